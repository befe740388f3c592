"""Argument types and the options the commands share.

Every value is checked while the command line is parsed (an ``argparse.ArgumentTypeError``: one line,
exit 2), before any device is touched. An :class:`Option` is declared once, with its default; parsers
get it with ``default=SUPPRESS`` (so a copy of it in a sub-command never overwrites a value given
earlier on the line), and the command's defaults are filled in after parsing (``parsing.finish``).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, replace
from decimal import MAX_EMAX, MIN_EMIN, Context, Decimal, InvalidOperation, localcontext
from typing import Any, Callable, Hashable, Optional, Sequence, TypeVar, Union

import l2ctl

from ..bench.reset_data import RESET_COLUMNS
from ..bench.timing import MAX_REPEAT
from .._plan import check_set_aside
from ..kernels import ResetVariant, check_variant
from ..testing import SIMULATE_HELP, FakeDevice
from ..workloads import gallery
from .output import STDOUT, format_bytes, note

__all__ = ["Option", "COLUMN_NAMES", "VARIANT_NAMES", "parse_size", "set_aside_size", "items", "simulated_gpus", "lut_size", "lut_sizes",
           "collective_sizes", "count", "repeat_count", "warmup_count", "strides", "columns", "variant",
           "gallery_names", "GALLERY_NAMES", "device_index", "output_path", "plot_path", "DEVICE", "REPEAT", "WARMUP",
           "ROUNDS", "JSON", "CSV", "PLOT", "QUIET", "SIMULATE", "EVERYWHERE", "COMMON", "LUT_SIZES", "LUT_BYTES",
           "OUT_BYTES", "VARIANT", "SET_ASIDE"]

MAX_BYTES = 1 << 62  # far above any device's memory; keeps a typo from overflowing the C++ side
COLUMN_NAMES = tuple(name for name, _ in RESET_COLUMNS)
VARIANT_NAMES = tuple(v.name.lower() for v in ResetVariant)
GALLERY_NAMES = tuple(gallery.names())
SIZE_UNITS = "a number of bytes, optionally with a unit: K, M or G, powers of 1024 (also written KB, KiB)"
SIZE_HELP = "e.g. 4096, 8M, 1.5MiB, 1G"
Item = TypeVar("Item", bound=Hashable)


def _bad(message: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(message)


# ----------------------------------------------------------------------------------------------- types


def parse_size(text: str) -> int:
    """A whole number of bytes: 4096, 4K, 8M, 1.5MiB (1,572,864), 1G (powers of 1024); computed exactly
    (Decimal), so a fraction of a byte (1.5, 1.3K) is refused rather than dropped."""
    t = text.strip().upper().replace("IB", "").replace("B", "")
    scale = 1
    for suffix, factor in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, scale = t[:-1], factor
            break
    try:
        number = Decimal(t)
    except InvalidOperation:
        number = Decimal("nan")
    if not number.is_finite():
        raise _bad(f"not a size: {text!r} ({SIZE_UNITS}; {SIZE_HELP})")
    if number > 0 and number.adjusted() > 30:  # past MAX_BYTES in any unit; 1E1000000 would overflow the product
        raise _bad(f"size too large: {text!r}")
    # every digit kept and any exponent allowed, so that the product is exact: no rounding, no Overflow
    with localcontext(Context(prec=len(t) + 12, Emin=MIN_EMIN, Emax=MAX_EMAX)):
        value = number * scale
    if value <= 0:
        raise _bad(f"size must be positive: {text!r}")
    if value != value.to_integral_value():
        raise _bad(f"size must be a whole number of bytes: {text!r} is {value.normalize():f} B")
    if value > MAX_BYTES:
        raise _bad(f"size too large: {text!r}")
    return int(value)


def set_aside_size(text: str) -> Union[int, float, str]:
    """``--set-aside``: what l2ctl.set_aside takes (l2ctl._plan.check_set_aside, the one rule), written on a command
    line: a size (``8M``, ``4096``: bytes), ``max``, or a plain decimal strictly between 0 and 1 (``0.5``: that
    fraction of the max). ``1.0`` is refused as the API refuses it, saying to write ``max`` or a size."""
    t = text.strip()
    if t == "max":
        return "max"
    if re.fullmatch(r"[0-9]*\.[0-9]*", t) and t != ".":  # a plain decimal, no unit: a fraction, as in the API
        try:
            fraction = float(t)
            check_set_aside(fraction)
            return fraction
        except ValueError as e:
            raise _bad(f"--set-aside {t}: {e}".replace("set_aside=", "").replace("an int", "a size")) from None
    try:
        return parse_size(text)
    except argparse.ArgumentTypeError as e:
        raise _bad(f"{e}; --set-aside is a size ({SIZE_HELP}), max, or a fraction of the max such as 0.5") from None


def lut_size(text: str) -> int:
    """A LUT size: a byte size that is a multiple of 4 (the LUT holds 4-byte words)."""
    value = parse_size(text)
    if value % 4:
        raise _bad(f"a LUT size must be a multiple of 4 bytes: {text!r} is {value} B")
    return value


def items(text: str, what: str, example: str) -> list[str]:
    """The items of a comma-separated list; an empty one (4M,,8M, a trailing comma) is refused, not skipped."""
    parts = [part.strip() for part in text.split(",")]
    if not any(parts):
        raise _bad(f"no {what} given: {text!r} (use e.g. {example})")
    if not all(parts):
        raise _bad(f"empty item in {text!r}: separate the {what}s by single commas (e.g. {example})")
    return parts


def measured_once(values: Sequence[Item], parts: Sequence[str], what: str,
                  show: Optional[Callable[[Item], str]] = None) -> list[Item]:
    """``values`` (parsed from ``parts``) in order, each once; a repeat is said on stderr (a table with a row or
    a column twice says nothing more, and ``8M,8MiB`` is easily typed). ``show``: how a value is written in
    that line (none: the items are names)."""
    texts: dict[Item, list[str]] = {}
    for value, part in zip(values, parts):
        texts.setdefault(value, []).append(part)
    for value, same in texts.items():
        if len(same) > 1:
            times = "twice" if len(same) == 2 else f"{len(same)} times"
            said = (f"{same[0]} is named {times}" if show is None
                    else f"{', '.join(same)} are one {what} ({show(value)})")
            note(f"l2ctl: {said}: measured once")
    return list(texts)


def lut_sizes(text: str) -> list[int]:
    """Comma-separated LUT sizes: 1M,4M,8M; each measured once."""
    parts = items(text, "size", "1M,4M,8M")
    return measured_once([lut_size(part) for part in parts], parts, "size", format_bytes)


def _world_size() -> int:
    """The ranks of the torchrun job this command runs in (its WORLD_SIZE), 1 outside one."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def collective_sizes(text: str) -> list[int]:
    """Comma-separated collective message sizes, each one the collectives move exactly (whole float32
    elements, split evenly over the job's ranks); each measured once."""
    from ..bench.collectives import collective_size_problem  # the collectives' rule, loaded where it is asked for

    parts = items(text, "size", "64M,1G")
    values = [parse_size(part) for part in parts]
    for value in values:
        problem = collective_size_problem(value, _world_size())
        if problem:
            raise _bad(problem)
    return measured_once(values, parts, "size", format_bytes)


def count(minimum: int, maximum: Optional[int] = None, what: str = "count") -> Callable[[str], int]:
    """An integer in [minimum, maximum] (``1_000_000`` accepted)."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip(), 10)
        except ValueError:
            raise _bad(f"not an integer: {text!r}") from None
        if value < minimum:
            raise _bad(f"must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise _bad(f"must be at most {maximum:_}, got {value:_}")
        return value

    parse.__name__ = what
    return parse


repeat_count = count(1, MAX_REPEAT, "repeat")
warmup_count = count(0, MAX_REPEAT, "warmup")


def strides(text: str) -> list[int]:
    """Comma-separated strides in bytes, each a positive multiple of 4 up to 1 MiB."""
    parse = count(4, 1 << 20, "stride")
    values = []
    parts = items(text, "stride", "4,8,16")
    for part in parts:
        try:
            value = parse(part)
        except argparse.ArgumentTypeError as exc:
            raise _bad(f"stride {part!r}: {exc}") from None
        if value % 4:
            raise _bad(f"strides must be positive multiples of 4 bytes, got {value}")
        values.append(value)
    return measured_once(values, parts, "stride", lambda v: f"{v} B")


def _known_names(text: str, what: str, known: Sequence[str]) -> list[str]:
    """Comma-separated names, each one of ``known`` (``what`` names them in a refusal); each measured once."""
    names = items(text, what, ",".join(known[:2]))
    unknown = [n for n in names if n not in known]
    if unknown:
        raise _bad(f"unknown {what}(s) {', '.join(map(repr, unknown))}; choose from {', '.join(known)}")
    return measured_once(names, names, what)


def columns(text: str) -> list[str]:
    """Comma-separated reset-data columns, names from l2ctl.bench.RESET_COLUMNS."""
    return _known_names(text, "column", COLUMN_NAMES)


def gallery_names(text: str) -> list[str]:
    """Comma-separated gallery workload names (l2ctl.workloads.gallery)."""
    return _known_names(text, "workload", GALLERY_NAMES)


def variant(text: str) -> str:
    """A reset-data kernel variant (l2ctl.kernels.ResetVariant), by name; returned in lower case."""
    try:
        return check_variant(text).name.lower()
    except ValueError:
        raise _bad(f"unknown variant {text!r}; choose from {', '.join(VARIANT_NAMES)}") from None


def device_index(text: str) -> int:
    """A CUDA device index, below l2ctl.device_count() when a device is visible (with none, the command
    itself reports that there is no device)."""
    value = count(0, None, "device")(text)
    try:
        visible = int(l2ctl.device_count())
    except l2ctl.L2ctlError:  # the command will say what is wrong
        return value
    if visible and value >= visible:
        raise _bad(f"device {value} does not exist; {visible} device(s) are visible (0 to {visible - 1})")
    return value


def simulated_gpus(text: str) -> str:
    """--simulate's value: simulated GPU presets, comma-separated (l2ctl.testing.simulate)."""
    for name in items(text, "GPU", "h100,h200"):
        try:
            FakeDevice.named(name)
        except ValueError as exc:
            raise _bad(str(exc)) from None
    return text


def output_path(text: str) -> str:
    """A file to write, or ``-`` for stdout: its directory must exist and be writable; an existing file must
    be writable. Both are tried (an existing file opened to append, nothing written; a new one made and
    removed), so that a file that cannot be written (a read-only mount, /proc) is refused before the run,
    not after it."""
    if text == STDOUT:
        return text
    return plot_path(text)


def plot_path(text: str) -> str:
    """A file to write (a plot: never stdout), checked as :func:`output_path` checks one."""
    if text == STDOUT:
        raise _bad("a plot cannot go to stdout: give a file name")
    if not text.strip():
        raise _bad("empty path")
    if os.path.isdir(text):
        raise _bad(f"{text} is a directory; give a file name")
    directory = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(directory):
        raise _bad(f"cannot write {text}: directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise _bad(f"cannot write {text}: directory {directory} is not writable")
    existed = os.path.exists(text)
    if existed and not os.access(text, os.W_OK):
        raise _bad(f"cannot write {text}: the file is not writable")
    try:
        with open(text, "a" if existed else "x"):
            pass
        if not existed:
            os.remove(text)
    except OSError as exc:
        raise _bad(f"cannot write {text}: {exc.strerror or exc}") from None
    return text


# ----------------------------------------------------------------------------------------------- options


@dataclass(frozen=True)
class Option:
    """One command-line option: its flag, help, default (and how the help shows it) and type."""

    flag: str
    help: str
    default: Any = None
    shown_default: Optional[str] = None  #: None: derived from ``default``
    type: Callable[[str], Any] = str  #: parses and checks the value (ArgumentTypeError: exit 2)
    metavar: Optional[str] = None
    switch: bool = False  #: a flag without a value (store_true)
    const: Optional[str] = None  #: the value of the flag given without one (--simulate); see parsing.normalize
    #: the value (a size, or a list of sizes of which the largest counts) is device memory the command holds
    #: while every other such option's is held too: checked against the device's memory (parsing.finish)
    device_bytes: bool = False
    #: the value is an output the workload streams past the LUT: below the device's L2 size nothing evicts the
    #: LUT and persistence has nothing to show (parsing.finish refuses it)
    streams_past_l2: bool = False
    #: the value is a LUT (a size, or a list of which the largest counts) the output holds repeated: no larger
    #: than the output (parsing.finish refuses it)
    repeated_into_output: bool = False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def help_text(self) -> str:
        shown = self.shown_default
        if shown is None:
            shown = "off" if self.switch else "none" if self.default is None else str(self.default)
        return f"{self.help} (default: {shown})"

    def but(self, **changes: Any) -> "Option":
        """A copy with other fields (a command's own default, say)."""
        return replace(self, **changes)

    def add_to(self, parser: argparse.ArgumentParser, hidden: bool = False) -> None:
        """Added with ``default=SUPPRESS`` (only a value typed lands in the namespace); ``hidden``: not in
        the help (parsed, then refused: see parsing.finish)."""
        text = argparse.SUPPRESS if hidden else self.help_text.replace("%", "%%")
        how: dict[str, Any] = {"action": "store_true"} if self.switch else {"type": self.type, "metavar": self.metavar}
        parser.add_argument(self.flag, dest=self.dest, default=argparse.SUPPRESS, help=text, **how)


DEVICE = Option("--device", "CUDA device index", None, "the current device", device_index, "N")
REPEAT = Option("--repeat", f"timed repetitions per point, the median is reported (1 to {MAX_REPEAT:_})", 15,
                type=repeat_count, metavar="N")
WARMUP = Option("--warmup", "untimed runs before the timed ones, per point", 3, type=warmup_count, metavar="N")
ROUNDS = Option("--rounds", "paired rounds: each runs one block of the baseline and of every point, shuffled (3 to 1000)",
                5, type=count(3, 1000, "rounds"), metavar="N")
JSON = Option("--json", "write the full report (environment, configuration, every record) as JSON; - : to stdout "
              "(the tables then go to stderr)", type=output_path, metavar="PATH")
CSV = Option("--csv", "write one CSV row per measurement; - : to stdout (the tables then go to stderr)",
             type=output_path, metavar="PATH")
PLOT = Option("--plot", "save a plot, format by extension (.png, .svg, .pdf); needs matplotlib",
              type=plot_path, metavar="PATH")
QUIET = Option("--quiet", "no progress on stderr", False, switch=True)
SIMULATE = Option("--simulate", SIMULATE_HELP + "; alone: h100", None, "off: the real GPUs, unless $L2CTL_SIMULATE",
                  simulated_gpus, "[GPU]", const="h100")

#: What every command takes, before or after its name (the README promises it).
EVERYWHERE = (DEVICE, JSON, CSV, QUIET, SIMULATE)
#: What every benchmark, sweep and the tuner takes.
COMMON = (DEVICE, REPEAT, WARMUP, JSON, CSV, QUIET, SIMULATE)

LUT_SIZES = Option("--lut-sizes", f"LUT sizes, comma-separated ({SIZE_HELP}; multiples of 4)", None,
                   "1,4,8,12,16,24,32,48 x L2/50: 1 to 48 MiB on a 50 MiB L2", lut_sizes, "SIZES", device_bytes=True,
                   repeated_into_output=True)
LUT_BYTES = Option("--lut-bytes", f"LUT size of the reset-data workload ({SIZE_HELP}; a multiple of 4)", 4 << 20,
                   "4M", lut_size, "SIZE", device_bytes=True, repeated_into_output=True)
OUT_BYTES = Option("--out-bytes", f"output size of the reset-data workload ({SIZE_HELP}; at least the L2 size, so "
                   "that it streams past the L2, and the LUT)", 1 << 30, "1G", parse_size, "SIZE", device_bytes=True,
                   streams_past_l2=True)
VARIANT = Option("--variant", f"reset-data kernel variant: {', '.join(VARIANT_NAMES)}", "plain", type=variant,
                 metavar="NAME")
SET_ASIDE = Option("--set-aside", f"persisting-L2 set-aside limit to request: a size ({SIZE_HELP}), max, or a fraction "
                   "of the max strictly between 0 and 1 (0.5)", None, type=set_aside_size, metavar="SIZE")
