"""Hostile input to every public call, on the simulated H100: each is refused with the documented error
type and a message, before any state-changing CUDA call, and the device is left exactly as it was.
The same arguments on a machine with no GPU give the argument error, not NoDeviceError."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import l2ctl
from l2ctl import _backend, bench, kernels
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20


def test_every_public_call_refuses_hostile_input_and_changes_nothing(hostile):
    with FakeBackend.installed(FakeDevice.h100()) as fake:
        objects = hostile.Objects()
        with l2ctl.persist(objects.s, objects.buf, 0.3):
            pass  # the device has been used once
        table = hostile.cases(objects)
        for name, call, error in table:
            before, n = fake.state(), len(fake.calls)
            with pytest.raises(error) as info:
                call()
            assert str(info.value), name
            assert fake.state() == before, name
            assert not hostile.STATE_CHANGES & set(fake.calls[n:]), (name, fake.calls[n:])
        assert len(table) >= 120


def test_without_a_gpu_argument_errors_come_first():
    """The argument-only cases (no device objects needed) raise the same errors with no GPU at all."""
    with _backend.use(FakeBackend.without_devices()):
        raw = (0x7000_0000, 64)
        argument_cases: list[tuple[str, Callable[[], Any], type[BaseException]]] = [
            ("set_aside(-1)", lambda: l2ctl.set_aside(-1), ValueError),
            ("set_aside('lots')", lambda: l2ctl.set_aside("lots"), ValueError),
            ("persist(hit 2)", lambda: l2ctl.persist(0, raw, 2.0), ValueError),
            ("reset_data(variant)", lambda: kernels.reset_data(raw, raw, 0, variant="x"), ValueError),
            ("stride_read(block 0)", lambda: kernels.stride_read(raw, 4, raw, 0, block_threads=0), ValueError),
            ("write_index(odd)", lambda: kernels.write_index((0x7000_0000, 6), 0), ValueError),
            ("bench_reset_data(repeat 0)", lambda: bench.bench_reset_data(repeat=0), ValueError),
            ("bench_stride(6)", lambda: bench.bench_stride([6]), ValueError),
            ("tune(repeat 0)", lambda: l2ctl.tune(lambda st: None, 0, raw, repeat=0), ValueError),
            ("DeviceBuffer(-1)", lambda: l2ctl.DeviceBuffer(-1), ValueError),
            ("time_gpu(repeat 0)", lambda: bench.time_gpu(lambda st: None, 0, repeat=0), ValueError),
        ]
        for name, call, error in argument_cases:
            with pytest.raises(error):
                call()
        with pytest.raises(l2ctl.NoDeviceError, match="no CUDA device"):
            l2ctl.set_aside(0)
