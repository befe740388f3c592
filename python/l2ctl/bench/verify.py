"""Verification of benchmark outputs: a number is kept only when the output it timed was right."""

from __future__ import annotations

from .._errors import L2ctlError

__all__ = ["VerificationError", "check"]


class VerificationError(L2ctlError, AssertionError):
    """A benchmark's output was wrong; its timing is discarded."""


def check(ok: bool, what: str) -> None:
    """Raise VerificationError naming ``what`` unless ``ok``."""
    if not ok:
        raise VerificationError(f"verification failed: {what}; the timing was discarded")
