"""Head-wise RMSNorm (Li et al., "The Structural Origin of Attention Sink"): RMS-normalise every head's aggregated
output at ``attn.hook_z`` (before W_O), so every position's per-head output has the same scale whatever the number
of values it averaged — the parity across positions that removes the first token's privilege. ``hook_z`` is the
input of the output projection on TL 3 and on TL 4 bridges (native and HF-built).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from lens_bias.core.errors import LensBiasError
from lens_bias.core.probes import FwdHook
from lens_bias.hooks.base import Intervention

__all__ = ["HeadwiseRMSNorm"]


@dataclass(frozen=True)
class HeadwiseRMSNorm(Intervention):
    """RMS-normalise each head's aggregated output z (per head, over d_head, before W_O), times a gain.

    With ``gain=True`` every (layer, head) owns a gain vector over d_head. The gains are made for one model,
    explicitly: :meth:`bind` returns a copy holding them (ones of shape [n_layers, n_heads, d_head] on the model's
    device); ``lens_bias.training.trainer`` trains them with the model, and ``to_dict`` carries their values.

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

    def _gains(self, model: Any) -> torch.nn.Parameter | None:
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

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        _, n_heads, d_head = self._shape(model)
        v_head = getattr(getattr(getattr(model, "original_model", None), "config", None), "v_head_dim", None)
        if isinstance(v_head, int) and v_head != d_head:
            raise LensBiasError(
                f"HeadwiseRMSNorm normalises each head's z, but this model's value heads are {v_head} wide and its hook_z is split into heads of "
                f"{d_head} (multi-head latent attention: query/key heads differ from value heads), so hook_z does not hold its heads; leave it out"
            )
        return super().fwd_hooks(model)

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        weight, eps = self._gains(model), float(self.eps)
        heads = self._shape(model)[1:]

        def hook_fn(z: Tensor, hook: Any) -> Tensor:  # [batch, pos, head, d_head]
            if tuple(z.shape[-2:]) != heads:
                raise LensBiasError(f"HeadwiseRMSNorm: {hook.name} holds {tuple(z.shape[-2:])} per position, not the model's (n_heads, d_head) {heads}")
            normed = z * torch.rsqrt(z.float().pow(2).mean(dim=-1, keepdim=True) + eps).to(z.dtype)
            return normed if weight is None else normed * weight[layer].to(z.dtype)

        return [(f"blocks.{layer}.attn.hook_z", hook_fn)]

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["weight"] = None if self.weight is None else self.weight.detach().cpu().tolist()
        return out
