"""Type stub for l2ctl._fastpath, the registry's lone-scope path in C (src/fastpath.cpp), and the base of
l2ctl.Persist whose entry and exit take a lone stream scope through it.

It holds no CUDA: it calls the backend it is given (the extension or the simulator). _registry.py says what
the fields mean and when these functions are used.
"""

from types import ModuleType, TracebackType
from typing import Any, Callable, Iterator, Optional, TypeVar

_P = TypeVar("_P", bound="PersistCore")

class DeviceState:
    def __init__(self, device: int, maximum: int) -> None: ...
    @property
    def device(self) -> int: ...
    @property
    def maximum(self) -> int: ...
    @property
    def scopes(self) -> dict[int, Any]: ...
    @property
    def base_windows(self) -> dict[tuple[int, int, int], tuple[int, int, float, int, int]]: ...
    @property
    def applied_windows(self) -> dict[tuple[int, int, int], tuple[int, int, float, int, int]]: ...
    base_limit: Optional[int]
    applied_request: Optional[int]
    applied_limit: Optional[int]
    observed_limit: Optional[int]
    in_force_demand: float
    auto_capped: bool
    dirty: bool
    auto_bounds: Optional[tuple[int, int]]
    shared: int
    autos: int
    limited: int

class PersistCore:
    # Persist's fields (set by Persist.__init__; _persist.py says what they hold).
    _enabled: bool
    _ref: Any
    _target_object: Any
    _buffer: Any
    _offset: int
    _num_bytes: Optional[int]
    _hit_prop: Any
    _miss_prop: Any
    _requested_hit_ratio: Optional[float]
    _limit_request: Any
    _reset_on_exit: bool
    _share: bool
    _scope: Any
    _slots: tuple[tuple[int, int, int], ...]
    _changed: Optional[Callable[[], None]]
    window: Any
    device: Optional[int]
    clipped: bool
    def __enter__(self: _P) -> _P: ...
    def __exit__(self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None: ...

def enter_lone(backend: Any, state: DeviceState, scope: Any,
               generations: dict[tuple[int, int], int]) -> Optional[tuple[int, float, bool]]: ...
def exit_lone(backend: Any, state: DeviceState, scope: Any) -> bool: ...
def configure(lock: Any, ids: Iterator[int], on_failure: Callable[..., BaseException]) -> None: ...
def configure_persist(backend_module: ModuleType, registry_module: ModuleType, properties_last: list[Any],
                      scope_type: type, window_type: type, check_owned_pointer: Callable[..., None]) -> None: ...
