"""Interventions of the attention-sink experiments (Li et al., "The Structural Origin of Attention Sink").

Positions are 0-based, as in TransformerLens tensors: the first token is position 0.

- MaskToSelf(position=k): token k attends only to itself, at ``hook_pattern`` (row k becomes one-hot). It keeps
  the first token's privilege — one value vector, not an average — and so its high variance.
- AmplifyVariance(position=k, factor=λ): o_k ← λ(o_k − μ) + μ at ``hook_attn_out``, μ the batch mean at
  position k. Spreads token k's attention output across sequences like the first token's.
- ScaleNorm(position=k, factor=λ): o_k ← λ·o_k, the control: a larger norm but the same *relative* spread.
- HeadwiseRMSNorm(gain=True): RMS-normalise every head's aggregated output at ``attn.hook_z`` (before W_O), so
  every position's per-head output has the same scale whatever the number of values it averaged; its learnable
  gains are made for one model with ``HeadwiseRMSNorm().bind(model)``.

All four hook points are live edit points on TL 3 and on TL 4 bridges (native and HF-built; ``hook_z`` is the
input of the output projection there): tests check each edit against a direct computation.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from lens_bias.adapter import FwdHook
from lens_bias.errors import LensBiasError

from .base import Intervention

__all__ = ["MaskToSelf", "AmplifyVariance", "ScaleNorm", "HeadwiseRMSNorm"]


def _check_position(position: Any, owner: str) -> None:
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise LensBiasError(f"{owner}: position must be a non-negative int (0 = first token), got {position!r}")


def _check_in_sequence(position: int, seq_len: int, owner: str) -> None:
    if position >= seq_len:
        raise LensBiasError(f"{owner}(position={position}) on sequences of {seq_len} tokens: use position < {seq_len}")


@dataclass(frozen=True)
class MaskToSelf(Intervention):
    """Token ``position`` attends only to itself (its attention row becomes one-hot on the diagonal).

    >>> MaskToSelf(position=10).to_dict()
    {'type': 'MaskToSelf', 'layers': None, 'position': 10}
    """

    position: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_position(self.position, "MaskToSelf")

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        k = self.position

        def hook_fn(pattern: Tensor, hook: Any) -> Tensor:  # [batch, head, query, key]
            _check_in_sequence(k, pattern.shape[-2], "MaskToSelf")
            pattern = pattern.clone()
            pattern[..., k, :] = 0
            pattern[..., k, k] = 1
            return pattern

        return [(f"blocks.{layer}.attn.hook_pattern", hook_fn)]


@dataclass(frozen=True)
class _EditAtPosition(Intervention):
    """Shared part of AmplifyVariance and ScaleNorm: replace o_k, token k's attention output, by ``_edit(o_k)``."""

    position: int = 0
    factor: float = 4.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_position(self.position, type(self).__name__)

    def _edit(self, out_k: Tensor) -> Tensor:  # [batch, d_model] -> [batch, d_model]
        raise NotImplementedError

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        k, name = self.position, type(self).__name__

        def hook_fn(out: Tensor, hook: Any) -> Tensor:  # [batch, pos, d_model]
            _check_in_sequence(k, out.shape[1], name)
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


@dataclass(frozen=True)
class HeadwiseRMSNorm(Intervention):
    """RMS-normalise each head's aggregated output z (per head, over d_head, before W_O), times a gain.

    With ``gain=True`` every (layer, head) owns a gain vector over d_head. The gains are made for one model,
    explicitly: :meth:`bind` returns a copy holding them (ones of shape [n_layers, n_heads, d_head] on the model's
    device); ``lens_bias.train`` trains them with the model, and ``to_dict`` carries their values.

    >>> import lens_bias
    >>> m = lens_bias.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=16)
    >>> norm = HeadwiseRMSNorm().bind(m)
    >>> [tuple(p.shape) for p in norm.parameters(m)]
    [(2, 4, 16)]
    """

    gain: bool = True
    eps: float = 1e-6
    # [n_layers, n_heads, d_head] learnable gains (see bind); not part of equality.
    weight: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.eps > 0:
            raise LensBiasError(f"HeadwiseRMSNorm: eps must be > 0, got {self.eps}")
        if self.weight is not None:
            if not self.gain:
                raise LensBiasError("HeadwiseRMSNorm(gain=False) holds no weight")
            weight = self.weight if isinstance(self.weight, Tensor) else torch.tensor(self.weight, dtype=torch.float32)
            object.__setattr__(self, "weight", torch.nn.Parameter(weight.detach().clone()))

    @staticmethod
    def _shape(model: Any) -> tuple[int, int, int]:
        cfg = model.cfg
        return int(cfg.n_layers), int(cfg.n_heads), int(getattr(cfg, "d_head", 0) or cfg.d_model // cfg.n_heads)

    def bind(self, model: Any) -> "HeadwiseRMSNorm":
        """This intervention with gains for ``model``: new ones (all 1), or the ones it holds, on the model's device.

        Returns ``self`` when it already holds gains of the right shape on that device (training goes on with the
        same tensor); a copy otherwise. Without gains (``gain=False``) there is nothing to bind: ``self``.
        """
        if not self.gain:
            return self
        shape, device = self._shape(model), next(model.parameters()).device
        if self.weight is None:
            return replace(self, weight=torch.ones(shape, device=device))
        self._check_shape(shape)
        return self if self.weight.device == device else replace(self, weight=self.weight.detach().to(device))

    def _check_shape(self, shape: tuple[int, int, int]) -> None:
        if tuple(self.weight.shape) != shape:
            raise LensBiasError(
                f"HeadwiseRMSNorm holds gains of shape {tuple(self.weight.shape)} but the model needs {shape} "
                "(n_layers, n_heads, d_head): make a new HeadwiseRMSNorm().bind(model) for this model"
            )

    def _gains(self, model: Any) -> Tensor | None:
        """The gains, checked against ``model``; never made or moved here (that is :meth:`bind`)."""
        if not self.gain:
            return None
        if self.weight is None:
            raise LensBiasError(
                "HeadwiseRMSNorm(gain=True) holds no gains yet: make them for the model with "
                "norm = HeadwiseRMSNorm().bind(model), or use HeadwiseRMSNorm(gain=False)"
            )
        self._check_shape(self._shape(model))
        device = next(model.parameters()).device
        if self.weight.device != device:
            raise LensBiasError(f"HeadwiseRMSNorm's gains are on {self.weight.device}, the model on {device}: norm = norm.bind(model)")
        return self.weight

    def parameters(self, model: Any) -> list[torch.nn.Parameter]:
        weight = self._gains(model)
        return [] if weight is None else [weight]

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        weight, eps = self._gains(model), float(self.eps)

        def hook_fn(z: Tensor, hook: Any) -> Tensor:  # [batch, pos, head, d_head]
            normed = z * torch.rsqrt(z.float().pow(2).mean(dim=-1, keepdim=True) + eps).to(z.dtype)
            return normed if weight is None else normed * weight[layer].to(z.dtype)

        return [(f"blocks.{layer}.attn.hook_z", hook_fn)]

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["weight"] = None if self.weight is None else self.weight.detach().cpu().tolist()
        return out
