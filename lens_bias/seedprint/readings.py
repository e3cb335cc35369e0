"""``compare``'s default test (``align="auto"``) between models known only by what a run saved of them.

``"auto"`` reads the token and basis maps from the two models' embedding tables, and a pair whose token map changes
the inputs is fingerprinted on the tokens it maps to. A saved fingerprint holds neither, so a lineage run over saved
fingerprints alone can only run the published test. A :class:`Reading` keeps what ``"auto"`` needs of one model:
its embedding table (float16, as the fingerprint cache keeps it) and its tokenizer's vocabulary, and its
fingerprints each with the tokens it read (a renamed descendant's on the base's tokens renamed, and on the drawn IDs
themselves). :func:`saved_auto_test` then tests a pair as ``compare`` would, on the saved fingerprints whose inputs
are those the maps ask for, and says so where none are.

``lens-bias descendants --out DIR`` writes one reading per model (``DIR/readings/FAMILY--TARGET.pt``, beside
``DIR/fingerprints/FAMILY--TARGET.pt``); :func:`~lens_bias.seedprint.pairwise_lineage` takes them as ``readings=``.

>>> import lens_bias
>>> from lens_bias.models.reparametrise import rename_vocabulary, rotate_residual
>>> from lens_bias.seedprint import FingerprintSettings, fingerprint
>>> base = lens_bias.random_init("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=300, n_ctx=8)
>>> disguised = rename_vocabulary(rotate_residual(base, seed=1), seed=2)
>>> fp_base = fingerprint(base, FingerprintSettings(n=128, seq_len=8), progress=False)
>>> drawn = drawn_tokens(fp_base)
>>> renamed = disguised.lens_bias_vocabulary[drawn]  # the base's tokens under the disguised model's IDs
>>> fp_disguised = fingerprint(disguised, FingerprintSettings(n=128, seq_len=8), inputs=renamed, progress=False)
>>> readings = Reading.of(base, [(drawn, fp_base)]), Reading.of(disguised, [(renamed, fp_disguised)])
>>> result, base_first = saved_auto_test(*readings, LineageSettings(m=16))
>>> base_first, result.token_source, result.basis_map, result.p < 1e-10
(True, 'weights', 'orthogonal', True)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, Union

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from lens_bias.core.errors import LensBiasError
from lens_bias.core.files import atomic_save, load_torch_file
from lens_bias.seedprint.comparison import FingerprintsOn, Maps, auto_pair
from lens_bias.seedprint.correspondence import Embedding
from lens_bias.seedprint.fingerprints import Fingerprint, regenerate_inputs
from lens_bias.seedprint.lineage import LineageSettings, SeedPrintResult

__all__ = ["Reading", "ReadingFiles", "saved_auto_test", "drawn_tokens", "MIN_SHARE"]

FORMAT = "lens_bias.Reading/1"


@dataclass(frozen=True)
class Reading:
    """What ``align="auto"`` reads of one model, kept so that its pairs are tested without the model."""

    embedding: Embedding  # the token table in float16 (as FingerprintCache keeps it) and the tokenizer's vocabulary
    prints: tuple[tuple[Int[Tensor, "n seq"], Fingerprint], ...]  # each fingerprint with the token IDs it read
    # each ID's class of identical embedding rows (float32, before the float16 copy): two IDs of one class give the
    # model one input, so a fingerprint made on either serves both (a real vocabulary repeats rows, e.g. unused tokens)
    rows: Int[Tensor, "d_vocab"]

    @classmethod
    def of(cls, model: Any, prints: Sequence[tuple[Tensor, Fingerprint]]) -> "Reading":
        """``model``'s reading, with its fingerprints (each with the ``[n, seq_len]`` token IDs it was made on)."""
        made = Embedding.of(model)
        if not prints:
            raise LensBiasError("a Reading needs at least one fingerprint with the tokens it was made on")
        rows = torch.unique(made.table, dim=0, return_inverse=True)[1]
        return cls(Embedding(made.table.half(), made.words), tuple((tokens.cpu().long(), fp) for tokens, fp in prints), rows)

    def on(self, tokens: Int[Tensor, "n seq"]) -> Fingerprint | None:
        """The fingerprint made on ``tokens`` (or on IDs of the same embedding rows), or None."""
        found = self.most(tokens)
        return found[0] if found is not None and bool(found[1].all()) else None

    def most(self, tokens: Int[Tensor, "n seq"]) -> tuple[Fingerprint, Bool[Tensor, "n"]] | None:
        """The fingerprint that read ``tokens`` on the most inputs, and which inputs (an input counts where every
        position reads the same embedding row); None where none was made on inputs of that shape."""
        best = None
        for read, fp in self.prints:
            if read.shape == tokens.shape:
                same = (self.rows[read] == self.rows[tokens]).all(dim=1)
                if best is None or int(same.sum()) > int(best[1].sum()):
                    best = (fp, same)
        return best

    @property
    def drawn(self) -> Int[Tensor, "n seq"] | None:
        """The token IDs its fingerprints' record draws (that of the first with a seed), or None."""
        return next((drawn_tokens(fp) for _, fp in self.prints if fp.inputs.kind == "tokens" and fp.inputs.seed is not None), None)

    @property
    def reads_drawn(self) -> bool:
        """Whether its first fingerprint read the drawn IDs themselves (not, as a renamed model's, the base's renamed)."""
        drawn = self.drawn
        return drawn is not None and torch.equal(self.prints[0][0], drawn)

    def save(self, path: Union[str, Path]) -> None:
        """Write to ``path`` (tensors and plain values only), atomically."""
        prints = [(tokens, fp.saved()) for tokens, fp in self.prints]
        atomic_save({"format": FORMAT, "table": self.embedding.table, "words": self.embedding.words, "rows": self.rows, "prints": prints}, path)

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Reading":
        """Read a reading written by :meth:`save`."""
        data = load_torch_file(path, "reading", "write one with lens-bias descendants --out or Reading.save")
        if data.get("format") != FORMAT:
            raise LensBiasError(f"{path} is not a lens_bias reading ({FORMAT}); write one with lens-bias descendants --out or Reading.save")
        prints = tuple((tokens, Fingerprint.from_saved({k: v for k, v in fp.items() if k != "format"})) for tokens, fp in data["prints"])
        return cls(Embedding(data["table"], data["words"]), prints, data["rows"])


class ReadingFiles(Mapping[str, Reading]):
    """Readings by model name, read from files when first asked for; the last ``hold`` read are kept in memory (a
    real model's table is hundreds of MB, and a lineage run asks for one width's models at a time).

    Args:
        files: each model's reading file, by the name the lineage run knows the model by.
        hold: readings kept in memory at once.
    """

    def __init__(self, files: Mapping[str, Union[str, Path]], hold: int = 32):
        self.files, self.hold, self.held = {name: Path(f) for name, f in files.items()}, hold, OrderedDict[str, Reading]()

    def __getitem__(self, name: str) -> Reading:
        if name not in self.held:
            self.held[name] = Reading.load(self.files[name])
            while len(self.held) > self.hold:
                self.held.popitem(last=False)
        self.held.move_to_end(name)
        return self.held[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    @classmethod
    def beside(cls, models: Sequence[str], folders: Sequence[Union[str, Path]], hold: int = 32) -> "ReadingFiles":
        """The readings of saved fingerprint files ``models``, found in ``folders`` under the same file names."""
        found = {p.name: p for folder in folders for p in Path(folder).glob("*.pt")}
        missing = [name for name in models if Path(name).name not in found]
        if missing:
            raise LensBiasError(f"{', '.join(map(str, folders))} hold no reading named like {missing[:3]}: pass the readings folder of every model's run")
        return cls({name: found[Path(name).name] for name in models}, hold)


def drawn_tokens(fp: Fingerprint) -> Int[Tensor, "n seq"]:
    """The token IDs a fingerprint's record draws (for a renamed suspect's, the base's IDs before the renaming)."""
    return regenerate_inputs(fp)[0:fp.n]


def saved_auto_test(a: Reading, b: Reading, test: LineageSettings, *, both_trained: bool = False) -> tuple[SeedPrintResult, bool] | None:
    """``compare(a, b)``'s default test from two readings: the maps read from their tables, the pair tested on the
    saved fingerprints made on the inputs the maps ask for (:func:`~lens_bias.seedprint.comparison.auto_pair`).

    ``compare`` draws its tokens in the base's vocabulary, so which model is the base decides the inputs: a model
    whose first fingerprint read the drawn IDs themselves (:attr:`Reading.reads_drawn`) is tried as the base first.

    Args:
        a: one model's reading.
        b: the other's.
        test: the published test run after the maps (its ``align`` is ignored).
        both_trained: whether both models are trained (the verdict then asks their tables to agree).

    Returns:
        The result (``n``: the inputs it was tested on) and whether ``a`` was the base; None where neither order has
        saved fingerprints on at least :data:`MIN_SHARE` of the inputs its maps ask for.
    """
    orders = [(a, b, True), (b, a, False)]
    if b.reads_drawn and not a.reads_drawn:
        orders.reverse()
    for base, suspect, a_first in orders:
        drawn = base.drawn
        if drawn is None:
            raise LensBiasError("saved_auto_test needs each reading to hold a fingerprint made on drawn token inputs (inputs='tokens'), whose record says what compare draws")
        settings = next(fp.inputs for _, fp in base.prints if fp.inputs.kind == "tokens" and fp.inputs.seed is not None).settings()
        result = auto_pair(Maps.read(base.embedding, suspect.embedding), settings, _saved_on(base, suspect, drawn), test, both_trained)
        if result is not None:
            return result, a_first
    return None


def _saved_on(base: Reading, suspect: Reading, drawn: Tensor) -> FingerprintsOn:
    """The two readings' saved fingerprints on the inputs a pair's maps ask for (``drawn``, the base's own drawn
    tokens, where they ask for none): each reading's fingerprint that holds the most of them, on the inputs both hold,
    or None where those are fewer than :data:`MIN_SHARE` of them."""

    def saved(read_a: Tensor | None, read_b: Tensor | None) -> tuple[Fingerprint, Fingerprint] | None:
        found_a, found_b = base.most(drawn if read_a is None else read_a), suspect.most(drawn if read_b is None else read_b)
        if found_a is None or found_b is None:
            return None
        (fp_a, same_a), (fp_b, same_b) = found_a, found_b
        kept = same_a & same_b
        return _on_inputs(fp_a, fp_b, kept) if int(kept.sum()) >= MIN_SHARE * len(kept) else None

    return saved


MIN_SHARE = 0.5
"""The share of the inputs a pair is tested on at least: where the token map pairs a token differently from the map a
saved fingerprint was made through (two near-identical rows of a quantised table, say), the inputs that hold it are
left out; the test is the published test on the rest, chosen by the tokens alone, before any feature is read."""


def _on_inputs(fp_a: Fingerprint, fp_b: Fingerprint, kept: Bool[Tensor, "n"]) -> tuple[Fingerprint, Fingerprint]:
    """The two fingerprints on the inputs ``kept``, under one input record (the readings' rows showed that they read
    the same inputs; their own records differ where one was made on a tensor of IDs, the other on drawn ones)."""
    record = fp_a.inputs
    if not bool(kept.all()):
        record = replace(record, n=int(kept.sum()), digest=f"{record.digest}[{int(kept.sum())} of {len(kept)} inputs]")

    def rows(fp: Fingerprint) -> Fingerprint:
        return replace(fp, features=fp.features[kept], normalized=None if fp.normalized is None else fp.normalized[kept], inputs=record)

    return rows(fp_a), rows(fp_b)
