"""Type stub for l2ctl._fastpath, the registry's lone-scope path in C (src/fastpath.cpp).

It holds no CUDA: it calls the backend it is given (the extension or the simulator). _registry.py says what
the fields mean and when these functions are used.
"""

from typing import Any, Callable, Iterator, Optional

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

def enter_lone(backend: Any, state: DeviceState, scope: Any,
               generations: dict[tuple[int, int], int]) -> Optional[tuple[int, float, bool]]: ...
def exit_lone(backend: Any, state: DeviceState, scope: Any) -> bool: ...
def configure(lock: Any, ids: Iterator[int], on_failure: Callable[..., BaseException]) -> None: ...
