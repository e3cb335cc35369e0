"""Seeing it: circuitsvis views (attention with the sink, preferred tokens, positional spread), self-contained HTML
pages, and matplotlib figures.

circuitsvis views are ``RenderedHTML`` objects: in Jupyter they render through circuitsvis' own ``_repr_html_``
(which falls back to the inlined bundle offline). ``save_html`` writes a page that renders offline: it uses each
view's ``local_src`` (the ~1.3 MB bundle inlined) and puts the bundle on the page once, however many views.
``str(view)`` loads the bundle from a CDN instead and does not render offline.

Figures need matplotlib (``pip install "lens-bias[plot]"``); every ``plot_*`` returns a ``matplotlib.figure.Figure``
made without pyplot, so no display backend is touched.
"""

from __future__ import annotations

import base64
import html
import io
import re
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import pandas as pd
import torch
from torch import Tensor

from .adapter import ModelAdapter, Probe
from .errors import LensBiasError

__all__ = [
    "attention_view", "preferred_tokens_view", "variance_view", "save_html", "page_html", "view_slot", "figure_png",
    "plot_contraction", "plot_positional_variance", "plot_token_preference", "plot_lineage", "plot_sinks",
]

_BUNDLE = re.compile(r'<div id="(?P<id>[^"]+)"[^>]*/>\s*<script crossorigin type="module">(?P<bundle>.*?)CircuitsVis\.render\((?P<call>.*)\)\s*</script>\s*$', re.S)


# ---- circuitsvis views -------------------------------------------------------------------------------------


def _token_labels(model: Any, ids: Sequence[int]) -> list[str]:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        try:
            return [tokenizer.decode([i]) for i in ids]
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode single IDs: fall back to numbers
            pass
    return [str(i) for i in ids]


def attention_view(
    model: Any,
    tokens: Tensor,
    *,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    token_strings: Sequence[str] | None = None,
) -> Any:
    """circuitsvis ``attention_heads`` of one sequence; head names carry α_0, the first token's mean attention.

    Args:
        model: a TransformerLens model (read only, hooks scoped).
        tokens: one sequence ``[T]`` or ``[1, T]`` of token IDs.
        layers: layers to show (default: all).
        heads: heads to show in each layer (default: all).
        token_strings: labels of the tokens (default: the model's tokenizer, else the IDs).

    Returns:
        A circuitsvis ``RenderedHTML``.
    """
    from circuitsvis.attention import attention_heads

    from .analyses.sinks import key_importance

    tokens = tokens if tokens.ndim == 2 else tokens[None]
    if tokens.shape[0] != 1:
        raise LensBiasError(f"attention_view shows one sequence; got {tokens.shape[0]} (pass tokens[i])")
    adapter = ModelAdapter(model)
    layers = list(range(adapter.info.n_layers)) if layers is None else list(layers)
    heads = list(range(adapter.info.n_heads)) if heads is None else list(heads)
    probes = [Probe(f"blocks.{layer}.attn.hook_pattern", "pattern", lambda x: x) for layer in layers]
    kept = adapter.collect(tokens, probes, progress=False)
    patterns, names = [], []
    for layer, probe in zip(layers, probes):
        pattern = kept[probe.key][0]  # [head, q, k]
        alpha0 = key_importance(pattern)[:, 0]
        for head in heads:
            patterns.append(pattern[head])
            names.append(f"L{layer}H{head} α0={alpha0[head]:.2f}")
    labels = list(token_strings) if token_strings is not None else _token_labels(model, tokens[0].tolist())
    return attention_heads(attention=torch.stack(patterns), tokens=labels, attention_head_names=names)


def preferred_tokens_view(result: Any, top: int = 40) -> Any:
    """circuitsvis ``colored_tokens`` of the ``top`` most preferred tokens, coloured by log10(V·p̄).

    Args:
        result: a :class:`~lens_bias.analyses.token_preference.TokenPreferenceResult`.
        top: how many tokens.
    """
    from circuitsvis.tokens import colored_tokens

    p_bar = result.p_bar.double()
    values, ids = p_bar.topk(min(top, p_bar.numel()))
    labels = [result.token_strings[i] if result.token_strings else str(i) for i in ids.tolist()]
    return colored_tokens(tokens=labels, values=torch.log10(values * p_bar.numel()).float().tolist())


def variance_view(result: Any, layer: int = 0) -> Any:
    """circuitsvis ``colored_tokens`` over positions coloured by r_t = std_t / std_0 of one layer's attention output.

    Args:
        result: a :class:`~lens_bias.analyses.positional_variance.PositionalVarianceResult`.
        layer: which layer.
    """
    from circuitsvis.tokens import colored_tokens

    r = result.r_out[layer]
    return colored_tokens(tokens=[f"t{t}" for t in range(len(r))], values=r.tolist(), min_value=0.0, max_value=1.0)


def view_slot(name: str) -> str:
    """A marker for ``page_html``'s ``body``: the view called ``name`` is drawn there instead of after the body."""
    return f"<!--lens_bias view: {html.escape(name)}-->"


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1240px;padding:0 1em;color:#222} "
    "h1{margin-bottom:.2em} .meta{color:#555;margin-top:0} table{border-collapse:collapse;font-size:13px} "
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right} th{background:#f3f3f3} "
    "td:first-child,th:first-child{text-align:left} table.headline td:nth-child(2){text-align:left} "
    ".row{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start} .row>figure{margin:0;flex:0 1 auto} "
    ".row img{max-width:100%} .row>div{flex:1 1 360px;min-width:0;overflow-x:auto} figcaption{font-size:13px;color:#555} "
    ".summary{white-space:pre-wrap;font-size:13px;color:#333;margin-bottom:.6em} details{margin:.6em 0} "
    "summary{cursor:pointer;color:#225} section{border-top:1px solid #ddd;margin-top:1.5em}"
)


def page_html(views: Union[Mapping[str, Any], Sequence[Any]] = (), *, title: str = "lens_bias", body: str = "") -> str:
    """One self-contained HTML page: ``body`` (your HTML), then every view, with the circuitsvis bundle inlined once.

    A view whose :func:`view_slot` marker is in ``body`` is drawn at the marker; the others follow the body.
    """
    named = dict(views) if isinstance(views, Mapping) else {f"view {i}": v for i, v in enumerate(views)}
    bundle, blocks, calls = None, [], []
    for name, view in named.items():
        match = _BUNDLE.search(getattr(view, "local_src", ""))
        if match is None:
            raise LensBiasError(f"{name!r} is not a circuitsvis RenderedHTML (no local_src with the bundle)")
        bundle = bundle or match["bundle"]
        block = f'<h3>{html.escape(name)}</h3>\n<div id="{match["id"]}" style="margin: 15px 0;"></div>'
        if view_slot(name) in body:
            body = body.replace(view_slot(name), block)
        else:
            blocks.append(block.replace("<h3>", "<h2>").replace("</h3>", "</h2>"))
        calls.append(f"CircuitsVis.render({match['call']});")
    scripts = "" if bundle is None else f"<script>{bundle}</script>\n<script>\n" + "\n".join(calls) + "\n</script>"
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head>\n"
        f"<body>\n<h1>{html.escape(title)}</h1>\n{body}\n" + "\n".join(blocks) + f"\n{scripts}\n</body></html>\n"
    )


def save_html(views: Union[Mapping[str, Any], Sequence[Any], Any], path: Union[str, Path], *, title: str = "lens_bias", body: str = "") -> Path:
    """Write views (one, a list, or ``{heading: view}``) to a page that renders offline; returns the path."""
    if hasattr(views, "local_src"):
        views = [views]
    path = Path(path)
    path.write_text(page_html(views, title=title, body=body), encoding="utf-8")
    return path


# ---- matplotlib figures ------------------------------------------------------------------------------------


def _figure(width: float = 6.0, height: float = 4.0) -> Any:
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise LensBiasError('plots need matplotlib: pip install "lens-bias[plot]"') from err
    return Figure(figsize=(width, height), layout="constrained")


def figure_png(fig: Any) -> str:
    """A figure as a base64 PNG ``<img>`` tag, for HTML pages."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    return f'<img alt="figure" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def plot_contraction(result: Any) -> Any:
    """Inter- and intra-sequence cosine per layer: one line per condition of an ablation table, or one model's."""
    fig = _figure(9, 3.5)
    ax_inter, ax_intra = fig.subplots(1, 2, sharex=True)
    table = result.to_pandas()
    if "condition" not in table:
        table = table.assign(condition="model")
    for name, rows in table.groupby("condition", sort=False):
        ax_inter.plot(range(len(rows)), rows.inter, marker="o", label=name)
        ax_intra.plot(range(len(rows)), rows.intra, marker="o", label=name)
        labels = list(rows.layer)
    step = -(-len(labels) // 12)  # at most ~12 labels: deep models' layer names would overlap
    shown = list(range(0, len(labels), step))
    shown[-1] = len(labels) - 1  # the last ("final") is always labelled
    for ax, name in ((ax_inter, "inter-sequence cosine"), (ax_intra, "intra-sequence cosine")):
        ax.set_xticks(shown, [labels[i] for i in shown])
        ax.set_xlabel("layer")
        ax.set_title(name)
    ax_intra.legend(fontsize=7)
    return fig


def plot_positional_variance(result: Any, layers: Sequence[int] | None = None) -> Any:
    """r_t against t + 1 on log–log axes, per layer, with the (t+1)^-1/2 reference line."""
    fig = _figure()
    ax = fig.subplots()
    r = result.r_out
    t = torch.arange(1, r.shape[1] + 1).float()
    for layer in range(r.shape[0]) if layers is None else layers:
        ax.loglog(t, r[layer], marker=".", label=f"layer {layer}")
    ax.loglog(t, t**-0.5, "k--", label="(t+1)^-1/2")
    ax.set_xlabel("position t + 1")
    ax.set_ylabel("std_t / std_0")
    ax.legend(fontsize=7)
    return fig


def plot_token_preference(result: Any) -> Any:
    """The sorted V·p̄ curve on a log axis: how many orders of magnitude separate favourite and least favourite."""
    fig = _figure()
    ax = fig.subplots()
    p_bar = result.p_bar.double()
    ax.semilogy(torch.sort(p_bar * p_bar.numel(), descending=True).values.numpy())
    ax.axhline(1.0, color="k", linestyle="--", label="uniform")
    ax.set_xlabel("token rank")
    ax.set_ylabel("V · p̄")
    ax.legend()
    return fig


def plot_lineage(curve: pd.DataFrame) -> Any:
    """log10 p of SeedPrint (init vs each checkpoint) along training steps."""
    fig = _figure()
    ax = fig.subplots()
    ax.plot(curve.step, curve.log10_p, marker="o")
    ax.axhline(-2.0, color="k", linestyle="--", label="α = 0.01")
    ax.set_xlabel("training step")
    ax.set_ylabel("log10 p (init vs checkpoint)")
    ax.legend()
    return fig


def _integer_ticks(ax: Any, n_rows: int, n_cols: int, most: int = 16) -> None:
    """Integer ticks on a heatmap's cells (every k-th where there are many), not matplotlib's fractional ones."""
    ax.set_xticks(range(0, n_cols, -(-n_cols // most)))
    ax.set_yticks(range(0, n_rows, -(-n_rows // most)))


def plot_sinks(result: Any, position: int = 0, eps: float | None = None) -> Any:
    """Sink rate of one key position as a layer × head heatmap."""
    fig = _figure()
    ax = fig.subplots()
    rate = result.rate_by_head(position, eps)
    image = ax.imshow(rate.numpy(), vmin=0, vmax=100, cmap="viridis", aspect="auto")
    _integer_ticks(ax, *rate.shape)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(f"Sink_{position} (%) at ε {result.eps if eps is None else eps}")
    fig.colorbar(image, ax=ax)
    return fig
