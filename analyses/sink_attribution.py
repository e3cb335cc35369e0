"""The causal chain of a trained model's attention sink, measured link by link: what makes the sink, and what
removes or moves it at what perplexity cost.

The structural-origin paper's chain: causal averaging leaves the first token unaveraged; FFN super neurons (and
their super weight) amplify it into a massive activation in a few residual dimensions — a dimension disparity —
and the disparity makes the first token an attention sink. :func:`sink_attribution` edits one link at a time and
measures, on the same tokens, every link downstream: the massive dimension's value at position 0 after every
block, the disparity (max/mean |x| of position 0 after each pre-attention norm), Sink_0 per layer and head
(Gu et al.'s metric, α_0 > ε), and the perplexity of the tokens.

By default the conditions come from the model's own anatomy, found on calibration sequences disjoint from the
measured ones (the super-weight candidates, the massive dimensions and their means):

| condition | the edit (an intervention from ``lens_bias.hooks``) | the link it tests |
|---|---|---|
| unedited | — | |
| super weight (layer, row, col) removed | ``RemoveWeight``, for each of the top candidates | super weight → massive dim |
| down_proj row removed | ``ZeroOutputDims``: everything the layer's MLP writes into the massive dim | super neurons → massive dim |
| random weights removed | ``RemoveWeights`` of as many random weights of the same matrix | control |
| massive dims at the later positions' mean | ``SetActivations`` after every block: position 0's massive dims set to this model's mean over positions ≥ 1 (not Sun et al.'s mean ablation, which keeps their mean at the massive token) | massive dim → sink |
| position 0 at the later positions' mean state | ``SetActivations`` after every block: position 0's whole state set to the mean state of positions ≥ 1 | parity: no first-token privilege left |
| MaskToSelf(k), AmplifyVariance(k, λ) | a later token made to look like the first | what moves the sink |
| learned sinks removed (a model that declares them, GPT-OSS) | ``RemoveLearnedSinks``: every head's sink logit at −∞ | learned sink → attention |

On a mixture of experts the three weight conditions are left out (their super weights are per expert:
``super_experts``), and the massive dims are read from the block outputs alone. Where the model declares a learned
sink, every condition also reports its share, and where the attention it frees goes: to key 0, to one later key,
or spread over the keys.

The means are constants per layer estimated on the calibration sequences, so no information flows from later
tokens of a measured sequence into its position 0. Every condition's edits are recorded as ``to_dict()``; pass
your own as ``conditions={"name": [interventions]}``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence, Union

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.analyses.base import Result, measure
from lens_bias.analyses.massive import MassiveActivations
from lens_bias.analyses.perplexity import perplexity
from lens_bias.analyses.sinks import DEFAULT_EPS, Sinks
from lens_bias.analyses.super_neurons import SuperNeurons, dominance_ratio
from lens_bias.analyses.super_weights import SuperWeights
from lens_bias.core.adapter import ModelAdapter, Probe
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.figures import integer_ticks, new_figure
from lens_bias.core.inputs import InputSpec, check_later_position
from lens_bias.hooks import (
    AmplifyVariance,
    Compose,
    Intervention,
    MaskToSelf,
    RemoveLearnedSinks,
    RemoveWeight,
    RemoveWeights,
    SetActivations,
    ZeroOutputDims,
)
from lens_bias.hooks.base import edit_hooks, edit_records, fix_for_inputs, refusal

__all__ = ["Condition", "anatomy_conditions", "sink_attribution", "SinkAttributionResult", "VERDICTS", "LEARNED_LINK"]

logger = logging.getLogger(__name__)

# How far an edit moves Sink_0 (paired over the measured sequences), worst to best for the sink.
VERDICTS = ("removes the sink", "weakens it", "no effect", "strengthens it")
# "removes": Sink_0 falls to at most this share of the unedited model's; weakens / strengthens: a paired change
# beyond 3 SE *and* of at least 5 points of Sink_0 (significance alone calls 70.6% → 69.8% a weakening on 32 sequences).
_REMOVED, _SE, _POINTS = 0.1, 3.0, 5.0
_MOVES = "a later token made first-like"  # the link of the conditions that move the sink: they test no necessity
LEARNED_LINK = "learned sink → attention"  # the link of "learned sinks removed"
# Where freed attention goes: one destination when it takes at least this share of what the learned sink gave up.
_DESTINATION = 0.5


@dataclass(frozen=True)
class Condition:
    """One edit of the model: a name, what it does in words, the link of the chain it tests, its interventions."""

    name: str
    description: str
    link: str
    interventions: tuple[Intervention, ...] = ()


def _mean_state_probe(hook: str) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [d]: Σ over the batch and positions ≥ 1
        return x[:, 1:].float().sum(dim=(0, 1))

    return Probe(hook, "sum_after_first", fn, combine="sum")


def _mean_states(model: Any, calibration: Tensor, batch_size: int | None, progress: bool) -> Float[Tensor, "layer d_model"]:
    """Each block output's mean state over the calibration sequences and their positions ≥ 1."""
    adapter = ModelAdapter(model)
    probes = [_mean_state_probe(f"blocks.{layer}.hook_resid_post") for layer in range(adapter.info.n_layers)]
    kept = adapter.collect(calibration, probes, batch_size=batch_size, progress=progress, desc="calibration means")
    count = calibration.shape[0] * (calibration.shape[1] - 1)
    return torch.stack([kept[p.key] / count for p in probes]).float()


def _at_every_block(n_layers: int, dims: Sequence[int], values: Tensor) -> Compose:
    """Position 0's ``dims`` set to ``values[layer]`` after every block."""
    return Compose(tuple(SetActivations(layer=layer, dims=tuple(dims), positions=(0,), values=tuple(values[layer, list(dims)].tolist()))
                         for layer in range(n_layers)))


def anatomy_conditions(
    model: Any, calibration: Int[Tensor, "n seq"], *, n_candidates: int = 2, n_random: int = 100, position: int = 8, factor: float = 8.0,
    seed: int = 0, batch_size: int | None = None, progress: bool = False,
) -> list[Condition]:
    """The default conditions of :func:`sink_attribution`, from the model's anatomy on ``calibration`` sequences.

    Args:
        model: a TransformerLens model with MLPs exposing ``W_out``; never modified.
        calibration: token IDs ``[n, seq]``, disjoint from the sequences that will be measured.
        n_candidates: super-weight candidates removed one at a time (by contribution, Yu et al.).
        n_random: random weights of the top candidate's matrix removed together (the control).
        position: the later token of MaskToSelf and AmplifyVariance.
        factor: λ of AmplifyVariance.
        seed: seed of the random control.
        batch_size: sequences per forward pass.
        progress: progress bars over the two calibration passes.

    Returns:
        The conditions, "unedited" first.
    """
    info = ModelAdapter(model).info
    if info.attn_only or info.d_mlp is None:
        raise LensBiasError("sink_attribution's default conditions edit MLP down-projections; this model is attention-only: pass conditions=")
    if position >= calibration.shape[1]:
        raise LensBiasError(f"position {position} lies outside sequences of {calibration.shape[1]} tokens; pass position < {calibration.shape[1]}")
    dense = info.n_experts is None  # a mixture of experts has its super weights per expert, not one per layer
    sections = [MassiveActivations(), *([SuperWeights(top=n_candidates), SuperNeurons()] if dense else [])]
    found = measure(model, calibration, sections, batch_size=batch_size, progress=progress)
    massive = found["massive_activations"]
    onset = massive.onset_layer()  # type: ignore[attr-defined]
    dims = massive.dims(onset, positions=(0,)) if onset is not None else []  # type: ignore[attr-defined]
    # no massive activation by Sun's rule: the largest dim
    dims = dims or [found["super_neurons"].massive_dim if dense else massive.largest_at_first()[1]]  # type: ignore[attr-defined]
    means = _mean_states(model, calibration, batch_size, progress)
    conditions = [Condition("unedited", "the model as it is", "")]
    if dense:
        conditions += _weight_conditions(found["super_weights"], info.d_model, int(info.d_mlp), n_candidates, n_random, seed)
    conditions += [
        Condition(f"massive dims {dims} at the later positions' mean",
                  f"position 0's dims {dims} set after every block to this model's mean over positions ≥ 1 (calibration sequences): close to "
                  "zeroing them, unlike Sun et al.'s mean ablation, which keeps their own mean at the massive token",
                  "massive dim → sink", (_at_every_block(info.n_layers, dims, means),)),
        Condition("position 0 at the later positions' mean state",
                  "position 0's whole state set after every block to this model's mean state over positions ≥ 1 (calibration sequences): "
                  "first-token parity, which tests no single link", "first-token privilege → sink", (_at_every_block(info.n_layers, range(info.d_model), means),)),
        Condition(f"MaskToSelf({position})", f"token {position} attends only to itself in every layer", _MOVES,
                  (MaskToSelf(position=position),)),
        Condition(f"AmplifyVariance({position}, {factor:g})", f"token {position}'s attention output spread {factor:g}× around its batch mean",
                  _MOVES, (AmplifyVariance(position=position, factor=factor),)),
    ]
    if info.learned_sinks:
        conditions.append(Condition("learned sinks removed", "every head's learned sink logit at −∞: attention over the keys alone", LEARNED_LINK,
                                    (RemoveLearnedSinks(),)))
    return conditions


def _weight_conditions(weights: Any, d_model: int, d_mlp: int, n_candidates: int, n_random: int, seed: int) -> list[Condition]:
    """The super-weight candidates removed one at a time, the top candidate's down_proj row, and the random control."""
    layer, row, col = weights.coordinates()[0]
    generator = torch.Generator().manual_seed(seed)
    picks = torch.randperm(d_model * d_mlp, generator=generator)
    picks = picks[picks != col * d_model + row][:n_random]
    matrix = f"layers[{layer}].mlp.down_proj.weight"
    conditions = [Condition(f"super weight L{l}[{r}, {c}] removed", f"layers[{l}].mlp.down_proj.weight[{r}, {c}] = 0",
                            "super weight → massive dim", (RemoveWeight(layer=l, row=r, col=c),)) for l, r, c in weights.coordinates()[:n_candidates]]
    conditions += [
        Condition(f"down_proj row {row} of layer {layer} removed", f"{matrix}[{row}, :] = 0: nothing that MLP writes reaches dim {row}",
                  "super neurons → massive dim", (ZeroOutputDims(layer=layer, dims=(row,)),)),
        Condition(f"{len(picks)} random weights removed", f"{len(picks)} random weights of {matrix} = 0 (seed {seed})", "control",
                  (RemoveWeights(weights=tuple((layer, int(i) % d_model, int(i) // d_model) for i in picks)),)),
    ]
    return conditions


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
    column_words = {"massive": "massive dims max |h_0| (over layers)", "learned_sink": "learned-sink share α_learned",
                    "freed_attention": "where the learned sink's attention went"}
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
            "necessary_links": sorted(set(table.link[table.verdict.isin(VERDICTS[:2])]) - {"", "control", _MOVES}),
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


def _condition_list(conditions: Union[Mapping[str, Sequence[Intervention]], Sequence[Condition]]) -> list[Condition]:
    if isinstance(conditions, Mapping):
        given = [Condition(name, " + ".join(type(iv).__name__ for iv in ivs) or "the model as it is", "", tuple(ivs)) for name, ivs in conditions.items()]
    else:
        given = list(conditions)
        if not all(isinstance(c, Condition) for c in given):
            raise WrongType("conditions are {name: [interventions]} or a list of Condition")
    if not given or given[0].interventions:
        given.insert(0, Condition("unedited", "the model as it is", ""))
    return given


def sink_attribution(
    model: Any,
    tokens: Int[Tensor, "n seq"],
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
    progress: bool = False,
) -> SinkAttributionResult:
    """Measure the sink's causal chain on ``tokens``: one pass per condition, and its perplexity.

    >>> import lens_bias
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=16, seed=0)
    >>> r = sink_attribution(m, lens_bias.random_tokens(8, 16, 97), calibration=lens_bias.random_tokens(8, 16, 97, seed=1), n_random=10)
    >>> r.conditions[0], r.to_pandas().shape[0] == len(r.conditions)
    ('unedited', True)

    Args:
        model: a TransformerLens model (the default conditions need MLPs exposing ``W_out``); never modified.
        tokens: token IDs ``[n, seq]`` whose sink and perplexity are measured (real text: ``lens_bias.text_tokens``).
        calibration: token IDs for finding the anatomy and the means the default conditions set, disjoint from
            ``tokens`` (default: the odd rows of ``tokens`` calibrate and the even rows are measured).
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
    if tokens.ndim != 2 or tokens.dtype.is_floating_point:
        raise LensBiasError("sink_attribution measures token IDs [n, seq] (e.g. lens_bias.text_tokens(model.tokenizer, 32, 64))")
    if calibration is None:
        tokens, calibration = tokens[0::2], tokens[1::2]
    if tokens.shape[0] < 2 or calibration.shape[0] < 1:
        raise LensBiasError(f"sink_attribution needs at least 2 measured and 1 calibration sequence, got {tokens.shape[0]} and {calibration.shape[0]}")
    check_later_position(position, tokens.shape[1])
    chosen = _condition_list(conditions) if conditions is not None else anatomy_conditions(
        model, calibration, n_candidates=n_candidates, n_random=n_random, position=position, factor=factor, seed=seed, batch_size=batch_size,
        progress=progress)
    skipped: dict[str, str] = {}
    if conditions is None:  # a default condition whose edit cannot act on this model is left out and listed, not run
        skipped = {c.name: why for c in chosen if (why := refusal(model, c.interventions)) is not None}
        chosen = [c for c in chosen if c.name not in skipped]
    records = [edit_records(c.interventions) for c in chosen]  # before the passes: an edit that cannot be recorded fails now
    adapter = ModelAdapter(model)
    n_layers = adapter.info.n_layers
    dims = _massive_dims(chosen, model, calibration, batch_size, progress)
    sinks = Sinks(eps=eps, per_sequence=True)  # paired tests between conditions read α of every sequence
    spec = InputSpec(kind="tokens", n=tokens.shape[0], seq_len=tokens.shape[1], seed=None)
    extra = {("massive", layer): Probe(f"blocks.{layer}.hook_resid_post", f"abs@0x{dims}", lambda x: x[:, 0, dims].float().abs().max(dim=-1).values)
             for layer in range(n_layers)}
    extra.update({("disparity", layer): Probe(f"blocks.{layer}.ln1.hook_normalized", "dominance@0", lambda x: dominance_ratio(x[:, 0]))
                  for layer in range(n_layers)})
    per_condition = []
    for condition in tqdm(chosen, desc="sink attribution", disable=not progress):
        probes = sinks.probes(adapter)
        edits = fix_for_inputs(model, list(condition.interventions), tokens, batch_size)  # the same at any batch size
        kept = adapter.collect(tokens, [*probes.values(), *extra.values()], batch_size=batch_size, hooks=edit_hooks(model, edits),
                               progress=False, desc=condition.name)
        result = sinks.finalize(adapter, {name: kept[p.key] for name, p in probes.items()}, spec)
        alpha = result.alpha  # [n, layer, head, key]
        per_condition.append({
            "rate": result.rate_by_head(0).mean(dim=1), "rate_head": result.rate_by_head(0),
            "per_sequence": (alpha[..., 0] > eps).float().mean(dim=(1, 2)) * 100,
            "later": (alpha[..., position] > eps).float().mean(dim=(1, 2)) * 100,
            "alpha0": result.share(0).mean(dim=1),
            "key_mass": result.mass().mean(dim=(0, 1)),
            "learned": result.learned_share().mean(dim=1) if result.declares_sink else None,
            "massive": torch.stack([kept[extra["massive", layer].key].mean() for layer in range(n_layers)]),
            "disparity": torch.stack([kept[extra["disparity", layer].key].mean() for layer in range(n_layers)]),
            "perplexity": perplexity(model, tokens, interventions=edits, batch_size=batch_size),
        })
        logger.info("%s: Sink_0 %.1f%%, perplexity %.4g", condition.name, per_condition[-1]["per_sequence"].mean(), per_condition[-1]["perplexity"])

    def stack(key: str) -> Tensor:
        return torch.stack([row[key] for row in per_condition])

    return SinkAttributionResult(
        conditions=[c.name for c in chosen], descriptions=[c.description for c in chosen], links=[c.link for c in chosen], interventions=records,
        sink_rate=stack("rate"), sink_rate_head=stack("rate_head"), sink_per_sequence=stack("per_sequence"), later_per_sequence=stack("later"),
        alpha0=stack("alpha0"), massive_value=stack("massive"), disparity=stack("disparity"), perplexity=[row["perplexity"] for row in per_condition],
        massive_dims=dims, position=position, eps=eps, n=int(tokens.shape[0]), seq_len=int(tokens.shape[1]), skipped=skipped,
        learned_share=stack("learned") if adapter.info.learned_sinks else None, key_mass=stack("key_mass"),
    )


def _massive_dims(conditions: Sequence[Condition], model: Any, calibration: Tensor, batch_size: int | None, progress: bool) -> list[int]:
    """The dims the massive-value column reads: those the conditions set at position 0, else the model's largest."""
    for condition in conditions:
        for iv in condition.interventions:
            parts = iv.parts if isinstance(iv, Compose) else (iv,)
            dims = list(dict.fromkeys(d for part in parts if isinstance(part, SetActivations) and part.positions == (0,) for d in part.dims))
            if 0 < len(dims) < ModelAdapter(model).info.d_model:
                return dims  # in the order the condition set them: the largest massive dim first
    if ModelAdapter(model).info.n_experts is not None:  # no single MLP per layer to rank
        return [measure(model, calibration, [MassiveActivations()], batch_size=batch_size)["massive_activations"].largest_at_first()[1]]  # type: ignore[attr-defined]
    found = measure(model, calibration, [SuperNeurons()], batch_size=batch_size, progress=progress)["super_neurons"]
    return [found.massive_dim]  # type: ignore[attr-defined]
