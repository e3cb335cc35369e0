"""The nulls a lineage test judges τ̄ against, as named objects: ``lineage_test(a, b, null=SeedsNull())``.

| null | what p is measured against |
|---|---|
| :class:`AnalyticNull` | the closed form sd(τ̄) = sd(τ)/√k, p = min(1, 2·Φ̄(z)) |
| :class:`EmpiricalNull` | τ's of random N(0, I) features through the whole pipeline |
| :class:`SeedsNull` | τ̄ of the base against other models on the same inputs: fresh random inits of its architecture, or any fingerprints you pass (e.g. models trained on the same data from other seeds, a data-matched null) |

Each is a frozen dataclass with a ``kind`` (its name: subclassing with a ``kind`` registers the class in
``NULLS``, which the CLI's ``--null`` choices, :func:`null_named`, :meth:`Null.from_dict` and
:func:`~lens_bias.seedprint.calibrate` read) and a ``label`` (what results and tables call it). A null returns a
:class:`Judgement`: the log p, the z it was judged at, and its own details, which a
:class:`~lens_bias.seedprint.SeedPrintResult` keeps in ``null_details``. ``to_dict`` is what a result records of
the null, and :meth:`Null.from_dict` reads it back.

>>> SeedsNull(n_null=5, label="fresh inits").to_dict()
{'kind': 'seeds', 'label': 'fresh inits', 'n_null': 5, 'seed': 0, 'source': 'recorded spec', 'n_fingerprints': None}
>>> Null.from_dict(EmpiricalNull(n_trials=4).to_dict())
EmpiricalNull(n_trials=4, test_type='t-test', seed=0, label='empirical')
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, ClassVar, Sequence

import numpy as np
import torch
from jaxtyping import Float
from scipy.stats import mannwhitneyu, ttest_ind
from scipy.stats import t as student_t
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.core import memory
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.registry import Registry
from lens_bias.core.stats import kendall_tau_b
from lens_bias.models import ModelSpec, random_init, redraw
from lens_bias.seedprint import align
from lens_bias.seedprint.align import AlignMode
from lens_bias.seedprint.fingerprints import (
    FeaturesLike,
    Fingerprint,
    as_features,
    check_compatible,
    fingerprint,
    regenerate_inputs,
)
from lens_bias.seedprint.statistic import (
    TauStatistic,
    log_p_scaled_sf,
    tau_null_sd,
    tau_statistic,
)

__all__ = ["Null", "AnalyticNull", "EmpiricalNull", "SeedsNull", "NULLS", "Case", "Judgement", "null_named", "seed_null_fingerprints"]

# Depth up to which the shared residual path makes the analytic null unsafe with embedding inputs (calibration:
# unrelated llama-style seeds reach p ≈ 1e-60 at 4 layers and p < 0.01 at 12 layers of width 128).
_SHALLOW_LAYERS = 12
TEST_TYPES = ("t-test", "welch", "u-test")

# Null kind -> its class; subclassing Null with a ``kind`` adds it.
NULLS: Registry[type["Null"]] = Registry("null")


@dataclass(frozen=True)
class Case:
    """What a null judges: the two inputs as given, their features, the statistic on them, and the test's settings.

    With an alignment the first ``fit_rows`` rows fit the map from the suspect's basis to the base's and the
    statistic is taken on the rest: ``fa`` and ``fb`` are those test rows, ``fb`` aligned; :meth:`statistic_of`
    runs the same split, fit and statistic on any other pair of feature matrices (a null's models, random ones).
    """

    a: FeaturesLike
    b: FeaturesLike
    fa: Float[Tensor, "n d"]  # the base's features on the test rows
    fb: Float[Tensor, "n d"]  # the suspect's, aligned to the base's basis
    m: int
    mode: str
    temperature: float
    statistic: TauStatistic
    progress: bool
    full_a: Float[Tensor, "n_all d"]  # every row of the base's features
    align: AlignMode = None
    fit_rows: int = 0

    def split_align(self, x: Float[Tensor, "n_all d"], y: Float[Tensor, "n_all d"]) -> tuple[Tensor, Tensor]:
        """``x`` and ``y`` on the test rows, ``y`` aligned to ``x``'s basis on the fit rows."""
        return align.split_and_align(self.align, self.fit_rows, x, y)

    def statistic_of(self, x: Float[Tensor, "n_all d"], y: Float[Tensor, "n_all d"]) -> TauStatistic:
        """The test's statistic of another pair, by the same split, alignment and identity dims."""
        return tau_statistic(*self.split_align(x, y), self.m, self.mode, self.temperature)

    def tau_bar_against(self, other: Float[Tensor, "n_all d"]) -> float:
        """τ̄ of the base against another model's features on the same inputs, by the same pipeline."""
        return self.statistic_of(self.full_a, other).tau_bar


@dataclass(frozen=True)
class Judgement:
    """A null's verdict on a case: natural log of p, the z it was judged at, and the null's own details."""

    log_p: float
    z: float
    details: dict[str, Any] = field(default_factory=dict)


class Null:
    """A null distribution of the lineage test (the base of :class:`AnalyticNull`, :class:`EmpiricalNull`, :class:`SeedsNull`).

    A subclass is a frozen dataclass with a ``kind`` (which registers it) and a ``label`` field, and implements
    :meth:`judge`; :meth:`check` may warn or refuse before the statistic is computed, and :meth:`note` names the
    details a result's one-line summary shows.
    """

    kind: ClassVar[str]
    label: str

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            NULLS.add(cls.kind, cls)

    def to_dict(self) -> dict[str, Any]:
        """The null's settings as plain values (what a result records)."""
        return {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}  # type: ignore[arg-type]  # every Null is a dataclass

    @classmethod
    def from_dict(cls, d: dict[str, Any], **objects: Any) -> "Null":
        """The null that ``to_dict`` recorded; ``objects`` supply what a dict cannot hold (``SeedsNull``'s factory or fingerprints)."""
        settings = dict(d)
        kind = settings.pop("kind", None)
        if kind not in NULLS or cls not in (Null, NULLS[kind]):
            raise LensBiasError(f"not a recorded {cls.__name__}: kind {kind!r} (expected one of {NULLS.names()})")
        return NULLS[kind].from_settings(settings, objects)

    @classmethod
    def from_settings(cls, settings: dict[str, Any], objects: dict[str, Any]) -> "Null":
        """The null of these recorded settings (``to_dict`` without its kind) and objects."""
        return cls(**settings, **objects)

    def check(self, a: FeaturesLike, n: int) -> None:
        """Warnings or refusals before the statistic is computed (none by default)."""

    def judge(self, case: Case) -> Judgement:
        """p (as its natural log) of the case's τ̄ under this null."""
        raise NotImplementedError

    @classmethod
    def note(cls, details: dict[str, Any]) -> str:
        """What a result's one-line summary adds of this null's details (nothing by default)."""
        return ""

    def fresh_inits_needed(self) -> int:
        """How many fingerprints of fresh random inits :func:`~lens_bias.seedprint.calibrate` must make for this null."""
        return 0

    def with_fresh_inits(self, prints: Sequence[Fingerprint]) -> "Null":
        """This null judging against those fresh inits' fingerprints (calibration shares them across pairs)."""
        return self


@dataclass(frozen=True)
class AnalyticNull(Null):
    """sd(τ̄) = √(2(2n+5)/(9n(n−1)))/√k and p = min(1, 2·Φ̄(z)); with ``aggregate`` also the aggregate signal
    (Kendall τ of the identity dims' row means), p = min(1, 4·Φ̄(max(z, z_agg))).

    Unsafe for small models with embedding inputs (the shared residual path) and for N > V/4 token inputs
    (repeated last tokens): the lineage test warns there.
    """

    aggregate: bool = False
    label: str = "analytic"
    kind: ClassVar[str] = "analytic"

    def check(self, a: FeaturesLike, n: int) -> None:
        if not isinstance(a, Fingerprint):
            return
        kind, layers = a.inputs.kind, a.model.n_layers
        if kind == "embeddings" and layers <= _SHALLOW_LAYERS:
            warnings.warn(
                f"the analytic null is unsafe for embedding inputs on a {layers}-layer model: the shared residual path "
                "makes unrelated seeds look related. Use null=SeedsNull() (or check with lens_bias.seedprint.calibrate)",
                stacklevel=3,
            )
        vocab = a.inputs.vocab
        if kind == "tokens" and vocab and n > vocab / 4:
            warnings.warn(
                f"the analytic null is unsafe with N={n} token inputs over a vocabulary of {vocab} (N > V/4): repeated "
                "last tokens shrink the effective sample size. Use null=SeedsNull() or more vocabulary",
                stacklevel=3,
            )

    def judge(self, case: Case) -> Judgement:
        stat = case.statistic
        n = case.fa.shape[0]
        sd = tau_null_sd(n)
        z = stat.tau_bar / (sd / math.sqrt(stat.k))
        if not self.aggregate:
            return Judgement(log_p_scaled_sf(z, 2.0), z)
        dims = stat.dims
        agg = kendall_tau_b(case.fa[:, dims].mean(1, keepdim=True), case.fb[:, dims].mean(1, keepdim=True))[0].item()
        return Judgement(log_p_scaled_sf(max(z, agg / sd), 4.0), z, {"tau_agg": agg, "z_agg": agg / sd})


@dataclass(frozen=True)
class EmpiricalNull(Null):
    """``n_trials`` pairs of random N(0, I) features (generator seeded with ``seed``) through the whole pipeline;
    the real τ's against the pooled null τ's by a one-sided ``test_type``: "t-test" (Student), "welch" or
    "u-test" (Mann-Whitney)."""

    n_trials: int = 10
    test_type: str = "t-test"
    seed: int = 0
    label: str = "empirical"
    kind: ClassVar[str] = "empirical"

    def __post_init__(self) -> None:
        if self.test_type not in TEST_TYPES:
            raise LensBiasError(f"test_type must be 't-test', 'welch' or 'u-test', got {self.test_type!r}")
        if isinstance(self.n_trials, bool) or not isinstance(self.n_trials, int) or self.n_trials < 1:
            raise LensBiasError(f"n_trials must be an int >= 1, got {self.n_trials!r}")

    def judge(self, case: Case) -> Judgement:
        generator = torch.Generator().manual_seed(self.seed)
        shape = tuple(case.full_a.shape)
        # the pooled τ of every trial are kept for the test: k float64 values a trial
        memory.check_held(f"the empirical null's {self.n_trials} trials", self.n_trials, 8 * max(1, case.statistic.k), "n_trials", "m")
        pooled = []
        for _ in tqdm(range(self.n_trials), desc="empirical null", disable=not case.progress):  # random features through the whole pipeline, the alignment included
            ra, rb = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)
            taus = case.statistic_of(ra, rb).taus
            pooled.append(taus[~torch.isnan(taus)])
        null_taus = torch.cat(pooled).numpy()
        stat = case.statistic
        real = stat.taus[~torch.isnan(stat.taus)].numpy()
        mean, std = float(null_taus.mean()), float(null_taus.std())
        z = (stat.tau_bar - mean) / (std / math.sqrt(stat.k))
        if self.test_type == "u-test":
            p = mannwhitneyu(real, null_taus, alternative="greater").pvalue
        else:
            p = ttest_ind(real, null_taus, alternative="greater", equal_var=self.test_type == "t-test").pvalue
        return Judgement(math.log(max(float(p), 1e-300)), z, {"null_taus_mean": mean, "null_taus_std": std})


@dataclass(frozen=True)
class SeedsNull(Null):
    """τ̄ of the base against the base vs each of K other models on the same inputs: a normal fit (Student-t
    predictive) for the verdict, the rank p beside it.

    The other models are ``fingerprints`` when given (any fingerprints of the base's inputs: models trained on
    the same data from other init seeds make a data-matched null), else ``n_null`` fresh inits from ``factory``
    (``seed -> model``), else from the base fingerprint's recorded spec; fresh inits use init seeds from
    1,000,000 + ``seed`` on, skipping the seeds of the two models tested.
    """

    factory: Callable[[int], Any] | None = field(default=None, repr=False)
    fingerprints: Sequence[Fingerprint] | None = field(default=None, repr=False)
    n_null: int = 20
    seed: int = 0
    label: str = "seeds"
    kind: ClassVar[str] = "seeds"

    def __post_init__(self) -> None:
        if self.factory is not None and self.fingerprints is not None:
            raise LensBiasError("SeedsNull takes a factory (fresh inits) or precomputed fingerprints, not both")
        if self.fingerprints is not None:
            prints = tuple(self.fingerprints)
            if not all(isinstance(f, Fingerprint) for f in prints):
                raise WrongType("SeedsNull(fingerprints=...) takes Fingerprint objects (lens_bias.seedprint.fingerprint)")
            object.__setattr__(self, "fingerprints", prints)  # frozen: a tuple, so the null cannot change under a result
        elif self.n_null < 3:
            raise LensBiasError(f"the seeds null needs n_null >= 3 fresh inits, got {self.n_null}")

    @property
    def source(self) -> str:
        """Where the null's models come from: "fingerprints", "factory" or "recorded spec"."""
        return "fingerprints" if self.fingerprints is not None else "factory" if self.factory is not None else "recorded spec"

    def to_dict(self) -> dict[str, Any]:
        """Settings only: a factory and fingerprints are objects, recorded as their source and count."""
        count = len(self.fingerprints) if self.fingerprints is not None else None
        return {"kind": self.kind, "label": self.label, "n_null": self.n_null, "seed": self.seed, "source": self.source, "n_fingerprints": count}

    @classmethod
    def from_settings(cls, settings: dict[str, Any], objects: dict[str, Any]) -> "Null":
        source = settings.pop("source", "recorded spec")
        settings.pop("n_fingerprints", None)
        wanted = {"fingerprints": "fingerprints", "factory": "factory"}.get(source)
        if wanted and wanted not in objects:
            raise LensBiasError(f"this seeds null used a {wanted} that a dict cannot hold; pass it again: Null.from_dict(d, {wanted}=...)")
        return cls(**settings, **objects)

    def fresh_inits_needed(self) -> int:
        return self.n_null if self.source == "recorded spec" else 0

    def with_fresh_inits(self, prints: Sequence[Fingerprint]) -> "Null":
        return replace(self, fingerprints=prints[: self.n_null]) if self.source == "recorded spec" else self

    @classmethod
    def note(cls, details: dict[str, Any]) -> str:
        return f", rank p {details['p_rank']:.3g}"

    def judge(self, case: Case) -> Judgement:
        prints = self.fingerprints
        if prints is None:
            if not isinstance(case.a, Fingerprint):
                raise LensBiasError("SeedsNull() needs the base as a Fingerprint (to regenerate its inputs), or SeedsNull(fingerprints=...)")
            avoid = sorted({f.spec["seed"] for f in (case.a, case.b) if isinstance(f, Fingerprint) and f.spec})
            prints = seed_null_fingerprints(case.a, n_null=self.n_null, factory=self.factory, first_seed=1_000_000 + self.seed, avoid=avoid, progress=case.progress)
        null = []
        for other in prints:
            features = as_features(other, "a seeds-null fingerprint", case.align)
            check_compatible(case.a, other, case.full_a, features)
            tau = case.tau_bar_against(features)
            if not math.isnan(tau):
                null.append(tau)
        if len(null) < 3:
            raise LensBiasError(f"only {len(null)} null fingerprints gave a defined τ̄; need at least 3")
        k, tau_bar = len(null), case.statistic.tau_bar
        mean, sd = float(np.mean(null)), float(np.std(null, ddof=1))
        z = (tau_bar - mean) / sd
        p_rank = (1 + sum(x >= tau_bar for x in null)) / (k + 1)
        # A new draw from a normal null with estimated mean and sd is Student-t with k-1 degrees of freedom after
        # scaling by √(1 + 1/k): the exact "normal fit" p for k fresh inits.
        return Judgement(float(student_t.logsf(z / math.sqrt(1 + 1 / k), k - 1)), z, {"null_tau_bars": null, "p_rank": p_rank})


def null_named(name: str, **settings: Any) -> Null:
    """The null whose ``kind`` is ``name`` (as the CLI spells them: one of ``NULLS``) with ``settings``.

    >>> null_named("seeds", n_null=5)
    SeedsNull(n_null=5, seed=0, label='seeds')
    """
    if name not in NULLS:
        raise LensBiasError(f"null must be one of {NULLS.names()}, got {name!r}")
    return NULLS[name](**settings)


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

    Compute them once to share one seeds null between tests: ``SeedsNull(fingerprints=seed_null_fingerprints(base))``.

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
            raise LensBiasError("the base model was not built by lens_bias, so its architecture cannot be rebuilt; pass SeedsNull(factory=lambda seed: ...)")
        spec = ModelSpec.from_dict(base.spec)
        built: list[Any] = []

        def factory(seed: int) -> Any:  # one model, re-drawn per seed: building a bridge costs more than its weights
            if not built:
                built.append(random_init(replace(spec, seed=seed)))
            return redraw(built[0], seed)
    memory.check_held(f"the seeds null's {n_null} fingerprints", n_null, base.features.numel() * (4 if base.normalized is None else 8), "n_null", "the base's inputs (n)")
    data = regenerate_inputs(base)
    seeds = [s for s in range(first_seed, first_seed + n_null + len(avoid)) if s not in avoid][:n_null]
    prints = []
    for seed in tqdm(seeds, desc="seeds null", disable=not progress):
        made = fingerprint(factory(seed), inputs=data, progress=False)
        prints.append(replace(made, inputs=replace(base.inputs, digest=made.inputs.digest)))  # the base's record: the same inputs
    return prints
