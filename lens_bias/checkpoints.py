"""lens_bias checkpoints: a state_dict with the :class:`~lens_bias.models.ModelSpec` it was built from.

A checkpoint loads on the TransformerLens it was not written on: llama / qwen2 weights are converted between a
TL 4 bridge's Hugging Face layout and a TL 3 ``HookedTransformer``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import torch
from einops import rearrange

from ._io import atomic_save, load_torch_file
from .errors import LensBiasError
from .models import ModelSpec, random_init

__all__ = ["save_checkpoint", "load_checkpoint"]


def save_checkpoint(model: Any, path: Union[str, Path], **extra: Any) -> None:
    """A plain state_dict file with the lens_bias spec it was built from, loadable by :func:`load_checkpoint`."""
    spec = getattr(model, "lens_bias_spec", None)
    if spec is None:
        raise LensBiasError("save_checkpoint needs a model built by lens_bias.random_init (it records model.lens_bias_spec)")
    # Written under a temporary name and renamed: an interrupted save never leaves a partial checkpoint.
    atomic_save({"format": "lens_bias.checkpoint/1", "spec": spec.to_dict(), "state_dict": model.state_dict(), **extra}, path)


def load_checkpoint(path: Union[str, Path], *, device: Union[str, torch.device, None] = None) -> Any:
    """Rebuild the architecture from the checkpoint's spec and load its weights.

    A llama / qwen2 checkpoint saved from a TL 4 bridge (Hugging Face weight layout) loads into the TL 3
    ``HookedTransformer`` that ``random_init`` builds there, and the other way round: the weights are converted.
    """
    fix = "write one with `lens-bias train` or lens_bias.checkpoints.save_checkpoint"
    saved = load_torch_file(path, "checkpoint", fix)
    if saved.get("format") != "lens_bias.checkpoint/1" or not isinstance(saved.get("state_dict"), dict) or not isinstance(saved.get("spec"), dict):
        raise LensBiasError(f"{path} is not a lens_bias checkpoint file; {fix}")
    spec = ModelSpec.from_dict(saved["spec"])
    model = random_init(spec, device=device)
    state = saved["state_dict"]
    target = model.state_dict()
    if "embed.weight" in state and "embed.W_E" in target:
        state = _bridge_to_hooked(state, spec, target)
    elif "embed.W_E" in state and "embed.weight" in target:
        state = _hooked_to_bridge(state, spec)
    model.load_state_dict(state)
    return model


# TL 4 HF-built bridges keep nn.Linear weights ([out, in]); TL 3 keeps per-head [head, d_model, d_head] and [in, out].
_LINEAR = {"attn.q": "attn.W_Q", "attn.k": "attn.W_K", "attn.v": "attn.W_V"}


def _bridge_to_hooked(state: dict[str, torch.Tensor], spec: ModelSpec, target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if spec.arch == "gpt2":
        raise LensBiasError("gpt2 checkpoints from a TL 4 bridge load on TL 4 only; retrain on TL 3 or install transformer-lens>=4")
    heads = spec.n_heads
    out = {k: v for k, v in target.items()}  # buffers (masks, rotary tables) and zero biases stay as built
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


def _hooked_to_bridge(state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
    if spec.arch == "gpt2":
        raise LensBiasError("gpt2 checkpoints from TL 3 load on TL 3 only; retrain on TL 4 or install transformer-lens<4")
    out = {"embed.weight": state["embed.W_E"], "ln_final.weight": state["ln_final.w"], "unembed.weight": state["unembed.W_U"].T,
           "unembed.bias": state["unembed.b_U"]}
    for layer in range(spec.n_layers):
        b = f"blocks.{layer}."
        out[b + "ln1.weight"], out[b + "ln2.weight"] = state[b + "ln1.w"], state[b + "ln2.w"]
        for bridge, hooked in _LINEAR.items():
            out[b + bridge + ".weight"] = rearrange(state[b + hooked], "h d e -> (h e) d")
            if spec.arch == "qwen2":
                out[b + bridge + ".bias"] = rearrange(state[b + hooked.replace("W_", "b_")], "h e -> (h e)")
        out[b + "attn.o.weight"] = rearrange(state[b + "attn.W_O"], "h e d -> d (h e)")
        out[b + "mlp.gate.weight"] = state[b + "mlp.W_gate"].T
        out[b + "mlp.in.weight"] = state[b + "mlp.W_in"].T
        out[b + "mlp.out.weight"] = state[b + "mlp.W_out"].T
    return out
