"""Which implementation of the CUDA calls l2ctl uses.

Normally the compiled extension ``l2ctl._core``. Tests (and users testing their own code on a machine
without a GPU) can swap in :class:`l2ctl.testing.FakeBackend`, which simulates devices, limits,
windows and pointers with the same rounding and errors CUDA shows. Importing this module never
touches the driver.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

from . import _core

_lock = threading.Lock()
_active: Any = _core


def current() -> Any:
    """The backend in use (the ``_core`` module unless a test replaced it)."""
    return _active


@contextmanager
def use(backend: Any) -> Iterator[Any]:
    """Use ``backend`` instead of the CUDA extension inside the block (process-wide)."""
    global _active
    with _lock:
        previous, _active = _active, backend
    try:
        yield backend
    finally:
        with _lock:
            _active = previous
