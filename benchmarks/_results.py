"""A benchmark's tables as a results file, which ``docs/render.py`` renders into ``docs/performance.md``."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from lens_bias.core.provenance import REPOSITORY, tables_record, write_results


def command_line(argv: Sequence[str] | None = None) -> str:
    """This process's command, the script named relative to the repository (a results file names no machine's paths)."""
    script, *rest = sys.argv if argv is None else argv
    path = Path(script).resolve()
    shown = path.relative_to(REPOSITORY) if path.is_relative_to(REPOSITORY) else Path(path.name)
    return " ".join(["python", str(shown), *map(shlex.quote, rest)])


def write_tables(path: str, tables: Mapping[str, pd.DataFrame], keys: Mapping[str, Sequence[str]], formats: Mapping[str, str],
                 depends: Sequence[str], numbers: Mapping[str, Any] | None = None) -> None:
    """Write ``tables`` (each keyed by its ``keys`` columns, cells written with ``formats``) to the results file ``path``,
    with the hashes of the sources in ``depends`` and this process's command."""
    write_results(path, tables_record(tables, keys, formats, depends, command_line(), numbers=numbers))
