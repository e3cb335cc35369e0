"""compare(align="auto"): the token and basis maps read from the weights see through function-preserving edits
combined, find nothing between unrelated models, and leave the published test as it is where nothing was edited."""

from __future__ import annotations

import dataclasses
import itertools
import types

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias import seedprint as sp
from lens_bias.core.corpora import prose
from lens_bias.core.stats import unit
from lens_bias.models.parameters import copy_model
from lens_bias.models.reparametrise import permute_residual, rename_vocabulary, rotate_residual
from lens_bias.models.transforms import quantize
from lens_bias.seedprint import comparison, correspondence
from lens_bias.seedprint.vocabulary import nearest_rows
from lens_bias.training import TokenData, train

SPEC = lens_bias.ModelSpec("llama", d_model=32, n_layers=2, n_heads=4, d_vocab=1200, n_ctx=16, seed=1)  # n <= V/4: the analytic null holds
KW = dict(n=256, seq_len=8, m=16, progress=False)


def _with_tokens_added(model, k: int = 16):
    """``model`` with ``k`` new tokens at the end of its vocabulary (random rows): the same function on the old ones."""
    spec = dataclasses.replace(model.lens_bias_spec, d_vocab=model.lens_bias_spec.d_vocab + k)
    grown = lens_bias.random_init(spec)
    state = grown.state_dict()
    with torch.no_grad():
        for name, value in model.state_dict().items():
            target = state[name]
            target[tuple(slice(0, s) for s in value.shape)] = value
    grown.load_state_dict(state)
    return grown


@pytest.fixture(scope="module")
def base():
    return lens_bias.random_init(SPEC)


@pytest.fixture(scope="module")
def tuned(base):
    data = TokenData.build(prose(), vocab_size=SPEC.d_vocab, seq_len=8)
    model = copy_model(base)
    train(model, data, steps=20, batch_size=8, lr=1e-3, progress=False)
    return model


BASES = {"kept": lambda m: m, "permuted": lambda m: permute_residual(m, seed=2), "rotated": lambda m: rotate_residual(m, seed=2)}
VOCABS = {"kept": lambda m: m, "renamed": lambda m: rename_vocabulary(m, seed=3), "renamed + 16": lambda m: _with_tokens_added(rename_vocabulary(m, seed=3))}
WEIGHTS = ("as they are", "4-bit", "fine-tuned")


@pytest.mark.parametrize("basis, vocab, weights", list(itertools.product(BASES, VOCABS, WEIGHTS)))
def test_every_combination_of_edits_is_found_and_the_control_is_not(base, tuned, basis, vocab, weights):
    start = tuned if weights == "fine-tuned" else base
    suspect = VOCABS[vocab](BASES[basis](start))
    if weights == "4-bit":  # after the disguise, as rotation-based quantisation ships it
        suspect = quantize(suspect, 4)
    result = sp.compare(base, suspect, align="auto", **KW)
    assert result.same_lineage and result.log10_p < -10, str(result)
    assert result.basis_map == ("identity" if basis == "kept" else {"permuted": "permutation", "rotated": "orthogonal"}[basis]) or (
        weights != "as they are" and result.basis_map in ("orthogonal", "linear"))  # an edit of the weights may need the wider map
    assert result.renamed_vocabulary == (vocab != "kept")
    control = sp.compare(base, VOCABS[vocab](BASES[basis](lens_bias.random_init(dataclasses.replace(SPEC, seed=99)))), align="auto", **KW)
    assert not control.same_lineage and control.basis_map == "none" and control.token_source in ("none", "same"), str(control)


def test_with_nothing_to_map_auto_is_the_published_test(base, tuned):
    for suspect in (base, tuned, quantize(base, 4), lens_bias.random_init(dataclasses.replace(SPEC, seed=7))):
        auto, published = sp.compare(base, suspect, **KW), sp.compare(base, suspect, align=None, **KW)  # the default is "auto"
        assert (auto.p, auto.tau_bar, auto.identity_dims) == (published.p, published.tau_bar, published.identity_dims)
        assert auto.basis_map in ("identity", "none") and auto.token_source in ("same", "none")


def test_each_part_of_the_pipeline_is_needed(base, monkeypatch):
    disguised = rename_vocabulary(rotate_residual(base, seed=2), seed=3)
    assert sp.compare(base, disguised, align="auto", **KW).same_lineage
    assert sp.compare(base, disguised, align=None, **KW).log10_p > -10  # the published test alone: the case fails
    for part, off in (("token_map", lambda a, b: correspondence.TokenMap(torch.arange(SPEC.d_vocab), "same")),
                      ("basis_map", lambda a, b, tokens: correspondence.BasisMap("identity", None, 0.0))):
        with monkeypatch.context() as patch:
            patch.setattr(comparison, part, off)
            assert sp.compare(base, disguised, align="auto", **KW).log10_p > -10, part  # the case fails without it


def test_the_maps_are_read_from_the_weights(base):
    disguised = rename_vocabulary(permute_residual(base, seed=2), seed=3)
    tokens = correspondence.token_map(base, disguised)
    assert tokens.source == "weights" and torch.equal(tokens.ids, disguised.lens_bias_vocabulary)
    basis = correspondence.basis_map(base, disguised, tokens)
    assert basis.kind == "permutation" and basis.residual < 1e-6
    # the map takes the suspect's embedding into the base's: row for row, the base's table
    torch.testing.assert_close(basis(disguised.W_E.detach()[tokens.ids].double()).float(), base.W_E.detach(), atol=1e-5, rtol=1e-5)
    unrelated = lens_bias.random_init(dataclasses.replace(SPEC, seed=5))
    assert correspondence.token_map(base, unrelated).source == "none"
    assert correspondence.basis_map(base, unrelated, correspondence.TokenMap(torch.arange(SPEC.d_vocab), "same")).kind == "none"


def test_auto_needs_the_models():
    features = torch.randn(64, 8)
    with pytest.raises(LensBiasError, match="call compare"):
        sp.lineage_test(features, features, align="auto")


def test_tokenizers_give_the_map_where_they_agree_with_the_rows(base, monkeypatch):
    renamed = rename_vocabulary(rotate_residual(base, seed=2), seed=3)
    words = {f"token {i}": i for i in range(SPEC.d_vocab)}  # what get_vocab() gives: string -> ID
    table_a, table_b = base.W_E.detach().float(), renamed.W_E.detach().float()
    kept = correspondence.Embedding(table_b, words)  # a renamed copy that kept the base's tokenizer
    assert correspondence.token_map(correspondence.Embedding(table_a, words), kept).source == "weights"  # the rows overrule it
    renamed_words = {f"token {i}": int(j) for i, j in enumerate(renamed.lens_bias_vocabulary)}  # its tokenizer renamed alike
    tokens = correspondence.token_map(correspondence.Embedding(table_a, words), correspondence.Embedding(table_b, renamed_words))
    assert tokens.source == "tokenizer" and torch.equal(tokens.ids, renamed.lens_bias_vocabulary)
    monkeypatch.setattr(base, "tokenizer", types.SimpleNamespace(get_vocab=lambda: words, padding_side="right"), raising=False)
    monkeypatch.setattr(renamed, "tokenizer", types.SimpleNamespace(get_vocab=lambda: renamed_words, padding_side="right"), raising=False)
    assert correspondence.Embedding.of(renamed).words == renamed_words  # a model's tokenizer is read as these are
    result = sp.compare(base, renamed, align="auto", **KW)
    assert result.token_source == "tokenizer" and result.log10_p < -10


def test_the_shortcuts_agree_with_the_full_row_match(base):
    """A renaming that kept the basis is found on the sketches, as the full row match finds it; tables whose row norms
    differ are not matched at all (no basis map or renaming changes a norm), while edits that keep the function pass."""
    renamed = rename_vocabulary(base, seed=3)
    read_a, read_b = correspondence.Embedding.of(base), correspondence.Embedding.of(renamed)
    a = read_a.table
    quick = correspondence._renamed_in_place(read_a, read_b, 0)
    assert torch.equal(quick, renamed.lens_bias_vocabulary) and torch.equal(quick, correspondence._match_rows(read_a, read_b, 0))
    for edited in (rotate_residual(base, seed=2), quantize(base, 4), _with_tokens_added(rename_vocabulary(base, seed=3))):
        assert correspondence._norms_agree(a, correspondence.Embedding.of(edited).table)
    spread = a.clone()
    spread[: len(spread) // 2] *= 3  # half the rows three times longer: another norm distribution
    assert not correspondence._norms_agree(a, spread)


def _structured_table(v: int, d: int, seed: int) -> torch.Tensor:
    """A table with a trained table's decaying spectrum (a random init's principal axes are too alike to tell apart)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(v, d, generator=g) * torch.logspace(0, -1.5, d)


@pytest.mark.slow  # many seconds: out of the inner loop, in the full suite
def test_large_tables_are_matched_on_their_principal_axes(monkeypatch):
    """Above QUADRATIC_ROWS the rows are described by their principal axes alone (the neighbourhood pass is not run):
    a rotated, renamed copy and its 4-bit-like noisy copy are matched to every row, the coarse index gives the full
    search's answer, and two unrelated tables are turned down before any refinement."""
    v, d = correspondence.QUADRATIC_ROWS + 4000, 96  # wider than the last match's lookup axes: its shortlist is a projection
    table = _structured_table(v, d, 0)
    rotation, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(1)))
    renaming = torch.randperm(v, generator=torch.Generator().manual_seed(2))
    copy = torch.empty_like(table)
    copy[renaming] = table @ rotation  # new position renaming[i] holds old row i, as rename_vocabulary does
    noisy = copy + 0.03 * copy.norm(dim=1, keepdim=True) / d**0.5 * torch.randn(v, d, generator=torch.Generator().manual_seed(3))
    monkeypatch.setattr(correspondence, "_neighbourhoods", lambda *a, **k: pytest.fail("the quadratic description ran on a large table"))
    refined = []
    real_refined = correspondence._refined
    monkeypatch.setattr(correspondence, "_refined", lambda *a: refined.append(1) or real_refined(*a))
    described = []
    real_principal = correspondence._principal
    monkeypatch.setattr(correspondence, "_principal", lambda *a: described.append(1) or real_principal(*a))
    base = correspondence.Embedding(table, None)
    for suspect in (copy, noisy):
        tokens = correspondence.token_map(base, correspondence.Embedding(suspect, None))
        assert tokens.source == "weights" and torch.equal(tokens.ids, renaming)
    for suspect in (copy, noisy):
        mapped = unit(suspect @ rotation.T)
        assert torch.equal(correspondence._nearest_everywhere(unit(table), mapped), nearest_rows(unit(table), mapped)[1])
    refined.clear()
    other = _structured_table(v, d, 4)
    assert correspondence.token_map(base, correspondence.Embedding(other, None)).source == "none"
    assert not refined  # no start of an unrelated table held right pairs
    assert len(described) == 4  # each table's principal axes computed once: the base's for its three pairs


def test_lineage_across_models_reads_the_maps_of_each_pair(base):
    """pairwise_lineage's default is compare's: the disguised copy joins its base's family with compare's p, the pairs
    that need no map keep the published test's p, and the published run leaves the disguised copy out."""
    disguised = rename_vocabulary(rotate_residual(base, seed=2), seed=3)
    models, names = [base, disguised, quantize(base, 4), lens_bias.random_init(dataclasses.replace(SPEC, seed=99))], ["base", "disguised", "4-bit", "other"]
    auto = sp.pairwise_lineage(models, names=names, cache=False, **KW)
    assert auto.align == "auto" and sorted(map(sorted, auto.families)) == [["4-bit", "base", "disguised"], ["other"]]
    pairs = auto.to_pandas().set_index(["a", "b"])
    assert (pairs.loc[("base", "disguised"), "token_source"], pairs.loc[("base", "disguised"), "basis_map"]) == ("weights", "orthogonal")
    assert pairs.loc[("base", "disguised"), "log10_p"] == pytest.approx(sp.compare(base, disguised, **KW).log10_p, rel=1e-6)  # the matrix holds float32
    published = sp.pairwise_lineage(models, names=names, cache=False, align=None, **KW).to_pandas().set_index(["a", "b"])
    assert pairs.loc[("base", "4-bit"), "log10_p"] == published.loc[("base", "4-bit"), "log10_p"] and pairs.loc[("base", "4-bit"), "basis_map"] == "identity"
    assert not published.loc[("base", "disguised"), "related"]
