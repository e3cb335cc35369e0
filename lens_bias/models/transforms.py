"""Model transforms: descendants of a model made on the spot by editing its weights (what SeedPrint must still
recognise), and fresh random inits of its configuration (what it must not). The function-preserving ones (a
permuted or rotated residual basis, a renamed vocabulary) are :mod:`lens_bias.models.reparametrise`'s.

Every function takes any TransformerLens model (a TL 4 bridge or a TL 3 ``HookedTransformer``), returns a new
model and leaves its input bit for bit as it was:

- :func:`quantize`: round-trip symmetric absmax quantisation per group of ``group_size`` entries along each
  weight's last stored axis (on a bridge the input axis of each ``nn.Linear`` weight, like GGUF's Q8_0 / Q4_0
  blocks), dequantised back to float. Every element moves by at most half a quantisation step of its group.
- :func:`prune`: magnitude pruning, the smallest ``fraction`` of each block weight matrix set to zero (the
  embeddings are kept, as Wanda and SparseGPT keep them).
- :func:`merge`: the weight average ``(1 − weight)·a + weight·b`` of two models of one architecture.
- :func:`low_rank_delta`: a LoRA-style ``W + B·A`` on every attention and MLP matrix, ``A``, ``B`` of rank r drawn
  from a seeded generator and scaled to a relative Frobenius norm.
- :func:`random_inits`: fresh random inits of the same configuration (Hugging Face defaults: N(0, 0.02) matrices,
  unit norm gains, zero biases), one model object re-drawn in place per seed.


Tied embeddings stay tied: a bridge shares one parameter; in a HookedTransformer, which keeps ``W_U`` as its own
parameter, a ``W_U`` equal to ``W_Eᵀ`` is rewritten from the transformed ``W_E``.

>>> import lens_bias
>>> model = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> lens_bias.compare(model, quantize(model, bits=4), n=64, seq_len=8, m=32, progress=False).log10_p < -10
True
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from lens_bias.core.errors import LensBiasError
from lens_bias.models.architectures.base import init_parameters, is_bias
from lens_bias.models.init import mark
from lens_bias.models.parameters import copy_model, hooked_tie, parameters

__all__ = ["quantize", "prune", "merge", "low_rank_delta", "random_inits", "relative_change"]


# ---- weights, generically --------------------------------------------------------------------------------------


def _weight_matrices(params: dict[str, torch.nn.Parameter], *, blocks_only: bool) -> dict[str, torch.nn.Parameter]:
    """The ≥2-D weights (not TL 3's 2-D per-head biases), optionally only those inside the transformer blocks."""
    return {n: p for n, p in params.items() if p.ndim >= 2 and not is_bias(n) and (not blocks_only or n.startswith("blocks."))}


def _transformed(model: Any, fn: Callable[[str, Tensor], Tensor], *, blocks_only: bool) -> Any:
    """A copy of ``model`` with ``fn(name, weight)`` (computed in float32) applied to every weight matrix."""
    clone = copy_model(model)
    params = parameters(clone)
    tied = hooked_tie(params)
    with torch.no_grad():
        for name, p in _weight_matrices(params, blocks_only=blocks_only).items():
            if tied and name == "unembed.W_U":
                continue
            p.copy_(fn(name, p.detach().float()).to(p.dtype))
        if tied:
            params["unembed.W_U"].copy_(params["embed.W_E"].T)
    return clone


def _matrix(name: str, w: Tensor) -> tuple[Tensor, Callable[[Tensor], Tensor]]:
    """The 2-D matrix a weight acts as, and the map back to its stored layout.

    TL 4 bridges store ``nn.Linear`` weights ``[out, in]``; TL 3 stores ``[in, out]`` and keeps attention per head:
    W_Q/W_K/W_V ``[h, d_model, d_head]``, W_O ``[h, d_head, d_model]``, whose matrices are ``d (h e)`` and ``(h e) d``.
    """
    if w.ndim == 2:
        return w, lambda m: m
    if w.ndim != 3:
        raise LensBiasError(f"{name}: don't know the matrix layout of a {w.ndim}-D weight")
    h = w.shape[0]
    if name.endswith("W_O"):
        return rearrange(w, "h e d -> (h e) d"), lambda m: rearrange(m, "(h e) d -> h e d", h=h)
    return rearrange(w, "h d e -> d (h e)"), lambda m: rearrange(m, "d (h e) -> h d e", h=h)


def relative_change(base: Any, other: Any) -> float:
    """‖θ − θ_base‖ / ‖θ_base‖ over all weight matrices: how far a model moved from the base."""
    a, b = _weight_matrices(parameters(base), blocks_only=False), parameters(other)
    num = sum(float((b[n].detach().float() - p.detach().float()).pow(2).sum()) for n, p in a.items())
    den = sum(float(p.detach().float().pow(2).sum()) for p in a.values())
    return math.sqrt(num / den)


# ---- descendants ------------------------------------------------------------------------------------------------


def quantize(model: Any, bits: int = 8, group_size: int = 32) -> Any:
    """Round-trip symmetric absmax quantisation of every weight matrix (embeddings included), back to float.

    Per group of ``group_size`` consecutive entries along the last axis (a shorter last group when the axis is not
    a multiple): scale = max|w| / (2^(bits−1) − 1), w ← round(w / scale)·scale, so |Δw| ≤ scale / 2.

    Args:
        model: a TransformerLens model (not modified).
        bits: 2 to 8 (levels −(2^(bits−1) − 1) … 2^(bits−1) − 1: int8 ±127, 4-bit ±7).
        group_size: entries sharing one scale (GGUF blocks are 32).

    Returns:
        The quantised copy.
    """
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 8:
        raise LensBiasError(f"bits must be an int from 2 to 8, got {bits!r}")
    if group_size < 1:
        raise LensBiasError(f"group_size must be >= 1, got {group_size}")
    levels = 2 ** (bits - 1) - 1

    def round_trip(name: str, w: Tensor) -> Tensor:
        rows = w.reshape(-1, w.shape[-1])
        cols = rows.shape[1]
        size = min(group_size, cols)  # a group longer than the axis is the whole row: no padding to its length
        groups = F.pad(rows, (0, (-cols) % size)).view(rows.shape[0], -1, size)  # zero padding: absmax unchanged
        scale = groups.abs().amax(-1, keepdim=True) / levels
        q = torch.round(groups / torch.where(scale > 0, scale, 1.0)).clamp(-levels, levels)
        return (q * scale).view(rows.shape[0], -1)[:, :cols].reshape(w.shape)

    return _transformed(model, round_trip, blocks_only=False)


def prune(model: Any, fraction: float = 0.3) -> Any:
    """Magnitude pruning: in every weight matrix of the blocks, the ``round(fraction · size)`` smallest |w| become 0.

    Args:
        model: a TransformerLens model (not modified).
        fraction: share of each matrix zeroed, in [0, 1).

    Returns:
        The pruned copy.
    """
    if not 0 <= fraction < 1:
        raise LensBiasError(f"fraction must be in [0, 1), got {fraction}")

    def zero_smallest(name: str, w: Tensor) -> Tensor:
        flat = w.flatten().clone()
        flat[torch.topk(flat.abs(), round(fraction * flat.numel()), largest=False).indices] = 0.0
        return flat.view(w.shape)

    return _transformed(model, zero_smallest, blocks_only=True)


def merge(a: Any, b: Any, weight: float = 0.5) -> Any:
    """The weight average ``(1 − weight)·a + weight·b`` of every parameter (norm gains included).

    Args:
        a: a TransformerLens model (copied; not modified).
        b: a model of the same architecture (same parameter names and shapes).
        weight: b's share, in [0, 1].

    Returns:
        The merged copy of ``a``.
    """
    if not 0 <= weight <= 1:
        raise LensBiasError(f"weight must be in [0, 1], got {weight}")
    clone = copy_model(a)
    mine, theirs = parameters(clone), parameters(b)
    shapes = {n: tuple(p.shape) for n, p in mine.items()}
    if shapes != {n: tuple(p.shape) for n, p in theirs.items()}:
        raise LensBiasError("merge needs two models of one architecture (the same parameter names and shapes); got different ones")
    with torch.no_grad():
        for name, p in mine.items():
            p.copy_((p.float() * (1 - weight) + theirs[name].detach().float() * weight).to(p.dtype))
    return clone


def low_rank_delta(model: Any, rank: int = 8, scale: float = 0.05, seed: int = 0) -> Any:
    """A LoRA-style descendant: ``W + B·A`` on every attention and MLP matrix, with ‖B·A‖_F = scale·‖W‖_F.

    ``A`` [rank, in] and ``B`` [out, rank] are N(0, 1) from a generator seeded with ``seed`` (a trained adapter's
    directions are as unrelated to the base's init as random ones), in the order of the model's state_dict.

    Args:
        model: a TransformerLens model (not modified).
        rank: the adapter's rank r (the change to each matrix has rank ≤ r).
        scale: relative Frobenius norm of the change, per matrix.
        seed: the adapter's seed.

    Returns:
        The adapted copy.
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise LensBiasError(f"rank must be a positive int, got {rank!r}")
    if not scale > 0:
        raise LensBiasError(f"scale must be > 0, got {scale}")
    generator = torch.Generator().manual_seed(seed)

    def add_delta(name: str, w: Tensor) -> Tensor:
        matrix, back = _matrix(name, w)
        if rank > min(matrix.shape):
            raise LensBiasError(f"rank {rank} exceeds the {tuple(matrix.shape)} matrix {name}; pass rank <= {min(matrix.shape)}")
        a = torch.randn(rank, matrix.shape[1], generator=generator)
        b = torch.randn(matrix.shape[0], rank, generator=generator)
        delta = b @ a
        return back(matrix + delta * (scale * matrix.norm() / delta.norm()))

    return _transformed(model, add_delta, blocks_only=True)


def random_inits(model: Any, seeds: Iterable[int], *, init_std: float = 0.02) -> Iterator[Any]:
    """Fresh random inits of ``model``'s configuration, one per seed: matrices N(0, init_std), norm gains 1, biases 0.

    One copy of ``model`` is re-drawn in place for every seed (building a 100M-parameter model costs more than
    drawing its weights), so each yielded model is the same object: use it before advancing. Every parameter is
    re-drawn from a local ``torch.Generator(seed)``; buffers (rotary tables, masks) are the configuration's. Tied
    embeddings stay tied.

    Args:
        model: a TransformerLens model (not modified).
        seeds: init seeds.
        init_std: std of the matrices (Hugging Face's initializer_range, 0.02 for LLaMA-family configs).

    Yields:
        The re-drawn copy, once per seed.
    """
    fresh = mark(copy_model(model), regime="init")  # no longer the recorded (spec, source) model
    params = parameters(fresh)
    tied = hooked_tie(params)
    drawn = [(name, p) for name, p in params.items() if not (tied and name == "unembed.W_U")]
    for seed in seeds:
        init_parameters(drawn, seed=seed, std=init_std)
        if tied:
            with torch.no_grad():
                params["unembed.W_U"].copy_(params["embed.W_E"].T)
        yield fresh
