"""Seeing it: the attention of single heads with the sink named (:func:`attention_view`), and self-contained HTML
pages of any circuitsvis views (:func:`save_html`). Each report section draws its own figure (``result.plot()``)
and view (``result.show()``).

circuitsvis views are ``RenderedHTML`` objects: in Jupyter they render through circuitsvis' own ``_repr_html_``
(which falls back to the inlined bundle offline). ``save_html`` writes a page that renders offline: it uses each
view's ``local_src`` and puts circuitsvis' ~1.3 MB bundle on the page once, however many views, gzipped (~0.5 MB in
base64) and unpacked by the browser's own ``DecompressionStream``. ``str(view)`` loads the bundle from a CDN instead
and does not render offline.
"""

from __future__ import annotations

import base64
import gzip
import html
import re
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import torch
from torch import Tensor

from lens_bias.analyses import sink_heads
from lens_bias.analyses.sinks import key_importance
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.probes import Probe

__all__ = ["attention_view", "save_html", "page_html", "view_slot", "gzip_base64"]

_BUNDLE = re.compile(r'<div id="(?P<id>[^"]+)"[^>]*/>\s*<script crossorigin type="module">(?P<bundle>.*?)CircuitsVis\.render\((?P<call>.*)\)\s*</script>\s*$', re.S)


# ---- circuitsvis views -------------------------------------------------------------------------------------


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

    tokens = tokens if tokens.ndim == 2 else tokens[None]
    if tokens.shape[0] != 1:
        raise LensBiasError(f"attention_view shows one sequence; got {tokens.shape[0]} (pass tokens[i])")
    adapter = ModelAdapter.of(model)
    layers = list(range(adapter.info.n_layers)) if layers is None else list(layers)
    heads = list(range(adapter.info.n_heads)) if heads is None else list(heads)
    probes = [Probe(f"blocks.{layer}.attn.hook_pattern", "pattern", lambda x: x) for layer in layers]
    kept = adapter.collect(tokens, probes, progress=False)
    windows = adapter.windows
    patterns, names = [], []
    for layer, probe in zip(layers, probes):
        pattern = kept[probe.key][0]  # [head, q, k]
        alpha0 = key_importance(pattern, windows[layer])[:, 0]
        for head in heads:
            patterns.append(pattern[head])
            names.append(f"L{layer}H{head} α0={alpha0[head]:.2f}")
    labels = list(token_strings) if token_strings is not None else sink_heads.token_strings(model, tokens[0].tolist())
    return attention_heads(attention=torch.stack(patterns), tokens=labels, attention_head_names=names)


def view_slot(name: str) -> str:
    """A marker for ``page_html``'s ``body``: the view called ``name`` is drawn there instead of after the body."""
    return f"<!--lens_bias view: {html.escape(name)}-->"


_STYLE = (
    "body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1240px;padding:0 1em;color:#222} "
    "h1{margin-bottom:.2em} .meta{color:#555;margin-top:0} table{border-collapse:collapse;font-size:13px} "
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right} th{background:#f3f3f3} .text{text-align:left} "
    "td:first-child,th:first-child{text-align:left} table.headline td:nth-child(2){text-align:left} "
    ".row{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start} .row>figure{margin:0;flex:0 1 auto} "
    ".row img{max-width:100%} .row>div{flex:1 1 360px;min-width:0;overflow-x:auto} figcaption{font-size:13px;color:#555} "
    ".summary{font-size:13px;color:#333;margin-bottom:.6em} .summary p{margin:0 0 .3em} .summary ul{margin:0;padding-left:1.2em} "
    "details{margin:.6em 0} "
    "summary{cursor:pointer;color:#225} section{border-top:1px solid #ddd;margin-top:1.5em} "
    "table.dataframe{display:block;overflow-x:auto;max-width:100%;margin-top:.6em} .note{font-size:13px;color:#555}"
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
    scripts = "" if bundle is None else _unpack_and_render(bundle, calls)
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{_STYLE}</style></head>\n"
        f"<body>\n<h1>{html.escape(title)}</h1>\n{body}\n" + "\n".join(blocks) + f"\n{scripts}\n</body></html>\n"
    )


def gzip_base64(text: str) -> str:
    """``text`` gzipped and in base64: what a page unpacks with the browser's ``DecompressionStream("gzip")``."""
    return base64.b64encode(gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)).decode()


def _unpack_and_render(bundle: str, calls: Sequence[str]) -> str:
    """The script that unpacks the gzipped bundle, runs it as a classic script (which defines ``CircuitsVis``
    globally, as an inlined bundle would) and draws every view."""
    packed = gzip_base64(bundle)
    return (
        "<script>\n(async () => {\n"
        f'  const packed = Uint8Array.from(atob("{packed}"), c => c.charCodeAt(0));\n'
        '  const code = await new Response(new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"))).text();\n'
        '  const script = document.createElement("script");\n  script.text = code;\n  document.head.appendChild(script);\n  '
        + "\n  ".join(calls) + "\n})();\n</script>"
    )


def save_html(views: Union[Mapping[str, Any], Sequence[Any], Any], path: Union[str, Path], *, title: str = "lens_bias", body: str = "") -> Path:
    """Write views (one, a list, or ``{heading: view}``) to a page that renders offline; returns the path."""
    if hasattr(views, "local_src"):
        views = [views]
    path = Path(path)
    path.write_text(page_html(views, title=title, body=body), encoding="utf-8")
    return path
