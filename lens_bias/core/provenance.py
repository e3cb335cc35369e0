"""Where a number came from: the command, the date, the versions and the machine a results file records with it."""

from __future__ import annotations

import hashlib
import json
import math
import platform
import re
import shlex
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import pandas as pd
import torch

__all__ = ["provenance", "versions", "machine", "command_line", "source_hash", "run_hash", "results_record", "tables_record", "table_of", "numbers_of", "write_results"]

# the packages whose versions a number depends on
PACKAGES = ("lens_bias", "torch", "transformer-lens", "transformers")


def versions() -> dict[str, str]:
    """The installed versions of ``PACKAGES``, and Python's."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return {**found, "python": platform.python_version()}


def machine() -> str:
    """The machine in words: the architecture, torch's threads and the GPU where one is present."""
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"
    threads = torch.get_num_threads()
    return f"{platform.machine()}, {threads} torch thread{'' if threads == 1 else 's'}{gpu}"


def provenance(command: str | None = None) -> dict[str, Any]:
    """The record a results file starts with: ``command`` (default: this process's ``lens-bias`` command line), the
    UTC date, :func:`versions` and :func:`machine`."""
    return {"command": command if command is not None else " ".join(["lens-bias", *sys.argv[1:]]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "versions": versions(), "machine": machine()}


REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout an editable install runs from


# when this process read lens_bias's sources (the CLI and the examples import this module first): a source edited
# after it did not run, whatever its hash says when the results are written
_IMPORTED = time.time()
EDITED_DURING_RUN = "edited during the run"


def command_line(script: Union[str, Path], args: Sequence[str] | None = None, *, module: str | None = None) -> str:
    """The shell command that runs ``script`` with ``args`` (default: this process's arguments), the script named
    relative to the repository (a results file names no machine's paths) and each argument quoted; with ``module``,
    ``python -m module`` instead (a script that imports from the checkout's tests).

    >>> command_line(REPOSITORY / "examples" / "calibration.py", ["--pairs", "100", "--results", "a b.json"])
    "python examples/calibration.py --pairs 100 --results 'a b.json'"
    """
    rest = sys.argv[1:] if args is None else list(args)
    if module is not None:
        head = ["python", "-m", module]
    else:
        path = Path(script).resolve()
        head = ["python", str(path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else Path(path.name))]
    return " ".join([*head, *map(shlex.quote, rest)])


def _files(path: str, root: Path) -> list[Path]:
    target = root / path
    return [target] if target.is_file() else sorted(target.rglob("*.py"))


def source_hash(path: str, root: Path = REPOSITORY) -> str:
    """sha256 of a source file, or of a folder's ``.py`` files in name order (``path`` relative to ``root``); a
    results file keeps it for each source its numbers depend on, so a page can say when the code changed since."""
    digest = hashlib.sha256()
    for file in _files(path, root):
        digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()


def run_hash(path: str, root: Path = REPOSITORY) -> str:
    """:func:`source_hash` of the source as this process ran it: ``"edited during the run"`` (which no later hash
    equals, so the pages call the run older than the code) when a file of it changed after the process started."""
    if any(file.stat().st_mtime > _IMPORTED for file in _files(path, root)):
        return EDITED_DURING_RUN
    return source_hash(path, root)


def results_record(numbers: dict[str, Any], tables: dict[str, dict[str, Any]], depends: Sequence[str], command: str | None = None) -> dict[str, Any]:
    """A results file's content (``docs/render.py`` writes the pages from it): :func:`provenance`, the named
    ``numbers``, the ``tables`` ({"columns", "rows", "formats"}) and the hash of each source in ``depends``."""
    return {**provenance(command), "numbers": numbers, "tables": tables, "depends": {path: run_hash(path) for path in depends}}


def tables_record(tables: Mapping[str, pd.DataFrame], keys: Mapping[str, Sequence[str]], formats: Mapping[str, str], depends: Sequence[str],
                  command: str, numbers: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """:func:`results_record` of named DataFrames: each one's cells as numbers ``NAME.KEY.COLUMN`` (:func:`numbers_of`,
    keyed by its ``keys`` columns) and as a table, every column named in ``formats`` written with that spec; ``numbers``
    adds named numbers of its own."""
    found = dict(numbers or {})
    for name, frame in tables.items():
        found.update(numbers_of(frame, keys[name], name))
    rendered = {name: table_of(frame, {c: f for c, f in formats.items() if c in frame}) for name, frame in tables.items()}
    return results_record(found, rendered, depends, command)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def table_of(frame: pd.DataFrame, formats: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A DataFrame as a results file's table: its columns, its rows (NaN as None) and each column's format spec."""
    rows = [[None if isinstance(v, float) and math.isnan(v) else v for v in row] for row in frame.astype(object).values.tolist()]
    return {"columns": [str(c) for c in frame.columns], "rows": rows, "formats": dict(formats or {})}


def numbers_of(frame: pd.DataFrame, keys: Sequence[str], prefix: str) -> dict[str, Any]:
    """Every cell of ``frame`` as a named number, ``PREFIX.KEY.COLUMN`` (the ``keys`` columns' values, lower case,
    non-alphanumerics as ``_``): what a page quotes as ``<!-- r NAME.PREFIX.KEY.COLUMN -->``."""
    numbers = {}
    for row in frame.to_dict(orient="records"):
        key = ".".join(_slug(str(row[k])) for k in keys)
        numbers.update({f"{prefix}.{key}.{_slug(str(column))}": value for column, value in row.items() if column not in keys})
    return numbers


def write_results(path: Union[str, Path], record: Mapping[str, Any]) -> Path:
    """Write a results file (numpy scalars as plain numbers)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, default=lambda o: o.item() if hasattr(o, "item") else str(o)) + "\n")
    return path
