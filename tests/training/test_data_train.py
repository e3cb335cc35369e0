"""Offline corpora, the BPE tokenizer, token blocks and the deterministic trainer."""

import datasets
import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.core.corpora import Corpus, code, hf_dataset, prose, text_files
from lens_bias.models.checkpoints import load_checkpoint
from lens_bias.training.data import TokenData
from lens_bias.training.trainer import batch_order, train


@pytest.fixture(scope="module")
def corpora():
    return prose(), code()


@pytest.mark.slow
def test_corpora_are_deterministic_real_and_different(corpora, tmp_path, monkeypatch):
    p, c = corpora
    assert len(p.documents) > 1000 and p.n_chars > 1_000_000 and c.n_chars > 5_000_000
    assert all(len(d) >= 200 for d in p.documents + c.documents)
    assert len(set(p.documents)) == len(p.documents)  # deduplicated
    assert '"""' not in c.documents[0][:200] or c.documents[0].count('"""') < 2  # docstrings removed
    monkeypatch.setenv("LENS_BIAS_CACHE", str(tmp_path))  # re-extract from scratch: same corpus
    assert prose().digest() == p.digest() and code().digest() == c.digest()
    assert p.meta["python"].count(".") == 2
    letters = sum(ch.isalpha() for ch in p.documents[0]) / len(p.documents[0])
    symbols = sum(ch in "()[]:=_" for d in c.documents[:50] for ch in d) / sum(len(d) for d in c.documents[:50])
    prose_symbols = sum(ch in "()[]:=_" for d in p.documents[:50] for ch in d) / sum(len(d) for d in p.documents[:50])
    assert letters > 0.6 and symbols > 2 * prose_symbols


@pytest.fixture(scope="module")
def blocks(corpora, tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    p, c = corpora
    on_prose = TokenData.build(p, vocab_size=1024, seq_len=32, cache=cache)
    on_code = TokenData.build(c, seq_len=32, tokenizer_from=on_prose, cache=cache)
    return on_prose, on_code


def test_a_vocabulary_the_corpus_cannot_give_is_refused_before_training(tmp_path):
    tiny = Corpus("tiny", ("abc abd " * 10,) * 3)  # 240 characters: at most 240 merges after the 257 base symbols
    with pytest.raises(LensBiasError, match="vocab_size must be an int >= 257"):
        TokenData.build(tiny, vocab_size=100, seq_len=8, cache=tmp_path)
    with pytest.raises(LensBiasError, match="pass vocab_size <= 497"):
        TokenData.build(tiny, vocab_size=10**12, seq_len=8, cache=tmp_path)  # the BPE trainer would abort the process


def test_tokenizer_round_trips_and_blocks_pack(blocks):
    on_prose, on_code = blocks
    tokenizer = on_prose.tokenizer()
    for text in ("Return the number of items in a container.", "def f(x):\n    return x ** 2  # square"):
        assert tokenizer.decode(tokenizer.encode(text).ids) == text
    assert on_prose.train.shape[1] == 33 and on_prose.vocab_size == on_code.vocab_size == 1024
    assert int(on_prose.train.max()) < 1024 and len(on_prose.eval) > 0
    # prose and code differ in token statistics: their unigram distributions are far apart
    p = torch.bincount(on_prose.train.flatten(), minlength=1024).double()
    q = torch.bincount(on_code.train.flatten(), minlength=1024).double()
    p, q = p / p.sum(), q / q.sum()
    assert 0.5 * (p - q).abs().sum() > 0.2  # total variation distance


def test_text_files_and_hf_datasets(tmp_path):
    (tmp_path / "a.txt").write_text("first document")
    (tmp_path / "b.txt").write_text("second document")
    assert text_files([tmp_path / "a.txt", tmp_path / "b.txt"]).documents == ("first document", "second document")
    ds = datasets.Dataset.from_dict({"text": ["one story", "", "another story"], "id": [1, 2, 3]})
    assert hf_dataset(ds).documents == ("one story", "another story")
    with pytest.raises(LensBiasError, match="no column 'body'"):
        hf_dataset(ds, text_field="body")
    with pytest.raises(LensBiasError, match="no documents"):
        Corpus("empty", ())


def tiny_model(seed):
    return lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=1024, n_ctx=32, seed=seed)


def test_training_lowers_the_loss_and_is_deterministic(blocks, tmp_path):
    on_prose, _ = blocks
    a, b = tiny_model(0), tiny_model(0)
    run = train(a, on_prose, steps=40, batch_size=8, lr=3e-3, checkpoint_every=20, checkpoint_dir=tmp_path, progress=False)
    train(b, on_prose, steps=40, batch_size=8, lr=3e-3, progress=False)
    assert run.losses.loss.iloc[-5:].mean() < run.losses.loss.iloc[:5].mean() - 0.5  # measured 6.92 -> 6.09
    assert run.evals.eval_loss.is_monotonic_decreasing
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())  # same seeds, same weights
    assert [p.name for p in run.checkpoints] == ["step000000.pt", "step000020.pt", "step000040.pt"]
    restored = load_checkpoint(run.checkpoints[-1])
    assert all(torch.equal(v, restored.state_dict()[k]) for k, v in a.state_dict().items())
    assert not torch.equal(load_checkpoint(run.checkpoints[0]).W_Q, a.W_Q)


def test_data_order_depends_only_on_the_data_seed():
    assert torch.equal(batch_order(100, 30, 8, data_seed=42), batch_order(100, 30, 8, data_seed=42))
    assert not torch.equal(batch_order(100, 30, 8, data_seed=42), batch_order(100, 30, 8, data_seed=43))
    order = batch_order(100, 25, 8, data_seed=1)  # epochs of permutations: each block once per epoch
    assert sorted(order.flatten()[:100].tolist()) == list(range(100))


def test_interventions_stay_attached_while_training(blocks):
    from lens_bias.hooks import OddActivation

    on_prose, _ = blocks
    plain, odd = tiny_model(1), tiny_model(1)
    train(plain, on_prose, steps=5, batch_size=4, progress=False)
    train(odd, on_prose, steps=5, batch_size=4, interventions=[OddActivation()], progress=False)
    assert not torch.equal(plain.W_in, odd.W_in)
    assert odd.lens_bias_spec.seed == 1


def test_training_reads_its_losses_in_stretches_not_every_step(blocks):
    """Reading the loss every step would stop a GPU every step: the losses are read once per SYNC_EVERY steps."""
    from lens_bias.training.trainer import SYNC_EVERY

    from ..test_host_transfers import host_transfers

    on_prose, _ = blocks
    counts = {}
    for steps in (SYNC_EVERY, 3 * SYNC_EVERY):
        with host_transfers() as sites:
            run = train(tiny_model(2), on_prose, steps=steps, batch_size=2, eval_every=steps, eval_blocks=2, progress=False)
        counts[steps] = sum(sites.values())
        assert run.losses.loss.notna().all() and len(run.losses) == steps  # every step's loss, read in stretches
    assert counts[3 * SYNC_EVERY] - counts[SYNC_EVERY] == 2, counts  # two more stretches, one read each


def test_a_non_finite_loss_stops_training_and_names_its_step(blocks):
    on_prose, _ = blocks
    model = tiny_model(3)
    with torch.no_grad():
        model.W_E.fill_(float("nan"))
    with pytest.raises(LensBiasError, match=r"the training loss is nan at step 1 \(losses are read every \d+ steps, so the weights were updated 3 more"):
        train(model, on_prose, steps=3, batch_size=2, eval_every=3, eval_blocks=2, progress=False)


def test_training_refuses_mismatched_data(blocks):
    on_prose, _ = blocks
    small_vocab = lens_bias.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=32)
    with pytest.raises(LensBiasError, match="d_vocab"):
        train(small_vocab, on_prose, steps=1)


@pytest.mark.slow
def test_tiny_persistence_run_gives_the_papers_verdicts(tmp_path):
    import pandas as pd

    from lens_bias.experiments.persistence import run_persistence

    result = run_persistence("tiny", inputs=("tokens", "embeddings"), progress=False)
    result.save(tmp_path)
    tables = pd.read_csv(tmp_path / "tables.csv")
    assert list(tables.columns) == ["table", "base", "target", "inputs", "tau_bar", "k", "p", "same_lineage", "expected"]
    assert sorted(tables.value_counts(["inputs", "table"]).items()) == [((kind, t), n) for kind in ("embeddings", "tokens") for t, n in [(1, 4), (2, 4), (3, 4), (4, 2)]]
    nulls = result.tables.groupby(["inputs", "table"]).null.unique().map(list).to_dict()
    assert nulls == {
        ("tokens", 1): ["analytic"], ("tokens", 2): ["analytic"], ("tokens", 3): ["analytic"], ("tokens", 4): ["trained seeds"],
        ("embeddings", 1): ["seeds"], ("embeddings", 2): ["trained seeds"], ("embeddings", 3): ["trained seeds"], ("embeddings", 4): ["trained seeds"],
    }
    for row in tables.itertuples():
        if row.table == 2 and row.inputs == "tokens":
            assert row.p < 1e-10, row  # init -> trained, same seed
        elif row.table == 2:
            continue  # embedding inputs at d 64, 2 layers: not detected (README); the default preset detects it
        elif row.expected == "related":
            assert row.p < 0.01, row  # trained 1000 -> continued on code from 1000
        else:
            assert row.p > 0.01, row  # different init seeds, however trained: no false positive under either null
    assert result.tables[result.tables.inputs == "tokens"].ok.all()
    curve = result.curve
    assert list(curve.step) == [0, 20, 40, 60] and (curve.log10_p < -10).all()
    training = result.training
    assert (training.eval_loss < training.final_train_loss + 0.5).all() and len(training) == 8  # 4 + 2 null seeds + 2 continued
    # the results file the persistence page is rendered from: its numbers are the tables', computed here again
    import json

    record = json.loads((tmp_path / "persistence.json").read_text())
    numbers = record["numbers"]
    assert numbers["verdicts"] == len(tables) == 28 and numbers["as_expected"] == int(result.tables.ok.sum())
    tokens_2 = tables[(tables.inputs == "tokens") & (tables.table == 2)]
    assert numbers["tokens.t2.tau_bar.min"] == tokens_2.tau_bar.min() and numbers["tokens.t2.p.max"] == tokens_2.p.max()
    continued = tables[(tables.table == 4) & (tables.expected == "unrelated") & (tables.inputs == "embeddings")]
    assert numbers["embeddings.t4_unrelated.p.min"] == continued.p.iloc[0]
    assert numbers["curve.log10_p.max"] == curve.log10_p.max() and numbers["curve.late.from_step"] == 40
    assert numbers["training.code.eval_loss.max"] == training[training.run.str.startswith("continue")].eval_loss.max()
    assert set(record["depends"]) == {"lens_bias/experiments/persistence.py", "lens_bias/seedprint", "lens_bias/training"}
