"""The rules of device state live once, in C++ (src/l2ctl/planner.cpp): Python names the planner's calls and
holds no rule. These checks read the package's source, so a rule written again in Python fails here; each is
fed a planted rule to show that it would."""

from __future__ import annotations

import ast
import pathlib

import pytest

import l2ctl
from l2ctl import _plan, _registry

PACKAGE = pathlib.Path(l2ctl.__file__).parent
#: Calls that change device state: only the planner makes them (the simulator implements them).
DEVICE_CHANGES = {"apply_window", "apply_state", "set_persisting_limit", "set_stream_window", "set_node_window",
                  "reset_persisting_lines"}
#: The planner's arithmetic, named in _plan.py for the API and its tests: each only calls the compiled one.
ARITHMETIC = {"round_up": "plan_round_up", "tax_free_limit": "plan_tax_free_limit",
              "auto_set_aside": "plan_auto_set_aside", "default_hit_ratio": "plan_default_hit_ratio",
              "shared_hit_ratios": "plan_shared_hit_ratios", "granted_set_aside": "plan_granted_set_aside"}


def rules_in_facade(source: str) -> list[str]:
    """Arithmetic, comparisons of values and loops in the registry's facade: what a rule is made of (a facade
    tests only for None and iterates what the planner hands back)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.BinOp, ast.AugAssign)):
            found.append(f"line {node.lineno}: arithmetic")
        elif isinstance(node, ast.Compare) and not all(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops):
            found.append(f"line {node.lineno}: a comparison of values")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in {"max", "min", "sum"}:
            found.append(f"line {node.lineno}: {node.func.id}()")
        elif isinstance(node, (ast.While, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            found.append(f"line {node.lineno}: a loop over values")
    return found


def arithmetic_in_python(source: str) -> list[str]:
    """Functions of ARITHMETIC whose body does more than check arguments and call the compiled rule."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name in ARITHMETIC:
            calls = {n.func.attr for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
            if ARITHMETIC[node.name] not in calls:
                found.append(f"{node.name} does not call {ARITHMETIC[node.name]}")
            if any(isinstance(n, ast.BinOp) or isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                   and n.func.id in {"max", "min", "sum"} for n in ast.walk(node)):
                found.append(f"{node.name} computes in Python")
    return found


def device_changes_outside_the_planner(sources: dict[str, str]) -> list[str]:
    found = []
    for name, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Attribute) and node.attr in DEVICE_CHANGES:
                found.append(f"{name}:{node.lineno}: .{node.attr}")
    return found


def core_sources() -> dict[str, str]:
    """Every module of the package but the simulator (which implements the backend's calls)."""
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in PACKAGE.rglob("*.py")
            if "testing" not in p.relative_to(PACKAGE).parts}


def test_the_registry_facade_holds_no_rule():
    assert rules_in_facade(pathlib.Path(_registry.__file__).read_text()) == []
    planted = "def _plan(scopes):\n    return max(s.limit for s in scopes)\n"
    assert len(rules_in_facade(planted)) == 2


def test_the_planning_arithmetic_is_the_compiled_one():
    assert arithmetic_in_python(pathlib.Path(_plan.__file__).read_text()) == []
    planted = "def auto_set_aside(demand, current, granularity, maximum):\n    return max(current, demand)\n"
    assert arithmetic_in_python(planted) == ["auto_set_aside does not call plan_auto_set_aside",
                                             "auto_set_aside computes in Python"]


def test_only_the_planner_changes_a_device():
    assert device_changes_outside_the_planner(core_sources()) == []
    planted = {"shortcut.py": "def fast(backend, s):\n    backend.apply_window(0, 0, [s], 0, 0, 0.0, 0, 0)\n"}
    assert device_changes_outside_the_planner(planted) == ["shortcut.py:2: .apply_window"]


@pytest.mark.parametrize("name", sorted(ARITHMETIC))
def test_each_name_of_the_arithmetic_reaches_the_planner(name, monkeypatch):
    """The compiled function is what answers: replaced, the Python name follows."""
    native = getattr(_plan, "_native")
    answer = [0.25] if name == "shared_hit_ratios" else 7

    class Stand_in:
        def __getattr__(self, attr: str) -> object:
            return (lambda *args: answer) if attr == ARITHMETIC[name] else getattr(native, attr)

    monkeypatch.setattr(_plan, "_native", Stand_in())
    args = {"round_up": (5, 4), "tax_free_limit": (100, 10), "auto_set_aside": (5.0, 0, 1, 100),
            "default_hit_ratio": (1, 2), "shared_hit_ratios": ([(0.5, 10)], 100),
            "granted_set_aside": (5, 10)}[name]
    assert getattr(_plan, name)(*args) == answer
