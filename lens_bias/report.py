"""``analyze(model)``: the born-biased report of any TransformerLens model.

A section is one :class:`~lens_bias.analysis.Analysis` in ``SECTIONS`` plus one field of :class:`BiasReport`;
all requested sections share one batched forward pass over the same random inputs.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field, fields
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
from .hooks.base import edit_records
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
    # The edits every section was measured under, as Intervention.to_dict() (empty: the unedited model).
    interventions: list[dict[str, Any]] = field(default_factory=list)

    def sections(self) -> dict[str, Result]:
        """The sections that were computed, by name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Result)}

    def to_dict(self) -> dict[str, Any]:
        """Model, inputs, interventions and each section's headline numbers and table, JSON-ready."""
        return {
            "model": self.model.to_dict(),
            "inputs": self.inputs.to_dict(),
            "interventions": self.interventions,
            "sections": {
                name: {"headline": r.headline(), "table": r.to_pandas().to_dict(orient="records")}
                for name, r in self.sections().items()
            },
        }

    def figures(self) -> dict[str, Any]:
        """matplotlib figures of the computed sections that have one (``result.plot()``; needs ``lens-bias[plot]``)."""
        return {_FIGURE_TITLES[name]: result.plot() for name, result in self.sections().items() if name in _FIGURE_TITLES}

    def views(self) -> dict[str, Any]:
        """circuitsvis views of the computed sections, by heading."""
        from . import viz

        out = {}
        if self.token_preference is not None:
            out[_VIEW_TITLES["token_preference"]] = viz.preferred_tokens_view(self.token_preference)
        if self.positional_variance is not None:
            out[_VIEW_TITLES["positional_variance"]] = viz.variance_view(self.positional_variance, 0)
        return out

    def headline_table(self) -> list[tuple[str, str, str]]:
        """The report's headline numbers as (section, number, value) rows, the first thing ``to_html`` shows."""
        rows = []
        for name, result in self.sections().items():
            numbers = result.headline()
            for key, label in _HEADLINES.get(name, ()):
                value = numbers.get(key)
                if isinstance(value, (list, tuple)):  # per layer: the first layer's
                    value = value[0] if value else None
                if value is not None:
                    rows.append((_SECTION_TITLES.get(name, name), label, _fmt(value)))
        return rows

    def to_html(self, path: Union[str, Path], *, views: Mapping[str, Any] | None = None, max_rows: int = 40, short_rows: int = 8) -> Path:
        """One page that renders offline, laid out like a paper's figure page.

        The headline numbers come first; then one part per section: its figure (when matplotlib is installed; PNG
        inlined) beside its summary and first ``short_rows`` rows, the rest of its table (up to ``max_rows``) folded
        in ``<details>``, and its circuitsvis view. ``views`` adds your own views (e.g. ``viz.attention_view``) at
        the end; the text summary closes the page, folded.

        Returns:
            The path written.
        """
        from . import viz

        m = self.model
        esc = html.escape
        rows = self.headline_table()
        parts = [
            f'<p class="meta">{esc(m.architecture or m.family)}, d_model {m.d_model}, {m.n_layers} layers × {m.n_heads} heads, '
            f"V {m.d_vocab} (TL {esc(str(m.tl_version))}, {esc(str(m.device))}/{esc(str(m.dtype))}); inputs: {esc(self.inputs.describe())}</p>",
            "<h2>Headline numbers</h2>",
            '<table class="headline"><tr><th>section</th><th>number</th><th>value</th></tr>'
            + "".join(
                f"<tr><td>{esc(a) if i == 0 or a != rows[i - 1][0] else ''}</td><td>{esc(b)}</td><td>{esc(c)}</td></tr>"
                for i, (a, b, c) in enumerate(rows)
            )
            + "</table>",
        ]
        no_plot = None
        for name, result in self.sections().items():
            table = result.to_pandas()
            table = table.dropna(axis=1, how="all")  # no empty columns (e.g. token strings of a model without a tokenizer)
            figure = ""
            if name in _FIGURE_TITLES and no_plot is None:
                try:
                    figure = f"<figure>{viz.figure_png(result.plot())}<figcaption>{esc(_FIGURE_TITLES[name])}</figcaption></figure>"
                except LensBiasError as err:  # no matplotlib: tables and views only
                    no_plot = str(err)
            short = table.head(short_rows).to_html(index=False, float_format=_fmt, border=0)
            side = f'<div><div class="summary">{esc(result.summary())}</div>{short}</div>'
            part = f"<section><h2>{esc(_SECTION_TITLES.get(name, name))}</h2><div class=\"row\">{figure}{side}</div>"
            if len(table) > short_rows:
                shown = table.head(max_rows)
                more = f", first {max_rows} shown" if len(table) > max_rows else ""
                part += (
                    f"<details><summary>full table ({len(table)} rows{more})</summary>"
                    + shown.to_html(index=False, float_format=_fmt, border=0) + "</details>"
                )
            if name in _VIEW_TITLES:
                part += viz.view_slot(_VIEW_TITLES[name])
            parts.append(part + "</section>")
        if no_plot is not None:
            parts.append(f"<p>{esc(no_plot)}</p>")
        parts.append(f"<section><details><summary>text summary</summary><pre>{esc(str(self))}</pre></details></section>")
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
        if self.interventions:
            header += "\nmeasured under: " + " + ".join(d.get("type", "?") for d in self.interventions)
        return "\n\n".join([header] + [r.summary() for r in self.sections().values()])


_SECTION_TITLES = {
    "token_preference": "Token preference", "contraction": "Contraction", "decomposition": "Residual decomposition",
    "fingerprint": "SeedPrint fingerprint", "positional_variance": "Positional variance", "sinks": "Attention sinks",
    "super_neurons": "Super neurons", "ablations": "Ablations",
}
_FIGURE_TITLES = {
    "token_preference": "sorted V·p̄", "contraction": "contraction per layer", "positional_variance": "positional variance r_t",
    "sinks": "first-token sink per layer and head", "ablations": "ablations per layer",
}
_VIEW_TITLES = {"token_preference": "preferred tokens (log10 V·p̄)", "positional_variance": "r_t = std_t / std_0 by position, layer 0"}
# Section -> (headline key, label) of the numbers the page opens with.
_HEADLINES = {
    "token_preference": (("max_min_ratio", "max/min p̄"), ("uniform_ratio", "V·max p̄"), ("entropy_ratio", "H(p̄)/log V"), ("tau_halves", "τ halves")),
    "contraction": (("inter_final", "inter (final norm)"), ("intra_final", "intra (final norm)"), ("energy_share_final", "energy along the seed direction")),
    "positional_variance": (("alpha_out", "α of r_t, layer 0"),),
    "sinks": (("sink_rate_0", "Sink_0 (%)"), ("first_token_share", "first-token share α_0"), ("norm_ratio_0_max", "max ‖h_0‖ / median ‖h_t‖")),
    "super_neurons": (("top_unit_ratio", "top unit, first token vs elsewhere"), ("resid_max_over_median", "residual max/median |h|")),
}


def _fmt(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:.4g}"


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
    interventions: Sequence[Any] = (),
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
        interventions: lens_bias.hooks interventions (or lists of them) attached for the pass; the report records
            them (``report.interventions``, their ``to_dict()``).

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
    if ablations and interventions:
        raise LensBiasError("ablations=True runs its own edits on the unedited model; for ablations under your edits "
                            "call lens_bias.ablate(model, conditions={name: [*your_edits, ...]})")
    records = edit_records(interventions)  # before the pass: an edit that cannot be recorded fails now
    results = run_analyses(adapter, data, spec, [SECTIONS[s]() for s in names], batch_size=batch_size, interventions=interventions, progress=progress)
    if ablations:
        results["ablations"] = ablate(model, inputs=data, batch_size=batch_size, progress=progress)
    return BiasReport(model=adapter.info, inputs=spec, interventions=records, **results)
