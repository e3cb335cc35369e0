"""``analyze(model)``: the report of any TransformerLens model, as a random init or as a trained model.

A section is one :class:`~lens_bias.analyses.base.Analysis` subclass (it registers itself in ``SECTIONS``); all
requested sections share one batched forward pass over the same inputs. The model's regime
(``ModelInfo.regime``, or ``analyze(..., regime=...)``) decides the report's order and
headline: a random init's opens with what it was born with (token preference, contraction, ...), a trained
model's with the anatomy of its sink (:mod:`lens_bias.report.anatomy`), and laws that hold only at init are
compared with only there.
"""

from __future__ import annotations

import dataclasses
import html
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import torch
from torch import Tensor

from lens_bias.analyses.ablation import AblationResult, ablate
from lens_bias.analyses.base import SECTIONS, Result, run_analyses
from lens_bias.analyses.sink_attribution import SinkAttributionResult, sink_attribution
from lens_bias.analyses.sink_heads import N_HEADS, SinkHeadsResult, sink_heads
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError, MissingExtra
from lens_bias.core.figures import figure_png
from lens_bias.core.inputs import Inputs, InputSpec, RandomTokens, resolve_inputs
from lens_bias.core.model_facts import REGIMES, ModelInfo
from lens_bias.hooks.base import Intervention, edit_records
from lens_bias.report.anatomy import SinkAnatomy, anatomy_of
from lens_bias.report.page import CSV_SCRIPT, fmt, summary_html, table_block
from lens_bias.report.viz import save_html, view_slot

__all__ = ["BiasReport", "analyze", "SECTIONS", "VIEWS"]

# Sections that are not an Analysis of the shared pass, with passes of their own.
EXTRA_SECTIONS: dict[str, type[Result]] = {
    "ablations": AblationResult,  # analyze(model, ablations=True)
    "sink_attribution": SinkAttributionResult,  # analyze(model, attribution=True)
    "sink_heads": SinkHeadsResult,  # a trained model's strongest sink heads on one window (one short pass per condition)
}
# Extra views with a pass of their own, named in analyze(sections=...) like sections; a whole report draws them.
VIEWS = ("sink_heads",)
# A trained model's page follows its anatomy with what removes the sink and what the sink heads look like.
_TRAINED_FIRST = ("sink_attribution", "sink_heads")


@dataclass
class BiasReport:
    """What a model is born with, section by section; ``str(report)`` is the human summary.

    ``report.sections`` holds the computed results by section name, in report order; ``report.<name>`` is one of
    them (``None`` for a known section that was not computed).
    """

    model: ModelInfo
    inputs: InputSpec
    sections: dict[str, Result] = field(default_factory=dict)
    # The edits every section was measured under, as Intervention.to_dict() (empty: the unedited model).
    interventions: list[dict[str, Any]] = field(default_factory=list)
    # Sections a default run left out because they cannot run on this model -> why, in one line.
    skipped: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        # Only reached when ordinary lookup fails: report.sinks and the other sections by name.
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        if name in SECTIONS or name in EXTRA_SECTIONS:
            return None
        raise AttributeError(f"BiasReport has no attribute or section {name!r}; sections: {list(SECTIONS) + list(EXTRA_SECTIONS)}, computed: {list(sections)}")

    def to_dict(self, *, results: bool = True) -> dict[str, Any]:
        """Model, inputs, interventions and each section's headline numbers and table, JSON-ready.

        Args:
            results: also each section's whole result (``Result.to_dict``: every tensor), which
                :meth:`from_dict` reads back. ``False`` keeps the summary that ``lens-bias analyze --json`` prints.
        """
        sections = {}
        for name, r in self.sections.items():
            sections[name] = {"headline": r.headline(), "table": r.to_pandas().to_dict(orient="records")}
            if results:
                sections[name]["result"] = r.to_dict()
        return {"model": self.model.to_dict(), "inputs": self.inputs.to_dict(), "interventions": self.interventions, "sections": sections,
                "skipped": dict(self.skipped)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "BiasReport":
        """The report :meth:`to_dict` wrote (with ``results=True``)."""
        sections = {}
        for name, section in d["sections"].items():
            kind = SECTIONS[name].result_type if name in SECTIONS else EXTRA_SECTIONS.get(name)
            if kind is None:
                raise LensBiasError(f"unknown section {name!r}; import the module that defines its Analysis before BiasReport.from_dict")
            if "result" not in section:
                raise LensBiasError(f"section {name!r} holds only its summary: write the report with to_dict(results=True)")
            sections[name] = kind.from_dict(section["result"])
        return cls(model=ModelInfo.from_dict(d["model"]), inputs=InputSpec.from_dict(d["inputs"]), sections=sections,
                   interventions=list(d["interventions"]), skipped=dict(d.get("skipped", {})))

    def anatomy(self) -> SinkAnatomy | None:
        """The anatomy of the first-token sink (super weight → massive dim → disparity → sink) from the computed
        sections, or None without the ``sinks`` and ``super_neurons`` sections. A trained model's report opens with it."""
        return anatomy_of(self.sections)

    def figures(self) -> dict[str, Any]:
        """matplotlib figures of the computed sections that have one (``result.plot()``; needs ``lens-bias[plot]``)."""
        return {r.plot_caption or name: r.plot() for name, r in self.sections.items() if r.has_figure}

    def views(self) -> dict[str, Any]:
        """circuitsvis views of the computed sections that have one (``result.show()``), by heading."""
        return {caption: view for r in self.sections.values() if r.has_view for caption, view in r.views().items()}

    def headline_table(self) -> list[tuple[str, str, str]]:
        """The report's headline numbers as (section, number, value) rows, each once and only where it applies: a
        trained model's page gives its sink's anatomy a block of its own (:meth:`anatomy`), so its rows here are
        the other sections' numbers that mean something for a trained model (``Result.trained_headline``); a random
        init's, those that mean something at init (``Result.init_headline``)."""
        rows = []
        trained = self.model.regime == "trained"
        for name, result in self.sections.items():
            numbers = result.headline()
            applies = result.trained_headline if trained else result.init_headline
            for key, label in result.headline_labels.items():
                if applies is not None and key not in applies:
                    continue
                value = numbers.get(key)
                if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):  # names: all of them
                    value = ", ".join(value) or "none"
                elif isinstance(value, (list, tuple)):  # per layer: the first layer's
                    value = value[0] if value else None
                if value is not None:
                    rows.append((result.heading or name, label, fmt(value)))
        return rows

    def to_html(self, path: Union[str, Path], *, views: Mapping[str, Any] | None = None, rows: int = 8) -> Path:
        """One page that renders offline, laid out like a paper's figure page.

        A trained model's page opens with the anatomy of its sink (the chain figure, with the causal verdicts under
        the links they test when ``attribution=True`` ran), then what removes the sink, the attention of its
        strongest sink heads, and the other numbers that apply to a trained model; a random init's opens with its
        headline numbers. Each section then shows its figure (PNG inlined) beside its summary and the ``rows`` rows
        of its table that carry the finding, with the whole table downloadable as CSV, and its circuitsvis views.
        ``views`` adds your own views (e.g. ``viz.attention_view``) at the end; the text summary closes the page,
        folded. circuitsvis' bundle is on the page once, gzipped.

        Returns:
            The path written.
        """
        m = self.model
        esc = html.escape
        trained = m.regime == "trained"
        headline = self.headline_table()
        table = (
            '<table class="headline"><tr><th>section</th><th>number</th><th>value</th></tr>'
            + "".join(f"<tr><td>{esc(a) if i == 0 or a != headline[i - 1][0] else ''}</td><td>{esc(b)}</td><td>{esc(c)}</td></tr>"
                      for i, (a, b, c) in enumerate(headline))
            + "</table>"
        )
        shown: list[tuple[str, Any]] = list(self.sections.items())
        first = [item for item in shown if trained and item[0] in _TRAINED_FIRST]
        shown = sorted(first, key=lambda item: _TRAINED_FIRST.index(item[0])) + [item for item in shown if item not in first]
        anatomy = self.anatomy() if trained else None
        if anatomy is not None:
            shown.insert(0, ("anatomy", anatomy))
        parts = [f'<p class="meta">{esc(m.architecture or m.family)}, d_model {m.d_model}, {m.n_layers} layers × {m.n_heads} heads, '
                 f"V {m.d_vocab} ({'trained' if trained else 'random init'}; TL {esc(str(m.tl_version))}, {esc(str(m.device))}/{esc(str(m.dtype))}); "
                 f"inputs: {esc(self.inputs.describe())}</p>", CSV_SCRIPT]
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
                    + table_block(result.to_pandas(), key=result.key_column, rows=rows, name=name, names=result.column_words))
            if result.has_view:  # each view made once: its slot here, drawn by save_html
                made = result.views()
                drawn.update(made)
                part += "".join(view_slot(caption) for caption in made)
            blocks.append(part + "</section>")
        if not trained:
            parts.append(f"<h2>Headline numbers</h2>{table}")
        elif headline:  # after the sink's own parts
            blocks.insert(len(first) + (anatomy is not None), f"<section><h2>Other numbers</h2>{table}</section>")
        parts += blocks
        if no_plot is not None:
            parts.append(f"<p>{esc(no_plot)}</p>")
        parts.append(f"<section><details><summary>text summary</summary><pre>{esc(str(self))}</pre></details></section>")
        title = f"lens_bias report: {m.name}" if m.name else "lens_bias report"
        return save_html({**drawn, **(views or {})}, path, title=title, body="\n".join(parts))

    def __str__(self) -> str:
        m, i = self.model, self.inputs
        pos = f"{m.positional_embedding} positions"
        mlp = "attention-only" if m.attn_only else f"{'gated ' if m.gated_mlp else ''}{m.act_fn} MLP"
        kind = "a trained model" if m.regime == "trained" else "a random init"
        header = (
            f"lens_bias report of {kind}: {m.architecture or m.family}, d_model {m.d_model}, {m.n_layers} layers × {m.n_heads} heads, "
            f"{mlp}, {m.normalization} norm, {pos}, V {m.d_vocab} ({m.family}, TL {m.tl_version}, {m.device}/{m.dtype})\n"
            + (f"model: {m.name}\n" if m.name else "")
            + f"inputs: {i.describe()}"
        )
        if self.interventions:
            header += "\nmeasured under: " + " + ".join(d.get("type", "?") for d in self.interventions)
        header += "".join(f"\nskipped {name}: {why}" for name, why in self.skipped.items())
        anatomy = self.anatomy() if m.regime == "trained" else None
        return "\n\n".join([header] + ([anatomy.summary()] if anatomy is not None else []) + [r.summary() for r in self.sections.values()])


def _sink_heads(model: Any, tokens: Tensor, results: Mapping[str, Result]) -> SinkHeadsResult:
    """The strongest sink heads on the first measured sequence; with the attribution, also under the cheapest
    condition that removes the sink."""
    rate = results["sinks"].rate_by_head(0)  # type: ignore[attr-defined]
    top = rate.flatten().topk(min(N_HEADS, rate.numel())).indices.tolist()
    heads = [(i // rate.shape[1], i % rate.shape[1]) for i in top]
    conditions = {}
    attribution = results.get("sink_attribution")
    if attribution is not None and (name := attribution.headline()["cheapest_removal"]) is not None:  # type: ignore[attr-defined]
        records = attribution.interventions[attribution.conditions.index(name)]  # type: ignore[attr-defined]
        conditions[f"under {name}"] = [Intervention.from_dict(record) for record in records]
    return sink_heads(model, tokens[0], heads, conditions=conditions)


def _check_device(adapter: ModelAdapter, device: Union[str, torch.device, None]) -> None:
    if device is None:
        return
    want, have = torch.device(device), adapter.device
    if want.type != have.type or (want.index is not None and want.index != have.index):
        raise LensBiasError(
            f"the model is on {have} but device={want} was requested; lens_bias never moves your model: "
            f"call model.to({str(want)!r}) first, or leave device=None"
        )


def analyze(
    model: Any,
    *,
    inputs: Union[str, Inputs] = "tokens",
    n_sequences: int = 256,
    seq_len: int = 128,
    seed: int = 42,
    batch_size: int | None = None,
    device: Union[str, torch.device, None] = None,
    progress: bool = True,
    sections: Sequence[str] | None = None,
    ablations: bool = False,
    attribution: Union[bool, SinkAttributionResult] = False,
    regime: str | None = None,
    interventions: Sequence[Any] = (),
) -> BiasReport:
    """Measure what ``model`` is born with, or for a trained model the anatomy of its sink, on one batched pass.

    With ``inputs="tokens"`` it analyses exactly ``lens_bias.random_tokens(n_sequences, seq_len, d_vocab, seed)``.

    >>> import lens_bias
    >>> m = lens_bias.models.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=32,
    ...                                  act_fn="relu", positional_embedding="none")
    >>> report = analyze(m, n_sequences=16, seq_len=8, progress=False)
    >>> list(report.contraction.to_pandas().layer)
    ['embed', '0', '1', 'final']

    Args:
        model: a TL 4.x TransformerBridge, a TL 3.x HookedTransformer, or a HookedRootModule with standard hook
            names. It is never modified.
        inputs: "tokens", "text" (held-out prose through ``model.tokenizer``: :func:`lens_bias.core.inputs.text_tokens`),
            "embeddings" (Gaussian with the model's embedding mean/std), token IDs [n, seq],
            embeddings [n, seq, d_model] or a RandomEmbeddings.
        n_sequences: number of random sequences (ignored for tensor inputs); at least 2.
        seq_len: tokens per sequence (ignored for tensor inputs); at least 2 and at most the model's n_ctx.
        seed: seed of the random inputs.
        batch_size: sequences per forward pass (default: sized to the sequence length).
        device: the device the model is on, as a check; lens_bias does not move models.
        progress: show a tqdm progress bar.
        sections: which sections to compute (default: every one in ``SECTIONS`` that can run on the model; the
            others are listed in ``report.skipped`` with the reason), and which extra views (``VIEWS``: "sink_heads",
            the attention of the strongest sink heads on one sequence, drawn for a trained model by default). Only
            the passes of what is named run.
        ablations: also run :func:`lens_bias.ablate` on the same inputs (one more pass per condition).
        attribution: also run :func:`lens_bias.analyses.sink_attribution.sink_attribution` on the same token inputs
            (two passes per condition; its odd sequences calibrate, its even ones are measured); its verdicts join
            the anatomy. Or the result of one already run on these inputs (``lens-bias attribution --html``).
        regime: "init" or "trained", instead of what lens_bias recorded of the model (``ModelInfo.regime``: models
            it did not build or load count as trained).
        interventions: lens_bias.hooks interventions (or lists of them) attached for the pass; the report records
            them (``report.interventions``, their ``to_dict()``).

    Returns:
        A :class:`BiasReport`.
    """
    adapter = ModelAdapter(model)
    _check_device(adapter, device)
    if regime is not None:
        if regime not in REGIMES:
            raise LensBiasError(f"regime must be one of {REGIMES}, got {regime!r}")
        adapter.info = dataclasses.replace(adapter.info, regime=regime)
    names = list(SECTIONS) if sections is None else [s for s in sections if s not in VIEWS]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        raise LensBiasError(f"unknown section(s) {unknown}; choose from {list(SECTIONS)} and the views {list(VIEWS)}")
    views = list(VIEWS) if sections is None else [v for v in VIEWS if v in sections]
    if "sink_heads" in views and sections is not None and "sinks" not in names:
        raise LensBiasError("the sink_heads view shows the heads the sinks section ranks: ask for sections=[..., 'sinks', 'sink_heads']")
    names.sort(key=lambda s: SECTIONS[s].place(adapter.info.regime))
    analyses = [SECTIONS[s]() for s in names]
    skipped: dict[str, str] = {}
    if sections is None:  # by default every section that can run on the model; the others are listed with the reason
        skipped = {a.name: why for a in analyses if (why := a.unavailable(adapter)) is not None}
        analyses = [a for a in analyses if a.name not in skipped]
    data, spec = resolve_inputs(inputs, model=model, d_vocab=adapter.info.d_vocab, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    if spec.n < 2:
        raise LensBiasError(f"analyze needs at least 2 sequences (cosines between sequences), got {spec.n}")
    if spec.seq_len < 2:
        raise LensBiasError(f"analyze needs seq_len >= 2 (cosines between positions), got {spec.seq_len}")
    if (ablations or attribution) and interventions:
        raise LensBiasError("ablations=True and attribution=True run their own edits on the unedited model; for them under your edits "
                            "call lens_bias.ablate / sink_attribution with conditions={name: [*your_edits, ...]}")
    if attribution and not (isinstance(data, RandomTokens) or (isinstance(data, torch.Tensor) and data.ndim == 2)):
        raise LensBiasError("attribution=True measures token inputs (perplexity needs next tokens): pass inputs='text' or 'tokens'")
    records = edit_records(interventions)  # before the pass: an edit that cannot be recorded fails now
    results = run_analyses(adapter, data, spec, analyses, batch_size=batch_size, interventions=interventions, progress=progress)
    if ablations:
        results["ablations"] = ablate(model, inputs=data, batch_size=batch_size, progress=progress)
    tokens = data.tensor() if isinstance(data, RandomTokens) else data if isinstance(data, torch.Tensor) and data.ndim == 2 else None
    if isinstance(attribution, SinkAttributionResult):
        results["sink_attribution"] = attribution
    elif attribution:
        results["sink_attribution"] = sink_attribution(model, tokens, batch_size=batch_size, progress=progress)
    # the view's own pass of one sequence runs where it was asked for (by default: a whole report), on the unedited model
    if "sink_heads" in views and adapter.info.regime == "trained" and "sinks" in results and tokens is not None and not interventions:
        results["sink_heads"] = _sink_heads(model, tokens, results)
    return BiasReport(model=adapter.info, inputs=spec, sections=results, interventions=records, skipped=skipped)
