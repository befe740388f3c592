"""Progress on stderr for long measurements, with one total known up front: on a terminal with tqdm
installed, tqdm's bar (it knows the terminal's width, and shows the rate and the time left); otherwise
(no tqdm, or stderr a file or a pipe: a log, CI) a few plain lines, one per tenth of the way at most,
each with the time so far and the time left. tqdm stays optional: NumPy is l2ctl's only dependency."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, Optional

__all__ = ["Progress"]


def _terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min"


class Progress:
    """``total`` steps, labelled, planned up front; ``step(what)`` after each. A measurement that plans the
    most it may need (the tuner: its refine and confirm stages depend on what the screen finds) calls
    ``skip(n)`` for the planned steps it turned out not to need, so the total never changes. Disabled:
    silent."""

    #: The most plain lines one Progress prints (one per tenth of the way).
    LINES = 10

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total, self.label, self.done, self.enabled = max(0, int(total)), label, 0, enabled
        self._start = time.monotonic()
        self._bar: Optional[Any] = None
        self._lines = enabled  # plain lines, unless tqdm draws a bar
        self._next_tenth = 1  # a plain line is printed when done reaches this tenth of the total
        if enabled and _terminal(sys.stderr):
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=self.total, desc=label, file=sys.stderr, dynamic_ncols=True, leave=True,
                                 unit="step")
                self._lines = False

    def step(self, what: str = "") -> None:
        self.skip(1, what)

    def skip(self, steps: int, what: str = "") -> None:
        """``steps`` planned steps that were not needed, counted as done."""
        steps = min(max(0, int(steps)), self.total - self.done)  # never "5/4", whatever a caller miscounts
        if steps == 0:
            return
        self.done += steps
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(steps)
            if self.done >= self.total:
                self.close()
        elif self._lines and self.done * self.LINES >= self._next_tenth * self.total:
            self._next_tenth = self.done * self.LINES // self.total + 1
            self._line(what)

    def _line(self, what: str) -> None:
        elapsed = time.monotonic() - self._start
        left = elapsed * (self.total - self.done) / self.done
        when = f"{_seconds(elapsed)}, about {_seconds(left)} left" if self.done < self.total else f"{_seconds(elapsed)}"
        line = f"{self.label} {self.done}/{self.total} ({self.done / self.total:.0%}, {when}) {what}".rstrip()
        width = shutil.get_terminal_size((100, 20)).columns
        sys.stderr.write(line[: max(20, width - 1)] + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
