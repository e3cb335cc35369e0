"""The embedding tables' agreement (seedprint.tables), and compare()'s default asking it between two trained models,
where unrelated models trained on one corpus pass the published test."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

import lens_bias
from lens_bias import seedprint as sp
from lens_bias.core.corpora import prose
from lens_bias.models.parameters import copy_model
from lens_bias.models.reparametrise import rename_vocabulary, rotate_residual
from lens_bias.seedprint import correspondence, lineage, tables
from lens_bias.seedprint.tables import table_agreement
from lens_bias.training import TokenData, TrainSettings, train

SMALL = lens_bias.ModelSpec("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=400, n_ctx=8)
# Where unrelated trained models pass the published test (lens-bias lineage-negatives at this size: 4 of 15 pairs on TL 4,
# 3 on TL 3, whose inits differ; the two TLs' strongest pairs are seeds 1 and 3 and seeds 4 and 5)
TRAINED = lens_bias.ModelSpec("llama", d_model=96, n_layers=2, n_heads=4, d_vocab=1024, n_ctx=32)
SEEDS = (1, 3, 4, 5)  # data order 42 below seed 3, 7 from it, as lineage-negatives orders them
KW = dict(n=256, seq_len=8, m=48, progress=False)


def _same(v: int) -> correspondence.TokenMap:
    return correspondence.TokenMap(torch.arange(v), "same")


def _column_correlations(a, b, rows=None):
    """Each residual coordinate's correlation between the two embedding tables (rows centred), in numpy."""
    ea, eb = (m.W_E.detach().double().numpy() for m in (a, b))
    ea, eb = (ea, eb) if rows is None else (ea[rows], eb[rows])
    ea, eb = ea - ea.mean(0), eb - eb.mean(0)
    return (ea * eb).sum(0) / np.sqrt((ea**2).sum(0) * (eb**2).sum(0))


def test_the_statistic_against_a_direct_computation():
    """z = Σc/‖c‖ of the column correlations, computed here with numpy; a copy with k columns negated has every
    |c_j| = 1, so z = (D − 2k)/√D exactly, and the bound is exp(−z²/2)."""
    a, b = (lens_bias.random_init(dataclasses.replace(SMALL, seed=s)) for s in (0, 1))
    c = _column_correlations(a, b)
    got = table_agreement(a, b, _same(SMALL.d_vocab))
    assert got.z == pytest.approx(c.sum() / np.linalg.norm(c), rel=1e-9) and got.mean_correlation == pytest.approx(c.mean(), rel=1e-9)
    assert got.log10_p == (0.0 if got.z <= 0 else pytest.approx(-got.z**2 / (2 * math.log(10))))
    flipped = copy_model(a)
    with torch.no_grad():
        flipped.W_E[:, :5] *= -1
    d = SMALL.d_model
    got = table_agreement(a, flipped, _same(SMALL.d_vocab))
    assert got.z == pytest.approx((d - 10) / math.sqrt(d), rel=1e-9)
    assert got.log10_p == pytest.approx(-((d - 10) ** 2 / d) / (2 * math.log(10)), rel=1e-9)


def test_a_large_vocabulary_is_compared_on_rows_drawn_blind(monkeypatch):
    """Above ``ROWS`` tokens the statistic reads ROWS of them, drawn without looking at the tables: the numpy
    computation over those rows gives the same z, and a copy with k columns negated still gives (D − 2k)/√D."""
    monkeypatch.setattr(tables, "ROWS", 100)
    a, b = (lens_bias.random_init(dataclasses.replace(SMALL, seed=s)) for s in (0, 1))
    got = table_agreement(a, b, _same(SMALL.d_vocab))
    c = _column_correlations(a, b, rows=torch.randperm(SMALL.d_vocab, generator=torch.Generator().manual_seed(0))[:100].sort().values.numpy())
    assert got.rows == 100 and got.z == pytest.approx(c.sum() / np.linalg.norm(c), rel=1e-9)
    flipped = copy_model(a)
    with torch.no_grad():
        flipped.W_E[:, :3] *= -1
    d = SMALL.d_model
    assert table_agreement(a, flipped, _same(SMALL.d_vocab)).z == pytest.approx((d - 6) / math.sqrt(d), rel=1e-9)


def test_the_bound_holds_on_unrelated_tables():
    """Over 300 pairs of unrelated inits, the share below α is at most α (the bound is conservative: z is about
    N(0, 1), and p ≤ 0.01 needs z ≥ 3.03)."""
    tables = [lens_bias.random_init(dataclasses.replace(SMALL, seed=s)) for s in range(25)]
    zs, below = [], 0
    for i in range(25):
        for j in range(i + 1, 25):
            got = table_agreement(tables[i], tables[j], _same(SMALL.d_vocab))
            zs.append(got.z)
            below += got.log10_p < -2
    assert len(zs) == 300 and below <= 3
    assert abs(float(np.mean(zs))) < 0.2 and 0.8 < float(np.std(zs)) < 1.2  # about N(0, 1), as the symmetry says


@pytest.fixture(scope="module")
def trained_pair():
    """The two unrelated trained models the published test calls most related, and a short fine-tune of the first."""
    data = TokenData.build(prose(), vocab_size=TRAINED.d_vocab, seq_len=32, progress=False)
    settings = TrainSettings(steps=250, batch_size=16, lr=2e-3)
    models = {}
    for seed in SEEDS:
        models[seed] = lens_bias.random_init(dataclasses.replace(TRAINED, seed=seed))
        train(models[seed], data, settings, data_seed=42 if seed < 3 else 7, progress=False)
    # compare(align=None)'s test, each model fingerprinted once
    prints = {s: sp.fingerprint(m, n=KW["n"], seq_len=KW["seq_len"], vocab=TRAINED.d_vocab, progress=False) for s, m in models.items()}
    pairs = [(a, b) for i, a in enumerate(SEEDS) for b in SEEDS[i + 1:]]
    a, b = min(pairs, key=lambda pair: sp.lineage_test(prints[pair[0]], prints[pair[1]], m=KW["m"]).log10_p)
    tuned = copy_model(models[a])
    train(tuned, data, TrainSettings(steps=40, batch_size=16, lr=1e-3), data_seed=5, progress=False)
    return (models[a], models[b]), tuned


@pytest.mark.slow  # many seconds: out of the inner loop, in the full suite
def test_the_default_asks_the_tables_between_trained_models(trained_pair):
    """Two models trained from other seeds pass the published test; the default keeps its p but asks their tables,
    which agree no more than chance, and calls them unrelated. A fine-tune of one of them keeps its table: related,
    with the published p, and without the caveat the published verdict carries."""
    (one, other), tuned = trained_pair
    published = sp.compare(one, other, align=None, **KW)
    default = sp.compare(one, other, **KW)
    assert published.same_lineage and published.log10_p < -4 and published.caveat == lineage.TRAINED
    assert default.p == published.p and default.tables_asked and default.tables is not None and abs(default.tables.z) < 3
    assert not default.same_lineage and "agree no more than chance" in str(default)
    related, as_published = sp.compare(one, tuned, **KW), sp.compare(one, tuned, align=None, **KW)
    assert related.p == as_published.p and related.same_lineage and related.caveat is None and as_published.caveat == lineage.TRAINED
    assert related.tables is not None and related.tables.z > 0.9 * math.sqrt(TRAINED.d_model)


@pytest.mark.slow  # many seconds: out of the inner loop, in the full suite
def test_a_disguised_fine_tune_of_a_trained_model_is_related(trained_pair):
    """Rotated and renamed: the tables agree through the fitted basis map (no bound then: the fit is the evidence)."""
    (one, _), tuned = trained_pair
    disguised = rename_vocabulary(rotate_residual(tuned, seed=4), seed=5)
    result = sp.compare(one, disguised, **KW)
    assert result.same_lineage and result.tables_asked and result.basis_map in ("orthogonal", "linear") and result.tables is not None
    assert result.tables.log10_p is None and result.tables.mean_correlation > 0.9


@pytest.mark.slow  # many seconds: out of the inner loop, in the full suite
def test_lineage_across_trained_models_asks_the_tables(trained_pair, tmp_path):
    """pairwise_lineage and lens-bias lineage ask the tables as compare does: the unrelated trained model is left
    out of the family that the published run puts it in."""
    (one, other), tuned = trained_pair
    models, names = [one, other, tuned], ["one", "other", "one tuned"]
    auto = sp.pairwise_lineage(models, names=names, cache=False, **KW)
    published = sp.pairwise_lineage(models, names=names, cache=False, align=None, **KW)
    assert sorted(map(sorted, auto.families)) == [["one", "one tuned"], ["other"]]
    assert sorted(map(sorted, published.families)) == [["one", "one tuned", "other"]]
    pairs = auto.to_pandas().set_index(["a", "b"])
    assert pairs.loc[("one", "other"), "tables_asked"] and abs(pairs.loc[("one", "other"), "tables_z"]) < 3 and not pairs.loc[("one", "other"), "related"]
