"""Sphinx configuration for the django-exclusive-jobs documentation.

Build with ``bash scripts/docs.sh`` (warnings are errors). Nothing is fetched from the
network: no intersphinx, no extension that downloads assets.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import django_exclusive_jobs  # noqa: E402

project = "django-exclusive-jobs"
author = "django-exclusive-jobs developers"
copyright = "django-exclusive-jobs developers"
release = django_exclusive_jobs.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

myst_enable_extensions = ["colon_fence", "deflist"]
# Lets pages link to a section with [text](page.md#section-title); a wrong anchor is a
# warning, and warnings fail the build.
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"undoc-members": False}

html_theme = "furo"
html_title = "django-exclusive-jobs"
html_static_path = ["_static"]
html_theme_options = {"navigation_with_keys": True}
