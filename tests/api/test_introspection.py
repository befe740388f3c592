"""What a user's tools see of the package: dir(l2ctl) lists the public names only, and persist (a compiled
type, which carries no signature of its own) has the signature its compiled code takes."""

from __future__ import annotations

import inspect
import pydoc

import l2ctl
from l2ctl import _core, _persist


def test_dir_lists_the_public_names_and_no_helper():
    names = dir(l2ctl)
    assert not {"Any", "TYPE_CHECKING", "annotations", "importlib", "os", "sys"} & set(names)
    assert [n for n in names if n.startswith("_") and not n.endswith("__")] == []
    assert set(l2ctl.__all__) <= set(names) and "__version__" in names
    assert all(hasattr(l2ctl, n) for n in names)


def test_persist_has_the_signature_the_compiled_type_takes():
    """Its one declaration, _prepare's parameters, which the compiled type takes by name (src/persist_type.hpp: the
    registration checked the two lists, and found the positional ones in the signature)."""
    sig = inspect.signature(l2ctl.persist)
    assert sig == inspect.signature(_persist._prepare).replace(return_annotation=inspect.Signature.empty)
    assert set(sig.parameters) == set(getattr(_core, "_planner").PERSIST_ARGUMENTS)
    assert [p.name for p in sig.parameters.values() if p.default is inspect.Parameter.empty] == ["stream", "buf"]
    assert [p.name for p in sig.parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD] == ["stream", "buf",
                                                                                               "hit_ratio"]
    assert sig.parameters["set_aside"].default == "auto" and sig.parameters["reset_on_exit"].default is True


def test_the_signatures_defaults_are_the_compiled_ones(fake):
    """A scope made with every keyword at the signature's default is the scope made without them."""
    sig = inspect.signature(l2ctl.persist)
    keywords = {p.name: p.default for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY}
    buf = l2ctl.DeviceBuffer(1 << 20)
    with l2ctl.Stream() as s:
        with l2ctl.persist(s, buf, **keywords) as a:
            first = (a.window, a.set_aside)
        with l2ctl.persist(s, buf) as b:
            assert (b.window, b.set_aside) == first


def test_help_shows_the_parameters():
    text = pydoc.render_doc(l2ctl.persist, renderer=pydoc.plaintext)
    assert "hit_ratio" in text and "set_aside: 'LimitRequest' = 'auto'" in text
