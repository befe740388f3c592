"""A stateful property test of the registry on the simulated H100: random interleavings of persist and
set_aside scopes on several streams and a graph, nested and non-LIFO exits, share True/False, bodies that
raise, warnings raised as errors during entry, raw windows, stream closes, line resets. After every step
the device (limit, stream windows, node windows) equals what a plain model of the rules says.

The model is written directly from the rules in docs/DESIGN.md, without the registry's machinery (no
slots, generations or diffing): the latest live scope on a stream or node owns its window; the limit is
the fold of the live scopes' requests in entry order; shared windows in force scale to fit.

L2CTL_MODEL_EXAMPLES=n runs more examples (CI keeps the default bounded).
"""

from __future__ import annotations

import math
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import l2ctl
from l2ctl import _registry, graph
from l2ctl.testing import FakeBackend, FakeDevice

MiB = 1 << 20
MAX = 32_768_000
G = MAX // 10
CAP = 3 * G  # where "auto" stops: the driver's default limit, 30% of the max
MAX_WINDOW = 128 * MiB
EXAMPLES = int(os.environ.get("L2CTL_MODEL_EXAMPLES", "60"))
BUFFER_SIZES = [MiB, 4 * MiB, 12 * MiB, 40 * MiB, 160 * MiB]  # the last one is clipped to the max window


def f32(x: float) -> float:
    return float(np.float32(x))


def round_up(n: float, step: int) -> int:
    return -(-math.ceil(n) // step) * step


@dataclass
class ModelScope:
    id: int
    targets: tuple[str, ...]  # "s<i>" streams, "n<j>" graph nodes; () for a limit-only scope
    base: int = 0
    nbytes: int = 0
    ratio: float = 0.0  # requested (resolved at entry when it was None)
    limit: Union[int, str, None] = None
    share: bool = False
    reset: bool = False
    handle: Any = None  # the l2ctl object to exit
    effective: float = 0.0

    @property
    def has_window(self) -> bool:
        return bool(self.targets)

    def demand(self, ratio: Optional[float] = None) -> float:
        return (self.ratio if ratio is None else ratio) * self.nbytes


@dataclass
class Model:
    initial_limit: int
    base_limit: Optional[int] = None
    scopes: list[ModelScope] = field(default_factory=list)
    base_windows: dict[str, tuple[int, int, float]] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)

    def top(self, scopes: list[ModelScope]) -> dict[str, ModelScope]:
        owner: dict[str, ModelScope] = {}
        for s in scopes:
            for t in s.targets:
                if t not in self.closed:
                    owner[t] = s
        return owner

    def in_force(self, scopes: list[ModelScope]) -> list[ModelScope]:
        ids = {s.id for s in self.top(scopes).values()}
        return [s for s in scopes if s.id in ids]

    def limit(self, scopes: Optional[list[ModelScope]] = None) -> int:
        return self.fold(self.scopes if scopes is None else scopes)[0]

    def fold(self, scopes: list[ModelScope]) -> tuple[int, bool]:
        """(limit, whether an "auto" request was held at the cap)."""
        limit = self.base_limit if self.base_limit is not None else self.initial_limit
        capped = False
        for k, s in enumerate(scopes):
            if isinstance(s.limit, int):
                limit = s.limit
            elif s.limit == "auto":
                demand = sum(x.demand() for x in self.in_force(scopes[: k + 1]))
                if demand > 0:
                    need = min(MAX, round_up(demand, G))
                    limit = max(limit, min(CAP, need))
                    capped = capped or limit < need
        return limit, capped

    def effective(self) -> dict[int, float]:
        in_force = self.in_force(self.scopes)
        ratios = {s.id: s.ratio for s in in_force}
        shared = [s for s in in_force if s.share]
        if shared:
            room = max(0, int(self.limit() - sum(s.demand() for s in in_force if not s.share)))
            total = sum(s.demand() for s in shared)
            if total > room and total > 0:
                for s in shared:
                    ratios[s.id] = min(1.0, s.ratio * room / total)
        return ratios

    def windows(self) -> dict[str, tuple[int, int, float]]:
        ratios = self.effective()
        out = dict(self.base_windows)
        for t, s in self.top(self.scopes).items():
            out[t] = (s.base, s.nbytes, ratios[s.id])
        return {t: w for t, w in out.items() if t not in self.closed}


class RegistryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.fake = FakeBackend(FakeDevice.h100())
        self._use = l2ctl._backend.use(self.fake)
        self._use.__enter__()
        self.streams: list[Optional[l2ctl.Stream]] = []
        self.buffers = {size: l2ctl.DeviceBuffer(size) for size in BUFFER_SIZES}
        self.model = Model(self.fake.device(0).initial_limit)
        self.ids = 0
        s = l2ctl.Stream()
        with graph.capture(s) as g:
            self.fake.launch_fake_kernel(s.handle)
            self.fake.launch_fake_kernel(s.handle)
        s.close()
        self.graph = g
        self.nodes = [k.node for k in g.kernel_nodes()]

    def teardown(self) -> None:
        for scope in reversed(list(self.model.scopes)):
            scope.handle.__exit__(None, None, None)
        self._use.__exit__(None, None, None)

    # ---- what the device holds -----------------------------------------------------------------

    def device_windows(self) -> dict[str, tuple[int, int, float]]:
        out = {}
        for i, s in enumerate(self.streams):
            if s is not None and s.handle in self.fake.windows:
                b, n, r, _, _ = self.fake.windows[s.handle]
                out[f"s{i}"] = (b, n, r)
        for j, node in enumerate(self.nodes):
            b, n, r, _, _ = self.fake.node_windows[node]
            if n:
                out[f"n{j}"] = (b, n, r)
        return out

    @invariant()
    def device_matches_the_model(self) -> None:
        assert self.fake.device(0).limit == self.model.limit()
        expected = {t: (b, n, f32(r)) for t, (b, n, r) in self.model.windows().items() if n}
        got = self.device_windows()
        assert got.keys() == expected.keys(), (got, expected)
        for t in got:
            assert got[t][:2] == expected[t][:2] and got[t][2] == pytest.approx(expected[t][2], abs=2e-7), (t, got, expected)

    def slot_of(self, target: str) -> Any:
        index = int(target[1:])
        if target[0] == "s":
            stream = self.streams[index]
            assert stream is not None
            return _registry.stream_slot(stream.handle)
        return _registry.node_slots([self.nodes[index]])[0]

    @invariant()
    def the_registry_holds_what_the_model_says(self) -> None:
        """Not only what was applied: the registry's whole record of the device (its scopes and sharing
        count, the base window of every covered slot, the demand in force, nothing left half done)."""
        planner = _registry._planners.get(self.fake)  # the planner's record of the device, as plain values
        state = None if planner is None else planner.device_state(0)
        model = self.model
        if state is None:
            assert not model.scopes
            return
        assert not state.dirty and state.batch is None
        assert len(state.scopes) == len(model.scopes) and not any(s.ending for s in state.scopes.values())
        assert state.shared == sum(s.share for s in model.scopes)
        covered = {t for s in model.scopes for t in s.targets if t not in model.closed}
        slots = {self.slot_of(t): t for t in covered}
        assert set(state.base_windows) == set(slots), (state.base_windows, slots)
        for slot, target in slots.items():
            base, nbytes, ratio = model.base_windows.get(target, (0, 0, 0.0))
            held = state.base_windows[slot]
            assert (held[0], held[1]) == (base, nbytes) and held[2] == pytest.approx(f32(ratio), abs=2e-7)
        ratios = model.effective()
        demand = sum(s.demand(ratios[s.id]) for s in model.in_force(model.scopes))
        assert state.in_force_demand == pytest.approx(demand, rel=1e-6, abs=1.0)
        if not model.scopes:
            assert not state.applied_windows and state.base_limit is None and state.applied_limit is None

    # ---- rules ------------------------------------------------------------------------------------

    @precondition(lambda self: sum(s is not None for s in self.streams) < 3)
    @rule()
    def open_stream(self) -> None:
        self.streams.append(l2ctl.Stream())

    @precondition(lambda self: any(s is not None for s in self.streams))
    @rule(data=st.data())
    def close_stream(self, data: st.DataObject) -> None:
        open_ = [i for i, s in enumerate(self.streams) if s is not None]
        i = data.draw(st.sampled_from(open_))
        stream = self.streams[i]
        assert stream is not None
        stream.close()
        self.streams[i] = None
        self.model.closed.add(f"s{i}")
        self.model.base_windows.pop(f"s{i}", None)

    def _target(self, data: st.DataObject) -> tuple[Any, tuple[str, ...]]:
        open_ = [i for i, s in enumerate(self.streams) if s is not None]
        choices = [("s", i) for i in open_] + [("g", None)]
        kind, i = data.draw(st.sampled_from(choices))
        if kind == "g":
            return self.graph, tuple(f"n{j}" for j in range(len(self.nodes)))
        return self.streams[i], (f"s{i}",)

    @rule(data=st.data(), size=st.sampled_from(BUFFER_SIZES), ratio=st.sampled_from([None, 0.25, 0.5, 1.0]),
          limit=st.sampled_from(["auto", None, "max", 0, G, 4 * G, MAX]), share=st.booleans(),
          strict=st.booleans(), reset=st.booleans())
    def enter_persist(self, data: st.DataObject, size: int, ratio: Optional[float], limit: Union[int, str, None],
                      share: bool, strict: bool, reset: bool) -> None:
        obj, targets = self._target(data)
        buf = self.buffers[size]
        nbytes = min(size, MAX_WINDOW)
        self.ids += 1
        model_limit = MAX if limit == "max" else limit
        scope = ModelScope(self.ids, targets, buf.ptr, nbytes, 1.0 if ratio is None else ratio, model_limit, share,
                           reset)
        model = self.model
        trial = model.scopes + [scope]
        base_limit = model.base_limit
        _, fit_capped = model.fold(trial)  # a fitted ratio starts from the whole window
        if ratio is None:  # as much as the set-aside holds next to the other windows in force
            planned = model.limit(trial)
            others = sum(s.demand() for s in model.in_force(trial) if s is not scope)
            room = max(0.0, planned - others)
            if room >= nbytes:
                scope.ratio = 1.0
            elif room >= 256:  # the window's first bytes it holds whole, in 256-byte units
                scope.nbytes, scope.ratio = int(room) // 256 * 256, 1.0
            else:
                scope.ratio = room / nbytes
        model.scopes = trial
        ratios = model.effective()
        in_force = model.in_force(trial)
        demand = sum(s.demand(ratios[s.id]) for s in in_force)
        _, capped = model.fold(trial)
        capped = capped or (ratio is None and fit_capped)
        warns = size > MAX_WINDOW or (model_limit == "auto" and capped) or demand > model.limit() * (1 + 1e-9)
        handle = l2ctl.persist(obj, buf, ratio, set_aside=limit, share=share, reset_on_exit=reset)
        with warnings.catch_warnings():
            warnings.simplefilter("error" if strict else "ignore")
            if strict and warns:
                model.scopes = model.scopes[:-1]
                model.base_limit = base_limit
                with pytest.raises((l2ctl.L2BudgetWarning, l2ctl.WindowClippedWarning, l2ctl.SetAsideTaxWarning)):
                    handle.__enter__()
                return
            handle.__enter__()
        scope.handle = handle

    @rule(k=st.integers(0, 10), plain=st.booleans())
    def enter_set_aside(self, k: int, plain: bool) -> None:
        self.ids += 1
        scope = ModelScope(self.ids, (), limit=k * G)
        handle = l2ctl.set_aside(k * G)
        if not plain:
            handle.__enter__()
        scope.handle = handle
        self.model.scopes.append(scope)

    @precondition(lambda self: bool(self.model.scopes))
    @rule(data=st.data(), raises=st.booleans())
    def exit_a_scope(self, data: st.DataObject, raises: bool) -> None:
        scope = data.draw(st.sampled_from(self.model.scopes))  # any order, not only the last one
        self.model.scopes.remove(scope)
        if raises:
            error = RuntimeError("the block failed")
            scope.handle.__exit__(RuntimeError, error, None)
        elif isinstance(scope.handle, l2ctl.SetAside):
            scope.handle.restore()
        else:
            scope.handle.__exit__(None, None, None)

    @precondition(lambda self: any(s is not None for s in self.streams))
    @rule(data=st.data(), size=st.sampled_from(BUFFER_SIZES[:3]), ratio=st.sampled_from([0.0, 0.5, 1.0]))
    def raw_window(self, data: st.DataObject, size: int, ratio: float) -> None:
        open_ = [i for i, s in enumerate(self.streams) if s is not None]
        i = data.draw(st.sampled_from(open_))
        buf = self.buffers[size]
        window = l2ctl.AccessPolicyWindow.for_buffer(buf, ratio)
        l2ctl.set_window(self.streams[i], window)
        self.model.base_windows[f"s{i}"] = (buf.ptr, buf.nbytes, ratio)

    @rule()
    def reset_lines(self) -> None:
        l2ctl.reset_persisting_lines()


RegistryMachine.TestCase.settings = settings(max_examples=EXAMPLES, stateful_step_count=30, deadline=None,
                                             suppress_health_check=[HealthCheck.too_slow])
TestRegistryModel = RegistryMachine.TestCase


@pytest.mark.filterwarnings("ignore::l2ctl.L2BudgetWarning", "ignore::l2ctl.SetAsideTaxWarning",
                            "ignore::l2ctl.WindowClippedWarning")
def test_many_threads_end_where_they_started(run_threads):
    """Threads with their own streams (and one shared stream) enter and exit scopes in random orders;
    when all are done the device is as it was. (The warnings the scopes raise are filtered for the whole
    test: warnings.catch_warnings is not thread-safe.)"""
    with FakeBackend.installed(FakeDevice.h100()) as fake:
        shared = l2ctl.Stream()
        bufs = [l2ctl.DeviceBuffer(size) for size in (MiB, 4 * MiB, 12 * MiB)]
        rounds = int(os.environ.get("L2CTL_MODEL_THREAD_ROUNDS", "40"))

        def worker(seed: int) -> None:
            rng = np.random.default_rng(seed)
            own = l2ctl.Stream()
            for _ in range(rounds):
                open_: list[Any] = []
                for _ in range(int(rng.integers(1, 4))):
                    stream = shared if rng.random() < 0.3 else own
                    kind = rng.integers(0, 3)
                    if kind == 0:
                        scope: Any = l2ctl.set_aside(int(rng.integers(0, 11)) * G)
                    else:
                        scope = l2ctl.persist(stream, bufs[int(rng.integers(0, 3))],
                                              [None, 0.5, 1.0][int(rng.integers(0, 3))],
                                              set_aside=["auto", None][int(rng.integers(0, 2))],
                                              share=bool(rng.integers(0, 2)))
                    scope.__enter__()
                    open_.append(scope)
                for k in rng.permutation(len(open_)):
                    open_[k].__exit__(None, None, None)
            own.close()

        run_threads(worker, [(seed,) for seed in range(8)])
        assert fake.device(0).limit == fake.device(0).initial_limit
        assert not fake.windows
        assert l2ctl.budget().scopes == ()
