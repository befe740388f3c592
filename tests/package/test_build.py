"""What the build produced, checked without a GPU: the CUDA flavour it reports and the runtime it linked in,
the cache operators each kernel variant promises are in the extension's PTX, its fatbinary runs on
Blackwell, and the public header compiles on every architecture (falling back where the L2 policy
instructions do not exist)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import struct
import sys
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


# ---- the flavour and the CUDA runtime -----------------------------------------------------------------------


def test_the_build_reports_its_cuda_flavour():
    flavour = l2ctl.cuda_flavour
    assert flavour in (12, 13) and l2ctl.__version__.endswith(f"+cu{flavour}"), (flavour, l2ctl.__version__)
    assert _core.runtime_version() // 1000 == flavour  # the runtime linked in is the flavour's


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


def _extension_ptx() -> str:
    """The PTX embedded in l2ctl._core. The build keeps the fatbinary uncompressed (--no-compress), so
    the text is read from the shared object itself; cuobjdump is used where the toolkit has it."""
    with open(_core.__file__, "rb") as f:
        text = f.read().decode("latin-1")
    blocks = [b for b in re.findall(r"\.version \d+\.\d+.*?(?=\x00)", text, re.S) if ".entry" in b]
    if blocks:
        return "\n".join(blocks)
    tool = shutil.which("cuobjdump") or os.path.join(CUDA_BIN, "cuobjdump")
    if os.path.exists(tool):
        out = subprocess.run([tool, "-ptx", _core.__file__], capture_output=True, text=True, timeout=120)
        if ".entry" in out.stdout:
            return out.stdout
    pytest.skip("the extension carries no PTX (built with CUDAARCHS listing only real architectures)")


@pytest.fixture(scope="module")
def ptx_functions() -> dict[str, str]:
    functions: dict[str, str] = {}
    for match in re.finditer(r"\.entry\s+(\S+)\((.*?)\n}\n", _extension_ptx(), re.S):
        functions.setdefault(match.group(1), "")
        functions[match.group(1)] += match.group(0)
    assert functions, "no kernel entry found in the PTX"
    return functions


def _bodies(functions: dict[str, str], name: str) -> list[str]:
    bodies = [body for fn, body in functions.items() if name in fn]
    assert bodies, f"no kernel named like {name} in the PTX"
    return bodies


@pytest.mark.parametrize("kernel,present,absent", [
    ("reset_data_plain_kernel", [], ["st.global.cs", "createpolicy", "L2::cache_hint"]),
    ("reset_data_streaming_kernel", ["st.global.cs"], ["createpolicy"]),
    ("reset_data_evict_last_kernel", ["createpolicy.fractional.L2::evict_last", "ld.global.L2::cache_hint"],
     ["st.global.cs"]),
    ("reset_data_hinted_kernel", ["createpolicy.fractional.L2::evict_last", "ld.global.L2::cache_hint", "st.global.cs"],
     []),
    # annotated_ptr passes its persisting policy as a constant operand: cache_hint loads, no createpolicy
    ("reset_data_annotated_kernel", ["ld.global.nc.L2::cache_hint"], ["st.global.cs", "createpolicy"]),
    ("sparse_vector_kernel", [], []),
])
def test_variants_emit_their_cache_operators(ptx_functions, kernel, present, absent):
    for body in _bodies(ptx_functions, kernel):
        for op in present:
            assert op in body, f"{kernel} lacks {op}"
        for op in absent:
            assert op not in body, f"{kernel} should not contain {op}"


def test_streaming_scenarios_use_cs_loads_only_when_asked(ptx_functions):
    for name in ("sparse_vector_kernel", "stream_analysis_kernel"):
        bodies = _bodies(ptx_functions, name)
        assert sum("ld.global.cs" in b for b in bodies) == 1, name  # the <true> instantiation only


def test_vector_paths_use_16_byte_accesses(ptx_functions):
    body = "".join(_bodies(ptx_functions, "reset_data_plain_kernel"))
    assert re.search(r"st\.global(\.\w+)*\.v4\.(u|b|s)32", body)
    assert re.search(r"ld\.global(\.\w+)*\.v4\.(u|b|s)32", body)


# ---- the fatbinary: can a Blackwell GPU run the build? ---------------------------------------------------

Codes = dict[str, set[str]]  # "sass"/"ptx" -> {"90", "90a", "100f", ...}


def _cuobjdump_codes(tool: str) -> Codes:
    codes: Codes = {"sass": set(), "ptx": set()}
    for kind, flag in (("sass", "--list-elf"), ("ptx", "--list-ptx")):
        out = subprocess.run([tool, flag, _core.__file__], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 or "does not contain" in out.stderr, out.stderr
        codes[kind] = set(re.findall(r"\.sm_(\d+[a-z]?)\.(?:cubin|ptx)$", out.stdout, re.M))
    return codes


def _fatbin_codes() -> Codes:
    """The entries of the fatbinaries in the extension, from their headers: what cuobjdump lists, for a toolkit
    without it. NVIDIA does not document the layout; as nvcc 13 writes it: a container header (magic
    0xBA55ED50, version 1, header size 16, payload size), then entries (kind 1 PTX, 2 ELF; header size;
    payload size; the arch at byte 28; flags at byte 40, 0x100000 for "a" targets, 0x200000 for "f" ones).
    test_the_fatbin_reader_agrees_with_cuobjdump keeps it honest where the toolkit has cuobjdump."""
    with open(_core.__file__, "rb") as f:
        data = f.read()
    codes: Codes = {"sass": set(), "ptx": set()}
    pos = data.find(b"\x50\xed\x55\xba")
    while pos >= 0:
        _, version, header, size = struct.unpack_from("<IHHQ", data, pos)
        if version == 1 and header == 16:
            entry, end = pos + header, pos + header + size
            while entry < end:
                kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
                (arch,), (flags,) = struct.unpack_from("<I", data, entry + 28), struct.unpack_from("<I", data, entry + 40)
                suffix = "a" if flags & 0x100000 else "f" if flags & 0x200000 else ""
                codes["ptx" if kind == 1 else "sass"].add(f"{arch}{suffix}")
                entry += entry_header + payload
            pos = end
        pos = data.find(b"\x50\xed\x55\xba", pos + 4)
    return codes


@pytest.fixture(scope="module")
def fatbin() -> Codes:
    tool = _find_tool("cuobjdump")
    codes = _cuobjdump_codes(tool) if tool else _fatbin_codes()
    if not codes["sass"] | codes["ptx"]:
        pytest.skip("no fatbinary found in the extension (and no cuobjdump to list it)")
    return codes


def _arches(codes: Codes) -> dict[str, set[int]]:
    return {kind: {int(c.rstrip("af")) for c in found} for kind, found in codes.items()}


def _runs_on(code: str, target: int, ptx: bool) -> bool:
    """Whether SASS (or PTX, JIT-compiled) for ``code`` runs on sm_<target>: SASS on its major version from its
    minor up, plain PTX on every later arch, "f" code on its family from its minor up, "a" code on its arch only."""
    arch, suffix = int(code.rstrip("af")), code[-1:] if code[-1].isalpha() else ""
    if suffix == "a":
        return arch == target
    if suffix == "f" or not ptx:
        return arch // 10 == target // 10 and arch <= target
    return arch <= target


@pytest.mark.parametrize("target", [100, 120], ids=["sm_100", "sm_120"])
def test_blackwell_can_run_the_build(fatbin, target):
    """Blackwell (B200: sm_100, RTX 50 / RTX PRO: sm_120) runs SASS built for it, or JIT-compiles the PTX of
    an earlier arch (the local CUDAARCHS=90 build carries compute_90 PTX; the default build adds Blackwell
    SASS)."""
    sass = [c for c in fatbin["sass"] if _runs_on(c, target, ptx=False)]
    ptx = [c for c in fatbin["ptx"] if _runs_on(c, target, ptx=True)]
    assert sass or ptx, f"nothing in {fatbin} runs on sm_{target}: add {target}-real to CUDAARCHS, or keep PTX"
    highest = max(max(found, default=0) for found in _arches(fatbin).values())
    assert sass or highest in _arches(fatbin)["ptx"], f"the highest arch, {highest}, has no PTX: {fatbin}"


def test_the_fatbin_reader_agrees_with_cuobjdump():
    tool = _tool("cuobjdump")
    assert _arches(_fatbin_codes()) == _arches(_cuobjdump_codes(tool))  # cuobjdump calls "f" SASS plain


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
    actual = {n for n in dir(_core) if not n.startswith("_")} | {"__version__"}
    declared.add("__version__")
    assert declared == actual, (sorted(actual - declared), sorted(declared - actual))
