"""The build's CUDA rules (build_support/l2ctl_cuda.py): which CUDA runtime the build links (12's, which serves
every supported driver; 13's only where no CUDA 12 headers are found), where its headers and static runtime come
from, what an isolated build installs, the one wheel's metadata (no local version label, the [cu12] and [cu13]
extras), and the backend that keeps the build directory between pip's isolated environments. Fake toolkits and
pip layouts in tmp_path; no compiler needed."""

from __future__ import annotations

import json
import os
import pathlib
import sys

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "build_support"))
import l2ctl_cuda  # noqa: E402


def _runtime(include: pathlib.Path, lib: pathlib.Path, version: int, cupti: bool = True) -> None:
    include.mkdir(parents=True, exist_ok=True)
    lib.mkdir(parents=True, exist_ok=True)
    (include / "cuda_runtime_api.h").write_text(f"#pragma once\n#define CUDART_VERSION {version}\n")
    (lib / "libcudart_static.a").write_bytes(b"!<arch>\n")
    if cupti:
        (include / "cupti_range_profiler.h").write_text("#pragma once\n")


def _crt(include: pathlib.Path) -> pathlib.Path:
    """The crt/ headers the runtime's include, where NVIDIA's pip packages put them apart from it."""
    (include / "crt").mkdir(parents=True, exist_ok=True)
    (include / "crt" / "host_defines.h").write_text("#pragma once\n")
    return include


def _toolkit(root: pathlib.Path, version: int) -> pathlib.Path:
    _runtime(root / "include", root / "lib64", version)
    return root


@pytest.fixture
def no_system_cuda(monkeypatch):
    """A machine without toolkits (this one may have /usr/local/cuda)."""
    monkeypatch.setattr(l2ctl_cuda, "system_toolkits", lambda env: [])


def test_a_cuda_12_toolkit_is_used_and_nothing_is_installed(tmp_path):
    toolkit = _toolkit(tmp_path / "cuda-12.8", 12080)
    env = {"PATH": "", "CUDA_HOME": str(toolkit)}  # CUDA_HOME is looked at before /usr/local/cuda
    cuda = l2ctl_cuda.find(env)
    assert (cuda.major, cuda.version, cuda.include_dirs, cuda.cupti_include) == \
        (12, 12080, [str(toolkit / "include")], str(toolkit / "include"))
    assert cuda.cudart_static == str(toolkit / "lib64" / "libcudart_static.a") and str(toolkit) in cuda.source
    assert l2ctl_cuda.build_requires(env) == []


def test_beside_a_cuda_13_toolkit_the_build_still_takes_cuda_12_and_installs_its_headers(monkeypatch, tmp_path):
    """The wheel's rule: CUDA 12's runtime serves drivers of 12 and 13, so a CUDA 13 toolkit does not make a
    CUDA 13 build where CUDA 12's pip headers are there (an isolated build installs them)."""
    env = {"PATH": "", "CUDA_HOME": str(_toolkit(tmp_path / "cuda-13.0", 13000))}
    assert l2ctl_cuda.build_requires(env) == l2ctl_cuda.PIP[12]["build"]
    site = tmp_path / "site"
    runtime = site / "nvidia" / "cuda_runtime"
    _runtime(runtime / "include", runtime / "lib", 12090)
    _crt(site / "nvidia" / "cuda_nvcc" / "include")
    monkeypatch.setattr(sys, "path", [str(site)])
    assert l2ctl_cuda.find(env).major == 12
    monkeypatch.setattr(sys, "path", [])  # --no-build-isolation without them: CUDA 13's, which CMake warns of
    cuda = l2ctl_cuda.find(env)
    assert cuda.major == 13 and "cuda-13.0" in cuda.source


def test_nvcc_on_path_names_the_first_toolkit(tmp_path):
    first, second = _toolkit(tmp_path / "a", 13000), _toolkit(tmp_path / "b", 12090)
    (first / "bin").mkdir()
    (first / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (first / "bin" / "nvcc").chmod(0o755)
    found = l2ctl_cuda.system_toolkits({"PATH": str(first / "bin"), "CUDA_HOME": str(second)})
    assert [t.version for t in found[:2]] == [13000, 12090]
    assert l2ctl_cuda.find({"PATH": str(first / "bin"), "CUDA_HOME": str(second)}).version == 12090


def test_a_cuda_12_toolkit_too_old_leaves_it_to_pip(tmp_path):
    env = {"PATH": "", "CUDA_HOME": str(_toolkit(tmp_path / "cuda-12.4", 12040))}
    assert l2ctl_cuda.toolkit_of(12, env) is None and l2ctl_cuda.build_requires(env) == l2ctl_cuda.PIP[12]["build"]


@pytest.mark.parametrize("major,layout,cupti", [(12, ("cuda_runtime", "lib"), "cuda_cupti"), (13, ("cu13", "lib"), "cu13")])
def test_the_pip_packages_of_each_major_are_found(monkeypatch, tmp_path, no_system_cuda, major, layout, cupti):
    site = tmp_path / "site"
    runtime = site / "nvidia" / layout[0]
    _runtime(runtime / "include", runtime / layout[1], major * 1000 + 90, cupti=False)
    (site / "nvidia" / cupti / "include").mkdir(parents=True, exist_ok=True)
    (site / "nvidia" / cupti / "include" / "cupti_range_profiler.h").write_text("")
    monkeypatch.setattr(sys, "path", [str(site)])  # only the fake packages: NVIDIA's real ones may be installed here
    assert l2ctl_cuda.pip_cuda(major) is None  # without crt/host_defines.h, which cuda_runtime_api.h includes
    crt = _crt(site / "nvidia" / ("cuda_nvcc" if major == 12 else "cu13") / "include")
    cuda = l2ctl_cuda.find()
    assert cuda.major == major and cuda.include_dirs == list(dict.fromkeys([str(runtime / "include"), str(crt)]))
    assert cuda.cudart_static == str(runtime / "lib" / "libcudart_static.a")
    assert cuda.cupti_include == str(site / "nvidia" / cupti / "include")
    assert l2ctl_cuda.pip_cuda(25 - major) is None  # the other major's headers are not taken for this one


def test_nothing_found_says_what_to_install(monkeypatch, no_system_cuda):
    monkeypatch.setattr(l2ctl_cuda, "pip_cuda", lambda major: None)
    with pytest.raises(LookupError, match="pip install nvidia-cuda-runtime-cu12>=12.9,<13"):
        l2ctl_cuda.find()


@pytest.mark.skipif(tomllib is None, reason="tomllib is Python 3.11's")
def test_one_wheel_no_local_label_and_the_extras_of_each_driver_s_libraries():
    """PyPI refuses a local version label (0.1.0+cu12): the version is plain. [cu12] and [cu13] bring NVRTC and
    CUPTI of each major, as cuda.core's extras do; nothing else is named by a CUDA major."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "+" not in project["version"] and "version" not in project.get("dynamic", [])
    extras = project["optional-dependencies"]
    assert not [name for name in extras if name.startswith(("cu", "ctk")) and name not in ("cu12", "cu13")]
    for major, pin in ((12, "-cu12>=12.9,<13"), (13, ">=13,<14")):
        assert sorted(extras[f"cu{major}"]) == sorted(f"nvidia-cuda-{lib}{pin}" for lib in ("nvrtc", "cupti"))


def test_staging_rewrites_only_what_changed(tmp_path):
    """The staged copy keeps its timestamps while the content is the same, so nothing recompiles when pip
    installs the same headers again at a new path with new timestamps."""
    source = tmp_path / "env" / "include"
    (source / "sub").mkdir(parents=True)
    (source / "a.h").write_text("int a;\n")
    (source / "sub" / "b.h").write_text("int b;\n")
    staged = pathlib.Path(l2ctl_cuda.stage(str(source), str(tmp_path / "stage")))
    os.utime(staged / "a.h", ns=(1, 1))
    os.utime(staged / "sub" / "b.h", ns=(1, 1))
    (source / "sub" / "b.h").write_text("int b2;\n")
    l2ctl_cuda.stage(str(source), str(staged))
    assert (staged / "a.h").stat().st_mtime_ns == 1  # same content: untouched
    assert (staged / "sub" / "b.h").read_text() == "int b2;\n" and (staged / "sub" / "b.h").stat().st_mtime_ns != 1


def test_write_cmake_names_the_staged_paths(monkeypatch, tmp_path, no_system_cuda):
    site = tmp_path / "site"
    _runtime(_crt(site / "nvidia" / "cu13" / "include"), site / "nvidia" / "cu13" / "lib", 13000)
    monkeypatch.setattr(sys, "path", [str(site)])  # only the fake packages: NVIDIA's real ones may be installed here
    out, stage = tmp_path / "cuda.cmake", tmp_path / "stage"
    l2ctl_cuda.write_cmake(str(out), str(stage))
    text = out.read_text()
    assert 'set(L2CTL_CUDA_MAJOR "13")' in text and "the pip packages" in text
    assert f'set(L2CTL_CUDART_STATIC "{stage}/lib/libcudart_static.a")' in text
    assert f'set(L2CTL_CUDA_INCLUDE_DIRS "{stage}/cuda-include")' in text and str(site) not in text.split("SOURCE")[0]
    assert (stage / "cuda-include" / "cuda_runtime_api.h").exists() and (stage / "cuda-include" / "crt").is_dir()


def test_the_backend_keeps_the_build_directory_of_another_environment(monkeypatch, tmp_path):
    skbuild = pytest.importorskip("scikit_build_core.cmake", reason="needs scikit-build-core (the build requirement)")
    import l2ctl_build_backend

    info = tmp_path / "build" / "cu13-cp311-cp311-linux_x86_64" / ".skbuild-info.json"
    info.parent.mkdir(parents=True)
    info.write_text(json.dumps({"source_dir": "/src", "skbuild_path": "/tmp/pip-build-env-old/scikit_build_core"}))
    monkeypatch.chdir(tmp_path)
    l2ctl_build_backend._keep_build_dirs()
    assert json.loads(info.read_text()) == {"source_dir": "/src", "skbuild_path": os.fspath(skbuild.DIR)}
