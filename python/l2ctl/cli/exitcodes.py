"""The command line's exit codes (also listed in ``l2ctl --help``)."""

from __future__ import annotations

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_UNSUPPORTED", "EXIT_VERIFY", "EXIT_INTERRUPTED",
           "EXIT_BROKEN_PIPE", "EXIT_CODES_HELP"]

EXIT_OK = 0  #: success
EXIT_ERROR = 1  #: a CUDA error, or memory exhausted (an allocation failed)
EXIT_USAGE = 2  #: bad arguments, an output file that cannot be written, a missing optional dependency
EXIT_UNSUPPORTED = 3  #: no GPU, a GPU (or process) that cannot persist L2, or nothing here to measure
EXIT_VERIFY = 4  #: a benchmark's output failed verification (no numbers are printed for it)
EXIT_INTERRUPTED = 130  #: Ctrl-C (the device state is restored first)
EXIT_BROKEN_PIPE = 141  #: stdout closed by its reader (``| head``), as a shell reports a process SIGPIPE ended

EXIT_CODES_HELP = ("exit codes: 0 ok, 1 CUDA error or out of memory, 2 bad arguments (or an output file\n"
                   "that cannot be written), 3 no GPU, one that cannot persist L2, or nothing to measure (no\n"
                   "framework for bench workloads), 4 a benchmark output failed verification, 130 interrupted,\n"
                   "141 stdout closed early (| head)")
