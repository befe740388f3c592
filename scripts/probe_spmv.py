"""Where an SpMV step's time goes: host time per call (no synchronisation) against GPU time per call."""
import time

import cupy

import l2ctl
from l2ctl import bench
from l2ctl.workloads import SpMV

with l2ctl.Stream() as s, SpMV() as w:
    for _ in range(5):
        w.enqueue(s)
    s.synchronize()
    t = time.perf_counter()
    for _ in range(100):
        w.enqueue(s)
    host = (time.perf_counter() - t) / 100 * 1e3
    s.synchronize()
    gpu = bench.time_gpu(w.enqueue, s, warmup=2, repeat=20)
    start = time.perf_counter()
    base, comps = bench.compare(w, s, [bench.Arm("same")], rounds=5, repeat=5)
    print(f"spmv host {host:.3f} ms/call, GPU {gpu.median_ms:.3f} ms/call; one compare of 2 arms: "
          f"{time.perf_counter() - start:.2f} s ({comps[0].speedup:.3f}x)")
    start = time.perf_counter()
    with bench.clean_state(s, set_aside=0):
        pass
    print(f"clean_state: {(time.perf_counter() - start) * 1e3:.2f} ms")
    start = time.perf_counter()
    w.verify(s)
    print(f"verify: {(time.perf_counter() - start) * 1e3:.2f} ms")
