"""The attention of the strongest sink heads on one window of tokens, as the reader sees it: which tokens each query
attends to, with the first token's column standing out, and the same heads under an edit that removes the sink.

The heads are the ones with the highest Sink_0 rate in a report's ``sinks`` section; the window is the first
``window`` tokens of one measured sequence. A trained model's report holds this view (``analyze`` builds it); with
``attribution=True`` it adds the same heads under the cheapest condition that removes the sink.

>>> import lens_bias
>>> m = lens_bias.random_init("llama", d_model=32, n_layers=2, n_heads=4, d_vocab=50, n_ctx=16)
>>> view = sink_heads(m, lens_bias.random_tokens(1, 12, 50)[0], heads=[(1, 0), (0, 3)], window=8)
>>> view.patterns.shape, view.head_names[0]
(torch.Size([1, 2, 8, 8]), 'L1H0')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_bias.analyses.base import Result, Results
from lens_bias.analyses.plan import ExtraPass, RunPlan
from lens_bias.analyses.sink_attribution import SinkAttributionResult
from lens_bias.analyses.sinks import Sinks
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.probes import Probe
from lens_bias.hooks.base import Intervention, edit_hooks

__all__ = ["sink_heads", "SinkHeadsResult", "WINDOW", "N_HEADS"]

WINDOW = 32  # tokens shown: enough prose to read, few enough that the page stays light (each head is WINDOW² numbers)
N_HEADS = 4  # the strongest sink heads shown


@dataclass
class SinkHeadsResult(Result):
    """Attention patterns of chosen heads on one window, unedited and under each condition given."""
    column_words: ClassVar[Mapping[str, str]] = {"alpha_0": "first-token share α_0"}

    heads: list[tuple[int, int]]  # (layer, head), strongest sink first
    head_names: list[str]
    tokens: list[str]  # the window's tokens as text (or IDs without a tokenizer)
    conditions: list[str]  # "unedited" first
    patterns: Float[Tensor, "condition head query key"]

    heading = "Attention of the strongest sink heads"
    key_column = "alpha_0"
    view_caption = "attention of the strongest sink heads (unedited)"

    def to_pandas(self) -> pd.DataFrame:
        """Per head and condition: the first token's mean attention share (α_0) over the window's queries."""
        alpha0 = self.patterns[..., 0].mean(dim=-1)  # [condition, head]
        return pd.DataFrame([{"condition": c, "layer": layer, "head": head, "alpha_0": alpha0[i, j].item()}
                             for i, c in enumerate(self.conditions) for j, (layer, head) in enumerate(self.heads)])

    def headline(self) -> dict[str, Any]:
        return {"heads": [list(h) for h in self.heads], "alpha_0": self.patterns[0, :, :, 0].mean(dim=-1).tolist()}

    def summary(self) -> str:
        lines = [f"the {len(self.heads)} strongest sink heads on a {len(self.tokens)}-token window "
                 "(α_0: the first token's mean attention share over the window's queries):"]
        alpha0 = self.patterns[..., 0].mean(dim=-1)
        for i, condition in enumerate(self.conditions):
            lines.append(f"  {condition}: " + ", ".join(f"{name} α_0 {alpha0[i, j]:.2f}" for j, name in enumerate(self.head_names)))
        return "\n".join(lines)

    def page_summary(self) -> str:
        return self.summary().splitlines()[0]  # the page's table has α_0 per head and condition

    def show(self, condition: int = 0) -> Any:
        """circuitsvis ``attention_heads`` of the heads under ``conditions[condition]`` (two decimals: a light page)."""
        from circuitsvis.attention import attention_heads

        alpha0 = self.patterns[condition, :, :, 0].mean(dim=-1)
        names = [f"{name} α0={a:.2f}" for name, a in zip(self.head_names, alpha0.tolist())]
        rounded = torch.round(self.patterns[condition].double(), decimals=2).tolist()
        return attention_heads(attention=rounded, tokens=list(self.tokens), attention_head_names=names)

    def views(self) -> dict[str, Any]:
        """One view per condition, captioned with it."""
        return {self.view_caption if i == 0 else f"the same heads, {c}": self.show(i) for i, c in enumerate(self.conditions)}


def token_strings(model: Any, ids: Sequence[int]) -> list[str]:
    """Each token as text through ``model.tokenizer``, else its ID."""
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        try:
            return [tokenizer.decode([i]) for i in ids]
        except Exception:  # noqa: BLE001 - a tokenizer that cannot decode single IDs: fall back to numbers
            pass
    return [str(i) for i in ids]


@one_adapter_per_call
def sink_heads(
    model: Any,
    tokens: Int[Tensor, " seq"],
    heads: Sequence[tuple[int, int]],
    *,
    conditions: Mapping[str, Sequence[Intervention]] | None = None,
    window: int = WINDOW,
) -> SinkHeadsResult:
    """The attention patterns of ``heads`` on the first ``window`` of ``tokens``, unedited and under each condition.

    Args:
        model: a TransformerLens model; never modified (edits are scoped hooks).
        tokens: one sequence of token IDs.
        heads: (layer, head) pairs, e.g. the strongest sink heads.
        conditions: ``{name: interventions}`` to show the same heads under (e.g. the edit that removes the sink).
        window: tokens shown from the start of the sequence.

    Returns:
        A :class:`SinkHeadsResult`; ``show()`` draws it with circuitsvis.
    """
    if tokens.ndim != 1:
        raise LensBiasError(f"sink_heads shows one sequence of token IDs [seq]; got shape {tuple(tokens.shape)} (pass tokens[i])")
    if not heads:
        raise LensBiasError("sink_heads needs at least one (layer, head); pick them from report.sinks.rate_by_head(0)")
    info = ModelAdapter.of(model).info
    bad = [(layer, head) for layer, head in heads if not (0 <= layer < info.n_layers and 0 <= head < info.n_heads)]
    if bad:
        raise LensBiasError(f"heads {bad} are not in this model ({info.n_layers} layers × {info.n_heads} heads)")
    window_tokens = tokens[:window][None]
    layers = sorted({layer for layer, _ in heads})
    probes = {layer: Probe(f"blocks.{layer}.attn.hook_pattern", "pattern", lambda x: x) for layer in layers}
    named = {"unedited": [], **(dict(conditions) if conditions else {})}
    patterns = []
    adapter = ModelAdapter.of(model)
    for edits in named.values():
        kept = adapter.collect(window_tokens, list(probes.values()), hooks=edit_hooks(model, list(edits)), progress=False)
        patterns.append(torch.stack([kept[probes[layer].key][0, head] for layer, head in heads]).float())
    return SinkHeadsResult(heads=[(int(a), int(b)) for a, b in heads], head_names=[f"L{a}H{b}" for a, b in heads],
                           tokens=token_strings(model, window_tokens[0].tolist()), conditions=list(named), patterns=torch.stack(patterns))


@dataclass(frozen=True)
class SinkHeads(ExtraPass[SinkHeadsResult]):
    """The report's view of its strongest sink heads on its first sequence, on the unedited model (a short pass of
    its own per condition); with the sink attribution, also under the cheapest condition that removes the sink.
    A trained model's whole report draws it; a random init has no sink to show."""

    name: ClassVar[str] = "sink_heads"
    order = 30

    def in_default(self, regime: str) -> bool:
        return regime == "trained"

    def check(self, plan: RunPlan) -> None:
        if not any(p.analysis.name == "sinks" for p in plan.sections) and "sinks" not in plan.skipped:
            raise LensBiasError("the sink_heads view shows the heads the sinks section ranks: ask for sections=[..., 'sinks', 'sink_heads']")

    def applies(self, plan: RunPlan, results: Results) -> bool:
        return plan.regime == "trained" and "sinks" in results and plan.spec.kind != "embeddings" and not plan.interventions

    def run(self, plan: RunPlan, results: Results) -> SinkHeadsResult:
        assert plan.tokens is not None  # applies() holds only for token inputs
        rate = results.of(Sinks).rate_by_head(0)
        top = rate.flatten().topk(min(N_HEADS, rate.numel())).indices.tolist()
        heads = [(i // rate.shape[1], i % rate.shape[1]) for i in top]
        conditions = {}
        attribution = results.get("sink_attribution")
        if isinstance(attribution, SinkAttributionResult) and (name := attribution.headline()["cheapest_removal"]) is not None:
            records = attribution.interventions[attribution.conditions.index(name)]
            conditions[f"under {name}"] = [Intervention.from_dict(record) for record in records]
        return sink_heads(plan.model, plan.tokens[0], heads, conditions=conditions)
