"""l2ctl's in-process counters against Nsight Compute on the same workload.

The workload: reset-data with a 4 MiB and a 32 MiB LUT, each without and with a window, and stride_read
at 4..64 B strides; each launch is repeated (``--repeat``) so that both tools' own run-to-run spread is
known, and each launch is made with its buffer (the LUT, stride_read's input) at several places in memory
(``--placements``).
Before each profiled launch: a warm-up of the same data (the `streaming` kernel variant, which ncu's
kernel filter skips) and an L2 flush that leaves no dirty lines and keeps persisting ones.

    python scripts/compare_ncu.py --json out.json      # runs both and compares (needs ncu on PATH)
    python scripts/compare_ncu.py --workload           # what ncu runs (no counters)

``--replay application`` (the default) compares ``l2ctl.collect`` (user replay, the setup inside each
pass) with ``ncu --replay-mode application``; ``--replay kernel`` compares ``l2ctl.counters`` (the setup
inside the block) with ``ncu --replay-mode kernel``.

The verdict (and the exit status) judges the counts that do not depend on where the buffers land
(``JUDGED``: global-load sectors and requests, the output's DRAM writes, stride_read's DRAM reads); L2
hit rates and a LUT's DRAM reads are shown with their ranges but not judged (see ``JUDGED`` for why), and
durations are summarised apart (their largest difference). Tolerances, on medians over the repetitions: hit rates 1 percentage point; bytes 2%, or 1 MiB for
values near zero (a read-only kernel's DRAM writes, a persisted LUT's reads), where a relative tolerance
is meaningless; durations 2%, or ncu's own spread over the repetitions where that is larger (the
30-50 us stride_read launches vary by 1-3% from launch to launch under ncu alone). Global-load sectors and requests must be equal in every launch, and
stride_read's sectors per request equal to l2ctl's model at 4..32 B.

Why placements: the two tools run in different processes, and each profiler allocates device memory of
its own, so the same program's buffers land on different physical pages under each. Some launches
depend on that. On the H100, over 32 placements 2 MiB apart, a 4 MiB LUT without a window read 44 to
56 MB from DRAM, and a persisted 4 MiB LUT (6.25 MiB set-aside) 0.1 to 0.4 MB at most placements but
21 MB at a few, under either tool, reproducibly within a process; where the two processes' physical
pages coincided (the same pattern at the same offsets) the tools agreed. So a configuration agrees when
every placement agrees; a metric whose medians move with the placement by more than the tolerance
(under either tool) is reported as placement-dependent and agrees when the two tools' ranges over the
placements overlap; stride_read's buffer moves the same way. Metrics that do not move with the placement
are held to the tolerance at every placement.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys

import l2ctl
from l2ctl import _backend, bench, kernels

MiB = 1 << 20
METRICS = ["lts__t_sector_hit_rate.pct", "lts__t_sector_op_read_hit_rate.pct", "dram__bytes_read.sum",
           "dram__bytes_write.sum", "gpu__time_duration.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
           "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]
KERNEL_FILTER = "regex:reset_data_plain_kernel|stride_read_kernel"
STRIDES = (4, 8, 16, 32, 64)


def configs(info):
    g = l2ctl.set_aside_granularity()
    out = []
    # 8% and 64% of the L2 (4 and 32 MiB on an H100): well inside the set-aside, and past the largest one
    for lut in (max(MiB, int(0.08 * info.l2_cache_size) // MiB * MiB), max(MiB, int(0.64 * info.l2_cache_size) // MiB * MiB)):
        out.append({"name": f"reset-data {lut // MiB} MiB, no window", "kind": "reset", "lut": lut, "set_aside": 0,
                    "hit_ratio": None})
        size = min(info.persisting_l2_cache_max_size, -(-lut // g) * g)
        out.append({"name": f"reset-data {lut // MiB} MiB, window", "kind": "reset", "lut": lut, "set_aside": size,
                    "hit_ratio": min(1.0, size / lut)})
    for s in STRIDES:
        out.append({"name": f"stride_read {s} B", "kind": "stride", "stride": s})
    return out


OPTIONS = {"mode": "application", "repeat": 5, "only": "", "placements": [0]}
COUNT_METRICS = [m for m in METRICS if m != "gpu__time_duration.sum"]
# What the verdict judges: the counts that do not depend on where the buffers land in physical memory.
# L2 hit rates and the DRAM reads of a LUT that L2 keeps (or partly keeps) depend on it, and the two
# tools' processes place buffers differently (each profiler allocates memory of its own): on the H100 a
# 4 MiB LUT read 44-56 MB over 32 placements, and on a second H200 machine 19 of 45 (configuration,
# placement) pairs differed beyond the tolerance in those metrics while every exact count agreed. They
# are reported with their ranges, not judged.
JUDGED = {"reset": ["dram__bytes_write.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"],
          "stride": ["dram__bytes_read.sum", "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                     "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]}
DURATION = "gpu__time_duration.sum"
BYTES_FLOOR = float(MiB)  # absolute tolerance for byte counts near zero
ALIGN = 2 * MiB


def run_workload(collect: bool) -> list:
    """Each config's launches, ``repeat`` times per LUT placement; with ``collect`` each carries l2ctl's
    counters. Every buffer is carved at a fixed offset out of one allocation, so a placement is an
    offset from the LUT region's start."""
    info = l2ctl.device_info()
    results = []
    threads = 8 << 20
    sizes = {"out": 1 << 30, "strided": max(OPTIONS["placements"]) + threads * max(STRIDES),
             "partials": 8 * (threads // 256 + 1),
             "lut": max(OPTIONS["placements"]) + max(c["lut"] for c in configs(info) if c["kind"] == "reset")}
    offsets, total = {}, 0
    for name, size in sizes.items():
        offsets[name] = total
        total += -(-size // ALIGN) * ALIGN
    with l2ctl.Stream() as s, l2ctl.DeviceBuffer(total) as arena:
        def view(name, nbytes=None, at=0):
            return (arena.ptr + offsets[name] + at, sizes[name] if nbytes is None else nbytes)

        out, partials = view("out"), view("partials")
        kernels.write_index(view("strided"), s)
        for cfg in configs(info):
            if OPTIONS["only"] not in cfg["name"]:
                continue
            for placement in OPTIONS["placements"]:
                if cfg["kind"] == "stride":
                    strided = view("strided", threads * max(STRIDES), placement)
                    with bench.clean_state(s, set_aside=0):
                        launch = lambda st=cfg["stride"], b=strided: kernels.stride_read(b, st, partials, s, threads=threads)  # noqa: E731
                        results += _repeat(dict(cfg, placement=placement), lambda: None, launch, s, collect)
                    continue
                lut = view("lut", cfg["lut"], placement)
                with bench.clean_state(s, set_aside=cfg["set_aside"]):
                    _backend.current().memset_device(lut[0], 7, lut[1], s.handle)
                    launch = lambda lut=lut: kernels.reset_data(out, lut, s, variant="plain")  # noqa: E731
                    warm = lambda lut=lut: kernels.reset_data(out, lut, s, variant="streaming")  # noqa: E731
                    window = (l2ctl.persist(s, lut, cfg["hit_ratio"], set_aside=None) if cfg["hit_ratio"] is not None
                              else contextlib.nullcontext())
                    with window:
                        results += _repeat(dict(cfg, placement=placement), warm, launch, s, collect)
    return results


def _repeat(cfg, warm, launch, stream, collect):
    def setup():
        warm()
        bench.flush_l2(stream, persisting=False)  # clean L2 (persisting lines stay): no pending write-backs
        stream.synchronize()

    out = []
    for _ in range(OPTIONS["repeat"]):
        if not collect:
            setup()
            launch()
            stream.synchronize()
            out.append({"config": cfg})
            continue
        if OPTIONS["mode"] == "application":  # the same state before every pass, as ncu's application replay
            results, passes = l2ctl.collect(launch, setup=setup, metrics=METRICS)
        else:  # the setup inside the block: starting the profiler disturbs L2 (see l2ctl.counters)
            with l2ctl.counters(metrics=METRICS) as c:
                setup()
                launch()
            results, passes = c.results[-1:], c.passes
        assert len(results) == 1 and ("reset_data" in results[0].name or "stride_read" in results[0].name), \
            [k.name for k in results]
        out.append({"config": cfg, "values": results[0].values, "kernel": results[0].name, "passes": passes})
    return out


def run_ncu() -> list[dict]:
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    cmd = [ncu, "--cache-control", "none", "--clock-control", "none", "--replay-mode", OPTIONS["mode"], "--metrics",
           ",".join(METRICS), "--csv", "--page", "raw", "--print-units", "base", "-k", KERNEL_FILTER,
           sys.executable, os.path.abspath(__file__), "--workload", "--replay", OPTIONS["mode"],
           "--repeat", str(OPTIONS["repeat"]), "--only", OPTIONS["only"],
           "--placements", ",".join(str(p) for p in OPTIONS["placements"])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if out.returncode != 0:
        raise RuntimeError(f"ncu failed ({out.returncode}): {out.stderr[-2000:]}")
    text = out.stdout[out.stdout.index('"ID"'):]
    rows = list(csv.DictReader(io.StringIO(text)))
    rows = [r for r in rows if r.get("ID", "").strip().isdigit()]  # drop the units row
    return [{m: float(r[m].replace(",", "")) for m in METRICS} for r in rows]


def _within(metric: str, ours: float, theirs: float, theirs_spread: float = 0.0) -> tuple[bool, float]:
    """(agrees, difference): pp for rates, relative otherwise. ``theirs_spread``: ncu's own max - min over
    the repetitions, which bounds the tolerance for durations from below."""
    if metric.endswith(".pct"):
        return abs(ours - theirs) <= 1.0, ours - theirs
    diff = (ours - theirs) / theirs if theirs else (0.0 if ours == 0 else float("inf"))
    if metric.startswith("dram__bytes") and abs(ours - theirs) <= BYTES_FLOOR:
        return True, diff
    if metric == "gpu__time_duration.sum" and abs(ours - theirs) <= theirs_spread:
        return True, diff
    return abs(diff) <= 0.02, diff


def _varies(metric: str, values: list[float]) -> bool:
    """Whether values (medians at several placements) differ by more than the tolerance."""
    return len(values) > 1 and not _within(metric, max(values), min(values))[0]


def compare(inproc: list, ncu: list) -> list[dict]:
    """One row per (configuration, placement) with medians, then a verdict per configuration."""
    if len(inproc) != len(ncu):
        raise RuntimeError(f"{len(inproc)} launches in-process but {len(ncu)} under ncu")
    groups: dict[tuple, dict] = {}
    for ours, theirs in zip(inproc, ncu):
        key = (ours["config"]["name"], ours["config"]["placement"])
        g = groups.setdefault(key, {"config": ours["config"], "l2ctl": [], "ncu": []})
        g["l2ctl"].append(ours["values"])
        g["ncu"].append(theirs)
    rows = []
    for (name, placement), g in groups.items():
        row = {"name": name, "placement": placement, "repeat": len(g["ncu"]), "metrics": {}, "ok": True}
        for m in METRICS:
            a = [v[m] for v in g["l2ctl"]]
            b = [v[m] for v in g["ncu"]]
            ok, diff = _within(m, statistics.median(a), statistics.median(b), max(b) - min(b))
            row["metrics"][m] = {"l2ctl": statistics.median(a), "ncu": statistics.median(b), "diff": diff, "ok": ok,
                                 "l2ctl_range": [min(a), max(a)], "ncu_range": [min(b), max(b)]}
            row["ok"] &= ok
        cfg = row["config"] = g["config"]
        row["sectors_exact"] = all(o[m] == t[m] for o, t in zip(g["l2ctl"], g["ncu"]) for m in METRICS[5:7])
        row["exact_ok"] = row["sectors_exact"]  # the checks that admit no tolerance
        if cfg["kind"] == "stride":
            v = g["l2ctl"][0]
            row["sectors_per_request"] = v[METRICS[5]] / v[METRICS[6]]
            row["sectors_per_request_model"] = kernels.sectors_per_request(cfg["stride"])
            if cfg["stride"] <= 32:
                row["exact_ok"] &= row["sectors_per_request"] == row["sectors_per_request_model"]
        row["ok"] &= row["exact_ok"]
        rows.append(row)
    return rows


def verdicts(rows: list[dict]) -> list[dict]:
    """Per configuration, over the counts (durations are summarised apart): "agree" (every placement agrees), "agree across placements" (each metric that
    differs moves with the placement by more than the tolerance under either tool, and the two tools'
    ranges over the placements overlap) or "disagree"."""
    out = []
    for name in dict.fromkeys(r["name"] for r in rows):
        mine = [r for r in rows if r["name"] == name]
        judged = JUDGED[mine[0]["config"]["kind"]]
        entry = {"name": name, "placements": len(mine), "verdict": "agree", "placement_dependent": [],
                 "reported_apart": []}
        if not all(r["exact_ok"] for r in mine):
            entry["verdict"] = "disagree"
        for m in COUNT_METRICS:
            if all(r["metrics"][m]["ok"] for r in mine):
                continue
            ours = [r["metrics"][m]["l2ctl"] for r in mine]
            theirs = [r["metrics"][m]["ncu"] for r in mine]
            overlap = min(ours) <= max(theirs) and min(theirs) <= max(ours)
            if m not in judged:
                entry["reported_apart"].append(m)  # placement-dependent by nature: shown, not judged
            elif overlap and (_varies(m, ours) or _varies(m, theirs)):
                entry["placement_dependent"].append(m)
                if entry["verdict"] == "agree":
                    entry["verdict"] = "agree across placements"
            else:
                entry["verdict"] = "disagree"
        out.append(entry)
    return out


def duration_summary(rows: list[dict]) -> dict:
    """How many rows' durations agree, and the largest relative difference among rows whose configuration's
    duration does not move with the placement (where it does, the rows compare different pages)."""
    moving = {r["name"] for r in rows if _varies(DURATION, [x["metrics"][DURATION]["l2ctl"] for x in rows
                                                            if x["name"] == r["name"]])}
    fixed = [r for r in rows if r["name"] not in moving] or rows
    worst = max(fixed, key=lambda r: abs(r["metrics"][DURATION]["diff"]))
    return {"within": sum(r["metrics"][DURATION]["ok"] for r in rows), "largest": worst["metrics"][DURATION]["diff"],
            "largest_row": f"{worst['name']} at +{worst['placement'] // MiB} MiB", "placement_dependent": sorted(moving)}


def _spread(lo: float, hi: float, mid: float, pct: bool) -> str:
    return f"{hi - lo:.2f} pp" if pct else (f"{(hi - lo) / mid:.1%}" if mid else "-")


def _bytes(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--repeat", type=int, default=5, help="launches per configuration and placement")
    ap.add_argument("--placements", default="0,6M,16M,26M,36M",
                    help="the LUT's offsets in its region, comma-separated (2 MiB multiples keep it aligned)")
    ap.add_argument("--only", default="", help="only the configurations whose name contains this text")
    ap.add_argument("--replay", choices=["application", "kernel"], default="application",
                    help="application: l2ctl.collect (user replay) vs ncu --replay-mode application; kernel: "
                         "l2ctl.counters vs ncu --replay-mode kernel")
    args = ap.parse_args()
    OPTIONS.update(mode=args.replay, repeat=args.repeat, only=args.only,
                   placements=[_bytes(p) for p in args.placements.split(",")])
    if args.workload:
        run_workload(collect=False)
        return 0
    inproc = run_workload(collect=True)
    theirs = run_ncu()
    rows = compare(inproc, theirs)
    table = verdicts(rows)
    print(f"medians of {args.repeat} launches each; spread = max - min over the launches; placement = the LUT's offset")
    print(f"{'workload':<28} {'at':>6} {'metric':<48} {'l2ctl':>15} {'ncu':>15} {'diff':>9} {'spread l2ctl':>12} "
          f"{'spread ncu':>11}")
    for row in rows:
        at = f"{row['placement'] // MiB}M"
        for m, v in row["metrics"].items():
            pct = m.endswith(".pct")
            diff = f"{v['diff']:+.2f} pp" if pct else f"{v['diff']:+.2%}"
            print(f"{row['name']:<28} {at:>6} {m:<48} {v['l2ctl']:15,.2f} {v['ncu']:15,.2f} {diff:>9} "
                  f"{_spread(*v['l2ctl_range'], v['l2ctl'], pct):>12} {_spread(*v['ncu_range'], v['ncu'], pct):>11}"
                  f"{'' if v['ok'] else '  <-'}")
        if "sectors_per_request" in row:
            print(f"{row['name']:<28} {at:>6} {'sectors per request (l2ctl counters / model)':<48} "
                  f"{row['sectors_per_request']:15.3f} {row['sectors_per_request_model']:15d}")
        if not row["sectors_exact"]:
            print(f"{row['name']:<28} {at:>6} global-load sectors or requests differ between the tools  <-")
    print()
    for entry in table:
        extra = f" ({', '.join(entry['placement_dependent'])})" if entry["placement_dependent"] else ""
        apart = (f"; beyond tolerance, not judged: {', '.join(entry['reported_apart'])}"
                 if entry["reported_apart"] else "")
        print(f"{entry['name']:<28} {entry['verdict']}{extra}{apart}")
    agree = all(e["verdict"] != "disagree" for e in table)
    same = sum(r["ok"] for r in rows)
    durations = duration_summary(rows)
    print(f"DURATIONS: within tolerance at {durations['within']} of {len(rows)} (configuration, placement) pairs; "
          f"largest difference {durations['largest']:+.2%} ({durations['largest_row']})")
    print(f"VERDICT ({args.replay} replay, counts): {'AGREE' if agree else 'DISAGREE'}; {same} of {len(rows)} "
          f"(configuration, placement) pairs agree within the tolerance on every metric")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": l2ctl.device_info().name, "replay": args.replay, "repeat": args.repeat,
                       "placements": OPTIONS["placements"], "metrics": METRICS, "rows": rows, "verdicts": table,
                       "passes": inproc[0].get("passes"), "agree": agree, "durations": durations,
                       "l2ctl_launches": inproc, "ncu_launches": theirs}, f, indent=1)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
