"""The conditions of :func:`~lens_bias.analyses.sink_attribution.sink_attribution`: named edits of a model, each
testing one link of its sink's causal chain.

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

from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_bias.analyses.base import Analysis, measure
from lens_bias.analyses.massive import MassiveActivations
from lens_bias.analyses.super_neurons import SuperNeurons
from lens_bias.analyses.super_weights import SuperWeights
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.probes import Probe
from lens_bias.hooks.activations import SetActivations
from lens_bias.hooks.attention import MaskToSelf
from lens_bias.hooks.base import Compose, Intervention
from lens_bias.hooks.learned_sinks import RemoveLearnedSinks
from lens_bias.hooks.sublayer import ZeroOutputDims
from lens_bias.hooks.variance import AmplifyVariance
from lens_bias.hooks.weights import RemoveWeight, RemoveWeights

__all__ = ["Condition", "anatomy_conditions", "condition_list", "massive_dims", "MOVES", "LEARNED_LINK"]

MOVES = "a later token made first-like"  # the link of the conditions that move the sink: they test no necessity
LEARNED_LINK = "learned sink → attention"  # the link of "learned sinks removed"


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
    adapter = ModelAdapter.of(model)
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
    info = ModelAdapter.of(model).info
    if info.attn_only or info.d_mlp is None:
        raise LensBiasError("sink_attribution's default conditions edit MLP down-projections; this model is attention-only: pass conditions=")
    if position >= calibration.shape[1]:
        raise LensBiasError(f"position {position} lies outside sequences of {calibration.shape[1]} tokens; pass position < {calibration.shape[1]}")
    dense = info.n_experts is None  # a mixture of experts has its super weights per expert, not one per layer
    sections: list[Analysis[Any]] = [MassiveActivations()]
    if dense:
        sections += [SuperWeights(top=n_candidates), SuperNeurons()]
    found = measure(model, calibration, sections, batch_size=batch_size, progress=progress)
    massive = found.of(MassiveActivations)
    onset = massive.onset_layer()
    dims = massive.dims(onset, positions=(0,)) if onset is not None else []
    # no massive activation by Sun's rule: the largest dim
    dims = dims or [found.of(SuperNeurons).massive_dim if dense else massive.largest_at_first()[1]]
    means = _mean_states(model, calibration, batch_size, progress)
    conditions = [Condition("unedited", "the model as it is", "")]
    if dense:
        conditions += _weight_conditions(found.of(SuperWeights), info.d_model, int(info.d_mlp), n_candidates, n_random, seed)
    conditions += [
        Condition(f"massive dims {dims} at the later positions' mean",
                  f"position 0's dims {dims} set after every block to this model's mean over positions ≥ 1 (calibration sequences): close to "
                  "zeroing them, unlike Sun et al.'s mean ablation, which keeps their own mean at the massive token",
                  "massive dim → sink", (_at_every_block(info.n_layers, dims, means),)),
        Condition("position 0 at the later positions' mean state",
                  "position 0's whole state set after every block to this model's mean state over positions ≥ 1 (calibration sequences): "
                  "first-token parity, which tests no single link", "first-token privilege → sink", (_at_every_block(info.n_layers, range(info.d_model), means),)),
        Condition(f"MaskToSelf({position})", f"token {position} attends only to itself in every layer", MOVES,
                  (MaskToSelf(position=position),)),
        Condition(f"AmplifyVariance({position}, {factor:g})", f"token {position}'s attention output spread {factor:g}× around its batch mean",
                  MOVES, (AmplifyVariance(position=position, factor=factor),)),
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


def condition_list(conditions: Union[Mapping[str, Sequence[Intervention]], Sequence[Condition]]) -> list[Condition]:
    if isinstance(conditions, Mapping):
        given = [Condition(name, " + ".join(type(iv).__name__ for iv in ivs) or "the model as it is", "", tuple(ivs)) for name, ivs in conditions.items()]
    else:
        given = list(conditions)
        if not all(isinstance(c, Condition) for c in given):
            raise WrongType("conditions are {name: [interventions]} or a list of Condition")
    if not given or given[0].interventions:
        given.insert(0, Condition("unedited", "the model as it is", ""))
    return given


def massive_dims(conditions: Sequence[Condition], model: Any, calibration: Tensor, batch_size: int | None, progress: bool) -> list[int]:
    """The dims the massive-value column reads: those the conditions set at position 0, else the model's largest."""
    for condition in conditions:
        for iv in condition.interventions:
            parts = iv.parts if isinstance(iv, Compose) else (iv,)
            dims = list(dict.fromkeys(d for part in parts if isinstance(part, SetActivations) and part.positions == (0,) for d in part.dims))
            if 0 < len(dims) < ModelAdapter.of(model).info.d_model:
                return dims  # in the order the condition set them: the largest massive dim first
    if ModelAdapter.of(model).info.n_experts is not None:  # no single MLP per layer to rank
        return [measure(model, calibration, [MassiveActivations()], batch_size=batch_size).of(MassiveActivations).largest_at_first()[1]]
    found = measure(model, calibration, [SuperNeurons()], batch_size=batch_size, progress=progress).of(SuperNeurons)
    return [found.massive_dim]
