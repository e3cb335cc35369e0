"""Remove single MLP weights through hooks, leaving the model's parameters untouched (Yu et al.'s super weights).

A weight is named ``(layer, row, col)`` as in Hugging Face: ``mlp.down_proj.weight[row, col]``, i.e.
TransformerLens ``W_out[layer][col, row]`` — row is a residual-stream dimension, col an MLP unit. Its
contribution to the MLP output is ``W_out[col, row] · a_col``; the hooks read ``a`` at ``blocks.{l}.mlp.hook_post``
(the down-projection's input) and subtract that product from dimension ``row`` at ``blocks.{l}.hook_mlp_out``,
which is exactly the output of the same MLP with that one weight zeroed (biases untouched). Both hook points are
live on TL 3 and on TL 4 bridges; tests compare against a copy of the model with the weights really zeroed.

In a mixture of experts, ``RemoveWeight(expert=e)`` names expert e's ``down_proj[e]`` weight ``[row, col]``: the hooks
read the block's input at ``blocks.{l}.mlp.hook_in``, ask the block's own router which tokens went to e and at
what weight, run e's own expert code on those tokens (:mod:`lens_bias.core.experts`) and subtract router weight ×
unit × weight from dimension ``row`` at ``blocks.{l}.hook_mlp_out``.

The weight is read at every forward pass, so the edit follows a model that is being trained (and the removed
weight then receives no gradient through the MLP output). Other edits of ``mlp.hook_post`` go *before* this one
(composing refuses them after it): the captured activation is the one at the moment its hook runs.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.experts import expert_activations, moe_layer, moe_layers, route
from lens_bias.core.offload import read_weight
from lens_bias.core.probes import FwdHook, on_device
from lens_bias.hooks.base import Intervention, reads

__all__ = ["RemoveWeight", "RemoveWeights"]

Coordinate = tuple[int, int, int]  # (layer, row = residual dim, col = MLP unit)


def _coordinate(weight: Any, owner: str) -> Coordinate:
    try:
        coordinate = tuple(weight)
    except TypeError:
        coordinate = ()
    if len(coordinate) != 3 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in coordinate):
        raise LensBiasError(f"{owner}: a weight is (layer, row, col) of non-negative ints, got {weight!r}")
    return coordinate


def _removal_hooks(model: Any, weights: Sequence[Coordinate], owner: str) -> list[FwdHook]:
    """Two hooks per layer: capture the needed units' activations, subtract their weights' contributions."""
    adapter = ModelAdapter.of(model)
    info = adapter.info
    if info.attn_only or info.d_mlp is None:
        raise LensBiasError(f"{owner}: this model is attention-only; it has no MLP weights to remove")
    by_layer: dict[int, list[Coordinate]] = defaultdict(list)
    for layer, row, col in weights:
        if layer >= info.n_layers or row >= info.d_model or col >= info.d_mlp:
            raise LensBiasError(
                f"{owner}: weight (layer={layer}, row={row}, col={col}) is outside the model "
                f"({info.n_layers} layers, d_model {info.d_model} rows, d_mlp {info.d_mlp} cols)"
            )
        by_layer[layer].append((layer, row, col))
    hooks: list[FwdHook] = []
    for layer, group in sorted(by_layer.items()):
        try:
            mlp = model.blocks[layer].mlp
            read_weight(mlp, "W_out")  # read once here so a model without TL weight names fails now, not mid-pass
        except (AttributeError, TypeError):
            raise LensBiasError(
                f"{owner} reads blocks[{layer}].mlp.W_out, which this {type(model).__name__} does not expose"
            ) from None
        rows = torch.tensor([row for _, row, _ in group])
        cols = torch.tensor([col for _, _, col in group])
        hooks += _layer_hooks(mlp, layer, rows, cols, owner)
    adapter.require([name for name, _ in hooks], owner)
    return hooks


def _layer_hooks(mlp: Any, layer: int, rows: Tensor, cols: Tensor, owner: str) -> list[FwdHook]:
    captured: dict[str, Tensor] = {}

    @reads
    def capture(post: Tensor, hook: Any) -> None:  # [batch, pos, d_mlp]
        captured["a"] = post[..., on_device(cols, post.device)]

    def subtract(out: Tensor, hook: Any) -> Tensor:  # [batch, pos, d_model]
        if "a" not in captured:
            raise LensBiasError(f"{owner}: blocks.{layer}.mlp.hook_post did not fire before hook_mlp_out")
        a = captured.pop("a")  # [batch, pos, n_weights]
        rows_, cols_ = on_device(rows, out.device), on_device(cols, out.device)
        w = read_weight(mlp, "W_out")[cols_, rows_].to(out.dtype)  # read now: follows weights that change (training)
        return out.index_add(-1, rows_, -(a.to(out.dtype) * w))

    return [(f"blocks.{layer}.mlp.hook_post", capture), (f"blocks.{layer}.hook_mlp_out", subtract)]


def _expert_hooks(model: Any, layer: int, expert: int, row: int, col: int, owner: str) -> list[FwdHook]:
    """Capture the MoE block's input; subtract what expert ``expert``'s weight ``[row, col]`` wrote for its tokens."""
    moe = moe_layer(model, layer, owner)
    d_model, d_unit = moe.down_weight(0).shape
    if expert >= moe.n_experts or row >= d_model or col >= d_unit:
        raise LensBiasError(f"{owner}: weight (layer={layer}, expert={expert}, row={row}, col={col}) is outside the model "
                            f"({moe.n_experts} experts, d_model {d_model} rows, {d_unit} units per expert)")
    captured: dict[str, Tensor] = {}

    @reads
    def capture(x: Tensor, hook: Any) -> None:  # [batch, pos, d_model]: the block's input
        captured["x"] = x

    def subtract(out: Tensor, hook: Any) -> Tensor:  # [batch, pos, d_model]
        if "x" not in captured:
            raise LensBiasError(f"{owner}: blocks.{layer}.mlp.hook_in did not fire before hook_mlp_out")
        states = captured.pop("x").reshape(-1, out.shape[-1])
        with torch.no_grad():
            weights, indices = route(moe, states)
            gate = (weights * (indices == expert)).sum(dim=-1)  # the router's weight on the expert; 0 where not routed
            tokens = gate.nonzero().squeeze(-1)
            units, _ = expert_activations(moe, states[tokens], expert)
        w = moe.down_weight(expert)[row, col]  # read now: follows weights that change (training)
        written = torch.zeros(states.shape[0], dtype=out.dtype, device=out.device)
        written[tokens] = (gate[tokens] * units[:, col] * w).to(out.dtype)
        return out.index_add(-1, torch.tensor([row], device=out.device), -written.view(*out.shape[:-1], 1))

    hooks = [(f"blocks.{layer}.mlp.hook_in", capture), (f"blocks.{layer}.hook_mlp_out", subtract)]
    ModelAdapter.of(model).require([name for name, _ in hooks], owner)
    return hooks


@dataclass(frozen=True)
class RemoveWeight(Intervention):
    """Remove one down-projection weight, HF ``layers[layer].mlp.down_proj.weight[row, col]``, or in a mixture of
    experts expert ``expert``'s ``down_proj[expert]`` weight ``[row, col]``.

    >>> RemoveWeight(layer=11, row=507, col=1229).to_dict()
    {'type': 'RemoveWeight', 'layers': None, 'layer': 11, 'row': 507, 'col': 1229, 'expert': None}
    """

    layer: int = 0
    row: int = 0
    col: int = 0
    # The expert whose weight goes, in a mixture of experts; None for a dense MLP.
    expert: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers is not None:
            raise LensBiasError("RemoveWeight names its layer: pass layer=, not layers=")
        _coordinate((self.layer, self.row, self.col), "RemoveWeight")
        if self.expert is not None and (isinstance(self.expert, bool) or not isinstance(self.expert, int) or self.expert < 0):
            raise LensBiasError(f"RemoveWeight: expert is a non-negative int (or None for a dense MLP), got {self.expert!r}")

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        if self.expert is not None:
            return _expert_hooks(model, self.layer, self.expert, self.row, self.col, "RemoveWeight")
        if self.layer in moe_layers(model):
            raise LensBiasError(f"RemoveWeight: block {self.layer} routes tokens to {moe_layer(model, self.layer, 'RemoveWeight').n_experts} experts; "
                                "name one with expert=")
        return _removal_hooks(model, [(self.layer, self.row, self.col)], "RemoveWeight")


@dataclass(frozen=True)
class RemoveWeights(Intervention):
    """Remove several down-projection weights ``(layer, row, col)`` at once (two hooks per layer, not per weight).

    >>> RemoveWeights(weights=((1, 5, 7), (1, 6, 2))).to_dict()
    {'type': 'RemoveWeights', 'layers': None, 'weights': [[1, 5, 7], [1, 6, 2]]}
    """

    weights: tuple[Coordinate, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers is not None:
            raise LensBiasError("RemoveWeights names each weight's layer: pass weights=((layer, row, col), ...), not layers=")
        weights = tuple(_coordinate(w, "RemoveWeights") for w in self.weights)
        if not weights:
            raise LensBiasError("RemoveWeights needs at least one (layer, row, col) weight")
        if len(set(weights)) != len(weights):
            raise LensBiasError("RemoveWeights: a weight is listed twice; removing it twice would subtract it twice")
        object.__setattr__(self, "weights", weights)

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        return _removal_hooks(model, self.weights, "RemoveWeights")

    def to_dict(self) -> dict[str, Any]:
        return {"type": "RemoveWeights", "layers": None, "weights": [list(w) for w in self.weights]}
