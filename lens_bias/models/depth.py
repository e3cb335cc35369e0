"""Depth edits: a copy with some of the base's blocks removed or repeated, as layer pruning (ShortGPT, "The
Unreasonable Ineffectiveness of the Deeper Layers") and depth up-scaling (SOLAR) make descendants (what SeedPrint
must keep finding: the embedding, the unembedding and every kept block are the base's own weights).

:func:`stack_layers` builds a model whose block ``j`` is the base's block ``order[j]``; :func:`remove_layers` and
:func:`duplicate_layers` name the common orders. The copy computes another function (a block now reads what another
block wrote), as such a model does before it is healed by training.

>>> import lens_bias
>>> model = lens_bias.random_init("llama", d_model=64, n_layers=4, n_heads=4, d_vocab=500, n_ctx=16)
>>> remove_layers(model, [1, 2]).lens_bias_layers.tolist(), duplicate_layers(model, [1, 2]).lens_bias_layers.tolist()
([0, 3], [0, 1, 2, 1, 2, 3])
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import torch

from lens_bias.core.errors import LensBiasError
from lens_bias.models.parameters import parameters
from lens_bias.models.rebuild import reshaped

__all__ = ["stack_layers", "remove_layers", "duplicate_layers"]

_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def stack_layers(model: Any, order: Sequence[int]) -> Any:
    """A copy of ``model`` whose block ``j`` is ``model``'s block ``order[j]`` (any block any number of times).

    Args:
        model: a TL 4 bridge of a Hugging Face model, or a TL 3 ``HookedTransformer`` (not modified).
        order: the base's block for each block of the copy; at least one.

    Returns:
        The copy; ``lens_bias_layers`` records ``order``.
    """
    n = int(model.cfg.n_layers)
    layers = torch.as_tensor(list(order), dtype=torch.long)
    if len(layers) == 0 or not bool(((layers >= 0) & (layers < n)).all()):
        raise LensBiasError(f"order names the base's blocks 0 to {n - 1}, at least one, got {list(order)[:8]}")

    def edit(config: Any) -> None:
        config.num_hidden_layers = len(layers)
        if getattr(config, "layer_types", None) is not None:  # sliding or full attention follows its block
            config.layer_types = [config.layer_types[i] for i in layers.tolist()]

    stacked = reshaped(model, edit, {"n_layers": len(layers)}, f"-layers{len(layers)}")
    old = parameters(model)
    with torch.no_grad():
        for name, p in parameters(stacked).items():
            block = _BLOCK.match(name)
            source = f"blocks.{int(layers[int(block.group(1))])}." + name[block.end():] if block else name
            if source not in old or old[source].shape != p.shape:
                raise LensBiasError(f"stack_layers cannot fill {name} from {source}: the rebuilt model's layout differs from the base's")
            p.copy_(old[source].detach())
    stacked.lens_bias_layers = layers
    return stacked


def remove_layers(model: Any, layers: Sequence[int]) -> Any:
    """A copy of ``model`` without the blocks ``layers`` (the others in order), as layer pruning leaves it.

    Args:
        model: a TransformerLens model (not modified).
        layers: the blocks to remove; at least one block stays.

    Returns:
        The shallower copy (``lens_bias_layers``: the base's blocks it kept).
    """
    n, removed = int(model.cfg.n_layers), set(layers)
    if not removed <= set(range(n)) or len(removed) >= n:
        raise LensBiasError(f"remove_layers removes some of the blocks 0 to {n - 1} and keeps one at least, got {sorted(removed)[:8]}")
    return stack_layers(model, [i for i in range(n) if i not in removed])


def duplicate_layers(model: Any, layers: Sequence[int]) -> Any:
    """A copy of ``model`` with the blocks ``layers`` repeated, in that order, right after the last of them, as
    depth up-scaling stacks a model on part of itself: SOLAR's two copies of a 32-block base, one without its last 8
    blocks and one without its first 8, are ``duplicate_layers(model, range(8, 24))``.

    Args:
        model: a TransformerLens model (not modified).
        layers: the blocks to repeat; at least one.

    Returns:
        The deeper copy (``lens_bias_layers``: the base's block of each of its blocks).
    """
    n, repeated = int(model.cfg.n_layers), list(layers)
    if not repeated or not set(repeated) <= set(range(n)):
        raise LensBiasError(f"duplicate_layers repeats some of the blocks 0 to {n - 1}, got {repeated[:8]}")
    after = max(repeated) + 1
    return stack_layers(model, list(range(after)) + repeated + list(range(after, n)))
