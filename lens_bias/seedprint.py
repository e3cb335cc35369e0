"""SeedPrint: tell whether two models share an initialisation, from the bias they were born with.

The algorithm is the SeedPrints camera-ready one (Tong et al., arXiv 2509.26404): the same N random inputs go
through both models; the features are the final normalized hidden states at the last position. The *identity
dimensions* are the m dimensions with the smallest mean over inputs (intersected across the two models in
"coset" mode). Each row is softmaxed over those dimensions at temperature 10, and for every identity dimension
Kendall's τ-b between the two models is taken across the inputs. The mean τ̄ is tested against the analytic null
sd(τ)/√k (p = min(1, 2·Φ̄(z))), optionally with the aggregate signal, or against an empirical null.

For small models the analytic null is anti-conservative (shared residual path with embedding inputs, repeated
last tokens when N ≫ V): ``null="seeds"`` judges τ̄ against fresh random inits of the base model's architecture
on the same inputs, which controls both by construction; ``calibrate`` measures each null's false-positive rate.

>>> import lens_bias
>>> small = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> a = fingerprint(lens_bias.random_init("gpt2", seed=1, **small), n=64, seq_len=16, progress=False)
>>> b = fingerprint(lens_bias.random_init("gpt2", seed=2, **small), n=64, seq_len=16, progress=False)
>>> result = test(a, b, m=32)
>>> result.k > 1, 0 <= result.p <= 1
(True, True)
"""

from __future__ import annotations

import copy
import hashlib
import logging
import math
import warnings
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any, Callable, Sequence, Union

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from scipy.stats import mannwhitneyu, norm, t as student_t, ttest_ind
from torch import Tensor
from tqdm.auto import tqdm

from . import _tl
from ._io import atomic_save, load_torch_file
from .adapter import READOUT, ModelAdapter, last_position
from .errors import LensBiasError
from .inputs import Inputs, RandomEmbeddings, random_tokens
from .models import ModelSpec, random_init, redraw
from .stats import kendall_tau_b

__all__ = ["Fingerprint", "SeedPrintResult", "fingerprint", "test", "compare", "calibrate", "identity_dims", "tau_null_sd", "seed_null_fingerprints"]

logger = logging.getLogger(__name__)

NULLS = ("analytic", "empirical", "seeds")
MODES = ("coset", "base")
# Depth up to which the shared residual path makes the analytic null unsafe with embedding inputs (calibration:
# unrelated llama-style seeds reach p ≈ 1e-60 at 4 layers and p < 0.01 at 12 layers of width 128).
_SHALLOW_LAYERS = 12

FeaturesLike = Union["Fingerprint", Tensor, np.ndarray]


# ---- fingerprints --------------------------------------------------------------------------------------------


@dataclass
class Fingerprint:
    """A model's SeedPrint features on a recorded set of random inputs; ``save`` once, compare many times."""

    features: Float[Tensor, "n d_model"]  # float32 CPU: the READOUT hook (final norm output) at the last position
    inputs: dict[str, Any]  # kind, n, seq_len, seed, vocab / mean, std, and a digest of the exact inputs
    model: dict[str, Any]  # lens_bias ModelInfo of the fingerprinted model
    spec: dict[str, Any] | None = None  # lens_bias ModelSpec when lens_bias built the model (rebuilds the null)
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return self.features.shape[0]

    @property
    def d(self) -> int:
        return self.features.shape[1]

    def save(self, path: Union[str, Path]) -> None:
        """Write to ``path`` (a torch file holding only tensors and plain Python values).

        The file is written under a temporary name and renamed, so an interrupted save never leaves a partial file.
        """
        atomic_save({"format": "lens_bias.Fingerprint/1", **asdict(self)}, path)

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Fingerprint":
        """Read a fingerprint written by :meth:`save`; a foreign, corrupt or non-finite file raises :class:`LensBiasError`."""
        fix = "make one with `lens-bias fingerprint` or Fingerprint.save"
        data = load_torch_file(path, "fingerprint", fix)
        if data.pop("format", None) != "lens_bias.Fingerprint/1":
            raise LensBiasError(f"{path} is not a lens_bias fingerprint file; {fix}")
        names = {f for f in cls.__dataclass_fields__}
        features = data.get("features")
        if not names >= set(data) or not isinstance(features, Tensor) or features.ndim != 2 or not features.is_floating_point():
            raise LensBiasError(f"{path} is a damaged lens_bias fingerprint (fields {sorted(data)}); {fix}")
        if not torch.isfinite(features).all():
            raise LensBiasError(f"{path} holds NaN/inf features: the fingerprinted model overflowed or is broken; {fix} in float32 or bfloat16")
        return cls(**data)


def _digest(inputs: Inputs) -> str:
    if isinstance(inputs, RandomEmbeddings):
        return "random-embeddings:" + repr(asdict(inputs))
    return "sha256:" + hashlib.sha256(inputs.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def _versions() -> dict[str, str]:
    return {"lens_bias": version("lens-bias"), "transformer_lens": _tl.tl_version(), "torch": str(torch.__version__)}


def _with_device_dtype(model: Any, device: Union[str, torch.device, None], dtype: torch.dtype | None) -> Any:
    """The model itself, or a copy on ``device`` / in ``dtype``: the caller's model is never moved or cast."""
    adapter = ModelAdapter(model)
    want_device = torch.device(device) if device is not None else adapter.device
    want_dtype = dtype
    if want_dtype is None:
        # fp16 overflows on long random sequences; the papers run half-precision models in bf16
        want_dtype = torch.bfloat16 if adapter.dtype == torch.float16 else adapter.dtype
    same_device = want_device.type == adapter.device.type and want_device.index in (None, adapter.device.index)
    if same_device and want_dtype == adapter.dtype:
        return model
    logger.info("fingerprinting a copy of the model on %s in %s (the model you passed is not moved)", want_device, want_dtype)
    clone = copy.deepcopy(model)
    if hasattr(model, "lens_bias_spec"):
        clone.lens_bias_spec = model.lens_bias_spec
    return clone.to(want_device).to(want_dtype)


def fingerprint(
    model: Any,
    *,
    inputs: Union[str, Inputs] = "tokens",
    n: int = 2000,
    seq_len: int = 1024,
    seed: int = 42,
    vocab: int | None = None,
    embed_std: float | None = None,
    batch_size: int | None = None,
    device: Union[str, torch.device, None] = None,
    dtype: torch.dtype | None = None,
    progress: bool = True,
    distributed: bool = False,
) -> Fingerprint | None:
    """SeedPrint features of ``model``: the final normalized state at the last position of N random inputs.

    The forward pass stops after the final norm (the unembedding is never computed) and keeps only the last
    position, so memory does not grow with N beyond the ``[N, d_model]`` result.

    Args:
        model: any TransformerLens model (never modified).
        inputs: "tokens" (IDs uniform in ``[0, vocab)``), "embeddings" (N(0, embed_std) in place of the token
            embedding, the same for every model of one width), or explicit token IDs / embeddings.
        n: number of random sequences.
        seq_len: tokens per sequence (the papers use 1024).
        seed: seed of the random inputs (the papers use 42).
        vocab: token IDs are drawn below this; use the smallest vocabulary of the models you will compare
            (default: this model's ``d_vocab``).
        embed_std: std of embedding inputs (default: the recorded init std of a lens_bias model, else 0.02, the
            Hugging Face initializer range).
        batch_size: sequences per forward pass.
        device: run on this device (a copy of the model is moved, not the model itself).
        dtype: run in this dtype (default: the model's, but bfloat16 for float16 models).
        progress: a progress bar over batches.
        distributed: under ``torchrun --nproc_per_node K``, shard the inputs across the K ranks (whole batches,
            NCCL on GPUs with each rank on ``cuda:LOCAL_RANK``, gloo on CPU) and gather the features on rank 0 in
            input order; the result equals the single-process fingerprint.

    Returns:
        A :class:`Fingerprint` (with ``distributed=True``: on rank 0; the other ranks get ``None``).
    """
    spec = getattr(model, "lens_bias_spec", None)
    adapter = ModelAdapter(model)
    info = adapter.info
    if isinstance(inputs, str):
        if inputs == "tokens":
            vocab = info.d_vocab if vocab is None else vocab
            if vocab > info.d_vocab:
                raise LensBiasError(f"vocab={vocab} exceeds the model's d_vocab={info.d_vocab}")
            data: Inputs = random_tokens(n, seq_len, vocab, seed)
            described: dict[str, Any] = {"kind": "tokens", "n": n, "seq_len": seq_len, "seed": seed, "vocab": vocab}
        elif inputs == "embeddings":
            std = embed_std if embed_std is not None else (spec.init_std if spec is not None else 0.02)
            data = RandomEmbeddings(n, seq_len, info.d_model, mean=0.0, std=std, seed=seed)
            described = {"kind": "embeddings", "n": n, "seq_len": seq_len, "seed": seed, "mean": 0.0, "std": std}
        else:
            raise LensBiasError(f"inputs must be 'tokens', 'embeddings' or a tensor, got {inputs!r}")
    elif isinstance(inputs, (Tensor, RandomEmbeddings)):
        data = inputs
        kind = "tokens" if isinstance(inputs, Tensor) and inputs.ndim == 2 else "embeddings"
        described = {"kind": kind, "n": inputs.shape[0], "seq_len": inputs.shape[1], "seed": None}
    else:
        raise TypeError(f"inputs must be 'tokens', 'embeddings', a tensor or RandomEmbeddings, got {type(inputs).__name__}")
    described["digest"] = _digest(data)

    probe = last_position(READOUT)
    if distributed:
        from . import distributed as dist_util

        dist_util.ensure_process_group()
        device = device if device is not None else dist_util.local_device()
        runner = _with_device_dtype(model, device, dtype)
        batch = batch_size or ModelAdapter(runner).default_batch_size(data.shape[1])

        def extract(start: int, stop: int) -> Tensor:
            if start == stop:
                return torch.zeros(0, info.d_model)
            shard = data.view(start, stop) if isinstance(data, RandomEmbeddings) else data[start:stop]
            return ModelAdapter(runner).collect(shard, [probe], batch_size=batch, progress=progress, desc="fingerprint")[probe.key]

        gathered = dist_util.run_sharded(extract, data.shape[0], batch)
        if gathered is None:
            return None
        features = gathered
    else:
        runner = _with_device_dtype(model, device, dtype)
        features = ModelAdapter(runner).collect(data, [probe], batch_size=batch_size, progress=progress, desc="fingerprint")[probe.key]
    nan_rows = int(torch.isnan(features).any(dim=1).sum())
    if nan_rows:
        warnings.warn(f"{nan_rows} of {features.shape[0]} feature rows are NaN (overflow?); test() drops them", stacklevel=2)
    return Fingerprint(
        features=features,
        inputs=described,
        model=ModelAdapter(runner).info.to_dict(),
        spec=spec.to_dict() if spec is not None else None,
        versions=_versions(),
    )


# ---- the test ----------------------------------------------------------------------------------------------


def tau_null_sd(n: int) -> float:
    """Standard deviation of Kendall's τ between two independent samples of size n: √(2(2n+5)/(9n(n−1)))."""
    return math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))


def identity_dims(features: Float[Tensor, "n d"], m: int) -> Tensor:
    """Indices of the m dimensions with the smallest mean over the inputs (``topk(avg, m, largest=False)``)."""
    return torch.topk(features.mean(dim=0), m, largest=False).indices


@dataclass
class SeedPrintResult:
    """The lineage verdict and everything it was computed from."""

    p: float
    log10_p: float
    tau_bar: float  # mean Kendall τ over the identity dimensions
    z: float  # τ̄ in null standard deviations (analytic, or against the seeds null)
    k: int  # identity dimensions with a defined τ
    n: int  # inputs used (NaN rows dropped)
    m: int
    mode: str
    temperature: float
    null: str
    alpha: float
    identity_dims: list[int]
    taus: Float[Tensor, "k"]
    means_a: Float[Tensor, "k"]
    means_b: Float[Tensor, "k"]
    reason: str | None = None  # why p = 1 without a test (k = 0 or 1)
    tau_agg: float | None = None  # aggregate signal (aggregate=True)
    z_agg: float | None = None
    null_tau_bars: list[float] | None = None  # seeds null: base vs each fresh init
    p_rank: float | None = None  # seeds null: rank of τ̄ among the K + 1
    null_taus_mean: float | None = None  # empirical null: pooled null τ's
    null_taus_std: float | None = None

    @property
    def same_lineage(self) -> bool:
        """The verdict: p < alpha."""
        return self.p < self.alpha

    def to_pandas(self) -> pd.DataFrame:
        """Per identity dimension: τ and the two models' mean feature values."""
        return pd.DataFrame({"dim": self.identity_dims, "tau": self.taus.tolist(), "mean_a": self.means_a.tolist(), "mean_b": self.means_b.tolist()})

    def __str__(self) -> str:
        verdict = "SAME lineage" if self.same_lineage else "no evidence of shared lineage"
        extra = f" ({self.reason})" if self.reason else ""
        rank = f", rank p {self.p_rank:.3g}" if self.p_rank is not None else ""
        return (
            f"SeedPrint ({self.null} null, {self.mode} identity dims, m {self.m}, k {self.k}, n {self.n}): "
            f"τ̄ = {self.tau_bar:.4f}, z = {self.z:.2f}, p = {self.p:.3g} (log10 {self.log10_p:.1f}{rank}) -> {verdict} at α = {self.alpha}{extra}"
        )


def _as_features(x: FeaturesLike, name: str) -> Tensor:
    if isinstance(x, Fingerprint):
        return x.features
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if isinstance(x, Tensor) and x.ndim == 2 and x.is_floating_point():
        if not torch.isfinite(x).all():
            raise LensBiasError(f"{name} holds NaN/inf features; fingerprint the model in float32 or bfloat16, or check its weights")
        return x.detach().float().cpu()
    raise TypeError(f"{name} must be a Fingerprint or a float [N, D] array/tensor, got {type(x).__name__}")


def _check_compatible(a: FeaturesLike, b: FeaturesLike, fa: Tensor, fb: Tensor) -> None:
    if fa.shape != fb.shape:
        raise LensBiasError(
            f"feature matrices must have the same shape (rows = the same inputs in the same order, same width); "
            f"got {tuple(fa.shape)} and {tuple(fb.shape)}"
        )
    if isinstance(a, Fingerprint) and isinstance(b, Fingerprint):
        keys = sorted(set(a.inputs) | set(b.inputs))
        differ = [k for k in keys if a.inputs.get(k) != b.inputs.get(k)]
        if differ:
            detail = ", ".join(f"{k}: {a.inputs.get(k)!r} vs {b.inputs.get(k)!r}" for k in differ if k != "digest")
            raise LensBiasError(
                f"the fingerprints were made from different inputs ({detail or 'different input tensors'}); "
                "fingerprint both models with the same inputs, n, seq_len, seed and vocab (the smallest vocabulary)"
            )


@dataclass(frozen=True)
class _Core:
    """One pass of the pipeline: identity dims, per-dimension τ's and their mean over the k defined ones."""

    tau_bar: float
    taus: Tensor
    dims: Tensor
    k: int


def _core(fa: Tensor, fb: Tensor, m: int, mode: str, temperature: float) -> _Core:
    """Identity dims, softmax at temperature, per-dimension Kendall τ-b, NaN τ's dropped."""
    dims = identity_dims(fa, m)
    if mode == "coset":
        other = identity_dims(fb, m)
        dims = dims[torch.isin(dims, other)]
    dims = dims.sort().values
    if dims.numel() < 2:  # k = 1: the softmax over one dimension is constant, τ undefined
        return _Core(float("nan"), torch.empty(0), dims, dims.numel())
    pa = torch.softmax(fa[:, dims].double() / temperature, dim=1)
    pb = torch.softmax(fb[:, dims].double() / temperature, dim=1)
    taus = kendall_tau_b(pa, pb)
    valid = taus[~torch.isnan(taus)]
    return _Core(valid.mean().item() if valid.numel() else float("nan"), taus, dims, int(valid.numel()))


def _log_p_scaled_sf(z: float, factor: float) -> float:
    """log of min(1, factor · Φ̄(z)), exact far into the tail (``norm.logsf``)."""
    return min(0.0, math.log(factor) + float(norm.logsf(z)))


def test(
    a: FeaturesLike,
    b: FeaturesLike,
    *,
    m: int | None = None,
    ratio_k: float = 0.10,
    mode: str = "coset",
    temperature: float = 10.0,
    null: str = "analytic",
    aggregate: bool = False,
    alpha: float = 0.01,
    factory: Callable[[int], Any] | None = None,
    n_null: int = 20,
    null_fingerprints: Sequence[Fingerprint] | None = None,
    n_trials: int = 10,
    test_type: str = "t-test",
    null_seed: int = 0,
    progress: bool = False,
) -> SeedPrintResult:
    """Do ``a`` and ``b`` share an initialisation? The SeedPrint distribution-correlation test.

    Args:
        a: the base model's :class:`Fingerprint`, or a float ``[N, D]`` array/tensor.
        b: the suspect's, on the same inputs in the same order.
        m: identity dimensions per model (default ``⌊ratio_k · D⌋``; at small D use about D/2).
        ratio_k: m as a share of D when ``m`` is None.
        mode: "coset" (identity dims of both models, intersected) or "base" (the base model's).
        temperature: softmax temperature over the identity dims.
        null: "analytic" (closed form), "empirical" (random N(0, I) features through the whole pipeline) or
            "seeds" (fresh random inits of the base architecture on the same inputs).
        aggregate: also use the aggregate signal (analytic null only).
        alpha: the significance level of the verdict.
        factory: ``seed -> model`` for the seeds null (default: rebuild from the fingerprint's recorded spec).
        n_null: fresh inits in the seeds null.
        null_fingerprints: precomputed fingerprints for the seeds null, reused instead of a factory: fresh inits,
            or, when both models were trained on the same data, models trained on it from other init seeds (a
            data-matched null: shared data makes unrelated trained models resemble each other beyond the
            analytic null).
        n_trials: random feature pairs in the empirical null.
        test_type: empirical null: "t-test" (Student), "welch" or "u-test" (Mann-Whitney), all one-sided.
        null_seed: seed of the empirical null's random features; the seeds null uses init seeds from
            1,000,000 + null_seed on (skipping the seeds of ``a`` and ``b``).
        progress: progress bars while fingerprinting the seeds null.

    Returns:
        A :class:`SeedPrintResult`; ``same_lineage`` is ``p < alpha``.
    """
    if null not in NULLS:
        raise LensBiasError(f"null must be one of {NULLS}, got {null!r}")
    if mode not in MODES:
        raise LensBiasError(f"mode must be one of {MODES}, got {mode!r}")
    if aggregate and null != "analytic":
        raise LensBiasError("aggregate=True combines with the analytic null only")
    fa, fb = _as_features(a, "a"), _as_features(b, "b")
    _check_compatible(a, b, fa, fb)
    keep = ~(torch.isnan(fa).any(dim=1) | torch.isnan(fb).any(dim=1))
    if not keep.all():
        warnings.warn(f"dropping {int((~keep).sum())} of {keep.numel()} input rows with NaN features", stacklevel=2)
        fa, fb = fa[keep], fb[keep]
    n, d = fa.shape
    if n < 3:
        raise LensBiasError(f"need at least 3 inputs with finite features, got {n}")
    m = int(ratio_k * d) if m is None else m
    if not 1 <= m <= d:
        raise LensBiasError(f"m must be in [1, D={d}], got {m} (with m=None it is ⌊ratio_k·D⌋)")
    if null == "analytic":
        _warn_unsafe_analytic(a, n)

    core = _core(fa, fb, m, mode, temperature)
    dims = core.dims
    result = SeedPrintResult(
        p=1.0, log10_p=0.0, tau_bar=core.tau_bar, z=float("nan"), k=core.k, n=n, m=m, mode=mode, temperature=temperature,
        null=null, alpha=alpha, identity_dims=dims.tolist(), taus=core.taus.float(),
        means_a=fa[:, dims].mean(0), means_b=fb[:, dims].mean(0),
    )
    if core.k < 2:
        result.reason = (
            "no identity dimensions in common" if dims.numel() == 0
            else "one identity dimension: the softmax over it is constant and τ is undefined" if dims.numel() == 1
            else "fewer than two identity dimensions with a defined τ"
        )
        return result

    if null == "analytic":
        sd = tau_null_sd(n)
        result.z = core.tau_bar / (sd / math.sqrt(core.k))
        log_p = _log_p_scaled_sf(result.z, 2.0)
        if aggregate:
            agg = kendall_tau_b(fa[:, dims].mean(1, keepdim=True), fb[:, dims].mean(1, keepdim=True))[0].item()
            result.tau_agg, result.z_agg = agg, agg / sd
            log_p = _log_p_scaled_sf(max(result.z, result.z_agg), 4.0)
    elif null == "empirical":
        log_p = _empirical(result, core, (n, d), m, mode, temperature, n_trials, test_type, null_seed)
    else:
        if null_fingerprints is None:
            if not isinstance(a, Fingerprint):
                raise LensBiasError("null='seeds' needs the base as a Fingerprint (to regenerate its inputs) or null_fingerprints=")
            avoid = {f.spec["seed"] for f in (a, b) if isinstance(f, Fingerprint) and f.spec}
            null_fingerprints = seed_null_fingerprints(a, n_null=n_null, factory=factory, first_seed=1_000_000 + null_seed, avoid=avoid, progress=progress)
        log_p = _seeds(result, a, fa, keep, null_fingerprints, m, mode, temperature)
    result.log10_p = log_p / math.log(10)
    result.p = math.exp(log_p)
    return result


def _warn_unsafe_analytic(a: FeaturesLike, n: int) -> None:
    if not isinstance(a, Fingerprint):
        return
    kind, layers = a.inputs.get("kind"), a.model.get("n_layers", 0)
    if kind == "embeddings" and layers <= _SHALLOW_LAYERS:
        warnings.warn(
            f"the analytic null is unsafe for embedding inputs on a {layers}-layer model: the shared residual path "
            "makes unrelated seeds look related. Use null='seeds' (or check with lens_bias.seedprint.calibrate)",
            stacklevel=3,
        )
    vocab = a.inputs.get("vocab")
    if kind == "tokens" and vocab and n > vocab / 4:
        warnings.warn(
            f"the analytic null is unsafe with N={n} token inputs over a vocabulary of {vocab} (N > V/4): repeated "
            "last tokens shrink the effective sample size. Use null='seeds' or more vocabulary",
            stacklevel=3,
        )


def _empirical(result: SeedPrintResult, core: _Core, shape: tuple[int, int], m: int, mode: str, temperature: float, n_trials: int, test_type: str, null_seed: int) -> float:
    """Random N(0, I) feature pairs through the whole pipeline; one-sided test of the real τ's against them."""
    if test_type not in ("t-test", "welch", "u-test"):
        raise LensBiasError(f"test_type must be 't-test', 'welch' or 'u-test', got {test_type!r}")
    generator = torch.Generator().manual_seed(null_seed)
    pooled = []
    for _ in range(n_trials):
        ra, rb = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
        taus = _core(ra, rb, m, mode, temperature).taus
        pooled.append(taus[~torch.isnan(taus)])
    null_taus = torch.cat(pooled).numpy()
    real = core.taus[~torch.isnan(core.taus)].numpy()
    result.null_taus_mean, result.null_taus_std = float(null_taus.mean()), float(null_taus.std())
    result.z = (core.tau_bar - result.null_taus_mean) / (result.null_taus_std / math.sqrt(core.k))
    if test_type == "u-test":
        p = mannwhitneyu(real, null_taus, alternative="greater").pvalue
    else:
        p = ttest_ind(real, null_taus, alternative="greater", equal_var=test_type == "t-test").pvalue
    return math.log(max(float(p), 1e-300))


def regenerate_inputs(base: Fingerprint) -> Inputs:
    """The exact inputs a fingerprint was made from, rebuilt from its record (checked against its digest)."""
    rec = base.inputs
    if rec.get("seed") is None:
        raise LensBiasError("this fingerprint was made from your own input tensor, which it does not store; pass null_fingerprints=")
    if rec["kind"] == "tokens":
        data: Inputs = random_tokens(rec["n"], rec["seq_len"], rec["vocab"], rec["seed"])
    else:
        data = RandomEmbeddings(rec["n"], rec["seq_len"], base.d, mean=rec["mean"], std=rec["std"], seed=rec["seed"])
    if _digest(data) != rec["digest"]:
        raise LensBiasError("regenerated inputs do not match the fingerprint's digest (made by another lens_bias version?)")
    return data


def seed_null_fingerprints(
    base: Fingerprint,
    *,
    n_null: int = 20,
    factory: Callable[[int], Any] | None = None,
    first_seed: int = 1_000_000,
    avoid: Sequence[int] = (),
    progress: bool = True,
) -> list[Fingerprint]:
    """Fingerprints of ``n_null`` fresh random inits of the base architecture, on the base's exact inputs.

    Args:
        base: the base model's fingerprint (its inputs are regenerated from the record).
        n_null: how many fresh inits.
        factory: ``seed -> model``; default: the base's recorded spec with another seed (one model, re-drawn).
        first_seed: the first init seed tried.
        avoid: init seeds to skip (the base's and the suspect's own).
        progress: a progress bar over the inits.

    Returns:
        ``n_null`` fingerprints.
    """
    if n_null < 3:
        raise LensBiasError(f"the seeds null needs n_null >= 3 fresh inits, got {n_null}")
    if factory is None:
        if base.spec is None:
            raise LensBiasError("the base model was not built by lens_bias, so its architecture cannot be rebuilt; pass factory=lambda seed: ...")
        spec = ModelSpec.from_dict(base.spec)
        built: list[Any] = []

        def factory(seed: int) -> Any:  # one model, re-drawn per seed: building a bridge costs more than its weights
            if not built:
                built.append(random_init(replace(spec, seed=seed)))
            return redraw(built[0], seed)
    data = regenerate_inputs(base)
    seeds = [s for s in range(first_seed, first_seed + n_null + len(avoid)) if s not in avoid][:n_null]
    prints = []
    for seed in tqdm(seeds, desc="seeds null", disable=not progress):
        prints.append(fingerprint(factory(seed), inputs=data, progress=False))
        prints[-1].inputs.update({k: v for k, v in base.inputs.items() if k != "digest"})
    return prints


def _seeds(result: SeedPrintResult, a: FeaturesLike, fa: Tensor, keep: Tensor, null_prints: Sequence[Fingerprint], m: int, mode: str, temperature: float) -> float:
    """Judge τ̄ against base-vs-fresh-init τ̄'s: normal fit (Student-t predictive) for the verdict, rank beside it."""
    null = []
    for other in null_prints:
        _check_compatible(a, other, _as_features(a, "a"), other.features)
        tau = _core(fa, other.features[keep], m, mode, temperature).tau_bar
        if not math.isnan(tau):
            null.append(tau)
    if len(null) < 3:
        raise LensBiasError(f"only {len(null)} null fingerprints gave a defined τ̄; need at least 3")
    k = len(null)
    mean, sd = float(np.mean(null)), float(np.std(null, ddof=1))
    result.null_tau_bars = null
    result.z = (result.tau_bar - mean) / sd
    result.p_rank = (1 + sum(x >= result.tau_bar for x in null)) / (k + 1)
    # A new draw from a normal null with estimated mean and sd is Student-t with k-1 degrees of freedom after
    # scaling by √(1 + 1/k): the exact "normal fit" p for k fresh inits.
    return float(student_t.logsf(result.z / math.sqrt(1 + 1 / k), k - 1))


def compare(
    model_a: Any,
    model_b: Any,
    *,
    inputs: str = "tokens",
    n: int = 2000,
    seq_len: int = 1024,
    seed: int = 42,
    vocab: int | None = None,
    embed_std: float | None = None,
    batch_size: int | None = None,
    device: Union[str, torch.device, None] = None,
    dtype: torch.dtype | None = None,
    progress: bool = True,
    **test_kwargs: Any,
) -> SeedPrintResult:
    """Fingerprint both models on the same random inputs and :func:`test` them (``a`` is the base).

    Token IDs are drawn below the smaller of the two vocabularies unless ``vocab`` is given; the other
    arguments are those of :func:`fingerprint` and :func:`test`.
    """
    if vocab is None and inputs == "tokens":
        vocab = min(ModelAdapter(model_a).info.d_vocab, ModelAdapter(model_b).info.d_vocab)
    common = dict(inputs=inputs, n=n, seq_len=seq_len, seed=seed, vocab=vocab, embed_std=embed_std, batch_size=batch_size, device=device, dtype=dtype, progress=progress)
    return test(fingerprint(model_a, **common), fingerprint(model_b, **common), progress=progress, **test_kwargs)


def calibrate(
    factory: Callable[[int], Any],
    *,
    inputs: Union[str, Sequence[str]] = ("tokens", "embeddings"),
    n_pairs: int = 100,
    n: int = 500,
    seq_len: int = 32,
    seed: int = 42,
    vocab: int | None = None,
    nulls: Sequence[str] = ("analytic", "seeds"),
    n_null: int = 20,
    alpha: float = 0.01,
    first_seed: int = 0,
    progress: bool = True,
    **test_kwargs: Any,
) -> pd.DataFrame:
    """False-positive rate of each null on pairs of independent random inits of one architecture.

    Builds ``n_null + 2·n_pairs`` models with init seeds ``first_seed, first_seed + 1, ...`` (the first
    ``n_null`` form the seeds null, shared by every pair), fingerprints each on the same inputs of every kind
    asked for, and tests every pair: any p < alpha is a false positive, since no two of these models share an
    initialisation.

    Args:
        factory: ``seed -> model``, e.g. ``lambda s: lens_bias.random_init("llama", d_model=128, seed=s)``.
        inputs: "tokens", "embeddings" or both.
        n: as in :func:`fingerprint`.
        seq_len: as in :func:`fingerprint`.
        seed: as in :func:`fingerprint`.
        vocab: as in :func:`fingerprint`.
        n_pairs: independent model pairs.
        nulls: which nulls to calibrate.
        n_null: fresh inits in the seeds null.
        alpha: the significance level.
        first_seed: the first init seed.
        progress: a progress bar over models.
        **test_kwargs: m, ratio_k, mode, temperature, ... for :func:`test`.

    Returns:
        One row per input kind and null: pairs, false positives, FPR, and the median τ̄ and log10 p.
    """
    kinds = [inputs] if isinstance(inputs, str) else list(inputs)
    unknown = [x for x in nulls if x not in NULLS]
    if unknown:
        raise LensBiasError(f"unknown null(s) {unknown}; choose from {NULLS}")
    prints: dict[str, list[Fingerprint]] = {kind: [] for kind in kinds}
    for s in tqdm(range(first_seed, first_seed + n_null + 2 * n_pairs), desc="calibration models", disable=not progress):
        model = factory(s)
        for kind in kinds:
            prints[kind].append(fingerprint(model, inputs=kind, n=n, seq_len=seq_len, seed=seed, vocab=vocab, progress=False))
    rows = []
    for kind in kinds:
        null_prints, pairs = prints[kind][:n_null], prints[kind][n_null:]
        for null in nulls:
            extra = {"null_fingerprints": null_prints} if null == "seeds" else {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the unsafe-regime warning is what this function measures
                outcomes = [test(pairs[2 * i], pairs[2 * i + 1], null=null, alpha=alpha, **extra, **test_kwargs) for i in range(n_pairs)]
            false = sum(r.same_lineage for r in outcomes)
            rows.append(
                {
                    "inputs": kind,
                    "null": null,
                    "pairs": n_pairs,
                    "false_positives": false,
                    "fpr": false / n_pairs,
                    "alpha": alpha,
                    "median_tau_bar": float(np.median([r.tau_bar for r in outcomes])),
                    "median_log10_p": float(np.median([r.log10_p for r in outcomes])),
                }
            )
    return pd.DataFrame(rows)
