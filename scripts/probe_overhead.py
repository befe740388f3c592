"""Where a persist scope's host time goes, piece by piece, on the machine at hand (microseconds per call,
the best of several rounds). A diagnosis for the overhead benchmark, not a benchmark: it prints a table."""

from __future__ import annotations

import sys
import timeit

import l2ctl
from l2ctl import _core, _device, _interop, _registry
from l2ctl._persist import Persist


def best(fn, n: int = 20000, rounds: int = 5) -> float:
    for _ in range(200):
        fn()
    return min(timeit.repeat(fn, number=n, repeat=rounds)) / n * 1e6


def main() -> None:
    rows = []
    s = l2ctl.Stream()
    buf = l2ctl.DeviceBuffer(4 << 20)
    w = (buf.ptr, buf.nbytes, 0.75, 2, 1)
    h = s.handle

    def minimal_scope() -> None:
        class CM:
            def __enter__(self) -> "CM":
                return self

            def __exit__(self, *e: object) -> None:
                pass
        with CM():
            pass

    rows.append(("python: minimal with-block (class made each time)", best(minimal_scope)))
    rows.append(("python: function call", best(lambda: None)))
    rows.append(("_core.device_count()", best(_core.device_count)))
    rows.append(("_core.get_stream_window", best(lambda: _core.get_stream_window(h))))
    rows.append(("_core.get_persisting_limit", best(lambda: _core.get_persisting_limit(0))))
    # The extension sets state only through its planner: the raw calls, timed in C++ (the limit set to itself).
    limit = _core.get_persisting_limit(0)
    driver = getattr(_core, "_driver_timing").time_calls(0, h, [], buf.ptr, buf.nbytes, limit, limit, 20000)
    rows.append(("C++: window read, set, set back (a lean scope's calls)", driver["cpp_lean_calls"]))
    rows.append(("C++: the same, then a reset of persisting lines", driver["cpp_default_calls"]))
    rows.append(("Persist() construction", best(lambda: Persist(s, buf, 0.75, set_aside=None, reset_on_exit=False))))
    p = Persist(s, buf, 0.75, set_aside=None, reset_on_exit=False)
    rows.append(("Persist enter+exit (object reused)", best(lambda: (p.__enter__(), p.__exit__(None, None, None)))))
    window = l2ctl.AccessPolicyWindow(*w)

    def registry_scope() -> None:
        scope = _registry.Scope(0, (_registry.stream_slot(h),), window)  # a scope is entered once
        _registry.enter(scope, 32768000)
        _registry.exit(scope)

    rows.append(("registry enter+exit (the C++ planner)", best(registry_scope)))
    rows.append(("properties(0)", best(lambda: _device.properties(0))))
    rows.append(("resolve_stream(l2ctl.Stream)", best(lambda: _interop.resolve_stream(s))))
    try:
        import torch

        ts = torch.cuda.Stream()
        tt = torch.empty(1 << 20, dtype=torch.int32, device="cuda")
        rows.append(("resolve_stream(torch stream)", best(lambda: _interop.resolve_stream(ts))))
        rows.append(("resolve_buffer(torch tensor)", best(lambda: _interop.resolve_buffer(tt))))
        rows.append(("torch: tensor.data_ptr()", best(tt.data_ptr)))
    except ImportError:
        pass
    width = max(len(r[0]) for r in rows)
    print(f"{'piece':<{width}} {'us':>8}   (python {sys.version.split()[0]})")
    for name, us in rows:
        print(f"{name:<{width}} {us:8.2f}")


if __name__ == "__main__" and "--profile" not in sys.argv:
    main()


def profile_scope() -> None:
    """cProfile of lean scopes on a reused Persist: which lines of l2ctl the time is in."""
    import cProfile
    import io
    import pstats

    s = l2ctl.Stream()
    buf = l2ctl.DeviceBuffer(4 << 20)
    p = Persist(s, buf, 0.75, set_aside=None, reset_on_exit=False)
    for _ in range(500):
        p.__enter__()
        p.__exit__(None, None, None)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(20000):
        p.__enter__()
        p.__exit__(None, None, None)
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(18)
    print(out.getvalue())


if __name__ == "__main__" and "--profile" in sys.argv:
    profile_scope()
