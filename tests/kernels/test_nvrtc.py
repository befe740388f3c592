"""l2ctl's kernels compiled at run time: NVRTC compiles the embedded source on this machine (no GPU needed), each
variant's PTX carries the cache operators it promises, the disk cache writes, hits, survives a corrupt entry and
an unwritable directory, NVRTC is looked for in the documented order, and its absence is an error that says what
to install. The GPU tests run the compiled kernels and check that a second process reads the cache."""

from __future__ import annotations

import json
import os
import pathlib
import pwd
import re
import shutil
import subprocess
import sys
from typing import Any

import pytest

import l2ctl
from l2ctl import KernelsUnavailableError, _core, _nvrtc, kernels
from l2ctl.testing import FakeBackend

BUILT_MAJOR = _core.runtime_version() // 1000
#: The archs l2ctl supports: Ampere, Ada, Hopper, Blackwell (datacenter and RTX).
SUPPORTED_ARCHS = [80, 86, 89, 90, 100, 120]
#: libcu++'s descriptor for a persisting hit (cuda::access_property::persisting), as a PTX immediate.
PERSISTING_DESCRIPTOR = str(0x14F0000000000000)


def _candidates() -> list[str]:
    return _nvrtc.search_paths(BUILT_MAJOR, _core.driver_version())


def _image(arch: int, ptx: bool, cache_dir: str = "") -> tuple[bytes, dict[str, Any]]:
    try:
        return _core.kernel_image(arch, ptx, _candidates(), cache_dir)
    except KernelsUnavailableError as exc:
        if "was not found" in str(exc):
            pytest.skip(f"no NVRTC on this machine: {exc}")
        raise


@pytest.fixture(scope="module")
def ptx_functions() -> dict[str, str]:
    """The PTX of every kernel, by name, as NVRTC makes it for sm_90."""
    image, info = _image(90, ptx=True)
    assert info["image"] == "ptx" and info["arch"] == 90
    text = image.rstrip(b"\0").decode()
    functions = {m.group(1): m.group(0) for m in re.finditer(r"\.entry\s+(\S+)\((.*?)\n}\n", text, re.S)}
    assert len(functions) == 28, sorted(functions)
    return functions


# ---- the embedded source compiles ----------------------------------------------------------------------------


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS, ids=[f"sm_{a}" for a in SUPPORTED_ARCHS])
def test_the_source_compiles_to_cubin_for_every_supported_arch(arch):
    image, info = _image(arch, ptx=False)
    major, minor = (int(x) for x in info["nvrtc_version"].split("."))
    if (major, minor) >= (12, 8):  # the first NVRTC that knows Blackwell
        assert (info["image"], info["arch"]) == ("cubin", arch), info
    if info["image"] == "cubin":
        assert image[:4] == b"\x7fELF", "a CUBIN is an ELF file"
    else:  # an NVRTC older than the arch: PTX for the highest arch it knows below, which the driver JIT-compiles
        assert info["arch"] < arch and image.startswith(b"//") and b".target sm_" in image
    assert info["source"] == "compiled" and info["cache_note"] == "no cache directory"


def test_an_arch_newer_than_nvrtc_gets_ptx_for_the_highest_it_knows():
    image, info = _image(990, ptx=False)
    assert info["image"] == "ptx" and 120 <= info["arch"] < 990
    assert f".target sm_{info['arch']}".encode() in image


@pytest.mark.parametrize("kernel,present,absent", [
    ("reset_data_plain_kernel", [], ["st.global.cs", "createpolicy", "L2::cache_hint"]),
    ("reset_data_streaming_kernel", ["st.global.cs"], ["createpolicy"]),
    ("reset_data_evict_last_kernel", ["createpolicy.fractional.L2::evict_last", "ld.global.L2::cache_hint"],
     ["st.global.cs"]),
    ("reset_data_hinted_kernel", ["createpolicy.fractional.L2::evict_last", "ld.global.L2::cache_hint", "st.global.cs"],
     []),
    # annotated_ptr's persisting property: a constant policy operand on cache_hint loads, no createpolicy
    ("reset_data_annotated_kernel", ["ld.global.nc.L2::cache_hint", PERSISTING_DESCRIPTOR],
     ["st.global.cs", "createpolicy"]),
    ("sparse_vector_kernel", [], []),
])
def test_variants_emit_their_cache_operators(ptx_functions, kernel, present, absent):
    bodies = [body for name, body in ptx_functions.items() if name.startswith(kernel)]
    assert bodies, f"no kernel named like {kernel}"
    for body in bodies:
        for op in present:
            assert op in body, f"{kernel} lacks {op}"
        for op in absent:
            assert op not in body, f"{kernel} should not contain {op}"


def test_streaming_scenarios_use_cs_loads_only_when_asked(ptx_functions):
    for name in ("sparse_vector_kernel", "stream_analysis_kernel"):
        assert "ld.global.cs" not in ptx_functions[name]
        assert "ld.global.cs" in ptx_functions[name + "_streaming"]


def test_vector_paths_use_16_byte_accesses(ptx_functions):
    body = ptx_functions["reset_data_plain_kernel_vec_lut"]
    assert re.search(r"st\.global(\.\w+)*\.v4\.(u|b|s)32", body)
    assert re.search(r"ld\.global(\.\w+)*\.v4\.(u|b|s)32", body)
    assert not re.search(r"\.v4\.", ptx_functions["reset_data_plain_kernel_scalar"])


def test_the_annotated_variant_uses_libcuxx_persisting_descriptor(tmp_path):
    """cuda::annotated_ptr<const int, access_property::persisting>, compiled by nvcc, loads with the descriptor the
    NVRTC source writes out (libcu++ is not reachable from NVRTC at run time)."""
    nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    if not os.path.exists(nvcc):
        pytest.skip("nvcc not found (needs the CUDA toolkit, for libcu++)")
    src = tmp_path / "annotated.cu"
    src.write_text("#include <cuda/annotated_ptr>\n__global__ void k(const int* lut, int* out) {\n"
                   "  cuda::annotated_ptr<const int, cuda::access_property::persisting> p(lut);\n"
                   "  out[threadIdx.x] = p[threadIdx.x];\n}\n")
    r = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-ptx", str(src), "-o", str(tmp_path / "a.ptx")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    ptx = (tmp_path / "a.ptx").read_text()
    assert "L2::cache_hint" in ptx and PERSISTING_DESCRIPTOR in ptx


# ---- the disk cache ------------------------------------------------------------------------------------------


def test_the_cache_is_written_then_read(tmp_path):
    first, info = _image(86, ptx=True, cache_dir=str(tmp_path / "cache"))
    assert info["source"] == "compiled" and info["cache_note"] == ""
    assert os.path.dirname(info["cache_file"]) == str(tmp_path / "cache") and os.path.exists(info["cache_file"])
    second, again = _image(86, ptx=True, cache_dir=str(tmp_path / "cache"))
    assert again["source"] == "cache" and again["cache_file"] == info["cache_file"] and second == first
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [os.path.basename(info["cache_file"])]  # no temporary
    _, other = _image(89, ptx=True, cache_dir=str(tmp_path / "cache"))  # another arch: another entry
    assert other["source"] == "compiled" and other["cache_file"] != info["cache_file"]


@pytest.mark.parametrize("damage", ["truncated", "flipped", "empty", "foreign"])
def test_a_corrupt_entry_is_compiled_again_and_replaced(tmp_path, damage):
    image, info = _image(87, ptx=True, cache_dir=str(tmp_path))
    path = pathlib.Path(info["cache_file"])
    data = path.read_bytes()
    bad = {"truncated": data[:len(data) // 2], "flipped": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:],
           "empty": b"", "foreign": b"l2ctl kernel cache 1\nsomething else\n" + data[-100:]}[damage]
    path.write_bytes(bad)
    again, info2 = _image(87, ptx=True, cache_dir=str(tmp_path))
    assert again == image and info2["source"] == "compiled" and "corrupt" in info2["cache_note"]
    assert _image(87, ptx=True, cache_dir=str(tmp_path))[1]["source"] == "cache"  # replaced by a whole entry


def test_an_unwritable_cache_only_costs_the_cache(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    image, info = _image(80, ptx=True, cache_dir=str(blocker / "cache"))
    assert image and info["source"] == "compiled" and "cannot write" in info["cache_note"]
    assert blocker.read_text() == "not a directory"


def test_cache_dir_rules(tmp_path):
    assert _nvrtc.cache_location({"L2CTL_CACHE_DIR": "/x", "XDG_CACHE_HOME": "/y"})[0] == "/x"
    assert _nvrtc.cache_location({"L2CTL_CACHE_DIR": ""})[0] == ""  # no cache
    assert _nvrtc.cache_location({"XDG_CACHE_HOME": "/y"})[0] == os.path.join("/y", "l2ctl")
    assert _nvrtc.cache_location({"HOME": "/h"})[0] == os.path.join("/h", ".cache", "l2ctl")
    assert _nvrtc.cache_location({})[0] == os.path.join(pwd.getpwuid(os.geteuid()).pw_dir, ".cache", "l2ctl")


# ---- the disk cache refuses what its user alone cannot have written ------------------------------------------
# Anyone who can write an entry chooses the code cuLibraryLoadData loads: only an absolute directory owned by the
# effective user and not writable by group or others is used, and in it only regular files alike, of bounded size.


@pytest.fixture(scope="module")
def entry(tmp_path_factory) -> pathlib.Path:
    """A valid entry (sm_86 PTX), to copy or link where a test plants one."""
    _, info = _image(86, ptx=True, cache_dir=str(tmp_path_factory.mktemp("valid")))
    assert info["source"] == "compiled" and os.path.isfile(info["cache_file"])
    return pathlib.Path(info["cache_file"])


def _planted(directory: pathlib.Path, entry: pathlib.Path) -> pathlib.Path:
    """Where the entry for sm_86 PTX goes in ``directory`` (made 0700 if missing)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    return directory / entry.name


def _refused(directory: pathlib.Path, note: str) -> dict[str, Any]:
    """kernel_image with ``directory`` as the cache: compiled, with ``note`` in cache_note."""
    image, info = _image(86, ptx=True, cache_dir=str(directory))
    assert image and info["source"] == "compiled" and note in info["cache_note"], info
    return info


def _refused_in_a_subprocess(directory: pathlib.Path, note: str) -> None:
    """_refused, in a process that reading an endless or blocking entry cannot hang or exhaust the machine by."""
    code = ("import json, resource\nfrom l2ctl import _core, _nvrtc\n"
            "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))\n"
            f"paths = _nvrtc.search_paths({BUILT_MAJOR}, _core.driver_version())\n"
            f"print(json.dumps(_core.kernel_image(86, True, paths, {str(directory)!r})[1]))\n")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading the cache in {directory} hung")
    assert out.returncode == 0, out.stderr[-2000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["source"] == "compiled" and note in info["cache_note"], info


def _as_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user (os.chown) needs root, as the tests run in CI")


@pytest.mark.parametrize("mode,by", [(0o777, "others"), (0o775, "its group")], ids=["0777", "0775"])
def test_a_directory_others_can_write_is_not_used(tmp_path, entry, mode, by):
    shared = tmp_path / "l2ctl"
    shutil.copy(entry, _planted(shared, entry))  # what anyone could have planted there
    shared.chmod(mode)
    info = _refused(shared, f"cache not used: {shared} is writable by {by} (mode {mode:04o})")
    assert [p.name for p in shared.iterdir()] == [entry.name] and info["cache_file"] == str(shared / entry.name)
    (shared / entry.name).unlink()
    _refused(shared, "cache not used")
    assert not any(shared.iterdir()), "nothing is written in a refused directory"


def test_a_directory_of_another_user_is_not_used(tmp_path, entry):
    _as_root()
    theirs = tmp_path / "l2ctl"
    shutil.copy(entry, _planted(theirs, entry))
    os.chown(theirs, 2001, 2001)
    _refused(theirs, f"cache not used: {theirs} is owned by uid 2001, not by uid 0")


@pytest.mark.parametrize("owner", ["uid 2001", "group-writable", "writable by others"])
def test_an_entry_its_user_alone_cannot_have_written_is_not_read(tmp_path, entry, owner):
    planted = _planted(tmp_path / "l2ctl", entry)
    shutil.copy(entry, planted)
    if owner == "uid 2001":
        _as_root()
        os.chown(planted, 2001, 2001)
    planted.chmod({"uid 2001": 0o600, "group-writable": 0o620, "writable by others": 0o606}[owner])
    note = {"uid 2001": "is owned by uid 2001, not by uid 0", "group-writable": "is writable by its group (mode 0620)",
            "writable by others": "is writable by others (mode 0606)"}[owner]
    _refused(tmp_path / "l2ctl", f"the entry {planted} {note}: not read, compiled")
    assert _image(86, ptx=True, cache_dir=str(tmp_path / "l2ctl"))[1]["source"] == "cache", "replaced by its own"


def test_symlinks_are_not_followed(tmp_path, entry):
    planted = _planted(tmp_path / "l2ctl", entry)
    planted.symlink_to(entry)  # a valid entry elsewhere
    _refused(tmp_path / "l2ctl", f"the entry {planted} is a symlink: not read, compiled")
    assert entry.is_file() and not entry.is_symlink(), "the link was replaced, never written through"
    (tmp_path / "link").symlink_to(entry.parent, target_is_directory=True)  # a trusted directory, valid entry
    _refused(tmp_path / "link", f"cache not used: {tmp_path / 'link'} is a symlink")


@pytest.mark.parametrize("kind", ["a symlink to /dev/zero", "a FIFO", "a sparse 1 TiB file"])
def test_an_entry_that_never_ends_is_refused_without_hanging(tmp_path, entry, kind):
    planted = _planted(tmp_path / "l2ctl", entry)
    if kind == "a FIFO":
        os.mkfifo(planted, 0o600)
    elif kind == "a symlink to /dev/zero":
        planted.symlink_to("/dev/zero")
    else:
        planted.write_bytes(entry.read_bytes())
        os.truncate(planted, 1 << 40)
    note = {"a FIFO": "is not a regular file", "a symlink to /dev/zero": "is a symlink",
            "a sparse 1 TiB file": f"is larger than 64 MiB ({1 << 40} bytes)"}[kind]
    _refused_in_a_subprocess(tmp_path / "l2ctl", f"the entry {planted} {note}: not read, compiled")


def test_missing_directories_are_made_0700(tmp_path):
    info = _refused(tmp_path / "a" / "b" / "l2ctl", "")
    assert info["cache_note"] == "" and os.path.isfile(info["cache_file"])
    for made in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "l2ctl"):
        assert made.stat().st_mode & 0o777 == 0o700, made
    assert os.stat(info["cache_file"]).st_mode & 0o777 == 0o600


def test_a_relative_cache_directory_is_not_used(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused(pathlib.Path("cachedir/l2ctl"), "cache not used: cachedir/l2ctl is not an absolute path")
    assert list(tmp_path.iterdir()) == [], "nothing made in the working directory (no stray c, no cachedir)"


def test_relative_cache_paths_from_the_environment_give_no_cache(monkeypatch):
    assert _nvrtc.cache_location({"L2CTL_CACHE_DIR": "cachedir"}) == (
        "", "L2CTL_CACHE_DIR='cachedir' is not an absolute path")
    assert _nvrtc.cache_location({"L2CTL_CACHE_DIR": ""}) == ("", "L2CTL_CACHE_DIR is empty")
    # the XDG spec: a relative XDG_CACHE_HOME is ignored
    assert _nvrtc.cache_location({"XDG_CACHE_HOME": "rel", "HOME": "/h"}) == ("/h/.cache/l2ctl", "")
    monkeypatch.setattr(_nvrtc.pwd, "getpwuid", lambda uid: type("entry", (), {"pw_dir": "/from-passwd"}))
    assert _nvrtc.cache_location({"HOME": "rel"}) == ("/from-passwd/.cache/l2ctl", "")

    def no_entry(uid: int) -> Any:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(_nvrtc.pwd, "getpwuid", no_entry)
    for env in ({}, {"HOME": "rel"}, {"HOME": "~"}, {"XDG_CACHE_HOME": "x", "HOME": ""}):
        where, why = _nvrtc.cache_location(env)
        assert where == "" and why.startswith("no absolute home directory (HOME="), env


def test_compile_info_says_why_there_is_no_cache(monkeypatch):
    """The backend says "no cache directory" for ""; compile_info adds why l2ctl chose none."""
    monkeypatch.setenv("L2CTL_CACHE_DIR", "cachedir")
    simulated = FakeBackend.load_kernels

    def as_the_core(self: FakeBackend, device: int, nvrtc: list[str], cache_dir: str) -> dict[str, Any]:
        return {**simulated(self, device, nvrtc, cache_dir), "cache_note": "no cache directory" if not cache_dir
                else "cache used"}

    monkeypatch.setattr(FakeBackend, "load_kernels", as_the_core)
    with FakeBackend.installed():
        kernels.max_read_partials(0)
        assert kernels.compile_info()[0]["cache_note"] == (
            "no cache directory: L2CTL_CACHE_DIR='cachedir' is not an absolute path")


# ---- where NVRTC is looked for -------------------------------------------------------------------------------


def test_search_order_wheels_then_toolkit_then_the_loader():
    paths = _nvrtc.search_paths(13, 0, {"CUDA_HOME": "/opt/tk"}, ["/site"])
    order = [paths.index(p) for p in ("/site/nvidia/cu13/lib/libnvrtc.so.13", "/opt/tk/lib64/libnvrtc.so.13",
                                      "/usr/local/cuda/lib64/libnvrtc.so.13", "libnvrtc.so.13")]
    assert order == sorted(order) and paths[-1] == "libnvrtc.so.13"
    assert not any(".so.14" in p for p in paths), "no newer major without a driver that supports it"
    cu12 = _nvrtc.search_paths(12, 0, {}, ["/site"])
    assert cu12[:2] == ["/site/nvidia/cu12/lib/libnvrtc.so.12", "/site/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"]


def test_the_built_major_comes_before_a_newer_one_the_driver_supports():
    paths = _nvrtc.search_paths(12, 13010, {}, ["/site"])
    assert paths.index("libnvrtc.so.12") < paths.index("/site/nvidia/cu13/lib/libnvrtc.so.13")
    assert "libnvrtc.so.13" in paths and not any(".so.14" in p for p in paths)


def test_l2ctl_nvrtc_is_the_only_candidate_when_set():
    assert _nvrtc.search_paths(13, 13000, {"L2CTL_NVRTC": "/mine/libnvrtc.so", "CUDA_HOME": "/x"}, ["/s"]) == [
        "/mine/libnvrtc.so"]


def test_no_nvrtc_is_an_error_that_says_what_to_install(tmp_path):
    """In a fresh process (the library is loaded once per process): nothing at the candidates, and a library that
    is no NVRTC."""
    code = ("import l2ctl\nfrom l2ctl import _core\n"
            "try:\n    _core.kernel_image(90, False, ['/nowhere/libnvrtc.so.13', 'libm.so.6'], '')\n"
            "except l2ctl.KernelsUnavailableError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "NVRTC, which compiles l2ctl's kernels, was not found" in text
    assert "libm.so.6: no nvrtcGetErrorString in it" in text and "none at /nowhere/libnvrtc.so.13" in text
    wheel = "nvidia-cuda-nvrtc-cu12" if BUILT_MAJOR == 12 else f"nvidia-cuda-nvrtc=={BUILT_MAJOR}.*"
    assert f"pip install {wheel}" in text.replace('"', "") and "L2CTL_NVRTC" in text


def test_the_builtins_beside_the_chosen_nvrtc_are_the_ones_used(tmp_path):
    """NVRTC opens libnvrtc-builtins.so.<major>.<minor> by name: the copy beside the chosen library (a wheel's,
    off the loader's path) must be the one found, not another on the loader's path."""
    _, info = _image(90, ptx=True)
    builtins = f"libnvrtc-builtins.so.{info['nvrtc_version']}"
    real = os.path.join(os.path.dirname(os.path.realpath(info["nvrtc"])), builtins)
    if not os.path.exists(real):
        pytest.skip(f"no {builtins} beside {info['nvrtc']}")
    wheel = tmp_path / "nvidia" / f"cu{BUILT_MAJOR}" / "lib"  # the layout of a wheel, by links
    wheel.mkdir(parents=True)
    (wheel / os.path.basename(info["nvrtc"])).symlink_to(os.path.realpath(info["nvrtc"]))
    (wheel / builtins).symlink_to(real)
    code = ("from l2ctl import _core\n"
            f"print(_core.kernel_image(90, True, [{str(wheel / os.path.basename(info['nvrtc']))!r}], '')[1]['nvrtc'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "LD_DEBUG": "libs"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == str(wheel / os.path.basename(info["nvrtc"]))
    assert f"calling init: {wheel / builtins}" in out.stderr
    assert f"find library={builtins}" not in out.stderr, "NVRTC searched the loader's path for its builtins"


# ---- the simulator and the GPU -------------------------------------------------------------------------------


def test_the_simulator_needs_no_nvrtc(monkeypatch):
    monkeypatch.setenv("L2CTL_NVRTC", "/nowhere/libnvrtc.so")
    with FakeBackend.installed():
        lut = l2ctl.DeviceBuffer(1024, dtype="int32")
        out = l2ctl.DeviceBuffer(4096, dtype="int32")
        kernels.reset_data(out, lut)
        assert kernels.verify_reset_data(out, lut) == 0
        info = kernels.compile_info()
        assert [(i["device"], i["source"], i["arch"]) for i in info] == [(0, "simulated", 90)]
        with pytest.raises(l2ctl.NotSupportedError, match="simulator compiles no kernels"):
            FakeBackend().kernel_image(90, False, [], "")


_FIRST_USE = """
import json, l2ctl, numpy as np
lut = l2ctl.DeviceBuffer.from_numpy(np.arange(1000, dtype=np.int32))
out = l2ctl.DeviceBuffer(1 << 20, dtype=np.int32)
for variant in l2ctl.kernels.ResetVariant:
    l2ctl.kernels.reset_data(out, lut, variant=variant)
    assert l2ctl.kernels.verify_reset_data(out, lut) == 0, variant
print(json.dumps(l2ctl.kernels.compile_info()))
"""


@pytest.mark.gpu
def test_first_use_compiles_and_a_second_process_reads_the_cache(tmp_path):
    env = {**os.environ, "L2CTL_CACHE_DIR": str(tmp_path)}
    infos = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _FIRST_USE], capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
        infos.append(json.loads(out.stdout.strip().splitlines()[-1]))
    (first,), (second,) = infos
    major, minor = l2ctl.device_info().compute_capability
    assert first["source"] == "compiled" and second["source"] == "cache", infos
    assert first["image"] == "cubin" and first["arch"] == 10 * major + minor
    assert second["cache_file"] == first["cache_file"] and second["seconds"] < first["seconds"]


@pytest.mark.gpu
def test_a_planted_entry_is_refused_on_the_gpu_and_the_kernels_are_compiled_and_run(tmp_path):
    """An intact entry (the right key and checksum, so the old cache loaded it) planted where l2ctl may not trust it:
    in a directory others can write, and, where the tests run as root, owned by another user in the user's own
    directory. Each is refused; the kernels are compiled, run and verified instead. Nothing is written in the
    shared directory; in the user's own, the entry is replaced by the user's own."""
    def first_use(cache: pathlib.Path) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-c", _FIRST_USE], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "L2CTL_CACHE_DIR": str(cache)})
        assert out.returncode == 0, out.stderr
        (info,) = json.loads(out.stdout.strip().splitlines()[-1])
        return info

    made = first_use(tmp_path / "own")
    entry = pathlib.Path(made["cache_file"])
    assert made["source"] == "compiled" and entry.exists() and first_use(tmp_path / "own")["source"] == "cache"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    planted = shared / entry.name
    planted.write_bytes(entry.read_bytes())
    before = (planted.read_bytes(), planted.stat().st_mtime_ns, [p.name for p in shared.iterdir()])
    info = first_use(shared)
    assert info["source"] == "compiled" and "writable by others (mode 0777)" in info["cache_note"], info
    assert (planted.read_bytes(), planted.stat().st_mtime_ns, [p.name for p in shared.iterdir()]) == before
    if os.geteuid() == 0:
        os.chown(entry, 2001, 2001)
        info = first_use(entry.parent)
        assert info["source"] == "compiled" and "is owned by uid 2001" in info["cache_note"], info
        assert entry.stat().st_uid == 0 and first_use(entry.parent)["source"] == "cache"
