"""Issue 43, the first hour, on the API: what a set-aside is (one set of values, one meaning, everywhere), the
tax warning's numbers, and what an MPS client gets by default (on the simulated devices)."""

from __future__ import annotations

import warnings

import pytest

import l2ctl
from l2ctl import _plan
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20


@pytest.fixture
def h100():
    with FakeBackend.installed(FakeDevice.h100()) as fake:
        with l2ctl.Stream() as s:
            yield fake, s
        assert fake.device(0).limit == fake.device(0).initial_limit and not fake.windows


# ---- item 2: set_aside's values ------------------------------------------------------------------------------


def test_a_fraction_of_the_max_is_taken_by_persist_and_policy_as_by_set_aside(h100):
    fake, s = h100
    maximum = fake.device(0).persisting_l2_cache_max_size
    buf = l2ctl.DeviceBuffer(4 * MiB)
    with l2ctl.set_aside(0.5) as granted:
        half = int(granted)
    assert half >= maximum // 2
    with l2ctl.persist(s, buf, 1.0, set_aside=0.5) as p:  # was TypeError
        assert p.set_aside == half
    with l2ctl.persist(s, buf, policy=l2ctl.Policy(set_aside=0.5, hit_ratio=1.0)) as p:
        assert p.set_aside == half
    with l2ctl.persist(s, buf, 1.0, set_aside="max") as p:
        assert p.set_aside == maximum


@pytest.mark.parametrize("value,says", [(1.0, "ambiguous: write 'max'"), (0.0, "write 0"), (2.0, "write an int"),
                                        (float("nan"), "strictly between 0 and 1"), ("MAX", "not a set-aside"),
                                        ("half", "not a set-aside")])
def test_the_ambiguous_forms_are_refused_everywhere_saying_what_to_write(h100, value, says):
    fake, s = h100
    buf = l2ctl.DeviceBuffer(4 * MiB)
    before = fake.state()
    for call in (lambda: l2ctl.set_aside(value), lambda: l2ctl.persist(s, buf, 1.0, set_aside=value).start(),
                 lambda: l2ctl.Policy(set_aside=value), lambda: _plan.check_set_aside(value, scope=True)):
        with pytest.raises(ValueError, match=says):
            call()
    assert fake.state() == before


def test_one_is_a_byte_and_auto_and_none_belong_to_scopes(h100):
    fake, s = h100
    with l2ctl.set_aside(1) as granted:
        assert granted.requested == 1 and int(granted) == fake.device(0).granularity  # one byte, rounded up
    for value in ("auto", None):
        with pytest.raises((ValueError, TypeError), match="persist scope's request"):
            l2ctl.set_aside(value)  # type: ignore[arg-type]
        assert l2ctl.Policy(set_aside=value).set_aside == value
    with pytest.raises(TypeError, match="not bool"):
        l2ctl.set_aside(True)


# ---- item 3: the tax warning quotes what is asked and what is granted ----------------------------------------


def test_the_tax_warning_says_the_bytes_asked_and_the_bytes_granted(h100):
    fake, s = h100
    buf = l2ctl.DeviceBuffer(40 * MiB)
    cap = l2ctl.auto_set_aside_cap()
    with pytest.warns(l2ctl.SetAsideTaxWarning) as caught:
        with l2ctl.persist(s, buf) as p:
            assert p.window.num_bytes == cap and p.set_aside == cap
    said = str(caught[0].message)
    assert f"ask for {40 * MiB} bytes" in said, said  # was the cut window's 9830400
    assert f"persisting limit at {cap} bytes" in said and f"first {cap} bytes" in said


# ---- item 6: MPS ----------------------------------------------------------------------------------------------


def test_the_default_scope_on_an_mps_client_takes_the_limit_mps_gives():
    with FakeBackend.installed(FakeDevice.mps_client()) as fake:
        s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
        limit = fake.device(0).limit
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(2):  # the probe refused once is not made again
                with l2ctl.persist(s, lut) as p:  # was NotSupportedError [requested 1 bytes]
                    assert p.active and p.set_aside == limit and p.window.num_bytes == MiB
                    assert p.window.hit_ratio == 1.0
        assert fake.device(0).limit == limit and not fake.windows
        with pytest.raises(l2ctl.NotSupportedError, match="CUDA_DEVICE_DEFAULT_PERSISTING_L2_CACHE_PERCENTAGE_LIMIT"):
            with l2ctl.persist(s, lut, set_aside="max"):
                pass


def test_a_window_larger_than_the_mps_limit_is_fitted_to_it():
    with FakeBackend.installed(FakeDevice.mps_client(percentage=10)) as fake:
        limit = fake.device(0).limit
        assert limit == fake.device(0).granularity  # 10% of the max: one granule
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(8 * MiB)
        with l2ctl.persist(s, buf) as p:
            assert p.set_aside == limit and p.window.num_bytes == limit and p.window.hit_ratio == 1.0
