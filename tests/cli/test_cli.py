"""The command line without a GPU: argument parsing, validation, exit codes, messages (never a traceback),
and that every option of every command reaches the function the command runs (the bench, sweep and tune
functions are replaced by recorders that return made-up reports) or is refused."""

from __future__ import annotations

import csv
import inspect
import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

import l2ctl
from l2ctl import _backend, _core, bench, benchmark_gallery, cli, plot, sweep, tuner
from l2ctl._errors import CudaError, NotSupportedError
from l2ctl.bench import Ceilings, Record, Report, VerificationError
from l2ctl.cli import bench_cmd, options, parsing, sweep_cmd, tune_cmd
from l2ctl.bench import collectives as bench_collectives_module

NO_GPU = _core.device_count() == 0
REAL_FRAMEWORKS_MISSING = bench_cmd.frameworks_missing
MiB = 1 << 20


def run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="100")
    return subprocess.run([sys.executable, "-m", "l2ctl", *args], capture_output=True, text=True, timeout=120,
                          env=env)


# ------------------------------------------------------------------------------------ existing behaviour


@pytest.mark.skipif(not NO_GPU, reason="checks the no-GPU behaviour; this machine has a GPU")
@pytest.mark.parametrize("args", [["info"], ["bench"], ["bench", "reset-data"], ["bench", "stride"],
                                  ["bench", "cache-streaming"], ["bench", "graph"], ["bench", "concurrent"],
                                  ["sweep", "tax"], ["sweep", "hit-ratio"], ["tune"],
                                  ["bench", "--device", "7"], ["info", "--device", "7"]])
def test_no_gpu_gives_a_message_and_exit_3(args):
    r = run(*args)
    assert r.returncode == cli.EXIT_UNSUPPORTED
    assert "Traceback" not in r.stderr and "no CUDA device" in r.stderr
    assert "--simulate" in r.stderr  # where a new user without a GPU can go on


def test_bad_arguments_exit_2():
    r = run("bench", "--lut-sizes", "4x")
    assert r.returncode == 2 and "not a size" in r.stderr
    assert run("frobnicate").returncode == 2
    assert run().returncode == 2


def test_help_lists_commands_and_exit_codes():
    r = run("--help")
    assert r.returncode == 0
    for word in ("info", "bench", "sweep", "tune", "exit codes", "--json PATH", "--csv PATH", "--device N", "--quiet",
                 "--simulate [GPU]", "nothing to measure"):
        assert word in r.stdout, word


@pytest.mark.parametrize("text,value", [("4096", 4096), ("4K", 4096), ("8M", 8 << 20), ("1.5MiB", 3 << 19),
                                        ("1G", 1 << 30), ("2mb", 2 << 20), ("1.5M", 1572864), ("0.5K", 512),
                                        ("1e3", 1000), ("4_096", 4096)])
def test_sizes(text, value):
    assert options.parse_size(text) == value


WHOLE = "size must be a whole number of bytes"


@pytest.mark.parametrize("text,message", [("4x", "not a size"), ("", "not a size"), ("inf", "not a size"),
                                          ("nan", "not a size"), ("-1", "size must be positive"),
                                          ("0", "size must be positive"), ("-4M", "size must be positive"),
                                          ("1.5", WHOLE), ("0.5", WHOLE), ("1.3K", WHOLE), ("1e-3", WHOLE),
                                          ("1e30G", "size too large"), ("1E1000000", "size too large"),
                                          ("1E999999999999999999", "size too large"), ("1e-1000000", WHOLE),
                                          ("4096.000000000000000000000000000000000001", WHOLE)])
def test_bad_sizes(text, message):
    with pytest.raises(Exception, match=message):
        options.parse_size(text)


def test_parser_defaults():
    args = cli.parse_args(["bench"])
    assert args.func is bench_cmd.cmd_bench_reset and args.repeat == 15 and args.out_bytes == 1 << 30
    assert args.command == "bench reset-data" and args.lut_sizes is None and args.quiet is False
    args = cli.parse_args(["bench", "stride", "--strides", "4,8", "--json", "x.json"])
    assert args.strides == [4, 8] and args.json == "x.json" and args.threads == 1 << 25
    args = cli.parse_args(["tune"])
    assert args.func is tune_cmd.cmd_tune and (args.repeat, args.warmup, args.lut_sizes) == (5, 1, [4 << 20])
    args = cli.parse_args(["sweep", "tax"])
    assert args.func is sweep_cmd.cmd_sweep_tax and not hasattr(args, "lut_bytes")


def test_entry_points():
    assert callable(cli.main)  # pyproject: l2ctl = "l2ctl.cli:main"
    r = run("--version")
    assert r.returncode == 0 and l2ctl.__version__ in r.stdout


# ------------------------------------------------------------------------------------ fakes

ENV = {"device": {"name": "Fake GPU", "compute_capability": "9.0", "l2_cache_size": 50 * MiB,
                  "persisting_l2_cache_max_size": 30 * MiB},
       "driver_version": 13000, "runtime_version": 13000}
COUNTERS = {"dram__bytes_read.sum": 1e6, "lts__t_sector_hit_rate.pct": 90.0}


def _rec(benchmark: str, variant: str, config: dict, ms: float = 1.0, **metrics: Any) -> Record:
    return Record(benchmark, variant, config, ms, ms, ms, 0.0, 3, True, metrics)


def fake_reset_data(lut_sizes=None, *, out_bytes=1 << 30, columns=None, counters=False, **_):
    names = columns or [c for c, _ in bench.RESET_COLUMNS]
    sizes = lut_sizes or [MiB, 4 * MiB]
    extra = {"counters": COUNTERS} if counters else {}
    records = [_rec("reset-data", n, {"lut_bytes": s, "out_bytes": out_bytes}, 1.0 + 0.1 * i, **extra)
               for s in sizes for i, n in enumerate(names)]
    table = [dict({"lut_bytes": s}, **{n: 1.0 + 0.1 * i for i, n in enumerate(names)}) for s in sizes]
    return Report("reset-data", ENV, records, Ceilings(out_bytes, 3000.0, 2500.0, 3200.0, 0.3, 0.8, 0.3),
                  {"table_ms": table, "verdict": "Fake GPU: made up."})


def fake_stride(strides=(4, 8), *, threads=1 << 25, **_):
    metrics = {"useful_gbps": 1.0, "sectors_per_request_model": 4, "sector_gbps": 2.0,
               "sector_fraction_of_read_ceiling": 0.5, "dram_model_gbps": 3.0}
    records = [_rec("stride", f"{s}B", {"stride_bytes": s, "threads": threads}, **metrics) for s in strides]
    return Report("stride", ENV, records, summary={"read_ceiling_gbps": 3000.0})


def fake_cache_streaming(n=10, **_):
    records = [_rec("cache-streaming", f"{sc}/{k}", {"n": n}, 2.0 if k == "normal" else 1.0)
               for sc in ("sparse_vector", "stream_analysis") for k in ("normal", "cs")]
    return Report("cache-streaming", ENV, records)


def fake_graph(lut_bytes=None, **_):
    config = {"kernels_per_graph": 4, "lut_bytes": lut_bytes or 4 * MiB, "out_bytes": 1 << 30}
    records = [_rec("graph", "replay_no_window", config, 2.0)] + [
        _rec("graph", f"replay_window_{how}", dict(config, set_aside_granted=4 * MiB, hit_ratio=1.0), 1.0,
             speedup_vs_no_window=2.0) for how in ("update", "reinstantiate")]
    return Report("graph", ENV, records)


def fake_collectives(sizes=None, **_):
    # rank 0's report (the one that prints); the table itself is bench.collectives', tested in tests/harness
    return Report("collectives", dict(ENV, distributed={"rank": 0, "ranks": 2, "backend": "nccl"}),
                  [_rec("collectives", "all_reduce", {"bytes": size, "set_aside": 0}, 1.0) for size in sizes or [MiB]])


def fake_concurrent(*, set_aside=None, **_):
    records = [_rec("concurrent", v, {"set_aside_granted": set_aside or 6 * MiB, "lut_bytes_each": 6 * MiB,
                                      "hit_ratios": hr}, 2.0, kernel1_median_ms=1.0, kernel2_median_ms=1.0)
               for v, hr in (("no_window", (None, None)), ("hit_ratio_1_each", (1.0, 1.0)), ("shared", (0.5, 0.5)))]
    return Report("concurrent", ENV, records)


def fake_overhead(**_):
    return Report("overhead", ENV, [_rec("overhead", name, {"operation": what}, 0.001, median_us=1.0, rounds_us=[1.0])
                                    for name, what in bench.OVERHEAD_VARIANTS.items()])


def fake_sweep(*_, **__):
    base = _rec("sweep", "baseline", {"set_aside_granted": 0, "hit_ratio": None}, 2.0)
    records = [_rec("sweep", "point", {"set_aside_granted": 4 * MiB, "hit_ratio": h}, 1.0, speedup_vs_baseline=2.0)
               for h in (0.5, 1.0)]
    return sweep.SweepResult("fake", records, base, ENV)


def fake_tax(*_, **__):
    records = [_rec("tax", "ceilings", {"set_aside_granted": s}, 1.0, write_gbps=3000.0, copy_gbps=2500.0)
               for s in (0, 4 * MiB)]
    return Report("sweep-tax", ENV, records)


def fake_tune(*_, **__):
    point = tuner.TunePoint("lut", 4 * MiB, 1.0, 0, 4 * MiB)
    result = tuner.PointResult(point, 2.0, (1.9, 2.1), 1.0, 2.0, "confirm", True)
    tax = bench.Tax(4 * MiB, 1.04, (1.0, 1.1), 256 * MiB, 0.2, 0.208)
    return tuner.TunedPolicy(l2ctl.Policy(set_aside=4 * MiB, hit_ratio=1.0), "lut", object(), 2.0, 1.0, (1.9, 2.1),
                             0.95, {"lut": tuner.CandidateResult("lut", 4 * MiB, [result])}, result, tax, tax,
                             "the smallest set-aside within noise of the best", [_rec("tune", "baseline",
                                                                                     {"set_aside_granted": 0}, 2.0)],
                             0.5, 9 * MiB, ENV)


def fake_workloads(*_, runs=3, **__):
    row = {"workload": "broadcast", "hot": "bias", "hot_bytes": 16 * MiB, "baseline_ms": 1.0, "recipe_speedup": 0.5,
           "recipe_ci": [0.49, 0.51], "recipe_set_aside": 30 * MiB, "recipe_copy_slowdown": 2.3, "hit1_speedup": 1.1,
           "hit1_ci": [1.0, 1.2], "tuned_buffer": "bias", "tuned_set_aside": 9 * MiB, "tuned_hit_ratio": 1.0,
           "tuned_num_bytes": 9 * MiB, "tuned_speedups": [1.2] * runs, "tuned_cis": [[1.1, 1.3]] * runs,
           "tuned_min_speedup": 1.2, "tuned_copy_slowdown": 1.0, "tune_confirmed_speedup": 1.2,
           "tune_reason": "confirmed", "grid_best": {"candidate": "bias", "set_aside": 12 * MiB, "hit_ratio": 0.8,
                                                      "offset": 0, "num_bytes": 16 * MiB, "speedup": 1.21,
                                                      "ci": [1.1, 1.3], "copy_slowdown": 1.1},
           "tune_seconds": 1.5, "candidates": 2, "tune_seconds_per_candidate": 0.75, "setup_seconds": 0.1,
           "tune_points": []}
    report = Report("workloads", ENV, [_rec("workloads", "baseline", {"workload": "broadcast"}, 1.0)])
    report.summary = {"rows": [row], "skipped": {"spmv": "needs CuPy"}, "runs": runs, "rounds": 5, "repeat": 5,
                      "recipe_set_aside": 30 * MiB, "policies": {}, "never_slower": True}
    return report


class FakeStream:
    def __init__(self, device: object = None) -> None:
        self.device = device

    def __enter__(self) -> "FakeStream":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class FakeWorkload:
    def __init__(self, lut_bytes: int, out_bytes: int = 1 << 30, *, variant: str = "plain", device: object = None,
                 seed: int = 0) -> None:
        self.buf = object()

    def __enter__(self) -> "FakeWorkload":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def fake_device_info(d=None):
    return SimpleNamespace(index=d, name=f"Fake GPU {d}", compute_capability=(9, 0), multiprocessor_count=132,
                           pci_bus_id=f"0000:0{d}:00.0", l2_cache_size=50 * MiB, persisting_l2_cache_max_size=30 * MiB,
                           access_policy_max_window_size=128 * MiB, persisting_l2_cache_size=0,
                           set_aside_granularity=0, supports_persistence=True, unsupported_reason=None,
                           total_memory=80 << 30)


class Calls:
    """What the commands called: name -> list of {parameter: value} (bound to the real signature)."""

    def __init__(self) -> None:
        self.log: dict[str, list[dict[str, Any]]] = {}

    def recorder(self, name: str, real: Any, result: Any) -> Any:
        signature = inspect.signature(real)

        def record(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            self.log.setdefault(name, []).append(dict(bound.arguments))
            return result(*args, **kwargs)

        return record

    def one(self, name: str) -> dict[str, Any]:
        assert len(self.log.get(name, [])) == 1, f"{name}: {self.log.get(name)}"
        return self.log[name][0]

    @property
    def measured(self) -> bool:
        return any(n not in ("device_info", "plot", "save") for n in self.log)


@pytest.fixture
def calls(monkeypatch) -> Iterator[Calls]:
    """The functions the commands run, replaced by recorders; two devices visible."""
    c = Calls()
    for name, fake in (("bench_reset_data", fake_reset_data), ("bench_stride", fake_stride),
                       ("bench_cache_streaming", fake_cache_streaming), ("bench_graph", fake_graph),
                       ("bench_concurrent", fake_concurrent), ("bench_overhead", fake_overhead),
                       ("bench_collectives", fake_collectives)):
        monkeypatch.setattr(bench, name, c.recorder(name, getattr(bench, name), fake))
    monkeypatch.setattr(bench_collectives_module, "collectives_table", lambda report: [f"{len(report.records)} rows"])
    monkeypatch.setattr(benchmark_gallery, "bench_workloads",
                        c.recorder("bench_workloads", benchmark_gallery.bench_workloads, fake_workloads))
    for name in ("sweep_hit_ratio", "sweep_set_aside", "sweep_surface"):
        monkeypatch.setattr(sweep, name, c.recorder(name, getattr(sweep, name), fake_sweep))
    monkeypatch.setattr(sweep, "sweep_tax", c.recorder("sweep_tax", sweep.sweep_tax, fake_tax))
    monkeypatch.setattr(sweep, "ResetDataWorkload", c.recorder("ResetDataWorkload", FakeWorkload, FakeWorkload))
    monkeypatch.setattr(tuner, "tune", c.recorder("tune", tuner.tune, fake_tune))
    monkeypatch.setattr(l2ctl, "Stream", c.recorder("Stream", FakeStream, FakeStream))
    for name in ("reset_data", "stride", "cache_streaming", "hit_ratio", "set_aside", "surface", "tax"):
        monkeypatch.setattr(plot, name, c.recorder("plot", getattr(plot, name), lambda *a, **k: "axes"))

    def save(ax: Any, path: str) -> str:
        with open(path, "w") as f:
            f.write("fake plot")
        return path

    monkeypatch.setattr(plot, "save", c.recorder("save", plot.save, save))
    monkeypatch.setattr(l2ctl, "device_count", lambda: 2)
    monkeypatch.setattr(l2ctl, "versions", lambda: {"driver": 13000, "runtime": 13000})
    monkeypatch.setattr(l2ctl, "device_info", c.recorder("device_info", l2ctl.device_info, fake_device_info))
    monkeypatch.setattr(l2ctl, "set_aside_granularity",
                        c.recorder("set_aside_granularity", l2ctl.set_aside_granularity, lambda d=None: 2 * MiB))
    monkeypatch.setattr(l2ctl, "set_aside_rounding", lambda d=None: "up")
    monkeypatch.setattr(bench_cmd, "frameworks_missing", lambda names: None)  # the fake gallery needs none
    with _backend.use(_backend.current()):  # --simulate installs the simulator; put back what was there
        yield c


def main(*argv: str) -> int:
    return cli.main(list(argv))


# ------------------------------------------------------------------------------------ every option

FILE = "file"  # the option writes a file
SIMULATED = "simulated"  # {SIMULATED: [names]}: the command ran on the simulator, with these GPUs
# command -> [(option tokens, {function: {parameter: value}}, FILE or SIMULATED)]; {tmp} is a temporary directory
H100, H200 = "NVIDIA H100 80GB HBM3 (simulated)", "NVIDIA H200 (simulated)"
SIMULATE = [(["--simulate"], {SIMULATED: [H100]}), (["--simulate", "h200"], {SIMULATED: [H200]}),
            (["--simulate", "H200,h100"], {SIMULATED: [H200, H100]})]
COMMON = [
    (["--device", "1"], {"*": {"device": 1}}),
    (["--repeat", "5"], {"*": {"repeat": 5}}),
    (["--warmup", "0"], {"*": {"warmup": 0}}),
    (["--quiet"], {"*": {"progress": False}}),
    (["--json", "{tmp}/out.json"], FILE),
    (["--csv", "{tmp}/out.csv"], FILE),
] + SIMULATE
PLOT = [(["--plot", "{tmp}/out.png"], FILE)]
WORKLOAD = [
    (["--lut-bytes", "8M"], {"ResetDataWorkload": {"lut_bytes": 8 * MiB}}),
    (["--out-bytes", "256M"], {"ResetDataWorkload": {"out_bytes": 256 * MiB}}),
    (["--variant", "Hinted"], {"ResetDataWorkload": {"variant": "hinted"}}),
]
SWEEP_DEVICE = (["--device", "1"], {"Stream": {"device": 1}, "ResetDataWorkload": {"device": 1}})
CASES: dict[str, tuple[str, list[tuple[list[str], Any]]]] = {
    # command: (the function it runs, its cases)
    "info": ("device_info", [(["--device", "1"], {"device_info": {"device": 1}}),
                             (["--probe"], {"set_aside_granularity": {"device": 1}}),  # the last of both
                             (["--json", "{tmp}/out.json"], FILE), (["--csv", "{tmp}/out.csv"], FILE),
                             (["--quiet"], {})] + SIMULATE),
    "bench reset-data": ("bench_reset_data", COMMON + PLOT + [
        (["--lut-sizes", "1M,2M"], {"*": {"lut_sizes": [MiB, 2 * MiB]}}),
        (["--out-bytes", "256M"], {"*": {"out_bytes": 256 * MiB}}),
        (["--columns", "baseline,hints"], {"*": {"columns": ["baseline", "hints"]}}),
        (["--counters"], {"*": {"counters": True}}),
    ]),
    "bench stride": ("bench_stride", COMMON + PLOT + [
        (["--strides", "8,16"], {"*": {"strides": [8, 16]}}),
        (["--threads", "64"], {"*": {"threads": 64}}),
    ]),
    "bench cache-streaming": ("bench_cache_streaming", COMMON + PLOT + [(["--n", "1000"], {"*": {"n": 1000}})]),
    "bench graph": ("bench_graph", COMMON + [(["--lut-bytes", "2M"], {"*": {"lut_bytes": 2 * MiB}})]),
    "bench concurrent": ("bench_concurrent", COMMON + [(["--set-aside", "8M"], {"*": {"set_aside": 8 * MiB}})]),
    "bench overhead": ("bench_overhead", [c for c in COMMON if c[0][0] not in ("--repeat", "--warmup")] + [
        (["--rounds", "3"], {"*": {"rounds": 3}}),
        (["--iterations", "50"], {"*": {"iterations": 50}})]),
    "bench collectives": ("bench_collectives", COMMON + [
        (["--sizes", "64M,1G"], {"*": {"sizes": [64 * MiB, 1 << 30]}}),
        (["--rounds", "4"], {"*": {"rounds": 4}})]),
    "sweep hit-ratio": ("sweep_hit_ratio", COMMON[1:] + [SWEEP_DEVICE] + PLOT + WORKLOAD + [
        (["--set-aside", "8M"], {"*": {"set_aside": 8 * MiB}})]),
    "sweep set-aside": ("sweep_set_aside", COMMON[1:] + [SWEEP_DEVICE] + PLOT + WORKLOAD),
    "sweep surface": ("sweep_surface", COMMON[1:] + [SWEEP_DEVICE] + PLOT + WORKLOAD),
    "sweep tax": ("sweep_tax", COMMON[1:] + [(["--device", "1"], {"Stream": {"device": 1}})] + PLOT),
    "bench workloads": ("bench_workloads", COMMON + [
        (["--names", "broadcast,spmv"], {"*": {"names": ["broadcast", "spmv"]}}),
        (["--runs", "2"], {"*": {"runs": 2}}),
        (["--rounds", "4"], {"*": {"rounds": 4}})]),
    "tune": ("tune", COMMON[1:] + [SWEEP_DEVICE] + WORKLOAD[1:] + [
        (["--lut-sizes", "8M"], {"ResetDataWorkload": {"lut_bytes": 8 * MiB}}),
        (["--rounds", "4"], {"*": {"rounds": 4}})]),
}


def _commands() -> dict[str, tuple[parsing.Command, tuple[options.Option, ...]]]:
    """command words -> (the command, the options shown where the command's options may come first)."""
    out = {}
    for entry in cli.COMMANDS:
        if isinstance(entry, parsing.Group):
            for command in entry.commands:
                out[f"{entry.name} {command.name}"] = (command, entry.options)
        else:
            out[entry.name] = (entry, ())
    return out


COMMANDS = _commands()


def test_every_option_of_every_command_has_a_case():
    assert set(CASES) == set(COMMANDS)
    for words, (command, _) in COMMANDS.items():
        tested = {tokens[0] for tokens, _ in CASES[words][1]}
        assert tested == {o.flag for o in command.options}, words
        assert {o.flag for o in options.EVERYWHERE} <= tested, words  # the README's promise


def _placements(words: str, tokens: list[str]) -> list[list[str]]:
    """The command line with the option after the command's name, before it and, in a group, between."""
    head = words.split()
    lines = [head + tokens, tokens + head]
    if len(head) == 2:
        lines.append(head[:1] + tokens + head[1:])
        if words == "bench reset-data":
            lines += [head[:1] + tokens, tokens + head[:1]]  # bench with no name runs reset-data
    return lines


@pytest.mark.parametrize("words,tokens,expected", [
    (words, tokens, expected) for words, (_, cases) in CASES.items() for tokens, expected in cases],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v if isinstance(v, str) else "")
def test_every_option_is_passed_through(calls, capsys, tmp_path, words, tokens, expected):
    function = CASES[words][0]
    for argv in _placements(words, [t.format(tmp=tmp_path) for t in tokens]):
        calls.log.clear()
        for f in tmp_path.iterdir():
            f.unlink()
        _backend.install(_core)
        assert main(*argv) == cli.EXIT_OK, argv
        out = capsys.readouterr().out
        assert "Fake GPU" in out
        if expected == FILE:
            written = tmp_path / os.path.basename(tokens[1])
            assert written.stat().st_size > 0, argv
            if tokens[0] == "--json":
                assert json.loads(written.read_text())["devices" if words == "info" else "records"], argv
        elif SIMULATED in expected:
            assert [d.name for d in _backend.current().devices] == expected[SIMULATED], argv
        else:
            for name, params in expected.items():
                got = calls.log[function if name == "*" else name][-1]
                for param, value in params.items():
                    assert got[param] == value, (argv, name, param)


@pytest.mark.parametrize("argv", [["bench", "--json", "{tmp}/x.json", "--device", "1", "reset-data"],
                                  ["bench", "reset-data", "--json", "{tmp}/x.json", "--device", "1"],
                                  ["bench", "--json", "{tmp}/x.json", "reset-data", "--device", "1"],
                                  ["bench", "--device", "1", "--json", "{tmp}/x.json"]])
def test_options_before_and_after_the_benchmark_name(calls, capsys, tmp_path, argv):
    assert main(*[a.format(tmp=tmp_path) for a in argv]) == 0
    assert calls.one("bench_reset_data")["device"] == 1
    assert (tmp_path / "x.json").exists()


@pytest.mark.parametrize("argv,message", [
    (["bench", "--repeat", "3", "stride", "--repeat", "5"], "--repeat is given twice (3, then 5)"),
    (["bench", "--out-bytes=1M", "--out-bytes", "2M"], "--out-bytes is given twice (1M, then 2M)"),
    (["--quiet", "info", "--quiet"], "--quiet is given twice"),
    (["--simulate", "bench", "--simulate", "h200"], "--simulate is given twice (h100, then h200)")],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_a_repeated_option_is_refused(calls, capsys, argv, message):
    assert main(*argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "give each option once" in err, err
    assert not calls.measured


def test_defaults_reach_the_functions(calls, capsys):
    assert main("bench") == 0
    got = calls.one("bench_reset_data")
    assert got["lut_sizes"] is None and got["columns"] is None and got["device"] is None
    assert (got["out_bytes"], got["repeat"], got["warmup"], got["progress"], got["counters"]) == (1 << 30, 15, 3,
                                                                                                  True, False)
    assert main("bench", "graph") == 0 and calls.one("bench_graph")["progress"] is True
    assert main("bench", "concurrent") == 0 and calls.one("bench_concurrent")["progress"] is True
    assert main("sweep", "hit-ratio") == 0
    assert calls.one("ResetDataWorkload")["lut_bytes"] == 4 * MiB and calls.one("sweep_hit_ratio")["set_aside"] is None
    calls.log.clear()
    assert main("tune") == 0
    got = calls.one("tune")
    assert (got["repeat"], got["warmup"], got["rounds"], got["progress"]) == (5, 1, 5, True)
    calls.log.clear()
    assert main("bench", "workloads") == 0
    got = calls.one("bench_workloads")
    assert (got["names"], got["runs"], got["rounds"], got["repeat"], got["warmup"]) == (None, 3, 5, 5, 1)


def test_tune_writes_one_file_per_lut_size(calls, capsys, tmp_path):
    assert main("tune", "--lut-sizes", "1M,2M", "--json", f"{tmp_path}/t.json", "--csv", f"{tmp_path}/t.csv") == 0
    assert [c["lut_bytes"] for c in calls.log["ResetDataWorkload"]] == [MiB, 2 * MiB]
    assert sorted(os.listdir(tmp_path)) == ["t_1048576.csv", "t_1048576.json", "t_2097152.csv", "t_2097152.json"]


def test_tables(calls, capsys):
    assert main("bench", "--counters", "--columns", "baseline,right_sized") == 0
    out = capsys.readouterr().out
    assert "right_sized" in out and "Hardware counters" in out and "Verdict" in out
    assert main("tune") == 0
    out = capsys.readouterr().out
    assert "persist lut" in out and "plain copy" in out and "grid best" in out and "<- chosen" in out
    assert main("bench", "workloads") == 0
    out = capsys.readouterr().out
    assert "broadcast" in out and "1.20 1.20 1.20x" in out and "spmv" in out and "skipped: needs CuPy" in out
    assert main("info", "--probe") == 0
    out = capsys.readouterr().out
    assert "device 0: Fake GPU 0" in out and "device 1: Fake GPU 1" in out and "granularity" in out


def test_info_writes_the_devices_as_json_and_csv(calls, capsys, tmp_path):
    assert main("info", "--json", f"{tmp_path}/i.json", "--csv", f"{tmp_path}/i.csv") == 0
    doc = json.loads((tmp_path / "i.json").read_text())
    assert (doc["l2ctl_version"], doc["driver_version"], doc["runtime_version"]) == (l2ctl.__version__, 13000, 13000)
    assert doc["simulated"] == _backend.simulated()
    assert [(d["index"], d["name"], d["compute_capability"]) for d in doc["devices"]] == [(0, "Fake GPU 0", "9.0"),
                                                                                          (1, "Fake GPU 1", "9.0")]
    assert doc["devices"][1]["persisting_l2_cache_max_size"] == 30 * MiB and doc["devices"][1]["set_aside_limit"] == 0
    with open(tmp_path / "i.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["name"], r["l2_cache_size"], r["supports_persistence"]) for r in rows] == [
        ("Fake GPU 0", str(50 * MiB), "True"), ("Fake GPU 1", str(50 * MiB), "True")]
    assert main("--json", f"{tmp_path}/one.json", "--device", "1", "info", "--probe") == 0
    (one,) = json.loads((tmp_path / "one.json").read_text())["devices"]
    assert (one["index"], one["set_aside_granularity"], one["set_aside_rounding"]) == (1, 2 * MiB, "up")
    err = capsys.readouterr().err
    assert err.count("wrote ") == 3


def test_the_header_says_when_the_gpu_is_simulated():
    from l2ctl.cli import output

    real = output.header(Report("x", ENV, []))
    assert "SIMULATED" not in real and "\n" not in real
    simulated = output.header(Report("x", dict(ENV, simulated="simulated by a model"), []))
    assert simulated == real + "\nSIMULATED, not a measurement of real hardware: simulated by a model"


@pytest.fixture
def restored() -> Iterator[None]:
    """The backend in use put back after a test that runs the command line with --simulate."""
    with _backend.use(_backend.current()):
        yield


BANNER = "SIMULATED, not a measurement of real hardware: simulated by l2ctl.testing, not a GPU ("
QUICK = ["--repeat", "1", "--warmup", "0", "--quiet"]


@pytest.mark.parametrize("argv", [
    ["--simulate", "info"], ["info", "--simulate", "h200", "--probe"], ["--simulate", "bench", "stride", *QUICK],
    ["bench", "--simulate", "h200", "--lut-sizes", "1M", "--out-bytes", "64M", *QUICK],
    ["bench", "overhead", "--rounds", "3", "--iterations", "10", "--simulate"],
    ["sweep", "--simulate", "h200", "tax", *QUICK], ["sweep", "hit-ratio", "--out-bytes", "64M", "--simulate", *QUICK],
    ["tune", "--out-bytes", "64M", "--rounds", "3", *QUICK, "--simulate", "h200"]], ids=" ".join)
def test_every_command_on_the_simulator_says_so(restored, capsys, tmp_path, argv):
    _backend.install(_core)
    assert main(*argv, "--json", f"{tmp_path}/r.json") == cli.EXIT_OK
    banner = capsys.readouterr().out.splitlines()[1]  # right under the first line
    name = H200 if "h200" in argv else H100
    assert banner.startswith(BANNER + name)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc.get("environment", doc)["simulated"] == _backend.simulated() == banner.split(": ", 1)[1]


def test_simulated_from_the_environment_and_options_anywhere_in_a_subprocess(tmp_path):
    r = subprocess.run([sys.executable, "-m", "l2ctl", "info"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, L2CTL_SIMULATE="h200"))
    assert r.returncode == 0 and r.stdout.splitlines()[1].startswith(BANNER + H200), r.stdout + r.stderr
    r = run("--quiet", "--simulate", "h200", "bench", "stride", "--json", f"{tmp_path}/s.json", *QUICK[:4])
    assert r.returncode == 0 and r.stdout.splitlines()[1].startswith(BANNER + H200), r.stdout + r.stderr
    assert r.stderr == f"wrote {tmp_path}/s.json\n"  # --quiet before the command: no progress
    assert json.loads((tmp_path / "s.json").read_text())["environment"]["simulated"].startswith("simulated by")
    r = run("--device", "0", "--simulate", "info", "--csv", f"{tmp_path}/i.csv")
    assert r.returncode == 0 and BANNER in r.stdout and "device 0: " + H100 in r.stdout
    assert (tmp_path / "i.csv").read_text().startswith("index,name,simulated,")


# ------------------------------------------------------------------------------------ bench workloads

NO_FRAMEWORK = "l2ctl: bench workloads: nothing to measure here: "
NEEDS_TORCH, NEEDS_CUPY = "needs PyTorch (pip install torch)", "needs CuPy (pip install cupy-cuda12x or cupy-cuda13x)"


def test_bench_workloads_without_a_framework_exits_3(calls, capsys, monkeypatch):
    monkeypatch.setattr(bench_cmd, "frameworks_missing", REAL_FRAMEWORKS_MISSING)
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert main("bench", "workloads") == cli.EXIT_UNSUPPORTED
    assert capsys.readouterr() == ("", f"{NO_FRAMEWORK}{NEEDS_TORCH}; {NEEDS_CUPY}\n")
    assert main("--simulate", "bench", "workloads", "--names", "spmv") == cli.EXIT_UNSUPPORTED
    assert capsys.readouterr() == ("", f"{NO_FRAMEWORK}{NEEDS_CUPY}\n")
    # PyTorch installed but no CUDA for it (the simulator is no GPU to PyTorch): said, and exit 3 too
    no_cuda = SimpleNamespace(__version__="2.9.0+cpu", cuda=SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", no_cuda)
    assert main("bench", "workloads", "--simulate", "--names", "broadcast,step") == cli.EXIT_UNSUPPORTED
    assert capsys.readouterr().err == (f"{NO_FRAMEWORK}PyTorch 2.9.0+cpu sees no CUDA device (a CPU-only build, or no "
                                       "driver)\n")
    assert "bench_workloads" not in calls.log  # refused before any device work
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(__version__="2.9.0", cuda=SimpleNamespace(
        is_available=lambda: True)))
    assert main("bench", "workloads") == cli.EXIT_OK  # one framework that can run: the gallery runs


def test_bench_workloads_where_every_row_is_skipped_exits_3(calls, capsys, monkeypatch):
    def all_skipped(*args: Any, **kwargs: Any) -> Report:
        report = fake_workloads(*args, **kwargs)
        report.summary["rows"] = []
        return report

    monkeypatch.setattr(benchmark_gallery, "bench_workloads", all_skipped)
    assert main("bench", "workloads") == cli.EXIT_UNSUPPORTED
    captured = capsys.readouterr()
    assert "skipped: needs CuPy" in captured.out and "recipe:" not in captured.out
    assert captured.err.splitlines()[-1] == ("l2ctl: bench workloads: nothing was measured: every workload was "
                                             "skipped (the reasons above)")


def test_bench_workloads_without_a_framework_in_a_subprocess():
    """The real path, frameworks hidden from the import system, on the simulator."""
    code = ("import sys; sys.modules['torch'] = sys.modules['cupy'] = None; from l2ctl.cli import main; "
            "sys.exit(main(['--simulate', 'bench', 'workloads']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (3, "", f"{NO_FRAMEWORK}{NEEDS_TORCH}; {NEEDS_CUPY}\n")


# ------------------------------------------------------------------------------------ refusals

SAMPLE = {"--lut-sizes": ["1M"], "--out-bytes": ["64M"], "--columns": ["baseline"], "--counters": [],
          "--plot": ["{tmp}/x.png"], "--device": ["1"], "--repeat": ["2"], "--warmup": ["1"],
          "--json": ["{tmp}/x.json"], "--csv": ["{tmp}/x.csv"], "--quiet": [], "--strides": ["8"],
          "--threads": ["64"], "--n": ["100"], "--rounds": ["3"], "--iterations": ["10"], "--lut-bytes": ["1M"], "--set-aside": ["1M"],
          "--variant": ["plain"], "--names": ["broadcast"], "--runs": ["1"], "--probe": [], "--simulate": [],
          "--sizes": ["1M"]}


def test_samples_cover_every_option():
    assert set(SAMPLE) == {o.flag for o in parsing.known_options(cli.COMMANDS)}


REFUSALS = [(words, flag) for words, (command, _) in COMMANDS.items() for flag in SAMPLE
            if flag not in {o.flag for o in command.options}]


@pytest.mark.parametrize("words,flag", REFUSALS, ids=[f"{w} {f}" for w, f in REFUSALS])
def test_an_option_a_command_does_not_take_is_refused(calls, capsys, tmp_path, words, flag):
    tokens = [flag] + [t.format(tmp=tmp_path) for t in SAMPLE[flag]]
    for argv in _placements(words, tokens):
        assert main(*argv) == cli.EXIT_USAGE, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{flag} does not apply to '{words}'" in err, err
        assert not calls.measured and not os.listdir(tmp_path)


# ------------------------------------------------------------------------------------ validation

BAD = [
    (["bench", "--repeat", "-3"], "--repeat: must be at least 1"),
    (["bench", "--repeat", "0"], "must be at least 1"),
    (["bench", "--repeat", "1000001"], "must be at most"),
    (["bench", "--repeat", "x"], "not an integer"),
    (["bench", "stride", "--warmup", "-1"], "--warmup: must be at least 0"),
    (["bench", "--device", "2"], "device 2 does not exist; 2 device(s)"),
    (["bench", "--device", "-1"], "--device: must be at least 0"),
    (["info", "--device", "5"], "device 5 does not exist"),
    (["bench", "stride", "--threads", "0"], "--threads: must be at least 32"),
    (["bench", "cache-streaming", "--n", "0"], "--n: must be at least 1"),
    (["bench", "stride", "--strides", "6"], "multiples of 4"),
    (["bench", "stride", "--strides", "0"], "must be at least 4"),
    (["bench", "stride", "--strides", ","], "no stride"),
    (["bench", "--lut-sizes", "4x"], "not a size"),
    (["bench", "--lut-sizes", "1T"], "not a size: '1T' (a number of bytes, optionally with a unit: K, M or G"),
    (["bench", "--out-bytes", "1E1000000"], "size too large: '1E1000000'"),
    (["tune", "--out-bytes", "1E1000000"], "size too large: '1E1000000'"),
    (["bench", "collectives", "--sizes", "1E1000000"], "size too large: '1E1000000'"),
    (["bench", "collectives", "--sizes", "64K,6"], "6 B is not a multiple of the 4-byte float32 element"),
    (["bench", "--lut-sizes", "100G", "--out-bytes", "64M", "--device", "0"],
     "--lut-sizes and --out-bytes need 100.06 GiB of device memory at once; device 0 (Fake GPU 0) has 80.00 GiB"),
    (["tune", "--lut-sizes", "4M,100G"], "need 101.00 GiB of device memory at once"),
    (["sweep", "surface", "--out-bytes", "81G"], "--lut-bytes and --out-bytes need 81.00 GiB"),
    (["bench", "graph", "--lut-bytes", "81G"], "--lut-bytes needs 81.00 GiB"),
    (["bench", "collectives", "--sizes", "1M,90G", "--device", "1"], "device 1 (Fake GPU 1) has 80.00 GiB"),
    (["bench", "--lut-sizes", "6"], "multiple of 4"),
    (["bench", "--lut-sizes", "0"], "size must be positive"),
    (["bench", "--out-bytes", "-1M"], "argument --out-bytes: size must be positive: '-1M'"),
    (["bench", "graph", "--lut-bytes", "-4M"], "argument --lut-bytes: size must be positive: '-4M'"),
    (["bench", "graph", "--lut-bytes=-4M"], "argument --lut-bytes: size must be positive: '-4M'"),
    (["--lut-bytes", "-4M", "sweep", "tax"], "size must be positive: '-4M'"),  # checked before it is refused
    (["tune", "--lut-sizes", "-4M,8M"], "size must be positive: '-4M'"),
    (["bench", "concurrent", "--set-aside", "-1"], "size must be positive: '-1'"),
    (["bench", "graph", "--lut-bytes", "0.5"], "size must be a whole number of bytes: '0.5' is 0.5 B"),
    (["bench", "--out-bytes", "1.5"], "size must be a whole number of bytes: '1.5' is 1.5 B"),
    (["bench", "--out-bytes", "1.3K"], "size must be a whole number of bytes: '1.3K' is 1331.2 B"),
    (["bench", "--lut-sizes", "4M,,8M"], "empty item in '4M,,8M'"),
    (["bench", "--lut-sizes", "4M,"], "empty item in '4M,'"),
    (["bench", "stride", "--strides", "4,,8"], "empty item in '4,,8'"),
    (["bench", "--columns", ",baseline"], "empty item in ',baseline'"),
    (["bench", "workloads", "--names", "broadcast,,spmv"], "empty item"),
    (["--simulate", "h900", "info"], "argument --simulate: no simulated GPU 'h900'; choose from h100, h200"),
    (["bench", "--simulate=h100,,h200"], "argument --simulate: empty item"),
    (["tune", "--simulate="], "argument --simulate: no GPU given"),
    (["info", "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["--csv", "{tmp}", "info"], "is a directory"),
    (["info", "--json"], "expected one argument"),
    (["--quiet", "--simulate", "--json", "info"], "required"),  # "info" taken for the file: no command
    (["bench", "concurrent", "--set-aside", "0"], "size must be positive"),
    (["bench", "--columns", "baseline,nope"], "unknown column(s) 'nope'"),
    (["sweep", "surface", "--variant", "fast"], "unknown variant 'fast'"),
    (["tune", "--variant", "fast"], "unknown variant"),
    (["bench", "--json", "/nonexistent/dir/x.json"], "does not exist"),
    (["bench", "--json", "/proc/x.json"], "cannot write /proc/x.json: "),
    (["tune", "--csv", "/proc/x.csv"], "cannot write /proc/x.csv: "),
    (["sweep", "tax", "--plot", "/proc/x.png"], "cannot write /proc/x.png: "),
    (["bench", "--json", "{tmp}/x.json", "--csv", "{tmp}/x.csv", "--columns", "nope"], "unknown column"),  # no probe left
    (["bench", "stride", "--csv", "/nonexistent/dir/x.csv"], "does not exist"),
    (["sweep", "tax", "--plot", "/nonexistent/dir/x.png"], "does not exist"),
    (["bench", "--json", "{tmp}"], "is a directory"),
    (["bench", "--plot", "{tmp}/x.unknownformat"], "extensions matplotlib writes"),
    (["bench", "--rep", "3"], "unknown option --rep; did you mean --repeat?"),
    (["bench", "stride", "--frobnicate"], "unknown option --frobnicate"),
    (["bench", "--lut-sizes"], "expected one argument"),
    (["bench", "nope"], "invalid choice: 'nope'"),
    (["sweep"], "required"),
    (["sweep", "--json", "{tmp}/x.json"], "required"),
    ([], "required"),
]


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(calls, capsys, tmp_path, argv, message):
    assert main(*[a.format(tmp=tmp_path) for a in argv]) == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and message in captured.err, captured.err
    assert "Traceback" not in captured.err and not calls.measured and not os.listdir(tmp_path)


@pytest.mark.parametrize("argv", [["bench", "--repeat", "-3"], ["bench", "--json", "/nonexistent/dir/x.json"],
                                  ["sweep", "--lut-bytes", "4M", "tax"], ["bench", "--lut-sizes", "4M", "stride"],
                                  ["bench", "stride", "--strides", "5"], ["sweep", "set-aside", "--variant", "x"],
                                  ["tune", "--warmup", "-2"], ["bench", "--columns", "x"],
                                  ["bench", "--plot", "/nonexistent/x.png", "graph"],
                                  ["bench", "graph", "--lut-bytes", "-4M"], ["--quiet", "bench", "--out-bytes", "1.5"],
                                  ["--simulate", "bench", "--lut-sizes", "4M,,8M"], ["info", "--simulate", "nope"],
                                  ["--simulate", "bench", "--lut-sizes", "100G", "--out-bytes", "64M"],
                                  ["--simulate", "bench", "--out-bytes", "1E1000000"],
                                  ["--simulate", "bench", "--json", "/proc/x.json"],
                                  ["--simulate", "bench", "collectives", "--sizes", "64K,6"]])
def test_no_traceback_from_the_command_line(argv):
    r = run(*argv)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and r.stderr.startswith("python -m l2ctl")


def test_plot_without_matplotlib(calls, capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    for argv in (["bench", "--plot", f"{tmp_path}/r.png"], ["sweep", "--plot", f"{tmp_path}/r.png", "tax"]):
        assert main(*argv) == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--plot needs matplotlib: pip install 'l2ctl[plot]'" in err
    assert not calls.measured and not os.listdir(tmp_path)
    assert main("bench") == 0  # no --plot: matplotlib is not needed


@pytest.mark.parametrize("error,code", [(VerificationError("verification failed: x"), cli.EXIT_VERIFY),
                                        (NotSupportedError("no persistence here"), cli.EXIT_UNSUPPORTED),
                                        (CudaError("cudaMalloc", 2, "cudaErrorMemoryAllocation", "out of memory"),
                                         cli.EXIT_ERROR),
                                        (ValueError("bad"), cli.EXIT_USAGE),
                                        (MemoryError("Unable to allocate 100. GiB for an array"), cli.EXIT_ERROR),
                                        (KeyboardInterrupt(), cli.EXIT_INTERRUPTED)])
def test_exit_codes(monkeypatch, capsys, error, code):
    def fail(*_, **__):
        raise error

    monkeypatch.setattr(bench, "bench_stride", fail)
    assert main("bench", "stride") == code
    err = capsys.readouterr().err
    assert err.startswith("l2ctl: ") and err.count("\n") == 1


def test_output_write_failure_exits_2(calls, capsys, tmp_path, monkeypatch):
    def fail(self, file):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Report, "write_json", fail)
    assert main("bench", "stride", "--json", f"{tmp_path}/x.json") == cli.EXIT_USAGE
    captured = capsys.readouterr()
    assert "stride" in captured.out  # the table was printed first
    assert "cannot write" in captured.err and "Permission denied" in captured.err


# ------------------------------------------------------------------------------------ help


def _help_entries(text: str) -> dict[str, str]:
    """flag -> its help text, from --help output."""
    entries: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if line.startswith("  -") and not line.startswith("    "):
            current = stripped.split()[0].rstrip(",")
            entries[current] = stripped
        elif current and line.startswith("   ") and stripped:
            entries[current] += " " + stripped
        else:
            current = None
    return entries


HELP = ["info", "bench", "sweep", "tune"] + [w for w in COMMANDS if " " in w]


@pytest.mark.parametrize("words", HELP)
def test_help_shows_every_option_with_its_default(capsys, words):
    assert main(*words.split(), "--help") == 0
    text = capsys.readouterr().out
    entries = _help_entries(text)
    if words in COMMANDS:
        shown = COMMANDS[words][0].options
    else:
        shown = next(e for e in cli.COMMANDS if e.name == words).options
    assert {o.flag for o in shown} == set(entries) - {"-h"}
    for flag, entry in entries.items():
        if flag != "-h":
            assert "(default: " in entry, entry


def test_help_in_a_subprocess():
    r = run("bench", "stride", "--help")
    text = " ".join(r.stdout.split())  # as wrapped for the terminal's width
    assert r.returncode == 0 and "(default: 4,8,16,32,64,128)" in text and "(default: 15)" in text
    text = " ".join(run("tune", "--help").stdout.split())
    assert "(default: 5)" in text and "(default: 4M)" in text


@pytest.fixture
def sim(fake):
    return fake


def test_cli_on_the_simulator(sim, capsys):
    from l2ctl import cli

    assert cli.main(["info", "--probe"]) == 0
    assert cli.main(["bench", "--lut-sizes", "1M,4M", "--out-bytes", "64M", "--repeat", "2", "--warmup", "1",
                     "--quiet", "--counters"]) == 0
    assert cli.main(["sweep", "tax", "--repeat", "2", "--warmup", "1", "--quiet"]) == 0
    assert cli.main(["tune", "--lut-sizes", "4M", "--out-bytes", "64M", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "H100" in out and "right_sized" in out and "set-aside" in out


# ------------------------------------------------------------------------------------ a new user's first screen


REPEATED_ITEMS = [  # (the command line, the function it runs, its parameter, the value it gets, the note)
    (["bench", "--lut-sizes", "8mb,8MB,8M,8MiB"], "bench_reset_data", "lut_sizes", [8 * MiB],
     "8mb, 8MB, 8M, 8MiB are one size (8.00 MiB)"),
    (["bench", "--lut-sizes", "4M,1M,4M"], "bench_reset_data", "lut_sizes", [4 * MiB, MiB],
     "4M, 4M are one size (4.00 MiB)"),
    (["bench", "collectives", "--sizes", "1M,1024K"], "bench_collectives", "sizes", [MiB],
     "1M, 1024K are one size (1.00 MiB)"),
    (["bench", "stride", "--strides", "8,8"], "bench_stride", "strides", [8], "8, 8 are one stride (8 B)"),
    (["bench", "--columns", "hints,baseline,hints"], "bench_reset_data", "columns", ["hints", "baseline"],
     "hints is named twice"),
    (["bench", "workloads", "--names", "spmv,spmv,spmv"], "bench_workloads", "names", ["spmv"],
     "spmv is named 3 times")]


@pytest.mark.parametrize("argv,function,parameter,given,note", REPEATED_ITEMS,
                         ids=[" ".join(a) for a, *_ in REPEATED_ITEMS])
def test_a_repeated_list_item_is_measured_once_and_said_so(calls, capsys, argv, function, parameter, given, note):
    assert main(*argv) == cli.EXIT_OK
    assert calls.one(function)[parameter] == given
    err = capsys.readouterr().err
    assert f"l2ctl: {note}: measured once" in err, err


def test_repeated_lut_sizes_give_one_row_without_repeated_columns(restored, capsys):
    _backend.install(_core)
    assert main("--simulate", "bench", "--lut-sizes", "4M,4M", "--out-bytes", "64M", "--columns", "baseline,hints",
                *QUICK) == cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    (head,) = [line for line in lines if line.split()[:1] == ["LUT"]]
    assert head.split() == ["LUT", "baseline", "hints"]
    assert [line.split()[:2] for line in lines if "MiB" in line and line.split()[1:2] == ["MiB"]] == [["4.00", "MiB"]]


def test_a_baseline_only_run_has_no_empty_verdict(restored, capsys):
    _backend.install(_core)
    assert main("--simulate", "bench", "--lut-sizes", "1M", "--out-bytes", "64M", "--columns", "baseline",
                *QUICK) == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "Verdict" not in out and ": ." not in out
    assert main("--simulate", "bench", "--lut-sizes", "1M", "--out-bytes", "64M", "--columns", "baseline,hints",
                *QUICK) == cli.EXIT_OK
    (verdict,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("Verdict: ")]
    assert "eviction hints alone" in verdict


def test_an_output_file_is_probed_without_being_changed(calls, capsys, tmp_path):
    kept = tmp_path / "kept.json"
    kept.write_text("an earlier run")
    assert main("bench", "--json", str(kept), "--plot", f"{tmp_path}/p.png", "--columns", "nope") == cli.EXIT_USAGE
    assert kept.read_text() == "an earlier run" and os.listdir(tmp_path) == ["kept.json"]
    capsys.readouterr()


def test_collective_sizes_that_the_ranks_cannot_split_evenly_are_refused(calls, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")  # torchrun's: all-gather splits a size into 3 float32 parts
    assert main("bench", "collectives", "--sizes", "64K") == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "65536 B is not a multiple of 12 B (3 ranks x the 4-byte float32 element" in err
    assert main("bench", "collectives", "--sizes", "48K") == cli.EXIT_OK


def test_info_without_a_gpu_points_to_the_simulator(calls, capsys, monkeypatch):
    monkeypatch.setattr(l2ctl, "device_count", lambda: 0)
    assert main("info") == cli.EXIT_UNSUPPORTED
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err and "--simulate" in err


@pytest.mark.parametrize("value", ["0", "false", "Off", "no", ""])
def test_l2ctl_simulate_off_values_leave_the_real_backend(value):
    r = subprocess.run([sys.executable, "-m", "l2ctl", "--version"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, L2CTL_SIMULATE=value))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert l2ctl.__version__ in r.stdout


def test_a_copy_at_full_speed_is_said_so(calls, capsys, monkeypatch):
    def untaxed(*args: Any, **kwargs: Any) -> Report:
        report = fake_workloads(*args, **kwargs)
        report.summary["rows"][0]["grid_best"]["copy_slowdown"] = 1.004
        return report

    monkeypatch.setattr(benchmark_gallery, "bench_workloads", untaxed)
    assert main("bench", "workloads") == cli.EXIT_OK
    out = capsys.readouterr().out
    assert "(copy at full speed)" in out and "1.00x slower" not in out
