"""What the commands print and write: byte and header formatting (tables go to stdout), the JSON and
CSV reports and the plots (files; "wrote PATH" on stderr)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, Callable, Optional

from ..bench import Report
from .exitcodes import EXIT_OK

__all__ = ["MiB", "OutputError", "fmt_bytes", "header", "note", "write_report", "save_plot", "plot_problem",
           "numbered_path", "measure", "done"]

MiB = 1 << 20


class OutputError(Exception):
    """A result file could not be written (exit 2; the table was already printed)."""


def fmt_bytes(n: int) -> str:
    return f"{n / MiB:.2f} MiB" if n >= MiB else f"{n / 1024:.1f} KiB"


def header(report: Report) -> str:
    """One line naming the GPU, its L2 and the CUDA versions a report was measured with."""
    env = report.environment
    d = env["device"]
    return (f"{d['name']} (cc {d['compute_capability']}, L2 {fmt_bytes(d['l2_cache_size'])}, persisting max "
            f"{fmt_bytes(d['persisting_l2_cache_max_size'])}), driver {env['driver_version']}, runtime "
            f"{env['runtime_version']}")


def note(message: str) -> None:
    """A line on stderr (not part of the table)."""
    print(message, file=sys.stderr)


def _writing(path: str, write: Callable[[str], Any]) -> None:
    try:
        write(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from exc
    note(f"wrote {path}")


def write_report(report: Report, json_path: Optional[str], csv_path: Optional[str]) -> None:
    """The report as JSON and/or CSV, where asked."""
    if json_path:
        _writing(json_path, report.to_json)
    if csv_path:
        _writing(csv_path, report.to_csv)


def numbered_path(path: str, nbytes: int) -> str:
    """``out.json`` -> ``out_4194304.json``: one file per LUT size."""
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
    from .. import plot

    _writing(path, lambda p: plot.save(draw(result), p))


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
