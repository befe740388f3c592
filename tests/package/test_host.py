"""The compiled layer reads l2ctl's Python by name only, and every name is checked when the Host is registered
(issue 44, item 1): persist's arguments (one declaration: _persist._prepare's parameters) and the fields of the
records it reads (the Request _prepare returns, StreamRef, BufferRef, Target, Policy), and the private attributes
of l2ctl's objects, declared once in l2ctl._host.Names with the classes that carry each. Each check is fed a
planted difference to show that it fails, naming what differs."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, NamedTuple, Optional, TypedDict

import pytest

import l2ctl
from l2ctl import _core, _host, _interop, _persist
from l2ctl.testing import FakeBackend

planner = getattr(_core, "_planner")


def _register(**change: Any) -> None:
    """The registration, given the Host in force with ``change``: a check it fails raises before "registered
    already" (the registration keeps nothing until every check passed)."""
    given = dataclasses.replace(_host.host, **change)
    planner.register_host(given)


def test_the_host_in_force_passes_every_check_and_is_kept_once():
    with pytest.raises(RuntimeError, match="registered already"):
        _register()


def test_persist_s_arguments_are_prepare_s_parameters_in_any_order():
    assert set(planner.PERSIST_ARGUMENTS) == set(inspect.signature(_persist._prepare).parameters)

    def reordered(buf, stream, *, clamp=False, strict=True, policy=None, share=False, reset_on_exit=True,  # noqa
                  set_aside="auto", miss_prop=1, hit_prop=2, offset=0, num_bytes=None, hit_ratio=None): ...

    with pytest.raises(RuntimeError, match="registered already"):  # no order to keep: the checks pass
        _register(prepare=reordered)


def _without(name: str) -> Any:
    params = [p for p in inspect.signature(_persist._prepare).parameters.values() if p.name != name]
    namespace: dict[str, Any] = {}
    exec(f"def prepare({', '.join(p.name if p.default is p.empty else f'{p.name}=None' for p in params)}): ...",
         namespace)
    return namespace["prepare"]


def test_a_prepare_that_lacks_an_argument_or_takes_another_is_refused():
    with pytest.raises(TypeError, match=r"Host\.prepare: persist's argument clamp is not a parameter"):
        _register(prepare=_without("clamp"))

    def extra(stream, buf, hit_ratio=None, *, num_bytes=None, offset=0, hit_prop=2, miss_prop=1,  # noqa
              set_aside="auto", reset_on_exit=True, share=False, policy=None, strict=True, clamp=False, color=0): ...

    with pytest.raises(TypeError, match=r"Host\.prepare: its parameter color is no argument of persist"):
        _register(prepare=extra)


def test_records_lacking_a_field_the_compiled_layer_reads_are_refused():
    class Ref(NamedTuple):
        handle: int
        device: Optional[int] = None

    @dataclasses.dataclass(frozen=True)
    class Policy:
        hit_ratio: Optional[float] = None
        enabled: bool = True

    fields = {k: v for k, v in _persist.Request.__annotations__.items() if k != "clamp"}
    Request = TypedDict("Request", fields)  # type: ignore[misc]
    for change, error in [({"stream_ref_type": Ref}, r"Host\.stream_ref_type: no field owner"),
                          ({"buffer_ref_type": Ref}, r"Host\.buffer_ref_type: no field ptr"),
                          ({"target_type": Ref}, r"Host\.target_type: no field slots"),
                          ({"policy_type": Policy}, r"Host\.policy_type: no field set_aside"),
                          ({"request_type": Request}, r"Host\.request_type: no field clamp")]:
        with pytest.raises(TypeError, match=error):
            _register(**change)


def test_a_name_missing_from_names_is_refused():
    class Names(_host.Names):
        pass

    Names.dirty = None  # type: ignore[assignment]  # no longer a str
    with pytest.raises(TypeError, match=r"l2ctl\._host\.Names\.dirty: missing"):
        _register(names=Names)


def test_names_are_checked_against_the_classes_that_carry_them():
    assert _host.Names.ref == "_ref" and _host.Names.scope == "_scope"

    class Carrier:
        _declared: int

    assert _host._carried("_declared", Carrier) == "_declared"
    with pytest.raises(TypeError, match="Carrier declares no _renamed"):
        _host._carried("_renamed", Carrier)


def test_the_compiled_scope_reads_the_names_it_was_given():
    """Every private name the compiled layer reads of an l2ctl object comes from Names: an l2ctl Stream's closed
    state, a scoped window's entry and a graph's capture, through their compiled entries."""
    with FakeBackend.installed():
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(1 << 20)
        with l2ctl.scoped_window(s, l2ctl.AccessPolicyWindow.for_buffer(buf, 0.5)):
            assert l2ctl.get_window(s).hit_ratio == 0.5
        with l2ctl.graph.capture(s) as g:
            pass
        assert g.handle
        p = l2ctl.persist(s, buf, 0.5)
        s.close()
        with pytest.raises(ValueError, match="the stream is closed"):
            p.start()


def test_stream_and_buffer_references_are_read_by_field_name():
    """The compiled scope reads StreamRef and BufferRef by field name (their positions found at registration), so
    a reference of another type is refused, not read by position."""
    assert getattr(_interop.StreamRef, "_fields")[:2] == ("handle", "device")
    with FakeBackend.installed():
        s, buf = l2ctl.Stream(), l2ctl.DeviceBuffer(1 << 20)

        class Faked:  # an object whose stream reference is a plain tuple
            def _l2ctl_stream_ref(self) -> Any:
                return (s.handle, 0, "int", None)

        with pytest.raises(TypeError, match="a stream reference is an l2ctl StreamRef"):
            l2ctl.persist(Faked(), buf, 0.5)  # type: ignore[arg-type]
