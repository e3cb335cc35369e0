"""How a section's table reads on the report page: columns in words with their units, the rows that carry the
finding, the key column beside the row's name, and the whole table downloadable as CSV from the page itself.

``to_pandas()`` keeps its short column names for code; the page renames them through the result's own
``column_words``. A section names its ``key_column``: the page shows the rows with its largest values, in table
order, and puts it right after the columns that name a row.
"""

from __future__ import annotations

import html
from typing import Any, Callable

import pandas as pd

from lens_bias.report.viz import gzip_base64

__all__ = ["ROW_WORDS", "words", "table_block", "summary_html", "csv_link", "fmt", "CSV_SCRIPT"]

ROW_WORDS = {"token": "token ID", "token_str": "token", "link": "link of the chain"}
"""The columns that name a row, where their name alone does not say it; every measured column's words are its
result's (``Result.column_words``)."""

_FEW = 4  # a table this many rows longer than asked is shown whole: hiding a few rows saves nothing
# Columns that name a row: they come first, then the section's key column.
_NAMES = ("condition", "link", "component", "layer", "head", "rank", "position", "dim", "token", "token_str", "hook", "row", "col")

CSV_SCRIPT = (
    "<script>\nasync function lensBiasCsv(link) {\n"
    "  const packed = Uint8Array.from(atob(link.dataset.csv), c => c.charCodeAt(0));\n"
    '  const csv = await new Response(new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"))).blob();\n'
    '  const a = document.createElement("a");\n  a.href = URL.createObjectURL(new Blob([csv], {type: "text/csv"}));\n'
    "  a.download = link.dataset.name;\n  a.click();\n  URL.revokeObjectURL(a.href);\n}\n</script>"
)
"""The page's one script for its CSV links: each link holds its table gzipped, unpacked on click."""


def words(column: str, named: Callable[[str], str | None] = lambda column: None) -> str:
    """A column's name in words with its unit: ``named(column)`` (a result's ``column_in_words``), a row name's
    words, else the name with spaces."""
    return named(column) or ROW_WORDS.get(column) or column.replace("_", " ")


def fmt(value: Any) -> str:
    """A number at 4 significant digits; anything else as text (a missing value as a blank)."""
    if isinstance(value, float) and value != value:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.4g}"


def summary_html(text: str) -> str:
    """A section's summary as prose: its first line a paragraph, each indented line below it an item of a list."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    items = "".join(f"<li>{html.escape(line.strip())}</li>" for line in lines[1:])
    return f'<div class="summary"><p>{html.escape(lines[0])}</p>' + (f"<ul>{items}</ul>" if items else "") + "</div>"


def csv_link(table: pd.DataFrame, name: str) -> str:
    """A link that downloads ``table`` (every row, its code column names) as ``name``."""
    packed = gzip_base64(table.to_csv(index=False, float_format="%.6g"))
    return (f'<a class="csv" href="#" data-name="{html.escape(name)}" data-csv="{packed}" onclick="lensBiasCsv(this); return false">'
            f"full table as CSV ({len(table)} rows)</a>")


def _html(table: pd.DataFrame, named: Callable[[str], str | None]) -> str:
    """The table as HTML: headers in words, numbers right-aligned, text left-aligned."""
    numeric = [pd.api.types.is_numeric_dtype(table[c]) and not pd.api.types.is_bool_dtype(table[c]) for c in table.columns]
    head = "".join(f'<th class="{"num" if n else "text"}">{html.escape(words(c, named))}</th>' for c, n in zip(table.columns, numeric))
    body = "".join("<tr>" + "".join(f'<td class="{"num" if n else "text"}">{html.escape(fmt(v))}</td>' for v, n in zip(row, numeric)) + "</tr>"
                   for row in table.itertuples(index=False))
    return f'<table class="dataframe"><tr>{head}</tr>{body}</table>'


def table_block(
    table: pd.DataFrame, *, key: str = "", rows: int = 8, name: str = "table", named: Callable[[str], str | None] = lambda column: None
) -> str:
    """The rows of ``table`` that carry the finding (the ``rows`` largest ``key`` values, in table order; the first
    ``rows`` without a key; all of them when only a few more), columns in words (``named``: the result's
    ``column_in_words``) with the key beside the row names, and the CSV link."""
    table = table.dropna(axis=1, how="all")  # no empty columns (e.g. token strings without a tokenizer)
    shown, note = table, ""
    if len(table) > rows + _FEW:
        if key in table and pd.api.types.is_numeric_dtype(table[key]):
            shown = table.loc[sorted(table[key].nlargest(rows).index)]
            note = f"{rows} of {len(table)} rows: those with the largest {words(key, named)}. "
        else:
            shown = table.head(rows)
            note = f"the first {rows} of {len(table)} rows. "
    first = [c for c in shown.columns if c in _NAMES]
    order = first + ([key] if key in shown.columns and key not in first else [])
    body = _html(shown[order + [c for c in shown.columns if c not in order]], named)
    return f'{body}<p class="note">{html.escape(note)}{csv_link(table, f"{name}.csv")}</p>'
