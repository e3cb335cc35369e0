"""Function-preserving reparametrisations: the same model in another residual basis, or under renamed token IDs
(what a descendant can be disguised by, and what SeedPrint's alignments must see through).

Every function takes any TransformerLens model (a TL 4 bridge or a TL 3 ``HookedTransformer``), returns a new
model and leaves its input bit for bit as it was:

- :func:`permute_residual`: the residual stream's dimensions permuted consistently through every weight that reads
  or writes it (norm gains included): the same function in another basis.
- :func:`rotate_residual`: the residual stream multiplied by a random orthogonal matrix, after folding every
  RMSNorm gain into the matrices that read the normalised stream (the unembedding untied where it was tied), as
  rotation-based quantisation (QuaRot, SpinQuant) does: the same function in a rotated basis.
- :func:`scale_residual`: the residual stream multiplied by one factor (the embedding and every weight that writes
  the stream scaled alike): the same function under RMSNorm, which divides the factor out before every reader.
- :func:`rename_vocabulary`: the vocabulary renamed, rows of the embedding and the unembedding permuted by one
  permutation (the tokenizer renamed alike): the same function on text, other answers to the same token IDs.

>>> import lens_bias, torch
>>> model = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> tokens = lens_bias.random_tokens(2, 8, 500)
>>> torch.allclose(model(tokens), rotate_residual(model, seed=1)(tokens), atol=1e-4)
True
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lens_bias.core.errors import LensBiasError
from lens_bias.models.parameters import copy_model, parameters, vocabulary_axis

__all__ = ["permute_residual", "rotate_residual", "scale_residual", "rename_vocabulary"]


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


def residual_role(name: str) -> tuple[str, str | None]:
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
    params = parameters(clone)
    hooked = "embed.W_E" in params
    tied = not hooked and "unembed.weight" not in params  # a bridge of a tied model shares embed.weight with the unembedding
    gains = {n.rsplit(".", 1)[0]: p.detach().float().clone() for n, p in params.items() if residual_role(n)[0] == "gain"}
    r = basis.float()
    new: dict[str, Tensor] = {}
    for name, p in params.items():
        role, norm = residual_role(name)
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
            _untie(clone, untied.to(params["embed.weight"].dtype))
    return clone


def _untie(bridge: Any, unembedding: Tensor) -> None:
    """Give a bridge of a tied Hugging Face model its own unembedding weight (the embedding keeps the shared one)."""
    hf = bridge.original_model
    hf.get_output_embeddings().weight = torch.nn.Parameter(unembedding)
    hf.config.tie_word_embeddings = False


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
    params = parameters(clone)
    embedding = next((params[name] for name in ("embed.weight", "embed.W_E") if name in params), None)
    if embedding is None:
        raise LensBiasError("rename_vocabulary needs a token embedding (embed.weight or embed.W_E)")
    # the table's rows, not cfg.d_vocab: a vocabulary grown by resize_token_embeddings can keep the old count in cfg
    perm = torch.randperm(embedding.shape[0], generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for name, p in params.items():
            axis = vocabulary_axis(name)
            if axis is not None:
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


def scale_residual(model: Any, factor: float = 4.0) -> Any:
    """The same function with its residual stream multiplied by ``factor``.

    The embedding and every weight that writes the stream (attention and MLP outputs, their biases) are multiplied
    by ``factor``; every reader sits behind an RMSNorm, which divides the factor out, so the logits are unchanged up
    to the norms' epsilon (a tied unembedding gets its own, unscaled weight). Every embedding row's norm moves by one
    factor, which is what a lineage test that reads norms must see through.

    >>> import lens_bias
    >>> model = lens_bias.random_init("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=50, n_ctx=8)
    >>> tokens = lens_bias.random_tokens(2, 8, 50)
    >>> logits, scaled = model(tokens), scale_residual(model, 4.0)(tokens)
    >>> bool((scaled - logits).abs().max() < 0.01 * logits.abs().max())  # RMSNorm's epsilon is not scaled
    True

    Args:
        model: a LLaMA-family TransformerLens model without norms on its sub-layers' outputs (not modified).
        factor: the positive factor.

    Returns:
        The scaled copy; ``model.lens_bias_scale`` records the factor.
    """
    if not factor > 0:
        raise LensBiasError(f"scale_residual takes a positive factor (got {factor}): a negative one flips the stream, which is a basis change")
    info = getattr(model, "cfg", None)
    if getattr(info, "normalization_type", "RMS") not in ("RMS", "RMSPre", None):
        raise LensBiasError("scale_residual needs a model whose norms are RMSNorms (LayerNorm's bias does not scale with the stream)")
    clone = copy_model(model)
    params = parameters(clone)
    tied = "embed.weight" in params and "unembed.weight" not in params  # a bridge of a tied model shares embed.weight with the unembedding
    roles = {name: residual_role(name)[0] for name in params}
    if "post_gain" in roles.values():
        raise LensBiasError("scale_residual cannot scale through post-sub-layer norms (Gemma's): their output's size is set by their "
                            "gain alone; rotate_residual and permute_residual keep such models' function")
    with torch.no_grad():
        if tied:  # the unembedding keeps the unscaled table
            _untie(clone, params["embed.weight"].detach().clone())
        for name, p in params.items():
            if roles[name] in ("embed", "write"):
                p.mul_(factor)
    clone.lens_bias_scale = float(factor)
    return clone
