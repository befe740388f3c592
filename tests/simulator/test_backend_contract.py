"""The backend contract: what a backend offers is declared once, in the stub (_core.pyi); the compiled
extension (l2ctl._core, the names src/bindings.cpp exports) and the simulator (l2ctl.testing.FakeBackend) have
its names, parameter names, parameter order and defaults.

pybind11 writes each function's signature in the first line of its ``__doc__`` (``name(a: T, b: T = 0) -> R``);
classes are compared through ``__init__``, their methods and their properties. In the simulator, a class of the
extension is a factory method of the same name taking the constructor's parameters, returning an object with
the class's methods and properties. The last tests feed deliberately broken declarations to the comparison, so
it is known to fail when something is missing or differs.
"""

from __future__ import annotations

import ast
import inspect
import pathlib
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import pytest

import l2ctl
from l2ctl import _backend, _core
from l2ctl.testing import FakeBackend, FakeDevice

STUB = pathlib.Path(l2ctl.__file__).with_name("_core.pyi")


class _Required:
    def __repr__(self) -> str:
        return "<required>"


REQUIRED = _Required()
#: (parameter name, default or REQUIRED), in order, without self
Params = list[tuple[str, Any]]


@dataclass
class ClassSpec:
    init: Params
    methods: dict[str, Params] = field(default_factory=dict)
    properties: set[str] = field(default_factory=set)


@dataclass
class Contract:
    functions: dict[str, Params]
    classes: dict[str, ClassSpec]
    attributes: set[str]


# ---- reading the stub ----------------------------------------------------------------------------


def _ast_params(fn: ast.FunctionDef, drop_self: bool) -> Params:
    args = list(fn.args.args)
    defaults: list[Any] = [REQUIRED] * (len(args) - len(fn.args.defaults)) + [
        ast.literal_eval(d) for d in fn.args.defaults]
    params = [(a.arg, d) for a, d in zip(args, defaults)]
    assert not fn.args.kwonlyargs and fn.args.vararg is None and fn.args.kwarg is None, fn.name
    return params[1:] if drop_self else params


def parse_stub(text: str) -> Contract:
    tree = ast.parse(text)
    functions: dict[str, Params] = {}
    classes: dict[str, ClassSpec] = {}
    attributes: set[str] = set()
    for node in tree.body:
        name = getattr(node, "name", getattr(getattr(node, "target", None), "id", ""))
        if name.startswith("_") and not name.startswith("__"):
            continue  # the planner's submodule (_planner), out of the contract, as the extension's reading skips it
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = _ast_params(node, drop_self=False)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            attributes.add(node.target.id)
        elif isinstance(node, ast.ClassDef):
            spec = ClassSpec(init=[])
            for item in node.body:
                if not isinstance(item, ast.FunctionDef):
                    continue
                if any(isinstance(d, ast.Name) and d.id == "property" for d in item.decorator_list):
                    spec.properties.add(item.name)
                elif item.name == "__init__":
                    spec.init = _ast_params(item, drop_self=True)
                else:
                    spec.methods[item.name] = _ast_params(item, drop_self=True)
            classes[node.name] = spec
    return Contract(functions, classes, attributes)


@pytest.fixture(scope="module")
def stub() -> Contract:
    return parse_stub(STUB.read_text())


# ---- reading pybind11 signatures -----------------------------------------------------------------


def _split_top(text: str, sep: str = ",") -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current)
    return parts


def pybind_params(obj: Any, name: str, drop_self: bool) -> Params:
    """Parameters from the first line of a pybind11 docstring, ``name(a: T, b: T = 0) -> R``."""
    doc = (obj.__doc__ or "").strip().splitlines()
    assert doc and doc[0].startswith(name + "("), f"{name}: no pybind11 signature in {doc[:1]}"
    line = doc[0][len(name) + 1:]
    depth, end = 1, 0
    for i, ch in enumerate(line):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            end = i
            break
    params: Params = []
    for part in _split_top(line[:end]):
        decl, _, default = part.partition(" = ")
        pname = decl.split(":")[0].strip()
        params.append((pname, ast.literal_eval(default.strip()) if default else REQUIRED))
    if drop_self:
        assert params and params[0][0] == "self", f"{name}: expected self first"
        params = params[1:]
    return params


def extension_contract() -> Contract:
    functions: dict[str, Params] = {}
    classes: dict[str, ClassSpec] = {}
    attributes = {"__version__"} if isinstance(getattr(_core, "__version__", None), str) else set()
    for name in dir(_core):
        if name.startswith("_"):
            continue
        obj = getattr(_core, name)
        if isinstance(obj, type):
            spec = ClassSpec(init=pybind_params(obj.__init__, "__init__", drop_self=True))
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(value, property):
                    spec.properties.add(attr)
                elif callable(value):
                    spec.methods[attr] = pybind_params(value, attr, drop_self=True)
            classes[name] = spec
        elif callable(obj):
            functions[name] = pybind_params(obj, name, drop_self=False)
    return Contract(functions, classes, attributes)


# ---- reading Python objects ----------------------------------------------------------------------


def py_params(fn: Callable[..., Any], drop_self: bool) -> Params:
    params = list(inspect.signature(fn).parameters.values())
    if drop_self:
        assert params and params[0].name == "self", f"{fn}: expected self first"
        params = params[1:]
    out: Params = []
    for p in params:  # keyword-only and variadic parameters are marked, so they never match the stub's
        name = {p.KEYWORD_ONLY: "*" + p.name, p.VAR_POSITIONAL: "*args", p.VAR_KEYWORD: "**kwargs"}.get(p.kind, p.name)
        out.append((name, REQUIRED if p.default is p.empty else p.default))
    return out


def _same_default(a: Any, b: Any) -> bool:
    return a is b or (a is not REQUIRED and b is not REQUIRED and type(a) is type(b) and a == b)


def _same(a: Params, b: Params) -> bool:
    return len(a) == len(b) and all(n1 == n2 and _same_default(d1, d2) for (n1, d1), (n2, d2) in zip(a, b))


def compare_functions(where: str, expected: dict[str, Params], actual: dict[str, Optional[Params]]) -> list[str]:
    problems = []
    for name, params in expected.items():
        got = actual.get(name)
        if got is None:
            problems.append(f"{where}: {name} is missing")
        elif not _same(params, got):
            problems.append(f"{where}: {name}{params} != {got}")
    return problems


def compare_objects(where: str, spec: ClassSpec, obj_or_type: Any) -> list[str]:
    """An object (or class) must have every method (same parameters) and property of ``spec``."""
    cls = obj_or_type if isinstance(obj_or_type, type) else type(obj_or_type)
    problems = []
    for prop in sorted(spec.properties):
        if not isinstance(inspect.getattr_static(cls, prop, None), property):
            problems.append(f"{where}: property {prop} is missing")
    for name, params in spec.methods.items():
        fn = inspect.getattr_static(cls, name, None)
        if fn is None or not callable(fn) or isinstance(fn, property):
            problems.append(f"{where}: method {name} is missing")
        elif not _same(params, py_params(fn, drop_self=True)):
            problems.append(f"{where}: {name}{params} != {py_params(fn, drop_self=True)}")
    return problems


def _methods_of(cls: type) -> dict[str, Optional[Params]]:
    out: dict[str, Optional[Params]] = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        fn = inspect.getattr_static(cls, name)
        if callable(fn) and not isinstance(fn, (type, classmethod, staticmethod)):
            out[name] = py_params(fn, drop_self=True)
    return out


# ---- the tests -----------------------------------------------------------------------------------


def test_stub_parses_into_functions_and_classes(stub):
    assert {"reset_data", "get_stream_window", "pointer_info"} <= set(stub.functions)
    assert set(stub.classes) == {"Stream", "Event", "DeviceMemory", "Graph", "GraphExec", "RangeProfiler",
                                 "LaunchRecorder"}
    assert stub.classes["Stream"].init == [("device", REQUIRED), ("non_blocking", True), ("priority", 0)]
    assert "handle" in stub.classes["Stream"].properties and "close" in stub.classes["Stream"].methods
    assert stub.attributes == {"__version__"}


def test_extension_matches_the_stub(stub):
    ext = extension_contract()
    assert set(ext.functions) == set(stub.functions), (sorted(set(ext.functions) ^ set(stub.functions)))
    assert set(ext.classes) == set(stub.classes), (sorted(set(ext.classes) ^ set(stub.classes)))
    assert ext.attributes == stub.attributes
    problems = compare_functions("_core", stub.functions, dict(ext.functions))
    for name, spec in stub.classes.items():
        got = ext.classes[name]
        if not _same(spec.init, got.init):
            problems.append(f"_core.{name}.__init__{spec.init} != {got.init}")
        if set(got.methods) != set(spec.methods) or got.properties != spec.properties:
            problems.append(f"_core.{name}: members {sorted(got.methods)} {sorted(got.properties)} != "
                            f"{sorted(spec.methods)} {sorted(spec.properties)}")
        problems += compare_functions(f"_core.{name}", spec.methods, dict(got.methods))
    assert not problems, "\n".join(problems)


def _fake_objects(fake: FakeBackend) -> dict[str, Any]:
    stream = fake.Stream(0)
    memory = fake.DeviceMemory(0, 4096)
    fake.begin_capture(stream.handle, 1)
    fake.launch_fake_kernel(stream.handle)
    graph = fake.Graph(fake.end_capture(stream.handle), True)
    fake.cupti_load("libcupti.so")
    return {"Stream": stream, "Event": fake.Event(), "DeviceMemory": memory, "Graph": graph,
            "GraphExec": fake.GraphExec(graph.handle),
            "RangeProfiler": fake.RangeProfiler(0, ["gpu__time_duration.sum"], 1),
            "LaunchRecorder": fake.LaunchRecorder(16)}


def test_fake_backend_implements_every_name(stub):
    fake = FakeBackend(FakeDevice.h100())
    methods = _methods_of(FakeBackend)
    problems = compare_functions("FakeBackend", stub.functions, methods)
    assert isinstance(FakeBackend.__version__, str) and FakeBackend.__version__ == _core.__version__
    objects = _fake_objects(fake)
    for name, spec in stub.classes.items():
        problems += compare_functions("FakeBackend (factory)", {name: spec.init}, methods)
        problems += compare_objects(f"FakeBackend.{name}()", spec, objects[name])
        # the class itself: the machine it belongs to, then the extension's constructor parameters
        cls = type(objects[name])
        init = py_params(cls.__init__, drop_self=True)
        if not init or init[0] != ("backend", REQUIRED) or not _same(spec.init, init[1:]):
            problems.append(f"{cls.__name__}.__init__{init} != (backend, {spec.init})")
    assert not problems, "\n".join(problems)


def _planner_calls() -> dict[str, Params]:
    """What the stub declares the planner calls on a backend beside the contract (``_PlannerCalls``)."""
    for node in ast.parse(STUB.read_text()).body:
        if isinstance(node, ast.ClassDef) and node.name == "_PlannerCalls":
            return {f.name: _ast_params(f, drop_self=True) for f in node.body if isinstance(f, ast.FunctionDef)}
    raise AssertionError("the stub declares no _PlannerCalls")


def test_the_simulator_implements_the_planners_calls(stub):
    """The calls that change device state are no functions of the extension (its planner calls CUDA in C++) but the
    simulator's: the calls the planner makes on a backend that the contract does not hold, declared in the stub's
    ``_PlannerCalls``."""
    declared = _planner_calls()
    assert set(declared) == {"apply_batch", "set_persisting_limit", "reset_persisting_lines"}
    assert not set(declared) & set(stub.functions) and not set(declared) & set(dir(_core))
    assert not {"apply_window", "apply_state", "set_stream_window", "set_node_window"} & set(dir(_core))
    assert compare_functions("FakeBackend", declared, _methods_of(FakeBackend)) == []


def test_use_installs_a_backend_for_the_block_only():
    fake = FakeBackend()
    with _backend.use(fake):
        assert _backend.current() is fake
    assert _backend.current() is _core


# ---- the comparison itself fails where it must ----------------------------------------------------


def test_comparison_catches_a_missing_function(stub):
    methods = _methods_of(FakeBackend)
    del methods["stride_read"]
    assert compare_functions("x", stub.functions, methods) == ["x: stride_read is missing"]


def test_comparison_catches_renamed_reordered_and_defaulted_parameters(stub):
    expected = {"stride_read": stub.functions["stride_read"]}

    def renamed(self, device, stream, buf, threads, stride, partials, block_threads=256): ...  # noqa: E704
    def reordered(self, stream, device, buf, threads, stride_words, partials, block_threads=256): ...  # noqa: E704
    def other_default(self, device, stream, buf, threads, stride_words, partials, block_threads=128): ...  # noqa: E704
    def no_default(self, device, stream, buf, threads, stride_words, partials, block_threads): ...  # noqa: E704
    def bool_default(self, device, stream, buf, threads, stride_words, partials, block_threads=True): ...  # noqa: E704
    def extra(self, device, stream, buf, threads, stride_words, partials, block_threads=256, x=1): ...  # noqa: E704

    for fn in (renamed, reordered, other_default, no_default, bool_default, extra):
        got = {"stride_read": py_params(fn, drop_self=True)}
        assert compare_functions("x", expected, got), fn.__name__


def test_comparison_catches_missing_members(stub):
    spec = stub.classes["Stream"]

    class NoClose:
        @property
        def handle(self) -> int: return 0  # noqa: E704
        @property
        def device(self) -> int: return 0  # noqa: E704
        @property
        def closed(self) -> bool: return False  # noqa: E704
        def synchronize(self) -> None: ...  # noqa: E704
        def query(self) -> bool: return True  # noqa: E704

    class HandleNotAProperty(NoClose):
        def handle(self) -> int: return 0  # type: ignore[override]  # noqa: E704
        def close(self) -> None: ...  # noqa: E704

    class WrongArgs(NoClose):
        def close(self, force: bool) -> None: ...  # noqa: E704

    assert compare_objects("x", spec, NoClose) == ["x: method close is missing"]
    assert compare_objects("x", spec, HandleNotAProperty) == ["x: property handle is missing"]
    assert compare_objects("x", spec, WrongArgs)


def test_pybind_signature_parser():
    class F:
        __doc__ = ("f(a: typing.SupportsInt | typing.SupportsIndex, b: collections.abc.Sequence[tuple[int, "
                   "tuple[int, float]]], c: bool = True, d: typing.SupportsInt = 0) -> tuple[int, int]\n\nmore text")

    assert pybind_params(F, "f", drop_self=False) == [("a", REQUIRED), ("b", REQUIRED), ("c", True), ("d", 0)]
    stub_text = "def f(a: int, b: bool = False) -> None: ...\nclass C:\n    def __init__(self, x: int) -> None: ...\n"
    parsed = parse_stub(stub_text)
    assert parsed.functions["f"] == [("a", REQUIRED), ("b", False)] and parsed.classes["C"].init == [("x", REQUIRED)]
