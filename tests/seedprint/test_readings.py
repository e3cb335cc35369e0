"""Saved readings: compare's default test (align="auto") of models known only by their saved fingerprints and
embedding tables gives the p compare gives the models themselves, and says which pairs it cannot test."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias import seedprint as sp
from lens_bias.models.parameters import copy_model
from lens_bias.models.reparametrise import rename_vocabulary, rotate_residual
from lens_bias.models.transforms import quantize
from lens_bias.seedprint.comparison import Maps, through_maps
from lens_bias.seedprint.readings import Reading, ReadingFiles, drawn_tokens, saved_auto_test

SPEC = lens_bias.ModelSpec("llama", d_model=32, n_layers=2, n_heads=4, d_vocab=1200, n_ctx=16, seed=1)  # n <= V/4: the analytic null holds
PRINTS = sp.FingerprintSettings(n=256, seq_len=8)
TEST = sp.LineageSettings(m=16)


@pytest.fixture(scope="module")
def models():
    base = lens_bias.random_init(SPEC)
    return {"base": base, "disguised": rename_vocabulary(rotate_residual(base, seed=2), seed=3), "4-bit": quantize(base, 4),
            "other": lens_bias.random_init(dataclasses.replace(SPEC, seed=99))}


@pytest.fixture(scope="module")
def readings(models):
    """Each model's reading as lens-bias descendants saves it: its fingerprint on the drawn IDs, and the disguised
    model's also on the base's tokens under its IDs (what its pairs with the base's family read)."""
    base_print = sp.fingerprint(models["base"], PRINTS, progress=False)
    drawn = drawn_tokens(base_print)
    made = {name: (base_print if name == "base" else sp.fingerprint(model, PRINTS, progress=False)) for name, model in models.items()}
    renamed = models["disguised"].lens_bias_vocabulary[drawn]
    out = {name: Reading.of(models[name], [(drawn, fp)]) for name, fp in made.items()}
    out["disguised"] = Reading.of(models["disguised"], [(drawn, made["disguised"]), (renamed, sp.fingerprint(models["disguised"], PRINTS, inputs=renamed, progress=False))])
    return out


@pytest.mark.parametrize("suspect", ["disguised", "4-bit", "other"])
def test_a_saved_pair_is_tested_as_compare_tests_the_models(models, readings, suspect):
    saved, base_first = saved_auto_test(readings["base"], readings[suspect], TEST)
    direct = sp.compare(models["base"], models[suspect], PRINTS, progress=False, m=16)
    assert base_first and (saved.token_source, saved.basis_map) == (direct.token_source, direct.basis_map)
    if suspect == "disguised":  # the maps are fitted on the float16 table a reading keeps: the same verdict, τ̄ to 1e-3
        assert saved.renamed_vocabulary and saved.log10_p < -10 and direct.log10_p < -10
        assert saved.tau_bar == pytest.approx(direct.tau_bar, abs=1e-3)
    else:  # nothing maps: the published test of the saved fingerprints, to the same p
        assert (saved.log10_p, saved.tau_bar) == (direct.log10_p, direct.tau_bar)
    assert saved.same_lineage == (suspect != "other")


def test_the_model_whose_print_read_its_own_ids_is_tried_as_the_base(readings):
    """A renamed model's first fingerprint reads the base's tokens renamed: as the pair's base it would ask for its
    own drawn IDs under the other's names, which nobody saved; the pair is tested the other way round."""
    renamed_first = dataclasses.replace(readings["disguised"], prints=readings["disguised"].prints[::-1])
    assert readings["disguised"].reads_drawn and not renamed_first.reads_drawn
    forward, _ = saved_auto_test(readings["base"], readings["disguised"], TEST)
    backward, base_first = saved_auto_test(renamed_first, readings["base"], TEST)
    assert not base_first and backward.log10_p == forward.log10_p


def test_a_pair_without_the_fingerprints_its_maps_ask_for_is_untestable(models, readings):
    only_drawn = dataclasses.replace(readings["disguised"], prints=readings["disguised"].prints[:1])
    assert saved_auto_test(readings["base"], only_drawn, TEST) is None
    names = ["base", "disguised", "other"]
    saved = {"base": readings["base"], "disguised": only_drawn, "other": readings["other"]}
    result = sp.pairwise_lineage([saved[n].prints[0][1] for n in names], names=names, readings=saved, m=16, progress=False)
    assert result.untestable == [("base", "disguised")] and not bool(result.tested[0, 1]) and bool(result.tested[1, 2])
    assert "1 without saved fingerprints on the inputs their maps ask for" in result.summary()
    full = sp.pairwise_lineage([readings[n].prints[0][1] for n in names], names=names, readings=readings, m=16, progress=False)
    pairs = full.to_pandas().set_index(["a", "b"])
    assert full.untestable == [] and full.families == [["base", "disguised"], ["other"]]
    assert pairs.loc[("base", "disguised"), "base"] == "base" and pairs.loc[("base", "disguised"), "token_source"] == "weights"
    with pytest.raises(LensBiasError, match="give every model one"):
        sp.pairwise_lineage([readings[n].prints[0][1] for n in names], names=names, readings={"base": readings["base"]}, progress=False)


def test_ids_of_one_embedding_row_share_a_fingerprint(models):
    """A saved fingerprint serves inputs that differ only in IDs whose embedding rows are identical: the model reads
    a token only through its row, so its features are the same, exactly."""
    twins = copy_model(models["base"])
    with torch.no_grad():
        twins.W_E[7] = twins.W_E[5]  # TL 4's W_E is the embedding's weight itself: one row, twice
    tokens = drawn_tokens(sp.fingerprint(twins, PRINTS, progress=False))
    swapped = torch.where(tokens == 5, 7, tokens)
    assert not torch.equal(swapped, tokens)
    made = sp.fingerprint(twins, PRINTS, inputs=tokens, progress=False)
    reading = Reading.of(twins, [(tokens, made)])
    assert reading.on(swapped) is made and torch.equal(sp.fingerprint(twins, PRINTS, inputs=swapped, progress=False).features, made.features)
    assert reading.on(torch.where(tokens == 5, 8, tokens)) is None


def test_a_reading_survives_its_file(readings, tmp_path):
    readings["disguised"].save(tmp_path / "disguised.pt")
    back = Reading.load(tmp_path / "disguised.pt")
    assert back.embedding.table.dtype == torch.float16 and torch.equal(back.embedding.table, readings["disguised"].embedding.table)
    assert torch.equal(back.rows, readings["disguised"].rows) and len(back.prints) == 2
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1].features, b[1].features) for a, b in zip(back.prints, readings["disguised"].prints))
    files = ReadingFiles.beside([str(tmp_path / "x" / "disguised.pt")], [tmp_path], hold=1)
    assert list(files) == [str(tmp_path / "x" / "disguised.pt")] and torch.equal(files[str(tmp_path / "x" / "disguised.pt")].rows, back.rows)
    with pytest.raises(LensBiasError, match="hold no reading named like"):
        ReadingFiles.beside([str(tmp_path / "base.pt")], [tmp_path])
    readings["base"].prints[0][1].save(tmp_path / "fingerprint.pt")
    with pytest.raises(LensBiasError, match="is not a lens_bias reading"):
        Reading.load(tmp_path / "fingerprint.pt")


def test_inputs_a_pair_maps_otherwise_are_left_out(readings):
    """Where the pair's token map pairs a token otherwise than the map a saved fingerprint was made through, the
    inputs holding it are left out and the rest tested; below MIN_SHARE of the inputs the pair is untestable."""
    (drawn, fp_drawn), (renamed, fp_renamed) = readings["disguised"].prints
    full, _ = saved_auto_test(readings["base"], readings["disguised"], TEST)
    for moved, tested in ((3, True), (200, False)):
        other = renamed.clone()
        other[:moved, 0] = (other[:moved, 0] + 1) % SPEC.d_vocab  # rows of another token: no longer what the maps ask for
        partial = dataclasses.replace(readings["disguised"], prints=((drawn, fp_drawn), (other, fp_renamed)))
        found = saved_auto_test(readings["base"], partial, TEST)
        assert (found is not None) == tested
        if tested:
            result = found[0]
            assert result.n == full.n - moved and result.log10_p < -10 and result.renamed_vocabulary
            kept = torch.arange(full.n) >= moved  # the same test of the inputs left, through the same maps
            maps = Maps.read(readings["base"].embedding, readings["disguised"].embedding)
            direct = through_maps(maps, _rows(readings["base"].prints[0][1], kept), _rows(fp_renamed, kept), TEST, False)
            assert (direct.log10_p, direct.tau_bar) == (result.log10_p, result.tau_bar)


def _rows(fp, kept):
    return dataclasses.replace(fp, features=fp.features[kept], normalized=None if fp.normalized is None else fp.normalized[kept])
