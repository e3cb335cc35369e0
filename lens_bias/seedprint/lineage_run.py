"""The models of one lineage run (:func:`~lens_bias.seedprint.families.pairwise_lineage`): each loaded when first
needed, once, known by the hash of its content and fingerprinted through the cache; the fingerprints that read a
renamed vocabulary's tokens; and the null each pair is judged against."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence, Union

import torch
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.files import atomic_write_text
from lens_bias.models import load_model
from lens_bias.models.transforms import random_inits
from lens_bias.seedprint.cache import FingerprintCache, content_key, expand_models, fingerprint_file
from lens_bias.seedprint.correspondence import Embedding
from lens_bias.seedprint.fingerprints import Fingerprint, FingerprintSettings, fingerprint, regenerate_inputs
from lens_bias.seedprint.lineage import LineageSettings
from lens_bias.seedprint.nulls import AnalyticNull, Null, SeedsNull
from lens_bias.seedprint.vocabulary import is_renamed, renamed_ids

__all__ = ["LineageRun", "PairNulls", "renamed_prints", "aligned_null", "NULL_FIRST_SEED"]

logger = logging.getLogger(__name__)

NULL_FIRST_SEED = 1_000_000  # fresh inits of the null: seeds clear of those models are built with



@dataclass
class LineageRun:
    """The models of one lineage run: each loaded when first needed, once, and known by the hash of its content."""

    sources: list[Any]  # MODEL strings (a fingerprint file's name already read), models or fingerprints
    names: list[str]
    keys: list[str | None]  # the content key of each MODEL string
    store: FingerprintCache
    spec: dict[str, Any] = field(default_factory=dict)  # the fingerprints' input spec, set by fingerprints()
    loaded: dict[int, Any] = field(default_factory=dict)
    # align="auto": the embeddings (Embedding) in memory: every one of a run without a cache folder (they cannot be read
    # again without loading the model), else the last two asked for (a pair's: the base is held across its suspects)
    embeddings: OrderedDict[int, Embedding] = field(default_factory=OrderedDict)

    @classmethod
    def of(cls, models: Sequence[Any], names: Sequence[str] | None, cache: Union[str, Path, bool, None]) -> "LineageRun":
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
            return int(x.inputs.vocab or x.model.d_vocab)
        card = self.store.folder / f"{key}.json" if self.store.folder is not None and key is not None else None
        if card is not None and card.exists():
            return int(json.loads(card.read_text())["d_vocab"])
        d_vocab = ModelAdapter.of(self.model(i)).info.d_vocab
        if card is not None:
            card.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(card, json.dumps({"d_vocab": d_vocab}))
        return d_vocab

    def embedding(self, i: int) -> Embedding | None:
        """Model i's :class:`~lens_bias.seedprint.correspondence.Embedding` (None for a saved fingerprint, which holds
        no weights): the model object's own, else read from the cache folder, else made (loading the model)."""
        x = self.sources[i]
        if isinstance(x, Fingerprint):
            return None
        if i in self.embeddings:
            self.embeddings.move_to_end(i)
            return self.embeddings[i]
        made = self.store.embedding(self.keys[i], lambda: self.model(i)) if isinstance(x, str) else Embedding.of(x)
        self.embeddings[i] = made
        if not isinstance(x, str) or self.store.folder is not None:  # can be had again cheaply: hold a pair's only
            while len(self.embeddings) > 2:
                self.embeddings.popitem(last=False)
        return made

    def fingerprints(self, settings: FingerprintSettings, progress: bool, *, embeddings: bool = False) -> tuple[list[Fingerprint], list[Tensor | None], dict[str, float]]:
        """Every model's fingerprint (from the cache where it is there), its embedding sketch (which vocabularies are
        another's renamed), with ``embeddings`` its :meth:`embedding`, and the seconds it took; one model in memory
        at a time."""
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
                kept = self.store.embedding_path(key)
                if embeddings and isinstance(x, str) and not (kept is not None and kept.exists()):  # made while the model is loaded
                    self.embedding(i)
            seconds[self.names[i]] = time.perf_counter() - started
            self.loaded.pop(i, None)
        return prints, sketches, seconds


@dataclass
class PairNulls:
    """The null each pair is judged against: the test's own, the analytic one, or with an alignment a seeds null of
    the base's configuration (made when first needed, one per base)."""

    test: LineageSettings
    n_null: int
    null_fingerprints: Sequence[Fingerprint]
    run: LineageRun
    prints: list[Fingerprint]
    made: dict[int, Null] = field(default_factory=dict)

    def of(self, i: int, j: int) -> Null:
        if self.test.null is not None or self.test.align in (None, "auto"):  # "auto" tests through maps with the published null
            return self.test.null if self.test.null is not None else AnalyticNull()
        if isinstance(self.run.sources[i], Fingerprint):  # no model to re-initialise: the given fingerprints of its width
            tested = [self.prints[i], self.prints[j]]
            pool = [fp for fp in self.null_fingerprints if fp.d == self.prints[i].d and not any(torch.equal(fp.features, t.features) for t in tested)]
            if len(pool) < 2:
                raise LensBiasError(f"an aligned test of the saved fingerprint {self.run.names[i]} needs a seeds null of its width ({self.prints[i].d}): "
                                    "pass null_fingerprints= (lens-bias lineage --null-fingerprints), e.g. the random inits lens-bias descendants --out saved")
            return SeedsNull(fingerprints=pool, label="the given fingerprints of its width")
        if i not in self.made:
            self.made[i] = aligned_null(self.run, i, self.prints[i], self.n_null)
        return self.made[i]


def renamed_prints(run: LineageRun, prints: Sequence[Fingerprint], sketches: Sequence[Tensor | None], seconds: dict[str, float]) -> dict[tuple[int, int], Fingerprint]:
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
                fp = replace(fingerprint(run.load(j), FingerprintSettings(inputs=ids), progress=False), inputs=replace(prints[i].inputs, renamed=True))
                if key is not None:
                    run.store.save(key, renamed_spec, fp)
            made[(j, digest)] = fp
            seconds[run.names[j]] += time.perf_counter() - started
        out[(i, j)] = made[(j, digest)]
    return out


def aligned_null(run: LineageRun, i: int, base: Fingerprint, n_null: int) -> Null:
    """A seeds null of ``n_null`` random inits of model i's configuration on its inputs (cached with the model)."""
    seeds, key = range(NULL_FIRST_SEED, NULL_FIRST_SEED + n_null), run.keys[i]
    cached = [run.store.load(f"{key}-init{s}", run.spec) if key is not None else None for s in seeds]
    prints = [fp for fp in cached if fp is not None]
    if len(prints) < n_null:
        prints = []
        same = base.inputs.settings()
        for s, fresh in zip(seeds, random_inits(run.model(i), seeds)):
            fp = fingerprint(fresh, same, progress=False)
            if key is not None:
                run.store.save(f"{key}-init{s}", run.spec, fp)
            prints.append(fp)
    return SeedsNull(fingerprints=prints, label=f"{n_null} random inits of its configuration")
