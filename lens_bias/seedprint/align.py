"""Aligning a suspect's features to the base's basis before the lineage test: what a reparametrised basis needs.

SeedPrint compares dimension j of one model with dimension j of the other, so a model whose residual basis was
permuted or rotated (a function-preserving reparametrisation: :func:`lens_bias.models.reparametrise.permute_residual`,
:func:`~lens_bias.models.reparametrise.rotate_residual`, rotation-based quantisation) looks unrelated. An alignment
fits a map from the suspect's features to the base's on one part of the inputs; the lineage test then runs on the
held-out rest, in the base's basis.

| mode | the map fitted on the fit rows | covers |
|---|---|---|
| ``None`` | none (the published test, on every row) | descendants that keep the basis: quantisation, pruning, fine-tunes, merges, adapters |
| ``"permutation"`` | the dimension matching that maximises the summed correlation (Hungarian assignment) | permuted residual dimensions |
| ``"orthogonal"`` | orthogonal Procrustes on the centred features | rotations of the residual stream, with the norm gains folded or not (the features are read before the final norm's gain); permutations too |
| ``"linear"`` | least squares (a small ridge) on the centred features | any invertible linear change of basis, e.g. rotations followed by per-dimension scalings |

No mode covers a different width (:func:`~lens_bias.seedprint.compare`'s default maps a pruned width through the
embedding tables), or distillation into a fresh init (a different initialisation by construction).
The more a mode can fit, the more it can also fit between unrelated models: judge aligned tests against a null
that is aligned the same way (``SeedsNull``), and measure each mode's false-positive rate with
:func:`lens_bias.seedprint.calibrate` (``align=``).

>>> import torch
>>> a = torch.randn(400, 8)
>>> aligned = fit("permutation", a[:200], a[:200, [3, 1, 0, 2, 7, 6, 5, 4]])
>>> torch.equal(aligned(a[200:, [3, 1, 0, 2, 7, 6, 5, 4]]), a[200:])
True
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Optional, get_args

import torch
from jaxtyping import Float
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from lens_bias.core.errors import LensBiasError

__all__ = ["ALIGN_MODES", "AlignMode", "check_align", "fit", "map_matrix", "split_and_align", "FIT_FRACTION"]

AlignMode = Optional[Literal["permutation", "orthogonal", "linear"]]
"""An alignment mode; None is the published test (no alignment)."""
ALIGN_MODES: tuple[AlignMode, ...] = (None, *get_args(get_args(AlignMode)[0]))


def check_align(align: Any, *, auto: bool = False) -> None:
    """Refuse anything but one of ``ALIGN_MODES``, or ``"auto"`` (:func:`~lens_bias.seedprint.compare`'s default,
    which reads the two models' weights) where the caller holds the models (``auto=True``): the one place the mode
    is checked."""
    if isinstance(align, str) and align == "auto":
        if not auto:
            raise LensBiasError("align='auto' reads the two models' tokenizers and weights, which features do not hold: call compare(model_a, model_b, align='auto')")
        return
    if align not in ALIGN_MODES:
        raise LensBiasError(f"align must be one of {(*ALIGN_MODES, 'auto') if auto else ALIGN_MODES}, got {align!r}")


def split_and_align(align: AlignMode, fit_rows: int, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """``x`` and ``y`` on the test rows, ``y`` aligned to ``x``'s basis on the first ``fit_rows`` rows (as they are,
    without an alignment)."""
    if align is None:
        return x, y
    return x[fit_rows:], fit(align, x[:fit_rows], y[:fit_rows])(y[fit_rows:])
# Share of the inputs (the first rows) an alignment is fitted on; the test runs on the rest.
FIT_FRACTION = 0.5
# Ridge of the linear map, relative to the mean variance of the suspect's features: keeps the fit defined when the
# fit rows are fewer than the dimensions.
_RIDGE = 1e-6

Aligner = Callable[[Float[Tensor, "n d"]], Float[Tensor, "n d"]]


def map_matrix(mode: AlignMode, base: Float[Tensor, "n d"], suspect: Float[Tensor, "n d"]) -> Float[Tensor, "d d"]:
    """The matrix ``M`` (float64) with ``suspect @ M ≈ base``, fitted on these rows: a one-hot matching of dimensions
    ("permutation"), orthogonal Procrustes on the centred rows ("orthogonal") or least squares with a small ridge
    ("linear"). What :func:`fit` applies to features, and what the weight-fitted maps of
    :mod:`~lens_bias.seedprint.correspondence` apply to embedding tables. Of two widths (``[n, d_a]`` and ``[n, d_b]``),
    "permutation" matches the narrower side's dimensions to as many of the wider's (a pruned width's partial map).
    """
    check_align(mode)
    if mode is None:
        raise LensBiasError("fit needs a map to fit: 'permutation', 'orthogonal' or 'linear' (None is the published test, which fits none)")
    partial = mode == "permutation" and base.ndim == suspect.ndim == 2 and base.shape[0] == suspect.shape[0]
    if not partial and (base.shape != suspect.shape or base.ndim != 2):
        raise LensBiasError(f"alignment needs two feature matrices of one shape [n, d], got {tuple(base.shape)} and {tuple(suspect.shape)}")
    a, b = base.double(), suspect.double()
    ca, cb = a - a.mean(0), b - b.mean(0)
    if mode == "permutation":
        corr = (ca / ca.norm(dim=0).clamp_min(1e-12)).T @ (cb / cb.norm(dim=0).clamp_min(1e-12))  # [d_a, d_b]
        rows, cols = linear_sum_assignment(corr.numpy(), maximize=True)
        matrix = torch.zeros(b.shape[1], a.shape[1], dtype=torch.float64)
        matrix[torch.as_tensor(cols), torch.as_tensor(rows)] = 1.0  # suspect dim cols[i] -> base dim rows[i]
        return matrix
    if mode == "orthogonal":
        u, _, vh = torch.linalg.svd(cb.T @ ca, full_matrices=False)
        return u @ vh  # argmin over orthogonal Q of ‖cb·Q − ca‖
    gram = cb.T @ cb  # "linear", the last mode
    ridge = _RIDGE * gram.diagonal().mean() * torch.eye(gram.shape[0], dtype=gram.dtype)
    return torch.linalg.solve(gram + ridge, cb.T @ ca)


def fit(mode: AlignMode, base: Float[Tensor, "n d"], suspect: Float[Tensor, "n d"]) -> Aligner:
    """The map that takes the suspect's features into the base's basis, fitted on these rows (:func:`map_matrix`).

    Args:
        mode: "permutation", "orthogonal" or "linear" (see the module docstring).
        base: the base model's features on the fit rows.
        suspect: the suspect's features on the same rows.

    Returns:
        A function from suspect features ``[n, d]`` (any rows) to features in the base's basis.
    """
    if base.shape != suspect.shape:
        raise LensBiasError(f"alignment needs two feature matrices of one shape [n, d], got {tuple(base.shape)} and {tuple(suspect.shape)}")
    matrix = map_matrix(mode, base, suspect)
    if mode == "permutation":
        order = matrix.argmax(dim=0)  # base dim i <- suspect dim order[i]: the features themselves, reordered
        return lambda x: x[:, order]
    return lambda x: (x.double() @ matrix).to(x.dtype)
