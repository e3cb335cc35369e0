"""LLaMA: RMSNorm (eps 1e-6), SwiGLU, RoPE, no biases, untied embeddings, every matrix N(0, init_std). On TL 4 a
random Hugging Face ``LlamaForCausalLM`` wrapped by ``build_bridge_from_module``, on TL 3 a ``HookedTransformer``;
checkpoints convert between the two layouts."""

from __future__ import annotations

import math
from typing import Any

import torch
from einops import rearrange

from lens_bias.models.architectures.base import Architecture, init_parameters
from lens_bias.models.spec import ModelSpec

__all__ = ["Llama"]

# TL 4 HF-built bridges keep nn.Linear weights ([out, in]); TL 3 keeps per-head [head, d_model, d_head] and [in, out].
_LINEAR = {"attn.q": "attn.W_Q", "attn.k": "attn.W_K", "attn.v": "attn.W_V"}


class Llama(Architecture):
    name = "llama"
    hf_architecture = "LlamaForCausalLM"
    activations = ("silu", "gelu", "relu")
    default_act = "silu"
    positional_embeddings = ("rotary",)
    normalization = "RMS"
    gated_mlp = True
    qkv_bias = False

    def default_d_mlp(self, d_model: int) -> int:
        return 16 * math.ceil(8 * d_model / 3 / 16)

    def hf_model(self, spec: ModelSpec, common: dict[str, Any]) -> Any:
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**common, attention_bias=False, mlp_bias=False))

    def build_bridge(self, spec: ModelSpec) -> Any:
        from transformer_lens.model_bridge.sources import (
            build_bridge_from_module,
        )

        common = dict(
            vocab_size=spec.d_vocab, hidden_size=spec.d_model, intermediate_size=spec.d_mlp, num_hidden_layers=spec.n_layers,
            num_attention_heads=spec.n_heads, num_key_value_heads=spec.n_heads, hidden_act=spec.act_fn,
            max_position_embeddings=spec.n_ctx, initializer_range=spec.init_std, rms_norm_eps=1e-6, tie_word_embeddings=False,
            # Eager attention materialises the pattern, so hook_pattern edits act on the real computation.
            attn_implementation="eager",
        )
        hf = self.hf_model(spec, common)
        self.redraw_bridge_module(hf, spec)
        hf.eval()
        return build_bridge_from_module(hf, self.hf_architecture, hf_config=hf.config, model_name=f"lens_bias-{spec.arch}-seed{spec.seed}")

    def redraw_bridge_module(self, hf: Any, spec: ModelSpec) -> None:
        init_parameters(hf.named_parameters(), seed=spec.seed, std=spec.init_std)

    def redraw_bridge(self, model: Any, spec: ModelSpec) -> None:
        self.redraw_bridge_module(model.original_model, spec)

    def hooked_config(self, spec: ModelSpec) -> dict[str, Any]:
        return dict(normalization_type="RMS", final_rms=True, gated_mlp=True, eps=1e-6)

    def bridge_to_hooked(self, state: dict[str, torch.Tensor], spec: ModelSpec, target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        heads = spec.n_heads
        out = dict(target)  # buffers (masks, rotary tables) and zero biases stay as built
        out["embed.W_E"] = state["embed.weight"]
        out["ln_final.w"] = state["ln_final.weight"]
        out["unembed.W_U"] = state["unembed.weight"].T
        out["unembed.b_U"] = state.get("unembed.bias", torch.zeros(spec.d_vocab))
        for layer in range(spec.n_layers):
            b = f"blocks.{layer}."
            out[b + "ln1.w"], out[b + "ln2.w"] = state[b + "ln1.weight"], state[b + "ln2.weight"]
            for bridge, hooked in _LINEAR.items():
                out[b + hooked] = rearrange(state[b + bridge + ".weight"], "(h e) d -> h d e", h=heads)
                if b + bridge + ".bias" in state:
                    out[b + hooked.replace("W_", "b_")] = rearrange(state[b + bridge + ".bias"], "(h e) -> h e", h=heads)
            out[b + "attn.W_O"] = rearrange(state[b + "attn.o.weight"], "d (h e) -> h e d", h=heads)
            out[b + "mlp.W_gate"] = state[b + "mlp.gate.weight"].T
            out[b + "mlp.W_in"] = state[b + "mlp.in.weight"].T
            out[b + "mlp.W_out"] = state[b + "mlp.out.weight"].T
        return out

    def hooked_to_bridge(self, state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
        out = {"embed.weight": state["embed.W_E"], "ln_final.weight": state["ln_final.w"], "unembed.weight": state["unembed.W_U"].T,
               "unembed.bias": state["unembed.b_U"]}
        for layer in range(spec.n_layers):
            b = f"blocks.{layer}."
            out[b + "ln1.weight"], out[b + "ln2.weight"] = state[b + "ln1.w"], state[b + "ln2.w"]
            for bridge, hooked in _LINEAR.items():
                out[b + bridge + ".weight"] = rearrange(state[b + hooked], "h d e -> (h e) d")
                if self.qkv_bias:
                    out[b + bridge + ".bias"] = rearrange(state[b + hooked.replace("W_", "b_")], "h e -> (h e)")
            out[b + "attn.o.weight"] = rearrange(state[b + "attn.W_O"], "h e d -> d (h e)")
            out[b + "mlp.gate.weight"] = state[b + "mlp.W_gate"].T
            out[b + "mlp.in.weight"] = state[b + "mlp.W_in"].T
            out[b + "mlp.out.weight"] = state[b + "mlp.W_out"].T
        return out
