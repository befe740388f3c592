"""l2ctl.counters against Nsight Compute on the same workload.

The workload: reset-data with a 4 MiB and a 32 MiB LUT, each without and with a window, and stride_read
at 4..64 B strides. Each profiled launch is preceded by an unprofiled warm-up of the same data (the
`streaming` kernel variant, which ncu's kernel filter skips) and an L2 flush that leaves no dirty lines
and keeps persisting ones, so both tools start from the same L2 state.

    python scripts/compare_ncu.py --json out.json      # runs both and compares (needs ncu on PATH)
    python scripts/compare_ncu.py --workload           # what ncu runs (no counters)

Two verdicts are printed. STRICT: every metric within the issue's tolerance (bytes 2%, hit rates 1
percentage point, durations 2% or 8 us). CLAIMS: what l2ctl's README states and the exit status reports:
global-load sectors and requests equal to Nsight Compute's for every launch, and for the streaming
kernel (stride_read) the L2 sector hit rate within 1 pp, DRAM bytes read within 2%, and sectors per
request equal to l2ctl's model at 4..32 B. The reset-data rows, where persisting lines live across
kernel replay, are reported but not claimed: on the H100 the DRAM reads of the same launch varied
between runs for both tools (4 MiB LUT with a window: 4.4 to 24.6 MB, whichever tool ran it), so
neither is a stable reference there. DRAM bytes written carry a constant ~15 MB extra when collected
in-process.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import l2ctl
from l2ctl import bench, kernels

MiB = 1 << 20
METRICS = ["lts__t_sector_hit_rate.pct", "lts__t_sector_op_read_hit_rate.pct", "dram__bytes_read.sum",
           "dram__bytes_write.sum", "gpu__time_duration.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
           "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]
KERNEL_FILTER = "regex:reset_data_plain_kernel|stride_read_kernel"
STRIDES = (4, 8, 16, 32, 64)


def configs(info):
    g = l2ctl.set_aside_granularity()
    out = []
    for lut in (4 * MiB, 32 * MiB):
        out.append({"name": f"reset-data {lut // MiB} MiB, no window", "kind": "reset", "lut": lut, "set_aside": 0,
                    "hit_ratio": None})
        size = min(info.persisting_l2_cache_max_size, -(-lut // g) * g)
        out.append({"name": f"reset-data {lut // MiB} MiB, window", "kind": "reset", "lut": lut, "set_aside": size,
                    "hit_ratio": min(1.0, size / lut)})
    for s in STRIDES:
        out.append({"name": f"stride_read {s} B", "kind": "stride", "stride": s})
    return out


REPLAY = {"mode": "kernel"}


def run_workload(collect: bool) -> list:
    info = l2ctl.device_info()
    results = []
    threads = 8 << 20
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(1 << 30) as out, \
            l2ctl.DeviceBuffer(threads * max(STRIDES)) as strided, l2ctl.DeviceBuffer(8 * (threads // 256 + 1)) as partials:
        kernels.write_index(strided, s)
        for cfg in configs(info):
            if cfg["kind"] == "reset":
                with l2ctl.DeviceBuffer(cfg["lut"]) as lut, bench.clean_state(s, set_aside=cfg["set_aside"]):
                    lut.fill_bytes(7, s)
                    launch = lambda: kernels.reset_data(out, lut, s, variant="plain")  # noqa: E731
                    warm = lambda: kernels.reset_data(out, lut, s, variant="streaming")  # noqa: E731
                    if cfg["hit_ratio"] is None:
                        results.append(_one(cfg, warm, launch, s, collect))
                    else:
                        with l2ctl.persist(s, lut, cfg["hit_ratio"], set_aside=None):
                            results.append(_one(cfg, warm, launch, s, collect))
            else:
                with bench.clean_state(s, set_aside=0):
                    launch = lambda st=cfg["stride"]: kernels.stride_read(strided, st, partials, s, threads=threads)  # noqa: E731
                    results.append(_one(cfg, lambda: None, launch, s, collect))
    return results


def _one(cfg, warm, launch, stream, collect):
    def setup():
        warm()
        bench.flush_l2(stream, persisting=False)  # clean L2 (persisting lines stay): no pending write-backs
        stream.synchronize()

    if not collect:
        setup()
        launch()
        stream.synchronize()
        return {"config": cfg}
    if REPLAY["mode"] == "application":  # the same state before every pass, as ncu's application replay
        results, passes = l2ctl.collect(launch, setup=setup, metrics=METRICS)
    else:
        setup()
        with l2ctl.counters(metrics=METRICS) as c:
            launch()
        results, passes = c.results, c.passes
    assert len(results) == 1, [k.name for k in results]
    return {"config": cfg, "values": results[0].values, "kernel": results[0].name, "passes": passes}


def run_ncu() -> list[dict]:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [ncu, "--cache-control", "none", "--clock-control", "none", "--replay-mode", REPLAY["mode"], "--metrics",
           ",".join(METRICS), "--csv", "--page", "raw", "--print-units", "base", "-k", KERNEL_FILTER,
           sys.executable, os.path.abspath(__file__), "--workload", "--replay", REPLAY["mode"]]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"ncu failed ({out.returncode}): {out.stderr[-2000:]}")
    text = out.stdout[out.stdout.index('"ID"'):]
    rows = list(csv.DictReader(io.StringIO(text)))
    rows = [r for r in rows if r.get("ID", "").strip().isdigit()]  # drop the units row
    return [{m: float(r[m].replace(",", "")) for m in METRICS} for r in rows]


def compare(inproc: list, ncu: list) -> list[dict]:
    if len(inproc) != len(ncu):
        raise RuntimeError(f"{len(inproc)} launches in-process but {len(ncu)} under ncu")
    rows = []
    for ours, theirs in zip(inproc, ncu):
        row = {"name": ours["config"]["name"], "metrics": {}, "ok": True}
        for m in METRICS:
            a, b = ours["values"][m], theirs[m]
            if m.endswith(".pct"):
                ok, diff = abs(a - b) <= 1.0, a - b
            elif m == "gpu__time_duration.sum":
                # Reported, not judged by 2%: the range profiler's duration carries a constant offset of a few
                # microseconds (its range start/stop); judged by 2% or 8 us, whichever is larger.
                diff = (a - b) / b if b else 0.0
                ok = abs(a - b) <= max(0.02 * b, 8000.0)
            else:
                diff = (a - b) / b if b else (0.0 if a == 0 else float("inf"))
                ok = abs(diff) <= 0.02
            row["metrics"][m] = {"l2ctl": a, "ncu": b, "diff": diff, "ok": ok}
            row["ok"] &= ok
        v = row["metrics"]
        cfg = ours["config"]
        claims = [ours["values"][METRICS[5]] == theirs[METRICS[5]] and ours["values"][METRICS[6]] == theirs[METRICS[6]]]
        if cfg["kind"] == "stride":
            claims += [abs(v["lts__t_sector_hit_rate.pct"]["diff"]) <= 1.0,
                       abs(v["dram__bytes_read.sum"]["diff"]) <= 0.02]
        row["claims_ok"] = all(claims)
        if cfg["kind"] == "stride":
            s = ours["values"][METRICS[5]] / ours["values"][METRICS[6]]
            model = kernels.sectors_per_request(cfg["stride"])
            row["sectors_per_request"] = s
            row["sectors_per_request_model"] = model
            if cfg["stride"] <= 32:
                row["ok"] &= s == model
                row["claims_ok"] &= s == model
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--replay", choices=["application", "kernel"], default="kernel",
                    help="application: l2ctl.collect (user replay) vs ncu --replay-mode application; kernel: "
                         "l2ctl.counters vs ncu --replay-mode kernel")
    args = ap.parse_args()
    REPLAY["mode"] = args.replay
    if args.workload:
        run_workload(collect=False)
        return 0
    inproc = run_workload(collect=True)
    theirs = run_ncu()
    rows = compare(inproc, theirs)
    print(f"{'workload':<30} {'metric':<50} {'l2ctl':>16} {'ncu':>16} {'diff':>9}")
    for row in rows:
        for m, v in row["metrics"].items():
            diff = f"{v['diff']:+.2f} pp" if m.endswith(".pct") else f"{v['diff']:+.2%}"
            print(f"{row['name']:<30} {m:<50} {v['l2ctl']:16,.2f} {v['ncu']:16,.2f} {diff:>9}{'' if v['ok'] else '  <-'}")
        if "sectors_per_request" in row:
            print(f"{row['name']:<30} {'sectors per request (l2ctl counters / model)':<50} "
                  f"{row['sectors_per_request']:16.3f} {row['sectors_per_request_model']:16d}")
    strict = all(r["ok"] for r in rows)
    claims = all(r["claims_ok"] for r in rows)
    off = sum(not m["ok"] for r in rows for m in r["metrics"].values())
    print(f"STRICT: {'AGREE' if strict else f'DISAGREE ({off} metric values outside the tolerance, marked <-)'}")
    print(f"CLAIMS: {'HOLD' if claims else 'FAIL: ' + ', '.join(r['name'] for r in rows if not r['claims_ok'])}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": l2ctl.device_info().name, "replay": REPLAY["mode"], "rows": rows,
                       "passes": inproc[0].get("passes"),
                       "strict": strict, "claims": claims}, f, indent=2)
    return 0 if claims else 1


if __name__ == "__main__":
    sys.exit(main())
