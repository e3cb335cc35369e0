"""SeedPrint: tell whether two models share an initialisation, from the bias they were born with.

The algorithm is the SeedPrints camera-ready one (Tong et al., arXiv 2509.26404): the same N random inputs go
through both models (:func:`fingerprint`); the features are the final normalized hidden states at the last
position. :func:`lineage_test` picks the identity dimensions, takes Kendall's τ-b per dimension between the two
models and judges the mean τ̄ against a null: :class:`AnalyticNull` (the closed form), :class:`EmpiricalNull` or
:class:`SeedsNull` (every null registers itself in ``NULLS`` by its ``kind``).

For small models the analytic null is anti-conservative (shared residual path with embedding inputs, repeated
last tokens when N ≫ V): ``SeedsNull()`` judges τ̄ against fresh random inits of the base model's architecture
on the same inputs, which controls both by construction; :func:`calibrate` measures each null's false-positive
rate.

A suspect whose residual basis was permuted or rotated is aligned first (``lineage_test(..., align=...)``,
:mod:`~lens_bias.seedprint.align`); :func:`pairwise_lineage` tests many models at once and groups them into
families (:mod:`~lens_bias.seedprint.families`).

Modules: :mod:`~lens_bias.seedprint.fingerprints` (the features), :mod:`~lens_bias.seedprint.statistic` (identity
dimensions, τ̄), :mod:`~lens_bias.seedprint.align`, :mod:`~lens_bias.seedprint.nulls`,
:mod:`~lens_bias.seedprint.lineage` (the test), :mod:`~lens_bias.seedprint.comparison` (``compare`` and its default
test, ``align="auto"``), :mod:`~lens_bias.seedprint.correspondence` (the token and basis maps it reads),
:mod:`~lens_bias.seedprint.tables` (whether two embedding tables agree beyond chance,
which ``align="auto"`` asks between trained models), :mod:`~lens_bias.seedprint.families` (with its run of models,
:mod:`~lens_bias.seedprint.lineage_run`, its cache, :mod:`~lens_bias.seedprint.cache`, and the saved
:mod:`~lens_bias.seedprint.readings` its default test reads where the models are not at hand) and
:mod:`~lens_bias.seedprint.calibration`.

>>> import lens_bias
>>> small = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> a = fingerprint(lens_bias.random_init("gpt2", seed=1, **small), n=64, seq_len=16, progress=False)
>>> b = fingerprint(lens_bias.random_init("gpt2", seed=2, **small), n=64, seq_len=16, progress=False)
>>> result = lineage_test(a, b, m=32, null=EmpiricalNull(n_trials=2))
>>> result.k > 1, 0 <= result.p <= 1, result.null_settings["kind"]
(True, True, 'empirical')
"""

from lens_bias.seedprint.align import ALIGN_MODES
from lens_bias.seedprint.calibration import calibrate
from lens_bias.seedprint.comparison import compare, fingerprint_like
from lens_bias.seedprint.families import LineageMatrix, pairwise_lineage
from lens_bias.seedprint.fingerprints import (
    FeaturesLike,
    Fingerprint,
    InputRecord,
    FingerprintSettings,
    fingerprint,
    regenerate_inputs,
)
from lens_bias.seedprint.lineage import (
    ALPHA,
    COMPARE,
    PUBLISHED,
    STRONG,
    LineageSettings,
    SeedPrintResult,
    lineage_test,
)
from lens_bias.seedprint.nulls import (
    NULLS,
    AnalyticNull,
    EmpiricalNull,
    Null,
    SeedsNull,
    null_named,
    seed_null_fingerprints,
)
from lens_bias.seedprint.statistic import MODES, identity_dims, tau_null_sd

__all__ = [
    "Fingerprint", "InputRecord", "FingerprintSettings", "LineageSettings", "SeedPrintResult", "fingerprint", "lineage_test", "compare", "fingerprint_like", "calibrate", "identity_dims", "tau_null_sd",
    "seed_null_fingerprints", "regenerate_inputs", "Null", "AnalyticNull", "EmpiricalNull", "SeedsNull", "null_named", "NULLS", "MODES",
    "FeaturesLike", "ALPHA", "STRONG", "COMPARE", "PUBLISHED", "ALIGN_MODES", "pairwise_lineage", "LineageMatrix",
]
