"""Ablations: switch MLP asymmetry and attention aggregation off separately, on the same random inputs.

The 2×2 factorial {MLP asymmetry on/off (OddActivation)} × {attention aggregation on/off (SelfOnlyAttention)}
shows the two forces apart: without asymmetry the inter-sequence cosine falls to ≈ 0 while attention still makes
positions alike (intra > 0); without aggregation intra falls to inter. The activation sweep (SwapActivation with
relu, gelu, silu, tanh, identity) orders the shared direction by the activation's mean, and uniform causal
attention shows that init attention is already nearly uniform at small width. Each condition is one batched
forward pass through the model with its interventions attached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence, Union

import pandas as pd
from tqdm.auto import tqdm

from lens_bias.analyses.base import Result, Results, run_analyses
from lens_bias.analyses.contraction import Contraction, plot_contraction
from lens_bias.analyses.plan import ExtraPass, RunPlan
from lens_bias.analyses.token_preference import TokenPreference
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import Inputs, resolve_inputs
from lens_bias.hooks.attention import SelfOnlyAttention, UniformAttention
from lens_bias.hooks.base import Intervention, edit_records, refusal
from lens_bias.hooks.mlp import OddActivation, SwapActivation

__all__ = ["ablate", "AblationResult", "CONDITIONS"]

# Condition name -> the interventions that define it ("base" is the unedited model).
CONDITIONS: dict[str, tuple[Intervention, ...]] = {
    "base": (),
    "odd_mlp": (OddActivation(),),
    "self_only_attention": (SelfOnlyAttention(),),
    "odd_mlp+self_only_attention": (OddActivation(), SelfOnlyAttention()),
    "uniform_attention": (UniformAttention(),),
    "act=relu": (SwapActivation("relu"),),
    "act=gelu": (SwapActivation("gelu"),),
    "act=silu": (SwapActivation("silu"),),
    "act=tanh": (SwapActivation("tanh"),),
    "act=identity": (SwapActivation("identity"),),
}


@dataclass
class AblationResult(Result):
    """Per condition and layer: inter/intra cosine; per condition: max/min p̄ and H(p̄)/log V."""
    column_words: ClassVar[Mapping[str, str]] = {
        "inter": "cos between sequences (inter)", "intra": "cos within a sequence (intra)", "max_min_ratio": "max / min p̄ (×)",
        "entropy_ratio": "H(p̄) / log V",
    }

    table: pd.DataFrame  # tidy: condition, layer, hook, inter, intra, max_min_ratio, entropy_ratio
    conditions: dict[str, list[dict[str, Any]]]  # condition -> its interventions, as Intervention.to_dict()
    # default conditions left out because they cannot act on this model -> why, in one line
    skipped: dict[str, str] = field(default_factory=dict)

    heading = "Ablations"
    plot_caption = "ablations per layer"

    def to_pandas(self) -> pd.DataFrame:
        return self.table.copy()

    def plot(self) -> Any:
        """Inter- and intra-sequence cosine per layer, one line per condition."""
        return plot_contraction(self.table)

    def final(self) -> pd.DataFrame:
        """One row per condition, at the final norm."""
        return self.table[self.table.layer == "final"].set_index("condition").drop(columns=["layer", "hook"])

    def headline(self) -> dict[str, Any]:
        return {cond: {k: float(v) for k, v in row.items()} for cond, row in self.final().iterrows()}

    def summary(self) -> str:
        text = self.final().to_string(float_format=lambda v: f"{v:.3f}")
        skipped = "".join(f"\n  skipped {name}: {why}" for name, why in self.skipped.items())
        return "ablations (same inputs; values after the final norm):\n" + "\n".join("  " + line for line in text.splitlines()) + skipped


@one_adapter_per_call
def ablate(
    model: Any,
    *,
    conditions: Union[Sequence[str], dict[str, Sequence[Intervention]], None] = None,
    inputs: Union[str, Inputs] = "tokens",
    n_sequences: int = 256,
    seq_len: int = 128,
    seed: int = 42,
    batch_size: int | None = None,
    progress: bool = True,
) -> AblationResult:
    """Contraction and token preference of ``model`` under each ablation condition, on the same inputs.

    >>> import lens_bias
    >>> m = lens_bias.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=16, act_fn="relu")
    >>> r = ablate(m, conditions=["base", "odd_mlp"], n_sequences=8, seq_len=8, progress=False)
    >>> list(r.final().index)
    ['base', 'odd_mlp']

    Args:
        model: any TransformerLens model; interventions are attached only for each pass.
        conditions: names from ``CONDITIONS`` (default: all that can act on the model; the others are listed in
            ``skipped`` with the reason), or ``{name: [interventions]}``.
        inputs: as in :func:`lens_bias.analyze`.
        n_sequences: as in :func:`lens_bias.analyze`.
        seq_len: as in :func:`lens_bias.analyze`.
        seed: as in :func:`lens_bias.analyze`.
        batch_size: as in :func:`lens_bias.analyze`.
        progress: a progress bar over conditions.

    Returns:
        An :class:`AblationResult` with one tidy table.
    """
    adapter = ModelAdapter.of(model)
    skipped: dict[str, str] = {}
    if conditions is None:
        skipped = {k: why for k, v in CONDITIONS.items() if (why := refusal(model, v)) is not None}
        chosen = {k: v for k, v in CONDITIONS.items() if k not in skipped}
    elif isinstance(conditions, dict):
        chosen = {k: tuple(v) for k, v in conditions.items()}
    else:
        unknown = [c for c in conditions if c not in CONDITIONS]
        if unknown:
            raise LensBiasError(f"unknown condition(s) {unknown}; choose from {list(CONDITIONS)} or pass {{name: [interventions]}}")
        chosen = {k: CONDITIONS[k] for k in conditions}
    data, spec = resolve_inputs(inputs, model=model, d_vocab=adapter.info.d_vocab, n_sequences=n_sequences, seq_len=seq_len, seed=seed)
    if spec.n < 2 or spec.seq_len < 2:
        raise LensBiasError(f"ablate needs at least 2 sequences of at least 2 tokens, got {spec.n} × {spec.seq_len}")
    records = {k: edit_records(v) for k, v in chosen.items()}  # before the passes: unrecordable edits fail now
    frames = []
    for name, interventions in tqdm(chosen.items(), desc="ablations", disable=not progress):
        results = run_analyses(adapter, data, spec, [TokenPreference(), Contraction()], batch_size=batch_size, interventions=interventions, progress=False)
        frame = results.of(Contraction).to_pandas()[["layer", "hook", "inter", "intra"]]
        frame.insert(0, "condition", name)
        frame["max_min_ratio"] = results.of(TokenPreference).max_min_ratio
        frame["entropy_ratio"] = results.of(TokenPreference).entropy_ratio
        frames.append(frame)
    table = pd.concat(frames, ignore_index=True)
    return AblationResult(table=table, conditions=records, skipped=skipped)


@dataclass(frozen=True)
class Ablations(ExtraPass[AblationResult]):
    """The report's ablation table: :func:`ablate` on the report's inputs, one more pass per condition
    (``analyze(model, sections=[..., "ablations"])``)."""

    name: ClassVar[str] = "ablations"
    order = 10

    conditions: Union[Sequence[str], dict[str, Sequence[Intervention]], None] = None  # as ablate's (None: every one that acts)

    def check(self, plan: RunPlan) -> None:
        if plan.interventions:
            raise LensBiasError("the ablations run their own edits on the unedited model; for them under your edits call "
                                "lens_bias.ablate with conditions={name: [*your_edits, ...]}")

    def run(self, plan: RunPlan, results: Results) -> AblationResult:
        return ablate(plan.model, conditions=self.conditions, inputs=plan.inputs, batch_size=plan.settings.batch_size, progress=plan.progress)
