"""Qwen2: LLaMA with q/k/v biases and a 4·d_model MLP (``Qwen2ForCausalLM``, no sliding window)."""

from __future__ import annotations

from typing import Any

from lens_bias.models.architectures.llama import Llama
from lens_bias.models.spec import ModelSpec

__all__ = ["Qwen2"]


class Qwen2(Llama):
    name = "qwen2"
    hf_architecture = "Qwen2ForCausalLM"
    qkv_bias = True

    def default_d_mlp(self, d_model: int) -> int:
        return 4 * d_model

    def hf_model(self, spec: ModelSpec, common: dict[str, Any]) -> Any:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        return Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
