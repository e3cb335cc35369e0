"""The documentation's references: every relative link resolves in the repository as GitHub shows it (the site's own
links are checked by ``mkdocs build --strict``), and every ``lens_bias.`` name the pages mention imports (the
``lens-bias`` commands and flags they show are parsed by ``test_documented_commands.py``)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted(ROOT.glob("lens_bias/**/README.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
NAME = re.compile(r"`[^`]*?\b(lens_bias(?:\.\w+)+)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


# a page that shows how to add an experiment names the module it would add
EXAMPLE_NAMES = {"lens_bias.experiments.depth"}


def _text(heading: str) -> str:
    return re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).strip().lower()


def _anchors(path: Path) -> set[str]:
    """The anchors of the page's headings that GitHub and the site give alike: GitHub turns each space into a hyphen,
    the site (Python-Markdown's toc) collapses runs of spaces and hyphens into one, so a heading whose two differ
    (``a × b``) cannot be linked on both."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        github = re.sub(r"[^\w\- ]", "", _text(heading)).replace(" ", "-")
        site = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", _text(heading)).strip())
        if github == site:
            anchors.add(github)
    return anchors


def _relative_links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    links = [a or b for a, b in LINK.findall(text)]
    return [link for link in links if not re.match(r"[a-z]+:", link)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_in_the_repository(page):
    broken = []
    for link in _relative_links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link} (no {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path})")
        elif anchor and path.suffix == ".md" and not anchor.startswith("lens_bias.") and anchor not in _anchors(path):
            # (an anchor that names an object is the API reference's, which mkdocs build --strict checks)
            broken.append(f"{link} (no heading #{anchor} in {path.name})")
    assert not broken, f"{page.relative_to(ROOT)}: {broken}"


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_api_name_the_page_mentions_exists(page):
    names = set(NAME.findall(page.read_text(encoding="utf-8")))
    missing = sorted(name for name in names - EXAMPLE_NAMES if not _resolves(name))
    assert not missing, f"{page.relative_to(ROOT)} names {missing}, which do not import"
