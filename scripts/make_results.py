"""Regenerates the tables of docs/results.md and README.md from the benchmark records in
benchmarks/results/<gpu>/ (the JSON each command wrote). A table lives between
``<!-- generated:NAME -->`` and ``<!-- end:NAME -->``; tests/test_docs.py fails when a table differs
from what its records give, so the documents cannot drift from the measurements. A table whose record is not
measured yet stands as ``<!-- pending:NAME -->`` on a line of its own: it stays so while its generator gives
nothing, and becomes a generated table the first time its record is there.

    python scripts/make_results.py          # rewrite the tables in place
    python scripts/make_results.py --check  # exit 1 when a table is out of date
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import statistics
import sys
from typing import Any, Callable, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "results"
DOCS = [ROOT / "docs" / "results.md", ROOT / "README.md"]
MiB = 1 << 20
GPUS = {"h100": "H100", "h200": "H200"}


def load(gpu: str, name: str) -> Optional[dict[str, Any]]:
    path = RECORDS / gpu / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def newest(gpu: str, name: str) -> Optional[dict[str, Any]]:
    """The newest of a measurement's records (by the timestamp inside): ``<name>.json`` and ``<name>_<commit>.json``
    (a later run kept beside it); a ``_repeat`` record, the same commit run again at once, is never the newest."""
    paths = [RECORDS / gpu / f"{name}.json", *sorted((RECORDS / gpu).glob(f"{name}_*.json"))]
    records = [json.loads(p.read_text()) for p in paths if p.exists() and not p.stem.endswith("_repeat")]
    return max(records, key=lambda r: r["environment"]["timestamp"], default=None)


def mib(n: float) -> str:
    return f"{n / MiB:.2f}".rstrip("0").rstrip(".") if n else "0"


def default_limit(env: dict[str, Any]) -> int:
    """The driver's default limit (where "auto" stops): 30% of the max, rounded up to the granularity."""
    dev = env["device"]
    step = dev.get("set_aside_granularity") or 1
    return min(dev["persisting_l2_cache_max_size"], -(-math.ceil(0.3 * dev["persisting_l2_cache_max_size"]) // step) * step)


def workload_runs(gpu: str) -> list[dict[str, Any]]:
    """Every gallery run of ``gpu``: the records under workloads/ (one per `bench workloads` process, named
    by the GPU and the run), else the single workloads.json of earlier sessions."""
    folder = RECORDS / gpu / "workloads"
    if folder.is_dir() and any(folder.glob("*.json")):
        return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    single = load(gpu, "workloads")
    return [] if single is None else [single]


def workload_rows(gpu: str) -> dict[str, dict[str, Any]]:
    """Each gallery row over every run: the row of its lowest run (by its lowest tuned speedup), with
    ``runs``, ``gpus`` (distinct GPUs: separate machines), ``tuned_low``/``tuned_high`` (the lowest and the
    highest of each run's lowest re-measure), and ``disagree`` when some runs persist a buffer and others
    choose no persistence. Rows a run skipped are listed from the first run."""
    found: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for run in workload_runs(gpu):
        uuid = run["environment"]["device"].get("uuid", "")
        for row in run["summary"]["rows"]:
            found.setdefault(row["workload"], []).append((uuid, row))
    out = {}
    for name, entries in found.items():
        lows = [min(row["tuned_speedups"]) for _, row in entries]
        lowest = entries[lows.index(min(lows))][1]
        # whether torch graphed the row: from the lowest run where it says, else from another run (older runs
        # did not record it)
        described = [row["described"] for _, row in entries if "graphed_compilations" in row.get("described", {})]
        own = lowest.get("described", {})
        out[name] = {**lowest, "runs": len(entries), "gpus": len({uuid for uuid, _ in entries}),
                     "described": own if "graphed_compilations" in own else (described[-1] if described else own),
                     "tuned_low": min(lows), "tuned_high": max(min(row["tuned_speedups"]) for _, row in entries),
                     "disagree": len({row["tuned_buffer"] is None for _, row in entries}) > 1}
    return out


def tuned_range(row: dict[str, Any]) -> str:
    """The tuned speedup over a row's runs: one figure when they agree to 0.01, else lowest-highest; runs that
    disagree on whether persistence pays say so."""
    lo, hi = f"{row['tuned_low']:.2f}", f"{row['tuned_high']:.2f}"
    text = f"{lo}x" if lo == hi else f"{lo}-{hi}x"
    return text + (" (runs disagree)" if row["disagree"] else "")


def runs_note(gpus: list[str]) -> str:
    """Which runs a gallery table stands on, per GPU."""
    parts = []
    for g in gpus:
        runs = workload_runs(g)
        if runs:
            n = len({r["environment"]["device"].get("uuid", "") for r in runs})
            commits = sorted({r["environment"].get("commit", "?")[:7] for r in runs})
            parts.append(f"{GPUS[g]}: {len(runs)} run{'s' * (len(runs) > 1)} on {n} GPU{'s' * (n > 1)} "
                         f"(commit {', '.join(commits)})")
    return "; ".join(parts)


# ---- the tables ----------------------------------------------------------------------------------------
# ---- the tables ----------------------------------------------------------------------------------------


def tax(gpu: str) -> str:
    r = load(gpu, "tax")
    if r is None:
        return ""
    cap = default_limit(r["environment"])
    recs = sorted(r["records"], key=lambda x: x["config"]["set_aside_granted"])
    head = [mib(x["config"]["set_aside_granted"]) for x in recs]
    bold = [x["config"]["set_aside_granted"] == cap for x in recs]

    def row(label: str, key: str) -> str:
        cells = [f"**{x['metrics'][key]:,.0f}**" if b else f"{x['metrics'][key]:,.0f}" for x, b in zip(recs, bold)]
        return f"| {label} | " + " | ".join(cells) + " |"

    header = " | ".join(f"**{h}**" if b else h for h, b in zip(head, bold))
    return "\n".join([f"| {GPUS[gpu]} set-aside (MiB) | {header} |", "|---" * (len(recs) + 1) + "|",
                      row("write-only GB/s", "write_gbps"), row("copy GB/s", "copy_gbps")])


def _choice(row: dict[str, Any]) -> str:
    if not row["tuned_buffer"]:
        return "no persistence"
    text = f"`{row['tuned_buffer']}`: {mib(row['tuned_set_aside'])} MiB, hit {row['tuned_hit_ratio']:.2f}"
    if row["tuned_num_bytes"]:
        text += f", first {mib(row['tuned_num_bytes'])} MiB"
    return text


def gallery(gpu: str) -> str:
    runs = workload_runs(gpu)
    if not runs:
        return ""
    rows = workload_rows(gpu)
    lines = [f"Runs: {runs_note([gpu])}; each row is its lowest run, with the range of the tuned speedup over all.",
             "", "| workload | baseline ms | recipe (its copy tax) | hit 1.0 | tuned, lowest run's 3 | tuned over the runs "
             "| tuned choice | copy tax | tune s (candidates) |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows.values():
        three = " / ".join(f"{x:.2f}" for x in row["tuned_speedups"])
        lines.append(f"| {row['workload']} ({row['hot']} {mib(row['hot_bytes'])} MiB) | {row['baseline_ms']:.3f} | "
                     f"{row['recipe_speedup']:.2f}x ({row['recipe_copy_slowdown']:.2f}x) | {row['hit1_speedup']:.2f}x | "
                     f"{three} | {tuned_range(row)} | {_choice(row)} | {row['tuned_copy_slowdown']:.2f}x | "
                     f"{row['tune_seconds']:.1f} ({row['candidates']}) |")
    for name, reason in runs[0]["summary"]["skipped"].items():
        lines.append(f"| {name} | skipped: {reason} | | | | | | | |")
    return "\n".join(lines)


README_NAMES = {
    "broadcast": "`x + bias`, 1 GiB streaming",
    "scatter-add": "`acc.index_add_`, acc 0.64 x L2",
    "step": "embedding + broadcast + scatter-add",
    "index_select": "`index_select`, random rows",
    "embedding_bag": "`F.embedding_bag`",
    "spmv": "cuSPARSE SpMV (CuPy), vector persisted",
}


def readme_gallery() -> str:
    rows = {gpu: workload_rows(gpu) for gpu in GPUS if workload_runs(gpu)}
    gpus = list(rows)
    lines = ["| workload (sizes from the L2) | " + " | ".join(f"{GPUS[g]}: tuned (its copy tax)" for g in gpus)
             + " | what `l2ctl.tune` chose |", "|---" * (len(gpus) + 2) + "|"]
    for name, label in README_NAMES.items():
        cells, choices = [], []
        for g in gpus:
            row = rows[g].get(name)
            if row is None:
                cells.append("-")
                continue
            cell = f"{tuned_range(row)} ({row['tuned_copy_slowdown']:.2f}x)"
            cells.append(f"**{cell}**" if row["tuned_low"] >= 1.1 else cell)
            choices.append(f"`{row['tuned_buffer']}`" if row["tuned_buffer"] else "no persistence")
        choice = choices[0] if len(set(choices)) == 1 else " / ".join(choices)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {choice} |")
    runs = "; ".join(f"{GPUS[g]} {len(workload_runs(g))}" for g in gpus)
    return "\n".join(lines + ["", f"The lowest run, and the range over the runs ({runs}; docs/results.md lists them)."])



def _pair(values: list[float], fmt: str = "{:.2f}x") -> str:
    return " / ".join(fmt.format(v) for v in values)


def readme_findings() -> str:
    """The README's findings, every number and every comparison from the records (tax.json, workloads.json
    of both GPUs); a record that no longer supports a sentence fails here, not silently in the prose."""
    gpus = [g for g in GPUS if load(g, "tax") and workload_runs(g)]
    if not gpus:
        return ""
    tax_r = {g: load(g, "tax") for g in gpus}
    work = {g: workload_rows(g) for g in gpus}
    names = " / ".join(GPUS[g] for g in gpus)
    default = [f"{mib(tax_r[g]['environment']['device']['persisting_limit_at_start'])} MiB on an {GPUS[g]}" for g in gpus]
    fractions = {round(tax_r[g]["environment"]["device"]["persisting_limit_at_start"]
                       / tax_r[g]["environment"]["device"]["persisting_l2_cache_max_size"], 2) for g in gpus}
    if len(fractions) != 1:
        raise ValueError(f"the default limit is not one fraction of the max: {fractions}")
    at_max = [tax_r[g]["summary"]["copy_slowdown_at_max"] for g in gpus]
    for g in gpus:  # "75% of L2, the max on both": the recipe asks more than the max
        dev = tax_r[g]["environment"]["device"]
        if 0.75 * dev["l2_cache_size"] < dev["persisting_l2_cache_max_size"]:
            raise ValueError(f"{g}: 75% of L2 is below the max; rewrite the README's recipe sentence")
    for g in gpus:  # "full speed up to the default": every copy up to it within 2% of no set-aside
        recs, cap = tax_r[g]["records"], default_limit(tax_r[g]["environment"])
        none = next(x["metrics"]["copy_gbps"] for x in recs if x["config"]["set_aside_granted"] == 0)
        if any(x["metrics"]["copy_gbps"] < 0.98 * none for x in recs if x["config"]["set_aside_granted"] <= cap):
            raise ValueError(f"{g}: a copy slows below the default limit; rewrite the README's tax sentence")
    scatter = {g: work[g]["scatter-add"] for g in gpus}
    broadcast = {g: work[g]["broadcast"] for g in gpus}
    step = {g: work[g]["step"] for g in gpus}
    gathers = [work[g][w] for g in gpus for w in ("index_select", "embedding")]
    # The sentences below claim: the recipe gains on the scatter-add, loses on the broadcast and the step,
    # and stays below the tuned choice; the gathers gain nothing and tune says so.
    if not all(scatter[g]["recipe_ci"][0] > 1 and broadcast[g]["recipe_ci"][1] < 1 and step[g]["recipe_ci"][1] < 1
               and scatter[g]["tuned_min_speedup"] > scatter[g]["recipe_speedup"] for g in gpus):
        raise ValueError("the records no longer support the README's sentence on the recipe: rewrite it")
    if not all(x["tuned_buffer"] is None and x["hit1_ci"][1] < 1.01 for x in gathers):
        raise ValueError("the records no longer support the README's sentence on gathers: rewrite it")
    return "\n".join([
        f"- **The set-aside is a tax on every other kernel.** Up to the driver's default limit "
        f"({next(iter(fractions)):.0%} of the max: {', '.join(default)}) a copy elsewhere on the GPU runs at "
        f"full speed; at the max it runs {_pair(at_max)} ({names}) slower.",
        f"- **The textbook recipe** (set aside 75% of L2, the max on both) is a gamble: "
        f"{_pair([scatter[g]['recipe_speedup'] for g in gpus])} on a scatter-add into an accumulator, but "
        f"{_pair([broadcast[g]['recipe_speedup'] for g in gpus])} on a broadcast and "
        f"{_pair([step[g]['recipe_speedup'] for g in gpus])} on a small training step, slower than without it. "
        f"`l2ctl.tune` got {_pair([scatter[g]['tuned_min_speedup'] for g in gpus])} on the scatter-add at a "
        f"{_pair([scatter[g]['tuned_copy_slowdown'] for g in gpus])} tax.",
        "- **Persistence pays for some access patterns only:** a buffer re-read while far more data streams "
        "past. Gathers (`index_select`, `F.embedding`) gain nothing, and `tune` says so: no persistence.",
    ])


APP_LIFETIME = [("h100", "app_lifetime", "H100", "CUDA 13"), ("h100", "app_lifetime_cu12", "H100", "CUDA 12"),
                ("h200", "app_lifetime", "H200", "CUDA 13"), ("h200", "app_lifetime_cu12", "H200", "CUDA 12")]


def _app_records() -> list[tuple[str, str, dict[str, Any]]]:
    """The app-lifetime example's records (examples/app_lifetime.py), each checked: outputs verified, device
    restored."""
    found = []
    for gpu, name, label, build in APP_LIFETIME:
        record = load(gpu, name)
        if record is None:
            continue
        if not (record["verified"] and record["device_restored"]):
            raise ValueError(f"{gpu}/{name}.json: outputs not verified or the device not restored")
        found.append((label, build, record))
    return found


def app_lifetime() -> str:
    """A model served for its lifetime three ways (examples/app_lifetime.py): the same code without l2ctl, a
    hand-written set-aside with no window (as StreamDiffusion's helper does), l2ctl's tuned app-lifetime scope."""
    rows = ["| GPU, build | step without l2ctl | hand-written set-aside: step (its copy tax) | l2ctl (its copy tax) "
            "| l2ctl's set-aside, window | commit |", "|---|---|---|---|---|---|"]
    for label, build, r in _app_records():
        scope, harm = r["l2ctl_scope"], r["helper_harm"]
        rows.append(f"| {label}, {build} | {r['median_step_ms']['baseline']:.3f} ms | {r['speedup']['helper']:.2f}x "
                    f"({harm['copy_slowdown']:.2f}x) | **{r['speedup']['l2ctl']:.2f}x** ({r['l2ctl_copy_slowdown']:.2f}x) "
                    f"| {mib(scope['set_aside'])} MiB, {mib(scope['window_bytes'])} MiB | {r['environment']['commit']} |")
    return "\n".join(rows)


def readme_app() -> str:
    """The README's app-lifetime line: the lowest l2ctl and the worst hand-written speedup over the H100 records."""
    h100 = [r for label, _b, r in _app_records() if label == "H100"]
    if not h100:
        return ""
    return (f"`examples/app_lifetime.py` on an H100: l2ctl {min(r['speedup']['l2ctl'] for r in h100):.2f}x, a "
            f"hand-written set-aside without a window {min(r['speedup']['helper'] for r in h100):.2f}x.")


def readme_autotune() -> str:
    """The README's autotune line: each gallery workload's speedup, beside tune-then-persist's, from the newest H200
    record (scripts/bench_autotune.py)."""
    r = newest("h200", "autotune")
    if r is None:
        return ""
    parts = [f"{'`index_select`' if x['workload'] == 'index_select' else x['workload']} "
             f"{x['autotune_speedup']:.2f}x ({x['tune+persist_speedup']:.2f}x)" for x in r["results"]]
    forms = newest("h200", "torch_autotune")
    named = {"compiled-module": "reduce-overhead", "compiled-in-function": "in a function",
             "default-graph": "a `CUDAGraph` replayed", "graphed-callables": "`make_graphed_callables`"}
    torch_forms = "" if forms is None else " torch's forms: " + ", ".join(
        f"{named[x['form']]} {x['autotune_speedup']:.2f}x ({x['tune+persist_speedup']:.2f}x)"
        for x in forms["results"] if x.get("form") in named and all(x["verified"].values())) + "."
    return (f"H200, against the same step without l2ctl (in brackets: `tune` then `persist`): {', '.join(parts)}; "
            f"decided within {max(x['decided_at_call'] for x in r['results'])} calls; "
            f"{max(x['autotune_cost_us'] for x in r['results'] + (forms or {}).get('results', [])):.0f} us a call "
            "at most." + torch_forms)


def autotune_table(gpu: str, record: str = "autotune", key: str = "workload") -> str:
    """docs/results.md: autotune against the same step without l2ctl and against tune then persist (the gallery's
    eager steps; ``record="torch_autotune", key="form"``: torch's forms, scripts/bench_autotune_torch.py)."""
    r = newest(gpu, record)
    if r is None:
        return ""
    rows = [f"| {key} | without l2ctl | autotune (95% CI) | `tune` + `persist` | ratio | decided at call | host cost "
            "per call | step calls as made | what autotune chose |", "|---|---|---|---|---|---|---|---|---|"]
    for x in r["results"]:
        chosen = x["decision"].split("] ", 1)[1].split(", decided at")[0]
        rows.append(f"| {x[key]} | {x['baseline_median_ms']:.3f} ms | **{x['autotune_speedup']:.3f}x** "
                    f"({x['autotune_ci'][0]:.3f}-{x['autotune_ci'][1]:.3f}) | {x['tune+persist_speedup']:.3f}x | "
                    f"{x['autotune_vs_manual']:.3f} | {x['decided_at_call']} | {max(x['autotune_cost_us'], 0.0):.1f} us | "
                    f"{'yes' if x['calls_match'] else 'no'} | {chosen} |")
    env = r["environment"]
    rows.append(f"\n{env['device']['name']}, CUDA driver API {env['driver_version'] // 1000}.{env['driver_version'] % 1000 // 10}, "
                f"commit {env['commit']}; "
                f"{r['results'][0]['config']['rounds']} rounds of {r['results'][0]['config']['calls']} calls per "
                f"arm, " + _verified(r["results"], key) + ".")
    return "\n".join(rows)


def _verified(results: list[dict[str, Any]], key: str) -> str:
    """What the record says of its outputs: all verified, or which arms did not."""
    wrong = [f"{x[key]} ({', '.join(arm for arm, ok in x['verified'].items() if not ok)})" for x in results
             if not all(x["verified"].values())]
    return "every output verified" if not wrong else "outputs NOT verified: " + "; ".join(wrong)


def defaults_table(gpu: str) -> str:
    """docs/results.md: the two forms of the default window (issue 42, item 3), each against no l2ctl and against
    each other (scripts/bench_defaults.py); "" while the record is missing."""
    r = newest(gpu, "defaults")
    if r is None:
        return ""
    wins = {"first": "first bytes", "whole": "whole window", "tie": "within noise"}
    rows = ["| workload | target | window / granted | without l2ctl | whole window (hit ratio) | first bytes at 1.0 | "
            "first / whole | faster |", "|---|---|---|---|---|---|---|---|"]
    for x in r["results"]:
        s, ci = x["speedup"], x["ci"]

        def cell(arm: str) -> str:
            mark = " (slower)" if x["loses"][arm] else ""
            return f"{s[arm]:.3f}x ({ci[arm][0]:.3f}-{ci[arm][1]:.3f}){mark}"

        same = x["forms_identical"]
        rows.append(f"| {x['workload']}{' (modeled)' if x.get('modeled') else ''} | {x['target']} | {mib(x['window_bytes'])} / {mib(x['granted'])} MiB | "
                    f"{x['median_ms']['none']:.3f} ms | hit {x['whole_hit_ratio']:.2f}: {cell('whole')} | "
                    f"{mib(x['first_bytes'])} MiB: {cell('first')} | {x['first_vs_whole']:.3f}x "
                    f"({x['first_vs_whole_ci'][0]:.3f}-{x['first_vs_whole_ci'][1]:.3f}) | "
                    f"{'one scope (the window fits)' if same else wins[x['winner']]} |")
    env, cfg, summary = r["environment"], r["config"], r["summary"]
    verified = all(v is not False for x in r["results"] for v in x["verified"].values())
    never = [arm for arm in ("whole", "first") if summary["never_loses"][arm]]
    rows.append(f"\n{env['device']['name']}, CUDA driver API {env['driver_version'] // 1000}."
                f"{env['driver_version'] % 1000 // 10}, commit {env['commit']}; {cfg['rounds']} shuffled rounds of "
                f"{cfg['repeat']} runs per arm, 95% paired-bootstrap intervals, "
                f"{'every output verified' if verified else 'NOT every output verified'}. Never slower than without "
                f"l2ctl beyond the noise: {' and '.join(wins[a] for a in never) if never else 'neither form'}.")
    return "\n".join(rows)


def _discovery() -> tuple[list[tuple[str, dict[str, Any]]], list[dict[str, Any]]]:
    """Issue 35's H100 records: the README's reduce-overhead step tuned by discovery, in fresh processes with fresh
    Inductor caches (its tensors marked static, and only ``acc`` marked), and the eager GNN layer's rows."""
    compiled = []
    for name, label in (("torch_captures_fresh_marked", "marked"), ("torch_captures_fresh_unmarked", "unmarked")):
        record = load("h100", name)
        if record is not None:
            part = record["summary"]["compiled" if label == "marked" else "compiled-unmarked"]
            if not part["graphed"] or not part["tuned"]["persists"]:
                raise ValueError(f"h100/{name}.json: the step was not graphed or discovery chose nothing")
            compiled.append((label, part))
    eager = load("h100", "eager_discovery")
    return compiled, [] if eager is None else eager["summary"]["rows"]


def _eager_speedup(rows: list[dict[str, Any]], form: str, dim: int) -> str:
    row = next(r for r in rows if r["form"] == form and r["dim"] == dim)
    return f"{row['check_speedup']:.2f}x" if row["persists"] else "no persistence"


def readme_discovery() -> str:
    """The README's line on discovery: the reduce-overhead step above and the eager GNN layer, on an H100."""
    compiled, eager = _discovery()
    by = dict(compiled)
    if not by or not eager:
        return ""
    return (f"H100: {by['marked']['speedup']:.2f}x ({by['unmarked']['speedup']:.2f}x with only `acc` marked). The "
            f"eager layer above at D = 1: {_eager_speedup(eager, 'stays', 1)} (by hand: "
            f"{_eager_speedup(eager, 'named', 1)}); at D = 16: {_eager_speedup(eager, 'stays', 16)}, as by hand.")


def discovery() -> str:
    """docs/results.md: every row of issue 35's discovery records, with its baseline."""
    compiled, eager = _discovery()
    rows = ["| H100: step | without l2ctl | discovered | chosen | commit |", "|---|---|---|---|---|"]
    for label, part in compiled:
        rows.append(f"| reduce-overhead zero + `index_add_`, {label} | {part['baseline_ms']:.3f} ms | "
                    f"**{part['speedup']:.2f}x** | {mib(part['tuned']['set_aside'])} MiB of Inductor's temporary, "
                    f"hit ratio {part['tuned']['hit_ratio']:.2f} | {load('h100', 'torch_captures_fresh_' + label)['environment']['commit']} |")
    commit = load("h100", "eager_discovery")["environment"]["commit"] if eager else ""
    for r in eager:
        if r["persists"]:
            base, result = f"{r['check_baseline_ms']:.3f} ms", f"**{r['check_speedup']:.2f}x**"
            chosen = "`out`, named by hand" if r["form"] == "named" else "the step's output, found at one address"
        else:
            moved = sum("moves between steps" in why for why in r.get("skipped", {}).values())
            base, result = "-", "no persistence"
            chosen = "no point beat the baseline beyond the noise" + (f"; {moved} temporaries moved" if moved else "")
        rows.append(f"| eager GNN layer, D = {r['dim']}, output {r['form']} | {base} | {result} | {chosen} | {commit} |")
    return "\n".join(rows)


def readme_multigpu() -> str:
    """The multi-GPU paragraph's numbers, from the two-GPU records under torchrun (h100x2/): the DDP example's
    gain per rank against its single-GPU gain, and NCCL's bus bandwidth under each set-aside."""
    ddp, coll = load("h100x2", "ddp_step_2rank"), load("h100x2", "collectives_2rank")
    if ddp is None or coll is None:
        return ""
    ranks = ddp["summary"]["per_rank"]
    if not all(r["restored"] for r in ranks) or coll["summary"]["ranks"] != len(ranks):
        raise ValueError("the two-GPU records no longer support the multi-GPU paragraph: rewrite it")
    fractions = [r["ddp_fraction_of_single_gain"] for r in ranks]
    table = coll["summary"]["table"]
    at = lambda op, n: [x["ratio"] for x in table if x["op"] == op and x["set_aside_granted"] == n]  # noqa: E731
    default, top = coll["summary"]["default_limit"], coll["summary"]["max_set_aside"]
    reduce_d, reduce_m, gather_m = at("all_reduce", default), at("all_reduce", top), at("all_gather", top)
    return (f"On two H100s under `torchrun`, the example's step gained {min(r['single_gain'] for r in ranks):.2f}x "
            f"alone and {min(r['ddp_gain'] for r in ranks):.2f}x under DDP on each rank "
            f"({span(fractions)} of the single-GPU gain), every device left as found; "
            f"NCCL's all-reduce kept {span(reduce_d)} of its bus bandwidth at the default limit and "
            f"{span(reduce_m)} at the max (all-gather {span(gather_m)}), 64 MiB to 1 GiB.")


def span(fractions: list[float]) -> str:
    """Percentages as one figure when they agree, else lowest-highest."""
    lo, hi = f"{min(fractions):.0%}", f"{max(fractions):.0%}"
    return lo if lo == hi else f"{lo}-{hi}"


GRAPH_ROWS = {"broadcast": "`x + bias`", "scatter-add": "`acc.index_add_`"}
GRAPH_MODES = (("eager", ""), ("graphed", "-graphed"), ("compiled", "-compiled"))


def readme_graphs() -> str:
    """The same step eager, as a CUDA graph and compiled (reduce-overhead), tuned against itself without l2ctl
    (lowest run, range over the runs); and a stream scope with the tuned policy around the graph's replays."""
    rows = {gpu: workload_rows(gpu) for gpu in GPUS if workload_runs(gpu)}
    lines = ["| workload, GPU | eager | CUDA graph (`keep_graph=True`) | `torch.compile(mode=\"reduce-overhead\")` "
             "| a stream scope around the graph's replays |", "|---|---|---|---|---|"]
    for name, label in GRAPH_ROWS.items():
        for gpu, found in rows.items():
            if f"{name}-graphed" not in found:
                continue
            cells = []
            for _, suffix in GRAPH_MODES:
                row = found.get(name + suffix)
                cells.append("-" if row is None else f"{tuned_range(row)} ({row['baseline_ms']:.2f} ms)")
            harm = found[f"{name}-graphed"].get("stream_scope_speedup")
            cells.append("-" if harm is None else f"{harm:.2f}x")
            lines.append(f"| {label}, {GPUS[gpu]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else ""


COMPILE_ROWS = (("scatter-add-compiled", "the gallery's step (tensors marked static)"),
                ("scatter-add-compiled-eager", "the gallery's step, accumulator not marked static"),
                ("scatter-add-compiled-temp", "the gallery's step with its zeroing: Inductor's own temporary"))
RECIPE_ROWS = (("compiled-eager", "in place, the accumulator an argument"),
               ("compiled-graphed", "in place, the accumulator an argument marked static"),
               ("compiled-temp", "with its zeroing, marked static: Inductor's own temporary"))


def graphed(row: dict[str, Any]) -> str:
    """Whether torch ran a compiled gallery row as CUDA graphs: every compilation, none, or how many."""
    described = row.get("described", {})
    n, of = described.get("graphed_compilations"), described.get("compilations")
    if n is None or not of:
        return "not recorded"
    return "yes" if n == of else "no" if n == 0 else f"{n} of {of}"


def readme_compile() -> str:
    """torch.compile's ways to run the scatter-add, each against the same code without l2ctl: tuned (the
    gallery's rows, lowest run and range) and the recipe with an explicit set-aside of the accumulator
    (scripts/torch_recipes.py, lowest of its rounds); whether torch ran each as CUDA graphs, as measured."""
    lines = ["| `torch.compile(mode=\"reduce-overhead\")` scatter-add, GPU | run as CUDA graphs | "
             "`persist(torch_captures(), acc, policy=tuned)` | `persist(torch_captures(), acc, set_aside=<acc>)` |",
             "|---|---|---|---|"]
    for gpu in GPUS:
        rows = workload_rows(gpu)
        for name, label in COMPILE_ROWS:
            row = rows.get(name)
            if row is not None:
                tuned = tuned_range(row) + ("" if row["tuned_buffer"] else ", no persistence")
                lines.append(f"| {label}, {GPUS[gpu]} | {graphed(row)} | {tuned} | - |")
        recipes = load(gpu, "torch_recipes")
        for name, label in RECIPE_ROWS if recipes is not None else ():
            row = next(r for r in recipes["summary"]["rows"] if r["workload"] == name)
            lines.append(f"| {label}, {GPUS[gpu]} | {'yes' if row['graphed'] else 'no'} | - | "
                         f"{min(row['round_speedups']):.2f}x |")
    return "\n".join(lines) if len(lines) > 2 else ""


def readme_graphed_callable() -> str:
    """make_graphed_callables on x + bias, captured inside persist(torch_captures(replays="new"), bias), in a
    process whose graph trees hold other compiled functions' recordings."""
    parts = []
    for gpu in GPUS:
        recipes = load(gpu, "torch_recipes")
        if recipes is not None:
            row = next(r for r in recipes["summary"]["rows"] if r["workload"] == "graphed-callable")
            parts.append(f"{min(row['round_speedups']):.2f}x on an {GPUS[gpu]} ({row['baseline_ms']:.2f} ms without l2ctl)")
    return "; ".join(parts)


def tune_models(gpu: str) -> str:
    """tune from a model's tensors and from what a graph's kernels are given (scripts/tune_models.py), against
    the same step without l2ctl (tune's own confirmation: paired rounds)."""
    r = load(gpu, "tune_models")
    if r is None:
        return ""
    lines = [f"| {GPUS[gpu]}: step | candidates | with your tensor named | tuned | chosen | tune s |", "|---|---|---|---|---|---|"]
    for x in r["summary"]["rows"]:
        yours = f"{x['yours_speedup']:.2f}x" if "yours_speedup" in x else "-"
        chosen = (x.get("chosen_range") or x["chosen"]) if x["persists"] else "no persistence"
        lines.append(f"| {x['workload']} | {x['summary']} | {yours} | {x['speedup']:.2f}x (CI {x['ci'][0]:.3f}-"
                     f"{x['ci'][1]:.3f}), baseline {x['baseline_ms']:.2f} ms | {chosen} | {x['tune_seconds']:.1f} |")
    return "\n".join(lines)


OVERHEAD_ROWS = [  # (variant, label, its raw calls through cuda.bindings, its driver calls timed in C++)
    ("persist_lean", "`persist(s, buf, 0.75, set_aside=None, reset_on_exit=False)`", "raw_set_clear_window",
     "cpp_lean_calls"),
    ("persist_lean_reused", "the same scope object made once and re-entered (`with scope:` in the loop)",
     "raw_set_clear_window", "cpp_lean_calls"),
    ("persist_default", "`persist(s, buf, 0.75)` (defaults: \"auto\" set-aside, lines reset at the end)", None,
     "cpp_default_calls"),
    ("persist_exact", "`persist(s, buf, 0.75, set_aside=<one granule more>)`: the limit up and back", "raw_set_limit_pair",
     "cpp_set_limit_pair"),
    ("persist_policy", "the same through `policy=Policy(...)`", "raw_set_limit_pair", "cpp_set_limit_pair"),
    ("persist_graph_1", "`persist` on a graph of 1 kernel node", None, None),
    ("persist_graph_32", "`persist` on a graph of 32 kernel nodes", None, "cpp_graph_32_calls"),
    ("set_clear_window", "`set_window` + `clear_window`", "raw_set_clear_window", None),
    ("set_aside_scope", "`with set_aside(...)`", "raw_set_limit_pair", "cpp_set_limit_pair"),
    ("reset_persisting_lines", "`reset_persisting_lines()`", "raw_reset", None),
    ("persist_lean_torch", "the lean `persist` with a torch stream and tensor", None, "cpp_lean_calls"),
    ("persist_lean_torch_1_0", "the same at `hit_ratio=1.0`", None, "cpp_lean_calls"),
    # The lean scope in each argument form (issue 36).
    ("persist_lean_1_0", "the lean scope at `hit_ratio=1.0`", None, "cpp_lean_calls"),
    ("persist_lean_int_1", "the lean scope at `hit_ratio=1` (an int)", None, "cpp_lean_calls"),
    ("persist_lean_np_float32", "the lean scope at `np.float32(0.75)`", None, "cpp_lean_calls"),
    ("persist_lean_keyword", "the lean scope with `hit_ratio=0.75` as a keyword", None, "cpp_lean_calls"),
    ("persist_lean_policy", "the lean scope through `policy=Policy(set_aside=None, hit_ratio=0.75)`", None,
     "cpp_lean_calls"),
    ("persist_lean_limit", "the lean scope with `set_aside=<the limit in force>` (an int)", None, "cpp_lean_calls"),
]


def overhead(gpu: str) -> str:
    r = newest(gpu, "overhead")
    if r is None:
        return ""
    us = {x["variant"]: x["metrics"]["median_us"] for x in r["records"] if x["verified"]}
    driver = any(key.startswith("cpp_") for key in us)  # records of the C++ planner time its driver calls too
    lines = [f"| operation ({GPUS[gpu]}, us per enter+exit) | l2ctl | the raw CUDA calls through cuda.bindings |"
             + (" its driver calls, timed in C++ |" if driver else ""), "|---|---|---|" + ("---|" if driver else "")]
    for key, label, raw, calls in OVERHEAD_ROWS:
        if key in us:
            cells = [f"{us[key]:.1f}", f"{us[raw]:.1f}" if raw in us else ""]
            if driver:
                cells.append(f"{us[calls]:.1f}" if calls in us else "")
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)



#: Issue 29's targets on an H100 (us per enter+exit), with the issue's measurement before it (ed73b12, three hosts).
OVERHEAD_TARGETS = [("persist_lean", "lean scope", "cpp_lean_calls", 2.0, "13.3-17.9"),
                    ("persist_default", "defaults", "cpp_default_calls", 6.0, "18.9-26.5"),
                    ("persist_graph_32", "32-node graph", "cpp_graph_32_calls", 25.0, "62-87"),
                    ("persist_lean_torch", "lean, on a torch stream and tensor", "cpp_lean_calls", 3.0, "22-37")]


def overhead_targets(gpu: str) -> str:
    """Issue 29's targets: the issue's measurement, the planner in C++ with a Python scope (227f00d's record), and
    the compiled scope (the newest record), each beside its own driver calls timed in C++."""
    before, after = load(gpu, "overhead_227f00d"), newest(gpu, "overhead")
    if before is None or after is None:
        return ""

    def medians(r: dict[str, Any]) -> dict[str, float]:
        return {x["variant"]: x["metrics"]["median_us"] for x in r["records"] if x["verified"]}

    b, a = medians(before), medians(after)
    commit = after["environment"].get("commit", "?")
    lines = [f"| {GPUS[gpu]}, us per enter+exit | issue 29 measured (ed73b12) | C++ planner, Python scope (227f00d) "
             f"| compiled scope ({commit}) | its driver calls, timed in C++ | target |", "|---|---|---|---|---|---|"]
    for key, label, calls, target, issue in OVERHEAD_TARGETS:
        if key in a:
            met = "met" if a[key] <= target else "missed"
            lines.append(f"| {label} | {issue} | {b[key]:.1f} | **{a[key]:.1f}** | {a[calls]:.2f} | <= {target:g} ({met}) |")
    repeat = load(gpu, f"overhead_{commit}_repeat")
    if repeat is not None:  # the same commit run again on the same host, at once
        again = medians(repeat)
        lines.append("")
        lines.append(f"Run again at once on the same host (`overhead_{commit}_repeat.json`): "
                     + ", ".join(f"{label} {again[key]:.1f} us" for key, label, _, _, _ in OVERHEAD_TARGETS if key in again)
                     + ".")
    return "\n".join(lines)


FORMS = (("compiled", "registry compiled (this code)"), ("interpreted", "the same source interpreted"),
         ("c_planner", "the hand-written C planner (before)"))
FORM_ROWS = [("persist_lean", "lean scope"), ("persist_lean_reused", "the lean scope object re-entered"),
             ("persist_default", "defaults (`\"auto\"`, lines reset at the end)"),
             ("persist_graph_32", "32-node graph"), ("raw_set_clear_window", "raw set + clear (cuda.bindings)")]


def overhead_runs(gpu: str) -> dict[str, list[dict[str, float]]]:
    """Per form, each interleaved run's medians (us) by variant: benchmarks/results/<gpu>/overhead_forms/."""
    runs: dict[str, list[dict[str, float]]] = {}
    for form, _ in FORMS:
        for path in sorted((RECORDS / gpu / "overhead_forms").glob(f"{form}_*.json")):
            r = json.loads(path.read_text())
            runs.setdefault(form, []).append({x["variant"]: x["metrics"]["median_us"] for x in r["records"] if x["verified"]})
    return runs


def overhead_forms(gpu: str) -> str:
    runs = overhead_runs(gpu)
    if not runs:
        return ""
    forms = [(f, label) for f, label in FORMS if f in runs]
    lines = [f"| {GPUS[gpu]}, us per enter+exit: median of {len(runs[forms[0][0]])} runs (range) | "
             + " | ".join(label for _, label in forms) + " |", "|---" * (len(forms) + 1) + "|"]
    for key, label in FORM_ROWS:
        cells = []
        for form, _ in forms:
            v = sorted(run[key] for run in runs[form])
            cells.append(f"{v[len(v) // 2]:.1f} ({v[0]:.1f}-{v[-1]:.1f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: Issue 36's table: the lean scope in each argument form (us per enter+exit, H100), with its target.
ARGUMENT_FORMS = [("persist_lean", "`hit_ratio=0.75`", 1.2), ("persist_lean_1_0", "`hit_ratio=1.0` (the README's)", 1.2),
                  ("persist_lean_int_1", "`hit_ratio=1`", 1.2), ("persist_lean_np_float32", "`np.float32(0.75)`", 1.2),
                  ("persist_lean_keyword", "`hit_ratio=` as a keyword", 1.2),
                  ("persist_lean_policy", "`policy=Policy(...)`", 1.2),
                  ("persist_lean_limit", "`set_aside=<an int equal to the limit>`", 1.2),
                  ("persist_lean_torch", "torch stream and tensor, 0.75", 1.5),
                  ("persist_lean_torch_1_0", "torch stream and tensor, 1.0", 1.5),
                  ("persist_default", "defaults", 4.0), ("persist_graph_32", "32-node graph", 12.0),
                  ("cpp_lean_calls", "a lean scope's driver calls, timed in C++", None),
                  ("raw_set_clear_window", "a window set and cleared through cuda.bindings", None)]


def argument_form_runs(gpu: str, folder: str) -> dict[str, list[dict[str, Any]]]:
    """Per side ("before", "after"), each run's record: benchmarks/results/<gpu>/<folder>/<side>_<n>.json, the two
    builds' runs interleaved on one machine (before_1, after_1, before_2, ...)."""
    return {side: [json.loads(p.read_text()) for p in sorted((RECORDS / gpu / folder).glob(f"{side}_*.json"))]
            for side in ("before", "after")}


def argument_forms(gpu: str, folder: str = "argument_forms") -> str:
    """Issue 36's table measured again: each form before and after, as the median of the interleaved runs with
    every run's value, beside the target. `argument_forms`: the forms' own change (every form on the compiled
    path); `argument_forms_speed`: the entry and end made cheaper."""
    runs = argument_form_runs(gpu, folder)
    if not runs["before"] or not runs["after"]:
        return ""
    us = {side: [{x["variant"]: x["metrics"]["median_us"] for x in r["records"] if x["verified"]} for r in records]
          for side, records in runs.items()}
    # The fastest round of any run (each run's rounds are round-robin over the variants): the host's speed moves
    # between runs, and the best round is the one least disturbed.
    best = {side: {x["variant"]: min(y["min_ms"] * 1000 for r in records for y in r["records"]
                                     if y["variant"] == x["variant"] and y["verified"])
                   for x in records[0]["records"] if x["verified"]} for side, records in runs.items()}
    commits = {side: runs[side][0]["environment"]["commit"] for side in runs}
    lines = [f"| {GPUS[gpu]}, us per enter+exit | before ({commits['before']}) | after ({commits['after']}) | target |",
             "|---|---|---|---|"]
    for key, label, target in ARGUMENT_FORMS:
        cells = []
        for side in ("before", "after"):
            values = [run[key] for run in us[side] if key in run]
            cells.append(f"{statistics.median(values):.1f} ({', '.join(f'{v:.1f}' for v in values)}; best "
                         f"{best[side][key]:.1f})" if values else "-")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {'' if target is None else f'<= {target}'} |")
    return "\n".join(lines)


def readme_cost() -> str:
    after = argument_form_runs("h100", "argument_forms_speed")["after"]
    if after:  # the newest build's interleaved runs: the median of the runs' medians
        def med(key: str) -> float:
            return statistics.median(x["metrics"]["median_us"] for r in after for x in r["records"]
                                     if x["variant"] == key and x["verified"])
        best = min(x["min_ms"] * 1000 for r in after for x in r["records"] if x["variant"] == "persist_lean")
        return (f"Host time per enter+exit on an H100 host (`bench overhead`, median of {len(after)} runs): a lean "
                f"scope **{med('persist_lean'):.1f} us** (best {best:.1f}; its driver calls: "
                f"{med('cpp_lean_calls'):.1f}), on torch objects {med('persist_lean_torch'):.1f} us, with the defaults "
                f"{med('persist_default'):.1f} us ({med('cpp_default_calls'):.1f}), on a 32-node graph "
                f"{med('persist_graph_32'):.1f} us ({med('cpp_graph_32_calls'):.1f}): "
                f"{med('persist_lean') / 5000:.2%}-{med('persist_lean') / 1000:.2%} of a 1-5 ms step.")
    latest = newest("h100", "overhead")
    us = {} if latest is None else {x["variant"]: x["metrics"]["median_us"] for x in latest["records"] if x["verified"]}
    if "cpp_lean_calls" in us:  # a record of the C++ planner: each scope beside its own driver calls
        return (f"Host time per enter+exit on an H100 host (`bench overhead`): a lean scope **{us['persist_lean']:.1f} us** "
                f"(its driver calls alone: {us['cpp_lean_calls']:.1f}), on torch objects {us['persist_lean_torch']:.1f} us, "
                f"with the defaults {us['persist_default']:.1f} us ({us['cpp_default_calls']:.1f}), on a 32-node graph "
                f"{us['persist_graph_32']:.1f} us ({us['cpp_graph_32_calls']:.1f}): "
                f"{us['persist_lean'] / 5000:.2%}-{us['persist_lean'] / 1000:.2%} of a 1-5 ms step.")
    runs = overhead_runs("h100")
    if not runs:
        return ""

    def med(form: str, key: str) -> str:
        v = sorted(run[key] for run in runs[form])
        return f"{v[len(v) // 2]:.0f}"

    raw = sorted(run["raw_set_clear_window"] for form in runs for run in runs[form])
    return (f"Host time per enter+exit on an H100 host (`bench overhead`, median of three runs): a lean scope "
            f"**{med('compiled', 'persist_lean')} us**, with the defaults {med('compiled', 'persist_default')} us, on a "
            f"32-node graph {med('compiled', 'persist_graph_32')} us (the raw CUDA calls: {raw[0]:.1f}-{raw[-1]:.1f} us): "
            f"{float(med('compiled', 'persist_lean')) / 5000:.1%}-{float(med('compiled', 'persist_lean')) / 1000:.1%} "
            "of a 1-5 ms step.")


RESET_COLUMNS = [("baseline", "baseline"), ("recipe_hr1", "recipe, hitRatio 1.0"), ("recipe_fit", "recipe, set-aside/LUT"),
                 ("right_sized", "right-sized"), ("hints", "hints only"), ("annotated", "annotated_ptr"),
                 ("seed_shape", "blog's kernel shape")]


def reset_data(gpu: str) -> str:
    r = load(gpu, "reset_data")
    if r is None:
        return ""
    cols = [(k, label) for k, label in RESET_COLUMNS if any(x["variant"] == k for x in r["records"])]
    lines = ["| LUT | " + " | ".join(label for _, label in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for row in r["summary"]["table_ms"]:
        base = row["baseline"]
        cells = [f"{row[k]:.3f}" if k == "baseline" else f"{row[k]:.3f} ({base / row[k]:.2f}x)" for k, _ in cols]
        lines.append(f"| {mib(row['lut_bytes'])} MiB | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tuner(gpu: str) -> str:
    parts = []
    for variant in ("plain", "scalar"):
        r = load(gpu, f"tuner_{variant}")
        if r is None or "tuned_ci" not in r["rows"][0]:
            continue
        parts.append(f"| {variant} kernel, LUT | baseline ms | grid best (set-aside MiB, hitRatio) | its copy tax | "
                     "tuned (set-aside MiB, hitRatio) | its copy tax | grid best / tuned | tuning |")
        parts.append("|---|---|---|---|---|---|---|---|")
        for x in r["rows"]:
            tuned = (f"{x['tuned_speedup']:.2f}x ({x['tuned_set_aside_mib']:.2f}, {x['tuned_hit_ratio']:.2f})"
                     if x["tuned_persists"] else f"{x['tuned_speedup']:.2f}x (no persistence)")
            parts.append(f"| {x['lut_mib']:g} MiB | {x['baseline_ms']:.3f} | {x['grid_best_speedup']:.2f}x "
                         f"({x['grid_best_set_aside_mib']:.2f}, {x['grid_best_hit_ratio']:.1f}) | "
                         f"{x['grid_best_copy_slowdown']:.2f}x | {tuned} | {x['tuned_copy_slowdown']:.2f}x | "
                         f"{x['tuned_vs_grid_best']:.3f} | {x['tune_seconds']:.1f} s, {x['tune_points']} points |")
        parts.append("")
    return "\n".join(parts).strip()


def stride(gpu: str) -> str:
    r = load(gpu, "stride")
    if r is None:
        return ""
    recs = sorted(r["records"], key=lambda x: x["config"]["stride_bytes"])
    head = " | ".join(f"{x['config']['stride_bytes']} B" for x in recs)
    return "\n".join([
        f"| stride | {head} |", "|---" * (len(recs) + 1) + "|",
        "| ms | " + " | ".join(f"{x['median_ms']:.3f}" for x in recs) + " |",
        "| sectors per request (model) | " + " | ".join(str(x["metrics"]["sectors_per_request_model"]) for x in recs) + " |",
        "| sector GB/s (of read ceiling) | " + " | ".join(
            f"{x['metrics']['sector_gbps']:,.0f} ({x['metrics']['sector_fraction_of_read_ceiling']:.0%})" for x in recs) + " |",
        "| DRAM model GB/s (64 B granularity) | " + " | ".join(f"{x['metrics']['dram_model_gbps']:,.0f}" for x in recs) + " |",
    ])


def micro(gpu: str) -> str:
    lines = []
    cs = load(gpu, "cache_streaming")
    if cs is not None:
        t = {x["variant"]: x["median_ms"] for x in cs["records"]}
        lines.append(f"| cache-streaming: sparse-vector | normal {t['sparse_vector/normal']:.4f} ms | `.cs` "
                     f"{t['sparse_vector/cs']:.4f} ms | {t['sparse_vector/normal'] / t['sparse_vector/cs']:.2f}x |")
        lines.append(f"| cache-streaming: stream-analysis | normal {t['stream_analysis/normal']:.3f} ms | `.cs` "
                     f"{t['stream_analysis/cs']:.3f} ms | {t['stream_analysis/normal'] / t['stream_analysis/cs']:.2f}x |")
    g = load(gpu, "graph")
    if g is not None:
        t = {x["variant"]: x["median_ms"] for x in g["records"]}
        base = t["replay_no_window"]
        lines.append(f"| graph replay, window on the nodes | none {base:.3f} ms | `cudaGraphExecUpdate` "
                     f"{t['replay_window_update']:.3f} ms ({base / t['replay_window_update']:.2f}x) | re-instantiated "
                     f"{t['replay_window_reinstantiate']:.3f} ms ({base / t['replay_window_reinstantiate']:.2f}x) |")
    c = load(gpu, "concurrent")
    if c is not None:
        t = {x["variant"]: x["median_ms"] for x in c["records"]}
        base = t["no_window"]
        lines.append(f"| two streams, one set-aside | no windows {base:.3f} ms | hit ratio 1.0 each "
                     f"{t['hit_ratio_1_each']:.3f} ms ({base / t['hit_ratio_1_each']:.2f}x) | shared (0.5 each) "
                     f"{t['shared']:.3f} ms ({base / t['shared']:.2f}x) |")
    if not lines:
        return ""
    return "\n".join(["| measurement | | | |", "|---|---|---|---|"] + lines)


def ncu(gpu: str) -> str:
    r = load(gpu, "ncu_compare")
    if r is None:
        return ""
    metrics = [("lts__t_sector_hit_rate.pct", "L2 hit rate %", 1.0, ".2f"), ("dram__bytes_read.sum", "DRAM read MB", 1e6, ".1f"),
               ("dram__bytes_write.sum", "DRAM write MB", 1e6, ".1f"), ("gpu__time_duration.sum", "duration us", 1e3, ".1f")]

    def span(values: list[float], scale: float, fmt: str) -> str:
        lo, hi = min(values) / scale, max(values) / scale
        return f"{lo:{fmt}}" if f"{lo:{fmt}}" == f"{hi:{fmt}}" else f"{lo:{fmt}}-{hi:{fmt}}"

    lines = ["| launch | " + " | ".join(label for _, label, _, _ in metrics) + " | verdict |", "|---" * (len(metrics) + 2) + "|"]
    for v in r["verdicts"]:
        rows = [x for x in r["rows"] if x["name"] == v["name"]]
        cells = []
        for key, _, scale, fmt in metrics:
            ours = [x["metrics"][key]["l2ctl"] for x in rows]
            theirs = [x["metrics"][key]["ncu"] for x in rows]
            cells.append(f"{span(ours, scale, fmt)} / {span(theirs, scale, fmt)}")
        verdict = v["verdict"] + (f"; not judged, beyond tolerance: {', '.join(m.split('__')[1].split('.')[0] for m in v['reported_apart'])}"
                                  if v.get("reported_apart") else "")
        lines.append(f"| {v['name']} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(lines)


def tuner_grid(gpu: str) -> str:
    """docs/results.md: tune against the grid's best point that the tax rule allows, per LUT over independent runs
    (scripts/bench_tuner_grid.py); nothing while the record is not there."""
    r = newest(gpu, "tuner_grid")
    if r is None:
        return ""
    cfg, env = r["config"], r["environment"]
    rows = ["| LUT | runs within 3% | tuned / grid best allowed, each run | grid best allowed, MiB | tuned, MiB "
            "(hit ratio) | grid fastest, MiB | baseline |", "|---|---|---|---|---|---|---|"]
    for lut in cfg["lut_mib"]:
        runs = [x for x in r["results"] if x["lut_mib"] == lut]
        grid = [mib(x["grid_best_allowed"]["set_aside"]) if x["grid_best_allowed"] else "none" for x in runs]
        tuned = [f"{mib(x['tuned']['set_aside'])} ({x['tuned']['hit_ratio']:.2f})" if x["tuned"]["persists"] else "none"
                 for x in runs]
        ratios = ", ".join(f"{x['ratio']:.3f}" if x["within_3pct"] else f"**{x['ratio']:.3f}**" for x in runs)
        baseline = statistics.median(x["remeasured"]["baseline_ms"] for x in runs)
        rows.append(f"| {lut:g} MiB | {sum(x['within_3pct'] for x in runs)} of {len(runs)} | {ratios} | "
                    f"{', '.join(grid)} | {', '.join(tuned)} | "
                    f"{', '.join(mib(x['grid_fastest']['set_aside']) for x in runs)} | {baseline:.3f} ms |")
    within = sum(x["within_3pct"] for x in r["results"])

    def version(v: int) -> str:
        return f"{v // 1000}.{v % 1000 // 10}"

    rows.append(f"\n{within} of {len(r['results'])} within 3%. {env['device']['name']}, CUDA driver API "
                f"{version(env['driver_version'])}, runtime {version(env['runtime_version'])}, commit {env['commit']}; "
                f"reset-data ({cfg['variant']}, {mib(cfg['out_bytes'])} MiB output); the grid: "
                f"{len(cfg['grid_set_asides'])} set-asides at hit ratio {cfg['grid_hit_ratio']:.1f}, {cfg['grid_rounds']} "
                f"paired rounds; the side-by-side check {cfg['check_rounds']} rounds of {cfg['repeat']} runs; tax-free "
                f"cap {mib(cfg['cap'])} MiB, tax gain {cfg['tax_gain']:.0%}; {r['summary']['seconds']:.0f} s in all.")
    return "\n".join(rows)


GENERATORS: dict[str, Callable[[], str]] = {"readme-gallery": readme_gallery, "readme-graphs": readme_graphs,
                                             "readme-compile": readme_compile,
                                             "readme-graphed-callable": readme_graphed_callable,
                                             "readme-cost": readme_cost,
                                             "readme-findings": readme_findings,
                                             "readme-multigpu": readme_multigpu,
                                             "app-lifetime": app_lifetime, "readme-app": readme_app,
                                             "readme-discovery": readme_discovery, "discovery": discovery,
                                             "readme-autotune": readme_autotune}
for _gpu in GPUS:
    for _name, _fn in (("tax", tax), ("gallery", gallery), ("tune-models", tune_models), ("overhead", overhead),
                       ("overhead-targets", overhead_targets), ("overhead-forms", overhead_forms),
                       ("argument-forms", argument_forms), ("reset-data", reset_data),
                       ("argument-forms-speed", lambda g: argument_forms(g, "argument_forms_speed")),
                       ("tuner", tuner), ("stride", stride), ("micro", micro), ("ncu", ncu),
                       ("autotune", autotune_table), ("tuner-grid", tuner_grid), ("defaults", defaults_table),
                       ("autotune-torch", lambda g: autotune_table(g, "torch_autotune", "form"))):
        GENERATORS[f"{_name}-{_gpu}"] = (lambda f=_fn, g=_gpu: f(g))

SECTION = re.compile(r"(<!-- generated:(?P<name>[\w-]+) -->\n)(?P<body>.*?)(\n?<!-- end:(?P=name) -->)", re.S)
PENDING = re.compile(r"^<!-- pending:(?P<name>[\w-]+) -->$", re.M)


def render(text: str) -> str:
    def generate(name: str) -> str:
        if name not in GENERATORS:
            raise KeyError(f"no generator for the section {name!r}")
        return GENERATORS[name]()

    def replace(m: re.Match[str]) -> str:
        name = m.group("name")
        return f"{m.group(1)}{generate(name)}\n<!-- end:{name} -->"

    def arrive(m: re.Match[str]) -> str:  # a pending table, once its record is there
        name, body = m.group("name"), generate(m.group("name"))
        return f"<!-- generated:{name} -->\n{body}\n<!-- end:{name} -->" if body.strip() else m.group(0)

    return PENDING.sub(arrive, SECTION.sub(replace, text))


def main(argv: list[str]) -> int:
    stale = []
    for path in DOCS:
        text = path.read_text()
        new = render(text)
        if new != text:
            stale.append(path.name)
            if "--check" not in argv:
                path.write_text(new)
    if stale and "--check" in argv:
        print("out of date:", ", ".join(stale))
        return 1
    print("rewrote" if stale else "up to date:", ", ".join(stale) if stale else "all tables")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
