"""Remove a whole contribution to the residual stream: a sublayer's output, some dimensions of it, or the
position embedding.

``blocks.L.hook_mlp_out`` / ``blocks.L.hook_attn_out`` and ``hook_pos_embed`` are live edit points on TL 3 and
TL 4 bridges (the edited value is what enters the residual sum; ``hook_resid_mid`` on TL 4 is not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.probes import FwdHook
from lens_bias.hooks.base import Intervention, replaces

__all__ = ["ZeroSublayer", "ZeroOutputDims", "SubtractPositionEmbedding"]


@replaces
def _zero(x: Tensor, hook: Any) -> Tensor:
    return torch.zeros_like(x)


@dataclass(frozen=True)
class ZeroSublayer(Intervention):
    """Zero the output of the MLP (``"mlp"``) or attention (``"attn"``) sublayer of the chosen layers.

    >>> ZeroSublayer("attn", layers=[1]).to_dict()
    {'type': 'ZeroSublayer', 'layers': [1], 'sublayer': 'attn'}
    """

    sublayer: str = "mlp"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.sublayer not in ("mlp", "attn"):
            raise LensBiasError(f"sublayer must be 'mlp' or 'attn', got {self.sublayer!r}")

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        if self.sublayer == "mlp" and getattr(model.cfg, "attn_only", False):
            raise LensBiasError("this model is attention-only: it has no MLP sublayer to zero")
        return [(f"blocks.{layer}.hook_{self.sublayer}_out", _zero)]


@dataclass(frozen=True)
class ZeroOutputDims(Intervention):
    """Zero residual dimensions ``dims`` of one sublayer's output (``blocks.{layer}.hook_{sublayer}_out``).

    For the MLP this removes whole rows of the down-projection, HF ``layers[layer].mlp.down_proj.weight[dims, :]``
    (TL ``W_out[layer][:, dims]``): exactly the MLP with those rows zeroed, since lens_bias' LLaMA-family models have
    no down-projection bias (with one, its entries in ``dims`` go too).

    >>> ZeroOutputDims(layer=11, dims=(507,)).to_dict()
    {'type': 'ZeroOutputDims', 'layers': None, 'layer': 11, 'dims': [507], 'sublayer': 'mlp'}
    """

    layer: int = 0
    dims: tuple[int, ...] = (0,)
    sublayer: str = "mlp"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers is not None:
            raise LensBiasError("ZeroOutputDims edits one block: pass layer=, not layers=")
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise LensBiasError(f"ZeroOutputDims: layer must be a non-negative int, got {self.layer!r}")
        dims = tuple(self.dims)
        if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in dims):
            raise LensBiasError(f"ZeroOutputDims: dims must be a non-empty sequence of non-negative ints, got {self.dims!r}")
        if self.sublayer not in ("mlp", "attn"):
            raise LensBiasError(f"sublayer must be 'mlp' or 'attn', got {self.sublayer!r}")
        object.__setattr__(self, "dims", dims)

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        info = ModelAdapter.of(model).info
        if self.layer >= info.n_layers:
            raise LensBiasError(f"ZeroOutputDims: layer {self.layer} does not exist; the model has {info.n_layers} layers")
        too_wide = [d for d in self.dims if d >= info.d_model]
        if too_wide:
            raise LensBiasError(f"ZeroOutputDims: dims {too_wide} do not exist; d_model is {info.d_model}")
        if self.sublayer == "mlp" and info.attn_only:
            raise LensBiasError("this model is attention-only: it has no MLP output to edit")
        name = f"blocks.{self.layer}.hook_{self.sublayer}_out"
        ModelAdapter.of(model).require([name], "ZeroOutputDims")
        dims = list(self.dims)

        def hook_fn(out: Tensor, hook: Any) -> Tensor:  # [batch, pos, d_model]
            out = out.clone()
            out[..., dims] = 0
            return out

        return [(name, hook_fn)]


@dataclass(frozen=True)
class SubtractPositionEmbedding(Intervention):
    """Remove the learned position embedding from the residual stream (``hook_pos_embed`` → 0).

    Learned positions are shared by every sequence and alone give an inter-sequence cosine of ≈ 0.5 at the
    readout position; subtract them before attributing concentration to the MLPs.

    >>> SubtractPositionEmbedding().to_dict()
    {'type': 'SubtractPositionEmbedding', 'layers': None}
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers is not None:
            raise LensBiasError("SubtractPositionEmbedding acts before the first layer; it takes no layers=")

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        ModelAdapter.of(model).require(["hook_pos_embed"], "SubtractPositionEmbedding")
        return [("hook_pos_embed", _zero)]
