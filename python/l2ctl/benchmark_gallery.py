"""The gallery benchmark (``python -m l2ctl bench workloads``): for each framework workload, what persistence
buys under the policies of WORKLOAD_POLICIES, measured side by side with the baseline (no set-aside, no
window) in paired rounds, every output verified. The recipe and hit 1.0 persist the workload's obvious
buffer (``hot``); hit 1.0's set-aside "auto" stops at the driver's default limit and warns. The tuned
choice is re-measured in ``runs`` separate paired comparisons (a "no persistence" answer measures the
scope that changes nothing). Each row also reports the tax of the tuned set-aside and of the recipe's on a
plain copy.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

from ._device import require_persistence, stream_device
from ._errors import L2BudgetWarning, SetAsideTaxWarning, WindowClippedWarning
from ._interop import resolve_buffer, resolve_stream
from ._limit import set_aside_granularity
from ._memory import StreamLike, synchronize_stream
from ._persist import persist
from ._targets import Target
from ._plan import check_count, clip_window, round_up
from .bench.paired import Arm, compare
from .bench.progress import Progress
from .bench.records import Report, environment
from .bench.state import owned_stream
from .bench.tax import measure_tax
from .bench.timing import check_repeats
from .tuner import tune
from .workloads import gallery

__all__ = ["bench_workloads", "recipe_set_aside", "WORKLOAD_POLICIES"]

WORKLOAD_POLICIES = (
    ("recipe", "set-aside min(0.75 x L2, max), hit ratio set-aside / buffer, on the obvious buffer"),
    ("hit_1.0", "persist(stream, buffer, 1.0) with l2ctl's defaults (set-aside 'auto', capped)"),
    ("tuned", "l2ctl.tune over every candidate; its choice applied with persist(policy=...)"),
)


def recipe_set_aside(device: object = None) -> int:
    """The textbook set-aside, min(0.75 x L2 size, persistingL2CacheMaxSize), as the driver grants it."""
    info = require_persistence(device)
    want = min(int(0.75 * info.l2_cache_size), info.persisting_l2_cache_max_size)
    return min(info.persisting_l2_cache_max_size, round_up(want, set_aside_granularity(info.index)))


@contextlib.contextmanager
def _quiet(scope: Any) -> Iterator[Any]:
    """A scope whose warnings are the point of the row (the recipe oversubscribes, hit 1.0 hits the cap)."""
    with warnings.catch_warnings():
        for category in (L2BudgetWarning, SetAsideTaxWarning, WindowClippedWarning):
            warnings.simplefilter("ignore", category)
        with scope as entered:
            yield entered


def bench_workloads(stream: StreamLike = None, names: Optional[Sequence[str]] = None, *, runs: int = 3, rounds: int = 5,
                    repeat: int = 5, warmup: int = 1, device: object = None, progress: bool = True,
                    factories: Optional[dict[str, Callable[[int], Any]]] = None) -> Report:
    """Run the gallery (``names``: a subset, in order; default all) on the GPU at hand. ``factories``
    replaces the gallery with name -> callable(device) returning a workload (the simulator's tests use
    modeled workloads). Workloads that cannot run here are listed in ``summary["skipped"]`` with the reason."""
    runs = check_count(runs, "runs", minimum=1, maximum=100)
    rounds = check_count(rounds, "rounds", minimum=3, maximum=1000)
    warmup, repeat = check_repeats(warmup, repeat)
    if factories is not None:
        chosen: list[tuple[str, Optional[str], Callable[[int], Any]]] = []
        for name in (list(factories) if names is None else list(names)):
            if name not in factories:
                raise ValueError(f"no workload {name!r}; choose from {', '.join(factories)}")
            chosen.append((name, None, factories[name]))
    else:
        entries = gallery.GALLERY if names is None else [gallery.entry(n) for n in names]
        chosen = [(e.name, e.missing(device if stream is None else stream_device(resolve_stream(stream))), e.make)
                  for e in entries]
    with owned_stream(stream, device) as s:
        dev = stream_device(resolve_stream(s))
        info = require_persistence(dev)
        recipe = recipe_set_aside(dev)
        records, rows, skipped = [], [], {}
        bar = Progress(len(chosen), "bench workloads", progress)
        for name, reason, make in chosen:
            if reason is not None:
                skipped[name] = reason
                bar.step(f"{name}: skipped")
                continue
            start = time.monotonic()
            with make(dev) as w:
                w.enqueue(s)  # the framework's first call (library handles, plans) is setup, not tuning
                synchronize_stream(s)
                setup_s = time.monotonic() - start
                candidates = w.candidates()
                hot = w.hot if w.hot in candidates else next(iter(candidates))
                hot_buf = candidates[hot]
                hot_bytes = clip_window(0, None, resolve_buffer(hot_buf).nbytes, info.access_policy_max_window_size)[0]
                # what replays: the stream, a graph, or the graphs torch records (workloads.graphed)
                target: Target = w.target() if hasattr(w, "target") else s
                tuned = tune(w, target, candidates, stream=None if target is s else s, rounds=rounds, repeat=repeat,
                             warmup=warmup, progress=False)
                recipe_ratio = min(1.0, recipe / hot_bytes)
                arms = [
                    Arm("recipe", recipe, lambda: _quiet(persist(target, hot_buf, recipe_ratio, set_aside=None,
                                                                   num_bytes=hot_bytes)),
                        {"buffer": hot, "hit_ratio": recipe_ratio}),
                    Arm("hit_1.0", 0, lambda: _quiet(persist(target, hot_buf, 1.0, num_bytes=hot_bytes)),
                        {"buffer": hot, "hit_ratio": 1.0, "set_aside": "auto"}),
                ]
                tuned_arm = Arm("tuned", 0, lambda: tuned.persist(target),
                                {"buffer": tuned.buffer_name, "policy_set_aside": tuned.policy.set_aside,
                                 "hit_ratio": tuned.policy.hit_ratio, "num_bytes": tuned.policy.num_bytes})
                if getattr(w, "mode", "") == "graphed" and tuned.persists:
                    # What a user did before l2ctl reached graphs: the tuned scope on the stream the graph replays
                    # on. Its window never reaches the replayed kernels; its set-aside does. (Only where the whole
                    # step replays: an eager kernel under the window would load the buffer as persisting lines.)
                    arms.append(Arm("stream_scope", 0, lambda: _quiet(tuned.persist(s)),
                                    {"buffer": tuned.buffer_name, "policy_set_aside": tuned.policy.set_aside}))
                tuned_speedups, tuned_cis = [], []
                for run in range(runs):
                    base, comps = compare(w, s, (arms if run == 0 else []) + [tuned_arm], rounds=rounds, repeat=repeat,
                                          warmup=warmup, seed=100 + run, benchmark=f"workloads/{name}")
                    extra = {"workload": name, "run": run, **w.describe()}
                    records += [c.record("workloads", extra) for c in [base, *comps]]
                    if run == 0:
                        first = {c.arm.label: c for c in comps}
                        baseline_ms = base.median_ms
                    tuned_speedups.append(comps[-1].speedup)
                    tuned_cis.append(comps[-1].ci)
                rows.append({
                    "workload": name, "mode": getattr(w, "mode", "") or "eager", "hot": hot, "hot_bytes": hot_bytes,
                    "baseline_ms": baseline_ms,
                    "recipe_speedup": first["recipe"].speedup, "recipe_ci": list(first["recipe"].ci),
                    "recipe_set_aside": recipe, "recipe_copy_slowdown": measure_tax(s, recipe).copy_slowdown,
                    "hit1_speedup": first["hit_1.0"].speedup, "hit1_ci": list(first["hit_1.0"].ci),
                    "stream_scope_speedup": first["stream_scope"].speedup if "stream_scope" in first else None,
                    "tuned_buffer": tuned.buffer_name,
                    "tuned_set_aside": tuned.policy.set_aside if tuned.persists else 0,
                    "tuned_hit_ratio": tuned.policy.hit_ratio if tuned.persists else None,
                    "tuned_num_bytes": tuned.policy.num_bytes,
                    "tuned_speedups": tuned_speedups, "tuned_cis": [list(c) for c in tuned_cis],
                    "tuned_min_speedup": min(tuned_speedups),
                    "tuned_copy_slowdown": tuned.tax.copy_slowdown,
                    "tune_confirmed_speedup": tuned.speedup, "tune_reason": tuned.reason,
                    "grid_best": None if tuned.grid_best is None else {
                        **tuned.grid_best.as_dict(), "copy_slowdown": tuned.grid_best_tax.copy_slowdown},
                    "tune_seconds": tuned.seconds, "candidates": len(candidates),
                    "tune_seconds_per_candidate": tuned.seconds / len(candidates), "setup_seconds": setup_s,
                    "tune_points": [{**p.as_dict(), "stage": p.stage} for c in tuned.candidates.values()
                                    for p in c.points],
                    "described": w.describe(),  # a compiled row: whether torch graphed it (graphs_recorded)
                })
                for rec in tuned.table:
                    rec.config = {"workload": name, **rec.config}
                records.extend(tuned.table)
            bar.step(f"{name}: tuned {tuned_speedups[0]:.2f}x")
        bar.close()
        report = Report("workloads", environment(dev), records)
        report.summary = {"rows": rows, "skipped": skipped, "runs": runs, "rounds": rounds, "repeat": repeat,
                          "recipe_set_aside": recipe, "policies": dict(WORKLOAD_POLICIES),
                          "never_slower": all(r["tuned_min_speedup"] >= 0.99 for r in rows) if rows else None}
    return report
