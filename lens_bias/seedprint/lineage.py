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
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, Mapping

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import RandomTokens
from lens_bias.core.settings import overridden, route_keywords
from lens_bias.seedprint.align import FIT_FRACTION, AlignMode, check_align, split_and_align
from lens_bias.seedprint.correspondence import BasisMap, Embedding, TokenMap, basis_map, token_map
from lens_bias.seedprint.fingerprints import (
    FeaturesLike,
    Fingerprint,
    FingerprintSettings,
    as_features,
    check_compatible,
    fingerprint,
    regenerate_inputs,
)
from lens_bias.seedprint.nulls import NULLS, AnalyticNull, Case, Null
from lens_bias.seedprint.statistic import MODES, tau_statistic
from lens_bias.seedprint.tables import TableAgreement, table_agreement
from lens_bias.seedprint.vocabulary import renamed_tokens

__all__ = ["SeedPrintResult", "LineageSettings", "Maps", "lineage_test", "compare", "auto_test", "through_maps", "mapped_inputs", "mapped_test", "fingerprint_like", "ALPHA", "STRONG", "COMPARE"]

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
    """How two fingerprints are tested: the identity dimensions, the statistic, the null and the level.

    >>> LineageSettings(align="orthogonal").fit_fraction
    0.5
    """

    m: int | None = None  # identity dimensions per model (None: ⌊ratio_k · D⌋; at small D use about D/2)
    ratio_k: float = 0.10  # m as a share of D when m is None: the papers' 0.1
    mode: str = "coset"  # "coset": both models' identity dims, intersected (the papers'); "base": the base's only
    temperature: float = 10.0  # softmax temperature over the identity dims: the papers'
    # what τ̄ is judged against (None: the analytic null; pairwise_lineage with an alignment: a seeds null aligned alike)
    null: Null | None = None
    alpha: float = ALPHA  # significance level of the verdict: the papers'
    # None: the published test; else the map fitted on the activations before it (lens_bias.seedprint.align); "auto"
    # (compare only): the token and basis maps read from the two models' tokenizers and weights (correspondence)
    align: AlignMode | Literal["auto"] = None
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


COMPARE = LineageSettings(align="auto")
""":func:`compare`'s test when none is given: the token and basis maps read from the weights, then the published test
(exactly it, to the same p, where nothing was renamed or rotated); between two trained models the verdict also asks
their embedding tables to agree beyond chance (:mod:`~lens_bias.seedprint.tables`)."""


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
        settings: :class:`LineageSettings` (the papers' defaults).
        progress: progress bars while a seeds null fingerprints its fresh inits.
        **overrides: fields of :class:`LineageSettings` (``m=32``), which replace those of ``settings``.

    Returns:
        A :class:`SeedPrintResult`; ``same_lineage`` is ``p < alpha``; ``null`` is the null's label and
        ``null_settings`` its ``to_dict()``.
    """
    s = overridden(LineageSettings, settings, overrides, "lineage_test()")
    align = s.align
    if align == "auto":
        raise LensBiasError("align='auto' reads the two models' tokenizers and weights, which features do not hold: call compare(model_a, model_b, align='auto')")
    null, full_a, full_b, fit_rows, m = _checked(s, a, b)
    n, mode, temperature = full_a.shape[0] - fit_rows, s.mode, s.temperature
    null.check(a, n)

    fa, fb = split_and_align(align, fit_rows, full_a, full_b)
    core = tau_statistic(fa, fb, m, mode, temperature)
    case = Case(a=a, b=b, fa=fa, fb=fb, m=m, mode=mode, temperature=temperature, statistic=core, progress=progress, full_a=full_a, align=align,
                fit_rows=fit_rows)
    dims = core.dims
    result = SeedPrintResult(
        p=1.0, log10_p=0.0, tau_bar=core.tau_bar, z=float("nan"), k=core.k, n=n, m=m, mode=mode, temperature=temperature,
        null=null.label, alpha=s.alpha, identity_dims=dims.tolist(), taus=core.taus.float(),
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
    result.caveat = caveats(result, all(isinstance(x, Fingerprint) and x.model.get("regime") == "trained" for x in (a, b)))
    return result


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


def compare(
    model_a: Any, model_b: Any, settings: FingerprintSettings | None = None, test: LineageSettings | None = None, *, progress: bool = True,
    **overrides: Any,
) -> SeedPrintResult:
    """Fingerprint both models on the same random inputs and :func:`lineage_test` them (``a`` is the base).

    By default (:data:`COMPARE`, ``align="auto"``) the suspect's token map and residual basis map are read from the
    two models' tokenizers and weights (:mod:`~lens_bias.seedprint.correspondence`), so a descendant whose
    vocabulary was renamed and whose basis was permuted or rotated is tested in the base's terms; where nothing was
    renamed or rotated this is the published test, to the same p. Between two trained models, whose unrelated pairs
    the analytic null does not hold for, the default's "related" also needs their embedding tables to agree beyond
    chance (``tables``, :func:`~lens_bias.seedprint.tables.table_agreement`); p stays the published test's.
    ``align=None`` runs the published test as it is.
    Token IDs are drawn below the smaller of the two vocabularies unless ``vocab`` is given. When ``b``'s vocabulary
    is ``a``'s renamed (its embedding rows are ``a``'s in another order:
    :func:`~lens_bias.seedprint.vocabulary.renamed_tokens`), ``b`` reads the same tokens under their new IDs, so a
    renaming, which leaves the model the same on text, cannot hide it; ``renamed_vocabulary`` says so. Models of
    different widths cannot share an init and are refused.

    Args:
        model_a: the base.
        model_b: the suspect.
        settings: how both are fingerprinted (:class:`~lens_bias.seedprint.FingerprintSettings`).
        test: how they are tested (:class:`LineageSettings`; default :data:`COMPARE`).
        progress: progress bars.
        **overrides: fields of either settings class (``n=512, m=32``), which replace theirs.

    Returns:
        A :class:`SeedPrintResult`.
    """
    routed = route_keywords(overrides, {"settings": FingerprintSettings, "test": LineageSettings}, "compare()")
    prints = overridden(FingerprintSettings, settings, routed["settings"], "compare()")
    testing = overridden(LineageSettings, test if test is not None else COMPARE, routed["test"], "compare()")
    info_a, info_b = ModelAdapter(model_a).info, ModelAdapter(model_b).info
    if info_a.d_model != info_b.d_model:
        raise LensBiasError(f"different widths cannot share an init (d_model {info_a.d_model} vs {info_b.d_model}); SeedPrint compares models of one width")
    drawn_tokens = isinstance(prints.inputs, str) and prints.inputs == "tokens"
    if prints.vocab is None and drawn_tokens:
        prints = replace(prints, vocab=min(info_a.d_vocab, info_b.d_vocab))
    if testing.align == "auto":
        return auto_test(model_a, model_b, prints, testing, progress=progress)
    fp_a = fingerprint(model_a, prints, progress=progress)
    fp_b = fingerprint_like(model_b, model_a, fp_a, prints, progress=progress) if drawn_tokens else fingerprint(model_b, prints, progress=progress)
    result = replace(lineage_test(fp_a, fp_b, testing, progress=progress), renamed_vocabulary=bool(fp_b.inputs.get("renamed")))
    return replace(result, caveat=caveats(result, info_a.regime == info_b.regime == "trained"))


def auto_test(
    model_a: Any, model_b: Any, prints: FingerprintSettings, test: LineageSettings, *, maps: "Maps | None" = None,
    made: tuple[Fingerprint | None, Fingerprint | None] = (None, None), progress: bool = False,
) -> SeedPrintResult:
    """:func:`compare`'s default test (``align="auto"``) of two models: the suspect reads the base's tokens under its
    own IDs and its features are mapped into the base's basis, both maps read from the weights (:class:`Maps`); where
    neither changes anything, this is the published test, to the same p. Between two trained models the verdict also
    asks their embedding tables to agree (``tables_asked``).

    Args:
        model_a: the base.
        model_b: the suspect.
        prints: how both are fingerprinted (drawn token inputs).
        test: the test (its ``align`` is ignored: the test after the maps is the published one).
        maps: :meth:`Maps.read` of the two models, where already read.
        made: the two models' fingerprints on ``prints``' own inputs, where already made: reused wherever the maps
            leave a model's inputs as they are.
        progress: progress bars.

    Returns:
        A :class:`SeedPrintResult` with the maps recorded.
    """
    if prints.inputs != "tokens":
        raise LensBiasError("align='auto' draws token inputs (inputs='tokens'): the token map is what it reads through")
    maps = Maps.read(model_a, model_b) if maps is None else maps
    inputs = mapped_inputs(maps, prints)
    reads: list[Tensor | None] = [None, None] if inputs is None else list(inputs)
    fp_a, fp_b = (_reused(fp, model, prints, read, progress) for model, read, fp in zip((model_a, model_b), reads, made))
    return through_maps(maps, fp_a, fp_b, test, ModelAdapter(model_a).info.regime == ModelAdapter(model_b).info.regime == "trained")


def through_maps(maps: "Maps", fp_a: Fingerprint, fp_b: Fingerprint, test: LineageSettings, both_trained: bool) -> SeedPrintResult:
    """The published ``test`` of two fingerprints made on the inputs :func:`mapped_inputs` gives (their own where it
    gives None), the suspect's features mapped by ``maps.basis``; the verdict asks the tables where ``both_trained``.

    Args:
        maps: :meth:`Maps.read` of the two models.
        fp_a: the base's fingerprint.
        fp_b: the suspect's.
        test: the test (its ``align`` is ignored).
        both_trained: whether both models are trained (the tables are asked, and :func:`caveats` read it).

    Returns:
        A :class:`SeedPrintResult` with the maps recorded.
    """
    published = replace(test, align=None)
    result = mapped_test(fp_a, fp_b, maps.basis, published) if not maps.nothing_to_map else lineage_test(fp_a, fp_b, published)
    result = replace(maps.recorded(result), tables_asked=both_trained)
    return replace(result, caveat=caveats(result, both_trained))


def _reused(fp: Fingerprint | None, model: Any, prints: FingerprintSettings, tokens: Tensor | None, progress: bool) -> Fingerprint:
    """``fp`` where it was made on ``tokens`` (None: on ``prints``' own drawn inputs), else ``model``'s fingerprint on them."""
    if fp is not None:
        drawn = regenerate_inputs(fp) if fp.inputs.get("seed") is not None else None
        if tokens is None or (isinstance(drawn, RandomTokens) and torch.equal(tokens, drawn.tensor())):
            return fp
    return fingerprint(model, prints, progress=progress) if tokens is None else fingerprint(model, prints, inputs=tokens, progress=progress)


@dataclass(frozen=True)
class Maps:
    """What ``align="auto"`` reads from two models' weights before it tests (:mod:`~lens_bias.seedprint.correspondence`):
    the suspect's ID of each base token, the map from its residual basis to the base's, and how far the two embedding
    tables agree once mapped (:mod:`~lens_bias.seedprint.tables`)."""

    tokens: TokenMap
    basis: BasisMap
    tables: TableAgreement

    @classmethod
    def read(cls, base: Any, suspect: Any) -> "Maps":
        """The maps between two models (each a model or its :class:`~lens_bias.seedprint.correspondence.Embedding`)."""
        base, suspect = Embedding.of(base), Embedding.of(suspect)  # read once: the three maps share them
        tokens = token_map(base, suspect)
        basis = basis_map(base, suspect, tokens)
        return cls(tokens, basis, table_agreement(base, suspect, tokens, basis))

    @property
    def nothing_to_map(self) -> bool:
        """Whether every token keeps its ID and no basis map was fitted: the published test is the test."""
        return self.tokens.source in ("same", "none") and self.basis.kind in ("identity", "none")

    def recorded(self, result: SeedPrintResult) -> SeedPrintResult:
        """``result`` with the maps it was tested through."""
        return replace(result, renamed_vocabulary=self.tokens.renamed, token_source=self.tokens.source, basis_map=self.basis.kind,
                       basis_fit=self.basis.residual, tables=self.tables)


def mapped_inputs(maps: Maps, prints: FingerprintSettings) -> tuple[Tensor, Tensor] | None:
    """The token inputs of the base and of the suspect when the token map changes them: the base's tokens the suspect
    has, drawn as ``prints`` draws, and the same tokens under the suspect's IDs; None when both read ``prints``' own.

    Args:
        maps: :meth:`Maps.read` of the two models.
        prints: how both are fingerprinted (drawn tokens; ``vocab`` None: every token the base has).

    Returns:
        ``(inputs_a, inputs_b)``, two ``[n, seq_len]`` token tensors, or None.
    """
    tokens = maps.tokens
    vocab = prints.vocab if prints.vocab is not None else len(tokens.ids)
    if not tokens.renamed and not bool((tokens.ids[:vocab] < 0).any()):
        return None
    shared = tokens.shared
    drawn = shared[RandomTokens(prints.n, prints.seq_len, len(shared), prints.seed).tensor()]
    return drawn, tokens.ids[drawn]


def mapped_test(fp_a: Fingerprint, fp_b: Fingerprint, basis: BasisMap, test: LineageSettings) -> SeedPrintResult:
    """``test`` (an unaligned one) of the suspect's features mapped into the base's basis by ``basis``; both
    fingerprints made on the inputs :func:`mapped_inputs` gives.

    Args:
        fp_a: the base's fingerprint.
        fp_b: the suspect's, on the same tokens (under its own IDs).
        basis: the suspect's basis map (:func:`~lens_bias.seedprint.correspondence.basis_map`).
        test: the test.

    Returns:
        A :class:`SeedPrintResult` (without the maps: :meth:`Maps.recorded` adds them).
    """
    if basis.kind in ("identity", "none"):
        return lineage_test(fp_a.features, fp_b.features, test)
    # the map holds before the final norm's gain, which a rotated basis folds into the unembedding
    read_a = fp_a.normalized if fp_a.normalized is not None else fp_a.features
    read_b = fp_b.normalized if fp_b.normalized is not None else fp_b.features
    return lineage_test(read_a, basis(read_b), test)


def fingerprint_like(
    model: Any, base_model: Any, base: Fingerprint, settings: FingerprintSettings | None = None, *, progress: bool = False
) -> Fingerprint:
    """``model``'s fingerprint on the random token inputs ``base`` (``base_model``'s) was made from; when ``model``'s
    vocabulary is ``base_model``'s renamed (:func:`~lens_bias.seedprint.vocabulary.renamed_tokens`), on the same
    tokens under their new IDs, recorded as ``inputs["renamed"] = True``.

    Args:
        model: the suspect.
        base_model: the model ``base`` was made from.
        base: a fingerprint on drawn token inputs.
        settings: the pass: ``batch_size``, ``device``, ``dtype`` and ``embed_std`` are read, the inputs are ``base``'s.
        progress: a progress bar.

    Returns:
        A fingerprint whose input record is ``base``'s (with ``renamed`` added when renamed).
    """
    record = base.inputs
    if record.get("kind") != "tokens" or record.get("seed") is None:
        raise LensBiasError("fingerprint_like reads a fingerprint made on drawn token inputs (inputs='tokens')")
    tokens = regenerate_inputs(base)[0:record["n"]]
    renamed = renamed_tokens(base_model, model, tokens)
    same = replace(settings or FingerprintSettings(), inputs="tokens", n=record["n"], seq_len=record["seq_len"], seed=record["seed"], vocab=record["vocab"])
    if renamed is None:
        return fingerprint(model, same, progress=progress)
    return replace(fingerprint(model, same, progress=progress, inputs=renamed), inputs={**record, "renamed": True})
