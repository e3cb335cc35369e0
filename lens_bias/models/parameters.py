"""A model's parameters as the transforms read and write them: a copy that shares the tokenizer, the parameters
under their state_dict names (a tied pair once), and whether a ``HookedTransformer`` keeps a tied unembedding as a
copy of its own."""

from __future__ import annotations

import copy
from typing import Any

import torch

__all__ = ["copy_model", "parameters", "hooked_tie", "vocabulary_axis"]

# parameters with one entry per token, on axis 0 (TL 3's W_U [d, V]: on axis 1), on either backend
_VOCABULARY_AXES = {"embed.weight": 0, "embed.W_E": 0, "unembed.weight": 0, "unembed.bias": 0, "unembed.b_U": 0, "unembed.W_U": 1}


def copy_model(model: Any) -> Any:
    """A deep copy sharing the tokenizer (read-only here, and slower to copy than it is worth).

    A TL 4 bridge wires capture hooks into its blocks on its first forward, closures over weak proxies of its own
    modules; a deep copy would keep them pointing at the original (and fail once it is gone), so the copy's are
    removed and it wires its own on its first forward."""
    tokenizer = getattr(model, "tokenizer", None)
    clone = copy.deepcopy(model, {id(tokenizer): tokenizer} if tokenizer is not None else {})
    for block in clone.modules() if isinstance(clone, torch.nn.Module) else ():
        handles = getattr(block, "_capture_hook_handles", None)
        if handles:
            ids = {handle.id for handle in handles}
            for module in block.modules():
                for hooks in (module._forward_pre_hooks, module._forward_hooks):
                    for hook_id in ids & set(hooks):
                        del hooks[hook_id]
            handles.clear()
            setattr(block, "_capture_hooks_wired", False)
    return clone


def parameters(model: Any) -> dict[str, torch.nn.Parameter]:
    """Parameters under their state_dict names (TL names on both backends), each tensor once (a tied pair once)."""
    seen: set[int] = set()
    out = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if isinstance(value, torch.nn.Parameter) and id(value) not in seen:  # buffers (rotary tables, masks) stay
            seen.add(id(value))
            out[name] = value
    return out


def hooked_tie(params: dict[str, torch.nn.Parameter]) -> bool:
    """A HookedTransformer converted from a tied model holds ``W_U`` as a separate copy of ``W_Eᵀ``."""
    w_e, w_u = params.get("embed.W_E"), params.get("unembed.W_U")
    return w_e is not None and w_u is not None and w_u.shape == w_e.shape[::-1] and torch.equal(w_u, w_e.T)


def vocabulary_axis(name: str) -> int | None:
    """The axis of the parameter ``name`` (its state_dict name) that runs over the vocabulary, or None."""
    return _VOCABULARY_AXES.get(name)
