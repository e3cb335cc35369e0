"""Super weights (Yu et al., "The Super Weight in Large Language Models", 2024).

One forward pass; at the first token, the largest |value| entering every MLP's down-projection
(``blocks.{l}.mlp.hook_post``) and leaving it (``blocks.{l}.hook_mlp_out``). Where both spike, the output spike's
residual dimension j and the input spike's unit k name one weight, HF ``layers[l].mlp.down_proj.weight[j, k]`` =
TL ``W_out[l][k, j]``, that writes the massive activation. :func:`super_weights` returns one such candidate per
layer, ranked by its **contribution** |W_out[k, j] · a_k| at the first token (mean over sequences), the size of
what that single weight writes into the spike; ``share`` is that contribution's fraction of the output spike.

:func:`super_weight_table` removes the top candidate with :class:`lens_bias.hooks.weights.RemoveWeight` (hooks only; the
weights stay untouched) and compares the held-out perplexity with two controls: the largest-magnitude other
weight of the same matrix, and random weights of it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from lens_bias.analyses.base import Result
from lens_bias.analyses.perplexity import PerplexityTable, perplexity_table
from lens_bias.hooks import RemoveWeight, RemoveWeights
from lens_bias.hooks.base import InterventionLike, as_hooks
from torch import Tensor

from lens_bias.core.adapter import FwdHook, ModelAdapter, Probe
from lens_bias.core.errors import LensBiasError

__all__ = ["super_weights", "SuperWeightsResult", "super_weight_table"]

logger = logging.getLogger(__name__)


def _first_token(hook: str) -> Probe:
    return Probe(hook, "first", lambda x: x[:, 0])


def _w_out(model: Any, layer: int) -> Float[Tensor, "d_mlp d_model"]:
    try:
        return model.blocks[layer].mlp.W_out.detach()
    except (AttributeError, TypeError):
        raise LensBiasError(f"super weights read blocks[{layer}].mlp.W_out, which this {type(model).__name__} does not expose") from None


@dataclass
class SuperWeightsResult(Result):
    """One candidate weight per layer (output spike dim × input spike unit), and the spikes themselves."""

    input_max: Float[Tensor, "layer"]  # max |a| over sequences and units at the first token (down_proj input)
    input_unit: Int[Tensor, "layer"]  # the unit k holding it
    output_max: Float[Tensor, "layer"]  # max |o| over sequences and dims at the first token (MLP output)
    output_dim: Int[Tensor, "layer"]  # the residual dimension j holding it
    weight: Float[Tensor, "layer"]  # W_out[k, j] = down_proj.weight[j, k]
    weight_rank: Int[Tensor, "layer"]  # 1 = the largest |w| of its matrix
    contribution: Float[Tensor, "layer"]  # mean over sequences of |W_out[k, j] · a_k| at the first token
    share: Float[Tensor, "layer"]  # mean over sequences of W_out[k, j] · a_k / o_j
    n_sequences: int
    top: int

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
        return (
            f"super weight candidate (first token, {h['n_sequences']} sequences): layer {h['layer']} "
            f"down_proj.weight[{h['row']}, {h['col']}] = {h['weight']:.4g} (rank {h['weight_rank']} by |w| in its matrix); "
            f"input spike {h['input_spike']:.4g}, output spike {h['output_spike']:.4g}, of which this weight writes {h['share']:.0%}"
        )


def super_weights(
    model: Any,
    tokens: Int[Tensor, "n seq"],
    *,
    top: int = 5,
    interventions: Sequence[InterventionLike] = (),
    batch_size: int | None = None,
    progress: bool = False,
) -> SuperWeightsResult:
    """Super-weight candidates from the down-projection spikes at the first token (Yu et al.); see module docstring.

    >>> import lens_bias
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=32, seed=0)
    >>> r = super_weights(m, lens_bias.random_tokens(2, 8, 97), top=2)
    >>> r.to_pandas().columns.tolist()[:4]
    ['rank', 'layer', 'row', 'col']

    Args:
        model: any TransformerLens model with MLPs exposing ``W_out``; never modified.
        tokens: token IDs ``[n, seq]``: one prompt (Yu et al.) or several, read in one batched pass.
        top: candidates in the table.
        interventions: edits attached for the pass, e.g. removing the super weights found so far (Yu et al.
            repeat until no spike is left).
        batch_size: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.
        progress: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.

    Returns:
        A :class:`SuperWeightsResult`.
    """
    adapter = ModelAdapter(model)
    if adapter.info.attn_only:
        raise LensBiasError("super_weights reads MLP down-projections; this model is attention-only")
    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise LensBiasError(f"top must be a positive int, got {top!r}")
    layers = range(adapter.info.n_layers)
    probes = [_first_token(f"blocks.{l}.mlp.hook_post") for l in layers] + [_first_token(f"blocks.{l}.hook_mlp_out") for l in layers]
    hooks: list[FwdHook] = as_hooks(model, interventions)
    kept = adapter.collect(tokens, probes, batch_size=batch_size, hooks=hooks, progress=progress, desc="super weights")
    per_layer: dict[str, list[Any]] = {k: [] for k in ("input_max", "input_unit", "output_max", "output_dim", "weight", "weight_rank", "contribution", "share")}
    for l in layers:
        a, o = kept[f"blocks.{l}.mlp.hook_post:first"], kept[f"blocks.{l}.hook_mlp_out:first"]  # [n, d_mlp], [n, d_model]
        a_max, o_max = a.abs().max(dim=0).values, o.abs().max(dim=0).values
        k, j = int(a_max.argmax()), int(o_max.argmax())
        w_out = _w_out(model, l).float().cpu()
        w = w_out[k, j]
        written = w * a[:, k]  # [n]: what this one weight adds to o_j
        per_layer["input_max"].append(a_max[k])
        per_layer["input_unit"].append(k)
        per_layer["output_max"].append(o_max[j])
        per_layer["output_dim"].append(j)
        per_layer["weight"].append(w)
        per_layer["weight_rank"].append(int((w_out.abs() > w.abs()).sum()) + 1)
        per_layer["contribution"].append(written.abs().mean())
        per_layer["share"].append((written / o[:, j]).mean())
    result = SuperWeightsResult(
        input_max=torch.stack(per_layer["input_max"]),
        input_unit=torch.tensor(per_layer["input_unit"]),
        output_max=torch.stack(per_layer["output_max"]),
        output_dim=torch.tensor(per_layer["output_dim"]),
        weight=torch.stack(per_layer["weight"]),
        weight_rank=torch.tensor(per_layer["weight_rank"]),
        contribution=torch.stack(per_layer["contribution"]),
        share=torch.stack(per_layer["share"]),
        n_sequences=int(tokens.shape[0]),
        top=min(top, adapter.info.n_layers),
    )
    logger.info("super weight candidates: %s", result.coordinates())
    return result


def super_weight_table(
    model: Any,
    tokens: Int[Tensor, "n seq"],
    eval_tokens: Int[Tensor, "m seq2"],
    *,
    n_random: int = 100,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool = False,
) -> PerplexityTable:
    """Held-out perplexity with the top super-weight candidate removed, against two controls.

    Conditions: baseline; the top candidate of :func:`super_weights` on ``tokens`` removed; the largest-|w| other
    weight of the same down-projection removed; ``n_random`` weights of that matrix (drawn without replacement,
    the candidate excluded, from a local generator seeded with ``seed``) removed together.

    Args:
        model: any TransformerLens model with MLPs exposing ``W_out``; never modified.
        tokens: token IDs ``[n, seq]`` to find the candidate.
        eval_tokens: held-out token IDs ``[m, seq2]`` whose perplexity is measured.
        n_random: how many random weights the last control removes.
        seed: seed of the random control.
        batch_size: as in :func:`lens_bias.analyses.perplexity.perplexity`.
        progress: as in :func:`lens_bias.analyses.perplexity.perplexity`.

    Returns:
        A :class:`~lens_bias.analyses.perplexity.PerplexityTable`.
    """
    if isinstance(n_random, bool) or not isinstance(n_random, int) or n_random < 1:
        raise LensBiasError(f"n_random must be a positive int, got {n_random!r}")
    found = super_weights(model, tokens, top=1, batch_size=batch_size, progress=progress)
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
        eval_tokens,
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
