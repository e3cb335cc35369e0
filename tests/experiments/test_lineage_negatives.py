"""lens-bias lineage-negatives: unrelated trained models and random inits, compared under every align mode."""

import dataclasses
import json
import math

import pytest

from lens_bias import seedprint
from lens_bias.cli import main
from lens_bias.core.corpora import prose
from lens_bias.experiments import lineage_negatives as N
from lens_bias.models import random_init
from lens_bias.training.data import TokenData
from lens_bias.training.trainer import TrainSettings, train


@pytest.fixture(scope="module")
def tiny():
    return N.run_negatives(N.PRESETS["tiny"], progress=False)


@pytest.mark.slow  # the module's trained models take seconds: out of the inner loop, in the full suite
def test_every_pair_under_every_mode(tiny):
    cfg = N.PRESETS["tiny"]
    pairs = tiny.pairs
    trained, drawn = pairs[pairs.negatives == "trained"], pairs[pairs.negatives == "random init"]
    assert len(trained) == math.comb(cfg.n_trained, 2) * len(cfg.modes) and len(drawn) == cfg.n_random * len(cfg.random_modes)
    # seeds 0, 1 on one data order and 2, 3 on the other: 2 pairs share an order, 4 do not
    orders = trained[trained["mode"] == "auto"].order.value_counts()
    assert orders["same order"] == 2 and orders["other order"] == 4
    assert (tiny.training.eval_loss < math.log(cfg.model.d_vocab) - 0.5).all()  # they learned more than a uniform guess


@pytest.mark.slow  # the module's trained models take seconds: out of the inner loop, in the full suite
def test_the_default_is_the_published_test_where_nothing_maps(tiny):
    """Unrelated models share no table up to a map, so "auto" runs the published test: the same p, pair by pair."""
    table = tiny.pairs.set_index(["base", "suspect", "negatives", "mode"]).sort_index()
    auto = table.xs("auto", level="mode")
    assert (auto.basis_map == "none").all()
    assert auto.p.tolist() == table.xs("None", level="mode").loc[auto.index].p.tolist()


def test_the_published_verdict_is_the_direct_lineage_test():
    """The row of a trained pair equals lineage_test on the two models' fingerprints, computed here."""
    cfg = dataclasses.replace(N.PRESETS["tiny"], n_trained=2, n_random=0, modes=(None,))
    result = N.run_negatives(cfg, progress=False)
    data = TokenData.build(prose(), vocab_size=cfg.model.d_vocab, seq_len=cfg.seq_len, progress=False)
    models = []
    for seed in (0, 1):
        model = random_init(dataclasses.replace(cfg.model, seed=seed))
        train(model, data, TrainSettings(steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr), data_seed=cfg.data_seeds[seed], progress=False)
        models.append(model)
    prints = [seedprint.fingerprint(m, n=cfg.n, seq_len=cfg.input_len, vocab=cfg.model.d_vocab, progress=False) for m in models]
    direct = seedprint.lineage_test(*prints, m=cfg.m)
    row = result.pairs.iloc[0]
    assert row.order == "other order" and row.p == direct.p and row.tau_bar == pytest.approx(direct.tau_bar, abs=0)


@pytest.mark.slow  # the module's trained models take seconds: out of the inner loop, in the full suite
def test_rates_count_the_positives(tiny):
    rates = tiny.rates().set_index(["negatives", "mode"])
    for (kind, mode), group in tiny.pairs.groupby(["negatives", "mode"]):
        row = rates.loc[("random init" if kind == "random init" else "trained, all", mode)]
        assert row.pairs == len(group) and row.false_positives == group.related.sum() and row.fpr == group.related.mean()


def test_clopper_pearson_upper_bound():
    # closed forms: no positives, (1 - p)^n = 0.05; all but one... and the bound is above the rate
    assert N.clopper_pearson_upper(0, 300) == pytest.approx(1 - 0.05 ** (1 / 300), rel=1e-9)
    assert N.clopper_pearson_upper(3, 3) == 1.0
    upper = N.clopper_pearson_upper(3, 300)
    assert sum(math.comb(300, k) * upper**k * (1 - upper) ** (300 - k) for k in range(4)) == pytest.approx(0.05, rel=1e-6)


def test_the_command_writes_its_results_file(tmp_path, capsys):
    out = tmp_path / "negatives"
    code = main(["lineage-negatives", "--preset", "tiny", "--set", "n_trained=2", "--set", "n_random=1", "--no-progress", "--out", str(out)])
    assert code == 0
    record = json.loads((out / "lineage_negatives.json").read_text())
    assert record["command"].startswith("lens-bias") and {"torch", "lens_bias"} <= set(record["versions"]) and record["numbers"]["config"]["n_trained"] == 2
    assert {row[0] for row in record["tables"]["rates"]["rows"]} >= {"trained, other order", "random init"}
    assert record["numbers"]["rates.auto.trained_all.pairs"] == 1 and set(record["depends"]) == set(N.DEPENDS)
    assert "false positives" in capsys.readouterr().out


def test_a_related_verdict_says_what_it_cannot_tell():
    """Between two trained models the published test's "related" carries TRAINED (the default asks their tables
    instead, which a copy's agree); after an activation-fitted map, CONVERGENCE; between inits, or on an
    "unrelated" verdict, nothing."""
    from lens_bias.models.init import REGIME
    from lens_bias.models.transforms import quantize
    from lens_bias.seedprint import lineage

    base = random_init(N.PRESETS["tiny"].model)
    copy = quantize(base, 8)
    sizes = dict(n=160, seq_len=8, m=16, progress=False)
    assert seedprint.compare(base, copy, **sizes).caveat is None  # two inits: the analytic null holds
    fitted = seedprint.compare(base, copy, align="orthogonal", **sizes)
    assert fitted.same_lineage and fitted.caveat == lineage.CONVERGENCE
    for model in (base, copy):
        setattr(model, REGIME, "trained")
    trained = seedprint.compare(base, copy, align=None, **sizes)
    assert trained.same_lineage and trained.caveat == lineage.TRAINED and "judge them against models trained" in str(trained)
    asked = seedprint.compare(base, copy, **sizes)
    assert asked.same_lineage and asked.tables_asked and asked.caveat is None
    prints = [seedprint.fingerprint(m, n=160, seq_len=8, progress=False) for m in (base, copy)]
    assert seedprint.lineage_test(*prints, m=16).caveat == lineage.TRAINED  # the fingerprints record the regime
    unrelated = seedprint.compare(base, random_init(dataclasses.replace(N.PRESETS["tiny"].model, seed=5)), **sizes)
    assert not unrelated.same_lineage and unrelated.caveat is None
