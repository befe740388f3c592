"""What the build produced, checked without a GPU: its version (no local label) and the runtime it linked in,
no device code (NVRTC compiles the embedded source at run time: tests/kernels/test_nvrtc.py), the public header
compiles on every architecture (falling back where the L2 policy instructions do not exist), and the stub lists
the extension's names."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from typing import Optional

import pytest

import l2ctl
from l2ctl import _core

CUDA_BIN = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin")


def _find_tool(name: str) -> Optional[str]:
    path = shutil.which(name) or os.path.join(CUDA_BIN, name)
    return path if os.path.exists(path) else None


def _tool(name: str) -> str:
    path = _find_tool(name)
    if path is None:
        pytest.skip(f"{name} not found (needs the CUDA toolkit on PATH or in $CUDA_HOME/bin)")
    return path



# ---- the version and the CUDA runtime -----------------------------------------------------------------------


def test_the_build_has_a_plain_version_and_names_the_drivers_its_runtime_needs():
    """One wheel for every driver: no +cu12/+cu13 label; the runtime linked in (12's for the wheel, 13's for a
    source build beside a CUDA 13 toolkit only) sets the oldest driver, which `info` prints."""
    assert "+" not in l2ctl.__version__ and l2ctl.__version__ == _core.__version__, l2ctl.__version__
    runtime = _core.runtime_version()
    assert runtime // 1000 in (12, 13) and l2ctl.versions()["runtime"] == runtime
    assert l2ctl.minimum_driver(runtime) == {12: "525.60.13", 13: "580.65.06"}[runtime // 1000]


def _readelf(*flags: str) -> str:
    tool = shutil.which("readelf")
    if tool is None:
        pytest.skip("readelf not found (binutils)")
    return subprocess.run([tool, "-W", *flags, _core.__file__], capture_output=True, text=True, check=True,
                          timeout=120).stdout


def test_the_cuda_runtime_is_linked_in():
    """The CUDA runtime is static: the extension needs no CUDA library to load (NEEDED names the C and C++
    runtimes only, no RPATH), and no CUDA symbol is left for the loader, so a CUDA 12 build runs on a CUDA 12
    driver whatever toolkit is installed beside it."""
    dynamic = _readelf("-d")
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", dynamic)
    assert needed and not [n for n in needed if re.match(r"lib(cuda|cudart|cupti|nvrtc|nvidia)", n)], needed
    system = r"(libstdc\+\+|libm|libgcc_s|libc|libpthread|libdl|librt|ld-linux-[\w-]+)\.so(\.\d+)*$"
    assert all(re.match(system, n) for n in needed), needed
    assert "RPATH" not in dynamic and "RUNPATH" not in dynamic
    undefined = re.findall(r"\bUND\s+(\w+)", _readelf("--dyn-syms"))
    assert not [name for name in undefined if re.match(r"cu(da)?[A-Z]", name)], undefined


def test_the_extension_carries_no_device_code():
    """A C++ compiler alone builds the extension: its kernels are compiled at run time by NVRTC from the source
    embedded in it (tests/kernels/test_nvrtc.py compiles that source for every supported arch). No fatbinary
    (magic 0xBA55ED50) is linked in, and the embedded source is there as text."""
    with open(_core.__file__, "rb") as f:
        data = f.read()
    assert b"\x50\xed\x55\xba" not in data, "a CUDA fatbinary is linked into the extension"
    assert b'extern "C" __global__ void reset_data_seed_kernel(' in data
    assert b"namespace hints" in data  # cache_hints.cuh, which the kernels include


HEADER_USER = r"""
#include <l2ctl/cache_hints.cuh>
using namespace l2ctl::hints;
__global__ void use(const float4* a, float4* b, const double2* c, double2* d, const int* lut, int* o,
                    const unsigned long long* e, unsigned long long* f) {
  int i = threadIdx.x;
  b[i] = load<load_op::cs>(a + i);
  store<store_op::cs>(b + i + 64, load<load_op::lu>(a + i + 64));
  store<store_op::wt>(d + i, load<load_op::cv>(c + i));
  store<store_op::cg>(f + i, load<load_op::cg>(e + i));
  store<store_op::wb>(o + 64 + i, load<load_op::ca>(lut + i));
  auto p = make_policy<evict::last>();
  o[i] = load_with_policy(lut + i, p);
  store_with_policy(o + i + 32, 7, make_policy<evict::first>(0.5f));
}
"""


@pytest.mark.parametrize("arch,has_policy", [("sm_75", False), ("sm_80", True), ("sm_90", True)])
def test_public_header_compiles_everywhere(tmp_path, arch, has_policy):
    nvcc = _tool("nvcc")
    src = tmp_path / "use.cu"
    src.write_text(HEADER_USER)
    ptx = tmp_path / "use.ptx"
    r = subprocess.run([nvcc, "-std=c++17", f"-arch={arch}", "-I", l2ctl.get_include(), "-ptx", str(src), "-o", str(ptx)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = ptx.read_text()
    for op in ("ld.global.cs.v4.f32", "st.global.cs.v4.f32", "ld.global.lu.v4.f32", "ld.global.cv.v2.f64",
               "st.global.wt.v2.f64", "ld.global.cg.u64", "st.global.cg.u64", "ld.global.ca.s32"):
        assert op in text, op
    assert ("createpolicy" in text) == has_policy
    assert ("L2::cache_hint" in text) == has_policy


def test_stub_matches_the_extension():
    """Every public name of l2ctl._core is in _core.pyi and the other way round."""
    import ast
    import pathlib

    stub = pathlib.Path(l2ctl.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    declared |= {t.id for n in tree.body if isinstance(n, ast.AnnAssign) for t in [n.target]}
    declared = {n for n in declared if not n.startswith("_")}  # _planner: the planner's submodule, typed apart
    actual = {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}
    declared.add("__version__")
    assert declared == actual, (sorted(actual - declared), sorted(declared - actual))
