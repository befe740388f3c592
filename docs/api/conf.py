"""Sphinx configuration of l2ctl's API reference, generated from the docstrings.

Build (from the repository root; tests/package/test_api_reference.py runs both):

    sphinx-build -W --keep-going -b html docs/api <out>
    sphinx-build -W --keep-going -b doctest docs/api <out>
"""

from __future__ import annotations

import os

# The simulator stands in for the GPU, so that the reference builds, and its examples run, on any machine.
os.environ.setdefault("L2CTL_SIMULATE", "h100")

project = "l2ctl"
author = "l2ctl authors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.doctest", "sphinx.ext.viewcode"]
html_theme = "alabaster"
exclude_patterns = ["_build"]
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Signatures say the types; the descriptions stay as the docstrings wrote them.
autodoc_typehints = "signature"
# Type hints name private modules (l2ctl._window, ...) and optional libraries: not every one is a page here.
nitpicky = False
# The doctests run in one fresh simulated process; each page's group starts from no scopes.
doctest_global_setup = "import l2ctl"
# Only the ``.. doctest::`` blocks of these pages run. The ``>>>`` examples inside docstrings (persist's, Timer's)
# use names the reader supplies (a stream, a buffer, their kernels) and stay illustrations.
doctest_test_doctest_blocks = ""
