"""Which token is which, and which residual basis is which, between a base and a suspect, read from their tokenizers
and weights: what ``align="auto"`` finds before it tests.

A descendant can be disguised by function-preserving edits combined: its residual basis permuted or rotated (the
norm gains folded, as QuaRot ships it) and its vocabulary renamed, with tokens added. Either edit alone leaves a
trace the other hides: a renaming is found from embedding rows compared in one basis, and a basis map is fitted on
the activations of token IDs that must mean the same tokens. So both are read here from what neither edit changes.

1. **Tokens** (:func:`token_map`). Where both models carry a tokenizer, their token strings give the correspondence
   exactly (common strings only, so added or removed tokens drop out). From the weights alone, each embedding row is
   described by what a rotation or a permutation of the basis leaves unchanged: its norm and the sizes of its
   coordinates on its table's own principal axes (O(V·D²)); on tables of at most :data:`QUADRATIC_ROWS` rows, where
   the principal axes of a random init are too alike to tell apart, also its largest cosines with the other rows of
   its own table and those rows' norms (O(V²·D)); a suspect whose rows are all larger by one factor (a residual
   scaled uniformly, which RMSNorm divides out) is described at the base's scale. Rows are matched on a
   description, an orthogonal map is fitted on the pairs that are each other's nearest, and every row is matched
   again by cosine in the base's basis, until the match settles. A description is refined only where an orthogonal
   map fitted on half of its pairs makes a share of the other half agree (unrelated tables are turned down at the
   cost of the description), and the match is accepted only where held-out rows find their counterpart at cosine
   :data:`MATCH_COSINE` (as :mod:`~lens_bias.seedprint.vocabulary` accepts a renaming), so unrelated tables are
   never paired. A suspect with fewer rows that none of this pairs (a trimmed vocabulary: some of the base's rows,
   in any order and basis) is matched from its own side, every suspect row to a base row, and the map is partial:
   -1 for the tokens it dropped.
2. **The basis** (:func:`basis_map`). Over the corresponding tokens, the map from the suspect's embedding rows to
   the base's: the identity, a permutation (Hungarian), a rotation (Procrustes) or a linear map (least squares),
   the simplest whose relative residual ``‖B·M − A‖ / ‖A‖`` (rows centred) is at most :data:`FIT`. A table holds far
   more rows than the width, so the map is fitted on weights, not on the test's inputs. Models trained from other
   seeds on the same data do not share their tables up to a rotation (measured residual 1.10, against 0.995 for a
   fresh init and 2e-7 for a rotated descendant), so no map is accepted between them.

>>> import lens_bias
>>> from lens_bias.models.reparametrise import rename_vocabulary, rotate_residual
>>> base = lens_bias.random_init("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=300, n_ctx=8)
>>> disguised = rename_vocabulary(rotate_residual(base, seed=1), seed=2)
>>> tokens = token_map(base, disguised)
>>> tokens.source, bool((tokens.ids == disguised.lens_bias_vocabulary).all())
('weights', True)
>>> basis_map(base, disguised, tokens).kind
'orthogonal'
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator, Literal, Union, get_args

import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_bias.core.errors import LensBiasError
from lens_bias.core.stats import unit
from lens_bias.seedprint.align import map_matrix
from lens_bias.seedprint.vocabulary import MATCH_COSINE, SAME_TABLE, is_renamed, nearest_rows, table_sketch

__all__ = ["Embedding", "TokenMap", "BasisMap", "token_map", "basis_map", "FIT", "BASIS_KINDS", "PARTIAL_KINDS", "QUADRATIC_ROWS", "SCALE_TOLERANCE"]

logger = logging.getLogger(__name__)

FIT = 0.5
"""The largest relative residual of an accepted basis map. Descendants whose tables were quantised or fine-tuned stay
far below it; tables of unrelated models, trained or not, stay near 1 (no map makes them one table)."""

NORM_SPREAD = 0.25
"""The largest relative difference between the two tables' row-norm quantiles (over their medians) of tables that
may be one table: 4-bit quantisation and short fine-tunes move them by a few percent; a trained table against a
random init differs by far more."""

SCALE_TOLERANCE = 0.05
"""The relative difference of two tables' median row norms beyond which the suspect's rows are described at the
base's scale (:func:`token_map` from the weights): a uniform scale of the residual (every row × c, the same function
under RMSNorm) moves every norm by one factor, where quantisation and short fine-tunes move the median by about a
percent, whose descriptions stay as they are."""

SquareKind = Literal["identity", "permutation", "orthogonal", "linear"]
PartialKind = Literal["partial-permutation", "partial-orthogonal"]
Kind = Union[SquareKind, PartialKind]
BASIS_KINDS: tuple[SquareKind, ...] = get_args(SquareKind)
"""The maps :func:`basis_map` tries between tables of one width, simplest first."""
PARTIAL_KINDS: tuple[PartialKind, ...] = get_args(PartialKind)
"""The maps it tries between tables of two widths, simplest first: the narrower's channels are a subset of the
wider's (a pruned width), kept in another order, or a rotation of such a subset."""

QUADRATIC_ROWS = 16384
"""The largest table whose rows are also described by their neighbourhoods, a pass quadratic in the rows (20 min at
Gemma 3's 262k rows on 2 cores). Larger (real) tables are matched on their principal axes alone."""

# Principal axes that describe a row, tried in turn: few are the least disturbed by quantisation; more tell rows apart
# (Gemma 3's 4-bit copy needs 32).
_AXES = (16, 32, 64)
# Nearest neighbours that describe a row, tried in turn: few are the least disturbed by tokens added or removed and by
# quantisation; more tell rows apart in a table with more structure.
_NEIGHBOURS = (4, 8)
# The share of a start's held-out pairs that must agree, after an orthogonal map fitted on its other pairs, for the
# start to be refined: unrelated tables give none (independent rows' cosines stay near 1/√D); a start refinement can
# recover holds several percent of right pairs.
_PROMISING = 0.01
_ROUNDS = 10  # refinements of a match at most (they settle in three or four)
_SAMPLE = 2048  # rows matched on a description, then rows held out to judge the refined match
_ROWS = 8192  # corresponding rows a basis map is fitted on
_CELLS = 1024  # cells of the coarse index the last match looks rows up in
_PROBES = 8  # cells a row is looked up in: its own and the nearest others
_LOOKUP_AXES = 64  # principal axes the last match shortlists rows on (a ninth of SmolLM2's width: 9x fewer products)
_AXES_ROWS = 16384  # rows those axes are computed from (enough to fix 64 axes; Gemma's table has 262k)
_KMEANS_ROUNDS = 2  # k-means rounds that even out the cells (the largest of SmolLM2's 49k rows: 4155 rows from random centres, 1771 after two)
_SHORTLIST = 4  # shortlisted rows per base row, ranked by their full cosine
_BLOCK_BYTES = 1 << 28  # cosines computed 256 MB at a time
_CLOSEST_CHUNK = 1024  # table rows a nearest-row search reads at a time (0.3-0.5 s for 2048 rows against 262k on 2 cores)


@dataclass(frozen=True)
class TokenMap:
    """The suspect's ID of each of the base's tokens (``ids[i]``, -1 where it has none) and where that came from."""

    ids: Int[Tensor, "v_base"]
    source: Literal["same", "tokenizer", "weights", "none"]  # "same": every shared ID is the same token; "none": unknown

    @property
    def renamed(self) -> bool:
        """Whether some token has another ID in the suspect."""
        known = self.ids >= 0
        return bool((self.ids[known] != torch.arange(len(self.ids))[known]).any())

    @property
    def shared(self) -> Int[Tensor, "k"]:
        """The base's IDs that the suspect has too."""
        return (self.ids >= 0).nonzero().flatten()


@dataclass(frozen=True)
class BasisMap:
    """The map from the suspect's residual basis to the base's (``x_suspect @ matrix ≈ x_base``), its kind, and how
    well it makes the two embedding tables one table (``residual``: relative, rows centred). Between two widths the
    matrix is ``[d_suspect, d_base]``: orthonormal rows where the suspect is the narrower (its channels a subset of
    the base's, or a rotation of one), orthonormal columns where it is the wider."""

    kind: Kind | Literal["none"]  # "none": no map fits; the tables are not one
    matrix: Float[Tensor, "d_suspect d_base"] | None
    residual: float

    def __call__(self, x: Float[Tensor, "n d_suspect"]) -> Float[Tensor, "n d_base"]:
        return x if self.matrix is None else (x.double() @ self.matrix.double()).to(x.dtype)

    def compared(self, base: Float[Tensor, "n d_base"], suspect: Float[Tensor, "n d_suspect"]) -> tuple[Tensor, Tensor]:
        """The base's and the suspect's rows as the lineage test and the table fit compare them, in the base's basis:
        the suspect mapped, and where it is the narrower, both over the base channels it kept (the base's rows
        projected on the span the map reaches, over the channels that span holds at least half of: exactly the
        kept channels of a width pruned in the base's basis, every channel of one pruned after a rotation)."""
        if self.matrix is None or self.matrix.shape[0] >= self.matrix.shape[1]:
            return base, self(suspect)
        projector = self.matrix.double().T @ self.matrix.double()  # [d_base, d_base], onto the span the suspect's channels reach
        kept = projector.diagonal() > 0.5
        return (base.double() @ projector[:, kept]).to(base.dtype), self(suspect)[:, kept]


@dataclass(frozen=True)
class Embedding:
    """What the maps read of a model: its token embedding table and its tokenizer's vocabulary (None without one).
    A lineage run keeps these instead of the models (``LineageRun.embedding``); the descriptions of its rows are
    computed once per table, however many pairs it is read in."""

    table: Float[Tensor, "d_vocab d_model"]
    words: dict[str, int] | None

    @cached_property
    def principal(self) -> Float[Tensor, "d_vocab k"] | None:
        """Each row's norm and the sizes of its coordinates on the table's principal axes, as many as the width allows
        (at most 64; fewer axes are its first columns); None where the width allows none."""
        axes = _axes(self.table.shape[1])
        return _principal(self.table.float(), axes[-1]) if axes else None

    @cached_property
    def sketch(self) -> Float[Tensor, "d_vocab k"]:
        """The rows' sketch (:func:`~lens_bias.seedprint.vocabulary.table_sketch`), in the table's own basis."""
        return table_sketch(self.table.float())

    @classmethod
    def of(cls, model: Any) -> "Embedding":
        """``model``'s (an :class:`Embedding` is returned as it is)."""
        if isinstance(model, Embedding):
            return model
        w_e = getattr(model, "W_E", None)
        if not isinstance(w_e, Tensor) or w_e.ndim != 2:
            raise LensBiasError(f"{type(model).__name__} has no token embedding W_E [d_vocab, d_model] to read its tokens from")
        tokenizer = getattr(model, "tokenizer", None)
        vocab = tokenizer.get_vocab() if tokenizer is not None and hasattr(tokenizer, "get_vocab") else None
        return cls(w_e.detach().float().cpu(), dict(vocab) if isinstance(vocab, dict) and vocab else None)


def token_map(base: Any, suspect: Any, *, seed: int = 0) -> TokenMap:
    """The suspect's ID for each of the base's tokens.

    Args:
        base: the base model (or its :class:`Embedding`).
        suspect: the suspect, of any basis and vocabulary order.
        seed: which rows are sampled to match and to judge the match.

    Returns:
        A :class:`TokenMap`: from the tokenizers' strings where both models carry one and the rows they pair agree
        (up to a basis map); else from the embedding rows (``source="weights"``) when they are one table up to a
        basis map and a renaming; ``source="same"`` (the identity) where the kept order agrees; where the rows match
        nothing, the tokenizers' map, or the identity with ``source="none"``.
    """
    a, b = Embedding.of(base), Embedding.of(suspect)
    table_a, table_b, words_a, words_b = a.table.float(), b.table.float(), a.words, b.words
    v_a = table_a.shape[0]
    by_words = None
    if words_a is not None and words_b is not None:
        ids = torch.full((v_a,), -1, dtype=torch.long)
        for word, i in words_a.items():
            j = words_b.get(word)
            if j is not None and i < v_a and j < table_b.shape[0]:
                ids[i] = j
        source: Literal["same", "tokenizer"] = "same" if bool((ids[ids >= 0] == (ids >= 0).nonzero().flatten()).all()) else "tokenizer"
        by_words = TokenMap(ids, source)
        # trusted where the rows it pairs agree; a copy renamed without its tokenizer, for one, is read from its rows
        if _one_table(table_a, table_b, ids, seed):
            return by_words
    identity = torch.arange(v_a)
    identity[identity >= table_b.shape[0]] = -1
    if _one_table(table_a, table_b, identity, seed):  # the cheap check first: most suspects keep their token order
        return TokenMap(identity, "same")
    renamed = _renamed_in_place(a, b, seed) if table_a.shape[1] == table_b.shape[1] else None  # a renaming that kept the basis: cheap to find
    if renamed is not None:
        return TokenMap(renamed, "weights")
    if not _norms_agree(table_a, table_b):  # no map makes them one table: the quadratic match is not needed to say so
        return by_words if by_words is not None else TokenMap(identity, "none")
    matched = _match_rows(a, b, seed)
    if matched is None and table_b.shape[0] < v_a:  # fewer rows: a trimmed vocabulary keeps some of the base's
        matched = _kept_rows(a, b, seed)
    if matched is None:  # the rows tell nothing: the tokenizers' word, where there is one
        return by_words if by_words is not None else TokenMap(identity, "none")
    return TokenMap(matched, "same" if bool((matched == torch.arange(v_a)).all()) else "weights")


def _kept_rows(a: Embedding, b: Embedding, seed: int) -> Int[Tensor, "v_a"] | None:
    """The suspect's row for each base row it kept, when the suspect's rows are some of the base's (a trimmed
    vocabulary, in any basis): every suspect row is matched to its base row as a renaming is found, from the
    suspect's side (each suspect row has its base row; not every base row has one), and the match inverted, -1 for
    the base's tokens the suspect dropped; None where that partial map does not make the rows one table."""
    back = _renamed_in_place(b, a, seed) if a.table.shape[1] == b.table.shape[1] else None
    back = _match_rows(b, a, seed) if back is None else back
    if back is None:
        return None
    ids = torch.full((a.table.shape[0],), -1, dtype=torch.long)
    ids[back] = torch.arange(b.table.shape[0])  # a base row two suspect rows match (a duplicated row) keeps the later
    return ids if _one_table(a.table.float(), b.table.float(), ids, seed) else None


def _neighbourhoods(table: Tensor, k: int, rows: Tensor | None = None) -> Tensor:
    """Each row's norm, its ``k`` largest cosines with the table's other rows (largest first) and those rows' norms:
    a description that a rotation or a permutation of the basis leaves unchanged, and a renaming only reorders.
    Only ``rows`` (default: all) are described, each against the whole table; ``_described(..., j)`` keeps the
    first ``j`` neighbours of it."""
    norms, units = table.norm(dim=1), unit(table)
    rows = torch.arange(table.shape[0]) if rows is None else rows
    block = max(1, _BLOCK_BYTES // (4 * table.shape[0]))
    top, where = [], []
    for start in range(0, len(rows), block):
        chunk = rows[start:start + block]
        cosine = units[chunk] @ units.T
        cosine[torch.arange(len(chunk)), chunk] = -2.0  # not itself
        values, index = cosine.topk(k, dim=1)
        top.append(values)
        where.append(index)
    index = torch.cat(where)
    return torch.cat([norms[rows, None], torch.cat(top), norms[index]], dim=1)


def _axes(width: int) -> list[int]:
    """The numbers of principal axes (``_AXES``) a table of this width is described on, fewest first."""
    return [k for k in _AXES if k < width]


def _principal(table: Tensor, k: int) -> Tensor:
    """Each row's norm and the sizes of its coordinates on the table's ``k`` first principal axes (rows centred; the
    largest first): a description that a rotation or a permutation of the basis leaves unchanged (each axis turns
    with the basis, and only its sign is arbitrary), and a renaming only reorders."""
    centred, axes = _top_axes(table, k)
    coordinates = (centred @ axes).abs().float()
    return torch.cat([table.norm(dim=1, keepdim=True), coordinates], dim=1)


def _top_axes(rows: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """``rows`` centred (float64) and their ``k`` first principal axes ``[d, k]``, the largest first."""
    centred = rows.double() - rows.double().mean(dim=0)
    _, axes = torch.linalg.eigh(centred.T @ centred)  # ascending
    return centred, axes[:, -k:].flip(1)


def _descriptions(a: Embedding, b: Embedding, rows: Tensor) -> Iterator[tuple[str, Tensor, Tensor]]:
    """Descriptions of the base's ``rows`` and of every suspect row, in the order they are tried (:func:`_match_rows`):
    principal axes, then, on small tables, neighbourhoods."""
    scale = _uniform_scale(a.table, b.table)  # every description is linear in the rows' size, or (cosines) blind to it
    if a.principal is not None and b.principal is not None:  # computed for the most axes; fewer are the first columns
        most_a, most_b = a.principal[rows], b.principal / scale
        for k in _axes(a.table.shape[1]):
            yield f"{k} principal axes", most_a[:, :1 + k], most_b[:, :1 + k]
    rows_a, rows_b = a.table.shape[0], b.table.shape[0]
    usable = [k for k in _NEIGHBOURS if k < min(rows_a, rows_b)]
    if not usable or max(rows_a, rows_b) > QUADRATIC_ROWS:
        return
    # the base's sampled rows against its table, every suspect row against its own (the quadratic step), for the most
    # neighbours; fewer are read from the same pass
    most_a, most_b = _neighbourhoods(a.table.float(), usable[-1], rows), _neighbourhoods(b.table.float() / scale, usable[-1])
    for k in usable:
        yield f"{k} neighbours", _described(most_a, k), _described(most_b, k)


def _promising(table_a: Tensor, table_b: Tensor, rows: Tensor, matched: Tensor) -> bool:
    """Whether a start (``matched[k]``: ``b``'s row for ``a``'s row ``rows[k]``) holds right pairs: an orthogonal map
    fitted on its even pairs brings :data:`_PROMISING` of its odd pairs to cosine :data:`MATCH_COSINE`."""
    fit, held = slice(0, None, 2), slice(1, None, 2)
    q = map_matrix("orthogonal", table_a[rows[fit]], table_b[matched[fit]]).float()
    cosine = (unit(table_a[rows[held]]) * unit(table_b[matched[held]] @ q)).sum(dim=1)
    return (cosine >= MATCH_COSINE).float().mean().item() >= _PROMISING


def _described(neighbourhoods: Tensor, k: int) -> Tensor:
    """The description with ``k`` neighbours out of one computed with more (the norm, then k cosines, then k norms)."""
    most = (neighbourhoods.shape[1] - 1) // 2
    return torch.cat([neighbourhoods[:, :1 + k], neighbourhoods[:, 1 + most:1 + most + k]], dim=1)


def _uniform_scale(table_a: Tensor, table_b: Tensor) -> float:
    """The factor by which the suspect's rows are larger than the base's, from their median norms: 1 within
    :data:`SCALE_TOLERANCE`, so that a quantised or fine-tuned table is read as it is."""
    ratio = (table_b.norm(dim=1).median() / table_a.norm(dim=1).median().clamp_min(1e-12)).item()
    return ratio if abs(ratio - 1) > SCALE_TOLERANCE else 1.0


def _norms_agree(table_a: Tensor, table_b: Tensor) -> bool:
    """Whether the two tables' row norms have one distribution (quantiles 1-99%, over their medians, within
    :data:`NORM_SPREAD`): a basis map and a renaming keep every norm and quantisation or a fine-tune barely moves
    them, so tables that differ here are not one table, and the quadratic row match is not run on them."""
    levels = torch.linspace(0.01, 0.99, 99, dtype=torch.float64)
    qa, qb = (torch.quantile(t.norm(dim=1).double(), levels) for t in (table_a, table_b))
    qa, qb = qa / qa[49].clamp_min(1e-12), qb / qb[49].clamp_min(1e-12)  # levels[49] is the median
    return bool(((qa - qb).abs() / qa.clamp_min(1e-12)).max() <= NORM_SPREAD)


def _renamed_in_place(a: Embedding, b: Embedding, seed: int) -> Int[Tensor, "v_a"] | None:
    """The renaming of a suspect that kept the base's basis: decided on the 64-dimensional sketches of sampled rows
    (:func:`~lens_bias.seedprint.vocabulary.is_renamed`), each row then looked up among the suspect's
    (:func:`_nearest_everywhere`) and the whole checked on the rows themselves; None otherwise."""
    if not is_renamed(a.sketch, b.sketch, seed=seed):
        return None
    table_a, table_b = a.table.float(), b.table.float()
    ids = _nearest_everywhere(unit(table_a), unit(table_b))
    return ids if _one_table(table_a, table_b, ids, seed) else None


def _match_rows(a: Embedding, b: Embedding, seed: int) -> Int[Tensor, "v_a"] | None:
    """The suspect's row for every base row, when the tables are one table up to a basis map and a renaming: rows
    matched on each description in turn (:func:`_descriptions`), a promising start (:func:`_promising`) refined
    (:func:`_refined`) and judged on held-out rows."""
    table_a, table_b = a.table.float(), b.table.float()
    if table_a.shape[1] != table_b.shape[1]:
        return None
    order = torch.randperm(table_a.shape[0], generator=torch.Generator().manual_seed(seed))
    fit_rows, judged = order[:_SAMPLE], order[_SAMPLE:2 * _SAMPLE]
    judged = judged if len(judged) else fit_rows
    for name, described_a, described_b in _descriptions(a, b, fit_rows):
        centre, spread = described_a.mean(dim=0), described_a.std(dim=0).clamp_min(1e-12)
        start = _closest((described_a - centre) / spread, (described_b - centre) / spread)
        if not _promising(table_a, table_b, fit_rows, start):
            continue
        mapped, unit_a = unit(table_b @ _refined(table_a, table_b, fit_rows, start)), unit(table_a)
        cosine, _ = nearest_rows(unit_a[judged], mapped)
        if (cosine >= MATCH_COSINE).float().mean().item() >= SAME_TABLE:
            logger.info("the suspect's embedding rows are the base's under a basis map and a renaming (rows matched on %s): tokens follow them", name)
            return _nearest_everywhere(unit_a, mapped)
    return None


def _nearest_everywhere(unit_a: Tensor, mapped: Tensor) -> Tensor:
    """Each base row's nearest suspect row, once both are in one basis, as an inverted-file index finds it: both
    tables are projected on the base's :data:`_LOOKUP_AXES` first principal axes, where a row and its counterpart stay
    close; the suspect's projected rows are grouped into :data:`_CELLS` cells (a few rounds of k-means, so that a
    dense region of a real vocabulary is split instead of filling one cell); each base row shortlists its
    :data:`_SHORTLIST` nearest projected rows among the cells of the :data:`_PROBES` centres nearest its own, and the
    shortlisted row of the largest full cosine is its match. Rows whose
    match stays below :data:`MATCH_COSINE` are searched again in full. A full search of every row is quadratic in the
    vocabulary (30 s at SmolLM2's 49k rows on one core; this, 3-5 s)."""
    if mapped.shape[0] <= _CELLS * _PROBES:
        return nearest_rows(unit_a, mapped)[1]
    generator = torch.Generator().manual_seed(0)
    axes = _top_axes(unit_a[torch.randperm(unit_a.shape[0], generator=generator)[:_AXES_ROWS]], _LOOKUP_AXES)[1].float()
    low_a, low_b = unit_a @ axes, mapped @ axes
    centres = low_b[torch.randperm(low_b.shape[0], generator=generator)[:_CELLS]]
    for _ in range(_KMEANS_ROUNDS):
        cell = _nearest_centre(low_b, centres)
        counts = torch.bincount(cell, minlength=_CELLS)
        sums = torch.zeros_like(centres).index_add_(0, cell, low_b)
        centres = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None], centres)
    in_a, in_b = (_cells(_nearest_centre(x, centres)) for x in (low_a, low_b))
    probed = torch.cdist(centres, centres).topk(_PROBES, dim=1, largest=False).indices  # each cell's nearest, itself first
    index = torch.empty(unit_a.shape[0], dtype=torch.long)
    for c, rows in enumerate(in_a):
        if len(rows):
            candidates = torch.cat([in_b[k] for k in probed[c].tolist()])
            near = torch.cdist(low_a[rows], low_b[candidates]).topk(min(_SHORTLIST, len(candidates)), dim=1, largest=False).indices
            shortlist = candidates[near].sort(dim=1).values  # duplicate rows tie: the lowest ID, whatever the cells' order
            cosine = (unit_a[rows, None, :] * mapped[shortlist]).sum(dim=-1)
            index[rows] = shortlist.gather(1, cosine.argmax(dim=1, keepdim=True)).squeeze(1)
    missed = ((unit_a * mapped[index]).sum(dim=1) < MATCH_COSINE).nonzero().flatten()
    if len(missed):
        index[missed] = nearest_rows(unit_a[missed], mapped)[1]
    return index


def _nearest_centre(rows: Tensor, centres: Tensor) -> Tensor:
    """Each row's nearest centre by Euclidean distance (``argmax x·c − |c|²/2``), in blocks."""
    block = max(1, _BLOCK_BYTES // (4 * centres.shape[0]))
    offset = 0.5 * (centres * centres).sum(dim=1)
    return torch.cat([(rows[start:start + block] @ centres.T - offset).argmax(dim=1) for start in range(0, rows.shape[0], block)])


def _cells(cell: Tensor) -> list[Tensor]:
    """The rows in each cell, from each row's cell."""
    return list(torch.argsort(cell).split(torch.bincount(cell, minlength=_CELLS).tolist()))


def _closest(rows: Tensor, table: Tensor) -> Tensor:
    """The index of each row's nearest row of ``table`` by Euclidean distance (``argmin |t|² − 2 x·t``), the table read
    :data:`_CLOSEST_CHUNK` rows at a time against every row at once, keeping the best so far: the distances of a chunk
    stay in cache, where blocks of rows against the whole table (Gemma 3's 262k rows) wrote a quarter of a GB each and
    took 5x longer."""
    best = torch.full((rows.shape[0],), float("inf"))
    index = torch.zeros(rows.shape[0], dtype=torch.long)
    for start in range(0, table.shape[0], _CLOSEST_CHUNK):
        chunk = table[start:start + _CLOSEST_CHUNK]
        distance, where = torch.addmm((chunk * chunk).sum(dim=1)[None, :], rows, chunk.T, alpha=-2).min(dim=1)
        closer = distance < best  # strict: a tie keeps the earlier row, as one argmin over the whole table would
        best, index = torch.where(closer, distance, best), torch.where(closer, where + start, index)
    return index


def _refined(table_a: Tensor, table_b: Tensor, rows: Tensor, matched: Tensor) -> Tensor:
    """The orthogonal map from ``b``'s basis to ``a``'s, refined from a rough match (``matched[k]``: ``b``'s row for
    ``a``'s row ``rows[k]``): fitted on the mutually nearest pairs, then every row matched again by cosine, until the
    match stops changing. A start with a fair share of right pairs converges in a few rounds."""
    unit_rows = unit(table_a[rows])
    keep = torch.arange(len(rows))
    q = torch.eye(table_a.shape[1])
    for _ in range(_ROUNDS):
        q = map_matrix("orthogonal", table_a[rows[keep]], table_b[matched[keep]]).float()
        mapped = unit(table_b @ q)
        _, again = nearest_rows(unit_rows, mapped)
        _, back = nearest_rows(mapped[again], unit_rows)
        keep = (back == torch.arange(len(rows))).nonzero().flatten()  # pairs each other's nearest
        if torch.equal(again, matched) or len(keep) < 2:
            break
        matched = again
    return q


def _one_table(table_a: Tensor, table_b: Tensor, ids: Tensor, seed: int) -> bool:
    """Whether the rows ``ids`` names are the base's up to an orthogonal map (cosine above MATCH_COSINE); between two
    widths, up to a partial one (a pruned width), judged on rows it was not fitted on."""
    shared = (ids >= 0).nonzero().flatten()
    if len(shared) < 2 * max(table_a.shape[1], table_b.shape[1]):
        return False
    same_width = table_a.shape[1] == table_b.shape[1]
    # two widths: half the rows fit a map of up to d_wide · d_narrow entries, so more rows are read
    rows = shared[torch.randperm(len(shared), generator=torch.Generator().manual_seed(seed))[:_SAMPLE if same_width else _ROWS]]
    if same_width:
        q = map_matrix("orthogonal", table_a[rows], table_b[ids[rows]]).float()
        cosine = (unit(table_a[rows]) * unit(table_b[ids[rows]] @ q)).sum(dim=1)
    else:  # a map onto a subspace of the wider table can fit more of its own rows: held-out rows judge it
        fit, held = rows[0::2], rows[1::2]
        partial = BasisMap("partial-orthogonal", _partial_orthogonal(table_a[fit], table_b[ids[fit]]), 0.0)
        rows_a, rows_b = partial.compared(table_a[held], table_b[ids[held]])
        cosine = (unit(rows_a) * unit(rows_b)).sum(dim=1)
    return (cosine >= MATCH_COSINE).float().mean().item() >= SAME_TABLE


def basis_map(base: Any, suspect: Any, tokens: TokenMap, *, seed: int = 0) -> BasisMap:
    """The simplest map (:data:`BASIS_KINDS`; between two widths :data:`PARTIAL_KINDS`) that makes the suspect's
    embedding rows the base's, over the tokens ``tokens`` pairs, with a residual at most :data:`FIT`; ``kind="none"``
    (and the smallest residual) where none does. Between two widths the residual is taken over the channels the
    narrower table keeps (:meth:`BasisMap.compared`), on rows the map was not fitted on.

    Args:
        base: the base model (or its :class:`Embedding`).
        suspect: the suspect.
        tokens: the suspect's ID for each base token (:func:`token_map`).
        seed: which corresponding rows the maps are fitted on (at most 8192).

    Returns:
        A :class:`BasisMap`, to apply to the suspect's features read before the final norm's gain.
    """
    table_a, table_b = Embedding.of(base).table, Embedding.of(suspect).table
    shared = tokens.shared
    if len(shared) < 2:
        return BasisMap("none", None, float("inf"))
    rows = shared[torch.randperm(len(shared), generator=torch.Generator().manual_seed(seed))[:_ROWS]]
    a, b = table_a[rows].double(), table_b[tokens.ids[rows]].double()
    if table_a.shape[1] != table_b.shape[1]:
        return _partial_map(a, b)
    ca, cb = a - a.mean(0), b - b.mean(0)
    scale = ca.norm().clamp_min(1e-12)
    smallest = float("inf")
    for kind in BASIS_KINDS:  # simplest first: a map is fitted only where the simpler ones do not fit
        matrix = None if kind == "identity" else map_matrix(kind, a, b)
        residual = ((cb if matrix is None else cb @ matrix) - ca).norm().item() / scale.item()
        if residual <= FIT:
            return BasisMap(kind, matrix, residual)
        smallest = min(smallest, residual)
    return BasisMap("none", None, smallest)


def _partial_map(a: Tensor, b: Tensor) -> BasisMap:
    """The simplest of :data:`PARTIAL_KINDS` that makes the suspect's rows ``b`` the base's ``a`` (corresponding
    rows of two widths), fitted on every other row and judged on the rest: a map onto a subspace of the wider
    table has more freedom than a square one to fit rows of unrelated tables. The residual is read after the best
    positive factor on the mapped rows: a uniform scale of the residual stream (which RMSNorm divides out) is no
    reason to refuse a map, and between two widths no linear map is tried to absorb it."""
    fit, held = slice(0, None, 2), slice(1, None, 2)
    smallest = float("inf")
    for kind in PARTIAL_KINDS:
        matrix = map_matrix("permutation", a[fit], b[fit]) if kind == "partial-permutation" else _partial_orthogonal(a[fit], b[fit])
        candidate = BasisMap(kind, matrix, 0.0)
        ca, cb = candidate.compared(a[held] - a[fit].mean(0), b[held] - b[fit].mean(0))
        factor = ((ca * cb).sum() / (cb * cb).sum().clamp_min(1e-300)).clamp_min(0.0)
        residual = (factor * cb - ca).norm().item() / ca.norm().clamp_min(1e-12).item()
        if residual <= FIT:
            return BasisMap(kind, candidate.matrix, residual)
        smallest = min(smallest, residual)
    return BasisMap("none", None, smallest)


def _partial_orthogonal(a: Tensor, b: Tensor) -> Tensor:
    """The ``[d_b, d_a]`` map with orthonormal rows or columns that takes the suspect's rows ``b`` to the base's ``a``
    (corresponding rows of two widths): the narrower table regressed on the wider (rows centred; exact for a width
    pruned in any basis, where the narrower is the wider times a matrix of orthonormal columns), then made the
    nearest matrix of orthonormal columns (the polar factor). A Procrustes fit from the narrower side would lean
    towards the wider table's directions of largest variance instead."""
    ca, cb = a.double() - a.double().mean(0), b.double() - b.double().mean(0)
    narrow_b = cb.shape[1] < ca.shape[1]
    wide, narrow = (ca, cb) if narrow_b else (cb, ca)
    u, _, vh = torch.linalg.svd(torch.linalg.lstsq(wide, narrow).solution, full_matrices=False)  # [d_wide, d_narrow]
    polar = u @ vh
    return polar.T if narrow_b else polar
