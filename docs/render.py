"""Write every measured number of the README and the docs pages from the results files of ``docs/results/``.

Each results file (``docs/results/NAME.json``) is what one run measured, with where it came from: ``command``,
``date``, ``versions``, ``machine``, ``numbers`` (name -> value), ``tables`` (name -> {"columns": [...], "rows":
[[...], ...]}) and ``depends`` (path -> the sha256 of that source file or folder when the run was made). A page holds
markers where those numbers go; the text between a marker and its end is this script's:

- ``<!-- r NAME.KEY FORMAT -->73.8<!-- /r -->``: one number (FORMAT a Python format spec, e.g. ``.1f``, optional; ``~.3g``
  writes exponents short, 2.36e4; a list writes each element so, comma-separated);
- ``<!-- r-table NAME.TABLE -->`` ... ``<!-- /r-table -->``: a table, then the line that says which run it is from;
- ``<!-- r-sources -->`` ... ``<!-- /r-sources -->``: the results files the page's numbers come from, with their dates
  (the command, the versions and the machine are in each file).

A run whose ``depends`` no longer hash the same is older than the code: its tables say so. ``python docs/render.py``
rewrites the pages; ``python docs/render.py --check`` exits 1 when a page differs from what it would write (CI runs
it through ``tests/acceptance/test_rendered.py``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from lens_bias.core.provenance import source_hash

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# a marker right after a backtick is an example of one (a page that documents them), not a marker
NUMBER = re.compile(r"(?<!`)<!-- r (\w+)\.([\w.]+)(?: ([^ ]+))? -->(.*?)<!-- /r -->", re.S)
TABLE = re.compile(r"(?<!`)<!-- r-table (\w+)\.(\w+) -->\n(.*?)<!-- /r-table -->", re.S)
SOURCES = re.compile(r"(?<!`)<!-- r-sources -->\n(.*?)<!-- /r-sources -->", re.S)


def load(name: str, cache: dict[str, dict[str, Any]]) -> dict[str, Any]:
    if name not in cache:
        path = RESULTS / f"{name}.json"
        if not path.exists():
            raise SystemExit(f"a page names the results file {path.relative_to(ROOT)}, which does not exist")
        cache[name] = json.loads(path.read_text(encoding="utf-8"))
    return cache[name]


def stale(record: dict[str, Any]) -> list[str]:
    """The source paths that changed since the run."""
    return [path for path, digest in record.get("depends", {}).items() if source_hash(path) != digest]


def provenance_line(name: str, record: dict[str, Any], page: Path) -> str:
    """Which run a results file is from (linked from ``page``), and whether the code changed since."""
    link = os.path.relpath(RESULTS / f"{name}.json", page.parent)
    line = f"[`{name}.json`]({link}): `{record['command']}`, {record['date'][:10]}, {record['machine']}."
    changed = stale(record)
    if changed:
        line += f" Measured before the last change to {', '.join(f'`{p}`' for p in changed)}: an older run than the code."
    return line


def cell(value: Any, spec: str | None = None) -> str:
    """``value`` as a page shows it: by ``spec`` (a format spec; ``~`` before one writes exponents short, 2.36e4)."""
    if isinstance(value, list):  # a list of numbers (a model's massive dims): each by the spec
        return ", ".join(cell(v, spec) for v in value)
    if spec and spec.startswith("~"):
        return re.sub(r"e\+?(-?)0*(\d)", r"e\1\2", format(value, spec[1:]))
    if spec:
        return format(value, spec)
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def render_table(name: str, key: str, record: dict[str, Any], page: Path) -> str:
    table = record["tables"][key]
    formats = table.get("formats", {})
    # a column's name as a header: words, not an identifier (in_its_family -> in its family)
    lines = ["| " + " | ".join(c.replace("_", " ") for c in table["columns"]) + " |", "|" + "---|" * len(table["columns"])]
    # a "|" inside a cell (an edit's "max |w|") would end the cell: escaped as the tables write it by hand
    lines += ["| " + " | ".join(cell(v, formats.get(c)).replace("|", "\\|") for c, v in zip(table["columns"], row)) + " |" for row in table["rows"]]
    return "\n".join(lines) + "\n\n*From " + provenance_line(name, record, page) + "*\n"


def render(text: str, cache: dict[str, dict[str, Any]], page: Path) -> str:
    """``text`` (the page at ``page``) with every marker's content written from its results file."""
    def number(m: re.Match[str]) -> str:
        name, key, spec = m.group(1), m.group(2), m.group(3)
        numbers = load(name, cache)["numbers"]
        if key not in numbers:
            raise SystemExit(f"docs/results/{name}.json has no number {key!r}")
        spec_part = f" {spec}" if spec else ""
        return f"<!-- r {name}.{key}{spec_part} -->{cell(numbers[key], spec)}<!-- /r -->"

    def table(m: re.Match[str]) -> str:
        name, key = m.group(1), m.group(2)
        record = load(name, cache)
        if key not in record.get("tables", {}):
            raise SystemExit(f"docs/results/{name}.json has no table {key!r}")
        return f"<!-- r-table {name}.{key} -->\n{render_table(name, key, record, page)}<!-- /r-table -->"

    def sources(m: re.Match[str]) -> str:
        names = sorted({n.group(1) for n in NUMBER.finditer(text)} | {t.group(1) for t in TABLE.finditer(text)})
        parts, older = [], False
        for name in names:
            record = load(name, cache)
            mark = "†" if stale(record) else ""
            older = older or bool(mark)
            parts.append(f"[`{name}`]({os.path.relpath(RESULTS / f'{name}.json', page.parent)}) ({record['date'][:10]}{mark})")
        note = "; † an older run than the code it depends on" if older else ""
        return f"<!-- r-sources -->\nFrom the results files {', '.join(parts)}{note}.\n<!-- /r-sources -->"

    return SOURCES.sub(sources, TABLE.sub(table, NUMBER.sub(number, text)))


def main(argv: list[str]) -> int:
    check, cache, drifted = "--check" in argv, {}, []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        new = render(text, cache, page)
        if new != text:
            drifted.append(str(page.relative_to(ROOT)))
            if not check:
                page.write_text(new, encoding="utf-8")
    if check and drifted:
        sys.stderr.write(f"these pages differ from their results files: {drifted}; run python docs/render.py\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
