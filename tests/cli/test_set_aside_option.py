"""Issue 43, the first hour: the CLI's --set-aside takes what l2ctl.set_aside takes (a size in bytes, max, a fraction
of the max strictly between 0 and 1) and refuses what it refuses, in the same words."""

from __future__ import annotations

import argparse

import pytest

from l2ctl.cli.options import set_aside_size

MiB = 1 << 20


@pytest.mark.parametrize("text,value", [("max", "max"), ("8M", 8 * MiB), ("1", 1), ("0.5", 0.5), (".25", 0.25),
                                        ("1.5M", 3 * MiB // 2)])
def test_the_values_set_aside_takes(text, value):
    assert set_aside_size(text) == value


@pytest.mark.parametrize("text,says", [("1.0", "ambiguous: write 'max'"), ("0.0", "write 0"), ("2.5", "write a size"),
                                       ("lots", "max, or a fraction of the max")])
def test_the_forms_set_aside_refuses(text, says):
    with pytest.raises(argparse.ArgumentTypeError, match=says):
        set_aside_size(text)
