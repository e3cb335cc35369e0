"""Sparse upcycling: a dense model's MLPs turned into a mixture of experts, each expert a copy of the MLP it came
from and a new router in front (Komatsuzaki et al. 2023, as Qwen1.5-MoE and others start), which SeedPrint must
keep finding (every weight but the routers is the base's).

A router's top-``k`` weights are renormalised to sum to one, so identical experts compute the dense MLP whatever the
router chooses: the upcycled copy is the same function until it is trained.

>>> import lens_bias, torch
>>> model = lens_bias.random_init("llama", d_model=32, n_layers=2, n_heads=4, d_vocab=50, n_ctx=8)
>>> tokens = lens_bias.random_tokens(2, 8, 50)
>>> moe = upcycle_experts(model, n_experts=4, top_k=2)
>>> torch.allclose(moe(tokens), model(tokens), atol=1e-5)
True
"""

from __future__ import annotations

import re
from typing import Any

import torch

from lens_bias.core.errors import LensBiasError
from lens_bias.models.parameters import parameters
from lens_bias.models.rebuild import reshaped

__all__ = ["upcycle_experts"]

_ROUTER_STD = 0.02  # the routers' init (Mixtral's initializer_range): they choose among identical experts

# a dense Hugging Face LLaMA config's fields that a Mixtral config takes as they are
_SHARED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
           "hidden_act", "max_position_embeddings", "rms_norm_eps", "tie_word_embeddings", "attention_dropout", "bos_token_id",
           "eos_token_id", "pad_token_id", "rope_parameters", "rope_theta", "rope_scaling")
_HF_MLP = re.compile(r"^model\.layers\.(\d+)\.mlp\.")


def upcycle_experts(model: Any, n_experts: int = 4, top_k: int = 2, seed: int = 0) -> Any:
    """A copy of ``model`` whose every MLP is ``n_experts`` copies of itself behind a router that picks ``top_k``.

    Args:
        model: a dense LLaMA-family model: a TL 4 bridge of a Hugging Face ``LlamaForCausalLM``, or a TL 3
            ``HookedTransformer`` with a gated MLP and no MLP biases (not modified).
        n_experts: experts per layer.
        top_k: experts each token is routed to, ``1 ≤ top_k ≤ n_experts``.
        seed: seed of the routers' weights (a local generator).

    Returns:
        The mixture-of-experts copy (a Mixtral bridge on TL 4); ``lens_bias_experts`` records ``(n_experts, top_k)``.
    """
    if not 1 <= top_k <= n_experts:
        raise LensBiasError(f"upcycle_experts routes each token to 1 to n_experts experts, got top_k {top_k} of {n_experts}")
    generator = torch.Generator().manual_seed(seed)
    original = getattr(model, "original_model", None)
    if original is not None:
        moe = _upcycled_bridge(model, original, n_experts, top_k, generator)
    else:
        moe = _upcycled_hooked(model, n_experts, top_k, generator)
    moe.lens_bias_experts = (n_experts, top_k)
    return moe


def _upcycled_bridge(model: Any, original: Any, n_experts: int, top_k: int, generator: torch.Generator) -> Any:
    """The Mixtral copy of a bridge of a dense Hugging Face LLaMA, filled from its Hugging Face weights."""
    from transformers import LlamaConfig, MixtralConfig  # a bridge's path only

    if not isinstance(original.config, LlamaConfig):
        raise LensBiasError(f"upcycle_experts turns a LLaMA model into a Mixtral one, got a {type(original.config).__name__}")
    dense = original.config.to_dict()

    def as_mixtral(_: Any) -> Any:
        fields = {key: dense[key] for key in _SHARED if key in dense}
        return MixtralConfig(**fields, num_local_experts=n_experts, num_experts_per_tok=top_k)

    moe = reshaped(model, as_mixtral, {}, f"-moe{n_experts}")
    source = {name.replace("._original_component", ""): w.detach() for name, w in original.state_dict().items()}
    with torch.no_grad():
        for name, p in moe.original_model.state_dict(keep_vars=True).items():
            name = name.replace("._original_component", "")
            layer = _HF_MLP.match(name)
            if layer is None:
                p.copy_(source[name])
                continue
            mlp = f"model.layers.{layer.group(1)}.mlp."
            if name.endswith("mlp.gate.weight"):  # the router [n_experts, d]
                p.copy_(_ROUTER_STD * torch.randn(p.shape, generator=generator))
            elif name.endswith("experts.gate_up_proj"):  # [n_experts, 2 · d_mlp, d]: the gate's rows, then the up projection's
                p.copy_(torch.cat([source[mlp + "gate_proj.weight"], source[mlp + "up_proj.weight"]])[None].expand_as(p))
            elif name.endswith("experts.down_proj"):  # [n_experts, d, d_mlp]
                p.copy_(source[mlp + "down_proj.weight"][None].expand_as(p))
            else:
                raise LensBiasError(f"upcycle_experts does not know the Mixtral weight {name}: the installed transformers lays its "
                                    "experts out otherwise")
    return moe


def _upcycled_hooked(model: Any, n_experts: int, top_k: int, generator: torch.Generator) -> Any:
    """The mixture-of-experts copy of a TL 3 ``HookedTransformer`` with gated MLPs."""
    if not getattr(model.cfg, "gated_mlp", False) or getattr(model.cfg, "num_experts", None):
        raise LensBiasError("upcycle_experts turns a dense model with gated MLPs (LLaMA-family) into a mixture of experts")
    old = parameters(model)
    if any(name.endswith(("mlp.b_in", "mlp.b_out")) and bool(p.detach().any()) for name, p in old.items()):
        raise LensBiasError("upcycle_experts needs MLPs without biases: TL 3's experts have none, so the function would change")
    moe = reshaped(model, {}, {"num_experts": n_experts, "experts_per_token": top_k, "norm_topk_prob": True}, f"-moe{n_experts}")
    with torch.no_grad():
        for name, p in parameters(moe).items():
            expert = re.match(r"^(blocks\.\d+\.mlp\.)experts\.\d+\.(W_in|W_gate|W_out)\.weight$", name)
            if expert:  # nn.Linear [out, in] from the dense [in, out]
                p.copy_(old[expert.group(1) + expert.group(2)].detach().T)
            elif name.endswith("mlp.W_gate.weight"):  # the router
                p.copy_(_ROUTER_STD * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(old[name].detach())
    return moe
