"""``analyze(model)``: the born-biased report of any TransformerLens model.

A section is one :class:`~lens_bias.analysis.Analysis` in ``SECTIONS`` plus one field of :class:`BiasReport`;
all requested sections share one batched forward pass over the same random inputs.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import torch

from lens_bias.analyses.ablation import AblationResult, ablate
from lens_bias.analyses.contraction import Contraction, ContractionResult
from lens_bias.analyses.decomposition import Decomposition, DecompositionResult
from lens_bias.analyses.fingerprint import FingerprintSection, FingerprintSummary
from lens_bias.analyses.positional_variance import PositionalVariance, PositionalVarianceResult
from lens_bias.analyses.sinks import Sinks, SinksResult
from lens_bias.analyses.super_neurons import SuperNeurons, SuperNeuronsResult
from lens_bias.analyses.token_preference import TokenPreference, TokenPreferenceResult

from .adapter import ModelAdapter, ModelInfo
from .analysis import Analysis, Result, run_analyses
from .errors import LensBiasError
from .inputs import Inputs, InputSpec, resolve_inputs

__all__ = ["BiasReport", "analyze", "SECTIONS"]

# Field name -> the analysis that fills it, in report order.
SECTIONS: dict[str, type[Analysis]] = {
    "token_preference": TokenPreference,
    "contraction": Contraction,
    "decomposition": Decomposition,
    "fingerprint": FingerprintSection,
    "positional_variance": PositionalVariance,
    "sinks": Sinks,
    "super_neurons": SuperNeurons,
}


@dataclass
class BiasReport:
    """What a model is born with, section by section; ``str(report)`` is the human summary."""

    model: ModelInfo
    inputs: InputSpec
    token_preference: TokenPreferenceResult | None = None
    contraction: ContractionResult | None = None
    decomposition: DecompositionResult | None = None
    fingerprint: FingerprintSummary | None = None
    positional_variance: PositionalVarianceResult | None = None
    sinks: SinksResult | None = None
    super_neurons: SuperNeuronsResult | None = None
    ablations: AblationResult | None = None  # opt-in: analyze(model, ablations=True)

    def sections(self) -> dict[str, Result]:
        """The sections that were computed, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Result)}

    def to_dict(self) -> dict[str, Any]:
        """Model, inputs and each section's headline numbers and table, JSON-ready."""
        return {
            "model": self.model.to_dict(),
            "inputs": self.inputs.to_dict(),
            "sections": {
                name: {"headline": r.headline(), "table": r.to_pandas().to_dict(orient="records")}
                for name, r in self.sections().items()
            },
        }

    def figures(self) -> dict[str, Any]:
        """matplotlib figures of the computed sections that have one (``result.plot()``; needs ``lens-bias[plot]``)."""
        titles = {
            "token_preference": "sorted V·p̄", "contraction": "contraction per layer", "positional_variance": "positional variance r_t",
            "sinks": "first-token sink per layer and head", "ablations": "ablations per layer",
        }
        return {titles[name]: result.plot() for name, result in self.sections().items() if name in titles}

    def views(self) -> dict[str, Any]:
        """circuitsvis views of the computed sections, by heading."""
        from . import viz

        out = {}
        if self.token_preference is not None:
            out["preferred tokens (log10 V·p̄)"] = viz.preferred_tokens_view(self.token_preference)
        if self.positional_variance is not None:
            out["r_t = std_t / std_0 by position, layer 0"] = viz.variance_view(self.positional_variance, 0)
        return out

    def to_html(self, path: Union[str, Path], *, views: Mapping[str, Any] | None = None, max_rows: int = 40) -> Path:
        """One page that renders offline: the summary, each section's table, the figures (when matplotlib is
        installed; PNGs inlined) and the circuitsvis views (``views`` adds your own, e.g. ``viz.attention_view``).

        Returns:
            The path written.
        """
        from . import viz

        parts = [f"<pre>{html.escape(str(self))}</pre>"]
        for name, result in self.sections().items():
            table = result.to_pandas()
            note = f"<p>first {max_rows} of {len(table)} rows</p>" if len(table) > max_rows else ""
            parts.append(f"<h2>{name}</h2>{note}" + table.head(max_rows).to_html(index=False, float_format=lambda v: f"{v:.4g}"))
        try:
            parts += [f"<h2>{html.escape(title)}</h2>{viz.figure_png(fig)}" for title, fig in self.figures().items()]
        except LensBiasError as err:  # no matplotlib: tables and views only
            parts.append(f"<p>{html.escape(str(err))}</p>")
        return viz.save_html({**self.views(), **(views or {})}, path, title="lens_bias report", body="\n".join(parts))

    def __str__(self) -> str:
        m, i = self.model, self.inputs
        pos = f"{m.positional_embedding} positions"
        mlp = "attention-only" if m.attn_only else f"{'gated ' if m.gated_mlp else ''}{m.act_fn} MLP"
        header = (
            f"lens_bias report: {m.architecture or m.family}, d_model {m.d_model}, {m.n_layers} layers × {m.n_heads} heads, "
            f"{mlp}, {m.normalization} norm, {pos}, V {m.d_vocab} ({m.family}, TL {m.tl_version}, {m.device}/{m.dtype})\n"
            f"inputs: {i.describe()}"
        )
        return "\n\n".join([header] + [r.summary() for r in self.sections().values()])


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
) -> BiasReport:
    """Measure what ``model`` is born with on random inputs: token preference, contraction, ...

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
        inputs: "tokens", "text" (held-out prose through ``model.tokenizer``: :func:`lens_bias.inputs.text_tokens`),
            "embeddings" (Gaussian with the model's embedding mean/std), token IDs [n, seq],
            embeddings [n, seq, d_model] or a RandomEmbeddings.
        n_sequences: number of random sequences (ignored for tensor inputs); at least 2.
        seq_len: tokens per sequence (ignored for tensor inputs); at least 2 and at most the model's n_ctx.
        seed: seed of the random inputs.
        batch_size: sequences per forward pass (default: sized to the sequence length).
        device: the device the model is on, as a check; lens_bias does not move models.
        progress: show a tqdm progress bar.
        sections: which sections to compute (default: all of ``SECTIONS``).
        ablations: also run :func:`lens_bias.ablate` on the same inputs (one more pass per condition).

    Returns:
        A :class:`BiasReport`.
    """
    adapter = ModelAdapter(model)
    _check_device(adapter, device)
    # By default every section the model can have: attention-only models have no MLP units to rank.
    names = [s for s in SECTIONS if not (s == "super_neurons" and adapter.info.attn_only)] if sections is None else list(sections)
    unknown = [s for s in names if s not in SECTIONS]
    if unknown:
        raise LensBiasError(f"unknown section(s) {unknown}; choose from {list(SECTIONS)}")
    data, spec = resolve_inputs(inputs, model=model, d_vocab=adapter.info.d_vocab, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    if spec.n < 2:
        raise LensBiasError(f"analyze needs at least 2 sequences (cosines between sequences), got {spec.n}")
    if spec.seq_len < 2:
        raise LensBiasError(f"analyze needs seq_len >= 2 (cosines between positions), got {spec.seq_len}")
    results = run_analyses(adapter, data, spec, [SECTIONS[s]() for s in names], batch_size=batch_size, progress=progress)
    if ablations:
        results["ablations"] = ablate(model, inputs=data, batch_size=batch_size, progress=progress)
    return BiasReport(model=adapter.info, inputs=spec, **results)
