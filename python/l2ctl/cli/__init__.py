"""``l2ctl`` / ``python -m l2ctl``: device info, the benchmarks, the sweeps and the tuner.

    l2ctl info [--probe]
    l2ctl bench [reset-data|stride|cache-streaming|graph|concurrent|overhead|workloads|collectives] [options]
    l2ctl sweep hit-ratio|set-aside|surface|tax [options]
    l2ctl tune [options]

Every command takes --device N, --json PATH, --csv PATH, --quiet and --simulate [GPU] (the simulated GPUs
of l2ctl.testing; every output then says so); options go before or after the command. Every argument is
checked before anything runs (bad values, output files that cannot be written, a --plot without
matplotlib: one line on stderr, exit 2). Tables go to stdout; progress and "wrote PATH" to stderr.

Layout: ``options`` (argument types, shared options), ``parsing`` (commands to parsers, defaults,
refusals), ``output`` (formatting, files), ``exitcodes`` (each code and what it means, as ``--help`` lists
them), one ``*_cmd`` module per command family (info, bench, sweep, tune).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import sys
import warnings
from typing import Iterator, Optional, Sequence, TextIO, Union

import l2ctl

from .._errors import CudaError, NoDeviceError, NotSupportedError, VerificationError
from . import bench_cmd, info_cmd, sweep_cmd, tune_cmd
from .exitcodes import (EXIT_BROKEN_PIPE, EXIT_CODES_HELP, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_UNSUPPORTED,
                        EXIT_USAGE, EXIT_VERIFY)
from .output import NO_GPU_HINT, OutputError, data_to_stdout
from .parsing import Entry, Parser, add_entries, finish, normalize, simulate

__all__ = ["main", "build_parser", "parse_args", "run", "COMMANDS", "EXIT_OK", "EXIT_ERROR", "EXIT_USAGE",
           "EXIT_UNSUPPORTED", "EXIT_VERIFY", "EXIT_INTERRUPTED", "EXIT_BROKEN_PIPE"]

#: The top-level commands, in the order ``--help`` lists them.
COMMANDS: tuple[Entry, ...] = (info_cmd.INFO, bench_cmd.BENCH, sweep_cmd.SWEEP, tune_cmd.TUNE)

PROG = "l2ctl"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The parser of the whole command line. Options are parsed with no defaults (only what was typed);
    :func:`parse_args` adds the chosen command's defaults."""
    parser = Parser(prog=prog, description="NVIDIA L2 persistence controls and benchmarks",
                    epilog=EXIT_CODES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter,
                    allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {l2ctl.__version__}")
    add_entries(parser, COMMANDS)
    return parser


def parse_args(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> argparse.Namespace:
    """The chosen command's options (given or default), ``func`` and ``command``; SystemExit(2) with one
    line on stderr for anything wrong, SystemExit(0) after --help."""
    parser = build_parser(prog)
    args = normalize(parser, sys.argv[1:] if argv is None else argv, COMMANDS)
    simulate(parser, args)
    return finish(parser.parse_args(args))


@contextlib.contextmanager
def _each_warning_once() -> Iterator[None]:
    """A measurement repeats its scopes, and the filters' registries forget what was said whenever a filter
    changes (a benchmark silences one around each point), so a warning would be said at every point: here each
    (category, message) is shown once per run, under --quiet too (it says what the numbers mean: it is no
    progress). With -W or PYTHONWARNINGS, Python's own rules apply."""
    if sys.warnoptions:
        yield
        return
    said: set[tuple[type, str]] = set()
    show = warnings.showwarning

    def once(message: Union[Warning, str], category: type[Warning], filename: str, lineno: int,
             file: Optional[TextIO] = None, line: Optional[str] = None) -> None:
        if (category, str(message)) not in said:
            said.add((category, str(message)))
            show(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():
        warnings.showwarning = once
        yield


def run(args: argparse.Namespace) -> int:
    """Run a parsed command; errors become one line on stderr and an exit code."""
    try:
        with data_to_stdout(args), _each_warning_once():
            code: int = args.func(args)
        return code
    except (VerificationError, NotSupportedError, ValueError, OutputError, CudaError) as exc:
        code = (EXIT_VERIFY if isinstance(exc, VerificationError) else EXIT_UNSUPPORTED
                if isinstance(exc, NotSupportedError) else EXIT_USAGE if isinstance(exc, (ValueError, OutputError))
                else EXIT_ERROR)
        hint = f"; {NO_GPU_HINT}" if isinstance(exc, NoDeviceError) else ""
        print(f"l2ctl: {'CUDA error: ' if code == EXIT_ERROR else ''}{exc}{hint}", file=sys.stderr)
        return code
    except MemoryError as exc:  # a host allocation (numpy's too): one line, as a CUDA out-of-memory is
        print(f"l2ctl: out of memory: {' '.join(str(exc).split()) or 'an allocation failed'}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("l2ctl: interrupted; device state restored", file=sys.stderr)
        return EXIT_INTERRUPTED


def _handle_interrupts() -> None:
    """Python's Ctrl-C (KeyboardInterrupt) back, where ``import l2ctl`` put the command line's start-up one."""
    starting = getattr(l2ctl, "_interrupted_while_starting", None)
    if starting is not None and signal.getsignal(signal.SIGINT) is starting:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _stdout_gone() -> int:
    """stdout's reader went away (``| head -1``): nothing more is said, and Python's flush at exit finds
    nothing left to write (its own complaint would be a traceback-like message)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):  # not a file (a test's capture): nothing to quiet
        pass
    return EXIT_BROKEN_PIPE


def main(argv: Optional[Sequence[str]] = None, prog: str = PROG) -> int:
    """The console script (``l2ctl``) and ``python -m l2ctl``: parse ``argv`` (default sys.argv[1:]), run,
    return the exit code."""
    try:
        _handle_interrupts()
        try:
            args = parse_args(argv, prog)
        except SystemExit as exc:  # --help / --version (0), or bad arguments (2, the line already printed)
            return EXIT_OK if exc.code is None else exc.code if isinstance(exc.code, int) else EXIT_USAGE
        code = run(args)
        sys.stdout.flush()  # a reader gone is found here, not in Python's flush at exit
        return code
    except KeyboardInterrupt:  # while parsing (imports, --simulate): nothing was changed yet
        print("l2ctl: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _stdout_gone()

