# mypy: disallow-any-expr
"""A user's script, checked by test_typing.py under pyright (strict) and mypy (--strict, and no Any in this file), and
run on the simulator: what the public API takes and returns is typed, never Any, so the checkers follow a user's
code through it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from typing_extensions import assert_type
else:  # at run time (on the simulator) typing_extensions may be absent
    def assert_type(value, _):
        return value

import l2ctl
from l2ctl import AccessPolicyWindow, DeviceBuffer, Stream


def step(stream: Stream, lut: DeviceBuffer, out: DeviceBuffer) -> None:
    l2ctl.kernels.reset_data(out, lut, stream, variant="hinted")


def main() -> None:
    with Stream() as s, DeviceBuffer(1 << 20) as lut, DeviceBuffer(64 << 20) as out:
        with l2ctl.persist(s, lut, 0.75) as p:
            assert_type(p.window, AccessPolicyWindow)
            assert_type(p.set_aside, int)
            window: AccessPolicyWindow = p.window
            step(s, lut, out)
        with l2ctl.set_aside(4 << 20) as limit:
            assert_type(limit.granted, int)
        with l2ctl.graph.capture(s) as g:
            step(s, lut, out)
        assert_type(g, l2ctl.graph.Graph)
        with l2ctl.persist(g, lut, hit_ratio=1.0), l2ctl.persist(g.select(lambda node: "reset" in node.function), lut):
            g.launch(s)
        nodes = l2ctl.graph.inspect(g)
        assert_type(nodes[0].window, AccessPolicyWindow)
        tuned = l2ctl.tune(lambda stream: step(s, lut, out), s, {"lut": lut}, rounds=3, repeat=1)
        assert_type(tuned, l2ctl.TunedPolicy)
        assert_type(tuned.set_aside, int)
        assert_type(tuned.hit_ratio, float)
        with tuned.persist(s) as q:
            assert_type(q, l2ctl.Persist)
            assert_type(q.reason, Optional[str])
            step(s, lut, out)
        served = tuned.persist(s, strict=False).start()  # an app's lifetime
        assert_type(served, l2ctl.Persist)
        step(s, lut, out)
        served.stop()
        l2ctl.persist(s, lut, 1.0, set_aside=8 << 20, clamp=True, strict=False).start().close()
        other = Stream()
        done = s.record()
        assert_type(done, l2ctl.Event)
        other.wait(done)
        other.wait(s)
        end = l2ctl.Event()
        end.record(other)
        end.wait(s)
        assert_type(done.elapsed_time(end), float)
        print(window, limit, nodes, tuned.set_aside, tuned.hit_ratio, q.window)


if __name__ == "__main__":
    main()
