"""A report rendered: the offline page (:func:`page`) and the text summary (:func:`text`), laid out by the report's
:class:`~lens_bias.report.layout.Layout`."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Mapping, Union

from lens_bias.analyses.base import Result
from lens_bias.core.errors import MissingExtra
from lens_bias.core.figures import figure_png
from lens_bias.report.data import ReportData
from lens_bias.report.page import CSV_SCRIPT, summary_html, table_block
from lens_bias.report.viz import save_html, view_slot

__all__ = ["page", "text"]


def page(report: ReportData, path: Union[str, Path], *, views: Mapping[str, Any] | None = None, rows: int = 8) -> Path:
    """One page that renders offline, laid out like a paper's figure page.

    A trained model's page opens with the anatomy of its sink (the chain figure, with the causal verdicts under
    the links they test when the sink attribution ran), then what removes the sink, the attention of its
    strongest sink heads, and the other numbers that apply to a trained model; a random init's opens with its
    headline numbers. Each section then shows its figure (PNG inlined) beside its summary and the ``rows`` rows
    of its table that carry the finding, with the whole table downloadable as CSV, and its circuitsvis views.
    ``views`` adds your own views (e.g. ``viz.attention_view``) at the end; the text summary closes the page,
    folded. circuitsvis' bundle is on the page once, gzipped.

    Returns:
        The path written.
    """
    m, layout = report.model, report.layout
    esc = html.escape
    headline = report.headline_table()
    table = (
        '<table class="headline"><tr><th>section</th><th>number</th><th>value</th></tr>'
        + "".join(f"<tr><td>{esc(a) if i == 0 or a != headline[i - 1][0] else ''}</td><td>{esc(b)}</td><td>{esc(c)}</td></tr>"
                  for i, (a, b, c) in enumerate(headline))
        + "</table>"
    )
    shown: list[tuple[str, Result]] = [(name, report.sections[name]) for name in layout.page_order(list(report.sections))]
    first = [name for name in layout.first if name in report.sections]
    anatomy = report.anatomy() if layout.shows_anatomy else None
    if anatomy is not None:
        shown.insert(0, ("anatomy", anatomy))
    parts = [f'<p class="meta">{esc(m.architecture or m.family)}, d_model {m.d_model}, {m.n_layers} layers × {m.n_heads} heads, '
             f"V {m.d_vocab} ({layout.short}; TL {esc(str(m.tl_version))}, {esc(str(m.device))}/{esc(str(m.dtype))}); "
             f"inputs: {esc(report.inputs.describe())}</p>", CSV_SCRIPT]
    blocks, no_plot, drawn = [], None, {}
    for name, result in shown:
        figure = ""
        if result.has_figure and no_plot is None:
            caption = result.plot_caption or result.heading or name
            try:
                figure = f"<figure>{figure_png(result.plot(), alt=esc(caption))}<figcaption>{esc(caption)}</figcaption></figure>"
            except MissingExtra as err:  # no matplotlib: tables and views only
                no_plot = str(err)
        summary = f"<div>{summary_html(result.page_summary())}</div>" if result.page_summary() else ""
        part = (f"<section><h2>{esc(result.heading or name)}</h2><div class=\"row\">{figure}{summary}</div>"
                + table_block(result.to_pandas(), key=result.key_column, rows=rows, name=name, named=result.column_in_words))
        if result.has_view:  # each view made once: its slot here, drawn by save_html
            made = result.views()
            drawn.update(made)
            part += "".join(view_slot(caption) for caption in made)
        blocks.append(part + "</section>")
    if not layout.trained:
        parts.append(f"<h2>{layout.headline_heading}</h2>{table}")
    elif headline:  # after the sink's own parts
        blocks.insert(len(first) + (anatomy is not None), f"<section><h2>{layout.headline_heading}</h2>{table}</section>")
    parts += blocks
    if no_plot is not None:
        parts.append(f"<p>{esc(no_plot)}</p>")
    parts.append(f"<section><details><summary>text summary</summary><pre>{esc(text(report))}</pre></details></section>")
    title = f"lens_bias report: {m.name}" if m.name else "lens_bias report"
    return save_html({**drawn, **(views or {})}, path, title=title, body="\n".join(parts))


def text(report: ReportData) -> str:
    """The human summary: the model and inputs, then (for a trained model) the anatomy, then each section's summary."""
    m, i = report.model, report.inputs
    pos = f"{m.positional_embedding} positions"
    mlp = "attention-only" if m.attn_only else f"{'gated ' if m.gated_mlp else ''}{m.act_fn} MLP"
    kind = report.layout.kind
    header = (
        f"lens_bias report of {kind}: {m.architecture or m.family}, d_model {m.d_model}, {m.n_layers} layers × {m.n_heads} heads, "
        f"{mlp}, {m.normalization} norm, {pos}, V {m.d_vocab} ({m.family}, TL {m.tl_version}, {m.device}/{m.dtype})\n"
        + (f"model: {m.name}\n" if m.name else "")
        + f"inputs: {i.describe()}"
    )
    if report.interventions:
        header += "\nmeasured under: " + " + ".join(d.get("type", "?") for d in report.interventions)
    header += "".join(f"\nskipped {name}: {why}" for name, why in report.skipped.items())
    anatomy = report.anatomy() if report.layout.shows_anatomy else None
    return "\n\n".join([header] + ([anatomy.summary()] if anatomy is not None else []) + [r.summary() for r in report.sections.values()])
