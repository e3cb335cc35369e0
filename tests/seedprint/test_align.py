"""SeedPrint through a reparametrised basis: the transforms keep the function, the alignments recover the basis,
aligned tests find the descendants and not the unrelated models, and lineage across many models."""

from __future__ import annotations

import json
import math
import typing

import pandas as pd
import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias import seedprint as sp
from lens_bias.cli import main
from lens_bias.core.stats import adjust_p, detection_metrics
from lens_bias.models.checkpoints import save_checkpoint
from lens_bias.models.reparametrise import permute_residual, rotate_residual
from lens_bias.models.transforms import quantize
from lens_bias.seedprint import align
from lens_bias.seedprint.statistic import tau_statistic

from ..conftest import assert_same_state, state_copy, tiny

SMALL = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=2000, n_ctx=16)
KW = dict(n=400, seq_len=16, progress=False)


def _with_gains(model):
    """Norm gains away from 1, so that folding them is tested."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and ("ln" in name or "norm" in name):
                p.copy_(torch.rand(p.shape, generator=torch.Generator().manual_seed(len(name))) + 0.5)
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("transform", [permute_residual, rotate_residual])
def test_reparametrisations_keep_the_function(arch, transform):
    model = _with_gains(tiny(arch))
    before = state_copy(model)
    tokens = lens_bias.random_tokens(3, 16, 97, seed=2)
    moved = transform(model, seed=3)
    with torch.no_grad():
        base, out = model(tokens), moved(tokens)
    torch.testing.assert_close(out, base, atol=2e-5, rtol=1e-5)
    assert_same_state(model, before)
    basis = moved.lens_bias_basis
    w_e = moved.W_E.detach()
    r = basis if basis.ndim == 2 else torch.eye(64)[basis]
    torch.testing.assert_close(w_e, model.W_E.detach() @ r.T, atol=1e-6, rtol=1e-5)  # the embedding in the new basis
    if transform is rotate_residual:  # the gains are folded: every norm is plain
        assert all(torch.equal(p, torch.ones_like(p)) for n, p in moved.named_parameters() if p.ndim == 1 and ("ln" in n or "norm" in n))


def test_layernorm_models_are_refused():
    with pytest.raises(LensBiasError, match="LLaMA-family"):
        rotate_residual(tiny("gpt2"))


def test_alignments_recover_the_basis():
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(600, 16, generator=generator) @ torch.randn(16, 16, generator=generator)
    perm = torch.randperm(16, generator=generator)
    q, _ = torch.linalg.qr(torch.randn(16, 16, generator=generator))
    scale = torch.diag(torch.rand(16, generator=generator) + 0.5)
    for mode, b in (("permutation", a[:, perm]), ("orthogonal", a @ q), ("linear", a @ q @ scale)):
        mapped = align.fit(mode, a[:300], b[:300])(b[300:])
        torch.testing.assert_close(mapped, a[300:], atol=1e-3, rtol=1e-3)
    with pytest.raises(LensBiasError, match="align must be one of"):
        align.fit("affine", a, a)


@pytest.fixture(scope="module")
def prints():
    base = lens_bias.random_init("llama", seed=0, **SMALL)
    made = {"base": base, "permuted": permute_residual(base, 1), "rotated": rotate_residual(base, 1), "rotated 4-bit": quantize(rotate_residual(base, 1), bits=4)}
    made.update({f"init {s}": lens_bias.random_init("llama", seed=s, **SMALL) for s in (5, 6)})
    return {name: sp.fingerprint(m, **KW) for name, m in made.items()}


@pytest.mark.slow  # many seconds: out of the inner loop, in the full suite
def test_aligned_tests_find_the_reparametrised_descendants(prints):
    base = prints["base"]
    null = sp.SeedsNull(n_null=8)  # fresh inits of the base's recorded spec, aligned like the suspect
    assert not sp.lineage_test(base, prints["permuted"], m=32).same_lineage  # the published test is fooled ...
    for mode, covered in (("permutation", ["permuted"]), ("orthogonal", ["permuted", "rotated", "rotated 4-bit"]), ("linear", ["permuted", "rotated", "rotated 4-bit"])):
        for name in covered:  # ... an alignment that covers the change is not
            result = sp.lineage_test(base, prints[name], m=32, align=mode, null=null)
            assert result.p < 1e-10 and result.align == mode and result.fit_rows == 200 and result.n == 200, (mode, name)
        for name in ("init 5", "init 6"):
            assert sp.lineage_test(base, prints[name], m=32, align=mode, null=null).p > 0.01, (mode, name)


def test_the_seeds_null_aligns_its_models_too(prints):
    base, other = prints["base"], prints["init 5"]
    fresh = sp.seed_null_fingerprints(base, n_null=4, progress=False)
    result = sp.lineage_test(base, other, m=32, align="linear", null=sp.SeedsNull(fingerprints=fresh))
    for tau, fp in zip(result.null_details["null_tau_bars"], fresh):  # each null model went through the same fit
        a, b = base.features, fp.features
        mapped = align.fit("linear", a[:200], b[:200])(b[200:])
        assert tau == pytest.approx(tau_statistic(a[200:], mapped, 32, "coset", 10.0).tau_bar, abs=1e-12)


def test_compare_and_the_seedprint_command_take_align(tmp_path, capsys):
    base = lens_bias.random_init("llama", seed=0, **SMALL)
    permuted = permute_residual(base, 1)
    fa, fb = sp.fingerprint(base, **KW), sp.fingerprint(permuted, **KW)
    direct = sp.lineage_test(fa, fb, m=32, align="permutation")
    via_compare = sp.compare(base, permuted, m=32, align="permutation", fit_fraction=0.5, **KW)
    assert via_compare.align == "permutation" and via_compare.log10_p == direct.log10_p and direct.tau_bar == pytest.approx(1.0)
    fa.save(tmp_path / "a.pt")
    fb.save(tmp_path / "b.pt")
    assert main(["seedprint", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--m", "32", "--align", "permutation", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["align"], shown["fit_rows"], shown["log10_p"]) == ("permutation", 200, direct.log10_p)


def test_multiple_testing_and_detection_metrics():
    p = [1e-12, 0.004, 0.02, 0.5]
    holm = adjust_p(p, "holm")
    assert holm.tolist() == pytest.approx([4e-12, 0.012, 0.04, 0.5])
    bh = adjust_p(p, "bh")
    assert bh.tolist() == pytest.approx([4e-12, 0.008, 0.02 * 4 / 3, 0.5])
    m = detection_metrics([9.0, 8.0, 2.0, 1.0, 0.5], [True, True, True, False, False])
    assert (m["auc"], m["tpr"], m["fpr"], m["accuracy"], m["tpr_at_1pct_fpr"]) == (1.0, 1.0, 0.0, 1.0, 1.0)


@pytest.mark.slow  # several seconds: out of the inner loop, in the full suite
def test_lineage_across_models_with_a_cache_labels_and_families(tmp_path, monkeypatch):
    base = lens_bias.random_init("llama", seed=0, **SMALL)
    folder = tmp_path / "models"
    folder.mkdir()
    save_checkpoint(base, folder / "a_base.pt")
    save_checkpoint(permute_residual(base, 2), folder / "b_permuted.pt")
    save_checkpoint(quantize(base, bits=8), folder / "c_int8.pt")
    for s in (7, 8):
        save_checkpoint(lens_bias.random_init("llama", seed=s, **SMALL), folder / f"d_init{s}.pt")
    labels = {"a_base.pt": "base", "b_permuted.pt": "base", "c_int8.pt": "base", "d_init7.pt": "seven", "d_init8.pt": "eight"}
    (tmp_path / "labels.json").write_text(json.dumps(labels))
    args = ["lineage", str(folder), "--labels", str(tmp_path / "labels.json"), "--align", "orthogonal", "--n", "400", "--seq-len", "16",
            "--m", "32", "--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "out"), "--no-progress"]
    assert main(args) == 0
    pairs = pd.read_csv(tmp_path / "out" / "pairs.csv")
    families = json.loads((tmp_path / "out" / "families.json").read_text())
    names = sorted(str(p) for p in folder.iterdir())
    assert families["families"] == [names[:3], [names[3]], [names[4]]]
    assert families["metrics"]["auc"] == 1.0 and families["metrics"]["positives"] == 3 and len(pairs) == 10
    assert (tmp_path / "out" / "lineage.png").exists()
    # a re-run reads every fingerprint (and the aligned null's) from the cache: no model is loaded
    monkeypatch.setattr("lens_bias.seedprint.lineage_run.load_model", lambda text: pytest.fail(f"loaded {text} again"))
    again = sp.pairwise_lineage(names, labels=[labels[n.rsplit("/", 1)[-1]] for n in names], align="orthogonal", n=400, seq_len=16, m=32,
                                cache=tmp_path / "cache", progress=False)
    assert again.families == families["families"] and all(s < 5 for s in again.seconds.values())
    with pytest.raises(LensBiasError, match="at least 2 models"):
        sp.pairwise_lineage(names[:1], progress=False)


def test_the_lineage_command_reads_the_maps_by_default(tmp_path, monkeypatch):
    """lens-bias lineage with no --align runs compare's default (auto): the permuted copy is found through the basis
    map read from the weights, which pairs.csv names; a re-run reads the embeddings from the cache as it reads the
    fingerprints; --align none is the published test, which misses it."""
    base = lens_bias.random_init("llama", seed=0, **SMALL)
    folder = tmp_path / "models"
    folder.mkdir()
    save_checkpoint(base, folder / "a_base.pt")
    save_checkpoint(permute_residual(base, 2), folder / "b_permuted.pt")
    save_checkpoint(lens_bias.random_init("llama", seed=7, **SMALL), folder / "c_init7.pt")
    common = ["--n", "200", "--seq-len", "16", "--m", "32", "--cache", str(tmp_path / "cache"), "--no-progress"]
    assert main(["lineage", str(folder), *common, "--out", str(tmp_path / "auto")]) == 0
    pairs = pd.read_csv(tmp_path / "auto" / "pairs.csv").set_index(["a", "b"])
    names = sorted(str(p) for p in folder.iterdir())
    assert pairs.loc[(names[0], names[1]), "basis_map"] == "permutation" and pairs.loc[(names[0], names[1]), "related"]
    assert not pairs.loc[(names[0], names[2]), "related"] and pairs.loc[(names[0], names[2]), "basis_map"] == "none"
    monkeypatch.setattr("lens_bias.seedprint.lineage_run.load_model", lambda text: pytest.fail(f"loaded {text} again"))
    again = sp.pairwise_lineage(names, n=200, seq_len=16, m=32, cache=tmp_path / "cache", progress=False)
    assert again.families == json.loads((tmp_path / "auto" / "families.json").read_text())["families"]
    monkeypatch.undo()
    assert main(["lineage", str(folder), *common, "--align", "none", "--out", str(tmp_path / "published")]) == 0
    published = pd.read_csv(tmp_path / "published" / "pairs.csv").set_index(["a", "b"])
    assert not published.loc[(names[0], names[1]), "related"] and "basis_map" not in published.columns


def test_pairs_of_different_widths_are_not_tested():
    """Models of different widths cannot share an init: across widths a pair is not tested (p 1, τ̄ NaN) and the
    multiple-testing correction counts only the pairs that were."""
    specs = ["llama:d=32,L=1,H=4,V=500,ctx=8,seed=1", "llama:d=32,L=1,H=4,V=500,ctx=8,seed=1", "llama:d=48,L=1,H=4,V=500,ctx=8,seed=1"]
    result = sp.pairwise_lineage(specs, names=["a", "a copy", "wider"], n=64, seq_len=8, m=16, cache=False, progress=False)
    table = result.to_pandas().set_index("b")
    assert table.loc["a copy", "related"] and table.loc["a copy", "log10_p"] < -10
    assert math.isnan(result.tau_bar[0, 2]) and result.p_adjusted[0, 2] == 1 and result.p_adjusted[1, 2] == 1
    assert result.p_adjusted[0, 1] == pytest.approx(10 ** result.log10_p[0, 1].item())  # one test: Holm leaves it as it is
    assert result.families == [["a", "a copy"], ["wider"]]
    assert result.tested.tolist() == [[False, True, False], [True, False, False], [False, False, False]]
    assert "1 pairs tested (2 of different widths are not)" in result.summary() and result.to_pandas().tested.tolist() == [True, False, False]


def test_a_renamed_vocabulary_does_not_evade_lineage(tmp_path, monkeypatch):
    """`lens-bias lineage` finds a renamed vocabulary from the models' embedding sketches: the renamed copy, and its
    4-bit copy, read the base's tokens under their new IDs and are related to it; the two renamed copies share one
    token order, so they read the same IDs; an unrelated init is left alone. A saved fingerprint counts as a model,
    and a re-run loads no model."""
    from lens_bias.models.reparametrise import rename_vocabulary

    base = lens_bias.random_init("llama", seed=3, **SMALL)
    renamed = rename_vocabulary(base, seed=1)
    folder = tmp_path / "models"
    folder.mkdir()
    save_checkpoint(base, folder / "a_base.pt")
    save_checkpoint(renamed, folder / "b_renamed.pt")
    save_checkpoint(quantize(renamed, bits=4), folder / "c_renamed_4bit.pt")
    sp.fingerprint(lens_bias.random_init("llama", seed=4, **SMALL), n=128, seq_len=8, vocab=2000, progress=False).save(folder / "d_init4.pt")
    kw = dict(n=128, seq_len=8, m=32, cache=tmp_path / "cache", progress=False)
    result = sp.pairwise_lineage([str(folder)], **kw)
    table = result.to_pandas().assign(a=lambda t: t.a.str.rsplit("/", n=1).str[-1], b=lambda t: t.b.str.rsplit("/", n=1).str[-1]).set_index(["a", "b"])
    for suspect in ("b_renamed.pt", "c_renamed_4bit.pt"):
        row = table.loc[("a_base.pt", suspect)]
        assert row.renamed_vocabulary and row.related and row.tau_bar > 0.8, row
    assert not table.loc[("b_renamed.pt", "c_renamed_4bit.pt")].renamed_vocabulary  # one token order: nothing to rename
    assert table.loc[("b_renamed.pt", "c_renamed_4bit.pt")].related
    for other in ("a_base.pt", "b_renamed.pt", "c_renamed_4bit.pt"):
        row = table.loc[(other, "d_init4.pt")]
        assert not row.renamed_vocabulary and not row.related and abs(row.tau_bar) < 0.2, row
    assert [len(f) for f in result.families] == [3, 1]
    # the renamed fingerprints are cached too: a re-run loads no model and finds the same
    monkeypatch.setattr("lens_bias.seedprint.lineage_run.load_model", lambda text: pytest.fail(f"loaded {text} again"))
    again = sp.pairwise_lineage([str(folder)], **kw)
    assert again.renamed == result.renamed and torch.equal(again.tau_bar.nan_to_num(), result.tau_bar.nan_to_num())


def test_the_align_mode_is_checked_in_one_place_before_any_work():
    from lens_bias.seedprint import calibrate, lineage_test, pairwise_lineage
    from lens_bias.seedprint.align import ALIGN_MODES, AlignMode, fit

    assert ALIGN_MODES == (None, *typing.get_args(typing.get_args(AlignMode)[0]))
    features = torch.randn(12, 4)
    for call in (lambda: lineage_test(features, features, m=2, align="rotation"), lambda: fit("rotation", features, features),
                 lambda: calibrate(lambda seed: pytest.fail("built a model"), n_pairs=1, aligns=["rotation"], progress=False)):
        with pytest.raises(LensBiasError, match=r"align must be one of \(None, 'permutation', 'orthogonal', 'linear'\), got 'rotation'"):
            call()
    # "auto" is a mode of its own, checked there too: taken where the models are at hand, refused on features alone
    for call in (lambda: lineage_test(features, features, m=2, align="auto"),
                 lambda: calibrate(lambda seed: pytest.fail("built a model"), n_pairs=1, aligns=["auto"], progress=False)):
        with pytest.raises(LensBiasError, match="align='auto' reads the two models' tokenizers and weights, which features do not hold"):
            call()
    for call in (lambda: align.check_align("rotation", auto=True),
                 lambda: pairwise_lineage(["llama:d=16,L=1,H=2,V=50,ctx=8"] * 2, align="rotation", cache=False, progress=False)):
        with pytest.raises(LensBiasError, match=r"align must be one of \(None, 'permutation', 'orthogonal', 'linear', 'auto'\), got 'rotation'"):
            call()
    align.check_align("auto", auto=True)


def test_the_default_test_on_saved_fingerprints_warns_that_it_is_the_published_one(tmp_path):
    """Saved fingerprints hold no weights: pairwise_lineage's default ("auto") cannot read the maps from them, so it
    runs the published test, says so in a warning, and gives what align=None gives."""
    from lens_bias.seedprint import pairwise_lineage

    small = dict(d_model=32, n_layers=1, n_heads=2, d_vocab=200, n_ctx=8)
    prints = [sp.fingerprint(lens_bias.random_init("llama", seed=seed, **small), n=64, seq_len=8, progress=False) for seed in (0, 0, 1)]
    with pytest.warns(UserWarning, match=r"published test \(align=None\), not compare's default \(align='auto'\); pass readings="):
        default = pairwise_lineage(prints, names=["a", "a again", "b"], m=8, progress=False)
    published = pairwise_lineage(prints, names=["a", "a again", "b"], m=8, align=None, progress=False)
    assert default.align is None and torch.equal(default.log10_p, published.log10_p) and default.families == [["a", "a again"], ["b"]]
