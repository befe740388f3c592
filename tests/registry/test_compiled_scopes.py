"""The compiled scope objects (src/persist_scope.cpp, src/scope_entries.cpp): every with block l2ctl gives enters and ends in compiled code;
torch and CuPy objects are resolved once per object while they live, and again when a tensor's memory moved; an
interrupt in the Python that an entry calls after the device changed (a warning's display) ends the scope before
the entry returns; the arguments' checks are those of the Python scope they replaced."""

from __future__ import annotations

import warnings

import pytest

import l2ctl
from l2ctl import SetAsideTaxWarning, _registry, graph
from l2ctl._limit import SetAside
from l2ctl._targets import ScopedWindow

MiB = 1 << 20


@pytest.mark.parametrize("cls", [l2ctl.Persist, ScopedWindow, SetAside, l2ctl.Stream, graph.Capture])
def test_every_with_block_enters_and_ends_in_compiled_code(cls):
    # persist's scope also starts and stops outside a with block (an app's lifetime), and ends in its finalizer
    for name in ("__enter__", "__exit__") + (("start", "stop", "close") if cls is l2ctl.Persist else ()):
        method = getattr(cls, name)
        assert not hasattr(method, "__code__") and not hasattr(getattr(method, "__func__", None), "__code__"), (
            f"{cls.__name__}.{name} is Python: an interrupt could land between the device's change and its record")


def test_torch_objects_are_resolved_once_while_they_live(fake, torch_like):
    s, first, second = l2ctl.Stream(), l2ctl.DeviceBuffer(2 * MiB), l2ctl.DeviceBuffer(MiB)
    stream, tensor = torch_like.Stream(s), torch_like.Tensor(first)
    for _ in range(5):
        with l2ctl.persist(stream, tensor, 0.5, set_aside=None, reset_on_exit=False) as p:
            assert l2ctl.get_window(s).base_ptr == first.ptr and p.window.num_bytes == 2 * MiB
    assert (stream.reads, tensor.resolved) == (1, 1)
    tensor.point_at(second)  # the same object, other memory: its pointer and size tell
    with l2ctl.persist(stream, tensor, 0.5, set_aside=None, reset_on_exit=False) as p:
        assert l2ctl.get_window(s).base_ptr == second.ptr and p.window.num_bytes == MiB
    assert (stream.reads, tensor.resolved) == (2, 2)  # that scope took the full path for all its arguments
    with l2ctl.persist(stream, tensor, 0.5, set_aside=None, reset_on_exit=False):
        pass
    assert (stream.reads, tensor.resolved) == (2, 2)
    assert not fake.windows


def test_a_tensor_moved_to_memory_l2ctl_cannot_use_is_checked_again(fake, torch_like):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    tensor = torch_like.Tensor(buf)
    with l2ctl.persist(s, tensor, 0.5):
        pass
    gone = l2ctl.DeviceBuffer(MiB)
    tensor.point_at(gone)
    gone.free()  # the tensor now names freed memory: its pointer check runs again and refuses it
    with pytest.raises(ValueError, match="host memory"):
        with l2ctl.persist(s, tensor, 0.5):
            pass
    assert not fake.windows and l2ctl.budget().scopes == ()


def test_an_interrupt_in_an_entrys_warning_ends_the_scope_before_the_entry_returns(fake, monkeypatch):
    s, big = l2ctl.Stream(), l2ctl.DeviceBuffer(64 * MiB)
    limit = fake.device(0).limit

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # as a signal's handler raises it while the warning is shown

    monkeypatch.setattr(warnings, "showwarning", interrupted)
    with warnings.catch_warnings():
        warnings.simplefilter("always", SetAsideTaxWarning)
        with pytest.raises(KeyboardInterrupt):
            with l2ctl.persist(s, big, None):  # "auto" kept at the tax-free limit: a warning after the change
                pytest.fail("the block must not run")
    # Back at once, not at the next l2ctl call: nothing live, the window gone, the limit as it was.
    assert not _registry.live_scopes(0)
    assert not fake.windows and fake.device(0).limit == limit


@pytest.mark.parametrize("call, error, message", [
    (lambda s, b: l2ctl.persist(s, b, 1.5), ValueError, "hit_ratio"),
    (lambda s, b: l2ctl.persist(s, b, True), TypeError, "hit_ratio"),
    (lambda s, b: l2ctl.persist(s, b, set_aside="lots"), ValueError, "set_aside"),
    (lambda s, b: l2ctl.persist(s, b, reset_on_exit=1), TypeError, "bools"),
    (lambda s, b: l2ctl.persist(s, b, offset=2 * MiB), ValueError, "offset"),
    (lambda s, b: l2ctl.persist(s, b, num_bytes=0), ValueError, "num_bytes"),
    (lambda s, b: l2ctl.persist(s, b, 0.5, policy=l2ctl.Policy()), ValueError, "either policy"),
    (lambda s, b: l2ctl.persist(s, b, colour="red"), TypeError, "unexpected keyword argument 'colour'"),
    (lambda s, b: l2ctl.persist(s, b, 0.5, hit_ratio=0.5), TypeError, "multiple values for argument 'hit_ratio'"),
    (lambda s, b: l2ctl.persist(s), TypeError, "missing required argument 'buf'"),
    (lambda s, b: l2ctl.persist(s, b, 0.5, "auto"), TypeError, "positional arguments"),
    (lambda s, b: l2ctl.persist("s", b), TypeError, "stream"),
    (lambda s, b: l2ctl.persist(s, 0x1000), TypeError, "ambiguous"),
])
def test_arguments_are_refused_as_the_python_scope_refused_them(fake, call, error, message):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with pytest.raises(error, match=message):
        call(s, buf)
    assert not fake.windows


def test_a_persist_object_can_be_initialised_again_only_when_not_live(fake):
    s, a, b = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB), l2ctl.DeviceBuffer(2 * MiB)
    p = l2ctl.persist(s, a, 0.5)
    p.__init__(s, b, 0.25)  # type: ignore[misc]
    with p:
        assert p.window.base_ptr == b.ptr and p.window.hit_ratio == 0.25
        with pytest.raises(RuntimeError, match="live"):
            p.__init__(s, a, 0.5)  # type: ignore[misc]
    assert not p.active and p.window.base_ptr == b.ptr  # what was applied stays readable after the end


def test_an_interrupt_as_a_capture_begins_leaves_the_stream_not_capturing(fake, monkeypatch):
    s = l2ctl.Stream()
    begin = fake.begin_capture

    def cut_short(stream, mode):  # the capture began, then the call was interrupted before it returned
        begin(stream, mode)
        raise KeyboardInterrupt

    monkeypatch.setattr(fake, "begin_capture", cut_short)
    with pytest.raises(KeyboardInterrupt):
        with graph.capture(s):
            pytest.fail("the block must not run")
    assert not fake.is_capturing(s.handle)
    monkeypatch.setattr(fake, "begin_capture", begin)
    with graph.capture(s) as g:
        fake.launch_fake_kernel(s.handle)
    assert len(g.kernel_nodes()) == 1


def test_a_capture_whose_block_raised_leaves_no_graph_and_a_usable_stream(fake):
    s = l2ctl.Stream()
    with pytest.raises(ZeroDivisionError):
        with graph.capture(s) as g:
            fake.launch_fake_kernel(s.handle)
            1 / 0
    assert not fake.is_capturing(s.handle)
    with pytest.raises(RuntimeError, match="capture has not ended"):
        g.handle


def test_a_malformed_reference_of_an_l2ctl_object_is_refused_not_read_past(fake):
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    ref, s._ref = s._ref, (s.handle,)  # type: ignore[assignment]  # private state broken from outside
    try:
        with pytest.raises(TypeError, match="StreamRef"):
            l2ctl.persist(s, buf, 0.5)
    finally:
        s._ref = ref


def test_a_raw_range_is_checked_where_the_window_lies(fake):
    """(ptr, nbytes) that runs past its allocation: a window inside the allocation is taken, one past it refused
    (as the Python scope did: the check covers the window, since nothing says the rest of the range is real)."""
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with l2ctl.persist(s, (buf.ptr, 2 * MiB), 0.5, num_bytes=MiB) as p:
        assert p.window.num_bytes == MiB
    with pytest.raises(ValueError, match="runs past its allocation"):
        with l2ctl.persist(s, (buf.ptr, 2 * MiB), 0.5):
            pass
    assert not fake.windows


def test_a_torch_stream_read_through_its_cuda_stream_protocol_is_remembered(fake):
    """torch's streams implement __cuda_stream__ (read first): they are torch's all the same, one stream for life."""
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)

    class TorchStream:
        __module__ = "torch.cuda.streams"
        reads = 0

        def __cuda_stream__(self) -> tuple[int, int]:
            TorchStream.reads += 1
            return (0, s.handle)

    stream = TorchStream()
    for _ in range(3):
        with l2ctl.persist(stream, buf, 0.5, set_aside=None):
            assert l2ctl.get_window(s).base_ptr == buf.ptr
    assert TorchStream.reads == 1
