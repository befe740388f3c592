"""The compiled persist object (src/persist_scope.cpp, `_core._planner.Persist`) under what Python code can do to
it: foreign objects it remembers must not be kept alive by it nor taken for what they are not, an entry whose
Python parts (a graph's predicate, a warning's display, a target's callback) end, re-enter or re-initialise the
object stays consistent, and malformed uses raise instead of crashing the interpreter. The crashes run in a
child process, so that a regression fails one test rather than the whole run."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest

import l2ctl
from l2ctl import _registry

MiB = 1 << 20


class CallbackTarget:
    """A target on one stream whose `changed` (called after the entry and after the end) runs `hook` once."""

    def __init__(self, stream: l2ctl.Stream) -> None:
        self.stream = stream
        self.hook = None

    def _l2ctl_target(self) -> _registry.Target:
        return _registry.Target(0, (_registry.stream_slot(self.stream.handle),), self, changed=self.changed)

    def changed(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()


def run_child(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter on a simulated H100 (names: l2ctl, _registry, fake, MiB, warnings)."""
    prelude = textwrap.dedent("""
        import warnings
        import l2ctl
        from l2ctl import _registry
        from l2ctl.testing import FakeBackend, FakeDevice
        MiB = 1 << 20
        with FakeBackend.installed(FakeDevice.h100()) as fake:
        """)
    body = textwrap.indent(textwrap.dedent(code), "    ")
    package = str(Path(l2ctl.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (package, os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-c", prelude + body], capture_output=True, text=True, timeout=120,
                          env=env)


def test_the_objects_a_scope_resolved_are_freed_with_their_last_reference(fake, torch_like):
    # The table of resolved objects held each one through the owner field of its StreamRef/BufferRef: a tensor
    # given to persist once kept its (GPU) memory until 1024 other objects had been resolved.
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    tensor, stream = torch_like.Tensor(buf), torch_like.Stream(s)
    with l2ctl.persist(stream, tensor, 0.5) as p:
        assert p._scope.owner == (stream, tensor)
    with l2ctl.persist(stream, tensor, 0.5) as p:  # from the table this time: the owners are still the objects
        assert p._scope.owner == (stream, tensor)
    dead_tensor, dead_stream = weakref.ref(tensor), weakref.ref(stream)
    del tensor, stream, p
    gc.collect()
    assert dead_tensor() is None, "the resolved-object table keeps a tensor alive"
    assert dead_stream() is None, "the resolved-object table keeps a stream alive"
    assert not fake.windows


def test_a_remembered_tensor_is_no_stream_and_a_remembered_stream_no_buffer(fake, torch_like):
    # One table by address: an object remembered as a buffer was taken as a stream (its pointer as the handle,
    # its size as the device) and a stream as a buffer (reading fields a StreamRef does not have).
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    tensor, stream = torch_like.Tensor(buf), torch_like.Stream(s)
    with l2ctl.persist(stream, tensor, 0.5):
        pass
    with pytest.raises(TypeError, match="cannot use a TorchLikeTensor as a stream"):
        l2ctl.persist(tensor, buf, 0.5)
    with pytest.raises(TypeError, match="cannot use a TorchLikeStream as a device buffer"):
        l2ctl.persist(s, stream, 0.5)
    assert not fake.windows


@pytest.mark.parametrize("offset", [2**64, -(2**64)])
def test_an_offset_too_large_for_a_long_long_is_refused_as_the_python_scope_refused_it(fake, offset):
    # The short path read it with PyLong_AsLongLong and left its OverflowError set: SystemError.
    s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    with pytest.raises(ValueError, match="offset"):
        l2ctl.persist(s, buf, 0.5, offset=offset)


def test_a_persist_object_never_initialised_is_refused_at_entry():
    # Persist.__new__ alone left the buffer's reference NULL, and __enter__ read it: a segmentation fault.
    r = run_child("""
        p = l2ctl.Persist.__new__(l2ctl.Persist)
        try:
            p.__enter__()
        except RuntimeError as error:
            print("refused:", error)
        assert not fake.windows and not _registry.live_scopes(0)
        """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: this persist scope was not initialised" in r.stdout


def test_a_warning_display_that_ends_the_scope_and_fails_leaves_nothing_live():
    # The entry's end after a failed warning read the object's live record, already ended by the display: a NULL
    # dereference.
    r = run_child("""
        s, big = l2ctl.Stream(), l2ctl.DeviceBuffer(64 * MiB)
        p = l2ctl.persist(s, big, None)  # "auto" kept at the tax-free limit: a warning after the change

        def display(*args, **kwargs):
            p.__exit__(None, None, None)
            raise RuntimeError("the display failed")

        warnings.showwarning = display
        warnings.simplefilter("always")
        try:
            with p:
                raise AssertionError("the block must not run")
        except RuntimeError as error:
            print("raised:", error)
        assert not p.active and not _registry.live_scopes(0) and not fake.windows
        """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "raised: the display failed" in r.stdout


def test_reinitialising_a_persist_object_while_it_is_entered_is_refused():
    # A graph's predicate runs inside the entry; __init__ called there replaced the references the entry had
    # borrowed (the buffer's owner, freed with its BufferRef): a use after free.
    r = run_child("""
        from l2ctl import graph

        class ArrayLike:  # resolved at every scope: only the persist object holds it
            def __init__(self, ptr, nbytes):
                self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1",
                                                 "version": 3}

        s, lut, other = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB), l2ctl.DeviceBuffer(MiB)
        with graph.capture(s) as g:
            fake.launch_fake_kernel(s.handle)
        p = None

        def predicate(kernel):
            p.__init__(s, other, 0.5)
            return True

        p = l2ctl.persist(g.select(predicate), ArrayLike(lut.ptr, MiB), 0.5)
        try:
            with p:
                print("entered with owners", p._scope.owner)
        except RuntimeError as error:
            print("refused:", error)
        assert not p.active and not _registry.live_scopes(0) and not fake.windows
        """)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "refused: this persist scope is being entered" in r.stdout


def test_a_scope_entered_again_while_its_end_calls_back_stays_the_objects(fake):
    # The end cleared the object's live record after the target's callback (Python, where another thread may run
    # too) had entered the object again: the new scope stayed live with no object to end it.
    s, lut = l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    target = CallbackTarget(s)
    p = l2ctl.persist(target, lut, 0.5, set_aside=None)
    p.__enter__()
    target.hook = p.__enter__
    p.__exit__(None, None, None)
    assert p.active and len(_registry.live_scopes(0)) == 1
    p.__exit__(None, None, None)
    assert not p.active and not _registry.live_scopes(0) and not fake.windows


class CurrentStreamProxy:
    """An object whose __cuda_stream__ names whichever stream it is set to (as a proxy of a current stream does)."""

    def __init__(self, stream: l2ctl.Stream) -> None:
        self.stream = stream

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.stream.handle)


def test_a_cuda_stream_protocol_object_is_read_again_at_every_scope(fake):
    # Remembered by address like a torch stream, its first answer stood for every later scope: the window went on
    # the stream it named before, which may since have been closed and its handle reused.
    first, second, buf = l2ctl.Stream(), l2ctl.Stream(), l2ctl.DeviceBuffer(MiB)
    proxy = CurrentStreamProxy(first)
    with l2ctl.persist(proxy, buf, 0.5) as p:
        assert p.stream == first.handle
    proxy.stream = second
    with l2ctl.persist(proxy, buf, 0.5) as p:
        assert p.stream == second.handle
        assert l2ctl.get_window(second).base_ptr == buf.ptr and l2ctl.get_window(first).empty
    assert not fake.windows
