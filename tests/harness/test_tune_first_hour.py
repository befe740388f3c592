"""Issue 43, the first hour, on the tuner: a misspelt "discover", a step with no GPU work, and the report's words
and columns (on the simulator)."""

from __future__ import annotations

import dataclasses

import pytest

import l2ctl
from l2ctl import _plan
from l2ctl.workloads import ResetDataWorkload

MiB = 1 << 20


def test_a_misspelt_discover_is_refused_naming_it(fake):
    with l2ctl.Stream() as s, ResetDataWorkload(4 * MiB, 64 * MiB) as w:
        with pytest.raises(ValueError, match="did you mean 'discover'"):
            l2ctl.tune(w, s, "discovr")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="did you mean 'discover'"):
            l2ctl.autotune(lambda: None, "Discover")  # type: ignore[arg-type]


def test_a_step_with_no_gpu_work_says_so_when_discovering_too(fake):
    with l2ctl.Stream() as s, pytest.raises(ValueError, match="queued no GPU work"):
        l2ctl.tune(lambda stream: None, s, "discover")


def test_the_report_counts_in_words_and_fits_long_names(fake):
    long = "model.encoder.layers.11.attention.output.dense.weight"
    with l2ctl.Stream() as s, ResetDataWorkload(4 * MiB, 64 * MiB) as w:
        tuned = l2ctl.tune(w, s, {long: w.buf, "out": w.out})
    table = tuned.candidate_table()
    header = next(line for line in table if line.startswith("candidate"))
    rows = [line for line in table if line.startswith((long, "out "))]
    assert len(rows) == 2
    column = header.index("window") + len("window")  # the window column's right edge
    for row in rows:
        assert row[column - 1] != " " and row[column] == " ", (header, row)
    one = {name: dataclasses.replace(c, points=c.points[:1]) for name, c in list(tuned.candidates.items())[:1]}
    assert " 1 point " in str(dataclasses.replace(tuned, candidates=one)), str(dataclasses.replace(tuned, candidates=one))


def test_a_negative_zero_hit_ratio_is_zero():
    assert str(l2ctl.Policy(hit_ratio=-0.0).hit_ratio) == "0.0"
    assert str(_plan.normalize_hit_ratio(-0.0)) == "0.0"
