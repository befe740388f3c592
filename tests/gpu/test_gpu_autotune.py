"""``l2ctl.autotune`` on the GPU: the step runs exactly as often as the app calls it, a decision is reached within
MAX_CALLS with the tuner's rules, the outputs stay right under every arm, and stop() leaves the device as found.
(Whether it gains is a benchmark's question: scripts/bench_autotune.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import l2ctl
from l2ctl import autotuner

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("candidates", ["listed", "discover"])
def test_autotune_decides_on_the_apps_calls_and_restores_the_device(candidates):
    info = l2ctl.device_info()
    lut = l2ctl.DeviceBuffer.from_numpy(np.arange(info.persisting_l2_cache_max_size // 16, dtype=np.int32))
    out = l2ctl.DeviceBuffer(4 * info.l2_cache_size // 4, dtype=np.int32)
    calls = []
    with l2ctl.Stream() as s:
        limit, window = l2ctl.get_set_aside(), l2ctl.get_window(s)

        def step() -> None:
            calls.append(1)
            l2ctl.kernels.reset_data(out, lut, s)

        tuned = l2ctl.autotune(step, {"lut": lut} if candidates == "listed" else "discover", stream=s)
        for _ in range(autotuner.MAX_CALLS + 20):
            tuned()
        assert l2ctl.kernels.verify_reset_data(out, lut, s) == 0
        (decision,) = tuned.report()
        assert len(calls) == autotuner.MAX_CALLS + 20 and decision.calls == len(calls)
        assert decision.phase == "decided" and decision.decided_at <= autotuner.MAX_CALLS, decision
        assert decision.reason, decision
        if decision.policy.enabled:
            assert l2ctl.get_set_aside() >= decision.policy.set_aside
        tuned.stop()
        s.synchronize()
        assert l2ctl.get_set_aside() == limit and l2ctl.get_window(s) == window
