"""Sphinx configuration for the meshbus documentation.

Build with ``sphinx-build -W -b html docs docs/_build/html``: warnings are
errors, so a broken reference or docstring fails the build (tests/test_docs.py
runs exactly that). The API reference is autodoc of the installed package.
"""

from __future__ import annotations

import meshbus

project = "meshbus"
author = "meshbus contributors"
copyright = "meshbus contributors"
release = meshbus.__version__
version = ".".join(release.split(".")[:2])

# No intersphinx: builds must work without a network.
extensions = ["sphinx.ext.autodoc"]

exclude_patterns = ["_build"]
root_doc = "index"
nitpicky = False

# The docstrings are the reference: keep them in source order, grouped as written.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"

html_theme = "alabaster"
html_title = f"meshbus {release}"
html_theme_options = {
    "description": "An embeddable, plugin-based message bus for Python",
    "fixed_sidebar": True,
}
