"""Model transforms: descendants of a model made on the spot (what SeedPrint must still recognise), and fresh
random inits of its configuration (what it must not).

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
- :func:`permute_residual`: the residual stream's dimensions permuted consistently through every weight that reads
  or writes it (norm gains included): the same function in another basis.
- :func:`rotate_residual`: the residual stream multiplied by a random orthogonal matrix, after folding every
  RMSNorm gain into the matrices that read the normalised stream (the unembedding untied where it was tied), as
  rotation-based quantisation (QuaRot, SpinQuant) does: the same function in a rotated basis.
- :func:`rename_vocabulary`: the vocabulary renamed, rows of the embedding and the unembedding permuted by one
  permutation (the tokenizer renamed alike): the same function on text, other answers to the same token IDs.
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

import copy
import math
from typing import Any, Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from lens_bias.core.errors import LensBiasError
from lens_bias.models.architectures.base import init_parameters, is_bias
from lens_bias.models.init import mark

__all__ = ["quantize", "prune", "merge", "low_rank_delta", "permute_residual", "rotate_residual", "rename_vocabulary", "random_inits", "relative_change", "copy_model"]


# ---- weights, generically --------------------------------------------------------------------------------------


def copy_model(model: Any) -> Any:
    """A deep copy sharing the tokenizer (read-only here, and slower to copy than it is worth)."""
    tokenizer = getattr(model, "tokenizer", None)
    return copy.deepcopy(model, {id(tokenizer): tokenizer} if tokenizer is not None else {})


def _parameters(model: Any) -> dict[str, torch.nn.Parameter]:
    """Parameters under their state_dict names (TL names on both backends), each tensor once (a tied pair once)."""
    seen: set[int] = set()
    out = {}
    for name, value in model.state_dict(keep_vars=True).items():
        if isinstance(value, torch.nn.Parameter) and id(value) not in seen:  # buffers (rotary tables, masks) stay
            seen.add(id(value))
            out[name] = value
    return out


def _weight_matrices(params: dict[str, torch.nn.Parameter], *, blocks_only: bool) -> dict[str, torch.nn.Parameter]:
    """The ≥2-D weights (not TL 3's 2-D per-head biases), optionally only those inside the transformer blocks."""
    return {n: p for n, p in params.items() if p.ndim >= 2 and not is_bias(n) and (not blocks_only or n.startswith("blocks."))}


def _hooked_tie(params: dict[str, torch.nn.Parameter]) -> bool:
    """A HookedTransformer converted from a tied model holds ``W_U`` as a separate copy of ``W_Eᵀ``."""
    w_e, w_u = params.get("embed.W_E"), params.get("unembed.W_U")
    return w_e is not None and w_u is not None and w_u.shape == w_e.shape[::-1] and torch.equal(w_u, w_e.T)


def _transformed(model: Any, fn: Callable[[str, Tensor], Tensor], *, blocks_only: bool) -> Any:
    """A copy of ``model`` with ``fn(name, weight)`` (computed in float32) applied to every weight matrix."""
    clone = copy_model(model)
    params = _parameters(clone)
    tied = _hooked_tie(params)
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
    a, b = _weight_matrices(_parameters(base), blocks_only=False), _parameters(other)
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
    mine, theirs = _parameters(clone), _parameters(b)
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


# ---- reparametrisations of the residual basis -------------------------------------------------------------------
#
# With the residual stream x replaced by R·x (R orthogonal), a model computes the same function when every weight
# that reads the (normalised) stream takes Rᵀ on its input side and every weight that writes it takes R on its
# output side. RMSNorm without a gain commutes with R (‖R·x‖ = ‖x‖), so the gains are folded into the readers first
# (W ← W·diag(g), g ← 1); a permutation commutes with the gains themselves, which are permuted instead. Each
# parameter's role is read from its name, in the layout of a TL 4 bridge of a Hugging Face LLaMA-family model
# (``nn.Linear`` weights ``[out, in]``) or of a TL 3 ``HookedTransformer`` (row convention, per-head attention).

# name suffix -> (role, the norm whose gain it reads): "read" weights read the normalised stream, "write" ones add to it
_BRIDGE_ROLES = {"attn.q.weight": ("read", "ln1"), "attn.k.weight": ("read", "ln1"), "attn.v.weight": ("read", "ln1"),
                 "mlp.gate.weight": ("read", "ln2"), "mlp.in.weight": ("read", "ln2"), "attn.o.weight": ("write", None),
                 "mlp.out.weight": ("write", None), "attn.o.bias": ("write", None), "mlp.out.bias": ("write", None)}
_HOOKED_ROLES = {"attn.W_Q": ("read", "ln1"), "attn.W_K": ("read", "ln1"), "attn.W_V": ("read", "ln1"), "mlp.W_gate": ("read", "ln2"),
                 "mlp.W_in": ("read", "ln2"), "attn.W_O": ("write", None), "mlp.W_out": ("write", None), "attn.b_O": ("write", None),
                 "mlp.b_out": ("write", None)}
# parameters the residual basis does not touch (head-space and MLP-space biases, the unembedding's bias)
_UNTOUCHED = ("attn.q.bias", "attn.k.bias", "attn.v.bias", "attn.b_Q", "attn.b_K", "attn.b_V", "mlp.b_in", "mlp.gate.bias", "mlp.in.bias",
              "unembed.bias", "unembed.b_U", "attn.q_norm.weight", "attn.k_norm.weight")  # QK norms act per head
# Gemma's norms on each sub-layer's output, before it is added: their gains act on the residual's coordinates
_POST_GAINS = ("ln1_post.weight", "ln2_post.weight")


def _role(name: str) -> tuple[str, str | None]:
    """What a parameter does with the residual stream: (role, norm whose gain it reads)."""
    leaf = name
    if name.startswith("blocks."):  # "blocks.3.attn._W_K" -> "attn.W_K" (TL 3 keeps grouped-query K/V as _W_K, _W_V)
        module, _, last = name.split(".", 2)[2].rpartition(".")
        leaf = f"{module}.{last.lstrip('_')}" if module else last
    if leaf in _UNTOUCHED:
        return "none", None
    if name.startswith("blocks."):
        for table in (_BRIDGE_ROLES, _HOOKED_ROLES):
            if leaf in table:
                return table[leaf]
        if leaf in ("ln1.weight", "ln2.weight", "ln1.w", "ln2.w"):
            return "gain", None
        if leaf in _POST_GAINS:
            return "post_gain", None
    if name in ("embed.weight", "embed.W_E"):
        return "embed", None
    if name in ("unembed.weight", "unembed.W_U"):
        return "unembed", "ln_final"
    if name in ("ln_final.weight", "ln_final.w"):
        return "gain", None
    raise LensBiasError(
        f"cannot reparametrise the residual basis through {name!r}: lens_bias knows the roles of LLaMA-family (RMSNorm, no "
        "biases on the residual's norms) weights on a TL 4 bridge or a TL 3 HookedTransformer"
    )


def _gain_name(name: str, norm: str) -> str:
    layer = name.split(".")[1]
    return f"blocks.{layer}.{norm}" if norm != "ln_final" else "ln_final"


def _change_basis(model: Any, basis: Tensor, *, fold: bool) -> Any:
    """A copy of ``model`` whose residual stream is ``basis @ x`` (``basis`` orthogonal [d_model, d_model])."""
    info = getattr(model, "cfg", None)
    if getattr(info, "normalization_type", "RMS") not in ("RMS", "RMSPre", None) or getattr(model.cfg, "positional_embedding_type", "rotary") == "standard":
        raise LensBiasError("reparametrising the residual basis needs a LLaMA-family model: RMSNorm, rotary positions (LayerNorm's mean does not commute with a rotation)")
    clone = copy_model(model)
    params = _parameters(clone)
    hooked = "embed.W_E" in params
    tied = not hooked and "unembed.weight" not in params  # a bridge of a tied model shares embed.weight with the unembedding
    gains = {n.rsplit(".", 1)[0]: p.detach().float().clone() for n, p in params.items() if _role(n)[0] == "gain"}
    r = basis.float()
    new: dict[str, Tensor] = {}
    for name, p in params.items():
        role, norm = _role(name)
        w = p.detach().float()
        g = gains[_gain_name(name, norm)] if norm is not None and fold else None
        if role == "post_gain" and fold:
            raise LensBiasError("a rotation of the residual basis cannot be folded into post-sub-layer norms (Gemma's): their gains act on "
                                "the residual's coordinates after normalising, with no matrix after them; permute_residual keeps the function")
        if role == "gain" or role == "post_gain":
            new[name] = torch.ones_like(w) if fold else r @ w
        elif role == "embed":
            new[name] = w @ r.T  # rows are embedding vectors: e ← R·e
        elif role == "read" and hooked:  # [.., d, out] (row convention; W_Q/W_K/W_V per head [h, d, e])
            m = r * g[None, :] if g is not None else r
            new[name] = torch.einsum("kd,...do->...ko", m, w)
        elif role == "read":  # nn.Linear [out, d]
            new[name] = (w * g[None, :] if g is not None else w) @ r.T
        elif role == "write" and hooked:  # [..., d] outputs (W_O [h, e, d], W_out [m, d], b_O, b_out [d])
            new[name] = w @ r.T
        elif role == "write":  # nn.Linear [d, in] and its bias [d]
            new[name] = r @ w
        elif role == "unembed" and hooked:  # W_U [d, V]: logits = n_fᵀ·diag(g)·W_U
            new[name] = (r * gains["ln_final"][None, :] if fold else r) @ w
        elif role == "unembed":  # [V, d]
            new[name] = (w * gains["ln_final"][None, :] if fold else w) @ r.T
    with torch.no_grad():
        for name, value in new.items():
            params[name].copy_(value.to(params[name].dtype))
        if tied and fold:  # the unembedding now differs from the embedding: give it its own weight
            embed = params["embed.weight"].detach().float()
            untied = (embed @ r) * gains["ln_final"][None, :] @ r.T  # the original E (= new E·R), gain folded, rotated
            hf = clone.original_model
            hf.get_output_embeddings().weight = torch.nn.Parameter(untied.to(params["embed.weight"].dtype))
            hf.config.tie_word_embeddings = False
    return clone


def _orthogonal(d: int, seed: int) -> Tensor:
    """A Haar-random orthogonal [d, d] matrix from a local generator (QR of a Gaussian, signs fixed)."""
    g = torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    return (q * torch.sign(torch.diagonal(r))[None, :]).float()


def permute_residual(model: Any, seed: int = 0) -> Any:
    """The same function with its residual dimensions permuted (a random permutation from ``seed``).

    Every weight that reads or writes the residual stream, the embedding, the unembedding and the norm gains are
    permuted alike, so the logits are unchanged (to float32 rounding) and SeedPrint's dimension-by-dimension
    comparison sees unrelated columns unless it aligns first (``lineage_test(..., align="permutation")``).

    Args:
        model: a LLaMA-family TransformerLens model (not modified).
        seed: seed of the permutation.

    Returns:
        The permuted copy; ``model.lens_bias_basis`` records the permutation (new dim i holds old dim perm[i]).
    """
    d = int(model.cfg.d_model)
    perm = torch.randperm(d, generator=torch.Generator().manual_seed(seed))
    basis = torch.zeros(d, d)
    basis[torch.arange(d), perm] = 1.0  # (basis @ x)[i] = x[perm[i]]
    clone = _change_basis(model, basis, fold=False)
    clone.lens_bias_basis = perm
    return clone


def rename_vocabulary(model: Any, seed: int = 0) -> Any:
    """The same function under renamed token IDs: token ``i`` of ``model`` is token ``perm[i]`` of the copy.

    The embedding's rows and the unembedding's rows (its columns in TL 3's ``W_U``, and its bias) are permuted by
    one permutation, so the copy on ``perm[tokens]`` gives ``model``'s logits on ``tokens`` with their last axis
    permuted alike: a tokenizer renamed the same way makes it the same model on text. Token IDs drawn at random
    now reach other embeddings, which is what SeedPrint's token inputs see.

    >>> import lens_bias
    >>> model = lens_bias.random_init("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=50, n_ctx=8)
    >>> renamed = rename_vocabulary(model, seed=1)
    >>> tokens = torch.tensor([[3, 1, 4, 1, 5]])
    >>> perm = renamed.lens_bias_vocabulary
    >>> torch.allclose(renamed(perm[tokens])[..., perm], model(tokens), atol=1e-6)  # equal up to the order of float sums
    True

    Args:
        model: a TransformerLens model (not modified).
        seed: seed of the permutation.

    Returns:
        The renamed copy; ``model.lens_bias_vocabulary`` records the permutation.
    """
    clone = copy_model(model)
    params = _parameters(clone)
    vocab = int(model.cfg.d_vocab)
    perm = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))
    rows = {"embed.weight", "embed.W_E", "unembed.weight", "unembed.b_U", "unembed.bias"}  # vocabulary on axis 0
    if not {"embed.weight", "embed.W_E"} & set(params):
        raise LensBiasError("rename_vocabulary needs a token embedding (embed.weight or embed.W_E)")
    with torch.no_grad():
        for name, p in params.items():
            if name in rows or name == "unembed.W_U":
                axis = 1 if name == "unembed.W_U" else 0
                moved = torch.empty_like(p)
                moved.index_copy_(axis, perm.to(p.device), p.detach())  # new position perm[i] holds old row i
                p.copy_(moved)
    clone.lens_bias_vocabulary = perm
    return clone


def rotate_residual(model: Any, seed: int = 0) -> Any:
    """The same function in a rotated residual basis, as rotation-based quantisation (QuaRot, SpinQuant) ships it.

    Every RMSNorm gain is folded into the matrices that read the normalised stream (W ← W·diag(g), g ← 1; a tied
    unembedding gets its own weight, since the final gain folds into it alone), then the residual stream becomes
    Q·x for a Haar-random orthogonal Q from ``seed``: readers take Qᵀ, writers Q, the embedding Q. The logits are
    unchanged to float32 rounding.

    Args:
        model: a LLaMA-family TransformerLens model (not modified).
        seed: seed of the rotation.

    Returns:
        The rotated copy; ``model.lens_bias_basis`` records Q.
    """
    q = _orthogonal(int(model.cfg.d_model), seed)
    clone = _change_basis(model, q, fold=True)
    clone.lens_bias_basis = q
    return clone


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
    params = _parameters(fresh)
    tied = _hooked_tie(params)
    drawn = [(name, p) for name, p in params.items() if not (tied and name == "unembed.W_U")]
    for seed in seeds:
        init_parameters(drawn, seed=seed, std=init_std)
        if tied:
            with torch.no_grad():
                params["unembed.W_U"].copy_(params["embed.W_E"].T)
        yield fresh
