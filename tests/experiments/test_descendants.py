"""SeedPrint against real descendants: exact checks of each transform on tiny models, the experiment end to end on
a tiny model, and the lineage verdicts on SmolLM2-135M."""

from __future__ import annotations

import json
import math
import runpy
from pathlib import Path

import pandas as pd
import pytest
import torch
from scipy.stats import mannwhitneyu

import lens_bias
from lens_bias import LensBiasError, seedprint
from lens_bias.cli import main
from lens_bias.core.corpora import Corpus, code
from lens_bias.core.inputs import text_tokens
from lens_bias.core.stats import auc
from lens_bias.experiments import descendant_scores as S
from lens_bias.experiments import descendants as D
from lens_bias.models import reparametrise as R
from lens_bias.models import transforms as T
from lens_bias.seedprint import Fingerprint
from lens_bias.seedprint.align import ALIGN_MODES
from lens_bias.seedprint.readings import Reading
from lens_bias.training import fine_tune
from lens_bias.training.data import TokenData

from ..conftest import assert_same_state, requires_tl4, state_copy, tiny

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

ARCHS = ("llama", "gpt2")


@pytest.fixture(scope="module")
def code_blocks():
    """A BPE of 512 tokens over the first 60 stdlib modules, blocks of 16: a fine-tune in a fraction of a second."""
    return TokenData.build(Corpus("code-head", code().documents[:60]), vocab_size=512, seq_len=16)


def test_fine_tune_trains_a_copy(code_blocks):
    model = tiny("llama", d_vocab=512)
    before = state_copy(model)
    tuned, run = fine_tune(model, 3, data=code_blocks, lr=1e-3, progress=False)
    assert_same_state(model, before)
    assert len(run.losses) == 3 and len(run.evals) == 1
    assert T.relative_change(model, tuned) > 0
    with pytest.raises(LensBiasError, match="model.tokenizer"):
        fine_tune(model, 1)


def test_token_data_packs_with_a_pretrained_tokenizer(code_blocks, tmp_path):
    from transformers import PreTrainedTokenizerFast

    corpus = Corpus("code-head", code().documents[:60])
    hf = PreTrainedTokenizerFast(tokenizer_object=code_blocks.tokenizer())
    for given in (hf, code_blocks.tokenizer()):  # a Hugging Face fast tokenizer, or the tokenizers.Tokenizer
        packed = TokenData.build(corpus, seq_len=16, tokenizer_from=given, cache=tmp_path)
        assert torch.equal(packed.train, code_blocks.train) and torch.equal(packed.eval, code_blocks.eval)
        assert packed.vocab_size == 512 and packed.tokenizer_path.name.startswith("tokenizer-pretrained-")
    with pytest.raises(LensBiasError, match="tokenizer_from"):
        TokenData.build(corpus, seq_len=16, tokenizer_from="gpt2", cache=tmp_path)


def test_auc_is_the_mann_whitney_probability():
    assert auc([3, 2, 1], [True, False, False]) == 1.0
    assert auc([1, 2], [True, False]) == 0.0
    assert auc([1, 1], [True, False]) == 0.5
    scores = torch.randn(40, generator=torch.Generator().manual_seed(0))
    labels = [i % 3 == 0 for i in range(40)]
    pos, neg = scores[[i for i in range(40) if labels[i]]], scores[[i for i in range(40) if not labels[i]]]
    u = mannwhitneyu(pos.double().numpy(), neg.double().numpy()).statistic
    assert math.isclose(auc(scores, labels), u / (len(pos) * len(neg)))
    with pytest.raises(LensBiasError):
        auc([1.0, 2.0], [True, True])


@pytest.mark.slow  # many seconds: out of the inner loop, in the full suite
def test_experiment_on_a_tiny_model(code_blocks, tmp_path):
    model = tiny("llama", d_vocab=1024)  # the analytic null wants N ≤ V/4 token inputs (the tiny preset's N is 256)
    before = state_copy(model)
    readings = {}
    result = D.real_descendants(model, "tiny", data=code_blocks, progress=False, keep=lambda name, reading: readings.__setitem__(name, reading))
    assert_same_state(model, before)
    table, config = result.to_pandas(), D.PRESETS["tiny"]
    models = result.models
    assert (models.kind == "descendant").sum() == 15 and (models.kind == "random init").sum() == config.n_random and not result.not_made
    assert len(table) == len(config.align_modes) * len(models) and set(result.fingerprints) == {"base", *models.target}
    # every descendant under every mode that covers it; the random inits under every mode but auto (judged against
    # the other inits aligned the same way) are 40 tests of unrelated models at α 0.01, and Binomial(40, 0.01)
    # exceeds 2 with probability 0.008 (measured: 0 on TL 4, 1 on TL 3, an analytic p of 0.003)
    assert (table[table.covered].log10_p < -10).all()
    assert (table[(table.kind == "random init") & (table.align != "auto")].p < 0.01).sum() <= 2
    expected = [p < 1e-10 if covered else p >= 0.01 if kind == "random init" else True for p, covered, kind in zip(table.p, table.covered, table.kind)]
    assert table.ok.tolist() == expected and result.all_as_expected == all(expected)
    by_mode = {mode: rows.set_index("target") for mode, rows in table.groupby("align")}
    permuted, rotated = (next(t for t in models.target if t.startswith(s)) for s in ("permuted", "rotated"))
    assert by_mode["None"].loc[permuted].p > 1e-3 and by_mode["None"].loc[rotated].p > 1e-3  # the published test is fooled
    assert by_mode["permutation"].loc[permuted].covered and not by_mode["permutation"].loc[rotated].covered
    # the default reads its maps from the weights: the published test's p exactly where nothing was renamed or
    # rotated (every random init, every descendant that kept its basis), and the disguised descendants found, which
    # only it covers (the activation-fitted modes read their renamed tokens as the base's)
    auto, published = by_mode["auto"], by_mode["None"]
    kept = [t for t in models.target if not t.startswith(("permuted", "rotated", "renamed"))]
    assert auto.loc[kept, "log10_p"].tolist() == published.loc[kept, "log10_p"].tolist()
    assert auto.loc[kept].query("kind == 'descendant'").covered.all()
    for disguised in (t for t in models.target if " + renamed" in t):
        assert auto.loc[disguised].covered and auto.loc[disguised].log10_p < -10
        assert all(not by_mode[mode].loc[disguised].covered and by_mode[mode].loc[disguised].p > 1e-3 for mode in ("None", "permutation", "linear"))
    # a renamed vocabulary is read through its renamed tokens: related under every mode, with its loss on renamed text
    for renamed in (t for t in models.target if t.startswith("renamed")):
        assert by_mode["None"].loc[renamed].covered and by_mode["None"].loc[renamed].log10_p < -10
    renamed_loss = models.set_index("target").eval_loss
    assert renamed_loss[next(t for t in models.target if t.startswith("renamed vocabulary"))] == pytest.approx(result.base_eval_loss, rel=1e-5)
    # LeaFBench's metrics per mode, over every pair: base against each target, and the random inits against each other
    n_random = config.n_random
    for mode, rows in by_mode.items():
        metrics = result.metrics.set_index("align").loc[mode]
        pairs = result.pairs[result.pairs["align"] == mode]
        assert len(pairs) == len(rows) + n_random * (n_random - 1) // 2 and metrics.negatives == n_random + n_random * (n_random - 1) // 2
        against_base = pairs[pairs.a == "base"].set_index("b")
        assert against_base.loc[rows.index, "score"].tolist() == pytest.approx((-rows.log10_p).tolist())
        assert metrics.auc == pytest.approx(auc(pairs.score.values, pairs.related.values))
        assert metrics.fpr_at_alpha == pytest.approx((pairs[~pairs.related].p < 0.01).mean())
    pooled = S.lineage_metrics(pd.concat([result.pairs.assign(family="x"), result.pairs.assign(family="y")]))
    assert pooled.family.tolist() == ["x"] * 5 + ["y"] * 5 + ["pooled"] * 5
    assert pooled[pooled.family == "pooled"].auc.tolist() == pytest.approx(result.metrics.auc.tolist())
    metrics = result.metrics.set_index("align")
    assert metrics.loc["auto", "auc"] == 1.0 and metrics.loc["auto", "tpr_at_1pct_fpr"] == 1.0
    assert metrics.loc["None", "auc"] < 1.0 and metrics.loc["linear", "auc"] < 1.0  # disguised descendants score like random inits
    assert f"| {permuted} |" in result.markdown() and "tpr_at_1pct_fpr" in result.markdown()
    # the saved fingerprints are models for `lens-bias lineage`: every pair, the same τ̄ as the experiment's base tests
    labels = result.save_fingerprints(tmp_path / "prints", "tiny model")
    assert len(pd.read_csv(labels)) == len(models) + 1 and pd.read_csv(labels).base.eq("tiny-model").sum() == 16
    assert main(["lineage", str(tmp_path / "prints"), "--labels", str(labels), "--ratio-k", str(config.ratio_k), "--out", str(tmp_path / "out"),
                 "--no-progress"]) == 0
    lineage = pd.read_csv(tmp_path / "out" / "pairs.csv").assign(a=lambda t: t.a.str.rsplit("/", n=1).str[-1], b=lambda t: t.b.str.rsplit("/", n=1).str[-1])
    assert len(lineage) == (len(models) + 1) * len(models) // 2 and lineage.same_base.sum() == 15 * 16 // 2
    with_base = lineage[(lineage.a == "tiny-model--base.pt") | (lineage.b == "tiny-model--base.pt")]
    against_base = with_base.set_index(with_base.a.where(with_base.b == "tiny-model--base.pt", with_base.b)).tau_bar
    assert against_base[[f"tiny-model--{S.slug(t)}.pt" for t in models.target]].tolist() == pytest.approx(by_mode["None"].tau_bar.tolist(), abs=1e-6)
    # aligned, saved fingerprints are judged against the saved random inits of their width, less the pair tested
    inits = sorted(str(p) for p in (tmp_path / "prints").glob("*random-init*"))
    picked = [str(tmp_path / "prints" / f"tiny-model--{S.slug(t)}.pt") for t in ("base", permuted)] + inits[:2]
    assert main(["lineage", *picked, "--align", "permutation", "--null-fingerprints", *inits, "--ratio-k", str(config.ratio_k),
                 "--out", str(tmp_path / "aligned"), "--no-progress"]) == 0
    aligned = pd.read_csv(tmp_path / "aligned" / "pairs.csv").set_index(["a", "b"])
    assert aligned.loc[(picked[0], picked[1]), "related"] and aligned.loc[(picked[0], picked[1]), "log10_p"] < -2
    assert not aligned.loc[(picked[0], picked[2]), "related"] and not aligned.loc[(picked[2], picked[3]), "related"]
    assert main(["lineage", *picked, "--align", "permutation", "--no-progress"]) == 2  # a saved fingerprint has no model to re-initialise
    # with each model's reading saved beside its fingerprint, the default test runs on them: every pair tested, and each
    # base-target pair as the experiment's own "auto" test of the models (to the same p where nothing maps; through
    # maps fitted on the float16 tables a reading keeps, to the same verdict)
    assert set(readings) == set(result.fingerprints)
    (tmp_path / "readings").mkdir()
    for target, reading in readings.items():  # as lens-bias descendants --out saves them
        reading.save(tmp_path / "readings" / f"tiny-model--{S.slug(target)}.pt")
    assert main(["lineage", str(tmp_path / "prints"), "--labels", str(labels), "--readings", str(tmp_path / "readings"), "--ratio-k", str(config.ratio_k),
                 "--out", str(tmp_path / "auto"), "--no-progress"]) == 0
    saved = pd.read_csv(tmp_path / "auto" / "pairs.csv").assign(a=lambda t: t.a.str.rsplit("/", n=1).str[-1], b=lambda t: t.b.str.rsplit("/", n=1).str[-1])
    assert saved.tested.all() and len(saved) == len(lineage)
    with_base = saved[(saved.a == "tiny-model--base.pt") | (saved.b == "tiny-model--base.pt")]
    with_base = with_base.set_index(with_base.a.where(with_base.b == "tiny-model--base.pt", with_base.b))
    for target, row in auto.iterrows():
        pair = with_base.loc[f"tiny-model--{S.slug(target)}.pt"]
        if pair.basis_map in ("identity", "none"):
            assert pair.log10_p == pytest.approx(row.log10_p, rel=1e-6)  # pairs.csv holds the float32 matrix
        else:
            assert pair.tau_bar == pytest.approx(row.tau_bar, abs=1e-3) and pair.log10_p < -10
    assert ((saved.log10_p < -10) == saved.same_base).mean() > 0.95


@pytest.mark.slow  # a whole tiny experiment: the fast tier keeps test_experiment_on_a_tiny_model
@requires_tl4
def test_gemma_keeps_its_function_under_a_permutation_and_refuses_a_rotation(code_blocks):
    """Gemma 3 normalises each sub-layer's output before adding it: a permutation of the residual moves those gains
    with it (the logits stay), a rotation cannot be folded into them (one line), and the experiment records the three
    rotated descendants as not made instead of failing."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    hf = Gemma3ForCausalLM(Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                                            head_dim=16, vocab_size=1024, sliding_window=8, layer_types=["sliding_attention", "full_attention"])).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:  # trained-like gains: not the init's zeros of Gemma's (1 + w) parametrisation
                p.normal_(0, 0.3)
    model = lens_bias.models.from_hf(hf)
    ids = torch.randint(0, 1024, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids)
        assert (R.permute_residual(model)(ids) - expected).abs().max().item() < 1e-5 * expected.abs().max().item() + 1e-6
    with pytest.raises(LensBiasError, match="cannot be folded into post-sub-layer norms"):
        R.rotate_residual(model)
    result = D.real_descendants(model, "tiny", data=code_blocks, progress=False, align_modes=(None, "auto", "permutation"))
    assert sorted(result.not_made) == sorted(t for t in result.not_made if t.startswith("rotated")) and len(result.not_made) == 4
    table = result.to_pandas()
    assert (table[table.covered].log10_p < -10).all()  # every descendant made, renamed and permuted included
    assert (table[(table.kind == "random init") & (table.align != "auto")].p < 0.01).sum() <= 2  # 20 tests of unrelated models at α 0.01


# ---- the real model ----------------------------------------------------------------------------------------------

# 128 random sequences of 16 tokens (IDs below 49152), m = D/2 = 288 as in the experiment: sd(τ) =
# √(2(2n+5)/(9n(n−1))) = 0.060. A descendant keeps nearly all identity dims (k ≈ 280), so p < 1e-10 (z > 6.5)
# needs only τ̄ > 6.5 · 0.060/√280 = 0.023; unrelated models share k ≈ m²/D ≈ 144 dims by chance, and p ≥ 0.01
# means τ̄ < 2.58 · 0.060/√144 = 0.013.
REAL = dict(n=128, seq_len=16)
RATIO = D.PRESETS["default"].ratio_k


@pytest.fixture(scope="module")
def base_print(smollm2):
    return seedprint.fingerprint(smollm2, **REAL, progress=False)


def _real_test(base_print, model):
    return seedprint.lineage_test(base_print, seedprint.fingerprint(model, **REAL, progress=False), ratio_k=RATIO)


def test_smollm2_int8_and_pruned_descendants_are_related(smollm2, base_print):
    before = state_copy(smollm2)
    int8 = _real_test(base_print, T.quantize(smollm2, bits=8))
    pruned = _real_test(base_print, T.prune(smollm2, 0.3))
    assert_same_state(smollm2, before)
    # measured (TL 4 bridge / TL 3 HookedTransformer): int8 τ̄ 0.971 / 0.955 (z 274 / 269), pruned τ̄ 0.500 (z 127)
    assert int8.log10_p < -10 and int8.tau_bar > 0.9
    assert pruned.log10_p < -10


def test_smollm2_random_init_is_unrelated(smollm2, base_print):
    result = _real_test(base_print, next(T.random_inits(smollm2, [1_000_000])))
    assert result.p >= 0.01  # measured: τ̄ −0.003 / 0.005 (z −0.5 / 1.0)


@pytest.mark.parametrize("transform", [R.permute_residual, R.rotate_residual], ids=["permuted", "rotated"])
def test_smollm2_reparametrised_keeps_its_logits_on_real_text(smollm2, transform):
    tokens = text_tokens(smollm2.tokenizer, 2, 32)
    before = state_copy(smollm2)
    moved = transform(smollm2, seed=1)
    assert_same_state(smollm2, before)
    with torch.no_grad():
        base, out = smollm2(tokens), moved(tokens)
    # float32 rounding through 30 layers, sums of 576 products each: measured max |Δ| 7e-5 (permuted) and 1.1e-4
    # (rotated) on logits up to 34
    assert (out - base).abs().max() <= 2e-5 * base.abs().max()


# The alignment is fitted on half the inputs and the orthogonal and linear maps of D = 576 dims need more fit rows
# than dims: 1400 inputs of 4 tokens (700 fit, 700 test), about as cheap as 350 of 16. At n 700 sd(τ) = 0.025, so
# p < 1e-10 over k ≈ 288 dims needs τ̄ > 6.5 · 0.025/√288 = 0.01; the calibration above keeps the analytic null's
# FPR at α on held-out rows.
ALIGNED = dict(n=1400, seq_len=4)


@pytest.fixture(scope="module")
def aligned_prints(smollm2):
    rotated = R.rotate_residual(smollm2, seed=1)
    models = {"base": smollm2, "permuted": R.permute_residual(smollm2, seed=1), "rotated": rotated,
              "rotated 4-bit": T.quantize(rotated, bits=4), "random init": next(T.random_inits(smollm2, [1_000_000]))}
    return {name: seedprint.fingerprint(m, **ALIGNED, progress=False) for name, m in models.items()}


def test_smollm2_reparametrised_descendants_are_found_once_aligned(aligned_prints):
    base = aligned_prints["base"]

    def test(name, align):
        return seedprint.lineage_test(base, aligned_prints[name], ratio_k=RATIO, align=align)

    # measured: τ̄ 1.000 for permuted and rotated, 0.75 for rotated 4-bit, under the modes that cover them
    assert test("permuted", "permutation").log10_p < -10 and test("permuted", "permutation").tau_bar > 0.99
    for mode in ("orthogonal", "linear"):
        for name in ("permuted", "rotated", "rotated 4-bit"):
            assert test(name, mode).log10_p < -10, (name, mode)
    for mode in ALIGN_MODES:
        assert test("random init", mode).p >= 0.01, mode


@pytest.mark.slow  # two tiny experiments through the command line
def test_several_families_from_the_command_line(code_blocks, tmp_path, monkeypatch):
    """`lens-bias descendants --model A B` runs one family per model and writes one results file: each family's
    table of targets and the metrics per family and pooled, equal to lineage_metrics over the families' pairs."""
    from transformers import PreTrainedTokenizerFast

    def loaded(text):
        model = tiny("llama", d_vocab=1024, seed=int(text[-1]))
        model.tokenizer = PreTrainedTokenizerFast(tokenizer_object=code_blocks.tokenizer())
        return model

    real = D.real_descendants
    monkeypatch.setattr(D, "load_model", loaded)
    monkeypatch.setattr(D, "real_descendants", lambda model, config, progress, keep: real(model, config, data=code_blocks, progress=progress, keep=keep))  # the blocks built
    code = main(["descendants", "--model", "base-0", "base-2", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"])
    verdicts = pd.concat([pd.read_csv(tmp_path / f / "descendants.csv", keep_default_na=False) for f in ("base-0", "base-2")])
    # exit 0 only where every verdict is the expected one (an activation-fitted mode may call a random init of a tiny
    # model related: TL 3 draws other inits than TL 4); the default's verdicts are all as expected
    assert code == (0 if verdicts.ok.all() else 1) and verdicts[verdicts["align"] == "auto"].ok.all()
    record = json.loads((tmp_path / "descendants.json").read_text())
    pairs = pd.concat([pd.read_csv(tmp_path / f / "pairs.csv", keep_default_na=False).assign(family=f) for f in ("base-0", "base-2")], ignore_index=True)
    expected = S.lineage_metrics(pairs)
    n = record["numbers"]
    for row in expected.itertuples():
        family = str(row.family).replace("-", "_")
        mode = "published" if row.align == "None" else row.align
        assert n[f"metrics.{family}.{mode}.auc"] == pytest.approx(row.auc) and n[f"metrics.{family}.{mode}.fpr_at_alpha"] == pytest.approx(row.fpr_at_alpha)
    assert n["metrics.pooled.auto.related"] == 30 and n["metrics.pooled.auto.pairs"] == 30 + 2 * (10 + 45)
    assert set(record["tables"]) == {"metrics", "targets_base_0", "targets_base_2"}
    targets = record["tables"]["targets_base_0"]
    assert targets["columns"] == ["target", "None (published)", '"auto"', '"permutation"', '"orthogonal"', '"linear"'] and len(targets["rows"]) == 25
    assert len(list((tmp_path / "base-0" / "fingerprints").glob("base-0--*.pt"))) == 26
    # each model's reading beside its fingerprint, under its name: what the default test reads of the saved models
    names = sorted(p.name for p in (tmp_path / "base-0" / "fingerprints").glob("*.pt"))
    assert sorted(p.name for p in (tmp_path / "base-0" / "readings").glob("*.pt")) == names
    reading = Reading.load(tmp_path / "base-0" / "readings" / "base-0--base.pt")
    assert reading.reads_drawn and torch.equal(reading.prints[0][1].features, Fingerprint.load(tmp_path / "base-0" / "fingerprints" / "base-0--base.pt").features)
    assert pd.read_csv(tmp_path / "base-2" / "fingerprints" / "labels.csv").base.eq("base-2").sum() == 16  # each family its own labels

    # every pair of the two families' saved models at once (examples/families_lineage.py, what families-lineage.md
    # renders): 52 models of one width; the related pairs are those within a family (16 models each)
    table, matrices = runpy.run_path(str(EXAMPLES / "families_lineage.py"))["main"]([str(tmp_path), "--results", str(tmp_path / "lineage.json")])
    assert (table.related == 2 * 16 * 15 // 2).all() and (table.related + table.unrelated == 52 * 51 // 2).all()
    assert (table.related_found <= table.related).all() and list(table["key"]) == ["auto_05", "none_01", "none_05", "permutation_05", "orthogonal_05", "linear_05"]
    # the default test, from the saved readings: every pair tested, and each base pair as the descendants run's own
    # "auto" test (to the same p where nothing maps)
    assert table.untestable.tolist() == [0] * 6
    by_auto = matrices["auto_05"].to_pandas().set_index(["a", "b"])
    for row in pairs[(pairs["align"] == "auto") & (pairs.a == "base")].itertuples():
        key = (f"{row.family}--base.pt", f"{row.family}--{S.slug(row.b)}.pt")
        pair = by_auto.loc[key if key in by_auto.index else key[::-1]]
        if pair.basis_map in ("identity", "none"):
            assert -pair.log10_p == pytest.approx(row.score, rel=1e-6), key
        else:
            assert pair.log10_p < -10 and row.score > 10, key
    record = json.loads((tmp_path / "lineage.json").read_text())
    per_family = pd.DataFrame(record["tables"]["per_family"]["rows"], columns=record["tables"]["per_family"]["columns"])
    pooled = per_family[per_family.family == "pooled"].set_index("test")
    assert pooled.auc.tolist() == pytest.approx(table.auc.tolist()) and set(per_family.family) == {"base-0", "base-2", "pooled"}
    maps = pd.DataFrame(record["tables"]["auto_maps"]["rows"], columns=record["tables"]["auto_maps"]["columns"])
    assert maps["count"].sum() == 52 * 51 // 2 and set(maps.pairs) == {"related", "unrelated"}
    assert maps.fewest_inputs.between(D.PRESETS["tiny"].n // 2, D.PRESETS["tiny"].n).all()  # readings.MIN_SHARE of the inputs at least
    # the all-pairs published test at the descendants' m is the descendants run's own test of each base pair
    published = matrices["none_05"].to_pandas().set_index(["a", "b"]).log10_p
    own = pairs[(pairs["align"] == "None") & (pairs.a == "base") & pairs.related.astype(bool)]
    for row in own.itertuples():
        key = (f"{row.family}--base.pt", f"{row.family}--{S.slug(row.b)}.pt")
        log10_p = published.get(key, published.get(key[::-1]))
        assert -log10_p == pytest.approx(row.score, rel=1e-6), key
    assert json.loads((tmp_path / "lineage.json").read_text())["numbers"]["tests.none_05.related_found"] == table.set_index("key").related_found["none_05"]
    # which descendants each test leaves outside its base's family: read again from each test's own families
    apart = json.loads((tmp_path / "lineage.json").read_text())["tables"]["apart"]
    assert len(apart["rows"]) == 6 * 2
    for row in (dict(zip(apart["columns"], r)) for r in apart["rows"]):
        key = next(k for k, label in zip(table["key"], table["mode"] + ", m " + table["m"]) if label == row["test"])
        family = next(f for f in matrices[key].families if f"{row['base']}--base.pt" in f)
        outside = sorted(p.stem.removeprefix(f"{row['base']}--") for p in (tmp_path / row["base"] / "fingerprints").glob("*.pt")
                         if p.name not in family and "random-init" not in p.name)
        assert row["left_apart"] == (", ".join(outside) or "none") and row["in_its_family"] + len(outside) == row["descendants"] == 15
