"""The docs' numbers come from their results files: every page equals what ``docs/render.py`` writes from
``docs/results/``, so a number cannot drift from its run, and a run older than its code says so."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from lens_bias.core.provenance import source_hash

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("docs_render", ROOT / "docs" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


def test_every_page_is_what_its_results_files_render():
    assert render.main(["--check"]) == 0, "run python docs/render.py and commit the pages"


def test_every_results_file_says_where_it_came_from():
    for path in sorted((ROOT / "docs" / "results").glob("*.json")):
        record = json.loads(path.read_text())
        assert {"command", "date", "versions", "machine", "numbers", "depends"} <= set(record), path.name
        assert not re.search(r"(^|\s)/\S", record["command"]), f"{path.name}: a path outside the repository in {record['command']!r}"
        for source in record["depends"]:
            assert (ROOT / source).exists(), f"{path.name} depends on {source}, which is not in the repository"


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    record = {"command": "lens-bias x", "date": "2026-12-05T00:00:00", "machine": "m", "numbers": {"a.b": 0.123456, "n": 3},
              "tables": {"t": {"columns": ["k", "v_mean"], "rows": [["x", 1.5]], "formats": {"v_mean": ".2f"}}},
              "depends": {"docs/render.py": source_hash("docs/render.py")}}
    (tmp_path / "run.json").write_text(json.dumps(record))
    return tmp_path


def test_markers_take_their_numbers_and_tables_from_the_file(results):
    page = ROOT / "docs" / "page.md"
    text = "p̄ <!-- r run.a.b .2f -->old<!-- /r --> of <!-- r run.n -->9<!-- /r -->\n<!-- r-table run.t -->\nstale\n<!-- /r-table -->\n"
    out = render.render(text, {}, page)
    assert "<!-- r run.a.b .2f -->0.12<!-- /r --> of <!-- r run.n -->3<!-- /r -->" in out
    assert "| k | v mean |\n|---|---|\n| x | 1.50 |" in out and "stale" not in out and "older run" not in out  # headers in words
    assert render.render(out, {}, page) == out  # rendering is idempotent


def test_a_run_older_than_its_code_says_so(results):
    record = json.loads((results / "run.json").read_text())
    record["depends"] = {"docs/render.py": "0" * 64}
    (results / "run.json").write_text(json.dumps(record))
    out = render.render("<!-- r-table run.t -->\n<!-- /r-table -->", {}, ROOT / "README.md")
    assert "Measured before the last change to `docs/render.py`: an older run than the code." in out


def test_a_name_the_file_lacks_is_refused(results):
    with pytest.raises(SystemExit, match="no number 'missing'"):
        render.render("<!-- r run.missing -->1<!-- /r -->", {}, ROOT / "README.md")


def test_a_rendered_table_is_rendered_again_when_its_run_changes(results):
    """The provenance line a table carries has code in it (the command); rendering must still find the whole marker."""
    page = ROOT / "docs" / "page.md"
    first = render.render("<!-- r-table run.t -->\n<!-- /r-table -->", {}, page)
    record = json.loads((results / "run.json").read_text())
    record["tables"]["t"]["rows"] = [["x", 2.5]]
    record["command"] = "lens-bias y"
    (results / "run.json").write_text(json.dumps(record))
    again = render.render(first, {}, page)
    assert "| x | 2.50 |" in again and "`lens-bias y`" in again and "1.50" not in again and "lens-bias x" not in again
    assert render.render("`<!-- r run.n -->9<!-- /r -->`", {}, page) == "`<!-- r run.n -->9<!-- /r -->`"  # an example stays


def test_a_source_edited_during_the_run_is_not_recorded_as_the_one_that_ran(tmp_path, monkeypatch):
    """A results file written after a source it depends on was edited mid-run (the process ran the old code) records
    no hash of the new code, so the pages call the run older than the code; an untouched source records its hash."""
    from lens_bias.core import provenance

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    monkeypatch.setattr(provenance, "_IMPORTED", (tmp_path / "b.py").stat().st_mtime + 1)  # the run starts after both were written
    assert provenance.run_hash("pkg", tmp_path) == provenance.source_hash("pkg", tmp_path)
    (tmp_path / "pkg" / "a.py").write_text("x = 3\n")
    os.utime(tmp_path / "pkg" / "a.py", (provenance._IMPORTED + 5, provenance._IMPORTED + 5))  # edited during the run
    assert provenance.run_hash("pkg", tmp_path) == provenance.EDITED_DURING_RUN != provenance.source_hash("pkg", tmp_path)
    assert provenance.run_hash("b.py", tmp_path) == provenance.source_hash("b.py", tmp_path)
