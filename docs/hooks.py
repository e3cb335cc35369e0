"""MkDocs hooks: the API sources and the example notebooks, laid out for the build.

* ``lens_bias.hooks`` and ``lens_bias.analyses`` live in the top-level folders ``hooks/`` and ``analyses/`` (the
  package maps them, see pyproject.toml). The API reference reads the sources statically, so the build lays
  a ``lens_bias`` tree of links under ``build/docs_api/`` where they sit as subpackages.
* The notebooks of ``examples/`` become pages under ``notebooks/``. The pages link them where they are in the
  repository (``../examples/01_born_biased.ipynb``), so the links work on GitHub; the build points them at the pages. ``tests/acceptance/test_examples.py`` writes each notebook
  it executes to ``build/notebooks/``; the build renders that executed copy where there is one (CI runs the tests
  before the build) and the stripped source otherwise, so the build itself executes nothing.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
API_SRC = ROOT / "build" / "docs_api"
EXECUTED = ROOT / "build" / "notebooks"


@event_priority(100)  # before mkdocstrings reads its search paths
def on_config(config):
    package = API_SRC / "lens_bias"
    if API_SRC.exists():
        shutil.rmtree(API_SRC)
    package.mkdir(parents=True)
    for entry in (ROOT / "lens_bias").iterdir():
        if entry.name != "__pycache__":
            os.symlink(entry, package / entry.name)
    for sub in ("hooks", "analyses"):
        os.symlink(ROOT / sub, package / sub)
    return config


@event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files, config):
    # mkdocs-jupyter reads a page's file through src_dir/src_uri, so the notebooks are laid out as real files
    src_dir = ROOT / "build" / "docs_notebooks"
    (src_dir / "notebooks").mkdir(parents=True, exist_ok=True)
    for source in sorted((ROOT / "examples").glob("[0-9][0-9]_*.ipynb")):
        executed = EXECUTED / source.name
        path = executed if executed.exists() and executed.stat().st_mtime >= source.stat().st_mtime else source
        shutil.copyfile(path, src_dir / "notebooks" / source.name)
        files.append(File(f"notebooks/{source.name}", str(src_dir), config["site_dir"], config["use_directory_urls"]))
    return files


_NOTEBOOK_LINK = re.compile(r"\]\((?:\.\./)+examples/(\d\d_\w+\.ipynb)\)")


def on_page_markdown(markdown, page, config, files):
    # a link to a notebook in examples/ (which works on GitHub) becomes a link to its page under notebooks/
    up = "../" * page.file.src_uri.count("/")
    return _NOTEBOOK_LINK.sub(lambda m: f"]({up}notebooks/{m.group(1)})", markdown)
