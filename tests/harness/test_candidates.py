"""Candidates from a model (l2ctl.candidates): the rule from the device's properties, tied tensors once, the
largest first, optimizer state by parameter path; tune over a model of over a hundred tensors on the
simulator picks the one that pays, or says that none does."""

from __future__ import annotations

import pytest

import l2ctl
from l2ctl import candidates
from l2ctl.testing.devices import MiB


class Module:
    """What l2ctl reads of a torch.nn.Module: named parameters and buffers (here l2ctl DeviceBuffers)."""

    def __init__(self, params: dict[str, object], buffers: dict[str, object] | None = None) -> None:
        self.params, self.buffers = params, buffers or {}

    def named_parameters(self):
        return iter(self.params.items())

    def named_buffers(self):
        return iter(self.buffers.items())


class Optimizer:
    def __init__(self, state: dict[object, dict[str, object]]) -> None:
        self.state = state


def test_the_rule_comes_from_the_device(fake):
    info = l2ctl.device_info()
    rule = candidates.rule_for()
    assert rule.min_bytes == info.l2_cache_size // 64 and rule.max_bytes == 4 * info.persisting_l2_cache_max_size
    assert rule.most == candidates.MOST and "1/64 of the L2" in rule.describe()
    with pytest.raises(ValueError, match="most"):
        candidates.rule_for(most=0)


def test_a_model_of_many_tensors_is_filtered_before_anything_runs(fake):
    rule = candidates.rule_for()
    small = {f"layers.{i}.bias": l2ctl.DeviceBuffer(rule.min_bytes // 2) for i in range(100)}
    large = {f"layers.{i}.weight": l2ctl.DeviceBuffer(rule.min_bytes * (i + 2)) for i in range(10)}
    huge = l2ctl.DeviceBuffer(rule.max_bytes + MiB)
    embed = large["layers.9.weight"]
    model = Module({**small, **large, "head.weight": embed, "table": huge}, {"running_mean": l2ctl.DeviceBuffer(64)})
    calls = len(fake.calls)
    found = candidates.from_module(model)
    assert len(fake.calls) == calls  # nothing measured, nothing changed on the device
    assert found.total == 113 and len(found) == rule.most
    assert "layers.9.weight = head.weight" in found  # tied: one candidate under both names
    order = [found.nbytes[n] for n in found]
    assert order == sorted(order, reverse=True)  # the largest first
    assert found.skipped["table"].startswith("too large") and found.skipped["running_mean"].startswith("too small")
    assert sum(why.startswith("ranked below") for why in found.skipped.values()) == 2
    assert set(found.skipped) | {n for label in found for n in label.split(" = ")} == {
        *small, *large, "head.weight", "table", "running_mean"}
    assert "113 tensors, 8 tried" in found.summary() and "101 too small" in found.summary()


def test_optimizer_state_is_named_by_its_parameter(fake):
    rule = candidates.rule_for()
    weight = l2ctl.DeviceBuffer(2 * rule.min_bytes)
    moments = {"exp_avg": l2ctl.DeviceBuffer(2 * rule.min_bytes), "exp_avg_sq": l2ctl.DeviceBuffer(2 * rule.min_bytes)}
    found = candidates.from_module(Module({"encoder.layers.3.weight": weight}), Optimizer({weight: moments}))
    assert set(found) == {"encoder.layers.3.weight", "encoder.layers.3.weight.exp_avg",
                          "encoder.layers.3.weight.exp_avg_sq"}
    with pytest.raises(TypeError, match="state"):
        candidates.from_module(Module({}), object())
    with pytest.raises(TypeError, match="torch.nn.Module"):
        candidates.from_module(object())  # type: ignore[arg-type]


def test_host_tensors_and_other_devices_are_not_tried():
    import numpy as np

    from l2ctl.testing import FakeBackend, FakeDevice

    with FakeBackend.installed(FakeDevice.h100(), FakeDevice.h100()):
        rule = candidates.rule_for(0)
        model = Module({"cpu": np.zeros(rule.min_bytes, dtype=np.uint8), "other": l2ctl.DeviceBuffer(rule.min_bytes, 1),
                        "here": l2ctl.DeviceBuffer(rule.min_bytes, 0)})
        found = candidates.from_module(model, device=0)
        assert list(found) == ["here"]
        assert found.skipped["cpu"].startswith("not on a GPU") and found.skipped["other"].startswith("on another device")


def _model_of(workload, extra: int = 100):
    """A model whose tensors are the workload's buffers plus ``extra`` small ones (biases, norms)."""
    params = {f"block.{name}": buf for name, buf in workload.buffers.items()}
    params.update({f"block.norm{i}.weight": l2ctl.DeviceBuffer(4096) for i in range(extra)})
    return Module(params)


def test_tune_over_a_model_picks_the_tensor_that_pays(fake):
    from l2ctl.workloads.modeled import ModeledWorkload

    with l2ctl.Stream() as s, ModeledWorkload.scatter_add() as w:
        model = _model_of(w)
        tuned = l2ctl.tune(w, s, model, rounds=3, repeat=2, warmup=0)
        assert tuned.persists and tuned.buffer_name == "block.acc", str(tuned)
        assert tuned.considered is not None and tuned.considered.total == 103
        assert set(tuned.candidates) == set(tuned.considered.tried)  # the small ones were never measured
        text = str(tuned.report())
        assert "candidates: 103 tensors" in text and "100 too small" in text
        summary = tuned.report().summary["considered"]
        assert summary["total"] == 103 and "block.acc" in summary["tried"]


def test_tune_over_a_model_where_nothing_pays(fake):
    from l2ctl.workloads.modeled import ModeledWorkload

    with l2ctl.Stream() as s, ModeledWorkload.gather() as w:
        tuned = l2ctl.tune(w, s, _model_of(w), rounds=3, repeat=2, warmup=0)
        assert not tuned.persists and tuned.considered is not None
        assert fake.device(0).limit == fake.device(0).initial_limit


def test_a_model_with_nothing_to_try_is_refused_before_any_measurement(fake):
    with l2ctl.Stream() as s:
        model = Module({f"b{i}": l2ctl.DeviceBuffer(4096) for i in range(3)})
        calls = len(fake.calls)
        with pytest.raises(ValueError, match="no tensor of the model can be tried: 3 tensors, 0 tried"):
            l2ctl.tune(lambda st: None, s, model)
        assert len(fake.calls) == calls


def _attention_model(rule: candidates.CandidateRule) -> Module:
    """Two attention blocks as a diffusion UNet names them, every tensor large enough to try."""
    size = rule.min_bytes * 2
    params = {f"down.{b}.attn{a}.to_{p}.weight": l2ctl.DeviceBuffer(size + 4096 * (b + a))
              for b in range(2) for a in (1, 2) for p in "qkvo"}
    params.update({f"down.{b}.ff.net.weight": l2ctl.DeviceBuffer(size) for b in range(2)})
    return Module(params)


def test_candidates_by_name_pattern(fake):
    model = _attention_model(candidates.rule_for())
    calls = len(fake.calls)
    found = candidates.from_module(model, include="*.attn*.to_[qkv].weight", most=100)
    assert len(fake.calls) == calls
    assert sorted(found) == sorted(f"down.{b}.attn{a}.to_{p}.weight" for b in range(2) for a in (1, 2) for p in "qkv")
    assert found.skipped["down.0.attn1.to_o.weight"] == "not included: matches no include pattern"
    assert "6 not included" in found.summary()
    # several patterns, and exclude: the second block's attn2 left out
    found = candidates.from_module(model, include=["*.to_q.weight", "*.ff.*"], exclude="down.1.attn2.*")
    assert sorted(found) == sorted(["down.0.attn1.to_q.weight", "down.0.attn2.to_q.weight",
                                    "down.1.attn1.to_q.weight", "down.0.ff.net.weight", "down.1.ff.net.weight"])
    assert found.skipped["down.1.attn2.to_q.weight"] == "excluded: matches 'down.1.attn2.*'"
    # the size rule still applies to what the names pick
    small = Module({"attn.to_q.weight": l2ctl.DeviceBuffer(4096), "attn.to_k.weight": l2ctl.DeviceBuffer(4 * MiB)})
    found = candidates.from_module(small, include="attn.*")
    assert list(found) == ["attn.to_k.weight"] and found.skipped["attn.to_q.weight"].startswith("too small")


@pytest.mark.parametrize("include,exclude,error,message", [
    ("*.atn*.to_q.weight", None, ValueError,
     r"include pattern '\*.atn\*.to_q.weight' matches no tensor of the model \(18 in all; closest: down\."),
    (["*.to_q.weight", "*.to_x.*"], None, ValueError, r"include pattern '\*.to_x.\*' matches no tensor"),
    ("", None, TypeError, "include must be a pattern"), ([], None, TypeError, "include must be a pattern"),
    (["*.to_q.weight", 3], None, TypeError, "include must be a pattern"),
    (None, b"x", TypeError, "exclude must be a pattern")])
def test_names_that_match_nothing_say_so(fake, include, exclude, error, message):
    with pytest.raises(error, match=message):
        candidates.from_module(_attention_model(candidates.rule_for()), include=include, exclude=exclude)


def test_an_exclude_that_matches_nothing_is_no_error(fake):
    found = candidates.from_module(_attention_model(candidates.rule_for()), exclude="*.grad", most=100)
    assert len(found) == 18


def test_tune_over_the_tensors_picked_by_name(fake):
    """tune takes what from_module picked: only those tensors are measured, and the report says why not the rest."""
    from l2ctl.workloads.modeled import ModeledWorkload

    with l2ctl.Stream() as s, ModeledWorkload.scatter_add() as w:
        model = _model_of(w)
        picked = candidates.from_module(model, include=["block.*"], exclude="block.index")
        tuned = l2ctl.tune(w, s, picked, rounds=3, repeat=2, warmup=0)
        assert set(tuned.candidates) == set(picked) and "block.index" not in tuned.candidates
        assert tuned.persists and tuned.buffer_name == "block.acc", str(tuned)
        assert "excluded: matches 'block.index'" in tuned.report().summary["considered"]["skipped"].values()
