"""Attention-pattern edits at ``blocks.L.attn.hook_pattern`` ([batch, head, query, key], post-softmax), a live
edit point on TL 3 and on TL 4 bridges (native and HF-built with eager attention): the values are mixed with the
edited pattern.

- SelfOnlyAttention: the identity pattern. Each position keeps its own value vector: no aggregation, so no
  intra-sequence contraction, and no position-dependent variance.
- UniformAttention: 1/(t+1) over the causal prefix (over the window, in a sliding layer), what attention at init
  nearly is at small width.
- MaskToSelf(position=k): token k attends only to itself (row k becomes one-hot). It keeps the first token's
  privilege — one value vector, not an average — and so its high variance (Li et al., "The Structural Origin of
  Attention Sink"). Positions are 0-based: the first token is position 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lens_bias.core.attention_layout import layer_windows, window_mask
from lens_bias.core.probes import FwdHook
from lens_bias.hooks.base import (
    Intervention,
    check_in_sequence,
    check_position,
    replaces,
)

__all__ = ["SelfOnlyAttention", "UniformAttention", "MaskToSelf"]


@replaces
def _identity_pattern(pattern: Tensor, hook: Any) -> Tensor:
    q, k = pattern.shape[-2:]
    return torch.eye(q, k, dtype=pattern.dtype, device=pattern.device).expand_as(pattern)


def _uniform_pattern(window: int | None) -> Any:
    """A hook that replaces the pattern by 1/(visible keys) over the keys each query can see (in a sliding layer of
    window W, the last W keys: uniform attention never reaches past the model's own mask)."""

    @replaces
    def hook_fn(pattern: Tensor, hook: Any) -> Tensor:
        visible = window_mask(pattern.shape[-1], window, pattern.device).to(pattern.dtype)
        return (visible / visible.sum(dim=-1, keepdim=True)).expand_as(pattern)

    return hook_fn


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
    """Position t attends to positions 0..t with weight 1/(t+1) each; in a sliding layer of window W, to the last W
    positions with weight 1/min(t+1, W).

    >>> UniformAttention().to_dict()
    {'type': 'UniformAttention', 'layers': None}
    """

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        return [(f"blocks.{layer}.attn.hook_pattern", _uniform_pattern(layer_windows(model, int(model.cfg.n_layers))[layer]))]


@dataclass(frozen=True)
class MaskToSelf(Intervention):
    """Token ``position`` attends only to itself (its attention row becomes one-hot on the diagonal).

    >>> MaskToSelf(position=10).to_dict()
    {'type': 'MaskToSelf', 'layers': None, 'position': 10}
    """

    position: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_position(self.position, "MaskToSelf")

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        k = self.position

        def hook_fn(pattern: Tensor, hook: Any) -> Tensor:  # [batch, head, query, key]
            check_in_sequence(k, pattern.shape[-2], "MaskToSelf")
            pattern = pattern.clone()
            pattern[..., k, :] = 0
            pattern[..., k, k] = 1
            return pattern

        return [(f"blocks.{layer}.attn.hook_pattern", hook_fn)]
