"""What a model's attention can see, read from the model: each layer's sliding window, and whether its heads
declare a learned sink.

Two facts decide how a pattern's rows are read:

- **Sliding windows.** A sliding layer of window W lets query t see only the keys k with t − k < W (Gemma 3:
  5 local layers of 512 for each global one; GPT-OSS: every other layer, 128; GPT-Neo: every other layer, 256).
  Key 0 is then invisible to every query t ≥ W, so Sink_k in that layer averages over the queries that can see key
  k (:func:`visible_queries`), never over queries that could not attend to it.
- **Learned sinks.** GPT-OSS gives every head a learned logit that joins the softmax as one extra column no key
  owns; ``hook_pattern`` keeps the keys only, so a row sums to 1 minus what went to that logit. The missing mass
  is the model's declared sink, measured beside key 0 (``analyses/sinks.py``).

The window is read from the Hugging Face config a TL 4 bridge wraps (``layer_types`` with ``sliding_window``,
GPT-Neo's ``attention_layers`` with ``window_size``, or a ``sliding_window`` that every layer uses), or from a TL 3
model's blocks (each attention's ``attn_type``, "local" with ``cfg.window_size``). The tests check each reading against the mask the model applies.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from lens_bias.core.errors import LensBiasError

__all__ = ["layer_windows", "declares_learned_sinks", "visible_queries", "window_mask", "describe_windows"]

# Layer types that mean "attends to every earlier key" in Hugging Face configs.
_FULL_TYPES = ("full_attention", "global", "attention")
_SLIDING_TYPES = ("sliding_attention", "local")


def _hf_config(model: Any) -> Any:
    return getattr(getattr(model, "original_model", None), "config", None)


def layer_windows(model: Any, n_layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window (None: the layer sees every earlier key).

    >>> import lens_bias
    >>> layer_windows(lens_bias.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=50, n_ctx=16), 2)
    (None, None)

    Raises:
        LensBiasError: a layer type this reading does not know (its Sink_k would be averaged over the wrong queries).
    """
    hf = _hf_config(model)
    if hf is not None:
        return _hf_windows(hf, n_layers)
    # TL 3: each block's attention knows its type ("local" only where cfg.use_local_attn built it so)
    blocks = getattr(model, "blocks", None) or []
    types = [getattr(getattr(block, "attn", None), "attn_type", "global") for block in blocks]
    if "local" not in types:
        return (None,) * n_layers
    return _from_types(types, getattr(model.cfg, "window_size", None), n_layers, "the blocks' attn_type")


def _hf_windows(hf: Any, n_layers: int) -> tuple[int | None, ...]:
    window = getattr(hf, "sliding_window", None) or getattr(hf, "window_size", None)
    types = getattr(hf, "layer_types", None) or getattr(hf, "attention_layers", None)
    if types is not None:
        return _from_types(list(types), window, n_layers, "config.layer_types")
    if isinstance(window, int) and window > 0 and getattr(hf, "use_sliding_window", True) is not False:
        return (window,) * n_layers  # Mistral-style: one window for every layer
    return (None,) * n_layers


def _from_types(types: Sequence[str], window: Any, n_layers: int, where: str) -> tuple[int | None, ...]:
    if len(types) < n_layers:
        raise LensBiasError(f"{where} names {len(types)} layer types for {n_layers} layers; fix the model's config")
    unknown = sorted({t for t in types[:n_layers] if t not in _FULL_TYPES + _SLIDING_TYPES})
    if unknown:
        raise LensBiasError(f"{where} has layer type(s) {unknown}, whose keys lens_bias cannot tell; the sink metric reads full and sliding attention only")
    if any(t in _SLIDING_TYPES for t in types[:n_layers]) and not (isinstance(window, int) and window > 0):
        raise LensBiasError(f"{where} names sliding layers but the config gives no window ({window!r}); set sliding_window")
    return tuple(window if t in _SLIDING_TYPES else None for t in types[:n_layers])


def declares_learned_sinks(model: Any) -> bool:
    """Whether the model's attention declares a learned sink: a per-head logit in the softmax that no key owns
    (the Hugging Face attention modules' ``sinks`` parameter, GPT-OSS's)."""
    hf = getattr(model, "original_model", None)
    if hf is None:
        return False
    return any(isinstance(getattr(m, "sinks", None), torch.Tensor) for m in hf.modules())


def visible_queries(seq_len: int, window: int | None, device: torch.device | None = None) -> Float[Tensor, "key"]:
    """How many queries can see each key: T − k under full causal attention, min(W, T − k) in a window of W.

    >>> visible_queries(5, None), visible_queries(5, 2)
    (tensor([5., 4., 3., 2., 1.]), tensor([2., 2., 2., 2., 1.]))
    """
    seen = torch.arange(seq_len, 0, -1, device=device, dtype=torch.float32)
    return seen if window is None else seen.clamp(max=window)


def window_mask(seq_len: int, window: int | None, device: torch.device | None = None) -> Tensor:
    """``[query, key]`` bool: which keys each query sees (causal, and within the window)."""
    t = torch.arange(seq_len, device=device)
    lag = t[:, None] - t[None, :]
    return (lag >= 0) if window is None else (lag >= 0) & (lag < window)


def describe_windows(windows: Sequence[int | None]) -> str:
    """One phrase for the page and the summary: "layers 0, 2 slide (window 4)" or ""."""
    sliding = [layer for layer, w in enumerate(windows) if w is not None]
    if not sliding:
        return ""
    sizes = sorted({w for w in windows if w is not None})
    size = ", ".join(map(str, sizes))
    return f"layer{'s' if len(sliding) > 1 else ''} {', '.join(map(str, sliding))} slide{'' if len(sliding) > 1 else 's'} (window {size})"
