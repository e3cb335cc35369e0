"""Do two embedding tables agree beyond chance? The weights' own evidence of lineage, which ``compare``'s default asks
for between two trained models.

The analytic null of the SeedPrint test holds for random inits. Between trained models it does not: models trained
from other seeds on one corpus learn alike, and the published test calls 12 of 45 such pairs related
(``lens-bias lineage-negatives``). Their weights, in contrast, share nothing coordinate by coordinate: a model's
residual coordinates are fixed by its own init. A descendant (fine-tuned, quantised, renamed, rotated and mapped
back) keeps its base's table.

The statistic: over the tokens both models have (at most :data:`ROWS` of them), each residual coordinate ``j``'s
column correlation ``c_j`` between the two tables (rows centred), and ``z = Σ c_j / sqrt(Σ c_j²)``. Flipping the
sign of one residual coordinate of a model (its embedding column and every weight that reads or writes it) leaves a
Gaussian init's distribution and sign-equivariant training (SGD, Adam) unchanged, so between unrelated models each
``c_j`` is as likely negative as positive, independently, whatever its size. Hoeffding's inequality then bounds the
chance of a ``z`` this large: ``p ≤ exp(−z²/2)``. The bound is exact in this sense for RMSNorm models; LayerNorm
subtracts the mean over coordinates, which a flip changes, so there it is close rather than exact. A model's own
descendant reaches ``z ≈ sqrt(D)`` (every column agrees); over the 45 unrelated trained pairs of
``lens-bias lineage-negatives``, z lies between −2.65 and 1.99 (mean 0.22, sd 1.12), and over its 255 random-init
pairs between −2.78 and 2.31.

>>> import lens_bias, torch
>>> from lens_bias.models.transforms import quantize
>>> from lens_bias.seedprint.correspondence import TokenMap
>>> base = lens_bias.random_init("llama", d_model=64, n_layers=1, n_heads=4, d_vocab=500, n_ctx=8)
>>> same = TokenMap(torch.arange(500), "same")
>>> table_agreement(base, quantize(base, 4), same).log10_p < -10
True
>>> table_agreement(base, lens_bias.random_init("llama", seed=1, d_model=64, n_layers=1, n_heads=4, d_vocab=500, n_ctx=8), same).log10_p > -2
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from lens_bias.seedprint.correspondence import BasisMap, Embedding, TokenMap

__all__ = ["TableAgreement", "table_agreement", "ROWS"]

ROWS = 65536
"""The most tokens compared; larger vocabularies (Gemma 3's 262k, Qwen2.5's 152k) are compared on this many, drawn
with a fixed seed. A column correlation over 65536 rows is known to ±0.004, far inside what tells a descendant
(c̄ near 1) from an unrelated table (c̄ near 0), and the whole table took seconds per pair in float64."""


@dataclass(frozen=True)
class TableAgreement:
    """How far the suspect's embedding table agrees with the base's, column by column, in the base's basis."""

    z: float  # Σ c_j / sqrt(Σ c_j²) over the residual coordinates
    mean_correlation: float  # the mean column correlation c̄ (1 for a copy, about 0 between unrelated tables)
    rows: int  # the tokens both tables have, compared
    # the bound on p under unrelated tables (log10), or None where the columns were matched by a map fitted on these
    # same tables (a permutation, rotation or linear map): a fit makes agreement by construction, so its residual
    # (BasisMap.residual, at most correspondence.FIT) is the evidence there
    log10_p: float | None

    def agrees(self, alpha: float) -> bool:
        """Whether the tables are one table's: beyond chance at level ``alpha``, or matched by an accepted fitted map."""
        return self.log10_p is None or self.log10_p < math.log10(alpha)


def table_agreement(base: Any, suspect: Any, tokens: TokenMap, basis: BasisMap | None = None) -> TableAgreement:
    """The column agreement of the two embedding tables over the tokens ``tokens`` pairs, after ``basis`` (the
    suspect's map into the base's basis) where one was fitted.

    Args:
        base: the base model (its ``W_E``), or its :class:`~lens_bias.seedprint.correspondence.Embedding`.
        suspect: the suspect.
        tokens: the suspect's ID of each base token (:func:`~lens_bias.seedprint.correspondence.token_map`).
        basis: the suspect's basis map (:func:`~lens_bias.seedprint.correspondence.basis_map`); None or a kept basis
            (``identity``, ``none``) compares the tables as they are.

    Returns:
        A :class:`TableAgreement`.
    """
    table_a, table_b = (Embedding.of(m).table for m in (base, suspect))
    shared = tokens.shared
    fitted = basis is not None and basis.matrix is not None
    if (table_a.shape[1] != table_b.shape[1] and not fitted) or len(shared) < 3:
        return TableAgreement(z=0.0, mean_correlation=0.0, rows=len(shared), log10_p=0.0)
    if len(shared) > ROWS:  # drawn without looking at the tables, so the bound holds on them as on all rows
        shared = shared[torch.randperm(len(shared), generator=torch.Generator().manual_seed(0))[:ROWS]].sort().values
    a, b = table_a[shared].double(), table_b[tokens.ids[shared]].double()  # the rows compared, each copied once
    if fitted:
        assert basis is not None
        a, b = basis.compared(a, b)  # between two widths, over the channels both hold
    a, b = a - a.mean(0), b - b.mean(0)
    c = (a * b).sum(0) / (a.norm(dim=0) * b.norm(dim=0)).clamp_min(1e-300)
    z = float(c.sum() / c.norm().clamp_min(1e-300))
    log10_p = None if fitted else 0.0 if z <= 0 else -z * z / (2 * math.log(10))
    return TableAgreement(z=z, mean_correlation=float(c.mean()), rows=len(shared), log10_p=log10_p)

