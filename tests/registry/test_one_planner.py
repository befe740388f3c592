"""The rules of device state live once, in C++ (src/l2ctl/planner.cpp): Python names the planner's calls and
holds no rule. These checks read the package's source, so a rule written again in Python fails here; each is
fed a planted rule to show that it would."""

from __future__ import annotations

import ast
import io
import pathlib
import re
import tokenize

import pytest

import l2ctl
from l2ctl import _core, _plan, _registry

#: The checkout's sources where the tests run from one (CI installs the wheel, then tests the checkout), else
#: the installed package's.
ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "l2ctl" if (ROOT / "python" / "l2ctl").is_dir() else pathlib.Path(l2ctl.__file__).parent
#: Calls that change device state: only the planner makes them (the simulator implements them).
DEVICE_CHANGES = {"apply_batch", "set_persisting_limit", "reset_persisting_lines"}
#: The planner's arithmetic, named in _plan.py for the API and its tests: each only calls the compiled one.
ARITHMETIC = {"round_up": "plan_round_up", "tax_free_limit": "plan_tax_free_limit",
              "shared_hit_ratios": "plan_shared_hit_ratios", "normalize_hit_ratio": "plan_check_hit_ratio",
              "parse_set_aside_request": "plan_requested_set_aside", "oversubscribed": "plan_oversubscribed"}
#: The planner's files: the only place the rules below are written.
PLANNER = ("src/l2ctl/planner.cpp", "src/l2ctl/planner.hpp")
#: Each rule the compiled scope and Python both apply (issue 36), with what a copy of it looks like in code
#: (comments and strings apart): its constants and its comparisons.
RULES = {
    "the hit ratio (float32 never above 1.0, 1e-6 of rounding noise)": [
        r"0\.9999", r"1\s*\+\s*(1e-6|HIT_RATIO_TOLERANCE|hit_ratio_tolerance)\b", r"1\.000001",
        r"float32\([^()]*\)\)?\s*[<>]", r"static_cast<float>\([^()]*\)\s*[<>]"],
    "demand above the limit (1e-9 relative)": [r"1\s*\+\s*1e-9", r"1\.000000001"],
    "a window clipped to the device's largest (accessPolicyMaxWindowSize)": [
        r"[<>]=?\s*[\w.>()-]*\b(max_window|access_policy_max_window_size)\b",
        r"\bmin\([^()\n]*\b(max_window|access_policy_max_window_size)\b"],
    "the set-aside a request grants against the max": [
        r"(request|limit)\w*\s*=\s*[\w.>-]*persisting_max\s*;", r"floor\([^\n]*\*\s*max", r"return\s+int\(maximum\)",
        r"min\(\s*request\s*,\s*max"],
}


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


def code_of(name: str, source: str) -> str:
    """``source`` without its comments and string literals: what runs."""
    if not name.endswith(".py"):
        return re.sub(r'//[^\n]*|"(\\.|[^"\\])*"', " ", source)
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    code = list(source)
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            begin, end = starts[token.start[0] - 1] + token.start[1], starts[token.end[0] - 1] + token.end[1]
            code[begin:end] = " " * (end - begin)
    return "".join(code)


def product_sources() -> dict[str, str]:
    """The package's Python (the simulator apart) and the C++ sources, by path from the checkout."""
    files = [p for p in PACKAGE.rglob("*.py") if "testing" not in p.relative_to(PACKAGE).parts]
    files += sorted((ROOT / "src").rglob("*.[ch]pp")) if (ROOT / "src").is_dir() else []
    return {str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p): p.read_text() for p in files}


def copies_of_the_rules(sources: dict[str, str]) -> dict[str, list[str]]:
    """Per rule of RULES, where outside the planner its code appears (a copy)."""
    found: dict[str, list[str]] = {rule: [] for rule in RULES}
    for name, source in sources.items():
        if name in PLANNER:
            continue
        code = code_of(name, source)
        for rule, patterns in RULES.items():
            found[rule] += [f"{name}: {m.group(0)!r}" for p in patterns for m in re.finditer(p, code)]
    return found


def test_each_rule_is_written_once_in_the_planner():
    if not (ROOT / PLANNER[0]).exists():
        pytest.skip("the C++ sources are not here (testing an installed wheel outside its checkout)")
    planner = code_of(PLANNER[0], (ROOT / PLANNER[0]).read_text()) + code_of(PLANNER[1], (ROOT / PLANNER[1]).read_text())
    for rule in ("the hit ratio", "demand above the limit", "a window clipped"):  # the planner holds them (live)
        patterns = next(p for r, p in RULES.items() if r.startswith(rule))
        assert any(re.search(p, planner) for p in patterns), rule
    assert copies_of_the_rules(product_sources()) == {rule: [] for rule in RULES}


@pytest.mark.parametrize("name, planted", [
    ("_plan.py", "def fast(x):\n    return x if type(x) is float and x <= 0.9999999 else 1.0\n"),
    ("_plan.py", "def f(x):\n    return 1.0 if float(np.float32(x)) > 1.0 else x\n"),
    ("_plan.py", "TOO_MUCH = 1 + 1e-6\n"),
    ("src/scope_arguments.cpp", "bool over(double r) { return static_cast<float>(r) > 1.0f; }\n"),
    ("_persist.py", "def thrash(demand, limit):\n    return demand > limit * (1 + 1e-9)\n"),
    ("src/persist_scope.cpp", "const bool thrash = demand > limit * (1 + 1e-9);\n"),
    ("src/persist_scope.cpp", "if (self->limit == Limit::max) request = limits.persisting_max;\n"),
    ("_plan.py", "def parse(value, maximum):\n    return int(math.floor(float(value) * maximum))\n"),
    ("_plan.py", "def parse(value, maximum):\n    return int(maximum)\n"),
    ("_stream_window.py", "if window.num_bytes > props.access_policy_max_window_size:\n    raise ValueError\n"),
    ("src/persist_scope.cpp", "plan.clipped = plan.limits.max_window > 0 && full > plan.limits.max_window;\n"),
    ("tuner.py", "size = min(buf.nbytes, where.max_window)\n"),
])
def test_a_copy_of_a_rule_is_found(name, planted):
    found = copies_of_the_rules({name: planted})
    assert sum(map(len, found.values())) == 1, found
    assert copies_of_the_rules({PLANNER[0]: planted}) == {rule: [] for rule in RULES}
    commented = "".join(("# " if name.endswith(".py") else "// ") + line for line in planted.splitlines(keepends=True))
    assert copies_of_the_rules({name: commented}) == {rule: [] for rule in RULES}


def test_the_registry_facade_holds_no_rule():
    assert rules_in_facade(pathlib.Path(_registry.__file__).read_text()) == []
    planted = "def _plan(scopes):\n    return max(s.limit for s in scopes)\n"
    assert len(rules_in_facade(planted)) == 2


def test_the_planning_arithmetic_is_the_compiled_one():
    assert arithmetic_in_python(pathlib.Path(_plan.__file__).read_text()) == []
    planted = "def tax_free_limit(maximum, granularity):\n    return max(granularity, maximum)\n"
    assert arithmetic_in_python(planted) == ["tax_free_limit does not call plan_tax_free_limit",
                                             "tax_free_limit computes in Python"]


def test_only_the_planner_changes_a_device():
    assert device_changes_outside_the_planner(core_sources()) == []
    planted = {"shortcut.py": "def fast(backend, s):\n    backend.apply_batch(0, -1, False, False, False, [(0, s, w)])\n"}
    assert device_changes_outside_the_planner(planted) == ["shortcut.py:2: .apply_batch"]


@pytest.mark.parametrize("name", sorted(ARITHMETIC))
def test_each_name_of_the_arithmetic_reaches_the_planner(name, monkeypatch):
    """The compiled function is what answers: replaced, the Python name follows."""
    native = getattr(_plan, "_native")
    answer = [0.25] if name == "shared_hit_ratios" else 7

    class Stand_in:
        def __getattr__(self, attr: str) -> object:
            return (lambda *args: answer) if attr == ARITHMETIC[name] else getattr(native, attr)

    monkeypatch.setattr(_plan, "_native", Stand_in())
    if name == "normalize_hit_ratio":
        answer = (0.25, 0)  # (the ratio as CUDA takes it, no fault)
    args = {"round_up": (5, 4), "tax_free_limit": (100, 10), "shared_hit_ratios": ([(0.5, 10)], 100),
            "normalize_hit_ratio": (0.5,), "parse_set_aside_request": ("max", 10), "oversubscribed": (5.0, 10)}[name]
    assert getattr(_plan, name)(*args) == {"normalize_hit_ratio": 0.25, "oversubscribed": True}.get(name, answer)


def test_the_stub_declares_the_planners_rules_as_the_extension_has_them():
    """_core.pyi's _PlannerRules (what _plan.py calls, typed): each name is in _core._planner, with the parameter
    names pybind11 gives it, and each rule _plan.py names is declared."""
    stub = ast.parse(PACKAGE.joinpath("_core.pyi").read_text())
    rules = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == "_PlannerRules")
    native = _core._planner
    for item in rules.body:
        if isinstance(item, ast.AnnAssign):
            assert isinstance(getattr(native, item.target.id), float), item.target.id
        elif isinstance(item, ast.FunctionDef):
            signature = getattr(native, item.name).__doc__.splitlines()[0]
            names = re.findall(r"(\w+): ", signature[len(item.name) + 1:signature.index(") ->")])
            assert names == [a.arg for a in item.args.args], (item.name, signature)
    declared = {getattr(n, "name", None) for n in rules.body}
    assert set(ARITHMETIC.values()) <= declared


def test_the_window_clip_and_the_fraction_rule_are_asked_of_the_planner(monkeypatch):
    """_plan.clip_window (persist's byte range, set_window's size check, the tuner's window sizes) and the fraction
    rule of check_set_aside (its words too) answer what the planner answers: replaced, Python follows."""
    native = getattr(_plan, "_native")
    assert _plan.clip_window(0, None, 4096, 1000) == (1000, True)
    with pytest.raises(ValueError, match="runs past the end"):
        _plan.clip_window(1024, 4096, 4096, 0)
    with pytest.raises(ValueError, match=r"set_aside=1\.0 is ambiguous"):
        _plan.check_set_aside(1.0)
    monkeypatch.setattr(native, "plan_clip_window", lambda offset, n, buffer, maximum: (7, True, 0))
    monkeypatch.setattr(native, "plan_set_aside_fraction_refusal", lambda f: ": refused by the planner")
    assert _plan.clip_window(0, None, 4096, 0) == (7, True)
    with pytest.raises(ValueError, match=r"set_aside=0\.5: refused by the planner"):
        _plan.check_set_aside(0.5)
