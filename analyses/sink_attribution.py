"""The causal chain of a trained model's attention sink, measured link by link: what makes the sink, and what
removes or moves it at what perplexity cost.

The structural-origin paper's chain: causal averaging leaves the first token unaveraged; FFN super neurons (and
their super weight) amplify it into a massive activation in a few residual dimensions — a dimension disparity —
and the disparity makes the first token an attention sink. :func:`sink_attribution` edits one link at a time and
measures, on the same tokens, every link downstream: the massive dimension's value at position 0 after every
block, the disparity (max/mean |x| of position 0 after each pre-attention norm), Sink_0 per layer and head
(Gu et al.'s metric, α_0 > ε), and the perplexity of the tokens.

The conditions are named edits (``lens_bias.analyses.sink_conditions``): by default those of the model's own
anatomy, found on calibration sequences disjoint from the measured ones; or your own, ``conditions={"name":
[interventions]}``. Every condition's edits are recorded as ``to_dict()``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence, Union

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.analyses.base import Result, Results
from lens_bias.analyses.perplexity import perplexity
from lens_bias.analyses.plan import ExtraPass, RunPlan
from lens_bias.analyses.sink_conditions import MOVES, Condition, anatomy_conditions, condition_list, massive_dims
from lens_bias.analyses.sinks import DEFAULT_EPS, Sinks
from lens_bias.analyses.super_neurons import dominance_ratio
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import integer_ticks, new_figure
from lens_bias.core.inputs import InputSpec, check_later_position
from lens_bias.core.probes import Probe
from lens_bias.core.token_inputs import takes_token_inputs
from lens_bias.hooks.base import Intervention, edit_hooks, edit_records, fix_for_inputs, refusal

__all__ = ["sink_attribution", "SinkAttributionResult", "VERDICTS"]

logger = logging.getLogger(__name__)

# How far an edit moves Sink_0 (paired over the measured sequences), worst to best for the sink.
VERDICTS = ("removes the sink", "weakens it", "no effect", "strengthens it")
# "removes": Sink_0 falls to at most this share of the unedited model's; weakens / strengthens: a paired change
# beyond 3 SE *and* of at least 5 points of Sink_0 (significance alone calls 70.6% → 69.8% a weakening on 32 sequences).
_REMOVED, _SE, _POINTS = 0.1, 3.0, 5.0
# Where freed attention goes: one destination when it takes at least this share of what the learned sink gave up.
_DESTINATION = 0.5


@dataclass
class SinkAttributionResult(Result):
    """Per condition: Sink_0 per layer and head, α_0, the massive dims and the disparity at position 0, perplexity."""

    conditions: list[str]
    descriptions: list[str]
    links: list[str]  # the link of the chain each condition tests ("" for the unedited model)
    interventions: list[list[dict[str, Any]]]  # each condition's edits, as Intervention.to_dict()
    sink_rate: Float[Tensor, "condition layer"]  # Sink_0 (%) per layer, over sequences and heads
    sink_rate_head: Float[Tensor, "condition layer head"]
    sink_per_sequence: Float[Tensor, "condition n"]  # % of (layer, head) with α_0 > ε, per measured sequence
    later_per_sequence: Float[Tensor, "condition n"]  # the same at the later position (MaskToSelf / AmplifyVariance's)
    alpha0: Float[Tensor, "condition layer"]  # mean α_0 (first-token attention share)
    massive_value: Float[Tensor, "condition layer"]  # mean over sequences of max |h_0[d]| over the massive dims, after each block
    disparity: Float[Tensor, "condition layer"]  # mean max/mean |x_0| after each block's pre-attention norm
    perplexity: list[float]
    massive_dims: list[int]
    position: int  # the later position
    eps: float
    n: int
    seq_len: int
    # default conditions left out because their edits cannot act on this model -> why, in one line
    skipped: dict[str, str] = field(default_factory=dict)
    # Where the model declares a learned sink: its mean share per condition and layer; and, for every model, the
    # mean attention mass each key receives (over layers, heads and queries), which says where freed attention went.
    learned_share: Float[Tensor, "condition layer"] | None = None
    key_mass: Float[Tensor, "condition key"] | None = None

    heading = "What removes the sink"
    column_words: ClassVar[Mapping[str, str]] = {
        "link": "link of the chain", "verdict": "verdict", "edit": "what was done", "alpha_0": "first-token share α_0",
        "massive": "massive dims max |h_0| (over layers)", "learned_sink": "learned-sink share α_learned",
        "freed_attention": "where the learned sink's attention went", "disparity": "disparity max/mean |x_0| (max over layers)",
        "perplexity": "perplexity", "ppl_ratio": "perplexity (× unedited)", "diff_in_se": "change in Sink_0 (SE)",
        r"sink_(\d+)_diff_in_se": r"change in Sink_\1 (SE)", r"sink_(\d+)": r"Sink_\1 (%)",
    }
    headline_labels = {"cheapest_removal": "cheapest condition that removes the sink", "cheapest_removal_ppl_ratio": "its perplexity (× unedited)",
                       "necessary_links": "links whose edit removes or weakens the sink"}
    plot_caption = "Sink_0 (%) per condition and layer"

    def _paired(self, values: Tensor) -> tuple[Tensor, Tensor]:
        """Mean difference from the unedited model and its standard error over the sequences, per condition."""
        diff = values - values[0]
        se = diff.std(dim=1) / diff.shape[1] ** 0.5 if diff.shape[1] > 1 else torch.zeros(diff.shape[0])
        return diff.mean(dim=1), se

    def verdicts(self) -> list[str]:
        """What each condition does to Sink_0 (one of ``VERDICTS``), paired over the same sequences."""
        sink = self.sink_per_sequence.mean(dim=1)
        diff, se = self._paired(self.sink_per_sequence)
        out = []
        for i in range(len(self.conditions)):
            if i == 0:
                out.append("")
            elif sink[0] > 0 and sink[i] <= _REMOVED * sink[0]:
                out.append(VERDICTS[0])
            elif diff[i] < -_SE * se[i] and diff[i] <= -_POINTS:
                out.append(VERDICTS[1])
            elif diff[i] > _SE * se[i] and diff[i] >= _POINTS:
                out.append(VERDICTS[3])
            else:
                out.append(VERDICTS[2])
        return out

    def to_pandas(self) -> pd.DataFrame:
        sink, later = self.sink_per_sequence.mean(dim=1), self.later_per_sequence.mean(dim=1)
        diff, se = self._paired(self.sink_per_sequence)
        later_diff, later_se = self._paired(self.later_per_sequence)
        return pd.DataFrame({
            "condition": self.conditions, "link": self.links, "sink_0": sink.tolist(),
            "diff_in_se": [0.0 if s == 0 else (d / s).item() for d, s in zip(diff, se)], "verdict": self.verdicts(),
            "alpha_0": self.alpha0.mean(dim=1).tolist(), "massive": self.massive_value.max(dim=1).values.tolist(),
            "disparity": self.disparity.max(dim=1).values.tolist(), f"sink_{self.position}": later.tolist(),
            f"sink_{self.position}_diff_in_se": [0.0 if s == 0 else (d / s).item() for d, s in zip(later_diff, later_se)],
            "perplexity": self.perplexity, "ppl_ratio": [p / self.perplexity[0] for p in self.perplexity], "edit": self.descriptions,
            **({"learned_sink": self.learned_share.mean(dim=1).tolist(), "freed_attention": self.destinations()} if self.learned_share is not None else {}),
        })

    def destinations(self) -> list[str]:
        """Per condition, where the attention the learned sink gave up (against the unedited model) went: to key 0,
        to one later key (each when it took at least half), or spread over the keys; "" where none was freed."""
        if self.learned_share is None or self.key_mass is None:
            return [""] * len(self.conditions)
        learned = self.learned_share.mean(dim=1)
        out = []
        for i in range(len(self.conditions)):
            freed = (learned[0] - learned[i]).item()
            if freed < 0.01:
                out.append("")
                continue
            gain = (self.key_mass[i] - self.key_mass[0]) / freed
            later = int(gain[1:].argmax()) + 1 if len(gain) > 1 else 0
            if gain[0] >= _DESTINATION:
                out.append(f"to key 0 ({gain[0]:.0%} of the {freed:.2f} freed)")
            elif later and gain[later] >= _DESTINATION:
                out.append(f"to key {later} ({gain[later]:.0%} of the {freed:.2f} freed)")
            else:
                out.append(f"spread over the keys (key 0 {gain[0]:.0%}, at most {gain[1:].max():.0%} to any later key, of the {freed:.2f} freed)")
        return out

    def chain(self) -> pd.DataFrame:
        """One row per link of the chain: the condition that tests it, its verdict, Sink_0 before → after, the cost."""
        table = self.to_pandas()
        rows = table[table.link != ""]
        return pd.DataFrame({
            "link": rows.link, "condition": rows.condition, "verdict": rows.verdict,
            "sink_0": [f"{table.sink_0[0]:.1f}% → {s:.1f}%" for s in rows.sink_0], "ppl_ratio": rows.ppl_ratio,
        }).reset_index(drop=True)

    def headline(self) -> dict[str, Any]:
        table = self.to_pandas()
        removing = table[table.verdict == VERDICTS[0]]
        cheapest = removing.sort_values("ppl_ratio").iloc[0] if len(removing) else None
        return {
            "sink_0": table.sink_0[0],
            "removed_by": removing.condition.tolist(),
            "cheapest_removal": None if cheapest is None else cheapest.condition,
            "cheapest_removal_ppl_ratio": None if cheapest is None else float(cheapest.ppl_ratio),
            "necessary_links": sorted(set(table.link[table.verdict.isin(VERDICTS[:2])]) - {"", "control", MOVES}),
        }

    def summary(self) -> str:
        table = self.to_pandas()
        k = self.position
        lines = [f"sink attribution ({self.n} sequences of {self.seq_len} tokens; Sink_0 = % of (layer, head) with α_0 > {self.eps}; "
                 f"verdicts paired over the sequences: a change beyond {_SE:g} SE and of at least {_POINTS:g} points; "
                 f"removed = at most {_REMOVED:.0%} of the unedited Sink_0):"]
        for row in table.itertuples():
            verdict = f" → {row.verdict}" if row.verdict else ""
            learned = f", learned sink {row.learned_sink:.3f}" if self.learned_share is not None else ""
            freed = f", freed attention {row.freed_attention}" if getattr(row, "freed_attention", "") else ""
            lines.append(f"  {row.condition:<44} Sink_0 {row.sink_0:5.1f}%{verdict}; massive |h_0| {row.massive:.4g}, disparity {row.disparity:.3g}, "
                         f"Sink_{k} {getattr(row, f'sink_{k}'):.1f}%{learned}, perplexity {row.perplexity:.4g} (×{row.ppl_ratio:.3g}){freed}")
        h = self.headline()
        if h["cheapest_removal"] is not None:
            lines.append(f"  the sink goes with: {', '.join(h['removed_by'])}; cheapest: {h['cheapest_removal']} (perplexity ×{h['cheapest_removal_ppl_ratio']:.3g})")
        else:
            lines.append("  no condition removes the sink")
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)

    def page_summary(self) -> str:
        """The rule of the verdicts and what removes the sink (the page's table has a row per condition)."""
        lines = self.summary().splitlines()
        return "\n".join([lines[0], *lines[len(self.conditions) + 1:]])

    def plot(self) -> Any:
        """Sink_0 (%) as a condition × layer heatmap."""
        fig = new_figure(8, 0.45 * len(self.conditions) + 1.5)
        ax = fig.subplots()
        image = ax.imshow(self.sink_rate.numpy(), vmin=0, vmax=100, cmap="viridis", aspect="auto", interpolation="nearest")
        integer_ticks(ax, len(self.conditions), self.sink_rate.shape[1])
        ax.set_yticks(range(len(self.conditions)), self.conditions, fontsize=8)
        ax.set_xlabel("layer")
        ax.set_title(f"Sink_0 (%) at ε {self.eps}")
        fig.colorbar(image, ax=ax)
        return fig


def _chain_probes(n_layers: int, dims: list[int]) -> dict[tuple[str, int], Probe]:
    """The links of the chain read beside the sink: the massive dims' largest |h_0| and the disparity, per layer."""
    extra = {("massive", layer): Probe(f"blocks.{layer}.hook_resid_post", f"abs@0x{dims}", lambda x: x[:, 0, dims].float().abs().max(dim=-1).values)
             for layer in range(n_layers)}
    extra.update({("disparity", layer): Probe(f"blocks.{layer}.ln1.hook_normalized", "dominance@0", lambda x: dominance_ratio(x[:, 0]))
                  for layer in range(n_layers)})
    return extra


def _measured(
    model: Any, adapter: ModelAdapter, sinks: Sinks, extra: dict[tuple[str, int], Probe], tokens: Tensor, condition: Condition, position: int,
    batch_size: int | None,
) -> dict[str, Any]:
    """One condition's pass (the sink and the chain's links) and its perplexity."""
    probes = sinks.probes(adapter)
    edits = fix_for_inputs(model, condition.interventions, tokens, batch_size)  # the same at any batch size
    kept = adapter.collect(tokens, [*probes.values(), *extra.values()], batch_size=batch_size, hooks=edit_hooks(model, edits),
                           progress=False, desc=condition.name)
    spec = InputSpec(kind="tokens", n=tokens.shape[0], seq_len=tokens.shape[1], seed=None)
    result = sinks.finalize(adapter, {name: kept[p.key] for name, p in probes.items()}, spec)
    alpha, n_layers, eps = result.per_sequence(), adapter.info.n_layers, sinks.eps  # alpha: [n, layer, head, key]
    return {
        "rate": result.rate_by_head(0).mean(dim=1), "rate_head": result.rate_by_head(0),
        "per_sequence": (alpha[..., 0] > eps).float().mean(dim=(1, 2)) * 100,
        "later": (alpha[..., position] > eps).float().mean(dim=(1, 2)) * 100,
        "alpha0": result.share(0).mean(dim=1),
        "key_mass": result.mass().mean(dim=(0, 1)),
        "learned": result.learned_share().mean(dim=1) if result.declares_sink else None,
        "massive": torch.stack([kept[extra["massive", layer].key].mean() for layer in range(n_layers)]),
        "disparity": torch.stack([kept[extra["disparity", layer].key].mean() for layer in range(n_layers)]),
        "perplexity": perplexity(model, tokens, interventions=edits, batch_size=batch_size, progress=False),
    }


@takes_token_inputs
@one_adapter_per_call
def sink_attribution(
    model: Any,
    inputs: Int[Tensor, "n seq"],
    *,
    calibration: Int[Tensor, "m seq"] | None = None,
    conditions: Union[Mapping[str, Sequence[Intervention]], Sequence[Condition], None] = None,
    eps: float = DEFAULT_EPS,
    n_candidates: int = 2,
    n_random: int = 100,
    position: int = 8,
    factor: float = 8.0,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = True,
) -> SinkAttributionResult:
    """Measure the sink's causal chain on ``inputs``: one pass per condition, and its perplexity.

    >>> import lens_bias
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=16, seed=0)
    >>> r = sink_attribution(m, lens_bias.random_tokens(8, 16, 97), calibration=lens_bias.random_tokens(8, 16, 97, seed=1), n_random=10)
    >>> r.conditions[0], r.to_pandas().shape[0] == len(r.conditions)
    ('unedited', True)

    Args:
        model: a TransformerLens model (the default conditions need MLPs exposing ``W_out``); never modified.
        inputs: token IDs ``[n, seq]`` whose sink and perplexity are measured (real text: ``lens_bias.text_tokens``).
        calibration: token IDs for finding the anatomy and the means the default conditions set, disjoint from
            ``inputs`` (default: the odd rows of ``inputs`` calibrate and the even rows are measured).
        conditions: your own conditions, ``{name: [interventions]}`` or :class:`Condition` objects, instead of
            :func:`anatomy_conditions` (the unedited model is added first when missing).
        eps: Gu et al.'s threshold on α.
        n_candidates: as in :func:`anatomy_conditions`.
        n_random: as in :func:`anatomy_conditions`.
        position: as in :func:`anatomy_conditions`; Sink at this position is measured for every condition.
        factor: as in :func:`anatomy_conditions`.
        seed: as in :func:`anatomy_conditions`.
        batch_size: sequences per forward pass.
        progress: progress bars over the calibration passes and over the conditions.

    Returns:
        A :class:`SinkAttributionResult`; ``to_pandas()`` is the table, ``chain()`` the verdict per link.
    """
    if calibration is None:
        inputs, calibration = inputs[0::2], inputs[1::2]
    if inputs.shape[0] < 2 or calibration.shape[0] < 1:
        raise LensBiasError(f"sink_attribution needs at least 2 measured and 1 calibration sequence, got {inputs.shape[0]} and {calibration.shape[0]}")
    check_later_position(position, inputs.shape[1])
    chosen = condition_list(conditions) if conditions is not None else anatomy_conditions(
        model, calibration, n_candidates=n_candidates, n_random=n_random, position=position, factor=factor, seed=seed, batch_size=batch_size,
        progress=progress)
    skipped: dict[str, str] = {}
    if conditions is None:  # a default condition whose edit cannot act on this model is left out and listed, not run
        skipped = {c.name: why for c in chosen if (why := refusal(model, c.interventions)) is not None}
        chosen = [c for c in chosen if c.name not in skipped]
    records = [edit_records(c.interventions) for c in chosen]  # before the passes: an edit that cannot be recorded fails now
    adapter = ModelAdapter.of(model)
    n_layers = adapter.info.n_layers
    dims = massive_dims(chosen, model, calibration, batch_size, progress)
    sinks = Sinks(eps=eps, per_sequence=True)  # paired tests between conditions read α of every sequence
    extra = _chain_probes(n_layers, dims)
    per_condition = []
    for condition in tqdm(chosen, desc="sink attribution", disable=not progress):
        per_condition.append(_measured(model, adapter, sinks, extra, inputs, condition, position, batch_size))
        logger.info("%s: Sink_0 %.1f%%, perplexity %.4g", condition.name, per_condition[-1]["per_sequence"].mean(), per_condition[-1]["perplexity"])

    def stack(key: str) -> Tensor:
        return torch.stack([row[key] for row in per_condition])

    return SinkAttributionResult(
        conditions=[c.name for c in chosen], descriptions=[c.description for c in chosen], links=[c.link for c in chosen], interventions=records,
        sink_rate=stack("rate"), sink_rate_head=stack("rate_head"), sink_per_sequence=stack("per_sequence"), later_per_sequence=stack("later"),
        alpha0=stack("alpha0"), massive_value=stack("massive"), disparity=stack("disparity"), perplexity=[row["perplexity"] for row in per_condition],
        massive_dims=dims, position=position, eps=eps, n=int(inputs.shape[0]), seq_len=int(inputs.shape[1]), skipped=skipped,
        learned_share=stack("learned") if adapter.info.learned_sinks else None, key_mass=stack("key_mass"),
    )




@dataclass(frozen=True)
class SinkAttribution(ExtraPass[SinkAttributionResult]):
    """The report's sink attribution: :func:`sink_attribution` on the report's token inputs (two passes per condition;
    its odd sequences calibrate, its even ones are measured), whose verdicts join the anatomy
    (``analyze(model, sections=[..., "sink_attribution"])``)."""

    name: ClassVar[str] = "sink_attribution"
    order = 20

    # One already run on these inputs (``lens-bias attribution --html``), shown instead of running it again.
    result: SinkAttributionResult | None = field(default=None, compare=False)

    def check(self, plan: RunPlan) -> None:
        if plan.interventions:
            raise LensBiasError("the sink attribution runs its own edits on the unedited model; for it under your edits call "
                                "lens_bias.sink_attribution with conditions={name: [*your_edits, ...]}")
        if plan.spec.kind == "embeddings":
            raise LensBiasError("the sink attribution measures token inputs (perplexity needs next tokens): pass inputs='text' or 'tokens'")

    def run(self, plan: RunPlan, results: Results) -> SinkAttributionResult:
        if self.result is not None:
            return self.result
        assert plan.tokens is not None  # check refused embedding inputs
        return sink_attribution(plan.model, plan.tokens, batch_size=plan.settings.batch_size, progress=plan.progress)
