"""How a section's table reads on the report page: columns in words with their units, the rows that carry the
finding, the key column beside the row's name, and the whole table downloadable as CSV from the page itself.

``to_pandas()`` keeps its short column names for code; the page renames them through :data:`WORDS` (and the
patterns after it). A section names its ``key_column``: the page shows the rows with its largest values, in table
order, and puts it right after the columns that name a row.
"""

from __future__ import annotations

import html
import re
from typing import Any, Mapping

import pandas as pd

from lens_bias.report.viz import gzip_base64

__all__ = ["WORDS", "words", "table_block", "summary_html", "csv_link", "fmt", "CSV_SCRIPT"]

WORDS = {
    "layer": "layer", "head": "head", "rank": "rank", "position": "position", "dim": "dim", "sequence": "sequence", "token": "token ID",
    "token_str": "token", "condition": "condition", "link": "link of the chain", "verdict": "verdict", "edit": "what was done",
    "first_token_share": "first-token share α_0", "alpha_0": "first-token share α_0", "value": "|h| (mean over sequences)",
    "median": "median |h| of the block", "massive": "massive (> 100 and ≥ 1000× median)", "weight": "weight",
    "weight_rank": "rank of |weight| in its matrix", "input_spike": "input spike max |x|", "output_spike": "output spike max |y|",
    "contribution": "|x · w| at the spike", "share": "share of the output spike", "row": "row (residual dim)", "col": "col (MLP unit)",
    "top_unit": "top unit", "top_unit_writes": "top unit's write into the massive dim", "massive_dim_value": "massive dim mean |h_0|",
    "dominance_at": "disparity max/mean |x_0|", "dominance_elsewhere": "disparity at other positions", "resid_top1": "largest |h|",
    "resid_median": "median |h|", "resid_max_over_median": "largest / median |h| (×)", "mlp_in_max": "MLP input max |x|",
    "mlp_out_max": "MLP output max |y|", "std_out": "std across sequences", "r_out": "r_t = std_t / std_0", "r_out_sqrt_t": "r_t · √(t+1)",
    "p_bar": "mean probability p̄", "ratio_to_uniform": "V · p̄ (× uniform)", "mean_logit": "mean logit",
    "argmax_count": "inputs where it is the argmax", "hook": "hook", "inter": "cos between sequences (inter)",
    "intra": "cos within a sequence (intra)", "energy_share": "energy along the seed direction", "cos_to_seed": "cos to the seed direction",
    "component": "component", "shared_energy": "shared energy", "fluctuating_energy": "fluctuating energy",
    "shared_fraction": "shared share of the energy", "seed_projection": "along the seed direction",
    "cumulative_cos_to_seed": "cumulative cos to the seed", "cumulative_shared_norm": "cumulative shared norm", "mean": "mean final state",
    "softmax_mean": "softmax mean (T 10)", "softmax_std": "softmax spread", "sink_0": "Sink_0 (%)", "diff_in_se": "change in Sink_0 (SE)",
    "disparity": "disparity max/mean |x_0| (max over layers)", "perplexity": "perplexity", "ppl_ratio": "perplexity (× unedited)",
}
"""Column → words with units, for every section's table on the page; :func:`words` adds the numbered ones."""

_PATTERNS = [
    (re.compile(r"sink_rate_(\d+)"), r"Sink_\1 (% of sequences, α > ε)"),
    (re.compile(r"sink_(\d+)_diff_in_se"), r"change in Sink_\1 (SE)"),
    (re.compile(r"sink_(\d+)"), r"Sink_\1 (%)"),
    (re.compile(r"norm_ratio_(\d+)"), r"‖h_\1‖ / median ‖h_t‖"),
    (re.compile(r"r_z_head(\d+)"), r"r_t of head \1 before W_O"),
]
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


def words(column: str) -> str:
    """A column's name in words with its unit (its own name where there is no entry)."""
    if column in WORDS:
        return WORDS[column]
    for pattern, replacement in _PATTERNS:
        if pattern.fullmatch(column):
            return pattern.sub(replacement, column)
    return column.replace("_", " ")


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


def _html(table: pd.DataFrame, names: Mapping[str, str]) -> str:
    """The table as HTML: headers in words, numbers right-aligned, text left-aligned."""
    numeric = [pd.api.types.is_numeric_dtype(table[c]) and not pd.api.types.is_bool_dtype(table[c]) for c in table.columns]
    head = "".join(f'<th class="{"num" if n else "text"}">{html.escape(names.get(c) or words(c))}</th>' for c, n in zip(table.columns, numeric))
    body = "".join("<tr>" + "".join(f'<td class="{"num" if n else "text"}">{html.escape(fmt(v))}</td>' for v, n in zip(row, numeric)) + "</tr>"
                   for row in table.itertuples(index=False))
    return f'<table class="dataframe"><tr>{head}</tr>{body}</table>'


def table_block(table: pd.DataFrame, *, key: str = "", rows: int = 8, name: str = "table", names: Mapping[str, str] | None = None) -> str:
    """The rows of ``table`` that carry the finding (the ``rows`` largest ``key`` values, in table order; the first
    ``rows`` without a key; all of them when only a few more), columns in words with the key beside the row names
    (``names`` overrides :data:`WORDS` for this table), and the CSV link."""
    table = table.dropna(axis=1, how="all")  # no empty columns (e.g. token strings without a tokenizer)
    shown, note = table, ""
    if len(table) > rows + _FEW:
        if key in table and pd.api.types.is_numeric_dtype(table[key]):
            shown = table.loc[sorted(table[key].nlargest(rows).index)]
            note = f"{rows} of {len(table)} rows: those with the largest {words(key)}. "
        else:
            shown = table.head(rows)
            note = f"the first {rows} of {len(table)} rows. "
    first = [c for c in shown.columns if c in _NAMES]
    order = first + ([key] if key in shown.columns and key not in first else [])
    body = _html(shown[order + [c for c in shown.columns if c not in order]], names or {})
    return f'{body}<p class="note">{html.escape(note)}{csv_link(table, f"{name}.csv")}</p>'
