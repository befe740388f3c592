"""Planning arithmetic, property-tested: no GPU needed."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from l2ctl import _plan as plan

#: The planner's own rules, where _plan.py names none of them (what only these tests ask of it).
native = plan._native


@given(st.floats(min_value=0.0, max_value=1.0))
def test_valid_hit_ratios_stay_in_range(x):
    y = plan.normalize_hit_ratio(x)
    assert 0.0 <= y <= 1.0 and float(np.float32(y)) <= 1.0
    assert y == pytest.approx(x, abs=1e-7)


@given(st.floats(min_value=1.0, max_value=1.0 + plan.HIT_RATIO_TOLERANCE))
def test_rounding_noise_above_one_is_one(x):
    assert plan.normalize_hit_ratio(x) == 1.0


def test_float32_accumulation_is_accepted():
    acc = np.float32(0)
    for _ in range(10):
        acc += np.float32(0.1)
    assert acc > 1.0
    assert plan.normalize_hit_ratio(acc) == 1.0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -0.1, -1e-12, 1.5, 1 + 2e-6])
def test_bad_hit_ratios_raise_value_error(bad):
    with pytest.raises(ValueError):
        plan.normalize_hit_ratio(bad)


@pytest.mark.parametrize("bad", [None, "0.5", True, np.bool_(False), 1j, [0.5]])
def test_non_numbers_raise_type_error(bad):
    with pytest.raises(TypeError):
        plan.normalize_hit_ratio(bad)


@given(st.integers(min_value=2, max_value=200))
def test_hit_ratio_grid_is_exact(points):
    grid = plan.hit_ratio_grid(points)
    assert len(grid) == points and grid[0] == 0.0 and grid[-1] == 1.0
    assert all(a < b for a, b in zip(grid, grid[1:]))
    assert all(g == plan.normalize_hit_ratio(i / (points - 1)) for i, g in enumerate(grid))


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=1, max_value=1 << 30))
def test_round_up_and_down(n, g):
    up, down = plan.round_up(n, g), n // g * g
    assert up % g == 0 and down % g == 0
    assert down <= n <= up and up - down in (0, g)


@given(st.floats(min_value=0, max_value=1e9), st.integers(min_value=0, max_value=1 << 26),
       st.integers(min_value=1, max_value=1 << 24), st.integers(min_value=1, max_value=1 << 26))
def test_auto_set_aside_properties(demand, current, granularity, maximum):
    current = min(current, maximum)
    target = native.plan_auto_set_aside(demand, current, granularity, maximum)
    assert target >= current  # never shrinks
    assert target <= max(current, maximum)  # never past the max
    if demand > 0 and target > current:
        assert target == maximum or target % granularity == 0
        assert target >= min(maximum, demand)


def test_auto_set_aside_h100_numbers():
    g, mx = 3_276_800, 32_768_000
    assert native.plan_auto_set_aside(4 << 20, 0, g, mx) == 2 * g
    assert native.plan_auto_set_aside(4 << 20, 9_830_400, g, mx) == 9_830_400
    assert native.plan_auto_set_aside(64 << 20, 0, g, mx) == mx


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=1, max_value=1 << 40))
def test_default_hit_ratio(granted, window):
    hr = native.plan_default_hit_ratio(granted, window)
    assert 0 <= hr <= 1
    assert hr == pytest.approx(min(1.0, granted / window), abs=1e-7)


@given(st.integers(min_value=0, max_value=1 << 40), st.integers(min_value=1, max_value=1 << 40))
def test_fit_window(room, window):
    """hit_ratio=None: a window that fits is whole at 1.0; a larger one its first room bytes (256-byte units) at 1.0;
    with less than 256 bytes of room, the whole window at room / window."""
    nbytes, hr = native.plan_fit_window(room, window)
    if room >= window:
        assert (nbytes, hr) == (window, 1.0)
    elif room >= 256:
        assert (nbytes, hr) == (room // 256 * 256, 1.0) and nbytes <= room < nbytes + 256
    else:
        assert (nbytes, hr) == (window, native.plan_default_hit_ratio(room, window))


@given(st.integers(min_value=1, max_value=1 << 34), st.data())
def test_clip_window(buffer, data):
    offset = data.draw(st.integers(min_value=0, max_value=buffer - 1))
    num = data.draw(st.one_of(st.none(), st.integers(min_value=1, max_value=buffer - offset)))
    max_window = data.draw(st.integers(min_value=1, max_value=1 << 34))
    n, clipped = plan.clip_window(offset, num, buffer, max_window)
    wanted = buffer - offset if num is None else num
    assert n == min(wanted, max_window) and clipped == (wanted > max_window)


def test_clip_window_rejects_out_of_range():
    with pytest.raises(ValueError, match="past the end"):
        plan.clip_window(10, 100, 100, 1 << 30)
    with pytest.raises(ValueError, match="not inside"):
        plan.clip_window(100, None, 100, 1 << 30)
    with pytest.raises(ValueError):
        plan.clip_window(-1, None, 100, 1 << 30)
    with pytest.raises(ValueError):
        plan.clip_window(0, 0, 100, 1 << 30)


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=1), st.integers(min_value=1, max_value=1 << 30)),
                min_size=1, max_size=8), st.integers(min_value=0, max_value=1 << 31))
def test_shared_hit_ratios_fit(requests, set_aside):
    ratios = plan.shared_hit_ratios(requests, set_aside)
    demand = sum(hr * nb for hr, nb in requests)
    new_demand = sum(r * nb for r, (_, nb) in zip(ratios, requests))
    assert all(0 <= r <= hr + 1e-7 for r, (hr, _) in zip(ratios, requests))
    if demand <= set_aside:
        assert ratios == pytest.approx([hr for hr, _ in requests], abs=1e-7)
    else:
        assert new_demand <= set_aside * (1 + 1e-6) + 1


def test_shared_hit_ratios_seed_example():
    assert plan.shared_hit_ratios([(1.0, 16384), (1.0, 16384)], 16384) == [0.5, 0.5]


@pytest.mark.parametrize("value", [10**400, -10**400, Fraction(10**400, 3)], ids=["1e400", "-1e400", "Fraction"])
def test_a_ratio_beyond_a_float_is_a_value_error_as_every_bad_ratio(value):
    for check in (plan.normalize_hit_ratio, lambda v: plan.shared_hit_ratios([(v, 64)], 1 << 30)):
        with pytest.raises(ValueError, match="beyond a float's range"):
            check(value)
    with pytest.raises(ValueError, match="beyond a float's range"):  # a fraction of the max, as a ratio
        plan.parse_set_aside_request(Fraction(value), 1000)


@pytest.mark.parametrize("value,expected", [("max", 1000), (0.5, 500), (0.999, 999), (1, 1), (0, 0), (999, 999)])
def test_parse_set_aside_request(value, expected):
    assert plan.parse_set_aside_request(value, 1000) == expected


@pytest.mark.parametrize("value,error", [(1001, ValueError), (-1, ValueError), (1.5, ValueError), (math.nan, ValueError),
                                         ("half", ValueError), (True, TypeError), (None, TypeError), ("MAX", ValueError),
                                         (1.0, ValueError), (0.0, ValueError), (-0.0, ValueError), ("auto", ValueError)])
def test_parse_set_aside_request_errors(value, error):
    with pytest.raises(error):
        plan.parse_set_aside_request(value, 1000)
