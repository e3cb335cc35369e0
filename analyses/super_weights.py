"""Super weights (Yu et al., "The Super Weight in Large Language Models", 2024).

One forward pass; at the first token, the largest |value| entering every MLP's down-projection
(``blocks.{l}.mlp.hook_post``) and leaving it (``blocks.{l}.hook_mlp_out``). Where both spike, the output spike's
residual dimension j and the input spike's unit k name one weight, HF ``layers[l].mlp.down_proj.weight[j, k]`` =
TL ``W_out[l][k, j]``, that writes the massive activation. The report section ``super_weights``
(:class:`SuperWeights`, in the shared pass of ``analyze``) and :func:`super_weights` (one pass over your tokens)
return one such candidate per layer, ranked by its **contribution** |W_out[k, j]| · mean |a_k| at the first token,
the size of what that single weight writes into the spike; ``share`` is W_out[k, j] · mean a_k / mean o_j, the
fraction of the mean output spike it writes. The reductions (sums and maxima over sequences) happen inside the
hooks, one row per batch, so memory does not grow with the number of sequences.

:func:`super_weight_table` removes the top candidate with :class:`lens_bias.hooks.weights.RemoveWeight` (hooks only; the
weights stay untouched) and compares the held-out perplexity with two controls: the largest-magnitude other
weight of the same matrix, and random weights of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_bias.analyses.base import Analysis, Result, measure
from lens_bias.analyses.perplexity import PerplexityTable, perplexity_table
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import layer_axis, new_figure
from lens_bias.core.inputs import InputSpec
from lens_bias.core.model_facts import ModelInfo
from lens_bias.core.offload import read_weight
from lens_bias.core.probes import Probe
from lens_bias.core.token_inputs import takes_token_inputs
from lens_bias.hooks.base import InterventionLike
from lens_bias.hooks.weights import RemoveWeight, RemoveWeights

__all__ = ["super_weights", "SuperWeightsResult", "super_weight_table", "SPIKE"]

logger = logging.getLogger(__name__)

SPIKE = 50.0
"""Yu et al.'s detector (LLMSuperWeight's analyze.py): a layer spikes when the largest |value| entering and leaving its
down-projection both exceed this; only a spiking layer's candidate is named a super weight."""


def _at(x: Tensor, position: int) -> Tensor:
    if position >= x.shape[1]:
        raise LensBiasError(f"super_weights: position {position} is outside sequences of {x.shape[1]} tokens")
    return x[:, position].float()


def _sums_at(hook: str, position: int) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [2, d]: Σ x and Σ |x| over the batch at the position
        at = _at(x, position)
        return torch.stack([at.sum(dim=0), at.abs().sum(dim=0)])

    return Probe(hook, f"sums@{position}", fn, combine="sum")


def _abs_max_at(hook: str, position: int) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [d]: max |x| over the batch at the position
        return _at(x, position).abs().max(dim=0).values

    return Probe(hook, f"abs_max@{position}", fn, combine="max")


def check_top_and_position(top: int, position: int) -> None:
    """``top`` a positive int and ``position`` a non-negative one (the parameters of the spike readers)."""
    for name, value in (("top", top), ("position", position)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "top" else 0):
            raise LensBiasError(f"{name} must be a {'positive' if name == 'top' else 'non-negative'} int, got {value!r}")


def _w_out(model: Any, layer: int) -> Float[Tensor, "d_mlp d_model"]:
    try:
        return read_weight(model.blocks[layer].mlp, "W_out")
    except (AttributeError, TypeError):
        raise LensBiasError(f"super weights read blocks[{layer}].mlp.W_out, which this {type(model).__name__} does not expose") from None


@dataclass
class SuperWeightsResult(Result):
    """One candidate weight per layer (output spike dim × input spike unit), and the spikes themselves."""
    column_words: ClassVar[Mapping[str, str]] = {
        "weight": "weight", "weight_rank": "rank of |weight| in its matrix", "input_spike": "input spike max |x|",
        "output_spike": "output spike max |y|", "contribution": "|x · w| at the spike", "share": "share of the output spike",
        "row": "row (residual dim)", "col": "col (MLP unit)",
    }

    input_max: Float[Tensor, "layer"]  # max |a| over sequences and units at the first token (down_proj input)
    input_unit: Int[Tensor, "layer"]  # the unit k holding it
    output_max: Float[Tensor, "layer"]  # max |o| over sequences and dims at the first token (MLP output)
    output_dim: Int[Tensor, "layer"]  # the residual dimension j holding it
    weight: Float[Tensor, "layer"]  # W_out[k, j] = down_proj.weight[j, k]
    weight_rank: Int[Tensor, "layer"]  # 1 = the largest |w| of its matrix
    contribution: Float[Tensor, "layer"]  # |W_out[k, j]| · mean |a_k| at the position
    share: Float[Tensor, "layer"]  # W_out[k, j] · mean a_k / mean o_j: the fraction of the mean output spike it writes
    n_sequences: int
    top: int
    position: int = 0

    heading = "Super weights"
    trained_headline = ()  # in the anatomy
    init_headline = ()  # an init has no spike that passes Yu et al.'s rule: a top candidate of nothing
    key_column = "share"
    headline_labels = {"layer": "top candidate: layer", "row": "row (residual dim)", "col": "col (MLP unit)", "share": "share of the output spike"}
    plot_caption = "down-projection input and output spikes per layer (Yu et al.)"

    def ranked(self) -> list[int]:
        """Layers by contribution, largest first (all of them)."""
        return self.contribution.argsort(descending=True).tolist()

    def coordinates(self) -> list[tuple[int, int, int]]:
        """The top candidates as ``(layer, row, col)``: HF ``down_proj.weight[row, col]``."""
        return [(l, int(self.output_dim[l]), int(self.input_unit[l])) for l in self.ranked()[: self.top]]

    def best(self) -> RemoveWeight:
        """The intervention that removes the top candidate."""
        layer, row, col = self.coordinates()[0]
        return RemoveWeight(layer=layer, row=row, col=col)

    def to_pandas(self) -> pd.DataFrame:
        """The top candidates: layer, row, col, weight, its rank in the matrix, the spikes, contribution, share."""
        rows = []
        for rank, layer in enumerate(self.ranked()[: self.top]):
            rows.append({"rank": rank, "layer": layer, "row": int(self.output_dim[layer]), "col": int(self.input_unit[layer]),
                         "weight": self.weight[layer].item(), "weight_rank": int(self.weight_rank[layer]),
                         "input_spike": self.input_max[layer].item(), "output_spike": self.output_max[layer].item(),
                         "contribution": self.contribution[layer].item(), "share": self.share[layer].item()})
        return pd.DataFrame(rows)

    def plot(self) -> Any:
        """Yu et al.'s picture: max |down_proj input| and max |output| at the position, per layer, on a log axis."""
        fig = new_figure()
        ax = fig.subplots()
        layers = range(len(self.input_max))
        ax.semilogy(layers, self.input_max.clamp_min(1e-12).numpy(), marker="o", label="max |down_proj input|")
        ax.semilogy(layers, self.output_max.clamp_min(1e-12).numpy(), marker="s", label="max |down_proj output|")
        best = self.ranked()[0]
        ax.annotate(f"layer {best}: [{int(self.output_dim[best])}, {int(self.input_unit[best])}]", (best, self.output_max[best].item()),
                    textcoords="offset points", xytext=(8, 8), fontsize=8)
        ax.set_xlabel("layer")
        layer_axis(ax.xaxis)
        ax.set_ylabel(f"|value| at position {self.position}")
        ax.legend(fontsize=8)
        return fig

    def spikes(self) -> pd.DataFrame:
        """Per layer, Yu et al.'s plot: max |down_proj input| and max |output| at the first token, and where."""
        return pd.DataFrame({"layer": range(len(self.input_max)), "input_max": self.input_max.tolist(), "input_unit": self.input_unit.tolist(),
                             "output_max": self.output_max.tolist(), "output_dim": self.output_dim.tolist()})

    def headline(self) -> dict[str, Any]:
        layer = self.ranked()[0]
        return {
            "n_sequences": self.n_sequences,
            "layer": layer,
            "row": int(self.output_dim[layer]),
            "col": int(self.input_unit[layer]),
            "weight": self.weight[layer].item(),
            "weight_rank": int(self.weight_rank[layer]),
            "input_spike": self.input_max[layer].item(),
            "output_spike": self.output_max[layer].item(),
            "share": self.share[layer].item(),
        }

    def summary(self) -> str:
        h = self.headline()
        spikes = torch.minimum(self.input_max, self.output_max)
        if not (spikes > SPIKE).any():  # Yu et al.'s rule names no super weight: no top candidate of nothing (a random init)
            layer = int(spikes.argmax())
            return (f"super weights (position {self.position}, {h['n_sequences']} sequences): none by Yu et al.'s rule (a down-projection whose "
                    f"input and output spikes both exceed {SPIKE:g}); the largest spikes are at layer {layer}: input "
                    f"{self.input_max[layer].item():.4g}, output {self.output_max[layer].item():.4g}")
        return (
            f"super weight candidate (position {self.position}, {h['n_sequences']} sequences): layer {h['layer']} "
            f"down_proj.weight[{h['row']}, {h['col']}] = {h['weight']:.4g} (rank {h['weight_rank']} by |w| in its matrix); "
            f"input spike {h['input_spike']:.4g}, output spike {h['output_spike']:.4g}, of which this weight writes {h['share']:.0%}"
        )


@dataclass(frozen=True)
class SuperWeights(Analysis[SuperWeightsResult]):
    """One super-weight candidate per layer from the down-projection spikes at one position (see module docstring)."""

    name: ClassVar[str] = "super_weights"
    order = 78
    trained_order = 25
    # Candidates in the table.
    top: int = 5
    # The position whose spikes are read; Yu et al. read the first token, where the massive activation lives.
    position: int = 0

    def __post_init__(self) -> None:
        check_top_and_position(self.top, self.position)

    dense_mlp_only = True  # ranks one MLP's units per layer, not each expert's

    def applies_to(self, info: ModelInfo) -> bool:
        return not info.attn_only  # no down-projections

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        probes: dict[Hashable, Probe] = {}
        for layer in range(adapter.info.n_layers):
            for side, hook in (("in", f"blocks.{layer}.mlp.hook_post"), ("out", f"blocks.{layer}.hook_mlp_out")):
                probes[side, "sums", layer] = _sums_at(hook, self.position)
                probes[side, "max", layer] = _abs_max_at(hook, self.position)
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> SuperWeightsResult:
        rows: dict[str, list[Any]] = {k: [] for k in ("input_max", "input_unit", "output_max", "output_dim", "weight", "weight_rank", "contribution", "share")}
        for layer in range(adapter.info.n_layers):
            (a_mean, a_abs), a_max = (kept["in", "sums", layer] / spec.n).float(), kept["in", "max", layer]  # [d_mlp] each
            o_mean, o_max = (kept["out", "sums", layer][0] / spec.n).float(), kept["out", "max", layer]  # [d_model] each
            k, j = int(a_max.argmax()), int(o_max.argmax())
            w_out = _w_out(adapter.model, layer).float().cpu()
            w = w_out[k, j]
            rows["input_max"].append(a_max[k])
            rows["input_unit"].append(k)
            rows["output_max"].append(o_max[j])
            rows["output_dim"].append(j)
            rows["weight"].append(w)
            rows["weight_rank"].append(int((w_out.abs() > w.abs()).sum()) + 1)
            rows["contribution"].append(w.abs() * a_abs[k])
            rows["share"].append(w * a_mean[k] / o_mean[j])
        result = SuperWeightsResult(
            input_max=torch.stack(rows["input_max"]), input_unit=torch.tensor(rows["input_unit"]), output_max=torch.stack(rows["output_max"]),
            output_dim=torch.tensor(rows["output_dim"]), weight=torch.stack(rows["weight"]), weight_rank=torch.tensor(rows["weight_rank"]),
            contribution=torch.stack(rows["contribution"]), share=torch.stack(rows["share"]), n_sequences=spec.n,
            top=min(self.top, adapter.info.n_layers), position=self.position,
        )
        logger.info("super weight candidates: %s", result.coordinates())
        return result


@takes_token_inputs
@one_adapter_per_call
def super_weights(
    model: Any,
    inputs: Int[Tensor, "n seq"],
    *,
    top: int = 5,
    position: int = 0,
    interventions: Sequence[InterventionLike] = (),
    batch_size: int | None = None,
    progress: bool = True,
) -> SuperWeightsResult:
    """Super-weight candidates from the down-projection spikes at the first token (Yu et al.); see module docstring.

    >>> import lens_bias
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=32, seed=0)
    >>> r = super_weights(m, lens_bias.random_tokens(2, 8, 97), top=2)
    >>> r.to_pandas().columns.tolist()[:4]
    ['rank', 'layer', 'row', 'col']

    Args:
        model: any TransformerLens model with MLPs exposing ``W_out``; never modified.
        inputs: token IDs ``[n, seq]``: one prompt (Yu et al.) or several, read in one batched pass.
        top: candidates in the table.
        position: the position whose spikes are read (the first token by default).
        interventions: edits attached for the pass, e.g. removing the super weights found so far (Yu et al.
            repeat until no spike is left).
        batch_size: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.
        progress: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.

    Returns:
        A :class:`SuperWeightsResult`.
    """
    if ModelAdapter.of(model).info.attn_only:
        raise LensBiasError("super_weights reads MLP down-projections; this model is attention-only")
    analysis = SuperWeights(top=top, position=position)
    return measure(model, inputs, [analysis], interventions=interventions, batch_size=batch_size, progress=progress).of(SuperWeights)


@takes_token_inputs
@one_adapter_per_call
def super_weight_table(
    model: Any,
    inputs: Int[Tensor, "n seq"],
    eval_inputs: Int[Tensor, "m seq2"],
    *,
    n_random: int = 100,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = True,
) -> PerplexityTable:
    """Held-out perplexity with the top super-weight candidate removed, against two controls.

    Conditions: baseline; the top candidate of :func:`super_weights` on ``inputs`` removed; the largest-|w| other
    weight of the same down-projection removed; ``n_random`` weights of that matrix (drawn without replacement,
    the candidate excluded, from a local generator seeded with ``seed``) removed together.

    Args:
        model: any TransformerLens model with MLPs exposing ``W_out``; never modified.
        inputs: token IDs ``[n, seq]`` to find the candidate.
        eval_inputs: held-out token IDs ``[m, seq2]`` whose perplexity is measured.
        n_random: how many random weights the last control removes.
        seed: seed of the random control.
        batch_size: as in :func:`lens_bias.analyses.perplexity.perplexity`.
        progress: as in :func:`lens_bias.analyses.perplexity.perplexity`.

    Returns:
        A :class:`~lens_bias.analyses.perplexity.PerplexityTable`.
    """
    if isinstance(n_random, bool) or not isinstance(n_random, int) or n_random < 1:
        raise LensBiasError(f"n_random must be a positive int, got {n_random!r}")
    found = super_weights(model, inputs, top=1, batch_size=batch_size, progress=progress)
    layer, row, col = found.coordinates()[0]
    w_out = _w_out(model, layer).float().cpu()  # [d_mlp, d_model]: flat index = col · d_model + row
    d_model = w_out.shape[1]
    if n_random > w_out.numel() - 1:
        raise LensBiasError(f"n_random={n_random} exceeds the {w_out.numel() - 1} other weights of the matrix")
    magnitude = w_out.abs()
    magnitude[col, row] = -1.0
    other_col, other_row = divmod(int(magnitude.argmax()), d_model)
    order = torch.randperm(w_out.numel(), generator=torch.Generator().manual_seed(seed))
    order = order[order != col * d_model + row][:n_random]
    random = RemoveWeights(weights=tuple((layer, int(i) % d_model, int(i) // d_model) for i in order))
    name = f"layers[{layer}].mlp.down_proj.weight"
    return perplexity_table(
        model,
        eval_inputs,
        [
            ("baseline", "unedited", ()),
            ("super_weight", f"{name}[{row}, {col}] = {w_out[col, row].item():.4g} removed", (RemoveWeight(layer=layer, row=row, col=col),)),
            ("largest_other", f"{name}[{other_row}, {other_col}] = {w_out[other_col, other_row].item():.4g} removed", (RemoveWeight(layer=layer, row=other_row, col=other_col),)),
            ("random", f"{n_random} random weights of {name} removed (seed {seed}; max |w| {w_out[order // d_model, order % d_model].abs().max().item():.3g})", (random,)),
        ],
        title=f"super weight removed (layer {layer}) vs controls",
        batch_size=batch_size,
        progress=progress,
    )
