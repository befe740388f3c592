"""Hardware counters: lazy loading and error paths without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

import l2ctl
from l2ctl import _counters, _core
from l2ctl._errors import CuptiError


def test_import_does_not_load_cupti():
    code = "import l2ctl, l2ctl._core as c; print(c.cupti_loaded())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_counters_is_the_context_manager():
    assert l2ctl.counters is _counters.counters
    assert issubclass(l2ctl.CountersUnavailableError, l2ctl.NotSupportedError)


def test_bad_library_path_gives_an_actionable_error():
    if _core.cupti_loaded():
        pytest.skip("libcupti is already loaded in this process")
    with pytest.raises(l2ctl.CountersUnavailableError, match="L2CTL_CUPTI"):
        _counters.load_cupti("/nonexistent/libcupti.so")


def test_find_cupti_honours_the_environment(monkeypatch):
    monkeypatch.setenv("L2CTL_CUPTI", "/opt/custom/libcupti.so.13")
    assert _counters.find_cupti()[0] == "/opt/custom/libcupti.so.13"
    assert _counters.find_cupti()[-1] == "libcupti.so"


def test_find_cupti_prefers_a_newer_drivers_cuda_major(monkeypatch, tmp_path):
    """A CUDA 12 build under a CUDA 13 driver tries CUPTI 13 first (CUPTI 12 read no counters there)."""
    lib = tmp_path / "site" / "nvidia" / "cuda_cupti" / "lib"
    lib.mkdir(parents=True)
    for major in (12, 13):
        (lib / f"libcupti.so.{major}").write_bytes(b"")
    monkeypatch.delenv("L2CTL_CUPTI", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "none"))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    monkeypatch.setattr(_counters._core, "runtime_version", lambda: 12090)
    monkeypatch.setattr(_counters._core, "driver_version", lambda: 13000)
    found = [path for path in _counters.find_cupti() if path.startswith(str(tmp_path))]
    assert found == [str(lib / "libcupti.so.13"), str(lib / "libcupti.so.12")]
    monkeypatch.setattr(_counters._core, "driver_version", lambda: 12080)  # a CUDA 12 driver: the build's own
    found = [path for path in _counters.find_cupti() if path.startswith(str(tmp_path))]
    assert found == [str(lib / "libcupti.so.12"), str(lib / "libcupti.so.13")]


def test_find_cupti_prefers_the_builds_cuda_major(monkeypatch, tmp_path):
    """A CUDA 12 build beside a CUDA 13 toolkit loads the nvidia-cuda-cupti-cu12 wheel's libcupti.so.12 (and a
    CUDA 13 build the cu13 wheel's over a CUDA 12 toolkit's)."""
    own = _counters._core.runtime_version() // 1000
    other = 25 - own
    toolkit = tmp_path / "cuda" / "lib64"
    wheel = tmp_path / "site" / "nvidia" / ("cuda_cupti" if own == 12 else "cu13") / "lib"
    for directory, major in ((toolkit, other), (wheel, own)):
        directory.mkdir(parents=True)
        (directory / f"libcupti.so.{major}").write_bytes(b"")
    monkeypatch.delenv("L2CTL_CUPTI", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setattr(sys, "path", [str(tmp_path / "site")])
    monkeypatch.setattr(_counters._core, "driver_version", lambda: own * 1000)  # a driver of the build's major
    found = [path for path in _counters.find_cupti() if path.startswith(str(tmp_path))]
    assert found == [str(wheel / f"libcupti.so.{own}"), str(toolkit / f"libcupti.so.{other}")]


@pytest.mark.parametrize("code,words", [(35, "NVreg_RestrictProfilingToAdminUsers"), (39, "another profiler"),
                                        (27, "does not support"), (-1, "L2CTL_CUPTI")])
def test_error_hints(code, words):
    err = _counters._unavailable(CuptiError("cuptiProfilerInitialize", code, "boom"))
    assert isinstance(err, l2ctl.CountersUnavailableError) and words in str(err) and "boom" in str(err)


@pytest.mark.parametrize("kwargs", [{"metrics": []}, {"metrics": [""]}, {"metrics": [3]}, {"max_ranges": 0},
                                    {"max_ranges": True}])
def test_argument_validation(kwargs):
    with pytest.raises(ValueError):
        l2ctl.counters(**kwargs)


@pytest.mark.skipif(_core.device_count() > 0, reason="checks the no-GPU error")
def test_no_gpu_error():
    with pytest.raises(l2ctl.NoDeviceError):
        with l2ctl.counters():
            pass


def test_kernel_counters_helpers():
    k = l2ctl.KernelCounters("k", {"l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": 64.0,
                                   "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 4.0})
    assert k.sectors_per_request == 16.0
    assert l2ctl.KernelCounters("k", {}).sectors_per_request is None
    pickled = CuptiError("x", 35, "m")
    import pickle

    assert pickle.loads(pickle.dumps(pickled)).code == 35


def test_top_level_names():
    from l2ctl import tuner

    assert l2ctl.tune is tuner.tune and l2ctl.TunedPolicy is tuner.TunedPolicy
    assert l2ctl.collect is _counters.collect
    assert set(l2ctl.__all__) <= set(dir(l2ctl))
