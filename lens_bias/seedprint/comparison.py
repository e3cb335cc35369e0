"""Two models compared (:func:`compare`), by default through the maps read from their weights (``align="auto"``).

The default test reads the suspect's ID of each base token and the map from its residual basis to the base's from
the two models' embeddings (:class:`Maps`, :mod:`~lens_bias.seedprint.correspondence`), fingerprints both on the
tokens they share and runs the published :func:`~lens_bias.seedprint.lineage.lineage_test` in the base's basis;
where nothing was renamed or rotated, this is the published test, to the same p. :func:`auto_pair` is that test's
one pipeline: :func:`compare`, :func:`~lens_bias.seedprint.pairwise_lineage` and the saved readings
(:func:`~lens_bias.seedprint.readings.saved_auto_test`) differ only in where the two fingerprints come from.

>>> import lens_bias
>>> small = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> base, copy = (lens_bias.random_init("llama", seed=1, **small) for _ in range(2))
>>> result = compare(base, copy, n=64, seq_len=16, progress=False)
>>> result.same_lineage, result.basis_map
(True, 'identity')
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import RandomTokens
from lens_bias.core.settings import overridden, route_keywords
from lens_bias.seedprint.correspondence import FIT, BasisMap, Embedding, TokenMap, basis_map, token_map
from lens_bias.seedprint.fingerprints import Fingerprint, FingerprintSettings, fingerprint, regenerate_inputs
from lens_bias.seedprint.lineage import COMPARE, LineageSettings, SeedPrintResult, caveats, lineage_test
from lens_bias.seedprint.nulls import AnalyticNull
from lens_bias.seedprint.tables import TableAgreement, table_agreement
from lens_bias.seedprint.vocabulary import renamed_tokens

__all__ = ["compare", "auto_test", "auto_pair", "FingerprintsOn", "Maps", "mapped_inputs", "through_maps", "mapped_test", "fingerprint_like"]


@one_adapter_per_call
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
    renaming, which leaves the model the same on text, cannot hide it; ``renamed_vocabulary`` says so. Between
    models of two widths the default fits a partial map (:data:`~lens_bias.seedprint.correspondence.PARTIAL_KINDS`:
    the narrower's channels a subset of the wider's, as width pruning leaves them) and tests over the channels both
    hold; where none fits, the pair is unrelated (p 1, ``reason`` gives the fit). The other tests refuse two widths.

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
    info_a, info_b = ModelAdapter.of(model_a).info, ModelAdapter.of(model_b).info
    if info_a.d_model != info_b.d_model and testing.align != "auto":
        raise LensBiasError(f"align={testing.align!r} compares models of one width (d_model {info_a.d_model} vs {info_b.d_model}); "
                            "the default test (align='auto') maps a pruned width into the base's channels")
    drawn_tokens = isinstance(prints.inputs, str) and prints.inputs == "tokens"
    if prints.vocab is None and drawn_tokens:
        prints = replace(prints, vocab=min(info_a.d_vocab, info_b.d_vocab))
    if testing.align == "auto":
        return auto_test(model_a, model_b, prints, testing, progress=progress)
    fp_a = fingerprint(model_a, prints, progress=progress)
    fp_b = fingerprint_like(model_b, model_a, fp_a, prints, progress=progress) if drawn_tokens else fingerprint(model_b, prints, progress=progress)
    result = replace(lineage_test(fp_a, fp_b, testing, progress=progress), renamed_vocabulary=fp_b.inputs.renamed)
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

    def made_or_make(read_a: Tensor | None, read_b: Tensor | None) -> tuple[Fingerprint, Fingerprint]:
        return _reused(made[0], model_a, prints, read_a, progress), _reused(made[1], model_b, prints, read_b, progress)

    both_trained = ModelAdapter.of(model_a).info.regime == ModelAdapter.of(model_b).info.regime == "trained"
    result = auto_pair(maps, prints, made_or_make, test, both_trained)
    assert result is not None  # made_or_make always has the two fingerprints
    return result


FingerprintsOn = Callable[[Optional[Tensor], Optional[Tensor]], Optional[tuple[Fingerprint, Fingerprint]]]
"""Where a driver of :func:`auto_pair` finds the pair's fingerprints: given the base's and the suspect's token inputs
(both None: each model's own drawn inputs), the two fingerprints on them, or None where it has none."""


def auto_pair(maps: Maps, prints: FingerprintSettings, on: FingerprintsOn, test: LineageSettings, both_trained: bool) -> SeedPrintResult | None:
    """The default test (``align="auto"``) of one pair, wherever its fingerprints come from: the inputs the token map
    asks for (:func:`mapped_inputs`), the two fingerprints on them from ``on``, then the published test through the
    basis map (:func:`through_maps`). :func:`compare`, :func:`~lens_bias.seedprint.pairwise_lineage` and
    :func:`~lens_bias.seedprint.readings.saved_auto_test` each say only where the fingerprints come from.

    Args:
        maps: :meth:`Maps.read` of the two models.
        prints: how both are fingerprinted (drawn tokens).
        on: the two fingerprints on the inputs the maps ask for (:data:`FingerprintsOn`).
        test: the published test run after the maps (its ``align`` is ignored).
        both_trained: whether both models are trained (the verdict then asks their tables to agree).

    Returns:
        The result with the maps recorded, or None where ``on`` has no fingerprints on those inputs.
    """
    if maps.unmapped_widths:  # unrelated by their tables alone: no fingerprints needed
        return _verdict(maps, _widths_unmapped(maps, prints.n, replace(test, align=None)), both_trained)
    inputs = mapped_inputs(maps, prints)
    found = on(None, None) if inputs is None else on(*inputs)
    return None if found is None else through_maps(maps, found[0], found[1], test, both_trained)


@dataclass(frozen=True)
class Maps:
    """What ``align="auto"`` reads from two models' weights before it tests (:mod:`~lens_bias.seedprint.correspondence`):
    the suspect's ID of each base token, the map from its residual basis to the base's, and how far the two embedding
    tables agree once mapped (:mod:`~lens_bias.seedprint.tables`)."""

    tokens: TokenMap
    basis: BasisMap
    tables: TableAgreement
    widths: tuple[int, int]  # the base's and the suspect's residual widths

    @classmethod
    def read(cls, base: Any, suspect: Any) -> "Maps":
        """The maps between two models (each a model or its :class:`~lens_bias.seedprint.correspondence.Embedding`)."""
        base, suspect = Embedding.of(base), Embedding.of(suspect)  # read once: the three maps share them
        tokens = token_map(base, suspect)
        basis = basis_map(base, suspect, tokens)
        return cls(tokens, basis, table_agreement(base, suspect, tokens, basis), (base.table.shape[1], suspect.table.shape[1]))

    @property
    def unmapped_widths(self) -> bool:
        """Whether the two widths differ and no partial map makes the narrower table a pruning of the wider."""
        return self.widths[0] != self.widths[1] and self.basis.matrix is None

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
    if maps.unmapped_widths:
        result = _widths_unmapped(maps, fp_a.n, published)
    else:
        result = mapped_test(fp_a, fp_b, maps.basis, published) if not maps.nothing_to_map else lineage_test(fp_a, fp_b, published)
    return _verdict(maps, result, both_trained)


def _verdict(maps: Maps, result: SeedPrintResult, both_trained: bool) -> SeedPrintResult:
    """``result`` with the maps recorded, and the tables asked where both models are trained."""
    result = replace(maps.recorded(result), tables_asked=both_trained)
    return replace(result, caveat=caveats(result, both_trained))


def mapped_test(fp_a: Fingerprint, fp_b: Fingerprint, basis: BasisMap, test: LineageSettings) -> SeedPrintResult:
    """``test`` (an unaligned one) of the suspect's features mapped into the base's basis by ``basis`` (between two
    widths, over the channels both hold: :meth:`~lens_bias.seedprint.correspondence.BasisMap.compared`); both
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
    return lineage_test(*basis.compared(read_a, read_b), test)


def _widths_unmapped(maps: Maps, n: int, test: LineageSettings) -> SeedPrintResult:
    """The verdict on two widths that no partial map makes one table (``n`` inputs): unrelated (p 1), with the fit
    that says so."""
    (d_a, d_b), (narrow, wide) = maps.widths, sorted(maps.widths)
    reason = (f"widths {d_a} and {d_b}: no partial map makes the {narrow}-wide table a pruning of the {wide}-wide one "
              f"(smallest residual {maps.basis.residual:.3g} > {FIT}), so the narrower is not a pruning of the wider")
    empty = torch.zeros(0)
    null = test.null if test.null is not None else AnalyticNull()
    return SeedPrintResult(p=1.0, log10_p=0.0, tau_bar=float("nan"), z=float("nan"), k=0, n=n, m=0, mode=test.mode, temperature=test.temperature,
                           null=null.label, alpha=test.alpha, identity_dims=[], taus=empty, means_a=empty, means_b=empty, null_settings=null.to_dict(),
                           reason=reason)


def _reused(fp: Fingerprint | None, model: Any, prints: FingerprintSettings, tokens: Tensor | None, progress: bool) -> Fingerprint:
    """``fp`` where it was made on ``tokens`` (None: on ``prints``' own drawn inputs), else ``model``'s fingerprint on them."""
    if fp is not None:
        drawn = regenerate_inputs(fp) if fp.inputs.seed is not None else None
        if tokens is None or (isinstance(drawn, RandomTokens) and torch.equal(tokens, drawn.tensor())):
            return fp
    return fingerprint(model, prints, progress=progress) if tokens is None else fingerprint(model, prints, inputs=tokens, progress=progress)


def fingerprint_like(
    model: Any, base_model: Any, base: Fingerprint, settings: FingerprintSettings | None = None, *, progress: bool = False
) -> Fingerprint:
    """``model``'s fingerprint on the random token inputs ``base`` (``base_model``'s) was made from; when ``model``'s
    vocabulary is ``base_model``'s renamed (:func:`~lens_bias.seedprint.vocabulary.renamed_tokens`), on the same
    tokens under their new IDs, recorded as ``inputs.renamed``.

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
    if record.kind != "tokens" or record.seed is None:
        raise LensBiasError("fingerprint_like reads a fingerprint made on drawn token inputs (inputs='tokens')")
    same = record.settings(settings)
    renamed = renamed_tokens(base_model, model, regenerate_inputs(base)[0:record.n])
    if renamed is None:
        return fingerprint(model, same, progress=progress)
    return replace(fingerprint(model, same, progress=progress, inputs=renamed), inputs=replace(record, renamed=True))
