"""Variance edits of one token's attention output at ``blocks.L.hook_attn_out`` (Li et al., "The Structural Origin
of Attention Sink"); positions are 0-based, the first token is position 0.

- AmplifyVariance(position=k, factor=λ): o_k ← λ(o_k − μ) + μ, μ the batch mean at position k. Spreads token k's
  attention output across sequences like the first token's.
- ScaleNorm(position=k, factor=λ): o_k ← λ·o_k, the control: a larger norm but the same *relative* spread.

``hook_attn_out`` is a live edit point on TL 3 and on TL 4 bridges (native and HF-built): tests check each edit
against a direct computation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lens_bias.core.adapter import FwdHook
from lens_bias.core.errors import LensBiasError
from lens_bias.hooks.base import Intervention, check_in_sequence, check_position

__all__ = ["AmplifyVariance", "ScaleNorm"]


@dataclass(frozen=True)
class _EditAtPosition(Intervention):
    """Shared part of AmplifyVariance and ScaleNorm: replace o_k, token k's attention output, by ``_edit(o_k)``."""

    position: int = 0
    factor: float = 4.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_position(self.position, type(self).__name__)

    def _edit(self, out_k: Tensor) -> Tensor:  # [batch, d_model] -> [batch, d_model]
        raise NotImplementedError

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        k, name = self.position, type(self).__name__

        def hook_fn(out: Tensor, hook: Any) -> Tensor:  # [batch, pos, d_model]
            check_in_sequence(k, out.shape[1], name)
            out = out.clone()
            out[:, k] = self._edit(out[:, k])
            return out

        return [(f"blocks.{layer}.hook_attn_out", hook_fn)]


@dataclass(frozen=True)
class AmplifyVariance(_EditAtPosition):
    """Mean-centred amplification of token ``position``'s attention output: λ(o_k − μ) + μ, μ the batch mean.

    Needs batches of at least 2 sequences (μ is taken over the batch).

    >>> AmplifyVariance(position=10, factor=4.0, layers=[1]).to_dict()
    {'type': 'AmplifyVariance', 'layers': [1], 'position': 10, 'factor': 4.0}
    """

    def _edit(self, out_k: Tensor) -> Tensor:
        if out_k.shape[0] < 2:
            raise LensBiasError("AmplifyVariance centres on the batch mean: run batches of at least 2 sequences")
        mean = out_k.mean(dim=0, keepdim=True)
        return float(self.factor) * (out_k - mean) + mean


@dataclass(frozen=True)
class ScaleNorm(_EditAtPosition):
    """Plain scaling of token ``position``'s attention output, λ·o_k: the control for :class:`AmplifyVariance`.

    >>> ScaleNorm(position=10, factor=4.0).to_dict()
    {'type': 'ScaleNorm', 'layers': None, 'position': 10, 'factor': 4.0}
    """

    def _edit(self, out_k: Tensor) -> Tensor:
        return float(self.factor) * out_k
