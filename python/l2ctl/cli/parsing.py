"""How commands become parsers, and what happens after parsing.

A :class:`Command` declares its options (``options.Option``) and the function that runs it. A
:class:`Group` (``bench``, ``sweep``) holds several; the options it shows may be given before the
command's name as well as after it, and reach the command either way (only what was typed lands in the
namespace: ``options``). The top-level parser takes every option before the command too (``l2ctl --quiet
bench``; those every command takes, EVERYWHERE, shown in its help). Every parser also knows, hidden, the
options of every other command, so that :func:`finish` can refuse one by name ("--lut-sizes does not
apply to 'bench stride'") instead of argparse taking its value for a command name; :func:`finish` then
fills in the chosen command's own defaults and checks optional dependencies (--plot) and that no two outputs
name one file, all before anything runs. Before argparse sees the line, :func:`normalize` joins each option
to its value and :func:`simulate` installs --simulate's GPUs.
"""

from __future__ import annotations

import argparse
import copy
import difflib
import os
import re
from dataclasses import dataclass
from typing import Any, Callable, NoReturn, Optional, Sequence, Union

import l2ctl

from .._units import GiB, MiB, format_bytes
from ..testing import simulate as use_simulator
from .exitcodes import EXIT_USAGE
from .options import EVERYWHERE, SIMULATE, Option, output_path, plot_path
from .output import STDOUT, plot_problem

__all__ = ["Parser", "Command", "Group", "Entry", "add_entries", "known_options", "command_words", "normalize",
           "simulate", "finish"]

Run = Callable[[argparse.Namespace], int]
_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's negative numbers: values, not flags


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage block): ``prog: error: message (see 'prog --help')``."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.split())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {line} (see '{self.prog} --help')\n")


def _add_parser(subparsers: Any, entry: Entry, known: Sequence[Option]) -> Parser:
    """The parser of ``entry``: its options in the help, every other one in ``known`` hidden (parsed, then
    refused by name in ``finish`` rather than its value taken for a command name)."""
    parser: Parser = subparsers.add_parser(
        entry.name, help=entry.summary, description=entry.description or entry.summary, allow_abbrev=False,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=30))
    for option in entry.options:
        option.add_to(parser)
    dests = {o.dest for o in entry.options}
    for option in known:
        if option.dest not in dests:
            option.add_to(parser, hidden=True)
    return parser


@dataclass(frozen=True)
class Command:
    """A runnable command: ``name`` is its word (``stride``), ``summary`` its line in the parent's help."""

    name: str
    summary: str
    options: tuple[Option, ...]
    run: Run
    description: str = ""

    def all_options(self) -> tuple[Option, ...]:
        return self.options

    def add_to(self, subparsers: Any, known: Sequence[Option], parent: str = "") -> Parser:
        parser = _add_parser(subparsers, self, known)
        parser.set_defaults(_command=(self, parser, f"{parent} {self.name}".strip()))
        return parser


@dataclass(frozen=True)
class Group:
    """Commands under one word (``bench stride``). ``default`` runs when no command is named; ``options``
    are those shown before the command's name (any option of a command is accepted there)."""

    name: str
    summary: str
    commands: tuple[Command, ...]
    options: tuple[Option, ...]
    default: Optional[Command] = None
    description: str = ""
    metavar: str = "COMMAND"

    def all_options(self) -> tuple[Option, ...]:
        return self.options + tuple(o for c in self.commands for o in c.options)

    def add_to(self, subparsers: Any, known: Sequence[Option], parent: str = "") -> Parser:
        path = f"{parent} {self.name}".strip()
        parser = _add_parser(subparsers, self, known)
        names = ",".join(c.name for c in self.commands)
        sub = parser.add_subparsers(title=self.metavar.lower() + "s", metavar=f"{{{names}}}",
                                    required=self.default is None)
        for command in self.commands:
            command.add_to(sub, known, path)
        if self.default is not None:  # its own key: a command named after it sets _command
            parser.set_defaults(_default=(self.default, parser, f"{path} {self.default.name}"))
        return parser


Entry = Union[Command, Group]


def known_options(entries: Sequence[Entry]) -> tuple[Option, ...]:
    """Every option of every command, once per flag; one flag has one meaning (type) everywhere."""
    seen: dict[str, Option] = {}
    for entry in entries:
        for option in entry.all_options():
            first = seen.setdefault(option.flag, option)
            if (first.type, first.switch) != (option.type, option.switch):
                raise TypeError(f"{option.flag} is declared with two types")
    return tuple(seen.values())


def add_entries(parser: argparse.ArgumentParser, entries: Sequence[Entry]) -> None:
    """The commands (and groups of commands) under ``parser``; every option may also come before the
    command (those every command takes shown, the rest hidden and refused by ``finish`` where they do not
    apply)."""
    known = known_options(entries)
    everywhere = {o.flag for o in EVERYWHERE}
    for option in EVERYWHERE + tuple(o for o in known if o.flag not in everywhere):
        option.add_to(parser, hidden=option.flag not in everywhere)
    names = ",".join(e.name for e in entries)
    sub = parser.add_subparsers(title="commands", metavar=f"{{{names}}}", required=True)
    for entry in entries:
        entry.add_to(sub, known)


def command_words(entries: Sequence[Entry]) -> set[str]:
    """The words that name commands (info, bench, stride, ...)."""
    return {e.name for e in entries} | {c.name for e in entries if isinstance(e, Group) for c in e.commands}


def _command_of(entries: Sequence[Entry], before: Sequence[str], after: Sequence[str]) -> Optional[Entry]:
    """The command (or group) an option at this point of the line goes to: the one the words name, those
    typed before it or, for an option typed first, after it (``l2ctl --x bench stride``); None for none."""
    level: Sequence[Entry] = entries
    chosen: Optional[Entry] = None
    for word in (*before, *after):
        found = next((e for e in level if e.name == word), None)
        if found is not None:
            chosen = found
            level = found.commands if isinstance(found, Group) else ()
    return chosen


def _close_option(flag: str, command: Optional[Entry]) -> Optional[str]:
    """The option ``flag`` was likely meant to be, among those ``command`` takes (with no command, those every
    command takes), or None. Compared without the dashes, which every flag shares: with them, any
    flag resembles any other (--bogus read as --rounds)."""
    options = command.all_options() if command is not None else EVERYWHERE
    flags = [o.flag for o in options] + ["--help"] + (["--version"] if command is None else [])
    names = {f.lstrip("-"): f for f in flags}
    close = difflib.get_close_matches(flag.lstrip("-"), sorted(names), n=1)
    return names[close[0]] if close else None


def normalize(parser: argparse.ArgumentParser, argv: Sequence[str], entries: Sequence[Entry]) -> list[str]:
    """``argv`` with each option's value joined to it (``--lut-bytes -4M`` -> ``--lut-bytes=-4M``: argparse
    would take -4M for a flag) and an optional value made explicit (``--simulate info`` ->
    ``--simulate=h100 info``); a flag no command has is refused (exit 2, one line) before argparse takes
    its value for a command name, and so is an option given twice (argparse would keep the last value
    silently, and the first may be what was meant)."""
    options = {o.flag: o for o in known_options(entries)}
    known = set(options) | {"-h", "--help", "--version"}
    words = command_words(entries)
    out: list[str] = []
    given: dict[str, str] = {}  # flag -> its value as typed ("" for a switch)
    rest = list(argv)
    while rest:
        token = rest.pop(0)
        if token == "--":
            return out + [token] + rest
        option = options.get(token)
        after = rest[0] if rest else None
        if option is not None and option.const is not None:
            takes = after is not None and not after.startswith("-") and after not in words
            token = f"{token}={rest.pop(0) if takes else option.const}"
        elif option is not None and not option.switch:
            if after is not None and after.split("=", 1)[0] not in known:  # a missing value stays missing
                token = f"{token}={rest.pop(0)}"
        else:
            flag = token.split("=", 1)[0]
            if flag.startswith("-") and len(flag) > 1 and not _NUMBER.match(flag) and flag not in known:
                close = _close_option(flag, _command_of(entries, out, rest))
                parser.error(f"unknown option {flag}" + (f"; did you mean {close}?" if close else ""))
        flag, _, value = token.partition("=")
        if flag in options:
            if flag in given:
                values = f" ({given[flag]}, then {value})" if value or given[flag] else ""
                parser.error(f"{flag} is given twice{values}: give each option once")
            given[flag] = value
        out.append(token)
    return out


def simulate(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """The ``--simulate=GPU`` of a normalized ``argv`` put into effect (l2ctl.testing.simulate) before
    the line is parsed, so that --device is checked against the simulated GPUs."""
    given = [t.split("=", 1)[1] for t in argv[:argv.index("--") if "--" in argv else len(argv)]
             if t.startswith(SIMULATE.flag + "=")]
    if given:  # once at most: normalize refuses a repeated option
        try:
            gpus = SIMULATE.type(given[0])
        except argparse.ArgumentTypeError as exc:
            parser.error(f"argument {SIMULATE.flag}: {exc}")
        use_simulator(gpus)


def _device_info(values: dict[str, Any]) -> Any:
    """The --device's l2ctl.DeviceInfo (the current device without it), or None: with no device, the command
    itself says so."""
    try:
        return l2ctl.device_info(values.get("device"))
    except l2ctl.L2ctlError:
        return None


def _memory_problem(own: dict[str, Option], values: dict[str, Any], typed: set[str]) -> Optional[str]:
    """Why the sizes given cannot fit the device's memory together (the options marked ``device_bytes``:
    what the command holds at once, the largest of a list), or None. Checked only when one was typed."""
    held = [o for o in own.values() if o.device_bytes and values.get(o.dest) is not None]
    if not any(o.dest in typed for o in held):
        return None
    need = sum(max(v) if isinstance(v, list) else int(v) for v in (values[o.dest] for o in held))
    info = _device_info(values)
    if info is None or need <= info.total_memory:
        return None
    return (f"{' and '.join(o.flag for o in held)} {'need' if len(held) > 1 else 'needs'} {need / GiB:.2f} GiB of "
            f"device memory at once; device {info.index} ({info.name}) has {info.total_memory / GiB:.2f} GiB")


def _l2_problem(own: dict[str, Option], values: dict[str, Any], typed: set[str]) -> Optional[str]:
    """Why an output size typed (the options marked ``streams_past_l2``) is too small to measure persistence:
    smaller than the LUT it holds repeated, or than the L2 (the output then never evicts the LUT, so every
    policy "wins" by nothing but noise and the model's edges)."""
    outputs = [o for o in own.values() if o.streams_past_l2]
    luts = [o for o in own.values() if o.repeated_into_output and values.get(o.dest) is not None]
    if not any(o.dest in typed for o in outputs + luts):
        return None
    for option in outputs:
        for lut in luts:
            largest = max(values[lut.dest]) if isinstance(values[lut.dest], list) else values[lut.dest]
            if values[option.dest] < largest:
                return (f"{option.flag} {values[option.dest]} B is smaller than {lut.flag} {largest} B: the output "
                        f"holds the LUT repeated; give {option.flag} at least the LUT")
    small = [o for o in outputs if o.dest in typed]
    info = _device_info(values) if small else None
    if info is None:
        return None
    for option in small:
        if values[option.dest] < info.l2_cache_size:
            return (f"{option.flag} {values[option.dest]} B is smaller than the L2 of device {info.index} ({info.name}, "
                    f"{format_bytes(info.l2_cache_size)}): the output must stream past the L2 for persistence "
                    f"to keep anything; give at least {-(-info.l2_cache_size // MiB)}M")
    return None


def _same_file(own: dict[str, Option], values: dict[str, Any]) -> Optional[str]:
    """Why two of the output options (--json, --csv, --plot) cannot be written (both name one file, or both
    stdout), or None: one would overwrite the other."""
    seen: dict[str, str] = {}
    for dest, option in own.items():
        path = values.get(dest)
        if option.type not in (output_path, plot_path) or not path:
            continue
        key = path if path == STDOUT else os.path.realpath(path)
        if key in seen:
            where = "stdout" if path == STDOUT else f"the same file ({path})"
            return f"{seen[key]} and {option.flag} both write to {where}: give each its own"
        seen[key] = option.flag
    return None


def finish(ns: argparse.Namespace) -> argparse.Namespace:
    """The namespace the command runs with: only its own options, each given or at its default, plus
    ``func`` (the function to run) and ``command`` (its words, e.g. "bench stride"). Exits 2 with one
    line for an option the command does not take, a ``--plot`` that cannot be drawn, or sizes that do
    not fit the device's memory."""
    given = dict(vars(ns))
    chosen, default = given.pop("_command", None), given.pop("_default", None)
    command: Command
    parser: Parser
    command, parser, path = chosen or default
    own = {o.dest: o for o in command.options}
    foreign = ["--" + dest.replace("_", "-") for dest in given if dest not in own]
    if foreign:
        parser.error(f"{', '.join(foreign)} {'does' if len(foreign) == 1 else 'do'} not apply to '{path}'")
    values: dict[str, Any] = {dest: given.get(dest, copy.copy(option.default)) for dest, option in own.items()}
    plot: Optional[str] = values.get("plot")
    for problem in (_same_file(own, values), plot and plot_problem(plot), _memory_problem(own, values, set(given)),
                    _l2_problem(own, values, set(given))):
        if problem:  # the first, in this order
            parser.error(problem)
    return argparse.Namespace(**values, func=command.run, command=path)

