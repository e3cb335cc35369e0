"""The documentation: every runnable code block runs, the site's nav lists every page, the README stays short.

A python block is runnable when the line before its opening fence is ``<!-- runnable -->`` (an HTML comment, so
GitHub and MkDocs render the block as ordinary python). The blocks of one page run in order in one namespace, in
a temporary folder, at the small sizes the pages use. Pages that load the shipped real model share one copy of it
(lens_bias never changes a model it is handed); without its wheel they skip, except under CI (CI=true).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import lens_bias

from ..conftest import _real_model_or_skip

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MARK = "<!-- runnable -->"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def runnable_blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, code) of every block marked runnable on a page; a mark not followed by a python fence fails."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks = []
    for i, line in enumerate(lines):
        if line != MARK:  # at the start of a line: an indented example of the mark (contributing.md) is not one
            continue
        fence = lines[i + 1] if i + 1 < len(lines) else ""
        assert fence.strip() == "```python", f"{path.name}:{i + 1}: {MARK} must stand right before a ```python fence"
        end = next(j for j in range(i + 2, len(lines)) if lines[j].strip() == "```")
        blocks.append((i + 3, "\n".join(lines[i + 2 : end])))
    return blocks


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


RUNNABLE = [p for p in PAGES if runnable_blocks(p)]
_ORIGINAL = lens_bias.models.pretrained
_LOADED: dict[Any, Any] = {}


def _shared_pretrained(original):
    """``pretrained`` that loads each model once for all pages."""

    def pretrained(name, *args, **kwargs):
        key = (name, args, tuple(sorted(kwargs.items())))
        if key not in _LOADED:
            _LOADED[key] = original(name, *args, **kwargs)
        return _LOADED[key]

    return pretrained


def test_the_pages_that_teach_the_basics_have_runnable_blocks():
    names = {_name(p) for p in RUNNABLE}
    assert {"README.md", "docs/getting-started.md", "docs/concepts.md", "docs/interventions.md", "docs/sinks.md", "docs/seedprint.md"} <= names


@pytest.mark.parametrize("page", RUNNABLE, ids=_name)
def test_runnable_blocks_run(page, tmp_path, monkeypatch):
    blocks = runnable_blocks(page)
    if any("pretrained(" in code for _, code in blocks):
        _real_model_or_skip("smollm2-135m-instruct")
        shared = _shared_pretrained(_ORIGINAL)
        monkeypatch.setattr(lens_bias.models, "pretrained", shared)
        monkeypatch.setattr(lens_bias, "pretrained", shared)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for line, code in blocks:
        exec(compile(code, f"{_name(page)}:{line}", "exec"), namespace)  # noqa: S102 - the docs' own code


def _nav_pages(node: Any) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for value in node.values() for p in _nav_pages(value)]
    return [p for item in node for p in _nav_pages(item)]


def test_the_nav_lists_every_page_and_only_pages_that_exist():
    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    nav = _nav_pages(config["nav"])
    assert len(nav) == len(set(nav)), "a page is listed twice"
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    notebooks = {f"notebooks/{p.name}" for p in (ROOT / "examples").glob("[0-9][0-9]_*.ipynb")}  # docs/hooks.py adds them
    assert set(nav) == pages | notebooks


def test_readme_fits_on_two_screens_and_keeps_the_set_up_format():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    section = text.split("## Set up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", section, re.S)
    assert commands[0].startswith('pip install "torch==2.13.0" -e ".[dev]"') and commands[1] == "pytest -m readme"
    assert (ROOT / "docs" / "assets").is_dir() and all((ROOT / m).exists() for m in re.findall(r"\]\((docs/assets/[^)]+)\)", text))


def test_readme_reads_in_five_minutes():
    """At most 700 words (the results-file markers are HTML comments, not words); each headline cell at most 40
    words, and each row links to the page that holds its run."""
    text = re.sub(r"<!--.*?-->", "", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    assert len(text.split()) <= 700
    rows = [line for line in text.split("## Headline results", 1)[1].split("\n## ", 1)[0].splitlines() if line.startswith("| ") and "---" not in line]
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert max(len(cell.split()) for cell in cells) <= 40, row
        assert re.search(r"\]\(docs/[^)]+\.md", cells[-1]), row


def test_shipped_text_speaks_of_the_software_only():
    shipped = [ROOT / "README.md", *DOCS.rglob("*.md"), *(ROOT / "examples").glob("*.ipynb"), *(ROOT / "lens_bias").rglob("*.py")]
    for path in shipped:
        text = path.read_text(encoding="utf-8")
        for pattern in (r"\.\./shared/", r"session that wrote", r"was lent to", r"previous release"):
            assert not re.search(pattern, text), f"{_name(path)}: {pattern!r}"
