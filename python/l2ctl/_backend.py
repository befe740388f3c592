"""The backend contract: every CUDA call l2ctl makes goes through one object, the backend in use.

Normally that is the compiled extension ``l2ctl._core``; ``l2ctl.testing.FakeBackend`` (the simulator)
implements the same contract so that everything above it runs without a GPU. What a backend offers is declared
once, in ``_core.pyi``: its functions, and its classes, which another backend offers as factory methods of the
same name returning objects with the class's methods and properties. tests/simulator/test_backend_contract.py
holds the extension and the simulator to the stub. Importing this module never touches the driver.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Iterator

from . import _core

#: A backend: an object with the names and signatures ``_core.pyi`` declares (the ``_core`` module, or a
#: FakeBackend). ``Any`` to type checkers, which have no type for "a module, or an object with its names": a
#: Protocol would be a second copy of the stub's list. The objects a backend makes are typed with the stub's
#: classes (``_core.Graph``, ``_core.RangeProfiler``, ...), which do check their use.
Backend = Any

_lock = threading.Lock()
_active: Backend = _core  # read directly (not through current()) on a scope's hot path
# The compiled scopes remember the backend they found last; every change of `_active` tells them (backend_changed).
_planner: Any = getattr(_core, "_planner")


def current() -> Backend:
    """The backend in use (the ``_core`` extension unless a test or the simulator replaced it)."""
    return _active


def install(backend: Backend) -> Backend:
    """Use ``backend`` instead of the CUDA extension from now on, process-wide (the GPU-less try-out); returns the
    backend it replaces."""
    global _active
    with _lock:
        previous, _active = _active, backend
        _planner.backend_changed()
    return previous


def simulated() -> str:
    """What the backend in use simulates ("" for the CUDA extension): said by every output that reports a
    device, so a simulated number is never taken for a measured one."""
    return str(getattr(_active, "provenance", ""))


@contextmanager
def use(backend: Backend) -> Iterator[Backend]:
    """Use ``backend`` instead of the CUDA extension inside the block (process-wide)."""
    previous = install(backend)
    try:
        yield backend
    finally:
        install(previous)
