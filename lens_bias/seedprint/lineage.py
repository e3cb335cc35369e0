"""The lineage test: do two fingerprints share an initialisation? (:func:`lineage_test`)

The algorithm is the SeedPrints camera-ready one (Tong et al., arXiv 2509.26404): the identity dimensions are the
m dimensions with the smallest mean over inputs (intersected across the two models in "coset" mode); each row is
softmaxed over them at temperature 10, and for every identity dimension Kendall's τ-b between the two models is
taken across the inputs. The mean τ̄ is judged against a null (:mod:`lens_bias.seedprint.nulls`).

>>> import lens_bias
>>> from lens_bias.seedprint import fingerprint
>>> small = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> a = fingerprint(lens_bias.random_init("gpt2", seed=1, **small), n=64, seq_len=16, progress=False)
>>> b = fingerprint(lens_bias.random_init("gpt2", seed=2, **small), n=64, seq_len=16, progress=False)
>>> result = lineage_test(a, b, m=32)
>>> result.k > 1, 0 <= result.p <= 1, result.null
(True, True, 'analytic')
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.seedprint.align import FIT_FRACTION, AlignMode, check_align, split_and_align
from lens_bias.seedprint.fingerprints import (
    FeaturesLike,
    Fingerprint,
    as_features,
    check_compatible,
    fingerprint,
    regenerate_inputs,
)
from lens_bias.seedprint.nulls import NULLS, AnalyticNull, Case, Null
from lens_bias.seedprint.statistic import MODES, tau_statistic
from lens_bias.seedprint.vocabulary import renamed_tokens

__all__ = ["SeedPrintResult", "lineage_test", "compare", "fingerprint_like", "ALPHA", "STRONG"]

# The papers' significance level for "same lineage", and the bar a known descendant must clear (LeaFBench-style
# "overwhelmingly related", as the papers report related pairs at p ≲ 1e-10).
ALPHA = 0.01
STRONG = 1e-10


@dataclass
class SeedPrintResult:
    """The lineage verdict and everything it was computed from."""

    p: float
    log10_p: float
    tau_bar: float  # mean Kendall τ over the identity dimensions
    z: float  # τ̄ in null standard deviations (analytic, or against the seeds null)
    k: int  # identity dimensions with a defined τ
    n: int  # inputs compared (with an alignment: the held-out rows)
    m: int
    mode: str
    temperature: float
    null: str  # the null's label
    alpha: float
    identity_dims: list[int]
    taus: Float[Tensor, "k"]
    means_a: Float[Tensor, "k"]
    means_b: Float[Tensor, "k"]
    null_settings: dict[str, Any] | None = None  # the null's to_dict()
    reason: str | None = None  # why p = 1 without a test (k = 0 or 1)
    # The null's own numbers (Judgement.details): AnalyticNull(aggregate=True) tau_agg and z_agg; EmpiricalNull the
    # pooled null τ's mean and std; SeedsNull each null model's τ̄ and the rank p.
    null_details: dict[str, Any] = field(default_factory=dict)
    align: AlignMode = None  # the alignment fitted before the test (None: the published test)
    fit_rows: int = 0  # rows the alignment was fitted on (the first ones); the test ran on the rest
    renamed_vocabulary: bool = False  # compare() found b's vocabulary to be a's renamed, and gave b the same tokens renamed

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
        kind = (self.null_settings or {}).get("kind")
        rank = NULLS[kind].note(self.null_details) if self.null_details and kind in NULLS else ""
        aligned = f", {self.align} alignment fitted on {self.fit_rows} rows" if self.align else ""
        aligned += ", token inputs renamed to the suspect's vocabulary" if self.renamed_vocabulary else ""
        return (
            f"SeedPrint ({self.null} null{aligned}, {self.mode} identity dims, m {self.m}, k {self.k}, n {self.n}): "
            f"τ̄ = {self.tau_bar:.4f}, z = {self.z:.2f}, p = {self.p:.3g} (log10 {self.log10_p:.1f}{rank}) -> {verdict} at α = {self.alpha}{extra}"
        )


def lineage_test(
    a: FeaturesLike,
    b: FeaturesLike,
    *,
    m: int | None = None,
    ratio_k: float = 0.10,
    mode: str = "coset",
    temperature: float = 10.0,
    null: Null = AnalyticNull(),
    alpha: float = 0.01,
    align: AlignMode = None,
    fit_fraction: float = FIT_FRACTION,
    progress: bool = False,
) -> SeedPrintResult:
    """Do ``a`` and ``b`` share an initialisation? The SeedPrint distribution-correlation test.

    Args:
        a: the base model's :class:`~lens_bias.seedprint.Fingerprint`, or a float ``[N, D]`` array/tensor.
        b: the suspect's, on the same inputs in the same order.
        m: identity dimensions per model (default ``⌊ratio_k · D⌋``; at small D use about D/2).
        ratio_k: m as a share of D when ``m`` is None.
        mode: "coset" (identity dims of both models, intersected) or "base" (the base model's).
        temperature: softmax temperature over the identity dims.
        null: what τ̄ is judged against: ``AnalyticNull()`` (closed form; ``aggregate=True`` adds the aggregate
            signal), ``EmpiricalNull(n_trials, test_type)`` (random N(0, I) features through the whole pipeline)
            or ``SeedsNull(factory | fingerprints, label)`` (other models on the same inputs: fresh random inits
            of the base architecture by default).
        alpha: the significance level of the verdict.
        align: ``None`` (the published test), "permutation", "orthogonal" or "linear": first fit a map from
            ``b``'s features to ``a``'s basis on the first ``fit_fraction`` of the inputs, then test on the rest
            (:mod:`lens_bias.seedprint.align` says which reparametrisations each mode covers). Judge it against a
            null aligned the same way: ``SeedsNull`` and ``EmpiricalNull`` run the alignment on their own models.
        fit_fraction: the share of the inputs the alignment is fitted on.
        progress: progress bars while a seeds null fingerprints its fresh inits.

    Returns:
        A :class:`SeedPrintResult`; ``same_lineage`` is ``p < alpha``; ``null`` is the null's label and
        ``null_settings`` its ``to_dict()``.
    """
    if not isinstance(null, Null):
        raise LensBiasError(
            f"null must be AnalyticNull(), EmpiricalNull(...) or SeedsNull(...) from lens_bias.seedprint, got {null!r}"
            + (f"; for {null!r} use lens_bias.seedprint.null_named({null!r})" if isinstance(null, str) else "")
        )
    if mode not in MODES:
        raise LensBiasError(f"mode must be one of {MODES}, got {mode!r}")
    check_align(align)
    full_a, full_b = as_features(a, "a", align), as_features(b, "b", align)
    check_compatible(a, b, full_a, full_b)
    fit_rows = int(fit_fraction * full_a.shape[0]) if align is not None else 0
    if align is not None and not 3 <= fit_rows <= full_a.shape[0] - 3:
        raise LensBiasError(f"fit_fraction {fit_fraction} of {full_a.shape[0]} inputs leaves {fit_rows} rows to fit and {full_a.shape[0] - fit_rows} to test; both need at least 3")
    n, d = full_a.shape[0] - fit_rows, full_a.shape[1]
    if n < 3:
        raise LensBiasError(f"need at least 3 inputs, got {n}")
    m = int(ratio_k * d) if m is None else m
    if not 1 <= m <= d:
        raise LensBiasError(f"m must be in [1, D={d}], got {m} (with m=None it is ⌊ratio_k·D⌋)")
    null.check(a, n)

    fa, fb = split_and_align(align, fit_rows, full_a, full_b)
    core = tau_statistic(fa, fb, m, mode, temperature)
    case = Case(a=a, b=b, fa=fa, fb=fb, m=m, mode=mode, temperature=temperature, statistic=core, progress=progress, full_a=full_a, align=align,
                fit_rows=fit_rows)
    dims = core.dims
    result = SeedPrintResult(
        p=1.0, log10_p=0.0, tau_bar=core.tau_bar, z=float("nan"), k=core.k, n=n, m=m, mode=mode, temperature=temperature,
        null=null.label, alpha=alpha, identity_dims=dims.tolist(), taus=core.taus.float(),
        means_a=fa[:, dims].mean(0), means_b=fb[:, dims].mean(0), null_settings=null.to_dict(), align=align, fit_rows=fit_rows,
    )
    if core.k < 2:
        result.reason = (
            "no identity dimensions in common" if dims.numel() == 0
            else "one identity dimension: the softmax over it is constant and τ is undefined" if dims.numel() == 1
            else "fewer than two identity dimensions with a defined τ"
        )
        return result
    judgement = null.judge(case)
    result.log10_p = judgement.log_p / math.log(10)
    result.p = math.exp(judgement.log_p)
    result.z = judgement.z
    result.null_details = judgement.details
    return result


_FINGERPRINT_KEYWORDS = [name for name in inspect.signature(fingerprint).parameters if name not in ("model", "distributed")]
_TEST_KEYWORDS = [name for name in inspect.signature(lineage_test).parameters if name not in ("a", "b", "progress")]


def compare(model_a: Any, model_b: Any, *, progress: bool = True, **keywords: Any) -> SeedPrintResult:
    """Fingerprint both models on the same random inputs and :func:`lineage_test` them (``a`` is the base).

    ``keywords`` are those of :func:`~lens_bias.seedprint.fingerprint` (inputs, n, seq_len, seed, vocab,
    embed_std, batch_size, device, dtype) and of :func:`lineage_test` (m, ratio_k, mode, temperature, null,
    alpha, align, fit_fraction), with their defaults. Token IDs are drawn below the smaller of the two vocabularies unless ``vocab``
    is given. When ``b``'s vocabulary is ``a``'s renamed (its embedding rows are ``a``'s in another order:
    :func:`~lens_bias.seedprint.vocabulary.renamed_tokens`), ``b`` reads the same tokens under their new IDs, so a
    renaming, which leaves the model the same on text, cannot hide it; ``renamed_vocabulary`` says so. Models of
    different widths cannot share an init and are refused.
    """
    unknown = sorted(set(keywords) - set(_FINGERPRINT_KEYWORDS) - set(_TEST_KEYWORDS))
    if unknown:
        raise WrongType(f"compare() got unexpected keyword(s) {unknown}; it takes those of fingerprint {_FINGERPRINT_KEYWORDS} and lineage_test {_TEST_KEYWORDS}")
    info_a, info_b = ModelAdapter(model_a).info, ModelAdapter(model_b).info
    if info_a.d_model != info_b.d_model:
        raise LensBiasError(f"different widths cannot share an init (d_model {info_a.d_model} vs {info_b.d_model}); SeedPrint compares models of one width")
    common = {k: v for k, v in keywords.items() if k in _FINGERPRINT_KEYWORDS}
    against = {k: v for k, v in keywords.items() if k in _TEST_KEYWORDS}
    drawn_tokens = isinstance(common.get("inputs", "tokens"), str) and common.get("inputs", "tokens") == "tokens"
    if common.get("vocab") is None and drawn_tokens:
        common["vocab"] = min(info_a.d_vocab, info_b.d_vocab)
    fp_a = fingerprint(model_a, progress=progress, **common)
    passes = {k: v for k, v in common.items() if k in ("batch_size", "device", "dtype", "embed_std")}
    fp_b = fingerprint_like(model_b, model_a, fp_a, progress=progress, **passes) if drawn_tokens else fingerprint(model_b, progress=progress, **common)
    return replace(lineage_test(fp_a, fp_b, progress=progress, **against), renamed_vocabulary=bool(fp_b.inputs.get("renamed")))


def fingerprint_like(model: Any, base_model: Any, base: Fingerprint, *, progress: bool = False, **passes: Any) -> Fingerprint:
    """``model``'s fingerprint on the random token inputs ``base`` (``base_model``'s) was made from; when ``model``'s
    vocabulary is ``base_model``'s renamed (:func:`~lens_bias.seedprint.vocabulary.renamed_tokens`), on the same
    tokens under their new IDs, recorded as ``inputs["renamed"] = True``.

    Args:
        model: the suspect.
        base_model: the model ``base`` was made from.
        base: a fingerprint on drawn token inputs.
        progress: a progress bar.
        **passes: ``batch_size``, ``device``, ``dtype`` of :func:`~lens_bias.seedprint.fingerprint`.

    Returns:
        A fingerprint whose input record is ``base``'s (with ``renamed`` added when renamed).
    """
    record = base.inputs
    if record.get("kind") != "tokens" or record.get("seed") is None:
        raise LensBiasError("fingerprint_like reads a fingerprint made on drawn token inputs (inputs='tokens')")
    tokens = regenerate_inputs(base)[0:record["n"]]
    renamed = renamed_tokens(base_model, model, tokens)
    if renamed is None:
        return fingerprint(model, inputs="tokens", n=record["n"], seq_len=record["seq_len"], seed=record["seed"], vocab=record["vocab"], progress=progress, **passes)
    return replace(fingerprint(model, inputs=renamed, progress=progress, **passes), inputs={**record, "renamed": True})
