"""Lineage across many models: fingerprint each once, test every pair, correct for testing them all, group the
models into families, and score the verdicts against known bases with LeaFBench's metrics.

:func:`pairwise_lineage` takes MODEL strings (files, folders of them, shipped names, random-init specs: anything
:func:`lens_bias.models.load_model` reads), loaded models or fingerprints. A model's fingerprint is cached on disk
under the SHA-256 of its file's content (every file of a Hugging Face folder; the text of a random-init spec)
and the input spec, so a re-run reads it instead of loading the model. Every unordered pair is tested once (the
first as the base); the p-values are adjusted for the M·(M−1)/2 tests (Holm, or Benjamini–Hochberg), and the
models that are related after adjustment, directly or through others, form a family.

By default each pair is tested as :func:`~lens_bias.seedprint.compare` tests it (``align="auto"``): through the
token and basis maps read from the two models' embedding tables (cached like the fingerprints), so a renamed or
rotated descendant is tested in its base's terms, and where nothing maps the published test is run on the
fingerprints already made. Saved fingerprints hold no weights: a run of them is the published test, unless each
comes with its :class:`~lens_bias.seedprint.readings.Reading` (``readings=``; ``lens-bias descendants --out`` saves
them), from which the default test runs without the models. With an
activation-fitted alignment (``align="permutation" | "orthogonal" | "linear"``) each pair is judged against a
seeds null aligned the same way: fresh random inits of the base's configuration
(:func:`lens_bias.models.transforms.random_inits`), fingerprinted on the same inputs and cached like the models.

>>> import lens_bias
>>> tiny = "llama:d=32,L=1,H=4,V=500,ctx=8"
>>> result = pairwise_lineage([f"{tiny},seed=1", f"{tiny},seed=2"], n=64, seq_len=8, m=16, progress=False, cache=False)
>>> result.names, result.families
(['llama:d=32,L=1,H=4,V=500,ctx=8,seed=1', 'llama:d=32,L=1,H=4,V=500,ctx=8,seed=2'], [['llama:d=32,L=1,H=4,V=500,ctx=8,seed=1'], ['llama:d=32,L=1,H=4,V=500,ctx=8,seed=2']])
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence, Union

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import new_figure
from lens_bias.core.serialise import Serialisable
from lens_bias.core.settings import overridden, route_keywords
from lens_bias.core.stats import adjust_p, detection_metrics
from lens_bias.seedprint.align import AlignMode, check_align
from lens_bias.seedprint.comparison import Maps, auto_pair
from lens_bias.seedprint.fingerprints import Fingerprint, FingerprintSettings, fingerprint
from lens_bias.seedprint.lineage import COMPARE, LineageSettings, SeedPrintResult, lineage_test
from lens_bias.seedprint.lineage_run import LineageRun, PairNulls, renamed_prints
from lens_bias.seedprint.nulls import AnalyticNull
from lens_bias.seedprint.readings import Reading, saved_auto_test

__all__ = ["pairwise_lineage", "LineageMatrix", "CORRECTIONS", "PAIRWISE"]

logger = logging.getLogger(__name__)

CORRECTIONS = ("holm", "bh")
@dataclass
class LineageMatrix(Serialisable):
    """Every pair's lineage test, adjusted for testing them all, the families, and (with labels) the metrics."""

    names: list[str]
    tau_bar: Float[Tensor, "m m"]  # symmetric; the diagonal NaN
    log10_p: Float[Tensor, "m m"]  # raw
    p_adjusted: Float[Tensor, "m m"]  # adjusted for the m·(m−1)/2 tests by ``correction``
    related: Bool[Tensor, "m m"]  # p_adjusted < alpha
    families: list[list[str]]
    correction: str
    alpha: float
    align: AlignMode | Literal["auto"]
    null: dict[str, Any]  # the null's settings (its to_dict())
    inputs: dict[str, Any]  # the fingerprints' input record
    seconds: dict[str, float] = field(default_factory=dict)  # per model: fingerprinting (0 when read from the cache)
    labels: list[str] | None = None  # the base each model descends from, when known
    metrics: dict[str, float] | None = None  # LeaFBench's, over every pair, score −log10 p
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (a, b): b's vocabulary is a's renamed, so b read a's tokens renamed
    tested: Bool[Tensor, "m m"] | None = None  # pairs tested (models of different widths are not)
    # align="auto": per pair ("a\tb"), the maps read (token_source, basis_map, basis_fit) and the tables' agreement
    # (tables_z, tables_log10_p, tables_asked: between trained models the verdict needs it; tables_disagree: they
    # overrule p); on saved readings also
    # which model was the base and how many inputs the pair was tested on (readings.MIN_SHARE)
    maps: dict[str, dict[str, Any]] = field(default_factory=dict)
    # align="auto" on saved readings: pairs of one width not tested, since neither order has saved fingerprints on enough
    # of the inputs its maps ask for (readings.MIN_SHARE)
    untestable: list[tuple[str, str]] = field(default_factory=list)

    def to_pandas(self) -> pd.DataFrame:
        """One row per pair: τ̄, log10 p, the adjusted p, the verdict and, with labels, whether they share a base."""
        rows = []
        for i in range(len(self.names)):
            for j in range(i + 1, len(self.names)):
                row = {"a": self.names[i], "b": self.names[j], "tau_bar": self.tau_bar[i, j].item(), "log10_p": self.log10_p[i, j].item(),
                       "p_adjusted": self.p_adjusted[i, j].item(), "related": bool(self.related[i, j])}
                row["renamed_vocabulary"] = (self.names[i], self.names[j]) in self.renamed
                row["tested"] = True if self.tested is None else bool(self.tested[i, j])
                row.update(self.maps.get(f"{self.names[i]}\t{self.names[j]}", {}))
                if self.labels is not None:
                    row["same_base"] = self.labels[i] == self.labels[j]
                rows.append(row)
        return pd.DataFrame(rows)

    def summary(self) -> str:
        test = f"aligned ({self.align}) " if self.align not in (None, "auto") else ""
        via = " through the token and basis maps read from the weights (auto)" if self.align == "auto" else ""
        lines = [f"lineage of {len(self.names)} models: {test}SeedPrint{via} on {self.inputs.get('n')} × {self.inputs.get('seq_len')} {self.inputs.get('kind')}, "
                 f"{self.null.get('label', self.null.get('kind'))} null; {self._pairs_summary()}, "
                 f"{'Holm' if self.correction == 'holm' else 'Benjamini–Hochberg'}-adjusted at α {self.alpha}",
                 f"  {len(self.families)} famil{'y' if len(self.families) == 1 else 'ies'}:"]
        lines += [f"    {', '.join(family)}" for family in self.families]
        if self.metrics is not None:
            m = self.metrics
            lines.append(f"  against the labels: AUC {m['auc']:.4f}; at Youden's threshold accuracy {m['accuracy']:.4f}, TPR {m['tpr']:.4f}, "
                         f"FPR {m['fpr']:.4f}; TPR at 1% FPR {m['tpr_at_1pct_fpr']:.4f} ({m['positives']} related and {m['negatives']} unrelated pairs)")
        return "\n".join(lines)

    def _pairs_summary(self) -> str:
        total = len(self.names) * (len(self.names) - 1) // 2
        tested = total if self.tested is None else int(self.tested.sum().item()) // 2
        if tested == total:
            return f"{total} pairs"
        apart = f"{len(self.untestable)} without saved fingerprints on the inputs their maps ask for, " if self.untestable else ""
        return f"{tested} pairs tested ({apart}{total - tested - len(self.untestable)} of different widths are not)"

    def plot(self) -> Any:
        """The pairwise −log10 p matrix (raw p, capped at 300), models ordered by family, each family outlined."""
        order = [self.names.index(name) for family in self.families for name in family]
        score = (-self.log10_p).clamp(max=300.0).nan_to_num(300.0)[order][:, order]
        size = max(4.0, 0.35 * len(order) + 2)
        fig = new_figure(size + 1.5, size)
        ax = fig.subplots()
        image = ax.imshow(score.numpy(), cmap="magma", vmin=0, interpolation="nearest")
        labels = [self.names[i] for i in order]
        ax.set_xticks(range(len(labels)), [_short(n) for n in labels], rotation=90, fontsize=7)
        ax.set_yticks(range(len(labels)), [_short(n) for n in labels], fontsize=7)
        start = 0
        from matplotlib.patches import Rectangle  # matplotlib is there: new_figure made the figure

        for family in self.families:
            ax.add_patch(Rectangle((start - 0.5, start - 0.5), len(family), len(family), fill=False, edgecolor="#3cf", linewidth=2))
            start += len(family)
        ax.set_title(f"−log10 p, families outlined ({self.correction}-adjusted, α {self.alpha})", fontsize=9)
        fig.colorbar(image, ax=ax)
        return fig


def _short(name: str, width: int = 28) -> str:
    return name if len(name) <= width else "…" + name[-(width - 1):]


PAIRWISE = FingerprintSettings(n=256, seq_len=32)
"""The fingerprints of :func:`pairwise_lineage` by default: short, since every model of a run is fingerprinted."""


def pairwise_lineage(
    models: Sequence[Union[str, Any, Fingerprint]],
    settings: FingerprintSettings | None = None,
    test: LineageSettings | None = None,
    *,
    names: Sequence[str] | None = None,
    labels: Union[Sequence[str], Mapping[str, str], None] = None,
    n_null: int = 10,
    null_fingerprints: Sequence[Fingerprint] = (),
    readings: Mapping[str, Reading] | None = None,
    correction: str = "holm",
    cache: Union[str, Path, bool, None] = None,
    progress: bool = True,
    **overrides: Any,
) -> LineageMatrix:
    """Test every pair of ``models`` for shared lineage, adjust for the number of tests, and find the families.

    Args:
        models: MODEL strings (a folder of models counts as its models: :func:`~lens_bias.seedprint.cache.expand_models`), loaded TransformerLens
            models, or :class:`~lens_bias.seedprint.Fingerprint` objects made on the same inputs.
        settings: the fingerprints, on drawn tokens (default :data:`PAIRWISE`; ``vocab`` None: the smallest
            vocabulary among the models).
        test: every pair's :class:`~lens_bias.seedprint.LineageSettings`. Default: ``compare``'s
            (:data:`~lens_bias.seedprint.COMPARE`, ``align="auto"``: each pair through the token and basis maps read
            from the two models' weights, and between trained models their tables asked to agree) where every
            model has weights; the published test where some are saved fingerprints, which hold none. With an
            activation-fitted ``align`` mode and no ``null``, each pair is judged against a seeds null of
            ``n_null`` random inits of its base's configuration, aligned the same way.
        names: what to call them (default: the MODEL strings; ``model i`` for objects).
        labels: the base each model descends from (a list in model order, or ``{name: base}``); with them the
            result carries LeaFBench's metrics over every pair (related = same base).
        n_null: fresh random inits per configuration of the aligned default null.
        null_fingerprints: with an alignment, the null of a saved fingerprint (which has no model to re-initialise):
            a seeds null of those of its width, less the two under test (e.g. the random inits ``lens-bias
            descendants --out`` saves).
        readings: with saved fingerprints, each model's :class:`~lens_bias.seedprint.readings.Reading` by name (what
            ``lens-bias descendants --out`` saves as ``readings/``), so that the default test (``"auto"``) runs on
            them; a pair whose maps ask for inputs neither order saved (:func:`~lens_bias.seedprint.readings.saved_auto_test`)
            is left untested (``untestable``).
        correction: "holm" (family-wise error) or "bh" (false discovery rate).
        cache: a folder for fingerprints (default ``$LENS_BIAS_CACHE/fingerprints``), or False for none.
        progress: a progress bar over the models.
        **overrides: fields of either settings class (``n=64, m=16``), which replace theirs.

    Returns:
        A :class:`LineageMatrix`.
    """
    routed = route_keywords(overrides, {"settings": FingerprintSettings, "test": LineageSettings}, "pairwise_lineage()")
    prints_with = overridden(FingerprintSettings, settings if settings is not None else PAIRWISE, routed["settings"], "pairwise_lineage()")
    testing = overridden(LineageSettings, test if test is not None else COMPARE, routed["test"], "pairwise_lineage()")
    if prints_with.inputs != "tokens":
        raise LensBiasError(f"pairwise_lineage fingerprints drawn token inputs (settings.inputs='tokens'), got {prints_with.inputs!r}")
    if correction not in CORRECTIONS:
        raise LensBiasError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    check_align(testing.align, auto=True)
    run = LineageRun.of(models, names, cache)
    saved = readings is not None and all(name in readings for name in run.names)
    if readings is not None and not saved:
        raise LensBiasError(f"readings name no reading for {[n for n in run.names if n not in readings][:3]}...: give every model one, or none")
    if testing.align == "auto" and any(isinstance(x, Fingerprint) for x in run.sources) and not saved:
        if "align" in routed["test"]:  # asked for by name: refused; the settings' default: said, then the published test
            raise LensBiasError("align='auto' reads each model's weights, which a saved fingerprint does not hold: pass the models, or align=None for the published test")
        warnings.warn("pairwise_lineage: saved fingerprints hold no weights, so the pairs are tested by the published test (align=None), not "
                      "compare's default (align='auto'); pass readings= (what lens-bias descendants --out saves) for the default", stacklevel=2)
        testing = replace(testing, align=None)
    auto = testing.align == "auto"
    if prints_with.vocab is None:
        prints_with = replace(prints_with, vocab=min(run.vocab(i) for i in range(run.size)))
    prints, sketches, seconds = run.fingerprints(prints_with, progress, embeddings=auto)
    renamed = {} if auto else renamed_prints(run, prints, sketches, seconds)  # "auto" reads renamings from its token map
    nulls = PairNulls(testing, n_null, null_fingerprints, run, prints)
    size = run.size
    tau, log10_p = torch.full((size, size), float("nan")), torch.zeros(size, size)
    # models of different widths cannot share an init: such pairs are not tested (p 1, τ̄ NaN) and not counted
    pairs = [(i, j) for i in range(size) for j in range(i + 1, size) if prints[i].d == prints[j].d]
    if len(pairs) < size * (size - 1) // 2:
        logger.info("%d of %d pairs have different widths and are not tested", size * (size - 1) // 2 - len(pairs), size * (size - 1) // 2)
    maps: dict[tuple[int, int], SeedPrintResult] = {}
    bases: dict[tuple[int, int], str] = {}
    untestable: list[tuple[int, int]] = []
    for i, j in tqdm(pairs, desc="pairs", disable=not progress):
        if auto and readings is not None:
            both_trained = all(p.model.regime == "trained" for p in (prints[i], prints[j]))
            found = saved_auto_test(readings[run.names[i]], readings[run.names[j]], replace(testing, align=None), both_trained=both_trained)
            if found is None:
                untestable.append((i, j))
                continue
            res = maps[(i, j)] = found[0]
            bases[(i, j)] = run.names[i if found[1] else j]
        elif auto:
            res = maps[(i, j)] = _auto_pair(run, prints, prints_with, replace(testing, align=None, null=nulls.of(i, j)), i, j)
        else:
            res = lineage_test(prints[i], renamed.get((i, j), prints[j]), replace(testing, null=nulls.of(i, j)))
        tau[i, j] = tau[j, i] = res.tau_bar
        log10_p[i, j] = log10_p[j, i] = res.log10_p
    skipped = set(untestable)
    pairs = [pair for pair in pairs if pair not in skipped]
    adjusted_flat = [float(v) for v in adjust_p([10 ** log10_p[i, j].item() for i, j in pairs], correction)] if pairs else []
    adjusted, tested = torch.ones(size, size), torch.zeros(size, size, dtype=torch.bool)
    for (i, j), value in zip(pairs, adjusted_flat):
        adjusted[i, j] = adjusted[j, i] = float(value)
        tested[i, j] = tested[j, i] = True
    related = adjusted < testing.alpha
    for (i, j), res in maps.items():  # between trained models "auto" also asks the tables to agree (seedprint.tables)
        if res.tables_disagree:
            related[i, j] = related[j, i] = False
    related.fill_diagonal_(False)
    label_list = _labels(labels, run.names)
    same = [label_list[i] == label_list[j] for i, j in pairs] if label_list is not None else []
    # a pair whose tables disagree scores as p = 1: its verdict is "unrelated" whatever the statistic says
    scores = [0.0 if (i, j) in maps and maps[(i, j)].tables_disagree else -log10_p[i, j].item() for i, j in pairs]
    metrics = detection_metrics(scores, same) if any(same) and not all(same) else None
    return LineageMatrix(
        names=run.names, tau_bar=tau, log10_p=log10_p, p_adjusted=adjusted, related=related, families=_families(run.names, related),
        correction=correction, alpha=testing.alpha, align=testing.align, null=(nulls.of(*pairs[0]) if pairs else AnalyticNull()).to_dict(),
        inputs=_inputs_record(run.sources, prints, run.spec), seconds=seconds, labels=label_list, metrics=metrics,
        renamed=[(run.names[i], run.names[j]) for i, j in sorted(renamed) + sorted(k for k, r in maps.items() if r.renamed_vocabulary)], tested=tested,
        maps={f"{run.names[i]}\t{run.names[j]}": {**_maps_record(res), **({"base": bases[(i, j)], "inputs": res.n} if (i, j) in bases else {})} for (i, j), res in maps.items()},
        untestable=[(run.names[i], run.names[j]) for i, j in untestable],
    )


def _auto_pair(run: LineageRun, prints: Sequence[Fingerprint], settings: FingerprintSettings, test: LineageSettings, i: int, j: int) -> SeedPrintResult:
    """One pair under align="auto" (:func:`~lens_bias.seedprint.comparison.auto_pair`), the maps read from the two
    models' embeddings: the fingerprints already made, unless the token map changes the inputs (then both models are
    fingerprinted again on the tokens they share)."""
    embedding_a, embedding_b = run.embedding(i), run.embedding(j)
    assert embedding_a is not None and embedding_b is not None  # pairwise_lineage refused saved fingerprints
    maps = Maps.read(embedding_a, embedding_b)

    def made_or_make(read_a: Tensor | None, read_b: Tensor | None) -> tuple[Fingerprint, Fingerprint]:
        if read_a is None or read_b is None:
            return prints[i], prints[j]
        logger.info("%s reads %s's tokens through its token map (%s)", run.names[j], run.names[i], maps.tokens.source)
        return fingerprint(run.load(i), settings, inputs=read_a, progress=False), fingerprint(run.load(j), settings, inputs=read_b, progress=False)

    result = auto_pair(maps, settings, made_or_make, test, all(p.model.regime == "trained" for p in (prints[i], prints[j])))
    assert result is not None  # made_or_make always has the two fingerprints
    return result


def _maps_record(res: SeedPrintResult) -> dict[str, Any]:
    """What "auto" read for one pair, as plain values (pairs.csv's columns)."""
    tables = res.tables
    return {"token_source": res.token_source, "basis_map": res.basis_map, "basis_fit": res.basis_fit, "tables_z": None if tables is None else tables.z,
            "tables_log10_p": None if tables is None else tables.log10_p, "tables_asked": res.tables_asked, "tables_disagree": res.tables_disagree}


def _inputs_record(sources: Sequence[Any], prints: Sequence[Fingerprint], spec: Mapping[str, Any]) -> dict[str, Any]:
    """What the fingerprints were made from: the spec, or a saved fingerprint's own record when one was given."""
    given = next((fp for x, fp in zip(sources, prints) if isinstance(x, Fingerprint)), None)
    if given is None:
        return {"kind": "tokens", **spec}
    return {key: getattr(given.inputs, key) for key in ("kind", "n", "seq_len", "seed", "vocab")}


def _labels(labels: Union[Sequence[str], Mapping[str, str], None], names: Sequence[str]) -> list[str] | None:
    if labels is None:
        return None
    if isinstance(labels, Mapping):
        missing = [name for name in names if name not in labels]
        if missing:
            raise LensBiasError(f"labels name no base for {missing}; give every model one")
        return [str(labels[name]) for name in names]
    if len(labels) != len(names):
        raise LensBiasError(f"labels must give one base per model: {len(labels)} for {len(names)} models")
    return [str(label) for label in labels]


def _families(names: Sequence[str], related: Tensor) -> list[list[str]]:
    """Connected components of the related graph, in the models' order."""
    parent = list(range(len(names)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in related.nonzero().tolist():
        parent[root(i)] = root(j)
    groups: dict[int, list[str]] = {}
    for i, name in enumerate(names):
        groups.setdefault(root(i), []).append(name)
    return list(groups.values())
