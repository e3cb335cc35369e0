"""Remove a whole contribution to the residual stream: a sublayer's output, or the position embedding.

``blocks.L.hook_mlp_out`` / ``blocks.L.hook_attn_out`` and ``hook_pos_embed`` are live edit points on TL 3 and
TL 4 bridges (the edited value is what enters the residual sum; ``hook_resid_mid`` on TL 4 is not).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from lens_bias.hooks.base import Intervention, replaces
from torch import Tensor

from lens_bias.core.adapter import FwdHook, ModelAdapter
from lens_bias.core.errors import LensBiasError

__all__ = ["ZeroSublayer", "SubtractPositionEmbedding"]


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
        ModelAdapter(model).require(["hook_pos_embed"], "SubtractPositionEmbedding")
        return [("hook_pos_embed", _zero)]
