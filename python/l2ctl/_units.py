"""Byte counts as people read them: the one formatter every table, verdict and message of l2ctl's uses."""

from __future__ import annotations

__all__ = ["KiB", "MiB", "GiB", "format_bytes"]

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30


def format_bytes(nbytes: float) -> str:
    """``nbytes`` in the largest unit it fills (B, KiB, MiB): ``1000 B``, ``1.5 KiB``, ``4.00 MiB``. Never a
    fraction of a larger unit (``0.000953674 MiB``, ``0.00 MiB``), which reads as nothing; past a MiB two
    decimals, as the set-asides and windows of a table line up that way."""
    if abs(nbytes) >= MiB:
        return f"{nbytes / MiB:.2f} MiB"
    if abs(nbytes) >= KiB:
        return f"{nbytes / KiB:.1f} KiB"
    return f"{nbytes:g} B" if isinstance(nbytes, float) else f"{nbytes} B"
