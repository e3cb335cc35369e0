"""Reliability: one line for every user error, the memory guard, non-finite values, interrupts and atomic files."""

from __future__ import annotations

import copy
import io
import os

import pytest
import torch

import lens_bias
import lens_bias.hooks as H
from lens_bias import LensBiasError
from lens_bias.cli import main
from lens_bias.core import memory
from lens_bias.core.files import atomic_save, atomic_write_text
from lens_bias.core.probes import Probe, last_position
from lens_bias.models.checkpoints import load_checkpoint
from lens_bias.seedprint import Fingerprint, fingerprint

from .conftest import assert_same_state, hook_snapshot, state_copy, tiny, warmed_snapshot

SMALL = ["--d-model", "32", "--n-layers", "2", "--n-heads", "4", "--d-vocab", "100", "--n-sequences", "4", "--seq-len", "8", "--no-progress"]
SPEC = "llama:d=32,L=2,H=4,V=200,ctx=16,seed=1"


@pytest.fixture(scope="module")
def model():
    return tiny(d_model=32, d_vocab=100, n_ctx=16)


@pytest.fixture(scope="module")
def garbage(tmp_path_factory):
    folder = tmp_path_factory.mktemp("files")
    (folder / "garbage.pt").write_bytes(b"this is not a torch file\n" * 20)
    torch.save({"weights": torch.zeros(3)}, folder / "foreign.pt")
    fp = fingerprint(tiny(d_model=32, d_vocab=100, n_ctx=16), n=8, seq_len=8, progress=False)
    fp.save(folder / "good.pt")
    data = (folder / "good.pt").read_bytes()
    (folder / "truncated.pt").write_bytes(data[: len(data) // 2])
    return folder


def one_line_error(capsys, argv: list[str], message: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    command = argv[0]
    assert err.startswith(f"lens-bias {command}: error: ") and "\n" not in err, err
    assert message in err, err
    return err


# ---- one line per user error --------------------------------------------------------------------------------


def test_seq_len_beyond_memory_is_refused_at_once_with_the_estimate(capsys):
    err = one_line_error(capsys, ["analyze", *SMALL, "--seq-len", "99999"], "pass seq_len <=")
    assert "GiB for one sequence of 99999 tokens" in err and "available" in err
    longest = int(err.rsplit("<=", 1)[1])
    assert 100 < longest < 99999


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", [["analyze", *SMALL], ["fingerprint", SPEC, "-o", "x.pt"], ["train", SPEC, "--out", "x"]])
def test_unavailable_device(capsys, command):
    one_line_error(capsys, [*command, "--device", "cuda"], "CUDA is not available")


def test_unknown_device_name(capsys):
    one_line_error(capsys, ["analyze", *SMALL, "--device", "tpu9"], "is not a torch device")


def test_meta_device_and_meta_weights_are_refused(capsys, model):
    one_line_error(capsys, ["analyze", *SMALL, "--device", "meta"], "holds no data")
    ghost = copy.deepcopy(model).to("meta")
    with pytest.raises(LensBiasError, match="meta device"):
        lens_bias.analyze(ghost, n_sequences=2, seq_len=4, progress=False)


def test_unknown_model_name_offline(capsys, monkeypatch, tmp_path):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    corpus = tmp_path / "x.txt"
    corpus.write_text("some text\n")
    one_line_error(capsys, ["train", "nope", "--corpus", str(corpus), "--out", str(tmp_path / "o")], "could not load 'nope'")


@pytest.mark.parametrize("name, message", [("garbage.pt", "not a lens_bias fingerprint file"), ("foreign.pt", "not a lens_bias fingerprint file"),
                                           ("truncated.pt", "corrupt or truncated"), ("missing.pt", "no fingerprint at")])
def test_bad_fingerprint_files(capsys, garbage, name, message):
    one_line_error(capsys, ["seedprint", str(garbage / name), str(garbage / "good.pt")], message)
    with pytest.raises((LensBiasError, FileNotFoundError), match=message):
        Fingerprint.load(garbage / name)


def test_bad_checkpoint_files(capsys, garbage):
    one_line_error(capsys, ["fingerprint", str(garbage / "garbage.pt"), "-o", str(garbage / "out.pt")], "not a lens_bias checkpoint file")
    with pytest.raises(LensBiasError, match="not a lens_bias checkpoint file"):
        load_checkpoint(garbage / "foreign.pt")


def test_output_into_a_missing_folder(capsys, tmp_path):
    one_line_error(capsys, ["fingerprint", SPEC, "-o", str(tmp_path / "no" / "fp.pt"), "--n", "4", "--no-progress"], "does not exist")


@pytest.mark.parametrize("argv, message", [(["--batch-size", "0"], "batch_size must be a positive int"),
                                           (["--n-sequences", "0"], "n_sequences must be >= 1")])
def test_bad_sizes(capsys, argv, message):
    one_line_error(capsys, ["analyze", *SMALL, *argv], message)


def test_debug_shows_the_traceback():
    with pytest.raises(LensBiasError, match="batch_size must be a positive int"):
        main(["analyze", *SMALL, "--batch-size", "0", "--debug"])


# ---- the memory guard ---------------------------------------------------------------------------------------


def test_guard_refuses_one_sequence_that_cannot_fit_and_names_the_longest_that_does(model):
    info = lens_bias.extend.ModelAdapter(model).info
    one = memory.forward_bytes(seq_len=16, d_model=32, n_heads=4, d_mlp=info.d_mlp, d_vocab=100, family=info.family)
    with pytest.raises(LensBiasError, match=r"pass seq_len <= (\d+)") as caught:
        memory.plan_batch(info, n=10, seq_len=16, dtype=torch.float32, device="cpu", available=int(one * 1.5))  # budget 0.75 × one
    longest = int(caught.value.args[0].rsplit("<=", 1)[1])
    fits = lambda t: memory.forward_bytes(seq_len=t, d_model=32, n_heads=4, d_mlp=info.d_mlp, d_vocab=100, family=info.family)
    assert 1 <= longest < 16 and fits(longest) <= 0.75 * one < fits(longest + 1)


def test_guard_picks_the_batch_from_free_memory_and_checks_the_callers(model):
    info = lens_bias.extend.ModelAdapter(model).info
    one = memory.forward_bytes(seq_len=16, d_model=32, n_heads=4, d_mlp=info.d_mlp, d_vocab=100, family=info.family)
    plan = lambda free, **kw: memory.plan_batch(info, n=10**6, seq_len=16, dtype=torch.float32, device="cpu", available=free, **kw)
    assert plan(int(one * 2 * 7.5)) == 7  # half the free memory, 7.5 sequences' worth -> 7
    assert plan(2**40) == memory.MAX_TOKENS_PER_BATCH // 16
    assert plan(int(one * 2 * 7.5), batch_size=7) == 7
    with pytest.raises(LensBiasError, match="pass batch_size <= 7"):
        plan(int(one * 2 * 7.5), batch_size=8)


def test_logits_count_only_when_the_pass_reaches_the_unembedding():
    kw = dict(seq_len=64, d_model=32, n_heads=4, d_mlp=128, d_vocab=50000)
    assert memory.forward_bytes(**kw, logits=True) - memory.forward_bytes(**kw) == 2 * 64 * 50000 * 4


def test_analyze_refuses_before_running_when_memory_is_short(model, monkeypatch):
    before, hooks = state_copy(model), warmed_snapshot(model)
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 10_000)
    with pytest.raises(LensBiasError, match="pass seq_len <=|smaller model"):
        lens_bias.analyze(model, n_sequences=4, seq_len=16, progress=False)
    assert hook_snapshot(model) == hooks
    assert_same_state(model, before)


def test_probes_that_keep_too_much_are_refused_after_the_first_batch(model, monkeypatch):
    full = Probe("blocks.0.hook_resid_post", "all", lambda x: x)  # keeps [batch, 16, 32] floats: 2 KiB a sequence
    adapter = lens_bias.extend.ModelAdapter(model)
    tokens = lens_bias.random_tokens(2000, 16, 100)
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 2 * 2**20)  # 1 MiB usable: batches of 8 fit
    with pytest.raises(LensBiasError, match="pass at most 512 sequences"):  # 2 KiB each, written into one [n, 16, 32] tensor
        adapter.collect(tokens, [full], batch_size=8, progress=False)


def test_train_refuses_a_step_that_cannot_fit(monkeypatch):
    from lens_bias.core.corpora import prose
    from lens_bias.training.data import TokenData
    from lens_bias.training.trainer import train

    m = lens_bias.random_init(SPEC.split(":")[0], d_model=32, n_layers=2, n_heads=4, d_vocab=300, n_ctx=16, seed=1)
    data = TokenData.build(prose(), vocab_size=300, seq_len=16)
    before = state_copy(m)
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 8 * 2**20)
    with pytest.raises(LensBiasError, match=r"pass batch_size <= \d+"):
        train(m, data, steps=2, batch_size=4096, progress=False)
    assert_same_state(m, before)


# ---- non-finite values --------------------------------------------------------------------------------------


def test_nan_inputs_are_refused(model):
    emb = torch.randn(4, 8, 32) * 0.02
    emb[2, 3, 5] = float("nan")
    with pytest.raises(LensBiasError, match=r"1 NaN/inf value\(s\), the first at index \(2, 3, 5\)"):
        lens_bias.analyze(model, inputs=emb, progress=False)
    with pytest.raises(LensBiasError, match="must be finite"):
        lens_bias.RandomEmbeddings(4, 8, 32, mean=0.0, std=float("inf"))


def test_nan_inside_the_model_names_the_first_hook_where_it_appeared(model):
    def poison(x, hook):
        x = x.clone()
        x[1, 2] = float("inf")  # one sequence, one position: the probes' reductions alone might hide it
        return x

    before, hooks = state_copy(model), warmed_snapshot(model)
    with pytest.raises(LensBiasError, match=r"NaN/inf first appeared at hook blocks\.1\.\S+ \(sequences 0-3\)"):
        lens_bias.extend.ModelAdapter(model).collect(
            lens_bias.random_tokens(8, 8, 100), [last_position(f"blocks.{layer}.hook_resid_post") for layer in (0, 1)],
            batch_size=4, hooks=[("blocks.1.hook_resid_mid", poison)], progress=False)
    assert hook_snapshot(model) == hooks
    assert_same_state(model, before)


def test_a_broken_checkpoint_is_reported_at_its_layer(tmp_path):
    m = tiny(d_model=32, d_vocab=100, n_ctx=16)
    state = m.state_dict()  # shares storage with the parameters
    with torch.no_grad():
        state[next(k for k in state if k.startswith("blocks.1.") and "mlp" in k and state[k].ndim == 2)].fill_(float("nan"))
    with pytest.raises(LensBiasError, match=r"first appeared at hook blocks\.1\..*check the checkpoint"):
        lens_bias.analyze(m, n_sequences=4, seq_len=8, progress=False)


def test_nan_features_are_refused(garbage, tmp_path):
    fp = Fingerprint.load(garbage / "good.pt")
    bad = copy.deepcopy(fp)
    bad.features[0, 0] = float("nan")
    bad.save(tmp_path / "nan.pt")
    with pytest.raises(LensBiasError, match="NaN/inf features"):
        Fingerprint.load(tmp_path / "nan.pt")
    with pytest.raises(LensBiasError, match="NaN/inf features"):
        lens_bias.seedprint.lineage_test(fp, bad.features, m=8)


# ---- interrupts and atomic files ----------------------------------------------------------------------------


def _interrupt_on_call(k: int):
    calls = []

    def hook(x, hook):
        calls.append(1)
        if len(calls) == k:
            raise KeyboardInterrupt
    return hook


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupted_analyze_and_fingerprint_leave_the_model_unchanged(model, exc):
    before, hooks = state_copy(model), warmed_snapshot(model)
    model.train()

    def boom(x, hook, calls=[]):
        calls.append(1)
        if len(calls) == 2:  # the second batch
            raise exc("stop")

    with pytest.raises(exc):
        lens_bias.extend.ModelAdapter(model).collect(lens_bias.random_tokens(8, 8, 100), [last_position("ln_final.hook_normalized")],
                                              batch_size=4, hooks=[("blocks.0.hook_resid_mid", boom)], progress=False)
    assert model.training
    model.eval()
    assert hook_snapshot(model) == hooks
    assert_same_state(model, before)


INTERVENTIONS = [H.OddActivation(), H.MeanCenterMLP(), H.SwapActivation(), H.SelfOnlyAttention(), H.UniformAttention(), H.ZeroSublayer(),
                 H.MaskToSelf(), H.AmplifyVariance(), H.ScaleNorm(), H.HeadwiseRMSNorm(gain=False), H.SetActivations(), H.RemoveWeight(),
                 H.RemoveWeights(weights=((0, 1, 2),))]


@pytest.mark.parametrize("iv", INTERVENTIONS, ids=lambda iv: type(iv).__name__)
def test_every_intervention_interrupted_leaves_the_model_unchanged(model, iv):
    before, hooks = state_copy(model), warmed_snapshot(model)
    with pytest.raises(KeyboardInterrupt):
        with H.intervene(model, iv):
            model(lens_bias.random_tokens(2, 8, 100))
            raise KeyboardInterrupt
    tokens = lens_bias.random_tokens(4, 8, 100)
    with pytest.raises(KeyboardInterrupt):
        lens_bias.extend.ModelAdapter(model).collect(tokens, [last_position("ln_final.hook_normalized")], batch_size=2,
                                              hooks=H.edit_hooks(model, [iv, ("blocks.1.hook_resid_post", _interrupt_on_call(2))]), progress=False)
    assert hook_snapshot(model) == hooks
    assert_same_state(model, before)


def test_interrupted_save_leaves_no_partial_file(tmp_path, monkeypatch, garbage):
    fp = Fingerprint.load(garbage / "good.pt")
    target = tmp_path / "fp.pt"
    fp.save(target)
    good = target.read_bytes()
    real_save = torch.save

    def half_then_interrupt(obj, handle, *a, **kw):
        real_save(obj, handle, *a, **kw)
        handle.truncate(100)
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        fp.save(target)
    with pytest.raises(KeyboardInterrupt):
        fp.save(tmp_path / "new.pt")
    assert target.read_bytes() == good and not (tmp_path / "new.pt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fp.pt"]


class _InterruptOnWrite(io.RawIOBase):
    """A file that raises KeyboardInterrupt on its ``at``-th write, as Ctrl-C would land mid-record."""

    def __init__(self, inner, at: int):
        self.inner, self.at, self.writes = inner, at, 0

    def writable(self):
        return True

    def write(self, data):
        self.writes += 1
        if self.writes == self.at:
            raise KeyboardInterrupt
        return self.inner.write(data)


@pytest.mark.parametrize("at", range(1, 9))
def test_an_interrupt_inside_torch_save_surfaces_as_the_interrupt(tmp_path, monkeypatch, at):
    # torch's zip writer, stopped mid-record, raises RuntimeError("unexpected pos") on its way out; the caller
    # must see the KeyboardInterrupt, and neither a partial file nor the temporary one may stay.
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda obj, handle: real_save(obj, _InterruptOnWrite(handle, at)))
    with pytest.raises(KeyboardInterrupt):
        atomic_save({"w": torch.randn(100, 10), "v": torch.randn(3)}, tmp_path / "out.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("write", [lambda p: atomic_save({"v": torch.ones(3)}, p), lambda p: atomic_write_text(p, '{"a": 1}')],
                         ids=["atomic_save", "atomic_write_text"])
def test_an_interrupted_cache_write_keeps_the_old_file_whole(tmp_path, monkeypatch, write):
    target = tmp_path / "cache.json"
    target.write_text("old")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(KeyboardInterrupt))  # after every byte is written
    with pytest.raises(KeyboardInterrupt):
        write(target)
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"] and target.read_text() == "old"
    monkeypatch.undo()
    write(target)
    assert [p.name for p in tmp_path.iterdir()] == ["cache.json"] and target.read_bytes() != b"old"


def test_interrupted_training_keeps_complete_checkpoints_only(tmp_path, monkeypatch):
    from lens_bias.core.corpora import prose
    from lens_bias.training import trainer as train_module
    from lens_bias.training.data import TokenData

    m = lens_bias.random_init("llama", d_model=32, n_layers=2, n_heads=4, d_vocab=300, n_ctx=16, seed=1)
    data = TokenData.build(prose(), vocab_size=300, seq_len=16)
    hooks = warmed_snapshot(m)
    real_loss, calls = train_module._loss, []

    def interrupted(model, blocks):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_loss(model, blocks)

    monkeypatch.setattr(train_module, "_loss", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train_module.train(m, data, steps=5, batch_size=2, checkpoint_every=1, checkpoint_dir=tmp_path, interventions=[H.HeadwiseRMSNorm().bind(m)],
                           eval_every=100, progress=False)
    assert not m.training and hook_snapshot(m) == hooks
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["step000000.pt", "step000001.pt", "step000002.pt"]
    for name in names:
        assert load_checkpoint(tmp_path / name).cfg.d_model == 32
