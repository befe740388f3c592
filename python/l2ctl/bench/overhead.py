"""What l2ctl's controls cost on the host, side by side with the raw CUDA calls: enter+exit of persist
(lean and default settings, on a stream and on captured graphs; the lean scope in each argument form: hit
ratio 0.75, 1.0, 1, np.float32, keyword, Policy, an int set-aside equal to the limit, and a torch stream and
tensor at 0.75 and 1.0), set/clear of a window, a set_aside scope, a reset of persisting lines, and the same
through cuda-python's cuda.bindings when installed. On the simulator the numbers are the simulator's (the
record's environment says so) and the raw, driver-timed and torch variants are skipped.

Host time per operation (no GPU work and no synchronisation inside), the median over ``rounds`` rounds
of ``iterations`` operations each, the rounds taken round-robin over the variants. Every variant is
checked once before it is timed (the scope applied its window, and limit, inside) and after every round
(it left the device as it found it).
"""

from __future__ import annotations

import statistics
import time
from contextlib import ExitStack
from functools import partial
from typing import Any, Callable, Optional, Sequence

import numpy as np

from .. import _backend, _core
from .. import graph as graphs
from .. import kernels
from .._device import require_persistence
from .._limit import get_set_aside, reset_persisting_lines, set_aside, set_aside_granularity
from .._memory import DeviceBuffer, Stream
from .._persist import Policy, persist
from .._plan import check_count
from .._stream_window import clear_window, get_window, set_window
from .._units import MiB
from .._window import AccessPolicyWindow
from .._errors import check
from .progress import Progress
from .records import Record, Report, environment

__all__ = ["bench_overhead", "OVERHEAD_VARIANTS"]

#: name -> what one operation is.
OVERHEAD_VARIANTS: dict[str, str] = {
    "persist_lean": "persist(s, buf, 0.75, set_aside=None, reset_on_exit=False): enter + exit",
    "persist_lean_reused": "the lean scope made once, outside the loop: `with scope:` enter + exit",
    "persist_default": "persist(s, buf, 0.75): enter + exit (auto set-aside, lines reset at exit)",
    "persist_exact": "persist(s, buf, 0.75, set_aside=<one granule more>): enter + exit (two limit changes)",
    "persist_policy": "persist(s, buf, policy=Policy(set_aside=<one granule more>, hit_ratio=0.75)): the same",
    "persist_graph_1": "persist(graph of 1 kernel node, buf, 0.75, set_aside=None, reset_on_exit=False)",
    "persist_graph_32": "persist(graph of 32 kernel nodes, buf, 0.75, set_aside=None, reset_on_exit=False)",
    "set_clear_window": "set_window(s, w) then clear_window(s)",
    "set_aside_scope": "with set_aside(<one granule more>): enter + exit",
    "reset_persisting_lines": "reset_persisting_lines()",
    "raw_set_clear_window": "cuda.bindings: cudaStreamSetAttribute(window), then (empty window)",
    "raw_set_limit_pair": "cuda.bindings: cudaDeviceSetLimit(up), then (back)",
    "raw_reset": "cuda.bindings: cudaCtxResetPersistingL2Cache()",
    "persist_lean_torch": "persist(torch stream, torch tensor, 0.75, set_aside=None, reset_on_exit=False)",
    "persist_lean_torch_1_0": "persist(torch stream, torch tensor, 1.0, set_aside=None, reset_on_exit=False)",
    # The lean scope in each argument form of issue 36's table: each takes the compiled path.
    "persist_lean_1_0": "persist(s, buf, 1.0, set_aside=None, reset_on_exit=False): the README's hit ratio",
    "persist_lean_int_1": "persist(s, buf, 1, set_aside=None, reset_on_exit=False): an int hit ratio",
    "persist_lean_np_float32": "persist(s, buf, np.float32(0.75), set_aside=None, reset_on_exit=False)",
    "persist_lean_keyword": "persist(s, buf, hit_ratio=0.75, set_aside=None, reset_on_exit=False)",
    "persist_lean_policy": "persist(s, buf, policy=Policy(set_aside=None, hit_ratio=0.75), reset_on_exit=False)",
    "persist_lean_limit": "persist(s, buf, 0.75, set_aside=<the limit in force>, reset_on_exit=False): an int "
                          "set-aside that changes nothing",
    "cpp_lean_calls": "a lean scope's driver calls timed in C++: cudaStreamGetAttribute + 2 cudaStreamSetAttribute",
    "cpp_default_calls": "a default scope's driver calls timed in C++: the lean ones + cudaCtxResetPersistingL2Cache",
    "cpp_graph_32_calls": "a 32-node graph scope's driver calls timed in C++: per node, get + 2 sets of its window",
    "cpp_set_limit_pair": "cudaDeviceSetLimit(up), then (back), timed in C++",
}
#: The variants timed in C++ in one call per round (src/driver_timing.cpp), not through a Python loop.
DRIVER_VARIANTS = ("cpp_lean_calls", "cpp_default_calls", "cpp_graph_32_calls", "cpp_set_limit_pair")


def _per_op_us(op: Callable[[], Any], iterations: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(iterations):
        op()
    return (time.perf_counter_ns() - start) / iterations / 1e3


def _raw_bindings(stream_handle: int, buf: DeviceBuffer, device: int, up: int,
                  down: int) -> Optional[dict[str, Callable[[], None]]]:
    """Operations through cuda.bindings, each checking its return code; None when it is not installed."""
    try:
        from cuda.bindings import runtime as rt
    except ImportError:
        return None
    stream = rt.cudaStream_t(stream_handle)
    # cuda-python 12 names the stream attribute cudaStreamAttributeAccessPolicyWindow; 13 uses the launch
    # attribute names for streams too.
    ids = rt.cudaStreamAttrID
    attribute = getattr(ids, "cudaLaunchAttributeAccessPolicyWindow", None) or ids.cudaStreamAttributeAccessPolicyWindow
    value_type = getattr(rt, "cudaStreamAttrValue", None) or rt.cudaLaunchAttributeValue
    window, empty = value_type(), value_type()
    window.accessPolicyWindow.base_ptr = buf.ptr
    window.accessPolicyWindow.num_bytes = buf.nbytes
    window.accessPolicyWindow.hitRatio = 0.75
    window.accessPolicyWindow.hitProp = rt.cudaAccessProperty.cudaAccessPropertyPersisting
    window.accessPolicyWindow.missProp = rt.cudaAccessProperty.cudaAccessPropertyStreaming
    limit = rt.cudaLimit.cudaLimitPersistingL2CacheSize
    ok = rt.cudaError_t.cudaSuccess
    (err,) = rt.cudaSetDevice(device)
    check(err == ok, f"cudaSetDevice: {err}")

    def set_clear() -> None:
        (e1,) = rt.cudaStreamSetAttribute(stream, attribute, window)
        (e2,) = rt.cudaStreamSetAttribute(stream, attribute, empty)
        if e1 != ok or e2 != ok:
            raise RuntimeError(f"cudaStreamSetAttribute: {e1}, {e2}")

    def limit_pair() -> None:
        (e1,) = rt.cudaDeviceSetLimit(limit, up)
        (e2,) = rt.cudaDeviceSetLimit(limit, down)
        if e1 != ok or e2 != ok:
            raise RuntimeError(f"cudaDeviceSetLimit: {e1}, {e2}")

    def reset() -> None:
        (e,) = rt.cudaCtxResetPersistingL2Cache()
        if e != ok:
            raise RuntimeError(f"cudaCtxResetPersistingL2Cache: {e}")

    return {"raw_set_clear_window": set_clear, "raw_set_limit_pair": limit_pair, "raw_reset": reset}


def bench_overhead(
    *,
    device: object = None,
    rounds: int = 7,
    iterations: int = 2000,
    variants: Optional[Sequence[str]] = None,
    progress: bool = True,
) -> Report:
    """Host microseconds per operation for each variant (see OVERHEAD_VARIANTS); records carry the
    median over rounds (``median_ms`` in ms, ``metrics['median_us']`` in us) and every round's value."""
    rounds = check_count(rounds, "rounds", minimum=1, maximum=1000)
    iterations = check_count(iterations, "iterations", minimum=1, maximum=1_000_000)
    names = list(variants) if variants is not None else list(OVERHEAD_VARIANTS)
    for name in names:
        if name not in OVERHEAD_VARIANTS:
            raise ValueError(f"unknown variant {name!r}; one of {list(OVERHEAD_VARIANTS)}")
    props = require_persistence(device)
    index = props.index
    granule = set_aside_granularity(index)
    records: list[Record] = []
    with ExitStack() as stack, Progress(len(names), "overhead", progress) as bar:
        s = stack.enter_context(Stream(index))
        buf = stack.enter_context(DeviceBuffer(4 * MiB, index))
        out = stack.enter_context(DeviceBuffer(MiB, index))
        limit_before = get_set_aside(index)
        up = min(props.persisting_l2_cache_max_size, limit_before + granule)
        graphs_made = []
        for nodes in (1, 32):
            with graphs.capture(s) as g:
                for _ in range(nodes):
                    kernels.write_index(out, s)
            graphs_made.append(stack.enter_context(g))
        expected = AccessPolicyWindow.for_buffer(buf, 0.75)
        policy = Policy(set_aside=up, hit_ratio=0.75)
        lean_policy = Policy(set_aside=None, hit_ratio=0.75)
        g1, g32 = graphs_made
        # The lean scopes that differ only in their values, persist(target, buffer, ratio, set_aside=limit,
        # reset_on_exit=False): name -> (target, buffer, ratio, limit), each value made beforehand, as a program
        # holds it (the argument forms of issue 36's table, and graphs of 1 and 32 kernel nodes).
        lean: dict[str, tuple[Any, Any, Any, Optional[int]]] = {
            "persist_lean": (s, buf, 0.75, None), "persist_lean_1_0": (s, buf, 1.0, None),
            "persist_lean_int_1": (s, buf, 1, None), "persist_lean_np_float32": (s, buf, np.float32(0.75), None),
            "persist_lean_limit": (s, buf, 0.75, limit_before), "persist_graph_1": (g1, buf, 0.75, None),
            "persist_graph_32": (g32, buf, 0.75, None)}
        reusable = persist(s, buf, 0.75, set_aside=None, reset_on_exit=False)

        # Each operation is one call of a function that does what a user writes (a with-block on a scope
        # made in place), like the raw variants below: no extra layer in the timed loop.
        def persist_lean_reused() -> None:
            with reusable:
                pass

        def persist_lean_keyword() -> None:
            with persist(s, buf, hit_ratio=0.75, set_aside=None, reset_on_exit=False):
                pass

        def persist_lean_policy() -> None:
            with persist(s, buf, policy=lean_policy, reset_on_exit=False):
                pass

        def persist_default() -> None:
            with persist(s, buf, 0.75):
                pass

        def persist_exact() -> None:
            with persist(s, buf, 0.75, set_aside=up):
                pass

        def persist_policy() -> None:
            with persist(s, buf, policy=policy):
                pass

        def set_aside_scope() -> None:
            with set_aside(up, index):
                pass

        def set_clear_window() -> None:
            set_window(s, expected)
            clear_window(s)

        ops: dict[str, Callable[[], Any]] = {op.__name__: op for op in (
            persist_lean_reused, persist_lean_keyword, persist_lean_policy, persist_default, persist_exact,
            persist_policy, set_aside_scope, set_clear_window)}
        ops.update({name: _lean(*values) for name, values in lean.items()})
        ops["reset_persisting_lines"] = lambda: reset_persisting_lines(index)
        # What a scope applies inside, checked once before it is timed: name -> (the scope, where its window
        # goes, the window's hit ratio, the limit inside; None: not checked).
        scopes: dict[str, tuple[Callable[[], Any], Any, Optional[float], Optional[int]]] = {
            name: (partial(persist, target, b, ratio, set_aside=limit, reset_on_exit=False), target, float(ratio),
                   limit_before) for name, (target, b, ratio, limit) in lean.items()}
        scopes.update({
            "persist_lean_reused": (lambda: reusable, s, 0.75, limit_before),
            "persist_lean_keyword": (lambda: persist(s, buf, hit_ratio=0.75, set_aside=None, reset_on_exit=False), s,
                                     0.75, limit_before),
            "persist_lean_policy": (lambda: persist(s, buf, policy=lean_policy, reset_on_exit=False), s, 0.75,
                                    limit_before),
            "persist_default": (lambda: persist(s, buf, 0.75), s, 0.75, None),
            "persist_exact": (lambda: persist(s, buf, 0.75, set_aside=up), s, 0.75, up),
            "persist_policy": (lambda: persist(s, buf, policy=policy), s, 0.75, up),
            "set_aside_scope": (lambda: set_aside(up, index), None, None, up)})
        simulated = bool(_backend.simulated())  # the raw CUDA calls and torch's objects need the real GPU
        ops.update({} if simulated else _raw_bindings(s.handle, buf, index, up, limit_before) or {})
        torch_objects = None if simulated else _torch_objects(index)
        if torch_objects is not None:
            ops["persist_lean_torch"] = _lean(*torch_objects, 0.75, None)
            ops["persist_lean_torch_1_0"] = _lean(*torch_objects, 1.0, None)
        driver_timing = None if simulated else getattr(_core, "_driver_timing", None)
        nodes32 = [k.node for k in g32.kernel_nodes()]

        def driver_round(count: int) -> dict[str, float]:
            assert driver_timing is not None
            return dict(driver_timing.time_calls(index, s.handle, nodes32, buf.ptr, buf.nbytes, up, limit_before, count))

        def skip(name: str, reason: str) -> None:
            records.append(Record("overhead", name, {"operation": OVERHEAD_VARIANTS[name], "skipped": reason},
                                  float("nan"), float("nan"), float("nan"), 0.0, 0, False, {}))
            bar.step(f"{name}: skipped")

        measured, driver_measured = [], []
        for name in names:
            if name in DRIVER_VARIANTS:
                if driver_timing is None:
                    skip(name, "the GPU is simulated")
                else:
                    driver_measured.append(name)
                continue
            if name not in ops:
                skip(name, "the GPU is simulated" if simulated else "cuda-python is not installed"
                     if name.startswith("raw_") else "torch with a CUDA device is not installed")
                continue
            _check_variant(name, ops[name], scopes.get(name), expected, index)
            _check_left_clean(name, s, graphs_made, index, limit_before)
            measured.append(name)
        # Rounds go round-robin over the variants, so that a burst of load on the host falls on all of them
        # alike and the medians stay comparable side by side.
        samples: dict[str, list[float]] = {name: [] for name in measured + driver_measured}
        for _ in range(rounds):
            for name in measured:
                ops[name]()  # warm
                samples[name].append(_per_op_us(ops[name], iterations))
                _check_left_clean(name, s, graphs_made, index, limit_before)
            if driver_measured:  # the same round, beside the scopes
                driver_round(1)  # warm
                timed = driver_round(iterations)
                for name in driver_measured:
                    samples[name].append(timed[name])
                _check_left_clean("cpp_*", s, graphs_made, index, limit_before)
        for name in measured + driver_measured:
            median = statistics.median(samples[name])
            records.append(Record("overhead", name, {"operation": OVERHEAD_VARIANTS[name], "iterations": iterations,
                                                     "rounds": rounds, "order": "round-robin"},
                                  median / 1e3, min(samples[name]) / 1e3, max(samples[name]) / 1e3,
                                  (max(samples[name]) - min(samples[name])) / median if median else 0.0, rounds,
                                  True, {"median_us": median, "rounds_us": samples[name]}))
            bar.step(f"{name}: {median:.1f} us")
    return Report("overhead", environment(index), records,
                  summary={r.variant: r.metrics["median_us"] for r in records if r.verified})


def _torch_objects(index: int) -> Optional[tuple[Any, Any]]:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.Stream(device=index), torch.empty(MiB, dtype=torch.int32, device=f"cuda:{index}")


def _lean(target: Any, buffer: Any, ratio: Any, limit: Optional[int]) -> Callable[[], None]:
    """A lean scope's timed operation: ``persist(target, buffer, ratio, set_aside=limit, reset_on_exit=False)``
    entered and left."""

    def op() -> None:
        with persist(target, buffer, ratio, set_aside=limit, reset_on_exit=False):
            pass

    return op


def _check_variant(name: str, op: Callable[[], Any], scope: Optional[tuple[Callable[[], Any], Any, Optional[float],
                   Optional[int]]], expected: AccessPolicyWindow, index: int) -> None:
    """Once, outside the timed loops: the operation really applies what it claims inside the scope (``scope``:
    the scope, where its window goes, the window's hit ratio and the limit inside); without one, it runs."""
    if scope is None:
        op()
        return
    make, target, ratio, limit = scope
    with make():
        window = None if ratio is None else expected._replace(hit_ratio=ratio)
        if isinstance(target, graphs.Graph):
            check(all(k.window == window for k in target.kernel_nodes()), f"{name}: the node windows")
        elif window is not None:
            check(get_window(target) == window, f"{name}: the window on the stream")
        if limit is not None:
            check(get_set_aside(index) == limit, f"{name}: the limit")


def _check_left_clean(name: str, s: Stream, graphs_made: Sequence[graphs.Graph], index: int,
                      limit_before: int) -> None:
    check(get_window(s).empty, f"{name}: the stream's window afterwards")
    check(get_set_aside(index) == limit_before, f"{name}: the limit afterwards")
    for g in graphs_made:
        check(all(k.window.empty for k in g.kernel_nodes()), f"{name}: the node windows afterwards")
