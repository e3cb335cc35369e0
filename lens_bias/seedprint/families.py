"""Lineage across many models: fingerprint each once, test every pair, correct for testing them all, group the
models into families, and score the verdicts against known bases with LeaFBench's metrics.

:func:`pairwise_lineage` takes MODEL strings (files, folders of them, shipped names, random-init specs: anything
:func:`lens_bias.models.load_model` reads), loaded models or fingerprints. A model's fingerprint is cached on disk
under the SHA-256 of its file's content (every file of a Hugging Face folder; the text of a random-init spec)
and the input spec, so a re-run reads it instead of loading the model. Every unordered pair is tested once (the
first as the base); the p-values are adjusted for the M·(M−1)/2 tests (Holm, or Benjamini–Hochberg), and the
models that are related after adjustment, directly or through others, form a family.

With an alignment (``align="permutation" | "orthogonal" | "linear"``) each pair is judged against a seeds null
aligned the same way: fresh random inits of the base's configuration (:func:`lens_bias.models.transforms.random_inits`),
fingerprinted on the same inputs and cached like the models.

>>> import lens_bias
>>> tiny = "llama:d=32,L=1,H=4,V=500,ctx=8"
>>> result = pairwise_lineage([f"{tiny},seed=1", f"{tiny},seed=2"], n=64, seq_len=8, m=16, progress=False, cache=False)
>>> result.names, result.families
(['llama:d=32,L=1,H=4,V=500,ctx=8,seed=1', 'llama:d=32,L=1,H=4,V=500,ctx=8,seed=2'], [['llama:d=32,L=1,H=4,V=500,ctx=8,seed=1'], ['llama:d=32,L=1,H=4,V=500,ctx=8,seed=2']])
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import new_figure
from lens_bias.core.files import atomic_write_text
from lens_bias.core.serialise import Serialisable
from lens_bias.core.settings import overridden, route_keywords
from lens_bias.core.stats import adjust_p, detection_metrics
from lens_bias.models import load_model
from lens_bias.models.transforms import random_inits
from lens_bias.seedprint.align import AlignMode, check_align
from lens_bias.seedprint.cache import FingerprintCache, content_key, expand_models, fingerprint_file
from lens_bias.seedprint.fingerprints import Fingerprint, FingerprintSettings, fingerprint, regenerate_inputs
from lens_bias.seedprint.lineage import LineageSettings, lineage_test
from lens_bias.seedprint.nulls import AnalyticNull, Null, SeedsNull
from lens_bias.seedprint.vocabulary import is_renamed, renamed_ids

__all__ = ["pairwise_lineage", "LineageMatrix", "CORRECTIONS", "PAIRWISE"]

logger = logging.getLogger(__name__)

CORRECTIONS = ("holm", "bh")
_NULL_FIRST_SEED = 1_000_000  # fresh inits of the null: seeds clear of those models are built with


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
    align: AlignMode
    null: dict[str, Any]  # the null's settings (its to_dict())
    inputs: dict[str, Any]  # the fingerprints' input record
    seconds: dict[str, float] = field(default_factory=dict)  # per model: fingerprinting (0 when read from the cache)
    labels: list[str] | None = None  # the base each model descends from, when known
    metrics: dict[str, float] | None = None  # LeaFBench's, over every pair, score −log10 p
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (a, b): b's vocabulary is a's renamed, so b read a's tokens renamed
    tested: Bool[Tensor, "m m"] | None = None  # pairs tested (models of different widths are not)

    def to_pandas(self) -> pd.DataFrame:
        """One row per pair: τ̄, log10 p, the adjusted p, the verdict and, with labels, whether they share a base."""
        rows = []
        for i in range(len(self.names)):
            for j in range(i + 1, len(self.names)):
                row = {"a": self.names[i], "b": self.names[j], "tau_bar": self.tau_bar[i, j].item(), "log10_p": self.log10_p[i, j].item(),
                       "p_adjusted": self.p_adjusted[i, j].item(), "related": bool(self.related[i, j])}
                row["renamed_vocabulary"] = (self.names[i], self.names[j]) in self.renamed
                row["tested"] = True if self.tested is None else bool(self.tested[i, j])
                if self.labels is not None:
                    row["same_base"] = self.labels[i] == self.labels[j]
                rows.append(row)
        return pd.DataFrame(rows)

    def summary(self) -> str:
        test = f"aligned ({self.align}) " if self.align else ""
        lines = [f"lineage of {len(self.names)} models: {test}SeedPrint on {self.inputs.get('n')} × {self.inputs.get('seq_len')} {self.inputs.get('kind')}, "
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
        return f"{total} pairs" if tested == total else f"{tested} pairs tested ({total - tested} of different widths are not)"

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
        test: every pair's :class:`~lens_bias.seedprint.LineageSettings`; with an ``align`` mode and no ``null``,
            each pair is judged against a seeds null of ``n_null`` random inits of its base's configuration, aligned
            the same way (without one, the analytic null).
        names: what to call them (default: the MODEL strings; ``model i`` for objects).
        labels: the base each model descends from (a list in model order, or ``{name: base}``); with them the
            result carries LeaFBench's metrics over every pair (related = same base).
        n_null: fresh random inits per configuration of the aligned default null.
        null_fingerprints: with an alignment, the null of a saved fingerprint (which has no model to re-initialise):
            a seeds null of those of its width, less the two under test (e.g. the random inits ``lens-bias
            descendants --out`` saves).
        correction: "holm" (family-wise error) or "bh" (false discovery rate).
        cache: a folder for fingerprints (default ``$LENS_BIAS_CACHE/fingerprints``), or False for none.
        progress: a progress bar over the models.
        **overrides: fields of either settings class (``n=64, m=16``), which replace theirs.

    Returns:
        A :class:`LineageMatrix`.
    """
    routed = route_keywords(overrides, {"settings": FingerprintSettings, "test": LineageSettings}, "pairwise_lineage()")
    prints_with = overridden(FingerprintSettings, settings if settings is not None else PAIRWISE, routed["settings"], "pairwise_lineage()")
    testing = overridden(LineageSettings, test, routed["test"], "pairwise_lineage()")
    if prints_with.inputs != "tokens":
        raise LensBiasError(f"pairwise_lineage fingerprints drawn token inputs (settings.inputs='tokens'), got {prints_with.inputs!r}")
    if correction not in CORRECTIONS:
        raise LensBiasError(f"correction must be one of {CORRECTIONS}, got {correction!r}")
    if testing.align == "auto":
        raise LensBiasError("pairwise_lineage does not take align='auto' yet; compare(model_a, model_b, align='auto') does")
    check_align(testing.align)
    run = _Run.of(models, names, cache)
    if prints_with.vocab is None:
        prints_with = replace(prints_with, vocab=min(run.vocab(i) for i in range(run.size)))
    prints, sketches, seconds = run.fingerprints(prints_with, progress)
    renamed = _renamed_prints(run, prints, sketches, seconds)
    nulls = _Nulls(testing, n_null, null_fingerprints, run, prints)
    size = run.size
    tau, log10_p = torch.full((size, size), float("nan")), torch.zeros(size, size)
    # models of different widths cannot share an init: such pairs are not tested (p 1, τ̄ NaN) and not counted
    pairs = [(i, j) for i in range(size) for j in range(i + 1, size) if prints[i].d == prints[j].d]
    if len(pairs) < size * (size - 1) // 2:
        logger.info("%d of %d pairs have different widths and are not tested", size * (size - 1) // 2 - len(pairs), size * (size - 1) // 2)
    for i, j in tqdm(pairs, desc="pairs", disable=not progress):
        res = lineage_test(prints[i], renamed.get((i, j), prints[j]), replace(testing, null=nulls.of(i, j)))
        tau[i, j] = tau[j, i] = res.tau_bar
        log10_p[i, j] = log10_p[j, i] = res.log10_p
    adjusted_flat = [float(v) for v in adjust_p([10 ** log10_p[i, j].item() for i, j in pairs], correction)] if pairs else []
    adjusted, tested = torch.ones(size, size), torch.zeros(size, size, dtype=torch.bool)
    for (i, j), value in zip(pairs, adjusted_flat):
        adjusted[i, j] = adjusted[j, i] = float(value)
        tested[i, j] = tested[j, i] = True
    related = adjusted < testing.alpha
    related.fill_diagonal_(False)
    label_list = _labels(labels, run.names)
    same = [label_list[i] == label_list[j] for i, j in pairs] if label_list is not None else []
    metrics = detection_metrics([-log10_p[i, j].item() for i, j in pairs], same) if any(same) and not all(same) else None
    return LineageMatrix(
        names=run.names, tau_bar=tau, log10_p=log10_p, p_adjusted=adjusted, related=related, families=_families(run.names, related),
        correction=correction, alpha=testing.alpha, align=testing.align, null=(nulls.of(*pairs[0]) if pairs else AnalyticNull()).to_dict(),
        inputs=_inputs_record(run.sources, prints, run.spec), seconds=seconds, labels=label_list, metrics=metrics,
        renamed=[(run.names[i], run.names[j]) for i, j in sorted(renamed)], tested=tested,
    )


@dataclass
class _Run:
    """The models of one lineage run: each loaded when first needed, once, and known by the hash of its content."""

    sources: list[Any]  # MODEL strings (a fingerprint file's name already read), models or fingerprints
    names: list[str]
    keys: list[str | None]  # the content key of each MODEL string
    store: FingerprintCache
    spec: dict[str, Any] = field(default_factory=dict)  # the fingerprints' input spec, set by fingerprints()
    loaded: dict[int, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, models: Sequence[Any], names: Sequence[str] | None, cache: Union[str, Path, bool, None]) -> "_Run":
        sources = expand_models(list(models)) if all(isinstance(x, str) for x in models) else list(models)
        if len(sources) < 2:
            raise LensBiasError(f"lineage needs at least 2 models, got {len(sources)}")
        names = [str(x) if isinstance(x, str) else f"model {i}" for i, x in enumerate(sources)] if names is None else list(names)
        if len(names) != len(sources) or len(set(names)) != len(names):
            raise LensBiasError(f"names must be {len(sources)} distinct strings, one per model")
        sources = [fingerprint_file(x) or x if isinstance(x, str) else x for x in sources]
        return cls(sources, names, [content_key(x) if isinstance(x, str) else None for x in sources], FingerprintCache(cache))

    @property
    def size(self) -> int:
        return len(self.sources)

    def load(self, i: int) -> Any:
        """Model i, loaded anew (the caller frees it)."""
        return load_model(self.sources[i]) if isinstance(self.sources[i], str) else self.sources[i]

    def model(self, i: int) -> Any:
        """Model i, loaded once for its fingerprint, its sketch and its vocabulary."""
        if i not in self.loaded:
            self.loaded[i] = self.load(i)
        return self.loaded[i]

    def vocab(self, i: int) -> int:
        """Model i's vocabulary size: a fingerprint's record, or the card in the cache (so a cached model is not loaded)."""
        x, key = self.sources[i], self.keys[i]
        if isinstance(x, Fingerprint):
            return int(x.inputs.get("vocab") or x.model["d_vocab"])
        card = self.store.folder / f"{key}.json" if self.store.folder is not None and key is not None else None
        if card is not None and card.exists():
            return int(json.loads(card.read_text())["d_vocab"])
        d_vocab = ModelAdapter(self.model(i)).info.d_vocab
        if card is not None:
            card.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(card, json.dumps({"d_vocab": d_vocab}))
        return d_vocab

    def fingerprints(self, settings: FingerprintSettings, progress: bool) -> tuple[list[Fingerprint], list[Tensor | None], dict[str, float]]:
        """Every model's fingerprint (from the cache where it is there), its embedding sketch (which vocabularies are
        another's renamed) and the seconds it took; one model in memory at a time."""
        self.spec = {"inputs": "tokens", "n": settings.n, "seq_len": settings.seq_len, "seed": settings.seed, "vocab": settings.vocab}
        if settings.dtype is not None:
            self.spec["dtype"] = str(settings.dtype)
        prints: list[Fingerprint] = []
        sketches: list[Tensor | None] = []
        seconds: dict[str, float] = {}
        for i in tqdm(range(self.size), desc="fingerprints", disable=not progress):
            started, x, key = time.perf_counter(), self.sources[i], self.keys[i]
            if isinstance(x, Fingerprint):
                prints.append(x)
                sketches.append(None)
            else:
                fp = self.store.load(key, self.spec) if key is not None else None
                if fp is None:
                    fp = fingerprint(self.model(i), settings, progress=False)
                    if key is not None:
                        self.store.save(key, self.spec, fp)
                prints.append(fp)
                sketches.append(self.store.sketch(key, lambda: self.model(i)))
            seconds[self.names[i]] = time.perf_counter() - started
            self.loaded.pop(i, None)
        return prints, sketches, seconds


@dataclass
class _Nulls:
    """The null each pair is judged against: the test's own, the analytic one, or with an alignment a seeds null of
    the base's configuration (made when first needed, one per base)."""

    test: LineageSettings
    n_null: int
    null_fingerprints: Sequence[Fingerprint]
    run: _Run
    prints: list[Fingerprint]
    made: dict[int, Null] = field(default_factory=dict)

    def of(self, i: int, j: int) -> Null:
        if self.test.null is not None or self.test.align is None:
            return self.test.null if self.test.null is not None else AnalyticNull()
        if isinstance(self.run.sources[i], Fingerprint):  # no model to re-initialise: the given fingerprints of its width
            tested = [self.prints[i], self.prints[j]]
            pool = [fp for fp in self.null_fingerprints if fp.d == self.prints[i].d and not any(torch.equal(fp.features, t.features) for t in tested)]
            if len(pool) < 2:
                raise LensBiasError(f"an aligned test of the saved fingerprint {self.run.names[i]} needs a seeds null of its width ({self.prints[i].d}): "
                                    "pass null_fingerprints= (lens-bias lineage --null-fingerprints), e.g. the random inits lens-bias descendants --out saved")
            return SeedsNull(fingerprints=pool, label="the given fingerprints of its width")
        if i not in self.made:
            self.made[i] = _aligned_null(self.run, i, self.prints[i], self.n_null)
        return self.made[i]


def _inputs_record(sources: Sequence[Any], prints: Sequence[Fingerprint], spec: Mapping[str, Any]) -> dict[str, Any]:
    """What the fingerprints were made from: the spec, or a saved fingerprint's own record when one was given."""
    given = next((fp for x, fp in zip(sources, prints) if isinstance(x, Fingerprint)), None)
    if given is None:
        return {"kind": "tokens", **spec}
    return {key: given.inputs.get(key) for key in ("kind", "n", "seq_len", "seed", "vocab")}


def _renamed_prints(run: _Run, prints: Sequence[Fingerprint], sketches: Sequence[Tensor | None], seconds: dict[str, float]) -> dict[tuple[int, int], Fingerprint]:
    """For each pair (i, j) where j's vocabulary is i's renamed, j's fingerprint on i's tokens under j's IDs, so that a
    renaming, which leaves a model the same on text, cannot hide a descendant. One fingerprint per model and renaming
    (the models that share i's token order share it), cached under the model's key and the renamed IDs' digest."""
    made: dict[tuple[int, str], Fingerprint] = {}
    out: dict[tuple[int, int], Fingerprint] = {}
    for i, j in [(i, j) for i in range(len(prints)) for j in range(i + 1, len(prints))]:
        sketch_a, sketch_b = sketches[i], sketches[j]
        if sketch_a is None or sketch_b is None or prints[i].d != prints[j].d or not is_renamed(sketch_a, sketch_b):
            continue
        ids = renamed_ids(sketch_a, sketch_b, regenerate_inputs(prints[i])[0:prints[i].n])
        if ids is None:  # is_renamed's sample matched, the whole table did not
            continue
        digest = hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]
        if (j, digest) not in made:
            started = time.perf_counter()
            renamed_spec, key = {**run.spec, "renamed_ids": digest}, run.keys[j]
            fp = run.store.load(key, renamed_spec) if key is not None else None
            if fp is None:
                logger.info("%s reads %s's tokens under its renamed vocabulary", run.names[j], run.names[i])
                fp = replace(fingerprint(run.load(j), FingerprintSettings(inputs=ids), progress=False), inputs={**prints[i].inputs, "renamed": True})
                if key is not None:
                    run.store.save(key, renamed_spec, fp)
            made[(j, digest)] = fp
            seconds[run.names[j]] += time.perf_counter() - started
        out[(i, j)] = made[(j, digest)]
    return out


def _aligned_null(run: _Run, i: int, base: Fingerprint, n_null: int) -> Null:
    """A seeds null of ``n_null`` random inits of model i's configuration on its inputs (cached with the model)."""
    seeds, key = range(_NULL_FIRST_SEED, _NULL_FIRST_SEED + n_null), run.keys[i]
    cached = [run.store.load(f"{key}-init{s}", run.spec) if key is not None else None for s in seeds]
    prints = [fp for fp in cached if fp is not None]
    if len(prints) < n_null:
        prints = []
        same = FingerprintSettings(n=base.n, seq_len=base.inputs["seq_len"], seed=base.inputs["seed"], vocab=base.inputs["vocab"])
        for s, fresh in zip(seeds, random_inits(run.model(i), seeds)):
            fp = fingerprint(fresh, same, progress=False)
            if key is not None:
                run.store.save(f"{key}-init{s}", run.spec, fp)
            prints.append(fp)
    return SeedsNull(fingerprints=prints, label=f"{n_null} random inits of its configuration")


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
