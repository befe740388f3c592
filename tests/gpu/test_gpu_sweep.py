"""On the GPU: sweeps and the tuner measure verified points and restore the device."""

from __future__ import annotations

import pytest

import l2ctl
from l2ctl import sweep

pytestmark = pytest.mark.gpu
MiB = 1 << 20


@pytest.fixture
def setup(gpu_state):
    with l2ctl.Stream() as s, sweep.ResetDataWorkload(2 * MiB, 64 * MiB) as w:
        gpu_state.watch(s)
        yield s, w


def test_hit_ratio_sweep_uses_an_exact_grid(setup):
    s, w = setup
    r = sweep.sweep_hit_ratio(w, s, w.buf, repeat=3, warmup=1, progress=False)
    assert [rec.config["hit_ratio"] for rec in r.records] == pytest.approx([i / 10 for i in range(11)], abs=1e-7)
    assert r.records[-1].config["hit_ratio"] == 1.0
    assert all(rec.verified for rec in r.records) and r.baseline.verified
    assert r.report().summary["baseline_ms"] > 0


def test_set_aside_sweep_and_surface(setup):
    s, w = setup
    grid = sweep.set_aside_grid()
    a = sweep.sweep_set_aside(w, s, w.buf, set_asides=grid[1:3], repeat=3, warmup=1, progress=False)
    assert [rec.config["set_aside_granted"] for rec in a.records] == grid[1:3]
    b = sweep.sweep_surface(w, s, w.buf, set_asides=grid[1:3], hit_ratios=[0.5, 1.0], repeat=3, warmup=1, progress=False)
    assert len(b.records) == 4


def test_tax_and_tuner(setup):
    s, w = setup
    grid = sweep.set_aside_grid()
    tax = sweep.sweep_tax(s, set_asides=[0, grid[-1]], nbytes=256 * MiB, repeat=3, warmup=1, progress=False)
    assert len(tax.records) == 2 and tax.summary["copy_slowdown_at_max"] > 0
    tuned = l2ctl.tune(w, s, w.buf, repeat=3, warmup=1)
    assert tuned.table and tuned.seconds < 60
    assert tuned.tax.copy_slowdown > 0 and tuned.grid_best_tax.copy_slowdown > 0
    assert tuned.best_ms <= tuned.baseline_ms
    assert "simulated" not in str(tuned) + str(tuned.report())  # measured: no simulator's mark
    with l2ctl.persist(s, w.buf, policy=tuned) as p:  # warnings are errors here: the policy fits
        if tuned.persists:
            assert p.set_aside == tuned.policy.set_aside and p.window.hit_ratio == pytest.approx(tuned.policy.hit_ratio)
        else:
            assert not p.active


def test_user_callable_workload(setup):
    s, w = setup
    calls = []

    def work(stream):
        calls.append(stream)
        l2ctl.kernels.reset_data(w.out, w.buf, stream)

    rec = sweep.measure_point(work, s, w.buf, sweep.set_aside_grid()[1], 1.0, repeat=2, warmup=1)
    assert len(calls) == 3 and not rec.verified  # a bare callable cannot be verified, and says so
