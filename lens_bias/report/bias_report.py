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
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import torch
from torch import Tensor

from lens_bias.analyses.ablation import ablate
from lens_bias.analyses.base import SECTIONS, Analysis, Results, run_analyses
from lens_bias.analyses.sink_attribution import SinkAttributionResult, sink_attribution
from lens_bias.analyses.sink_heads import N_HEADS, SinkHeadsResult, sink_heads
from lens_bias.analyses.sinks import Sinks
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import Inputs, InputSpec, RandomTokens, resolve_inputs
from lens_bias.hooks.base import Intervention, edit_records
from lens_bias.report import render
from lens_bias.report.data import ReportData
from lens_bias.report.layout import Layout

__all__ = ["BiasReport", "analyze", "SECTIONS", "VIEWS"]

# Extra views with a pass of their own, named in analyze(sections=...) like sections; a whole report draws them.
VIEWS = ("sink_heads",)


class BiasReport(ReportData):
    """What a model is born with, section by section (:class:`~lens_bias.report.data.ReportData`), with its page
    (:meth:`to_html`) and its text summary (``str(report)``), both :mod:`lens_bias.report.render`'s."""

    def to_html(self, path: Union[str, Path], *, views: Mapping[str, Any] | None = None, rows: int = 8) -> Path:
        """The offline page (:func:`lens_bias.report.render.page`); ``views`` adds your own circuitsvis views at the end,
        ``rows`` is how many rows of each table the page shows.

        Returns:
            The path written.
        """
        return render.page(self, path, views=views, rows=rows)

    def __str__(self) -> str:
        return render.text(self)


def _sink_heads(model: Any, tokens: Tensor, results: Results) -> SinkHeadsResult:
    """The strongest sink heads on the first measured sequence; with the attribution, also under the cheapest
    condition that removes the sink."""
    rate = results.of(Sinks).rate_by_head(0)
    top = rate.flatten().topk(min(N_HEADS, rate.numel())).indices.tolist()
    heads = [(i // rate.shape[1], i % rate.shape[1]) for i in top]
    conditions = {}
    attribution = results.get("sink_attribution")
    if isinstance(attribution, SinkAttributionResult) and (name := attribution.headline()["cheapest_removal"]) is not None:
        records = attribution.interventions[attribution.conditions.index(name)]
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
        adapter.info = dataclasses.replace(adapter.info, regime=Layout(regime).regime)  # Layout refuses a regime it does not know
    layout = Layout(adapter.info.regime)
    analyses, views, skipped = _planned(adapter, layout, sections)
    data, spec = resolve_inputs(inputs, model=model, d_vocab=adapter.info.d_vocab, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    token_inputs = isinstance(data, RandomTokens) or (isinstance(data, torch.Tensor) and data.ndim == 2)
    _check_run(spec, token_inputs, ablations, attribution, interventions)
    records = edit_records(interventions)  # before the pass: an edit that cannot be recorded fails now
    results = run_analyses(adapter, data, spec, analyses, batch_size=batch_size, interventions=interventions, progress=progress)
    if ablations:
        results["ablations"] = ablate(model, inputs=data, batch_size=batch_size, progress=progress)
    # drawn only now: a count the memory guard refuses was refused by the pass, after one batch
    tokens = data.tensor() if isinstance(data, RandomTokens) else data if isinstance(data, torch.Tensor) and data.ndim == 2 else None
    if isinstance(attribution, SinkAttributionResult):
        results["sink_attribution"] = attribution
    elif attribution:
        assert tokens is not None  # _check_run refused attribution on other inputs
        results["sink_attribution"] = sink_attribution(model, tokens, batch_size=batch_size, progress=progress)
    # the view's own pass of one sequence runs where it was asked for (by default: a whole report), on the unedited model
    if "sink_heads" in views and layout.draws_sink_heads and "sinks" in results and tokens is not None and not interventions:
        results["sink_heads"] = _sink_heads(model, tokens, results)
    return BiasReport(model=adapter.info, inputs=spec, sections=results, interventions=records, skipped=skipped)


def _planned(adapter: ModelAdapter, layout: Layout, sections: Sequence[str] | None) -> tuple[list[Analysis[Any]], list[str], dict[str, str]]:
    """The analyses to run, in report order, the extra views asked for, and the sections a default run leaves out
    (those that cannot run on the model) with the reason."""
    names = list(SECTIONS) if sections is None else [s for s in sections if s not in VIEWS]
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        raise LensBiasError(f"unknown section(s) {unknown}; choose from {list(SECTIONS)} and the views {list(VIEWS)}")
    views = list(VIEWS) if sections is None else [v for v in VIEWS if v in sections]
    if "sink_heads" in views and sections is not None and "sinks" not in names:
        raise LensBiasError("the sink_heads view shows the heads the sinks section ranks: ask for sections=[..., 'sinks', 'sink_heads']")
    analyses = [SECTIONS[s]() for s in layout.section_order(names)]
    skipped: dict[str, str] = {}
    if sections is None:  # by default every section that can run on the model; the others are listed with the reason
        skipped = {a.name: why for a in analyses if (why := a.unavailable(adapter)) is not None}
        analyses = [a for a in analyses if a.name not in skipped]
    return analyses, views, skipped


def _check_run(spec: InputSpec, token_inputs: bool, ablations: bool, attribution: Any, interventions: Sequence[Any]) -> None:
    """Refuse inputs and options that cannot go together, before the pass."""
    if spec.n < 2:
        raise LensBiasError(f"analyze needs at least 2 sequences (cosines between sequences), got {spec.n}")
    if spec.seq_len < 2:
        raise LensBiasError(f"analyze needs seq_len >= 2 (cosines between positions), got {spec.seq_len}")
    if (ablations or attribution) and interventions:
        raise LensBiasError("ablations=True and attribution=True run their own edits on the unedited model; for them under your edits "
                            "call lens_bias.ablate / sink_attribution with conditions={name: [*your_edits, ...]}")
    if attribution and not token_inputs:
        raise LensBiasError("attribution=True measures token inputs (perplexity needs next tokens): pass inputs='text' or 'tokens'")
