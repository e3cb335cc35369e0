"""Small statistics shared by the analyses, each memory-light and exact."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

__all__ = ["mean_pairwise_cosine", "unit"]


def unit(x: Float[Tensor, "... d"], eps: float = 1e-12) -> Float[Tensor, "... d"]:
    """``x / ‖x‖`` along the last axis, in float32."""
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(eps)


def mean_pairwise_cosine(x: Float[Tensor, "... n d"]) -> Float[Tensor, "..."]:
    """Mean cosine over all ordered pairs i ≠ j of the ``n`` vectors, without forming the n×n matrix.

    Uses ``Σ_{i≠j} u_i·u_j = ‖Σ u_i‖² − n`` for unit vectors ``u``.

    >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    >>> round(mean_pairwise_cosine(x).item(), 4)  # (0 + 0.7071 + 0.7071) / 3
    0.4714

    Args:
        x: vectors along the second-to-last axis.

    Returns:
        The mean pairwise cosine for each leading index.
    """
    n = x.shape[-2]
    if n < 2:
        raise ValueError(f"mean_pairwise_cosine needs at least 2 vectors, got {n}")
    s = unit(x).sum(dim=-2)
    return ((s * s).sum(dim=-1) - n) / (n * (n - 1))
