"""Why in-process counters differed from Nsight Compute: one experiment per hypothesis, on the GPU.

Each row collects the same launch by user replay, varying one thing: whether the setup (warm-up of
the LUT, then an L2 flush that leaves no dirty lines) runs before the pass starts or inside it, and
the profiler's range capacity (the size of its counter-data image). Also reports the set-aside limit
around the profiler's start, to see whether CUPTI changes it.

    python scripts/diag_counters.py [--json out.json]   # setup before/inside the pass, range capacity
    python scripts/diag_counters.py --persist-matrix     # a persisted LUT by passes and output size
    python scripts/diag_counters.py --placement-sweep 2  # a persisted 2 MiB LUT at 32 placements
    python scripts/diag_counters.py --durations          # stride_read duration by what precedes it

Outputs from the H100: benchmarks/results/h100/counters_diagnosis.txt.
"""

from __future__ import annotations

import argparse
import json

import l2ctl
from l2ctl import _core, bench, kernels
from l2ctl._counters import load_cupti

MiB = 1 << 20
METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct", "gpu__time_duration.sum"]


def limit_around_start(stream) -> dict:
    """The limit and a stream window's read-back before the profiler, after its start and after a pass."""
    seen = {"before": l2ctl.get_set_aside()}
    load_cupti()
    profiler = _core.RangeProfiler(0, ["gpu__time_duration.sum"], 4, True)
    seen["after_enable"] = l2ctl.get_set_aside()
    profiler.start()
    seen["after_start"] = l2ctl.get_set_aside()
    kernels.write_index(_tiny(), stream)
    stream.synchronize()
    seen["after_kernel"] = l2ctl.get_set_aside()
    while not profiler.end_pass():
        profiler.start()
        kernels.write_index(_tiny(), stream)
    profiler.stop()
    del profiler
    seen["after_stop"] = l2ctl.get_set_aside()
    return seen


_TINY = []


def _tiny():
    if not _TINY:
        _TINY.append(l2ctl.DeviceBuffer(1 << 20))
    return _TINY[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--persist-matrix", action="store_true")
    ap.add_argument("--placement-sweep", type=int, metavar="LUT_MIB")
    ap.add_argument("--durations", action="store_true")
    args = ap.parse_args()
    if args.durations:
        duration_diag()
        return 0
    if args.placement_sweep:
        placement_sweep(args.placement_sweep, [i * 2 * MiB for i in range(32)])
        return 0
    if args.persist_matrix:
        persist_matrix()
        return 0
    info = l2ctl.device_info()
    g = l2ctl.set_aside_granularity()
    rows = []
    threads = 8 << 20
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(1 << 30) as out, l2ctl.DeviceBuffer(threads * 4) as strided, \
            l2ctl.DeviceBuffer(8 * (threads // 256 + 1)) as partials:
        kernels.write_index(strided, s)
        with bench.clean_state(s, set_aside=3 * g):
            limits = limit_around_start(s)
        print("limit around the profiler:", limits)
        cases = []
        for lut in (4 * MiB, 32 * MiB):
            size = min(info.persisting_l2_cache_max_size, -(-lut // g) * g)
            cases.append((f"reset {lut // MiB} MiB window", lut, size, min(1.0, size / lut)))
        cases.append(("stride_read 4 B", None, 0, None))
        variants = [("setup before start", False, 64), ("setup in pass", True, 64),
                    ("setup before start, 2 ranges", False, 2), ("setup in pass, 512 ranges", True, 512)]
        for name, lut_bytes, set_aside, ratio in cases:
            for vname, in_pass, max_ranges in variants:
                lut = l2ctl.DeviceBuffer(lut_bytes) if lut_bytes else None
                try:
                    with bench.clean_state(s, set_aside=set_aside):
                        if lut is not None:
                            lut.fill_bytes(7, s)

                            def warm():
                                kernels.reset_data(out, lut, s, variant="streaming")

                            def launch():
                                kernels.reset_data(out, lut, s, variant="plain")
                        else:
                            def warm():
                                pass

                            def launch():
                                kernels.stride_read(strided, 4, partials, s, threads=threads)

                        def setup():
                            warm()
                            bench.flush_l2(s, persisting=False)
                            s.synchronize()

                        if ratio is not None:
                            with l2ctl.persist(s, lut, ratio, set_aside=None):
                                res, passes = l2ctl.collect(launch, setup=setup, metrics=METRICS,
                                                            setup_in_pass=in_pass, max_ranges=max_ranges)
                        else:
                            res, passes = l2ctl.collect(launch, setup=setup, metrics=METRICS, setup_in_pass=in_pass,
                                                        max_ranges=max_ranges)
                    v = res[-1].values
                    row = {"case": name, "variant": vname, "ranges": len(res), "passes": passes, **v}
                except Exception as exc:  # noqa: BLE001 - a diagnostic: report and go on
                    row = {"case": name, "variant": vname, "error": repr(exc)[:300]}
                finally:
                    if lut is not None:
                        lut.free()
                rows.append(row)
                if "error" in row:
                    print(f"{name:<22} {vname:<32} ERROR {row['error']}")
                else:
                    print(f"{name:<22} {vname:<32} read {row[METRICS[0]] / 1e6:9.3f} MB  write "
                          f"{row[METRICS[1]] / 1e6:9.3f} MB  hit {row[METRICS[2]]:6.2f}%  "
                          f"{row[METRICS[3]] / 1e3:8.2f} us  ranges {row['ranges']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": info.name, "limits": limits, "rows": rows}, f, indent=1)
    return 0




def persist_matrix() -> None:
    """A persisted 4 MiB LUT collected with the setup inside the pass: DRAM reads by the number of
    passes the metrics need and by the output's size, the first collection of the process marked."""
    metric_sets = {"1 metric": ["dram__bytes_read.sum"], "2 metrics": METRICS[:2], "7 metrics": [
        "lts__t_sector_hit_rate.pct", "lts__t_sector_op_read_hit_rate.pct", "dram__bytes_read.sum",
        "dram__bytes_write.sum", "gpu__time_duration.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]}
    g = l2ctl.set_aside_granularity()
    size = -(-4 * MiB // g) * g
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(4 * MiB) as lut:
        lut.fill_bytes(5, s)
        for out_bytes in (256 * MiB, 1 << 30):
            with l2ctl.DeviceBuffer(out_bytes) as out, bench.clean_state(s, set_aside=size), \
                    l2ctl.persist(s, lut, 1.0, set_aside=None):
                def setup():
                    kernels.reset_data(out, lut, s, variant="streaming")
                    bench.flush_l2(s, persisting=False)
                    s.synchronize()

                for label, metrics in metric_sets.items():
                    for trial in range(3):
                        res, passes = l2ctl.collect(lambda: kernels.reset_data(out, lut, s), setup=setup,
                                                    metrics=metrics)
                        print(f"persisted 4 MiB LUT, out {out_bytes // MiB} MiB, {label} ({passes} passes), "
                              f"trial {trial}: DRAM read {res[0]['dram__bytes_read.sum'] / 1e6:.3f} MB")


def placement_sweep(lut_mib: int, placements: list[int]) -> None:
    """A persisted LUT's DRAM reads (setup inside the pass) at each offset of one allocation."""
    g = l2ctl.set_aside_granularity()
    size = -(-4 * MiB // g) * g
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(max(placements) + lut_mib * MiB) as region, \
            l2ctl.DeviceBuffer(256 * MiB) as out:
        for at in placements:
            lut = (region.ptr + at, lut_mib * MiB)
            with bench.clean_state(s, set_aside=size), l2ctl.persist(s, lut, 1.0, set_aside=None):
                def setup():
                    kernels.reset_data(out, lut, s, variant="streaming")
                    bench.flush_l2(s, persisting=False)
                    s.synchronize()

                res, _ = l2ctl.collect(lambda: kernels.reset_data(out, lut, s), setup=setup,
                                       metrics=["dram__bytes_read.sum"])
                print(f"persisted {lut_mib} MiB LUT in a {size / MiB:.2f} MiB set-aside at +{at // MiB} MiB: "
                      f"DRAM read {res[0]['dram__bytes_read.sum'] / 1e6:.3f} MB")


def duration_diag() -> None:
    """stride_read 16 B durations by what precedes the profiled launch in the pass (medians of 7)."""
    import statistics
    threads = 8 << 20
    metrics = ["gpu__time_duration.sum", "dram__bytes_read.sum"]
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(threads * 16) as buf, \
            l2ctl.DeviceBuffer(8 * (threads // 256 + 1)) as partials, l2ctl.DeviceBuffer(1 << 20) as tiny:
        kernels.write_index(buf, s)

        def run():
            kernels.stride_read(buf, 16, partials, s, threads=threads)

        def flush():
            bench.flush_l2(s, persisting=False)
            s.synchronize()

        def flush_then_tiny():
            flush()
            kernels.write_index(tiny, s)
            s.synchronize()

        variants = {"flush in pass": (flush, True), "flush before start": (flush, False),
                    "flush + tiny kernel in pass": (flush_then_tiny, True), "no setup": (None, True)}
        with bench.clean_state(s, set_aside=0):
            for name, (setup, inside) in variants.items():
                got = [l2ctl.collect(run, setup=setup, metrics=metrics, setup_in_pass=inside)[0][0].values
                       for _ in range(7)]
                d = statistics.median(v[metrics[0]] for v in got)
                r = statistics.median(v[metrics[1]] for v in got)
                print(f"stride_read 16 B, {name:<28} duration {d / 1e3:7.2f} us   DRAM read {r / 1e6:8.2f} MB")
            for _ in range(2):  # the same launches timed with events, no profiler
                flush()
                with l2ctl.Timer(s) as t:
                    run()
                print(f"stride_read 16 B, events, no profiler        {t.elapsed_ms * 1e3:7.2f} us")


if __name__ == "__main__":
    raise SystemExit(main())
