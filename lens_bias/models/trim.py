"""Vocabulary trimming: a copy that keeps a subset of the base's tokens, their rows of the embedding and the
unembedding in their order (as a model is cut down to one language's or one domain's tokens), with no tokenizer to
say which (what SeedPrint's token map must read from the rows alone).

>>> import lens_bias
>>> model = lens_bias.random_init("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=50, n_ctx=8)
>>> trimmed = trim_vocabulary(model, 0.2, seed=1)
>>> trimmed.W_E.shape[0], bool((trimmed.W_E == model.W_E[trimmed.lens_bias_kept]).all())
(40, True)
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from lens_bias.core.errors import LensBiasError
from lens_bias.models.parameters import parameters, vocabulary_axis
from lens_bias.models.rebuild import reshaped

__all__ = ["trim_vocabulary"]

def trim_vocabulary(model: Any, fraction: float = 0.2, seed: int = 0, *, kept: Sequence[int] | None = None) -> Any:
    """A copy of ``model`` without ``fraction`` of its tokens (drawn from ``seed``), the others in their order.

    Args:
        model: a TL 4 bridge of a Hugging Face model, or a TL 3 ``HookedTransformer`` (not modified).
        fraction: the share of tokens removed, ``0 < fraction < 1``.
        seed: which tokens (a local generator).
        kept: the tokens to keep instead (distinct IDs; kept in increasing order).

    Returns:
        The trimmed copy, without a tokenizer (its IDs are no longer the tokenizer's); ``lens_bias_kept`` records the
        base's ID of each of its tokens.
    """
    old = parameters(model)
    table = old.get("embed.weight", old.get("embed.W_E"))
    if table is None:
        raise LensBiasError("trim_vocabulary needs a token embedding (embed.weight or embed.W_E)")
    vocab = int(table.shape[0])  # the table's rows, not cfg.d_vocab
    if kept is None:
        if not 0 < fraction < 1:
            raise LensBiasError(f"trim_vocabulary removes a share 0 < fraction < 1 of the tokens, got {fraction}")
        removed = max(1, round(fraction * vocab))
        ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[removed:].sort().values
    else:
        ids = torch.as_tensor(list(kept), dtype=torch.long).sort().values
        if len(ids) == 0 or len(ids.unique()) != len(ids) or not bool(((ids >= 0) & (ids < vocab)).all()):
            raise LensBiasError(f"kept must be distinct token IDs in [0, {vocab}), at least one, got {list(kept)[:8]}")
    size = len(ids)
    trimmed = reshaped(model, {"vocab_size": size}, {"d_vocab": size, "d_vocab_out": size}, f"-vocab{size}")
    with torch.no_grad():
        for name, p in parameters(trimmed).items():
            w, axis = old[name].detach(), vocabulary_axis(name)
            p.copy_(w if axis is None else w.index_select(axis, ids.to(w.device)))
    trimmed.tokenizer = None
    trimmed.lens_bias_kept = ids
    return trimmed
