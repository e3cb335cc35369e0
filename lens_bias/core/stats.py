"""Small statistics shared by the analyses and the lineage tests, each memory-light and exact: cosines, Kendall's
τ-b, and the detection metrics of a lineage score (AUC, Youden's threshold, multiple-testing corrections)."""

from __future__ import annotations

import math
from typing import Sequence, Union

import numpy as np
import torch
from jaxtyping import Float
from scipy.stats import kendalltau
from torch import Tensor

from lens_bias.core.errors import LensBiasError

__all__ = ["mean_pairwise_cosine", "unit", "kendall_tau_b", "kendall_tau_b_vectorised", "auc", "detection_metrics", "adjust_p"]


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
        raise LensBiasError(f"mean_pairwise_cosine needs at least 2 vectors, got {n}")
    s = unit(x).sum(dim=-2)
    return ((s * s).sum(dim=-1) - n) / (n * (n - 1))


def _tied_pairs(sorted_values: Tensor, boundary: Tensor | None = None) -> Tensor:
    """Pairs (i < j) inside runs of equal values along the last axis of a sorted [k, n] tensor -> [k]."""
    if boundary is None:
        boundary = sorted_values[:, 1:] != sorted_values[:, :-1]
    k, n = sorted_values.shape
    idx = torch.arange(n, device=sorted_values.device).expand(k, n)
    starts = torch.where(torch.cat([torch.ones_like(boundary[:, :1]), boundary], dim=1), idx, torch.zeros_like(idx))
    return (idx - starts.cummax(dim=1).values).sum(dim=1)


def _strict_inversions(y: Tensor) -> Tensor:
    """Pairs i < j with y_i > y_j along the last axis of [k, n], by bottom-up merging of sorted blocks -> [k].

    Every level merges sorted blocks of width w pairwise; for each element of a right block, the left elements
    greater than it are w minus its ``searchsorted(..., right=True)`` position, which is also where it lands in
    the merged block. O(n log n) per column, all columns at once.
    """
    k, n = y.shape
    size = 1 << max(0, (n - 1).bit_length())
    blocks = torch.cat([y, y.new_full((k, size - n), float("inf"))], dim=1)  # +inf padding adds no inversions
    total = torch.zeros(k, dtype=torch.long, device=y.device)
    width = 1
    while width < size:
        pairs = blocks.view(k, size // (2 * width), 2, width)
        left, right = pairs[:, :, 0].contiguous(), pairs[:, :, 1].contiguous()
        leq = torch.searchsorted(left, right, right=True)  # left elements <= each right element
        total += (width - leq).sum(dim=(1, 2))
        lt = torch.searchsorted(right, left, right=False)  # right elements < each left element
        slots = torch.arange(width, device=y.device)
        merged = torch.empty_like(pairs.reshape(k, -1, 2 * width))
        merged.scatter_(2, slots + lt, left)
        merged.scatter_(2, slots + leq, right)
        blocks = merged.reshape(k, size)
        width *= 2
    return total


def kendall_tau_b(x: Float[Tensor, "n k"], y: Float[Tensor, "n k"]) -> Float[Tensor, "k"]:
    """Kendall's τ-b between ``x[:, j]`` and ``y[:, j]`` for every column j, ties handled.

    The same quantity as ``scipy.stats.kendalltau(x[:, j], y[:, j]).statistic``, by the faster exact
    implementation for the tensors' device: on CUDA all columns at once on the GPU (Knight's O(n log n)
    algorithm, vectorised); elsewhere scipy's compiled per-column loop, which beats the vectorised one on CPU
    cores. The two agree to 1e-9. Only order and equality of the values matter; NaN where a column is constant.

    >>> x = torch.tensor([[1.0, 1.0], [2.0, 2.0], [3.0, 2.0], [4.0, 3.0]])
    >>> y = torch.tensor([[1.0, 4.0], [3.0, 3.0], [2.0, 2.0], [4.0, 1.0]])
    >>> [round(t, 4) for t in kendall_tau_b(x, y).tolist()]
    [0.6667, -0.9129]

    Args:
        x: ``[n, k]`` values.
        y: ``[n, k]`` values, paired with ``x`` row by row.

    Returns:
        ``[k]`` τ-b values (float64, on the inputs' device).
    """
    if x.shape != y.shape or x.ndim != 2:
        raise LensBiasError(f"x and y must both be [n, k]; got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.device.type == "cuda":
        return kendall_tau_b_vectorised(x, y)
    return _kendall_tau_b_scipy(x, y)


# scipy's kendalltau without its per-call wrapper (argument and NaN checks, signature inspection: about a quarter of
# the loop at N 10,000): the inputs are checked once for all columns below.
_KENDALLTAU = getattr(kendalltau, "__wrapped__", kendalltau)


def _kendall_tau_b_scipy(x: Tensor, y: Tensor) -> Tensor:
    # float64 holds every float16/bfloat16/float32 value exactly, so order and ties are those of the inputs;
    # transposed, each column is contiguous
    xs, ys = (t.detach().cpu().double().T.contiguous().numpy() for t in (x, y))
    undefined = np.isnan(xs).any(axis=1) | np.isnan(ys).any(axis=1)  # NaN in, NaN out (scipy's "propagate")
    taus = [math.nan if undefined[j] else _KENDALLTAU(xs[j], ys[j])[0] for j in range(xs.shape[0])]
    return torch.tensor(taus, dtype=torch.float64, device=x.device)


def kendall_tau_b_vectorised(x: Float[Tensor, "n k"], y: Float[Tensor, "n k"]) -> Float[Tensor, "k"]:
    """:func:`kendall_tau_b` computed for all columns at once, on the tensors' device (what it runs on CUDA).

    Values are compared in their own dtype.

    Args:
        x: ``[n, k]`` values.
        y: ``[n, k]`` values, paired with ``x`` row by row.

    Returns:
        ``[k]`` τ-b values (float64).
    """
    if x.shape != y.shape or x.ndim != 2:
        raise LensBiasError(f"x and y must both be [n, k]; got {tuple(x.shape)} and {tuple(y.shape)}")
    n = x.shape[0]
    xt, yt = x.T.contiguous(), y.T.contiguous()
    by_y = torch.argsort(yt, dim=1, stable=True)
    xt, yt = xt.gather(1, by_y), yt.gather(1, by_y)
    by_x = torch.argsort(xt, dim=1, stable=True)  # stable: ties in x keep y ascending (a lexsort)
    xs, ys = xt.gather(1, by_x), yt.gather(1, by_x)
    pairs = n * (n - 1) // 2
    x_ties = _tied_pairs(xs)
    joint_ties = _tied_pairs(xs, (xs[:, 1:] != xs[:, :-1]) | (ys[:, 1:] != ys[:, :-1]))
    y_ties = _tied_pairs(ys.sort(dim=1).values)
    discordant = _strict_inversions(ys)
    concordant_minus_discordant = pairs - x_ties - y_ties + joint_ties - 2 * discordant
    denominator = ((pairs - x_ties).double() * (pairs - y_ties).double()).sqrt()
    return concordant_minus_discordant.double() / denominator


def auc(scores: Union[Float[Tensor, "n"], Sequence[float], np.ndarray], labels: Union[Sequence[bool], np.ndarray]) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting one half (exact).

    >>> auc([0.9, 0.8, 0.1], [True, False, False])
    1.0
    """
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        raise LensBiasError(f"the AUC needs both labels; got {len(pos)} positives and {len(neg)} negatives")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


def detection_metrics(scores: Sequence[float], labels: Sequence[bool], fpr_bar: float = 0.01) -> dict[str, float]:
    """LeaFBench's metrics of a lineage score: AUC; accuracy, TPR and FPR at the one global threshold that maximises
    Youden's J = TPR − FPR ("score ≥ threshold" is a positive); the TPR at an FPR of at most ``fpr_bar``.

    >>> m = detection_metrics([5.0, 4.0, 1.0, 0.5], [True, True, False, False])
    >>> m["auc"], m["accuracy"], m["tpr_at_1pct_fpr"]
    (1.0, 1.0, 1.0)
    """
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    area = auc(s, y)
    best, at_bar = (-1.0, 0.0, 0.0, 0.0, float("inf")), 0.0
    for threshold in np.unique(np.concatenate([s, [np.inf]])):
        predicted = s >= threshold
        tpr, fpr = float(predicted[y].mean()), float(predicted[~y].mean())
        if tpr - fpr > best[0]:
            best = (tpr - fpr, float((predicted == y).mean()), tpr, fpr, float(threshold))
        if fpr <= fpr_bar:
            at_bar = max(at_bar, tpr)
    _, accuracy, tpr, fpr, threshold = best
    return {"auc": area, "accuracy": accuracy, "tpr": tpr, "fpr": fpr, "threshold": threshold, "tpr_at_1pct_fpr": at_bar,
            "positives": int(y.sum()), "negatives": int((~y).sum())}


def adjust_p(p: Sequence[float], method: str = "holm") -> np.ndarray:
    """p-values adjusted for testing them all: "holm" (family-wise error, Holm 1979) or "bh" (false discovery rate,
    Benjamini–Hochberg 1995).

    >>> adjust_p([0.01, 0.04, 0.03], "holm").round(3).tolist()
    [0.03, 0.06, 0.06]
    >>> adjust_p([0.01, 0.04, 0.03], "bh").round(3).tolist()
    [0.03, 0.04, 0.04]
    """
    values = np.asarray(p, dtype=float)
    m = len(values)
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    if method == "holm":
        adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * ranked))
    elif method == "bh":
        adjusted = np.minimum.accumulate(np.minimum(1.0, m * ranked / np.arange(1, m + 1))[::-1])[::-1]
    else:
        raise LensBiasError(f"correction must be 'holm' or 'bh', got {method!r}")
    out = np.empty(m)
    out[order] = adjusted
    return out
