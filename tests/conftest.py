"""Shared fixtures. GPU tests carry the ``gpu`` marker and skip, with the reason, where no GPU that can
persist L2 is present; every GPU test is checked afterwards for leaving the device as it found it."""

from __future__ import annotations

import pytest

import l2ctl
from l2ctl import _backend, _core, _registry
from l2ctl.testing import FakeBackend, FakeDevice

# Every fast path of the registry is checked against its general plan in the tests.
_registry.CHECK_FAST_PATHS = True


def _gpu_skip_reason() -> str | None:
    if _core.device_count() == 0:
        return f"no CUDA GPU on this machine ({_core.device_count_error()})"
    try:
        info = l2ctl.device_info()
    except Exception as exc:  # pragma: no cover - depends on the machine
        return f"device query failed: {exc}"
    if not info.supports_persistence:
        return f"{info.name}: {info.unsupported_reason}"
    return None


GPU_SKIP_REASON = _gpu_skip_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if GPU_SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=GPU_SKIP_REASON)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fake() -> FakeBackend:
    """A simulated H100 in place of the CUDA extension."""
    with FakeBackend.installed(FakeDevice.h100()) as backend:
        yield backend


@pytest.fixture
def gpu_state():
    """Records the device limit at the start of a GPU test and asserts it is unchanged at the end;
    streams registered with ``gpu_state.watch(stream)`` must end with the window they started with."""

    class Watch:
        def __init__(self) -> None:
            self.device = l2ctl.device_info().index
            self.limit = l2ctl.get_set_aside(self.device)
            self.streams: list[tuple[object, l2ctl.AccessPolicyWindow]] = []

        def watch(self, stream: object) -> object:
            self.streams.append((stream, l2ctl.get_window(stream)))
            return stream

    assert _backend.current() is _core, "a GPU test must run on the real backend"
    watch = Watch()
    yield watch
    assert l2ctl.get_set_aside(watch.device) == watch.limit, "the test left the set-aside limit changed"
    for stream, window in watch.streams:
        if getattr(stream, "closed", False):
            continue
        assert l2ctl.get_window(stream) == window, "the test left a stream window changed"


@pytest.fixture(autouse=True)
def _every_gpu_test_restores_the_device(request):
    """Every GPU test gets the gpu_state check (the limit, and the windows of the streams it watches)."""
    if request.node.get_closest_marker("gpu") is not None and GPU_SKIP_REASON is None:
        request.getfixturevalue("gpu_state")
    yield
