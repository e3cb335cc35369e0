"""A benchmark's tables as a results file, which ``docs/render.py`` renders into ``docs/performance.md``."""

from __future__ import annotations

import sys
from typing import Any, Mapping, Sequence

import pandas as pd

from lens_bias.core.provenance import command_line, tables_record, write_results


def write_tables(path: str, tables: Mapping[str, pd.DataFrame], keys: Mapping[str, Sequence[str]], formats: Mapping[str, str],
                 depends: Sequence[str], numbers: Mapping[str, Any] | None = None) -> None:
    """Write ``tables`` (each keyed by its ``keys`` columns, cells written with ``formats``) to the results file ``path``,
    with the hashes of the sources in ``depends`` and this process's command."""
    write_results(path, tables_record(tables, keys, formats, depends, command_line(sys.argv[0]), numbers=numbers))
