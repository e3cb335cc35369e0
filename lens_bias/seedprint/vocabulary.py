"""Renamed vocabularies: which token of one model is which token of another, read off their embedding rows.

A descendant can rename its vocabulary: permute the rows of W_E and W_U and rename the tokenizer alike. On text it
is the same model; on random token IDs it answers other inputs, so SeedPrint's token inputs would call it
unrelated. When the two embedding tables are one table up to the order of its rows (nearly every sampled row of
``a`` has a row of ``b`` within cosine :data:`MATCH_COSINE`, and not at its own ID), :func:`renamed_tokens` gives
``b``'s IDs for ``a``'s tokens, so both models see the same inputs. Unrelated models never pass that test (the
largest cosine between independent rows in d dimensions is about √(2 ln V / d): 0.19 for SmolLM2), so their inputs
are never changed.

:func:`embedding_sketch` keeps what that test needs of one model, its rows through a fixed random projection, so
that :func:`~lens_bias.seedprint.pairwise_lineage` finds renamings among many models with one model in memory at a
time (:func:`renamed_ids` compares two sketches as it compares two tables).

>>> import lens_bias
>>> from lens_bias.models.reparametrise import rename_vocabulary
>>> model = lens_bias.random_init("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=50, n_ctx=8)
>>> renamed = rename_vocabulary(model, seed=1)
>>> tokens = torch.tensor([[3, 1, 4]])
>>> torch.equal(renamed_tokens(model, renamed, tokens), renamed.lens_bias_vocabulary[tokens])
True
>>> renamed_tokens(model, model, tokens) is None
True
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_bias.core.stats import unit

__all__ = ["renamed_tokens", "renamed_ids", "is_renamed", "embedding_sketch", "nearest_rows", "MATCH_COSINE", "SAME_TABLE", "SKETCH_DIMS"]

logger = logging.getLogger(__name__)

MATCH_COSINE = 0.9
"""A row of ``a`` matches a row of ``b`` at this cosine or above: 4-bit quantisation and fine-tuning keep a row's
cosine with itself above 0.99; independent rows stay below 0.3 at the widths of real models."""

SAME_TABLE = 0.9
"""The share of sampled rows that must match for the two tables to count as one table (a few untrained rows of a
real vocabulary may be near-duplicates of each other)."""

SKETCH_DIMS = 64
"""Projected dimensions of a sketch: independent rows' cosines spread by 1/√64, so the largest among 262k rows stays
near 0.6, while a row and its quantised or fine-tuned self keep a cosine above 0.95."""

_SAMPLE = 256  # rows of a sampled to decide
_BLOCK_BYTES = 1 << 28  # cosines computed 256 MB at a time


def _unit_rows(model: Any) -> Tensor:
    return unit(model.W_E.detach().cpu())


def nearest_rows(rows: Tensor, table: Tensor) -> tuple[Tensor, Tensor]:
    """(best cosine, index of the best row of ``table``) for each of ``rows``, in blocks that fit the budget."""
    block = max(1, _BLOCK_BYTES // (4 * table.shape[0]))
    rows, table = rows.float(), table.float()
    best, index = [], []
    for start in range(0, rows.shape[0], block):
        values, where = (rows[start:start + block] @ table.T).max(dim=1)
        best.append(values)
        index.append(where)
    return torch.cat(best), torch.cat(index)


def embedding_sketch(model: Any) -> Float[Tensor, "d_vocab k"]:
    """``model``'s unit embedding rows projected to :data:`SKETCH_DIMS` dimensions and made unit again, in float16.

    The projection is drawn from the width alone, so two models of one width are sketched alike and
    :func:`renamed_ids` compares their sketches as :func:`renamed_tokens` compares their tables.

    >>> import lens_bias
    >>> embedding_sketch(lens_bias.random_init("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=50, n_ctx=8)).shape
    torch.Size([50, 64])
    """
    return table_sketch(model.W_E.detach().cpu())


def table_sketch(table: Float[Tensor, "d_vocab d"]) -> Float[Tensor, "d_vocab k"]:
    """:func:`embedding_sketch` of an embedding table itself."""
    return sketch_rows(unit(table)).half()


def sketch_rows(rows: Float[Tensor, "v d"]) -> Float[Tensor, "v k"]:
    """``rows`` projected to :data:`SKETCH_DIMS` dimensions by a projection drawn from the width alone, and made unit:
    two tables of one width, in one basis, are sketched alike."""
    projection = torch.randn(rows.shape[1], SKETCH_DIMS, generator=torch.Generator().manual_seed(rows.shape[1]))
    return unit(rows.float() @ projection)


def is_renamed(table_a: Float[Tensor, "v_a d"], table_b: Float[Tensor, "v_b d"], *, seed: int = 0) -> bool:
    """Whether table ``b`` is table ``a`` with its rows in another order (:data:`SAME_TABLE` of sampled rows match
    within :data:`MATCH_COSINE`, and fewer of them at their own ID); unit rows or :func:`embedding_sketch` es."""
    if table_a.shape[1] != table_b.shape[1]:
        return False
    sample = torch.randperm(table_a.shape[0], generator=torch.Generator().manual_seed(seed))[:_SAMPLE]
    cosine, where = nearest_rows(table_a[sample], table_b)
    matched = (cosine >= MATCH_COSINE).float().mean().item()
    in_place = (where == sample).float().mean().item()
    if matched < SAME_TABLE or in_place >= SAME_TABLE:
        return False
    logger.info("the vocabulary is renamed (%.0f%% of sampled embedding rows match, %.0f%% at their own ID): token inputs follow the renaming",
                100 * matched, 100 * in_place)
    return True


def renamed_ids(
    table_a: Float[Tensor, "v_a d"], table_b: Float[Tensor, "v_b d"], tokens: Int[Tensor, "n seq"], *, seed: int = 0
) -> Int[Tensor, "n seq"] | None:
    """``b``'s IDs for ``a``'s ``tokens`` when table ``b`` is table ``a`` with its rows in another order, else None.

    Args:
        table_a: unit embedding rows of the base (or its :func:`embedding_sketch`).
        table_b: the suspect's, alike.
        tokens: token IDs of ``a``.
        seed: which rows are sampled to decide (:func:`is_renamed`).

    Returns:
        Each token's nearest row of ``b`` by cosine, or None when the tables are not one table renamed (unrelated,
        of other widths, or already in the same order).
    """
    if not is_renamed(table_a, table_b, seed=seed):
        return None
    unique, inverse = torch.unique(tokens, return_inverse=True)
    return nearest_rows(table_a[unique], table_b)[1][inverse].view_as(tokens)


def renamed_tokens(model_a: Any, model_b: Any, tokens: Int[Tensor, "n seq"], *, seed: int = 0) -> Int[Tensor, "n seq"] | None:
    """``b``'s token IDs for ``a``'s ``tokens`` when ``b``'s vocabulary is ``a``'s renamed, else None.

    Args:
        model_a: the base model.
        model_b: the suspect, of the same width.
        tokens: token IDs of ``a``.
        seed: which rows are sampled to decide.

    Returns:
        The renamed IDs (each token's nearest embedding row of ``b`` by cosine), or None when the tables are not one
        table renamed (unrelated, or already in the same order).
    """
    return renamed_ids(_unit_rows(model_a), _unit_rows(model_b), tokens, seed=seed)
