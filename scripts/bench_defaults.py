"""Issue 42, item 3, "the defaults lose nowhere": the two forms ``persist(target, buf)`` could take by default
when the window is larger than the set-aside "auto" grants, measured against each other and against no l2ctl,
side by side in one process.

- ``none``: no l2ctl (the limit as the process found it, no window);
- ``whole``: the auto set-aside, the window over the whole buffer at hit ratio granted / window (the default up to
  now), spelled out: ``persist(target, buf, hit_ratio=g / w, num_bytes=w, set_aside=g)``;
- ``first``: the same set-aside, the window cut to the buffer's first ``g`` bytes (rounded down to 256 B, as the
  tuner cuts it) at hit ratio 1.0: ``persist(target, buf, hit_ratio=1.0, num_bytes=g // 256 * 256, set_aside=g)``.

``g`` is what "auto" grants for the window: the window rounded up to the driver's granularity, at least the limit
as found, at most the tax-free cap (``auto_set_aside_cap()``). Where the window fits in it, the two forms are the
same scope, measured twice (a check of the noise).

Workloads: the gallery's (sizes from the device's L2; the torch graph-replay forms target their graph), and a
stand-in of the second client's shape (BlinkDL/Albatross, RWKV-7: a kept CUDA graph whose kernel nodes get a window
over a DeltaLog workspace): an l2ctl graph of ``layers`` sparse-vector kernels, each gathering at random from one
workspace of 1.33 x the tax-free cap while it streams its own slice of a large input and output, about 5 ms a
replay (the layer count is calibrated on the device). Each workload's three arms run in shuffled rounds, every block
from a clean state (bench.clean_state); each arm's output is verified after its last block; speedups are paired
bootstraps over rounds (bench.paired.bootstrap_speedup), ``first`` against ``whole`` too.

    python scripts/bench_defaults.py --json defaults.json                 # the GPU (about 2-3 minutes on an H200)
    L2CTL_SIMULATE=h200 python scripts/bench_defaults.py --quick --json /tmp/d.json   # the simulator, a try-out

Without torch (or CuPy) the gallery's framework workloads are skipped with the reason. On the simulator the modeled
stand-ins of l2ctl.workloads.modeled take their place where there is one (marked ``modeled``), the others are
skipped; the stand-in of the second client runs on l2ctl's own kernels, so everywhere.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import warnings
from typing import Any, Callable, Optional

import numpy as np

import l2ctl
from l2ctl import _backend, kernels
from l2ctl._interop import resolve_buffer
from l2ctl import graph as graphs
from l2ctl.bench.paired import bootstrap_speedup
from l2ctl.bench.records import environment
from l2ctl.bench.state import clean_state
from l2ctl.bench.timing import time_gpu
from l2ctl.workloads import describe, enqueue_of, gallery, verifier_of

MiB = 1 << 20
ARMS = ("none", "whole", "first")
EAGER = [e.name for e in gallery.GALLERY if not any(e.name.endswith(t) for t in ("-graphed", "-compiled", "-eager",
                                                                                   "-temp"))]
DEFAULT_WORKLOADS = EAGER + ["broadcast-graphed", "scatter-add-graphed", "albatross"]
WORKSPACE_OF_CAP = 1.33  # the stand-in's workspace against the tax-free cap (15 MiB against 11.25 MiB on an H200)
MODELED = {"broadcast": "broadcast", "scatter-add": "scatter_add", "index_select": "gather", "step": "mixed_step"}


def first_bytes(granted: int, window: int) -> int:
    """The window that the set-aside holds whole, in 256-byte units (the tuner's ``_span``), never past the window."""
    return min(window, max(256, granted // 256 * 256))


def auto_grant(window: int, device: int) -> int:
    """What ``set_aside="auto"`` grants a lone window of ``window`` bytes, read back from the driver."""
    gran = l2ctl.set_aside_granularity(device)
    cap = l2ctl.auto_set_aside_cap(device)
    initial = l2ctl.get_set_aside(device)
    request = max(initial, min(cap, -(-window // gran) * gran))
    with l2ctl.set_aside(request, device) as granted:
        return int(granted)


class AlbatrossStandIn:
    """A graph of ``layers`` sparse-vector kernels (l2ctl.kernels.sparse_vector): layer l reads its own slice of
    ``values`` (n float32) and the shared ``indices`` (n int32, random into the workspace), gathers from the
    workspace ``ws`` and writes its own slice of ``results``. What a replay streams is many times the L2; the
    workspace is re-read by every layer. ``target()`` is the graph (an l2ctl Graph: windows on its kernel nodes,
    its executable remade)."""

    name = "albatross"
    mode = "graph"
    hot = "workspace"
    pattern = ("stand-in of BlinkDL/Albatross (RWKV-7): a kept graph whose kernels re-read one workspace of 1.33 x "
               "the tax-free cap while streaming a much larger input")

    def __init__(self, device: int, stream: l2ctl.Stream, *, elements: int, target_ms: float, max_layers: int) -> None:
        self.device, self.stream = device, stream
        cap = l2ctl.auto_set_aside_cap(device)
        self.ws_words = int(WORKSPACE_OF_CAP * cap) // 4096 * 1024  # 4 KiB multiple
        self.n = elements
        rng = np.random.default_rng(7)
        self._owned: list[l2ctl.DeviceBuffer] = []
        self.ws = self._keep(l2ctl.DeviceBuffer.from_numpy(rng.standard_normal(self.ws_words).astype(np.float32),
                                                           device, stream))
        self.indices = self._filled(self.n, rng.integers(0, self.ws_words, size=(1 << 20) + 3, dtype=np.int32))
        value_lut = rng.standard_normal((1 << 20) + 5).astype(np.float32).view(np.int32)
        # Calibrated: one layer timed eagerly, then as many layers as ~target_ms holds.
        one_values = self._filled(self.n, value_lut)
        one_result = self._keep(l2ctl.DeviceBuffer(4 * self.n, device))
        t = time_gpu(lambda s: kernels.sparse_vector(one_values, self.indices, self.ws, one_result, s), stream,
                     warmup=2, repeat=5).median_ms
        self.layer_ms = t
        self.layers = max(2, min(max_layers, round(target_ms / max(t, 1e-6))))
        self.values = self._filled(self.layers * self.n, value_lut)
        self.results = self._keep(l2ctl.DeviceBuffer(4 * self.layers * self.n, device))
        self.reference = self._keep(l2ctl.DeviceBuffer(4 * self.layers * self.n, device))
        with graphs.capture(stream) as g:
            for layer in range(self.layers):
                at = 4 * self.n * layer
                kernels.sparse_vector((self.values.ptr + at, 4 * self.n), self.indices, self.ws,
                                      (self.results.ptr + at, 4 * self.n), stream)
        self.graph = g
        g.launch(stream)  # the executable exists before any scope, as after a warm-up
        kernels.copy_words(self.reference, self.results, stream)
        stream.synchronize()

    def _keep(self, buf: l2ctl.DeviceBuffer) -> l2ctl.DeviceBuffer:
        self._owned.append(buf)
        return buf

    def _filled(self, words: int, lut: np.ndarray) -> l2ctl.DeviceBuffer:
        """``words`` 32-bit words of ``lut`` repeated, written on the device (reset_data): no large host array."""
        out = self._keep(l2ctl.DeviceBuffer(4 * words, self.device))
        with l2ctl.DeviceBuffer.from_numpy(lut, self.device, self.stream) as src:
            kernels.reset_data(out, src, self.stream)
            self.stream.synchronize()
        return out

    def target(self) -> Any:
        return self.graph

    def candidates(self) -> dict[str, Any]:
        return {"workspace": self.ws}

    def enqueue(self, stream: Any) -> None:
        self.graph.launch(stream)

    def poison(self, stream: Any) -> None:
        self.results.fill_bytes(0xFF, stream)

    def verify(self, stream: Any) -> bool:
        return kernels.count_mismatches(self.results, self.reference, stream) == 0

    def describe(self) -> dict[str, Any]:
        return {"workload": self.name, "mode": self.mode, "workspace_bytes": self.ws.nbytes, "layers": self.layers,
                "elements_per_layer": self.n, "layer_ms": self.layer_ms,
                "streamed_bytes_per_replay": 12 * self.n * self.layers}

    def __enter__(self) -> "AlbatrossStandIn":
        return self

    def __exit__(self, *exc: object) -> None:
        self.graph.destroy()
        for buf in self._owned:
            buf.free()


def _make(name: str, device: int, stream: l2ctl.Stream, quick: bool) -> tuple[Optional[Any], str, str]:
    """The workload, its pattern, and why it was skipped (or "" when it runs; "modeled" for the simulator's)."""
    if name == "albatross":
        big = not _backend.simulated()
        w = AlbatrossStandIn(device, stream, elements=(1 << 24) if big and not quick else 1 << 16,
                             target_ms=5.0, max_layers=64 if big and not quick else 4)
        return w, AlbatrossStandIn.pattern, ""
    entry = gallery.entry(name)
    if _backend.simulated():  # a framework's kernels cannot run on a simulated GPU: the modeled stand-in, if any
        if name not in MODELED:
            return None, entry.pattern, "a framework workload without a modeled stand-in (the simulator)"
        from l2ctl.workloads.modeled import ModeledWorkload
        return getattr(ModeledWorkload, MODELED[name])(device), entry.pattern, "modeled"
    reason = entry.missing(device)
    return (entry.make(device) if reason is None else None), entry.pattern, reason or ""


def _paired(base: np.ndarray, arm: np.ndarray, seed: int) -> dict[str, Any]:
    x, ci = bootstrap_speedup(base, arm, 0.95, seed=seed)
    return {"speedup": x, "ci": list(ci), "faster": ci[0] > 1.0, "slower": ci[1] < 1.0}


def measure(name: str, w: Any, pattern: str, stream: l2ctl.Stream, *, rounds: int, repeat: int, warmup: int,
            seed: int) -> dict[str, Any]:
    device = stream.device
    info = l2ctl.device_info(device)
    candidates = w.candidates()
    hot = w.hot if w.hot in candidates else next(iter(candidates))
    buf = candidates[hot]
    buffer_bytes = resolve_buffer(buf).nbytes
    window = min(buffer_bytes, info.access_policy_max_window_size)
    target: Any = w.target() if hasattr(w, "target") else stream
    initial = l2ctl.get_set_aside(device)
    granted = auto_grant(window, device)
    ratio = min(1.0, granted / window)
    cut = first_bytes(granted, window)
    scopes: dict[str, Optional[Callable[[], Any]]] = {
        "none": None,
        "whole": lambda: l2ctl.persist(target, buf, hit_ratio=ratio, num_bytes=window, set_aside=granted),
        "first": lambda: l2ctl.persist(target, buf, hit_ratio=1.0, num_bytes=cut, set_aside=granted),
    }
    limits = {"none": initial, "whole": granted, "first": granted}
    enqueue, verify = enqueue_of(w), verifier_of(w)
    enqueue(stream)  # the framework's first call (handles, plans) is setup
    stream.synchronize()
    times = {arm: np.zeros((rounds, repeat)) for arm in ARMS}
    verified: dict[str, Optional[bool]] = {arm: None for arm in ARMS}
    rng = np.random.default_rng(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", l2ctl.L2BudgetWarning)
        for r in range(rounds):
            last = r == rounds - 1
            for arm in rng.permutation(list(ARMS)):
                with clean_state(stream, set_aside=limits[arm]):
                    if last and hasattr(w, "poison"):
                        w.poison(stream)
                    scope = scopes[arm]
                    with scope() if scope is not None else contextlib.nullcontext():
                        timing = time_gpu(enqueue, stream, warmup=warmup, repeat=repeat)
                    if last and verify is not None:
                        verified[arm] = bool(verify(stream))
                times[arm][r] = timing.times_ms
    speedups = {arm: _paired(times["none"], times[arm], seed + k) for k, arm in enumerate(ARMS) if arm != "none"}
    first_vs_whole = _paired(times["whole"], times["first"], seed + 7)
    winner = "first" if first_vs_whole["faster"] else "whole" if first_vs_whole["slower"] else "tie"
    return {
        "workload": name, "pattern": pattern, "mode": getattr(w, "mode", "") or "eager",
        "target": "graph" if target is not stream else "stream", "buffer": hot, "buffer_bytes": buffer_bytes,
        "window_bytes": window, "initial_set_aside": initial, "granted": granted,
        "tax_free_cap": l2ctl.auto_set_aside_cap(device), "whole_hit_ratio": ratio, "first_bytes": cut,
        "forms_identical": cut == window,
        "median_ms": {arm: float(np.median(times[arm])) for arm in ARMS},
        "times_ms": {arm: times[arm].tolist() for arm in ARMS},
        "speedup": {arm: d["speedup"] for arm, d in speedups.items()},
        "ci": {arm: d["ci"] for arm, d in speedups.items()},
        "loses": {arm: d["slower"] for arm, d in speedups.items()},
        "gains": {arm: d["faster"] for arm, d in speedups.items()},
        "first_vs_whole": first_vs_whole["speedup"], "first_vs_whole_ci": first_vs_whole["ci"], "winner": winner,
        "verified": verified, "described": describe(w),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", required=True, help="where the record goes")
    p.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS),
                   help=f"comma-separated: gallery names and 'albatross' (default: {','.join(DEFAULT_WORKLOADS)})")
    p.add_argument("--rounds", type=int, default=None, help="paired rounds per workload (default 20; --quick 4)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per block (default 10; --quick 3)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="a try-out: few rounds, a small stand-in (4 layers of 64 Ki elements); end to end on the "
                        "simulator (L2CTL_SIMULATE=h200)")
    a = p.parse_args(argv)
    rounds = a.rounds if a.rounds is not None else 4 if a.quick else 20
    repeat = a.repeat if a.repeat is not None else 3 if a.quick else 10
    names = [n.strip() for n in a.workloads.split(",") if n.strip()]
    for n in names:
        if n != "albatross":
            gallery.entry(n)  # an unknown name fails before anything runs
    start = time.monotonic()
    results, skipped = [], {}
    with l2ctl.Stream() as stream:
        device = stream.device
        for name in names:
            t0 = time.monotonic()
            w, pattern, note = _make(name, device, stream, a.quick)
            if w is None:
                skipped[name] = note
                print(f"{name}: skipped: {note}", flush=True)
                continue
            with w:
                r = measure(name, w, pattern, stream, rounds=rounds, repeat=repeat, warmup=a.warmup, seed=a.seed)
            r["modeled"] = note == "modeled"
            r["seconds"] = time.monotonic() - t0
            s, c = r["speedup"], r["ci"]
            print(f"{name}{' (modeled)' if r['modeled'] else ''}: window {r['window_bytes'] / MiB:.2f} MiB, granted "
                  f"{r['granted'] / MiB:.2f} MiB; none {r['median_ms']['none']:.3f} ms; whole (hit "
                  f"{r['whole_hit_ratio']:.3f}) {s['whole']:.3f}x ({c['whole'][0]:.3f}-{c['whole'][1]:.3f}); first "
                  f"{r['first_bytes'] / MiB:.2f} MiB at 1.0 {s['first']:.3f}x ({c['first'][0]:.3f}-{c['first'][1]:.3f})"
                  f"; first/whole {r['first_vs_whole']:.3f}x -> {r['winner']}; verified {r['verified']}; "
                  f"{r['seconds']:.0f} s", flush=True)
            results.append(r)
    differing = [r for r in results if not r["forms_identical"]]
    summary = {
        "whole_loses_on": [r["workload"] for r in results if r["loses"]["whole"]],
        "first_loses_on": [r["workload"] for r in results if r["loses"]["first"]],
        "first_beats_whole_on": [r["workload"] for r in differing if r["winner"] == "first"],
        "whole_beats_first_on": [r["workload"] for r in differing if r["winner"] == "whole"],
        "ties_on": [r["workload"] for r in differing if r["winner"] == "tie"],
        "forms_identical_on": [r["workload"] for r in results if r["forms_identical"]],
    }
    never = {arm: not summary[f"{arm}_loses_on"] for arm in ("whole", "first")}
    summary["never_loses"] = never
    summary["keep"] = ("first" if never["first"] and not summary["whole_beats_first_on"] else
                       "whole" if never["whole"] and not summary["first_beats_whole_on"] else "neither")
    record = {"benchmark": "defaults", "environment": environment(device),
              "config": {"rounds": rounds, "repeat": repeat, "warmup": a.warmup, "seed": a.seed, "quick": a.quick,
                         "workloads": names, "workspace_of_cap": WORKSPACE_OF_CAP, "confidence": 0.95,
                         "arms": {"none": "no l2ctl: the limit as found, no window",
                                  "whole": "auto set-aside g; window over the whole buffer at hit ratio g / window",
                                  "first": "auto set-aside g; window over the buffer's first g bytes (256-B units) "
                                           "at hit ratio 1.0"}},
              "results": results, "skipped": skipped, "summary": summary, "seconds": time.monotonic() - start}
    with open(a.json, "w") as f:
        json.dump(record, f, indent=1, default=str)
    print(f"keep: {summary['keep']}; whole loses on {summary['whole_loses_on'] or 'none'}, first loses on "
          f"{summary['first_loses_on'] or 'none'}; first beats whole on {summary['first_beats_whole_on'] or 'none'}, "
          f"whole beats first on {summary['whole_beats_first_on'] or 'none'}; {record['seconds']:.0f} s", flush=True)
    ok = all(v is not False for r in results for v in r["verified"].values())
    return 0 if ok and results else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
