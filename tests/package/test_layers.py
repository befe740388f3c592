"""The package's layers, read from its source: the core never imports the measurement harness, no module
imports from a layer above its own (the simulator none of the harness), there are no import cycles (through a
package's own submodules too), ``import l2ctl`` loads the core only and ``import l2ctl.tuner`` what tune uses."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import l2ctl

PACKAGE = pathlib.Path(l2ctl.__file__).parent
#: The layers above the core, lowest first (docs/DESIGN.md): a module imports from its own layer and those
#: below it only. The simulator sits just above the core (a backend, as the compiled one is) and below the whole
#: harness, which it never imports: the workloads modeled for it are workloads (l2ctl.workloads.modeled).
LAYERS = (("l2ctl.testing",), ("l2ctl.workloads",), ("l2ctl.bench",), ("l2ctl.sweep",), ("l2ctl.candidates",),
          ("l2ctl.tuner",), ("l2ctl.autotuner",), ("l2ctl.benchmark_gallery",), ("l2ctl.plot",),
          ("l2ctl.cli", "l2ctl.__main__"))
HARNESS = tuple(m for layer in LAYERS for m in layer if m != "l2ctl.testing")
#: The one import that goes up, and why: the GPU-less try-out (L2CTL_SIMULATE) puts the simulator in place of
#: the GPU when the package loads; it runs only when that variable is set.
ALLOWED = {("l2ctl", "l2ctl.testing"): "L2CTL_SIMULATE"}
OUTSIDE_THE_CORE = HARNESS + ("l2ctl.testing",)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: pathlib.Path) -> set[str]:
    """Modules of l2ctl this file imports at run time (imports under TYPE_CHECKING do not count)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("l2ctl"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.startswith("l2ctl"):
                # "from . import bench" imports the module l2ctl.bench, not what l2ctl/__init__ defines (the
                # package itself is loaded by any import of its submodules: no edge of the layering).
                submodules = {f"{module}.{a.name}" for a in node.names if _is_module(f"{module}.{a.name}")}
                found.update(submodules)
                if len(submodules) < len(node.names):
                    found.add(module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(name)
    return found


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.is_dir() or any(path.parent.glob(path.name + ".*"))  # a .py, or the extension (_core)


def _graph() -> dict[str, set[str]]:
    graph = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}
    return {m: {i for i in deps if (m, i) not in ALLOWED} for m, deps in graph.items()}


def _in(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def test_the_core_never_imports_the_harness():
    graph = _graph()
    core = {m for m in graph if not _in(m, OUTSIDE_THE_CORE)}
    assert "l2ctl._registry" in core and "l2ctl.kernels" in core
    offenders = {m: sorted(i for i in graph[m] if _in(i, OUTSIDE_THE_CORE)) for m in core}
    assert not {m: i for m, i in offenders.items() if i}, offenders


def test_there_are_no_import_cycles():
    graph = _graph()
    known = set(graph)
    # Every edge counts, a package's __init__ importing its own submodules too: bench/__init__ -> a bench
    # module -> the tuner -> bench/__init__ is a cycle however late one of the imports runs.
    edges = {m: {i for i in deps if i in known} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                cycle.extend(path + [m, n])
                return True
            if n not in state and visit(n, path + [m]):
                return True
        state[m] = 2
        return False

    for m in sorted(edges):
        if m not in state and visit(m, []):
            break
    assert not cycle, " -> ".join(cycle)


def _layer(module: str) -> int:
    for level, layer in enumerate(LAYERS, start=1):
        if _in(module, layer):
            return level
    return 0  # the core


def test_no_module_imports_from_a_layer_above_its_own():
    graph = _graph()
    upward = {m: sorted(i for i in deps if i in graph and _layer(i) > _layer(m)) for m, deps in graph.items()}
    assert not {m: i for m, i in upward.items() if i}, upward


def test_the_layer_checks_catch_what_they_are_for(monkeypatch):
    """Fed a package whose __init__ imports a submodule that imports a module above, which imports the
    package back (the shape the gallery runner once had), both checks fail; fed a simulator module that imports a
    workload (the shape the modeled workloads once had), the layer check fails."""
    real = _graph()
    planted = {**real, "l2ctl.bench": real["l2ctl.bench"] | {"l2ctl.bench.runner"},
               "l2ctl.bench.runner": {"l2ctl.tuner"}, "l2ctl.tuner": real["l2ctl.tuner"] | {"l2ctl.bench"}}
    monkeypatch.setattr(__import__(__name__), "_graph", lambda: planted)
    with pytest.raises(AssertionError, match="l2ctl.bench"):
        test_there_are_no_import_cycles()
    with pytest.raises(AssertionError, match="l2ctl.tuner"):
        test_no_module_imports_from_a_layer_above_its_own()
    planted = {**real, "l2ctl.testing.workloads": {"l2ctl.workloads.graphed"}}
    with pytest.raises(AssertionError, match="l2ctl.testing.workloads"):
        test_no_module_imports_from_a_layer_above_its_own()


def test_import_loads_the_core_only():
    code = ("import sys, l2ctl; print(sorted(m for m in sys.modules if m.startswith('l2ctl'))); "
            "print(l2ctl.tune.__module__, l2ctl.bench.__name__, l2ctl.kernels.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded, lazily = out.stdout.splitlines()
    assert not [m for m in eval(loaded) if _in(m, OUTSIDE_THE_CORE)], loaded
    assert lazily == "l2ctl.tuner l2ctl.bench l2ctl.kernels"


#: The most modules of l2ctl's (the extension's included) an import loads in a fresh process: the core alone, the
#: tuner with what its definitions need of the harness (records, timing, the tax's type, the workload protocol:
#: the paired rounds, hygiene, the progress bar and the bystander copy load when a tune runs; no benchmark
#: scenario, sweep, gallery or command line), the simulator's presets.
LOADS_AT_MOST = {"l2ctl": 24, "l2ctl.tuner": 32, "l2ctl.testing": 27}


@pytest.mark.parametrize("module", sorted(LOADS_AT_MOST))
def test_an_import_loads_only_what_it_uses(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m == 'l2ctl' or m.startswith('l2ctl.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    loaded = eval(out.stdout)
    assert len(loaded) <= LOADS_AT_MOST[module], f"{module} loads {len(loaded)} modules: {loaded}"


SRC = pathlib.Path(__file__).resolve().parents[2] / "src"


def test_the_compiled_layer_imports_no_module_of_l2ctls_by_name():
    """Its one tie to Python is the Host (l2ctl._host): no py::module_::import("l2ctl...") nor PyImport_* of one."""
    found = [f"{p.name}:{n}" for p in sorted(SRC.glob("*.[ch]pp")) for n, line in enumerate(p.read_text().splitlines(), 1)
             if "l2ctl." in line and ("module_::import" in line or "PyImport_" in line)]
    assert not found, found


def test_the_binding_layer_survives_a_thread_the_interpreter_ends():
    """CPython (< 3.14) ends a thread asking for the GIL at exit with a forced unwind (docs/DESIGN.md, "Interpreter
    exit"): the GIL is given up only through Gil_released, which catches it, and every catch-all of the binding
    layer lets L2CTL_THREAD_ENDED catch it first; the C++ core (src/l2ctl) never touches the GIL."""
    found = []
    for p in sorted(SRC.glob("*.[ch]pp")) + sorted((SRC / "l2ctl").glob("*.[ch]pp")):
        for n, line in enumerate(p.read_text().splitlines(), 1):
            if ("gil_scoped_release" in line or "PyEval_SaveThread" in line) and p.name != "gil.hpp":
                found.append(f"{p.name}:{n}: the GIL given up outside Gil_released")
            if "catch (...)" in line and "L2CTL_THREAD_ENDED catch (...)" not in line and p.parent == SRC:
                found.append(f"{p.name}:{n}: a catch-all without L2CTL_THREAD_ENDED before it")
    assert not found, found


def test_the_host_has_exactly_the_fields_the_compiled_layer_reads_each_from_a_core_module():
    from dataclasses import fields

    from l2ctl import _core, _host

    planner = getattr(_core, "_planner")
    declared = {f.name: f.type for f in fields(_host.Host)}
    compiled = dict(planner.HOST_FIELDS)  # name -> "callable" | "type" | "exception" (src/host.cpp)
    assert set(declared) == set(compiled)
    for name, kind in compiled.items():
        hint = declared[name]
        assert hint.startswith({"callable": "Callable", "type": "type", "exception": "type[BaseException]"}[kind]), name
    # Every value is a name of a core module (the harness and the simulator never feed the compiled layer).
    core = [m for m, mod in sys.modules.items() if m.startswith("l2ctl") and not _in(m, OUTSIDE_THE_CORE) and mod]
    for name in compiled:
        value = getattr(_host.host, name)
        owners = [m for m in core if any(v is value for v in vars(sys.modules[m]).values())]
        assert owners, f"Host.{name} is no name of a core module"


@pytest.mark.parametrize("change,error", [
    ({"prepare": None}, "Host.prepare: missing"), ({"announce": 3}, "Host.announce: not callable"),
    ({"stream_type": len}, "Host.stream_type: not a type"),
    ({"cuda_error": int}, "Host.cuda_error: not an exception class")])
def test_the_host_is_checked_field_by_field_and_registered_once(change, error):
    from l2ctl import _core, _host

    register = getattr(_core, "_planner").register_host
    values = {**vars(_host.host), **change}

    class Partial:
        pass

    given = Partial()
    for name, value in values.items():
        if value is not None:
            setattr(given, name, value)
    with pytest.raises(TypeError, match=error.replace(".", r"\.")):
        register(given)
    with pytest.raises(RuntimeError, match="registered already"):
        register(_host.host)


@pytest.mark.parametrize("package", ["l2ctl.bench", "l2ctl.workloads", "l2ctl.testing"])
def test_every_submodule_of_a_lazy_package_is_an_attribute(package):
    """A lazy package offers each submodule as an eagerly imported one did (``l2ctl.bench.collectives`` after
    ``import l2ctl.bench``: a GPU run's torchrun job used it so), loading it at that first use."""
    folder = PACKAGE / package.split(".")[1]
    names = sorted(p.stem for p in folder.glob("*.py") if not p.stem.startswith("_"))
    code = (f"import importlib, sys; p = importlib.import_module({package!r}); "
            f"print([n for n in {names!r} if getattr(p, n) is not sys.modules[{package!r} + '.' + n]])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:] or out.stdout
