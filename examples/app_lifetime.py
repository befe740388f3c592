"""An app that keeps L2 persistence for its lifetime: a model loaded once, then served.

    python examples/app_lifetime.py --json app_lifetime.json            # on a GPU
    L2CTL_SIMULATE=h100 python examples/app_lifetime.py                 # no GPU: simulated, and the record says so

The served step re-reads a hot weight (a table broadcast into every output row) while far more data streams past,
both sized from the L2 of the device at hand. Three ways to serve it, one after the other in one process:

- **without l2ctl** (the baseline, served before and after the others);
- **a hand-written helper**, as StreamDiffusion's ``tools/cuda_l2_cache.py`` does by default: at load it sets a
  persisting set-aside with cudaDeviceSetLimit (here through ``l2ctl.set_aside``; the textbook 75% of the L2, at
  most the max), puts no window on the stream the step runs on, and never undoes it;
- **l2ctl**: ``tune`` at load, then ``tuned.persist(stream, strict=False).start()`` for the server's life and
  ``stop()`` at unload (on a device that cannot persist it changes nothing and says why).

Each way also times a bystander, a plain copy elsewhere on the GPU that never touches a window: what a set-aside
costs everything else. The record (printed, and written with ``--json``): the device, driver, CUDA runtime and
commit, the sizes, the median step and copy times, the speedups over the baseline and the helper's harm. Every
step's output is verified. The device is left as it was found (checked; exit status 1 otherwise).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable

import numpy as np

import l2ctl
from l2ctl import kernels
from l2ctl.bench.records import environment

MiB = 1 << 20


class Model:
    """What the app loads once: the hot table every request re-reads, the output it streams, and a bystander
    copy (another part of the app, or another app on the GPU) that never reads the table."""

    def __init__(self, info: l2ctl.DeviceInfo, seed: int = 0) -> None:
        table_bytes = max(MiB, info.l2_cache_size // 4 // MiB * MiB)  # a quarter of the L2
        rng = np.random.default_rng(seed)
        self.table = l2ctl.DeviceBuffer.from_numpy(rng.integers(0, 2**31 - 1, table_bytes // 4, dtype=np.int32))
        self.out = l2ctl.DeviceBuffer(20 * info.l2_cache_size, dtype=np.int32)  # 20x the L2 streams past
        self.copy_src = l2ctl.DeviceBuffer(4 * info.l2_cache_size)
        self.copy_dst = l2ctl.DeviceBuffer(4 * info.l2_cache_size)
        kernels.write_index(self.copy_src)

    def step(self, stream: l2ctl.Stream) -> None:
        kernels.reset_data(self.out, self.table, stream)

    def bystander(self, stream: l2ctl.Stream) -> None:
        kernels.copy_words(self.copy_dst, self.copy_src, stream)

    def verified(self, stream: l2ctl.Stream) -> bool:
        return (kernels.verify_reset_data(self.out, self.table, stream) == 0
                and kernels.count_index_mismatches(self.copy_dst, stream) == 0)


def per_call_ms(work: Callable[[l2ctl.Stream], None], stream: l2ctl.Stream, calls: int, rounds: int) -> list[float]:
    """Milliseconds per call of ``work``, one value per round of ``calls`` back-to-back calls."""
    work(stream)  # warm-up
    out = []
    for _ in range(rounds):
        start = stream.record()
        for _ in range(calls):
            work(stream)
        out.append(start.elapsed_time(stream.record()) / calls)
    return out


def serve(model: Model, stream: l2ctl.Stream, args: argparse.Namespace) -> dict[str, Any]:
    """Serve for a while: the step's and the bystander's times, and whether every output was right."""
    step = per_call_ms(model.step, stream, args.steps, args.rounds)
    copy = per_call_ms(model.bystander, stream, args.steps, args.rounds)
    return {"step_ms": step, "copy_ms": copy, "verified": model.verified(stream)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=15, help="timed rounds per way of serving")
    parser.add_argument("--json", help="also write the record here")
    args = parser.parse_args()

    info = l2ctl.device_info()
    with l2ctl.Stream() as s:
        found = (l2ctl.get_set_aside(), l2ctl.get_window(s))
        model = Model(info)  # "load the model"
        runs: dict[str, list[dict[str, Any]]] = {"baseline": [serve(model, s, args)]}

        # The hand-written helper: a set-aside at load, no window on the step's stream, never undone by the app.
        helper_bytes = min(info.l2_cache_size * 3 // 4, info.persisting_l2_cache_max_size)
        helper = l2ctl.set_aside(helper_bytes)
        runs["helper"] = [serve(model, s, args)]
        helper.restore()  # what the helper never does: the example puts the device back before going on

        # l2ctl: tuned at load, kept for the server's life, stopped at unload.
        tuned = l2ctl.tune(model.step, s, {"table": model.table})
        scope = tuned.persist(s, strict=False).start()
        applied = {"set_aside": scope.set_aside, "window_bytes": scope.window.num_bytes,
                   "hit_ratio": scope.window.hit_ratio, "reason": scope.reason}
        runs["l2ctl"] = [serve(model, s, args)]
        scope.stop()

        runs["baseline"].append(serve(model, s, args))  # the baseline again: drift shows as a difference
        restored = (l2ctl.get_set_aside(), l2ctl.get_window(s)) == found

    def median(way: str, what: str) -> float:
        return statistics.median(v for run in runs[way] for v in run[what])

    step = {way: median(way, "step_ms") for way in runs}
    copy = {way: median(way, "copy_ms") for way in runs}
    record = {
        "example": "app_lifetime",
        "environment": environment(),
        "config": {"table_bytes": model.table.nbytes, "out_bytes": model.out.nbytes,
                   "copy_bytes": model.copy_src.nbytes, "helper_set_aside": helper_bytes,
                   "steps": args.steps, "rounds": args.rounds},
        "tuned": str(tuned),
        "l2ctl_scope": applied,
        "median_step_ms": step,
        "median_copy_ms": copy,
        "baseline_drift": statistics.median(runs["baseline"][1]["step_ms"]) / statistics.median(
            runs["baseline"][0]["step_ms"]),
        "speedup": {"helper": step["baseline"] / step["helper"], "l2ctl": step["baseline"] / step["l2ctl"]},
        "helper_harm": {"step_slowdown": step["helper"] / step["baseline"],
                        "copy_slowdown": copy["helper"] / copy["baseline"]},
        "l2ctl_copy_slowdown": copy["l2ctl"] / copy["baseline"],
        "verified": all(run["verified"] for way in runs.values() for run in way),
        "device_restored": restored,
        "runs": runs,
    }
    text = json.dumps(record, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    mark = "SIMULATED, " if record["environment"]["simulated"] else ""
    print(f"{mark}{info.name}: step {step['baseline']:.3f} ms without l2ctl; the helper's set-aside "
          f"{record['speedup']['helper']:.2f}x (a bystander copy {record['helper_harm']['copy_slowdown']:.2f}x slower); "
          f"l2ctl {record['speedup']['l2ctl']:.2f}x (copy {record['l2ctl_copy_slowdown']:.2f}x); {tuned}")
    if not record["verified"] or not restored:
        print("FAILED: " + ("a wrong output" if not record["verified"] else "the device was not restored"),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
