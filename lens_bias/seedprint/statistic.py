"""The SeedPrint statistic: identity dimensions, softmax at a temperature, per-dimension Kendall τ-b, and τ̄.

>>> import torch
>>> features = torch.tensor([[0.0, 5.0, -1.0], [1.0, 4.0, -2.0]])
>>> identity_dims(features, 2).tolist()
[2, 0]
>>> round(tau_null_sd(100), 4)
0.0678
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from scipy.stats import norm
from torch import Tensor

from lens_bias.core.stats import kendall_tau_b

__all__ = ["identity_dims", "tau_null_sd", "tau_statistic", "TauStatistic", "log_p_scaled_sf", "MODES"]

MODES = ("coset", "base")


def tau_null_sd(n: int) -> float:
    """Standard deviation of Kendall's τ between two independent samples of size n: √(2(2n+5)/(9n(n−1)))."""
    return math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))


def identity_dims(features: Float[Tensor, "n d"], m: int) -> Int[Tensor, " m"]:
    """Indices of the m dimensions with the smallest mean over the inputs (``topk(avg, m, largest=False)``)."""
    return torch.topk(features.mean(dim=0), m, largest=False).indices


@dataclass(frozen=True)
class TauStatistic:
    """One pass of the pipeline: identity dims, per-dimension τ's and their mean over the k defined ones."""

    tau_bar: float
    taus: Tensor
    dims: Tensor
    k: int


def tau_statistic(fa: Float[Tensor, "n d"], fb: Float[Tensor, "n d"], m: int, mode: str, temperature: float) -> TauStatistic:
    """Identity dims, softmax at temperature, per-dimension Kendall τ-b, NaN τ's dropped."""
    dims = identity_dims(fa, m)
    if mode == "coset":
        other = identity_dims(fb, m)
        dims = dims[torch.isin(dims, other)]
    dims = dims.sort().values
    if dims.numel() < 2:  # k = 1: the softmax over one dimension is constant, τ undefined
        return TauStatistic(float("nan"), torch.empty(0), dims, dims.numel())
    pa = torch.softmax(fa[:, dims].double() / temperature, dim=1)
    pb = torch.softmax(fb[:, dims].double() / temperature, dim=1)
    taus = kendall_tau_b(pa, pb)
    valid = taus[~torch.isnan(taus)]
    return TauStatistic(valid.mean().item() if valid.numel() else float("nan"), taus, dims, int(valid.numel()))


def log_p_scaled_sf(z: float, factor: float) -> float:
    """log of min(1, factor · Φ̄(z)), exact far into the tail (``norm.logsf``)."""
    return min(0.0, math.log(factor) + float(norm.logsf(z)))
