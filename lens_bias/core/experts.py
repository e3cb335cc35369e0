"""Mixture-of-experts layers, read through the model's own expert code.

A Hugging Face sparse MoE block (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, Granite-MoE, GPT-OSS, ...) routes each token
to ``top_k`` of its experts: ``router(x)`` returns ``(logits, weights, indices)``, and ``experts(x, indices,
weights)`` sums each chosen expert's MLP output times its weight. The experts' weights are fused into one
``down_proj`` parameter ``[expert, ...]``, and TransformerLens has no hook inside an expert.

:func:`expert_activations` runs one expert on given states through that same expert code (its unfused, per-expert
loop, with every state routed to the expert at weight 1) and captures the input of its down-projection from the
call itself, so the unit activations are the model's own and not a re-implementation of its gating. :func:`route`
asks the block's router. Weights are named as in Hugging Face's unfused MLPs: ``down_proj[expert]`` read as
``weight[row, col]``, row a residual dimension and col a unit, whichever way the fused parameter is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.overrides import TorchFunctionMode

from lens_bias.core.errors import LensBiasError

__all__ = ["MoELayer", "moe_layer", "moe_layers", "route", "expert_activations"]


@dataclass(frozen=True)
class MoELayer:
    """One layer's sparse MoE block of a Hugging Face model, and its parts."""

    layer: int
    router: torch.nn.Module  # returns (logits, weights [tokens, top_k], indices [tokens, top_k])
    experts: Any  # fused experts, a Hugging Face module: forward(states, indices, weights), down_proj [expert, ...]
    n_experts: int

    def down_weight(self, expert: int) -> Float[Tensor, "d_model d_unit"]:
        """Expert ``expert``'s down-projection as ``[row = residual dim, col = unit]``."""
        w = self.experts.down_proj[expert].detach()
        return w.T if getattr(self.experts, "is_transposed", False) else w


def _unbridged(module: Any) -> Any:
    """The Hugging Face module under a bridge's wrapper (some bridges wrap the experts too)."""
    while getattr(module, "original_component", None) is not None:
        module = module.original_component
    return module


def _parts(block: Any) -> tuple[Any, Any] | None:
    """(router, experts) of a bridged Hugging Face sparse MoE block, or None where ``block`` is not one."""
    hf = getattr(block, "original_component", None)
    experts = _unbridged(getattr(hf, "experts", None))
    router = getattr(hf, "gate", None) if hasattr(hf, "gate") else getattr(hf, "router", None)
    down = getattr(experts, "down_proj", None)
    if not isinstance(down, Tensor) or down.ndim != 3 or router is None or not hasattr(type(experts).forward, "__wrapped__"):
        return None
    return router, experts


def moe_layers(model: Any) -> list[int]:
    """The blocks whose MLP is a sparse MoE block (DeepSeek-V3 keeps dense MLPs in its first layers)."""
    return [layer for layer, block in enumerate(getattr(model, "blocks", [])) if _parts(getattr(block, "mlp", None)) is not None]


def moe_layer(model: Any, layer: int, owner: str) -> MoELayer:
    """The sparse MoE block of ``model.blocks[layer]`` (a TransformerLens 4 bridge of a Hugging Face MoE model).

    Args:
        model: a TransformerLens model.
        layer: the block.
        owner: who asks, for the error message.

    Returns:
        The block's :class:`MoELayer`; a one-line :class:`LensBiasError` where the block is not one.
    """
    try:
        block = model.blocks[layer].mlp
    except (AttributeError, IndexError, TypeError):
        raise LensBiasError(f"{owner}: this {type(model).__name__} has no blocks[{layer}].mlp") from None
    parts = _parts(block)
    if parts is None:
        raise LensBiasError(
            f"{owner} reads a Hugging Face sparse mixture-of-experts block (fused experts with a down_proj [expert, ...] "
            f"and a router) through a TransformerLens 4 bridge; blocks[{layer}].mlp of this {type(model).__name__} is not one"
        )
    router, experts = parts
    return MoELayer(layer=layer, router=router, experts=experts, n_experts=experts.down_proj.shape[0])


def route(moe: MoELayer, states: Float[Tensor, "tokens d_model"]) -> tuple[Float[Tensor, "tokens k"], Int[Tensor, "tokens k"]]:
    """The router's choice for each state: ``(weights, indices)``, each ``[tokens, top_k]``."""
    out = moe.router(states)
    weights, indices = out[-2], out[-1]
    if indices.dtype.is_floating_point or indices.shape != weights.shape or indices.shape[0] != states.shape[0]:
        raise LensBiasError(f"layer {moe.layer}'s router returned {[tuple(t.shape) for t in out]}; expected (logits, weights, indices) with "
                            "weights and indices [tokens, top_k]")
    return weights, indices


class _DownProjInput(TorchFunctionMode):
    """Keeps the input of each product with a slice of the fused ``down_proj``: the units the experts write from."""

    def __init__(self, down_proj: Tensor) -> None:
        super().__init__()
        self.storage = down_proj.untyped_storage().data_ptr()
        self.inputs: list[Tensor] = []

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if len(args) >= 2 and all(isinstance(a, Tensor) for a in args[:2]) and args[1].untyped_storage().data_ptr() == self.storage:
            self.inputs.append(args[0])
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def expert_activations(
    moe: MoELayer, states: Float[Tensor, "tokens d_model"], expert: int
) -> tuple[Float[Tensor, "tokens d_unit"], Float[Tensor, "tokens d_model"]]:
    """Expert ``expert`` on ``states`` as the model computes it: its down-projection's input and its output.

    >>> import lens_bias, torch
    >>> from transformers import MixtralConfig, MixtralForCausalLM
    >>> hf = MixtralForCausalLM(MixtralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
    ...                                       num_key_value_heads=1, vocab_size=50, num_local_experts=4))
    >>> units, out = expert_activations(moe_layer(lens_bias.from_hf(hf), 0, "example"), torch.randn(3, 32), expert=1)
    >>> tuple(units.shape), tuple(out.shape)
    ((3, 48), (3, 32))

    Args:
        moe: the layer, from :func:`moe_layer`.
        states: the block's input at the tokens to read, ``[tokens, d_model]``.
        expert: which expert.

    Returns:
        ``(units [tokens, d_unit], output [tokens, d_model])``, the output unweighted by the router.
    """
    n = states.shape[0]
    indices = torch.full((n, 1), expert, dtype=torch.long, device=states.device)
    weights = torch.ones(n, 1, dtype=states.dtype, device=states.device)
    capture = _DownProjInput(moe.experts.down_proj)
    with capture:  # the unfused per-expert loop (what the fused kernels compute), where each expert's product is visible
        out = type(moe.experts).forward.__wrapped__(moe.experts, states, indices, weights)
    if len(capture.inputs) != 1 or capture.inputs[0].shape[0] != n:
        raise LensBiasError(f"layer {moe.layer}'s experts did not multiply one [tokens, units] input by down_proj[{expert}]; "
                            "lens_bias cannot read their units")
    return capture.inputs[0], out
