"""Attention-pattern edits at ``blocks.L.attn.hook_pattern`` ([batch, head, query, key], post-softmax), a live
edit point on TL 3 and on TL 4 bridges (native and HF-built with eager attention): the values are mixed with the
edited pattern.

- SelfOnlyAttention: the identity pattern. Each position keeps its own value vector: no aggregation, so no
  intra-sequence contraction, and no position-dependent variance.
- UniformAttention: 1/(t+1) over the causal prefix, what attention at init nearly is at small width.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lens_bias.adapter import FwdHook

from .base import Intervention, replaces

__all__ = ["SelfOnlyAttention", "UniformAttention"]


@replaces
def _identity_pattern(pattern: Tensor, hook: Any) -> Tensor:
    q, k = pattern.shape[-2:]
    return torch.eye(q, k, dtype=pattern.dtype, device=pattern.device).expand_as(pattern)


@replaces
def _uniform_causal_pattern(pattern: Tensor, hook: Any) -> Tensor:
    q, k = pattern.shape[-2:]
    causal = torch.ones(q, k, dtype=pattern.dtype, device=pattern.device).tril()
    return (causal / causal.sum(dim=-1, keepdim=True)).expand_as(pattern)


@dataclass(frozen=True)
class SelfOnlyAttention(Intervention):
    """Every position attends only to itself (removes attention's aggregation over the prefix).

    >>> SelfOnlyAttention(layers=[0]).to_dict()
    {'type': 'SelfOnlyAttention', 'layers': [0]}
    """

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        return [(f"blocks.{layer}.attn.hook_pattern", _identity_pattern)]


@dataclass(frozen=True)
class UniformAttention(Intervention):
    """Position t attends to positions 0..t with weight 1/(t+1) each.

    >>> UniformAttention().to_dict()
    {'type': 'UniformAttention', 'layers': None}
    """

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        return [(f"blocks.{layer}.attn.hook_pattern", _uniform_causal_pattern)]
