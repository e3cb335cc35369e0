"""The one table renderer of the experiments: a DataFrame as a GitHub markdown table (no tabulate dependency)."""

from __future__ import annotations

from typing import Any, Mapping

import pandas as pd

__all__ = ["markdown_table"]


def markdown_table(table: pd.DataFrame, formats: Mapping[str, str] | None = None) -> str:
    """``table`` as a GitHub markdown table: floats to 4 significant digits unless ``formats`` gives a column its
    own format spec (``{"p": ".2g"}``); every other value as ``str``.

    >>> print(markdown_table(pd.DataFrame({"seed": [0], "tau": [0.123456], "p": [0.00123]}), formats={"p": ".2g"}))
    | seed | tau | p |
    |---|---|---|
    | 0 | 0.1235 | 0.0012 |
    """
    specs = [(formats or {}).get(str(column)) for column in table.columns]

    def cell(value: Any, spec: str | None) -> str:
        if spec is not None:
            return format(value, spec)
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v, spec) for v, spec in zip(row, specs)) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)
