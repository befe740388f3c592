"""Progress on stderr for long measurements: tqdm when it is installed (it knows the terminal's width),
otherwise one plain line per step, cut to the terminal's width."""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any, Optional

__all__ = ["Progress"]


class Progress:
    """``total`` steps, labelled; ``step(what)`` after each. ``grow(n)`` raises the total when a measurement
    learns its plan as it goes (the tuner). Disabled: silent."""

    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total, self.label, self.done, self.enabled = max(0, int(total)), label, 0, enabled
        self._start = time.monotonic()
        self._bar: Optional[Any] = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                pass
            else:
                self._bar = tqdm(total=self.total, desc=label, file=sys.stderr, dynamic_ncols=True, leave=True,
                                 unit="pt")

    def grow(self, steps: int) -> None:
        self.total += max(0, int(steps))
        if self._bar is not None:
            self._bar.total = self.total
            self._bar.refresh()

    def step(self, what: str = "") -> None:
        self.done += 1
        if self.done > self.total:  # never print "5/4": the total grows with what was done
            self.grow(self.done - self.total)
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(1)
            if self.done >= self.total:
                self.close()
            return
        line = f"{self.label} {self.done}/{self.total} ({time.monotonic() - self._start:.1f} s) {what}"
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
