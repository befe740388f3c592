"""The tuner, the paired comparisons under it, the tax and the gallery benchmark, on the simulated devices
(modeled workloads stand in for the framework gallery, which needs a GPU)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import types
from typing import Iterator

import numpy as np
import pytest

import l2ctl
from l2ctl import bench, benchmark_gallery, tuner
from l2ctl.bench.paired import Arm, bootstrap_speedup, compare
from l2ctl.testing import FakeBackend, FakeDevice
from l2ctl.workloads.modeled import ModeledKernel, ModeledWorkload
from stand_ins import SetAsideSurface
from l2ctl.tuner import CandidateResult, PointResult, TunePoint, choose, refine_points, screen_points, winners
from l2ctl.workloads import ResetDataWorkload, gallery

MiB = 1 << 20
PRESETS = [FakeDevice.h100, FakeDevice.h200]


@pytest.fixture(params=PRESETS, ids=lambda p: p.__name__)
def sim(request):
    with FakeBackend.installed(request.param()) as fake:
        with l2ctl.Stream() as s:
            yield fake, s
        assert fake.device(0).limit == fake.device(0).initial_limit
        assert not fake.windows


def _no_oversubscription(tuned: tuner.TunedPolicy) -> None:
    for c in tuned.candidates.values():
        for p in c.points:
            assert p.point.hit_ratio * p.point.num_bytes <= p.point.set_aside * (1 + 1e-9), p


# ---- the selection rule, on made-up points ------------------------------------------------------------


def _pr(set_aside_mib: float, speedup: float, half: float = 0.01) -> PointResult:
    point = TunePoint("b", int(set_aside_mib * MiB), 1.0, 0, int(set_aside_mib * MiB))
    return PointResult(point, speedup, (speedup - half, speedup + half), 1.0 / speedup, 1.0, "screen", True)


CAP = 9 * MiB


def test_nothing_beyond_the_noise_wins():
    assert choose([_pr(3, 1.005), _pr(6, 1.008, 0.02), _pr(30, 0.9)], CAP, 0.01) is None
    assert choose([_pr(3, 1.009, 0.001)], CAP, 0.01) is None  # beyond the noise but under min_gain


def test_the_smallest_set_aside_within_noise_of_the_best():
    points = [_pr(3, 1.10), _pr(6, 1.19, 0.02), _pr(9, 1.20), _pr(30, 1.21)]
    assert choose(points, CAP, 0.01).point.set_aside == 6 * MiB


def test_above_the_cap_only_for_two_percent_more():
    # 1.5% better than the best point under the cap: not worth the tax
    assert choose([_pr(9, 1.20, 0.001), _pr(20, 1.218, 0.001)], CAP, 0.01).point.set_aside == 9 * MiB
    # 5% better, beyond the noise: worth it
    assert choose([_pr(9, 1.20, 0.001), _pr(20, 1.26, 0.001)], CAP, 0.01).point.set_aside == 20 * MiB
    # above the cap and alone, but under 2% at its lower bound
    assert choose([_pr(20, 1.025, 0.01)], CAP, 0.01) is None
    assert [p.point.set_aside for p in winners([_pr(20, 1.04, 0.01)], CAP, 0.01)] == [20 * MiB]


# ---- the paired comparison --------------------------------------------------------------------------


def test_bootstrap_interval_covers_equal_arms_and_excludes_a_real_gain():
    rng = np.random.default_rng(3)
    base = 1.0 + 0.01 * rng.standard_normal((6, 5))
    same = 1.0 + 0.01 * rng.standard_normal((6, 5))
    est, (lo, hi) = bootstrap_speedup(base, same)
    assert lo < 1.0 < hi and lo <= est <= hi
    faster = base / 1.1
    est, (lo, hi) = bootstrap_speedup(base, faster)
    assert est == pytest.approx(1.1) and lo > 1.05
    assert bootstrap_speedup(base, faster, seed=1) == bootstrap_speedup(base, faster, seed=1)
    with pytest.raises(ValueError):
        bootstrap_speedup(base, faster[:3])


def test_interleaving_cancels_drift():
    """A workload that slows down steadily: an arm identical to the baseline is not called faster or
    slower, where the two measured one after the other would differ by the drift."""
    with FakeBackend.installed(FakeDevice.h100()) as fake, l2ctl.Stream() as s:
        calls = [0]

        def drifting(stream):
            calls[0] += 1
            fake.launch_modeled_kernel(stream.handle, streamed_bytes=0, compute_ms=1.0 + 0.002 * calls[0])

        base, (same,) = compare(drifting, s, [Arm("same")], rounds=6, repeat=5)
        assert not same.faster and not same.slower, same.ci
        first = bench.time_gpu(drifting, s, warmup=1, repeat=30).median_ms
        second = bench.time_gpu(drifting, s, warmup=1, repeat=30).median_ms
        assert second / first > 1.05  # what sequential medians would have called a 5% difference


def test_compare_verifies_every_arm_and_refuses_bad_arms(sim):
    fake, s = sim
    with ResetDataWorkload(MiB, 64 * MiB) as w:
        base, comps = compare(w, s, [Arm("window", 4 * MiB, lambda: l2ctl.persist(s, w.buf, 1.0, set_aside=None))],
                              rounds=3, repeat=2)
        assert base.verified and comps[0].verified and comps[0].granted >= 4 * MiB
        assert comps[0].record("x").metrics["rounds"] == 3
        with pytest.raises(TypeError):
            compare(w, s, ["not an arm"])  # type: ignore[list-item]
        with pytest.raises(ValueError):
            compare(w, s, [Arm("bad", -1)])

        class Wrong(ResetDataWorkload):
            def verify(self, stream):
                return False

        with Wrong(MiB, 16 * MiB) as bad, pytest.raises(bench.VerificationError):
            compare(bad, s, [], rounds=3, repeat=1)


# ---- the tuner ----------------------------------------------------------------------------------------


def test_single_buffer_form_still_works_and_its_policy_applies_without_warnings(sim):
    fake, s = sim
    with ResetDataWorkload(4 * MiB, 256 * MiB) as w:
        tuned = l2ctl.tune(w, s, w.buf)
        assert tuned.persists and tuned.buffer_name == "buffer" and tuned.buffer is w.buf
        assert 1.1 < tuned.speedup < 1.5 and tuned.ci[0] > 1.0
        assert all(r.verified for r in tuned.table)
        _no_oversubscription(tuned)
        with tuned.persist(s) as p:  # warnings are errors in this suite
            assert p.active and p.set_aside == tuned.policy.set_aside
            w.enqueue(s)
        with l2ctl.persist(s, w.buf, policy=tuned):
            w.enqueue(s)
        assert w.verify(s)
        json.dumps(tuned.report().to_dict(), default=str)
        assert "persist buffer" in str(tuned)


def test_the_report_prints_readably_and_writes_as_every_report(sim, tmp_path):
    fake, s = sim
    with ResetDataWorkload(4 * MiB, 64 * MiB) as w:
        tuned = l2ctl.tune(w, s, {"lut": w.buf, "out": w.out})
    report = tuned.report()
    said = f"simulated ({fake.device(0).name.removesuffix(' (simulated)')}): "  # never passes for a measurement
    assert str(tuned).startswith(said) and str(report).startswith(said) and repr(tuned).startswith("<TunedPolicy: " + said)
    assert isinstance(report, bench.Report) and len(str(report)) < 3000 < len(repr(report))
    assert str(report).splitlines()[2].startswith("lut ") and str(report).splitlines()[3].startswith("out ")
    report.to_json(str(tmp_path / "t.json"))
    report.to_csv(str(tmp_path / "t.csv"))
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["benchmark"] == "tune" and doc["summary"]["buffer"] == tuned.buffer_name and "text" not in doc
    assert len(doc["records"]) == len(tuned.table) and doc["environment"]["simulated"]
    assert (tmp_path / "t.csv").read_text().count("\n") == len(tuned.table) + 1


def test_it_picks_the_buffer_that_pays_in_a_mixed_step(sim):
    fake, s = sim
    with ModeledWorkload.mixed_step() as w:
        tuned = l2ctl.tune(w, s, w.candidates())
        assert tuned.persists and tuned.buffer_name == "acc"  # not the big table the textbook would persist
        assert set(tuned.candidates) == {"x", "bias", "table", "acc"}
        assert all(c.points for c in tuned.candidates.values())  # every candidate reported
        assert tuned.policy.set_aside <= l2ctl.auto_set_aside_cap()
        assert tuned.tax.copy_slowdown < 1.02
        _no_oversubscription(tuned)
        with tuned.persist(s):
            w.enqueue(s)
    # printed: the choice, a row per candidate, the chosen one's points, the grid's best; not the records
    text = str(tuned.report())
    lines = text.splitlines()
    assert lines[0] == str(tuned) and repr(tuned) == f"<TunedPolicy: {tuned}>" and "Record(" not in text
    assert lines[1].split()[:3] == ["candidate", "window", "points"]
    rows = {line.split()[0]: line for line in lines[2:6]}
    assert set(rows) == {"x", "bias", "table", "acc"}
    best = tuned.candidates["acc"].best
    assert f"{best.speedup:.3f}x [{best.ci[0]:.3f}, {best.ci[1]:.3f}]" in rows["acc"]
    assert lines[6] == "points on acc (speedup, 95% CI):" and lines[-1].startswith("grid best: ")
    assert len(lines) == 8 + len(tuned.candidates["acc"].points) and text.count("<- chosen") == 1


def test_where_nothing_pays_the_answer_is_no_persistence(sim):
    fake, s = sim
    with ModeledWorkload.gather() as w:
        tuned = l2ctl.tune(w, s, w.candidates())
        assert not tuned.persists and tuned.buffer_name is None and tuned.speedup == 1.0
        assert "no point was faster" in tuned.reason and "no persistence" in str(tuned)
        text = str(tuned.report())
        assert text.startswith(str(tuned) + "\n") and "<- chosen" not in text
        assert f"points on {tuned.grid_best.point.candidate} " in text  # what "no" was decided from
        assert tuned.grid_best is not None and tuned.grid_best_tax.set_aside == tuned.grid_best.point.set_aside
        before = fake.state()
        with tuned.persist(s) as p:  # issue 34: reading what it applied crashed ("the scope has not been entered")
            assert not p.active and p.window == l2ctl.AccessPolicyWindow()
            assert p.set_aside == fake.device(0).limit and p.device == 0 and p.stream == s.handle
            assert p.reason is not None and tuned.reason in p.reason
        assert fake.state() == before


def test_noise_does_not_buy_a_set_aside():
    """On a noisy GPU (3% per launch) a workload persistence cannot help gets "no persistence"."""
    noisy = FakeDevice.h100()
    noisy.noise = 0.03
    with FakeBackend.installed(noisy, seed=7), l2ctl.Stream() as s, ModeledWorkload.gather() as w:
        tuned = l2ctl.tune(w, s, w.candidates())
        assert not tuned.persists, tuned.reason


def test_the_choice_is_the_smallest_within_noise_and_above_the_cap_only_for_more(sim):
    fake, s = sim
    cap = l2ctl.auto_set_aside_cap()
    with ModeledWorkload.broadcast() as w:
        tuned = l2ctl.tune(w, s, w.candidates())
        assert tuned.persists and tuned.buffer_name == "bias" and tuned.policy.set_aside <= cap
        points = [p for c in tuned.candidates.values() for p in c.points if p.stage != "confirm"]
        assert choose(points, cap, 0.01).point.set_aside == tuned.policy.set_aside
        assert tuned.grid_best.speedup <= tuned.grid_best.ci[1]
    with ResetDataWorkload(16 * MiB, 1 << 30, variant="scalar") as w:  # a kernel where more set-aside pays a lot
        tuned = l2ctl.tune(w, s, {"lut": w.buf})
        assert tuned.persists and tuned.policy.set_aside > cap
        best_below = max(p.speedup for p in tuned.candidates["lut"].points if p.point.set_aside <= cap)
        assert tuned.speedup >= 1.02 * best_below * 0.99
        assert tuned.tax.set_aside == tuned.policy.set_aside and tuned.tax.copy_slowdown > 1.01  # the price, reported
        assert "NCCL" not in str(tuned)  # one process: no word of collectives
        with _in_a_distributed_job(2):  # the DDP rule: above the default, the collectives pay too
            assert "taxes NCCL's collectives" in str(tuned)
        with _in_a_distributed_job(1):
            assert "NCCL" not in str(tuned)


def test_the_screen_and_the_refine_stage_look_past_the_first_set_aside_that_holds_the_window(sim):
    fake, s = sim
    grid = l2ctl.sweep.set_aside_grid(include_zero=False)
    g = grid[0]
    window = 5 * g // 2
    sizes = [p.set_aside for p in screen_points({"b": window}, grid, 3 * g) if p.num_bytes == window]
    assert sizes == [g, 2 * g, 3 * g, 4 * g, 5 * g]  # up to the first that holds 2.5 granules, and two more
    big = int(6.5 * g)  # held first by 7 granules: the coarse screen below it, 8 and 9 above it
    assert [p.set_aside for p in screen_points({"b": big}, grid, 3 * g) if p.num_bytes == big] == \
        [k * g for k in (1, 2, 3, 4, 6, 7, 8, 9)]
    assert [p.set_aside for p in screen_points({"b": 200 * g}, grid, 3 * g) if p.num_bytes == 200 * g] == \
        [k * g for k in (1, 2, 3, 4, 6, 8, 10)]  # nothing holds it: as before
    anchor = TunePoint("b", 5 * g, 1.0, 0, window)
    refined = refine_points(anchor, grid, CandidateResult("b", window))
    assert {p.set_aside for p in refined} == {4 * g, 5 * g, 6 * g}  # the neighbour above the screen too


def test_a_surface_that_is_not_monotonic_above_the_window_gets_its_best_point(sim):
    """The H200's 8 MiB surface replayed: tune must find 4 granules (above the tax-free cap, but 16% faster than
    the best point at or below it), where a screen that stops at the first set-aside holding the window picks 3."""
    fake, s = sim
    cap = l2ctl.auto_set_aside_cap()
    with SetAsideSurface.h200_lut_8mib() as w:
        assert cap == 3 * w.granularity and w.best_granules() == 4
        tuned = l2ctl.tune(w, s, {"lut": w.buf})
        assert tuned.persists and tuned.policy.set_aside == 4 * w.granularity, "\n".join(tuned.candidate_table())
        assert tuned.policy.hit_ratio == 1.0 and tuned.policy.num_bytes is None
        assert tuned.speedup == pytest.approx(w.baseline_ms / w.times_ms[4], rel=0.02)
        # what the tax rule allows of the whole grid is the same point
        best = max(winners(tuned.candidates["lut"].points, cap, 0.01), key=lambda p: p.speedup)
        assert best.point.set_aside == tuned.policy.set_aside


@contextlib.contextmanager
def _in_a_distributed_job(ranks: int) -> Iterator[None]:
    """torch.distributed as tune sees it (sys.modules only; it never imports torch), in a job of ``ranks``."""
    fake = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, get_world_size=lambda: ranks)
    saved = sys.modules.get("torch.distributed")
    sys.modules["torch.distributed"] = fake  # type: ignore[assignment]
    try:
        yield
    finally:
        if saved is None:
            del sys.modules["torch.distributed"]
        else:
            sys.modules["torch.distributed"] = saved


def test_window_range_policies_apply(sim):
    fake, s = sim
    with ModeledWorkload.scatter_add() as w:
        tuned = l2ctl.tune(w, s, w.candidates())
        assert tuned.persists and tuned.buffer_name == "acc"
        with tuned.persist(s) as p:
            expected = tuned.policy.num_bytes or w.buffers["acc"].nbytes
            assert p.window.num_bytes == expected and p.window.base_ptr == w.buffers["acc"].ptr + tuned.policy.offset


def test_candidates_forms_and_refusals(sim):
    fake, s = sim
    a, b = l2ctl.DeviceBuffer(MiB), l2ctl.DeviceBuffer(2 * MiB)
    assert list(tuner.resolve_candidates([a, b])) == ["[0]", "[1]"]
    assert list(tuner.resolve_candidates((a, b))) == ["[0]", "[1]"]
    assert list(tuner.resolve_candidates((a.ptr, a.nbytes))) == ["buffer"]  # a raw (ptr, nbytes) pair is one buffer
    assert list(tuner.resolve_candidates({"lut": a, 7: b})) == ["lut", "7"]
    with pytest.raises(ValueError, match="at least one"):
        tuner.resolve_candidates([])
    with pytest.raises(TypeError, match="candidate 'x'"):
        tuner.resolve_candidates({"x": object()})
    before = fake.state()
    with pytest.raises(ValueError, match="0 ms"):
        l2ctl.tune(lambda stream: None, s, a)
    assert fake.state() == before


def test_policy_with_a_range_and_conflicts():
    with FakeBackend.installed(FakeDevice.h100()), l2ctl.Stream() as s, l2ctl.DeviceBuffer(8 * MiB) as buf:
        policy = l2ctl.Policy(set_aside=4 * MiB, hit_ratio=1.0, offset=MiB, num_bytes=2 * MiB)
        with l2ctl.persist(s, buf, policy=policy) as p:
            assert (p.window.base_ptr, p.window.num_bytes) == (buf.ptr + MiB, 2 * MiB)
        with pytest.raises(ValueError, match="byte range"):
            l2ctl.persist(s, buf, policy=policy, num_bytes=MiB)
        with pytest.raises(ValueError):
            l2ctl.persist(s, buf, policy=l2ctl.Policy(offset=-1))


# ---- the tax ------------------------------------------------------------------------------------------


def test_tax_is_nil_at_the_cap_and_large_at_the_max_and_cached(sim):
    fake, s = sim
    bench.forget_taxes()
    info = l2ctl.device_info()
    at_cap = bench.measure_tax(s, l2ctl.auto_set_aside_cap())
    at_max = bench.measure_tax(s, info.persisting_l2_cache_max_size)
    assert at_cap.copy_slowdown < 1.02 and at_max.copy_slowdown > 1.5
    assert at_max.ci[0] <= at_max.copy_slowdown <= at_max.ci[1]
    launched = len(fake.kernel_log)
    assert bench.measure_tax(s, info.persisting_l2_cache_max_size) is at_max  # cached: no new launch
    assert len(fake.kernel_log) == launched
    assert bench.measure_tax(s, 0).copy_slowdown == 1.0


# ---- the gallery and its benchmark --------------------------------------------------------------------


def test_gallery_imports_no_framework_and_says_why_it_cannot_run(monkeypatch):
    code = ("import sys, l2ctl.workloads, l2ctl.bench, l2ctl.tuner; "
            "assert not {'torch', 'cupy'} & set(sys.modules), sorted({'torch', 'cupy'} & set(sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0
    from l2ctl.workloads import _frameworks

    monkeypatch.setattr(gallery, "torch_missing", lambda: "needs PyTorch (pip install torch)")
    monkeypatch.setattr(gallery, "cupy_missing", lambda: "needs CuPy")
    with FakeBackend.installed(FakeDevice.h100()):
        reasons = {e.name: e.missing() for e in gallery.GALLERY}
        assert reasons["spmv"] == "needs CuPy" and reasons["broadcast"].startswith("needs PyTorch")
        report = benchmark_gallery.bench_workloads(names=["broadcast", "spmv"], progress=False)
        assert report.summary["rows"] == [] and set(report.summary["skipped"]) == {"broadcast", "spmv"}
    with pytest.raises(ValueError, match="no gallery workload"):
        gallery.entry("nope")
    assert callable(_frameworks.on_torch_stream)


def test_gallery_needs_memory_it_says_so(monkeypatch):
    small = FakeDevice.h100()
    small.total_global_memory = 1 << 30
    monkeypatch.setattr(gallery, "torch_missing", lambda: None)
    with FakeBackend.installed(small):
        assert "GiB of device memory" in gallery.entry("scatter-add").missing()


def test_gallery_benchmark_on_modeled_workloads(sim):
    fake, s = sim
    factories = {"broadcast": ModeledWorkload.broadcast, "gather": ModeledWorkload.gather,
                 "step": ModeledWorkload.mixed_step}
    report = benchmark_gallery.bench_workloads(s, factories=factories, runs=2, progress=False)
    rows = {r["workload"]: r for r in report.summary["rows"]}
    assert set(rows) == set(factories) and report.summary["never_slower"]
    assert rows["broadcast"]["tuned_buffer"] == "bias" and rows["broadcast"]["tuned_min_speedup"] > 1.05
    assert rows["broadcast"]["recipe_speedup"] < 1.0 and rows["broadcast"]["recipe_copy_slowdown"] > 1.5
    assert rows["gather"]["tuned_buffer"] is None and 0.99 < rows["gather"]["tuned_min_speedup"] < 1.01
    assert rows["step"]["tuned_buffer"] == "acc" and rows["step"]["hot"] == "table"
    assert all(len(r["tuned_speedups"]) == 2 for r in rows.values())
    assert all(r.verified for r in report.records)
    json.dumps(report.to_dict(), default=str)
    with pytest.raises(ValueError, match="no workload"):
        benchmark_gallery.bench_workloads(s, ["nope"], factories=factories, progress=False)


def test_modeled_workloads_need_the_simulator_and_known_buffers():
    with FakeBackend.installed(FakeDevice.h100()):
        with pytest.raises(ValueError, match="no buffer named"):
            ModeledWorkload("x", {"a": MiB}, [ModeledKernel("k", MiB, "b", MiB)])
        with ModeledWorkload.broadcast() as w:
            assert not w.verify(None)  # nothing launched yet


def test_tax_gain_raises_the_bar_above_the_cap():
    points = [_pr(9, 1.20, 0.001), _pr(20, 1.26, 0.001)]
    assert choose(points, CAP, 0.01, tax_gain=0.10).point.set_aside == 9 * MiB
    assert choose([_pr(20, 1.06, 0.001)], CAP, 0.01, tax_gain=0.10) is None


def _tuned_with_taxes(chosen: float, grid_best: float) -> tuner.TunedPolicy:
    """A TunedPolicy that persists, whose chosen set-aside and grid best slow a copy by the factors given."""
    point = TunePoint("lut", 4 * MiB, 1.0, 0, 4 * MiB)
    result = PointResult(point, 2.0, (1.9, 2.1), 1.0, 2.0, "confirm", True)

    def tax(slowdown: float) -> bench.Tax:
        return bench.Tax(4 * MiB, slowdown, (slowdown, slowdown), 256 * MiB, 0.2, 0.2 * slowdown)

    return tuner.TunedPolicy(l2ctl.Policy(set_aside=4 * MiB, hit_ratio=1.0), "lut", object(), 2.0, 1.0, (1.9, 2.1),
                             0.95, {"lut": tuner.CandidateResult("lut", 4 * MiB, [result])}, result, tax(chosen),
                             tax(grid_best), "confirmed", [], 0.5, 9 * MiB, {})


def test_a_copy_that_keeps_its_speed_runs_at_full_speed_in_words():
    tuned = _tuned_with_taxes(1.004, 2.37)
    assert "a plain copy elsewhere runs at full speed meanwhile; 1 point in" in str(tuned)
    assert tuned.candidate_table()[-1].endswith("a plain copy runs 2.37x slower (under the chosen one: at full speed)")
    assert "1.00x" not in str(tuned) + "\n".join(tuned.candidate_table())
    assert "runs 1.50x slower meanwhile" in str(_tuned_with_taxes(1.5, 1.5))
    assert [bench.copy_pace(x) for x in (0.97, 1.0, 1.004, 1.006, 2.37)] == [
        "at full speed", "at full speed", "at full speed", "1.01x slower", "2.37x slower"]
