"""SeedPrint against real descendants: LeaFBench in miniature, on CPU.

LeaFBench (SeedPrints paper) fingerprints each base model's descendants — fine-tunes, merges, adapters,
quantisations — and unrelated models, and reports the AUC of the lineage score. Here the descendants are made
on the spot from any TransformerLens model (a TL 4 bridge or a TL 3 ``HookedTransformer``); every function
returns a new model and leaves its input bit for bit as it was:

- :func:`quantize`: round-trip symmetric absmax quantisation per group of ``group_size`` entries along each
  weight's last stored axis (on a bridge the input axis of each ``nn.Linear`` weight, like GGUF's Q8_0 / Q4_0
  blocks), dequantised back to float. Every element moves by at most half a quantisation step of its group.
- :func:`prune`: magnitude pruning, the smallest ``fraction`` of each block weight matrix set to zero (the
  embeddings are kept, as Wanda and SparseGPT keep them).
- :func:`merge`: the weight average ``(1 − weight)·a + weight·b`` of two models of one architecture.
- :func:`low_rank_delta`: a LoRA-style ``W + B·A`` on every attention and MLP matrix, ``A``, ``B`` of rank r drawn
  from a seeded generator and scaled to a relative Frobenius norm.
- :func:`fine_tune`: a short fine-tune with :func:`lens_bias.train.train` on the standard library's code, packed
  with the model's own tokenizer (``model.tokenizer``).
- :func:`random_inits`: fresh random inits of the same configuration (Hugging Face defaults: N(0, 0.02) matrices,
  unit norm gains, zero biases), one model object re-drawn in place per seed.

:func:`real_descendants` fingerprints a base model and all of them (token inputs, analytic null) and tabulates
τ̄, k, p and the verdict per pair, with the AUC of related vs unrelated pairs. Tied embeddings stay tied: a
bridge shares one parameter; in a HookedTransformer, which keeps ``W_U`` as its own parameter, a ``W_U`` equal to
``W_Eᵀ`` is rewritten from the transformed ``W_E`` (only :func:`fine_tune` lets them drift apart there, since
training updates them separately).

>>> import lens_bias
>>> model = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> lens_bias.compare(model, quantize(model, bits=4), n=64, seq_len=8, m=32, progress=False).log10_p < -10
True
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from einops import rearrange
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from . import seedprint
from .data import TokenData, code
from .errors import LensBiasError
from .experiments.tables import markdown_table
from .train import TrainingRun, evaluate, train

__all__ = [
    "quantize", "prune", "merge", "low_rank_delta", "fine_tune", "random_inits", "auc", "DescendantsConfig", "DescendantsResult", "PRESETS",
    "real_descendants",
]

logger = logging.getLogger(__name__)

# The verdict's level, and the bar a descendant must clear (LeaFBench-style "overwhelmingly related").
ALPHA = 0.01
STRONG = 1e-10
# What lens_bias records on the models it builds or loads; a re-drawn init is neither, so it drops them.
_RECORDS = ("lens_bias_spec", "lens_bias_source")


# ---- weights, generically --------------------------------------------------------------------------------------


def _copy(model: Any) -> Any:
    """A deep copy sharing the tokenizer (read-only here, and slower to copy than it is worth)."""
    tokenizer = getattr(model, "tokenizer", None)
    return copy.deepcopy(model, {id(tokenizer): tokenizer} if tokenizer is not None else {})


def _is_bias(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1].lstrip("_")  # TL 3 GQA keeps "_b_K"; its per-head biases are 2-D
    return leaf in ("bias", "b") or leaf.startswith("b_")


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
    return {n: p for n, p in params.items() if p.ndim >= 2 and not _is_bias(n) and (not blocks_only or n.startswith("blocks."))}


def _hooked_tie(params: dict[str, torch.nn.Parameter]) -> bool:
    """A HookedTransformer converted from a tied model holds ``W_U`` as a separate copy of ``W_Eᵀ``."""
    w_e, w_u = params.get("embed.W_E"), params.get("unembed.W_U")
    return w_e is not None and w_u is not None and w_u.shape == w_e.shape[::-1] and torch.equal(w_u, w_e.T)


def _transformed(model: Any, fn: Callable[[str, Tensor], Tensor], *, blocks_only: bool) -> Any:
    """A copy of ``model`` with ``fn(name, weight)`` (computed in float32) applied to every weight matrix."""
    clone = _copy(model)
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


def _relative_change(base: Any, other: Any) -> float:
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
        groups = F.pad(rows, (0, (-cols) % group_size)).view(rows.shape[0], -1, group_size)  # zero padding: absmax unchanged
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
    clone = _copy(a)
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
        a = torch.randn(rank, matrix.shape[1], generator=generator)
        b = torch.randn(matrix.shape[0], rank, generator=generator)
        delta = b @ a
        return back(matrix + delta * (scale * matrix.norm() / delta.norm()))

    return _transformed(model, add_delta, blocks_only=True)


def fine_tune(
    model: Any,
    steps: int = 40,
    *,
    data: TokenData | None = None,
    lr: float = 1e-4,
    batch_size: int = 4,
    seq_len: int = 64,
    weight_decay: float = 0.0,
    data_seed: int = 42,
    eval_blocks: int = 16,
    progress: bool = True,
) -> tuple[Any, TrainingRun]:
    """A short full fine-tune of a copy of ``model`` on the standard library's code (:func:`lens_bias.data.code`).

    Args:
        model: a TransformerLens model with ``model.tokenizer`` (e.g. from ``lens_bias.models.pretrained``); not
            modified.
        steps: optimizer steps (AdamW, 10% warmup, cosine).
        data: packed blocks to train on instead (default: the code corpus packed with ``model.tokenizer``,
            ``seq_len`` tokens per block; the held-out split is never trained on).
        lr: peak learning rate; a fine-tune's, well below pretraining's.
        batch_size: sequences per step.
        seq_len: tokens per training sequence when ``data`` is built here.
        weight_decay: AdamW weight decay on matrices.
        data_seed: the data order.
        eval_blocks: held-out blocks of the one evaluation at the end.
        progress: a progress bar over steps.

    Returns:
        ``(fine-tuned copy, its TrainingRun)``. On a TL 3 HookedTransformer a tied ``W_U`` trains as its own
        parameter, so the copy's embedding and unembedding drift apart by the fine-tune's updates.
    """
    if data is None:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise LensBiasError("fine_tune packs the code corpus with model.tokenizer, and this model has none: set model.tokenizer, or pass data=TokenData.build(...)")
        data = TokenData.build(code(), seq_len=seq_len, tokenizer_from=tokenizer)
    tuned = _copy(model)
    run = train(tuned, data, steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay, data_seed=data_seed, eval_every=steps, eval_blocks=eval_blocks, progress=progress)
    return tuned, run


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
    fresh = _copy(model)
    for name in _RECORDS:
        if hasattr(fresh, name):
            delattr(fresh, name)  # no longer the recorded model
    params = _parameters(fresh)
    tied = _hooked_tie(params)
    for seed in seeds:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in params.items():
                if tied and name == "unembed.W_U":
                    continue
                if _is_bias(name):
                    p.zero_()
                elif p.ndim == 1:
                    p.fill_(1.0)
                else:  # drawn on CPU in float32: the same values on every device and dtype
                    p.copy_(torch.empty(p.shape).normal_(0.0, init_std, generator=generator))
            if tied:
                params["unembed.W_U"].copy_(params["embed.W_E"].T)
        yield fresh


# ---- the experiment ---------------------------------------------------------------------------------------------


def auc(scores: Union[Float[Tensor, "n"], Sequence[float]], labels: Sequence[bool]) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting one half (exact)."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        raise LensBiasError(f"the AUC needs both labels; got {len(pos)} positives and {len(neg)} negatives")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


@dataclass(frozen=True)
class DescendantsConfig:
    """Sizes of the experiment; ``PRESETS`` holds the tested ones."""

    # Fingerprint inputs. On SmolLM2 the weakest descendant (prune 30%) sits at z ≈ 120 with 128 inputs and 180 with
    # 256; the cost is linear in n · seq_len.
    n: int = 128
    seq_len: int = 32  # tokens per input (the papers use 1024)
    seed: int = 42  # the inputs' seed, the papers'
    # Identity dims m = ⌊ratio_k·D⌋, as the papers' 160M toys (m 400 of D 768). Their large-model 0.1 leaves
    # unrelated models ~m²/D ≈ 5 shared dims at D 576, where the analytic null ran wide on SmolLM2 (z sd 1.5 over 10
    # random inits, one at p = 0.001); at 0.5 the z's of 55 unrelated pairs had sd 0.95–1.05.
    ratio_k: float = 0.5
    group_size: int = 32  # quantisation block, GGUF's Q8_0 / Q4_0
    prune_fraction: float = 0.3
    lora_rank: int = 8
    lora_scale: float = 0.05  # ‖ΔW‖_F / ‖W‖_F per matrix: a large adapter (the 40-step fine-tune moves θ by 0.3%)
    lora_seed: int = 0
    finetune_steps: int = 40  # ~2.5 s a step for SmolLM2 on 2 cores; held-out code loss 2.83 -> 2.57 nats
    finetune_lr: float = 1e-4  # a full fine-tune's rate at 135M, well below pretraining's
    finetune_batch: int = 4
    finetune_seq_len: int = 64
    merge_weight: float = 0.5  # base and fine-tune averaged
    n_random: int = 10  # random inits of the config: the unrelated side of the AUC
    first_random_seed: int = 1_000_000  # as the seeds null's: clear of the small seeds lens_bias models are built with
    eval_blocks: int = 16  # held-out code blocks for each descendant's loss (a check that it still is a model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PRESETS = {
    "default": DescendantsConfig(),
    # For tests on tiny random models: minutes become seconds, every code path still runs.
    "tiny": DescendantsConfig(n=128, seq_len=8, finetune_steps=4, finetune_batch=4, finetune_seq_len=16, n_random=3, eval_blocks=4),
}


@dataclass
class DescendantsResult:
    """One row per pair (the base against each descendant and each random init), and the AUC over them."""

    table: pd.DataFrame  # pair, target, related, tau_bar, k, z, p, log10_p, verdict, expected, ok, weight_change, eval_loss
    auc_log10_p: float  # score −log10 p, labels related / unrelated
    auc_tau: float  # score τ̄
    base_eval_loss: float  # held-out code loss of the base (nats)
    fingerprints: dict[str, seedprint.Fingerprint]  # "base" and every target: re-test with another m or null
    config: dict[str, Any]
    seconds: float

    @property
    def all_as_expected(self) -> bool:
        return bool(self.table.ok.all())

    def to_pandas(self) -> pd.DataFrame:
        return self.table.copy()

    def markdown(self) -> str:
        """The table as markdown, the AUCs below it."""
        t = self.table
        shown = pd.DataFrame({
            "pair": t.pair, "τ̄": t.tau_bar, "k": t.k, "log10 p": t.log10_p, "verdict": [v + ("" if ok else " ✗") for v, ok in zip(t.verdict, t.ok)],
            "expected": t.expected, "‖Δθ‖/‖θ‖": t.weight_change, "code loss": ["" if math.isnan(v) else f"{v:.3f}" for v in t.eval_loss],
        })
        tail = f"AUC (score −log10 p) = {self.auc_log10_p:.4f}; AUC (score τ̄) = {self.auc_tau:.4f}; base code loss {self.base_eval_loss:.3f} nats"
        return markdown_table(shown, formats={"τ̄": ".4f", "log10 p": ".1f", "‖Δθ‖/‖θ‖": ".3g"}) + "\n\n" + tail + "\n"


def real_descendants(
    model: Any,
    config: Union[str, DescendantsConfig] = "default",
    *,
    data: TokenData | None = None,
    progress: bool = True,
    **overrides: Any,
) -> DescendantsResult:
    """Fingerprint ``model`` and its descendants (int8, 4-bit, pruned, LoRA delta, fine-tune, merge) and random inits.

    Every descendant is expected related at p < 1e-10 and every random init unrelated (p ≥ 0.01), under the
    analytic null with token inputs (IDs uniform below d_vocab, N ≪ V/4) and m = ⌊ratio_k·D⌋ identity dims
    (D/2 by default: see :class:`DescendantsConfig`).

    Args:
        model: the base, a TransformerLens model with ``model.tokenizer`` (or pass ``data``); not modified.
        config: a preset name ("default", "tiny") or a :class:`DescendantsConfig`.
        data: fine-tuning blocks (default: the code corpus packed with ``model.tokenizer``); the held-out split
            gives every model's code loss.
        progress: a progress bar over the models.
        **overrides: fields of :class:`DescendantsConfig` replacing the preset's.

    Returns:
        A :class:`DescendantsResult`.
    """
    cfg = replace(PRESETS[config] if isinstance(config, str) else config, **overrides)
    started = time.perf_counter()
    if data is None:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise LensBiasError("the fine-tuned descendant needs model.tokenizer (load with lens_bias.models.pretrained) or data=TokenData.build(...)")
        data = TokenData.build(code(), seq_len=cfg.finetune_seq_len, tokenizer_from=tokenizer)
    held_out = data.eval[: cfg.eval_blocks]

    def fingerprint(m: Any) -> seedprint.Fingerprint:
        return seedprint.fingerprint(m, inputs="tokens", n=cfg.n, seq_len=cfg.seq_len, seed=cfg.seed, progress=False)

    total = 7 + cfg.n_random
    bar = tqdm(total=total, desc="real descendants", disable=not progress)
    base = fingerprint(model)
    prints = {"base": base}
    bar.update()
    base_loss = evaluate(model, held_out)
    rows = []

    def record(name: str, target: Any, related: bool, eval_loss: float | None = None) -> None:
        prints[name] = fingerprint(target)
        res = seedprint.lineage_test(base, prints[name], ratio_k=cfg.ratio_k, alpha=ALPHA)
        expected = f"related, p < {STRONG:g}" if related else "unrelated"
        ok = res.p < STRONG if related else res.p >= ALPHA
        rows.append({
            "pair": f"base vs {name}", "target": name, "related": related, "tau_bar": res.tau_bar, "k": res.k, "z": res.z, "p": res.p,
            "log10_p": res.log10_p, "verdict": "related" if res.same_lineage else "unrelated", "expected": expected, "ok": ok,
            "weight_change": _relative_change(model, target), "eval_loss": evaluate(target, held_out) if eval_loss is None else eval_loss,
        })
        logger.info("%s: τ̄ %.4f, k %d, log10 p %.1f (%.0f s so far)", name, res.tau_bar, res.k, res.log10_p, time.perf_counter() - started)
        bar.update()

    makers: list[tuple[str, Callable[[], Any]]] = [
        ("int8", lambda: quantize(model, 8, cfg.group_size)),
        ("4-bit", lambda: quantize(model, 4, cfg.group_size)),
        (f"prune {cfg.prune_fraction:.0%}", lambda: prune(model, cfg.prune_fraction)),
        (f"low-rank delta r{cfg.lora_rank}", lambda: low_rank_delta(model, cfg.lora_rank, cfg.lora_scale, cfg.lora_seed)),
    ]
    for name, make in makers:
        record(name, make(), related=True)  # one descendant alive at a time: each is a full copy
    tuned, run = fine_tune(model, cfg.finetune_steps, data=data, lr=cfg.finetune_lr, batch_size=cfg.finetune_batch, eval_blocks=cfg.eval_blocks, progress=False)
    record(f"fine-tune {cfg.finetune_steps} steps", tuned, related=True, eval_loss=run.final_eval_loss)  # on held_out already
    record(f"merge(base, fine-tune) w {cfg.merge_weight:g}", merge(model, tuned, cfg.merge_weight), related=True)
    del tuned
    seeds = range(cfg.first_random_seed, cfg.first_random_seed + cfg.n_random)
    for seed, fresh in zip(seeds, random_inits(model, seeds)):
        record(f"random init {seed}", fresh, related=False, eval_loss=float("nan"))  # ≈ ln V, nothing to learn from it
    bar.close()
    table = pd.DataFrame(rows)
    return DescendantsResult(
        table=table,
        auc_log10_p=auc(-table.log10_p, table.related),
        auc_tau=auc(table.tau_bar, table.related),
        base_eval_loss=base_loss,
        fingerprints=prints,
        config=cfg.to_dict(),
        seconds=time.perf_counter() - started,
    )
