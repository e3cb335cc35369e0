"""MLP activation edits: remove the activation's asymmetry (the source of the shared seed direction), swap the
activation, or subtract the shared component directly.

All three act at ``blocks.L.mlp.hook_post`` (the down-projection's input, a live edit point on TL 3 and on TL 4
bridges). OddActivation and SwapActivation recompute it from ``mlp.hook_pre`` (the gate pre-activation in gated
MLPs, where the up-projection ``mlp.hook_pre_linear`` multiplies it), read in the same forward pass: they replace
``hook_post``, so an edit of it composes after them (``OddActivation() + MeanCenterMLP()``), never before. Every
edit is differentiable, so they can stay attached during training.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.probes import FwdHook
from lens_bias.hooks.base import Intervention, reads, replaces

__all__ = ["OddActivation", "MeanCenterMLP", "SwapActivation", "ACTIVATION_FUNCTIONS"]

Activation = Callable[[Tensor], Tensor]

# Elementwise activations by TransformerLens name, plus the odd ones models do not offer.
ACTIVATION_FUNCTIONS: dict[str, Activation] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "swish": F.silu,
    "solu": lambda x: x * F.softmax(x, dim=-1),
    "tanh": torch.tanh,
    "identity": lambda x: x,
}


def _model_activation(model: Any) -> Activation:
    name = getattr(model.cfg, "act_fn", None)
    if name not in ACTIVATION_FUNCTIONS:
        raise LensBiasError(
            f"the model's act_fn {name!r} is not one lens_bias can recompute; known: {sorted(ACTIVATION_FUNCTIONS)}"
        )
    return ACTIVATION_FUNCTIONS[name]


def _recompute_hooks(model: Any, layer: int, fn: Activation) -> list[FwdHook]:
    """Hooks that replace ``mlp.hook_post`` by ``fn(hook_pre)`` (times ``hook_pre_linear`` in gated MLPs)."""
    if getattr(model.cfg, "attn_only", False):
        raise LensBiasError("this model is attention-only: it has no MLP activations to edit")
    prefix = f"blocks.{layer}.mlp"
    gated = bool(getattr(model.cfg, "gated_mlp", False))
    seen: dict[str, Tensor] = {}

    def keep(name: str) -> Callable[[Tensor, Any], None]:
        @reads
        def hook_fn(x: Tensor, hook: Any) -> None:
            seen[name] = x

        return hook_fn

    @replaces
    def replace(post: Tensor, hook: Any) -> Tensor:
        out = fn(seen.pop("pre"))
        return out * seen.pop("linear") if gated else out

    hooks = [(f"{prefix}.hook_pre", keep("pre"))]
    if gated:
        hooks.append((f"{prefix}.hook_pre_linear", keep("linear")))
    return hooks + [(f"{prefix}.hook_post", replace)]


@dataclass(frozen=True)
class OddActivation(Intervention):
    """Replace the MLP activation φ(a) by its odd part (φ(a) − φ(−a))/2: no asymmetry, same scale.

    For ReLU the odd part is a/2; for GELU and SiLU it is a·(Φ(a) − ½)-like and has zero mean on symmetric
    inputs, so the MLP no longer adds a shared, seed-fixed direction. In gated MLPs it acts on the gate.

    >>> OddActivation(layers=[0, 1]).to_dict()
    {'type': 'OddActivation', 'layers': [0, 1]}
    """

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        phi = _model_activation(model)
        return _recompute_hooks(model, layer, lambda a: (phi(a) - phi(-a)) / 2)


@dataclass(frozen=True)
class SwapActivation(Intervention):
    """Recompute the MLP activation with another function: relu, gelu, silu, tanh, identity, ... or a callable.

    This is how tanh and identity MLPs are studied: TL model configs do not offer them. A callable cannot be
    serialised; ``to_dict`` then raises.

    >>> SwapActivation("tanh").to_dict()
    {'type': 'SwapActivation', 'layers': None, 'fn': 'tanh'}
    """

    fn: Union[str, Activation] = "relu"

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.fn, str) and self.fn not in ACTIVATION_FUNCTIONS:
            raise LensBiasError(f"unknown activation {self.fn!r}; choose from {sorted(ACTIVATION_FUNCTIONS)} or pass a callable")
        if not isinstance(self.fn, str) and not callable(self.fn):
            raise WrongType(f"fn must be an activation name or a callable, got {type(self.fn).__name__}")

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        fn = ACTIVATION_FUNCTIONS[self.fn] if isinstance(self.fn, str) else self.fn
        return _recompute_hooks(model, layer, fn)

    def to_dict(self) -> dict[str, Any]:
        if not isinstance(self.fn, str):
            raise WrongType("SwapActivation with a callable cannot be serialised; use an activation name")
        return super().to_dict()


@dataclass(frozen=True)
class MeanCenterMLP(Intervention):
    """Subtract, per hidden unit, the mean of ``mlp.hook_post`` over the batch's sequences and positions.

    The direct "remove the shared component" ablation. The mean is the batch's, so use batches of many
    sequences (analyses default to hundreds).

    >>> MeanCenterMLP().to_dict()
    {'type': 'MeanCenterMLP', 'layers': None}
    """

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        if getattr(model.cfg, "attn_only", False):
            raise LensBiasError("this model is attention-only: it has no MLP activations to edit")
        return [(f"blocks.{layer}.mlp.hook_post", lambda x, hook: x - x.mean(dim=(0, 1), keepdim=True))]
