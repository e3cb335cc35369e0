"""Width pruning of the residual stream: a narrower copy that keeps a subset of the base's residual channels, as
Minitron-Width and Sheared-LLaMA prune a model (what SeedPrint's partial basis maps must see through).

:func:`prune_residual` keeps ``width`` of the ``d_model`` channels, those of the largest weight norm unless the
channels are given, in every weight that reads or writes the residual stream (the embedding, the unembedding and
the norm gains included); the head dimension and the MLP width stay. The copy is a new model of the narrower width
that computes a different function (RMSNorm now averages over fewer channels), much as a pruned model does before
it is distilled.

>>> import lens_bias
>>> model = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> pruned = prune_residual(model, 48)
>>> pruned.cfg.d_model, pruned.cfg.d_head, len(pruned.lens_bias_channels)
(48, 16, 48)
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from lens_bias.core.errors import LensBiasError
from lens_bias.models.parameters import parameters
from lens_bias.models.rebuild import reshaped
from lens_bias.models.reparametrise import residual_role

__all__ = ["prune_residual", "channel_importance"]


def channel_importance(model: Any) -> Tensor:
    """Each residual channel's importance from the weights alone: the summed squared norm of every weight's slice
    that reads or writes it (embedding and unembedding columns, the rows readers multiply it by, the writers' rows
    into it; the norm gains are left out). Width pruning keeps the channels of the largest.

    Args:
        model: a LLaMA-family TransformerLens model.

    Returns:
        A float ``[d_model]`` tensor.
    """
    d = int(model.cfg.d_model)
    total = torch.zeros(d, dtype=torch.float64)
    params = parameters(model)
    hooked = "embed.W_E" in params
    for name, p in params.items():
        role, _ = residual_role(name)
        if role in ("none", "gain", "post_gain"):
            continue
        axis = _channel_axis(role, p, hooked=hooked)
        total += p.detach().double().pow(2).movedim(axis, 0).reshape(d, -1).sum(dim=1)
    return total


def _channel_axis(role: str, p: Tensor, *, hooked: bool) -> int:
    """The axis of ``p`` that indexes residual channels, in TL 3's row convention or nn.Linear's ``[out, in]``."""
    if hooked:
        # W_E [V, d]; readers [.., d, out] (W_Q [h, d, e], W_in [d, m]); writers [..., d]; W_U [d, V]
        return {"embed": 1, "read": -2, "write": -1, "unembed": 0}[role]
    # embed / unembed [V, d]; readers [out, d]; writers [d, in] and their biases [d]
    return {"embed": 1, "read": 1, "write": 0, "unembed": 1}[role] if p.ndim > 1 else 0


def prune_residual(model: Any, width: int, channels: Sequence[int] | None = None) -> Any:
    """A narrower copy of ``model`` that keeps ``width`` of its residual channels.

    Every weight that reads or writes the residual stream keeps the kept channels' slice (in their original order),
    the norm gains too; head and MLP widths stay. ``model`` is left as it was.

    Args:
        model: a LLaMA-family TransformerLens model (a TL 4 bridge of a Hugging Face model, or a TL 3
            ``HookedTransformer``).
        width: how many channels to keep, ``1 ≤ width < d_model``.
        channels: which (default: the ``width`` of the largest :func:`channel_importance`).

    Returns:
        The pruned copy; ``lens_bias_channels`` records which of ``model``'s channels it kept, in order.
    """
    d = int(model.cfg.d_model)
    if not 1 <= width < d:
        raise LensBiasError(f"prune_residual keeps 1 to {d - 1} of the {d} residual channels, got width {width}")
    if channels is None:
        kept = channel_importance(model).topk(width).indices.sort().values
    else:
        kept = torch.as_tensor(list(channels), dtype=torch.long)
        if len(kept) != width or len(set(kept.tolist())) != width or not bool(((kept >= 0) & (kept < d)).all()):
            raise LensBiasError(f"channels must be {width} distinct residual channels in [0, {d}), got {list(channels)[:8]}…")
    old = parameters(model)
    hooked = "embed.W_E" in old
    d_head = int(model.cfg.d_head)  # kept: a head_dim derived from the width would shrink with it
    narrow = reshaped(model, {"head_dim": d_head, "hidden_size": width}, {"d_model": width}, f"-width{width}")
    new = parameters(narrow)
    with torch.no_grad():
        for name, p in new.items():
            w = old[name].detach()
            role, _ = residual_role(name)
            if role != "none":
                axis = 0 if role in ("gain", "post_gain") else _channel_axis(role, w, hooked=hooked)
                w = w.index_select(axis % w.ndim, kept.to(w.device))
            if w.shape != p.shape:
                raise LensBiasError(f"prune_residual cannot narrow {name} {tuple(w.shape)} into {tuple(p.shape)}: it knows LLaMA-family layouts")
            p.copy_(w.to(p.dtype))
    narrow.lens_bias_channels = kept
    return narrow
