"""What the commands print and write: byte and header formatting (tables go to stdout), the JSON and
CSV reports and the plots (files; "wrote PATH" on stderr)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from typing import Any, Callable, Iterator, Optional, TextIO

from .. import plot
from .._units import format_bytes
from ..bench.records import Report, write_csv_rows, write_csv_table, write_json_array, write_json_document
from .exitcodes import EXIT_OK

__all__ = ["NO_GPU_HINT", "STDOUT", "OutputError", "data_to_stdout", "format_bytes", "simulated_line", "header",
           "note", "write_report", "write_reports_to_stdout", "write_table", "save_plot", "plot_problem", "numbered_path", "measure", "done"]

#: Said wherever a command finds no GPU: a new user's next step.
NO_GPU_HINT = "no GPU here? add --simulate to run this command on a simulated H100"


class OutputError(Exception):
    """A result file could not be written (exit 2; the table was already printed)."""


def simulated_line(provenance: str) -> str:
    """The line under a header when the numbers come from the simulator ("" on a GPU): a simulated number
    must never pass for a measured one."""
    return f"\nSIMULATED, not a measurement of real hardware: {provenance}" if provenance else ""


def header(report: Report) -> str:
    """One line naming the GPU, its L2 and the CUDA versions a report was measured with (and one more
    when the GPU was simulated)."""
    env = report.environment
    d = env["device"]
    return (f"{d['name']} (cc {d['compute_capability']}, L2 {format_bytes(d['l2_cache_size'])}, persisting max "
            f"{format_bytes(d['persisting_l2_cache_max_size'])}), driver {env['driver_version']}, runtime "
            f"{env['runtime_version']}{simulated_line(env.get('simulated', ''))}")


def note(message: str) -> None:
    """A line on stderr (not part of the table)."""
    print(message, file=sys.stderr)


#: The path that means standard output (``--json -``, ``--csv -``).
STDOUT = "-"
#: Where ``-`` writes: the process's stdout, while the tables go to stderr (``cli.run`` sets it).
_data: list[TextIO] = []


@contextlib.contextmanager
def data_to_stdout(args: argparse.Namespace) -> Iterator[None]:
    """The command's block: when --json or --csv is ``-``, their document goes to stdout and what the command
    prints (its tables) to stderr, so that stdout holds the document alone."""
    if STDOUT not in (getattr(args, "json", None), getattr(args, "csv", None)):
        yield
        return
    _data.append(sys.stdout)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _data.pop()


def _writing(path: str, write: Callable[[TextIO], Any]) -> None:
    """``write(file)`` into ``path`` (``-``: stdout), and "wrote PATH" on stderr."""
    if path == STDOUT:
        out = _data[-1] if _data else sys.stdout
        write(out)
        out.flush()
        return
    try:
        with open(path, "w", newline="", encoding="utf-8") as f:
            write(f)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    note(f"wrote {path}")


def write_report(report: Report, json_path: Optional[str], csv_path: Optional[str]) -> None:
    """The report as JSON and/or CSV, where asked."""
    for path, write in ((json_path, report.write_json), (csv_path, report.write_csv)):
        if path:
            _writing(path, write)


def write_reports_to_stdout(reports: list[Report], json_path: Optional[str], csv_path: Optional[str]) -> None:
    """Several reports of one run (tune's, one per LUT size) where --json or --csv is ``-``: one JSON document
    (an array, one report per element) and one CSV table under one header, as a reader of stdout parses them.
    The paths that name files are left to the caller (one file per report)."""
    if json_path == STDOUT:
        _writing(STDOUT, lambda f: write_json_array(reports, f))
    if csv_path == STDOUT:
        _writing(STDOUT, lambda f: write_csv_table(reports, f))


def write_table(json_path: Optional[str], csv_path: Optional[str], document: dict[str, Any],
                rows: list[dict[str, Any]]) -> None:
    """What is not a benchmark report (info): ``document`` as JSON and ``rows`` as CSV, where asked."""
    if json_path:
        _writing(json_path, lambda f: write_json_document(document, f))
    if csv_path:
        _writing(csv_path, lambda f: write_csv_rows(rows, f))


def numbered_path(path: Optional[str], nbytes: int) -> Optional[str]:
    """``out.json`` -> ``out_4194304.json``: one file per LUT size. None for none and for ``-``: stdout gets
    every size at once, in one document (``write_reports_to_stdout``), never one document after another."""
    if path is None or path == STDOUT:
        return None
    stem, ext = os.path.splitext(path)
    return f"{stem}_{nbytes}{ext}"


def plot_problem(path: str) -> Optional[str]:
    """Why ``--plot path`` cannot be drawn (matplotlib missing, a format it does not write), or None."""
    try:
        importlib.import_module("matplotlib")
        backend_bases = importlib.import_module("matplotlib.backend_bases")
    except ImportError:
        return "--plot needs matplotlib: pip install 'l2ctl[plot]'"
    formats = sorted(backend_bases.FigureCanvasBase.get_supported_filetypes())
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in formats:
        return (f"--plot {path}: give the file one of the extensions matplotlib writes: "
                f"{', '.join('.' + f for f in formats)}")
    return None


def save_plot(path: Optional[str], draw: Callable[[Any], Any], result: Any) -> None:
    """``draw(result)`` (an l2ctl.plot function) saved to ``path``, where asked."""
    if not path:
        return
    try:
        plot.save(draw(result), path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    note(f"wrote {path}")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The measurement options (--warmup, --repeat, --quiet) as the keywords l2ctl's measurements take."""
    return {"warmup": args.warmup, "repeat": args.repeat, "progress": not args.quiet}


def done(args: argparse.Namespace, report: Report, draw: Optional[Callable[[Any], Any]] = None,
         result: Any = None) -> int:
    """After the table: the report written and ``draw(result or report)`` saved where asked; EXIT_OK."""
    write_report(report, args.json, args.csv)
    if draw is not None:
        save_plot(args.plot, draw, report if result is None else result)
    return EXIT_OK
