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

import math
import warnings
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Mapping

import pandas as pd
from jaxtyping import Float
from torch import Tensor

from lens_bias.core.errors import LensBiasError
from lens_bias.core.settings import overridden
from lens_bias.seedprint.align import FIT_FRACTION, AlignMode, check_align, split_and_align
from lens_bias.seedprint.fingerprints import FeaturesLike, Fingerprint, as_features, check_compatible
from lens_bias.seedprint.nulls import NULLS, AnalyticNull, Case, Null
from lens_bias.seedprint.statistic import MODES, tau_statistic
from lens_bias.seedprint.tables import TableAgreement

__all__ = ["SeedPrintResult", "LineageSettings", "lineage_test", "caveats", "ALPHA", "STRONG", "COMPARE", "PUBLISHED"]

# The papers' significance level for "same lineage", and the bar a known descendant must clear (LeaFBench-style
# "overwhelmingly related", as the papers report related pairs at p ≲ 1e-10).
ALPHA = 0.01
STRONG = 1e-10


@dataclass(frozen=True)
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
    # With align="auto": where the token correspondence came from ("same", "tokenizer", "weights", "none"), the basis
    # map fitted on the embedding tables (correspondence.BASIS_KINDS, or "none") and its relative residual.
    token_source: str | None = None
    basis_map: str | None = None
    basis_fit: float | None = None
    # Why a "related" verdict may not mean lineage (:func:`caveats`: a map fitted on the activations, or the analytic
    # null between two trained models)
    caveat: str | None = None
    # With align="auto": whether the two embedding tables agree beyond chance (:mod:`~lens_bias.seedprint.tables`),
    # and whether the verdict asks them to (between two trained models, where the analytic null alone does not hold)
    tables: TableAgreement | None = None
    tables_asked: bool = False

    @property
    def tables_disagree(self) -> bool:
        """Whether the tables were asked (``tables_asked``) and do not agree beyond chance at ``alpha``."""
        return self.tables_asked and self.tables is not None and not self.tables.agrees(self.alpha)

    @property
    def same_lineage(self) -> bool:
        """The verdict: p < alpha, and, where the tables were asked, tables that agree."""
        return self.p < self.alpha and not self.tables_disagree

    def to_pandas(self) -> pd.DataFrame:
        """Per identity dimension: τ and the two models' mean feature values."""
        return pd.DataFrame({"dim": self.identity_dims, "tau": self.taus.tolist(), "mean_a": self.means_a.tolist(), "mean_b": self.means_b.tolist()})

    def __str__(self) -> str:
        verdict = "SAME lineage" if self.same_lineage else "no evidence of shared lineage"
        extra = f" ({self.reason})" if self.reason else ""
        kind = (self.null_settings or {}).get("kind")
        rank = NULLS[kind].note(self.null_details) if self.null_details and isinstance(kind, str) and kind in NULLS else ""
        aligned = f", {self.align} alignment fitted on {self.fit_rows} rows" if self.align else ""
        aligned += ", token inputs renamed to the suspect's vocabulary" if self.renamed_vocabulary else ""
        if self.basis_map is not None:
            aligned += f", auto: tokens {self.token_source}, basis {self.basis_map} (residual {self.basis_fit:.3g})"
        caveat = f"; {self.caveat}" if self.caveat else ""
        if self.p < self.alpha and self.tables_disagree and self.tables is not None:  # the tables overruled the published verdict
            caveat += (f"; both models are trained and their embedding tables agree no more than chance (z {self.tables.z:.2f}, "
                       f"log10 p ≤ {self.tables.log10_p:.1f}): the analytic null does not hold between trained models, so the weights must agree too")
        return (
            f"SeedPrint ({self.null} null{aligned}, {self.mode} identity dims, m {self.m}, k {self.k}, n {self.n}): "
            f"τ̄ = {self.tau_bar:.4f}, z = {self.z:.2f}, p = {self.p:.3g} (log10 {self.log10_p:.1f}{rank}) -> {verdict} at α = {self.alpha}{extra}{caveat}"
        )


@dataclass(frozen=True)
class LineageSettings:
    """How two models are tested: the identity dimensions, the statistic, the null, the level and the alignment.

    Its default is :func:`compare`'s test (``align="auto"``); :func:`lineage_test`, which reads features only, runs
    :data:`PUBLISHED` when given no settings.

    >>> LineageSettings().align, LineageSettings(align="orthogonal").fit_fraction
    ('auto', 0.5)
    """

    m: int | None = None  # identity dimensions per model (None: ⌊ratio_k · D⌋; at small D use about D/2)
    ratio_k: float = 0.10  # m as a share of D when m is None: the papers' 0.1
    mode: str = "coset"  # "coset": both models' identity dims, intersected (the papers'); "base": the base's only
    temperature: float = 10.0  # softmax temperature over the identity dims: the papers'
    # what τ̄ is judged against (None: the analytic null; pairwise_lineage with an alignment: a seeds null aligned alike)
    null: Null | None = None
    alpha: float = ALPHA  # significance level of the verdict: the papers'
    # "auto": the token and basis maps read from the two models' tokenizers and weights (correspondence), then the
    # published test: what compare runs; None: the published test as it is (all that features alone allow, without
    # a fit); else the map fitted on the activations before it (lens_bias.seedprint.align)
    align: AlignMode | Literal["auto"] = "auto"
    fit_fraction: float = FIT_FRACTION  # share of the inputs (the first rows) an alignment is fitted on

    def to_dict(self) -> dict[str, Any]:
        """Plain values; the null as its own ``to_dict()``."""
        return {**{f.name: getattr(self, f.name) for f in fields(self)}, "null": None if self.null is None else self.null.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], **objects: Any) -> "LineageSettings":
        """The settings ``to_dict`` wrote; ``objects`` as in :meth:`Null.from_dict` (a seeds null's factory or fingerprints)."""
        unknown = sorted(set(d) - {f.name for f in fields(cls)})
        if unknown:
            raise LensBiasError(f"LineageSettings.from_dict: unknown field(s) {unknown}; its fields are {[f.name for f in fields(cls)]}")
        null = d.get("null")
        return cls(**{**d, "null": None if null is None else Null.from_dict(null, **objects)})


CONVERGENCE = (
    "caveat: a map fitted on the activations also aligns unrelated models that learned alike (convergent learning), so between "
    "trained models this verdict does not tell lineage from similar training; compare() with align='auto' reads the map from the weights"
)
"""The caveat an activation-fitted alignment's "related" verdict carries (measured by ``lens-bias lineage-negatives``)."""

TRAINED = (
    "caveat: both models are trained, and the analytic null does not hold between trained models: unrelated models trained on one "
    "corpus correlate beyond it (convergent learning); compare() by default also asks their embedding tables to agree, or judge "
    "them against models trained on the same data from other seeds, null=SeedsNull(fingerprints=[...], label='trained seeds')"
)
"""The caveat a "related" verdict of the analytic null between two trained models carries (``lens-bias lineage-negatives``
measures its false-positive rate there)."""


def caveats(result: "SeedPrintResult", both_trained: bool) -> str | None:
    """What a "related" verdict cannot tell: :data:`CONVERGENCE` after an activation-fitted map, :data:`TRAINED`
    from the analytic null between two trained models unless their tables were asked too (``compare``'s default);
    None for an "unrelated" verdict or where neither applies."""
    if not result.same_lineage:
        return None
    analytic = (result.null_settings or {}).get("kind") == "analytic"
    found = [CONVERGENCE] if result.align not in (None, "auto") else []
    found += [TRAINED] if both_trained and analytic and not result.tables_asked else []
    return "; ".join(found) or None


COMPARE = LineageSettings()
""":func:`compare`'s test when none is given (``LineageSettings()``, ``align="auto"``): the token and basis maps read
from the weights, then the published test (exactly it, to the same p, where nothing was renamed or rotated); between
two trained models the verdict also asks their embedding tables to agree beyond chance
(:mod:`~lens_bias.seedprint.tables`)."""

PUBLISHED = LineageSettings(align=None)
""":func:`lineage_test`'s test when none is given: the published test, on the features as they are."""


def lineage_test(a: FeaturesLike, b: FeaturesLike, settings: LineageSettings | None = None, *, progress: bool = False, **overrides: Any) -> SeedPrintResult:
    """Do ``a`` and ``b`` share an initialisation? The SeedPrint distribution-correlation test.

    The null (``settings.null``) is ``AnalyticNull()`` (closed form; ``aggregate=True`` adds the aggregate signal),
    ``EmpiricalNull(n_trials, test_type)`` (random N(0, I) features through the whole pipeline) or
    ``SeedsNull(factory | fingerprints, label)`` (other models on the same inputs: fresh random inits of the base
    architecture by default). With an ``align`` mode, a map from ``b``'s features to ``a``'s basis is fitted on the
    first ``fit_fraction`` of the inputs and the test runs on the rest (:mod:`lens_bias.seedprint.align` says
    which reparametrisations each mode covers); judge it against a null aligned the same way: ``SeedsNull`` and
    ``EmpiricalNull`` run the alignment on their own models.

    Args:
        a: the base model's :class:`~lens_bias.seedprint.Fingerprint`, or a float ``[N, D]`` array/tensor.
        b: the suspect's, on the same inputs in the same order.
        settings: :class:`LineageSettings` (default :data:`PUBLISHED`, the papers' test). Its ``align="auto"``
            (the settings' default, :func:`compare`'s test) needs the models: here it runs the published test, and warns.
        progress: progress bars while a seeds null fingerprints its fresh inits.
        **overrides: fields of :class:`LineageSettings` (``m=32``), which replace those of ``settings``.

    Returns:
        A :class:`SeedPrintResult`; ``same_lineage`` is ``p < alpha``; ``null`` is the null's label and
        ``null_settings`` its ``to_dict()``.
    """
    s = overridden(LineageSettings, settings if settings is not None else PUBLISHED, overrides, "lineage_test()")
    if s.align == "auto" and "align" not in overrides:  # the settings' default, not asked for here: said, then the published test
        warnings.warn("lineage_test reads features only, and align='auto' (LineageSettings' default, compare's test) reads the two models' "
                      "weights: running the published test (align=None); pass align=None to say so, or call compare(model_a, model_b)", stacklevel=2)
        s = replace(s, align=None)
    null, full_a, full_b, fit_rows, m = _checked(s, a, b)
    align = s.align
    assert align != "auto"  # check_align (in _checked) refused it: its maps need the models
    n, mode, temperature = full_a.shape[0] - fit_rows, s.mode, s.temperature
    null.check(a, n)

    fa, fb = split_and_align(align, fit_rows, full_a, full_b)
    core = tau_statistic(fa, fb, m, mode, temperature)
    case = Case(a=a, b=b, fa=fa, fb=fb, m=m, mode=mode, temperature=temperature, statistic=core, progress=progress, full_a=full_a, align=align,
                fit_rows=fit_rows)
    dims = core.dims
    if core.k < 2:  # no test: p = 1, and the result says why
        reason: str | None = ("no identity dimensions in common" if dims.numel() == 0
                              else "one identity dimension: the softmax over it is constant and τ is undefined" if dims.numel() == 1
                              else "fewer than two identity dimensions with a defined τ")
        log_p, z, details = 0.0, float("nan"), {}
    else:
        judgement = null.judge(case)
        reason, log_p, z, details = None, judgement.log_p, judgement.z, judgement.details
    result = SeedPrintResult(
        p=math.exp(log_p), log10_p=log_p / math.log(10), tau_bar=core.tau_bar, z=z, k=core.k, n=n, m=m, mode=mode, temperature=temperature,
        null=null.label, alpha=s.alpha, identity_dims=dims.tolist(), taus=core.taus.float(), means_a=fa[:, dims].mean(0), means_b=fb[:, dims].mean(0),
        null_settings=null.to_dict(), reason=reason, null_details=details, align=align, fit_rows=fit_rows,
    )
    return replace(result, caveat=caveats(result, all(isinstance(x, Fingerprint) and x.model.regime == "trained" for x in (a, b))))


def _checked(s: LineageSettings, a: FeaturesLike, b: FeaturesLike) -> tuple[Null, Tensor, Tensor, int, int]:
    """The null, both feature matrices, the rows an alignment is fitted on and m, or a refusal of the settings."""
    null = AnalyticNull() if s.null is None else s.null
    if not isinstance(null, Null):
        raise LensBiasError(
            f"null must be AnalyticNull(), EmpiricalNull(...) or SeedsNull(...) from lens_bias.seedprint, got {null!r}"
            + (f"; for {null!r} use lens_bias.seedprint.null_named({null!r})" if isinstance(null, str) else "")
        )
    if s.mode not in MODES:
        raise LensBiasError(f"mode must be one of {MODES}, got {s.mode!r}")
    check_align(s.align)
    full_a, full_b = as_features(a, "a", s.align), as_features(b, "b", s.align)
    check_compatible(a, b, full_a, full_b)
    rows = full_a.shape[0]
    fit_rows = int(s.fit_fraction * rows) if s.align is not None else 0
    if s.align is not None and not 3 <= fit_rows <= rows - 3:
        raise LensBiasError(f"fit_fraction {s.fit_fraction} of {rows} inputs leaves {fit_rows} rows to fit and {rows - fit_rows} to test; both need at least 3")
    if rows - fit_rows < 3:
        raise LensBiasError(f"need at least 3 inputs, got {rows - fit_rows}")
    d = full_a.shape[1]
    m = int(s.ratio_k * d) if s.m is None else s.m
    if not 1 <= m <= d:
        raise LensBiasError(f"m must be in [1, D={d}], got {m} (with m=None it is ⌊ratio_k·D⌋)")
    return null, full_a, full_b, fit_rows, m
