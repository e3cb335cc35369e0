"""False-positive rates of the nulls on pairs of independent random inits (:func:`calibrate`)."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence, Union

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from lens_bias.core import memory
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.settings import overridden, route_keywords
from lens_bias.seedprint.align import AlignMode, check_align
from lens_bias.seedprint.fingerprints import Fingerprint, FingerprintSettings, fingerprint
from lens_bias.seedprint.lineage import PUBLISHED, LineageSettings, lineage_test
from lens_bias.seedprint.nulls import AnalyticNull, Null, SeedsNull

__all__ = ["calibrate", "CALIBRATION"]


CALIBRATION = FingerprintSettings(n=500, seq_len=32)
"""The fingerprints of :func:`calibrate` by default (every model of a calibration is fingerprinted)."""


def calibrate(
    factory: Callable[[int], Any],
    settings: FingerprintSettings | None = None,
    test: LineageSettings | None = None,
    *,
    kinds: Union[str, Sequence[str]] = ("tokens", "embeddings"),
    n_pairs: int = 100,
    nulls: Sequence[Null] = (AnalyticNull(), SeedsNull()),
    aligns: Sequence[AlignMode] = (None,),
    first_seed: int = 0,
    progress: bool = True,
    **overrides: Any,
) -> pd.DataFrame:
    """False-positive rate of each null on pairs of independent random inits of one architecture.

    Builds ``n_fresh + 2·n_pairs`` models with init seeds ``first_seed, first_seed + 1, ...``, fingerprints each
    once on the same inputs of every kind asked for, and tests every pair: any p < alpha is a false positive,
    since no two of these models share an initialisation. The first ``n_fresh`` models (the most any null asks
    for through ``Null.fresh_inits_needed``: a :class:`SeedsNull` without fingerprints or factory of its own asks
    for its ``n_null``) are the nulls' fresh inits, shared by every pair (``Null.with_fresh_inits``).

    Args:
        factory: ``seed -> model``, e.g. ``lambda s: lens_bias.random_init("llama", d_model=128, seed=s)``.
        settings: the fingerprints (default :data:`CALIBRATION`); each input kind replaces its ``inputs``.
        test: the test of every pair (:class:`~lens_bias.seedprint.LineageSettings`); its ``null`` and ``align``
            are those of ``nulls`` and ``aligns``.
        kinds: input kinds, "tokens", "embeddings" or both.
        n_pairs: independent model pairs.
        nulls: the nulls to calibrate (one row each per input kind, named by their label).
        aligns: the align modes to test each pair under (``None`` is the published test; see
            :mod:`lens_bias.seedprint.align`): an alignment that overfits shows here as a false-positive rate.
        first_seed: the first init seed.
        progress: a progress bar over models.
        **overrides: fields of either settings class (``n=64, m=32``), which replace theirs.

    Returns:
        One row per input kind, align mode and null: pairs, false positives, FPR, and the median τ̄ and log10 p.
    """
    routed = route_keywords(overrides, {"settings": FingerprintSettings, "test": LineageSettings}, "calibrate()")
    if "inputs" in routed["settings"]:
        raise LensBiasError("calibrate takes the input kinds as kinds=('tokens', 'embeddings'), not inputs=")
    if "align" in routed["test"] or "null" in routed["test"]:
        raise LensBiasError("calibrate takes aligns=[...] and nulls=[...] (every one is tested on the same fingerprints), not align= or null=")
    prints_with = overridden(FingerprintSettings, settings if settings is not None else CALIBRATION, routed["settings"], "calibrate()")
    testing = overridden(LineageSettings, test if test is not None else PUBLISHED, routed["test"], "calibrate()")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    if not all(isinstance(null, Null) for null in nulls):
        raise LensBiasError(f"nulls must be null objects such as (AnalyticNull(), SeedsNull()), got {list(nulls)!r}")
    # fresh inits are drawn here for the seeds nulls that bring no models of their own
    n_fresh = max((null.fresh_inits_needed() for null in nulls), default=0)
    prints: dict[str, list[Fingerprint]] = {kind: [] for kind in kinds}
    for align in aligns:  # before any model is fingerprinted
        check_align(align)
    if isinstance(n_pairs, bool) or not isinstance(n_pairs, int) or n_pairs < 1:
        raise LensBiasError(f"n_pairs must be a positive int, got {n_pairs!r}")
    for s in tqdm(range(first_seed, first_seed + n_fresh + 2 * n_pairs), desc="calibration models", disable=not progress):
        model = factory(s)
        if s == first_seed:  # every fingerprint is kept until the tests: refuse a count whose features cannot fit
            _check_kept(n_fresh + 2 * n_pairs, len(kinds) * prints_with.n * ModelAdapter.of(model).info.d_model * 4, n_fresh)
        for kind in kinds:
            prints[kind].append(fingerprint(model, prints_with, inputs=kind, progress=False))
    return pd.DataFrame([row for kind in kinds for row in _rates(kind, prints[kind], n_fresh, n_pairs, nulls, aligns, testing)])


def _rates(kind: str, prints: list[Fingerprint], n_fresh: int, n_pairs: int, nulls: Sequence[Null], aligns: Sequence[AlignMode],
           testing: LineageSettings) -> list[dict[str, Any]]:
    """One row per align mode and null: how often they call the independent pairs of ``prints`` related."""
    fresh, pairs = prints[:n_fresh], prints[n_fresh:]
    rows = []
    for align, null in ((align, null) for align in aligns for null in nulls):
        null = null.with_fresh_inits(fresh)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the unsafe-regime warning is what this function measures
            outcomes = [lineage_test(pairs[2 * i], pairs[2 * i + 1], testing, null=null, align=align) for i in range(n_pairs)]
        false = sum(r.same_lineage for r in outcomes)
        rows.append({
            "inputs": kind, "align": str(align), "null": null.label, "pairs": n_pairs, "false_positives": false, "fpr": false / n_pairs,
            "alpha": testing.alpha, "median_tau_bar": float(np.median([r.tau_bar for r in outcomes])),
            "median_log10_p": float(np.median([r.log10_p for r in outcomes])),
        })
    return rows


def _check_kept(models: int, per_model: int, n_fresh: int) -> None:
    budget = memory.MEMORY_FRACTION * memory.available_bytes("cpu")
    if models * per_model > budget:
        fits = int((budget // per_model - n_fresh) // 2)
        fix = f"pass n_pairs <= {fits}" if fits >= 1 else "pass fewer inputs (n)"
        raise LensBiasError(
            f"calibrating {models} models keeps their fingerprints, about {memory.format_bytes(models * per_model)}, but only "
            f"{memory.format_bytes(budget)} of CPU memory can be used; {fix}"
        )
