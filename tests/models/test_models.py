"""random_init: architectures, HF-default init scale, determinism per seed, no global-RNG use."""

import math

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.extend import ModelAdapter
from lens_bias.models import ModelSpec

from ..conftest import BACKEND, tiny


def _sd_tolerance(n: int, std: float) -> float:
    """5 standard errors of a sample std from n Gaussian draws: sd(s) ≈ std / √(2n)."""
    return 5 * std / math.sqrt(2 * n)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_weights_follow_hf_init(arch):
    model = tiny(arch, d_model=128, n_layers=3, n_heads=4)
    assert ModelAdapter(model).info.family == BACKEND
    # gpt2 scales residual-output projections by 1/sqrt(2 L) like HF GPT-2; llama/qwen2 use 0.02 everywhere.
    out_std = 0.02 / math.sqrt(2 * 3) if arch == "gpt2" else 0.02
    for name, expected in [("W_Q", 0.02), ("W_K", 0.02), ("W_in", 0.02), ("W_E", 0.02), ("W_U", 0.02), ("W_O", out_std), ("W_out", out_std)]:
        w = getattr(model, name).detach()
        assert abs(w.std().item() - expected) < _sd_tolerance(w.numel(), expected), name
        assert abs(w.mean().item()) < 5 * expected / math.sqrt(w.numel()), name
    if arch == "qwen2" and BACKEND == "bridge":
        assert any("q_proj" in n and n.endswith(".bias") for n, _ in model.named_parameters())
    for name, p in model.named_parameters():
        if name.endswith(("bias", ".b")) or name.rsplit(".", 1)[-1].startswith("b_"):
            assert torch.all(p == 0), name


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_same_seed_same_weights_other_seed_differs(arch):
    a, b, c = tiny(arch, seed=3), tiny(arch, seed=3), tiny(arch, seed=4)
    sa, sb, sc = (dict(m.named_parameters()) for m in (a, b, c))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    matrices = [k for k in sa if sa[k].ndim >= 2 and sa[k].std() > 0]
    assert matrices and not any(torch.equal(sa[k], sc[k]) for k in matrices)


def test_global_rng_untouched():
    state = torch.random.get_rng_state()
    tiny("gpt2")
    tiny("llama")
    assert torch.equal(state, torch.random.get_rng_state())


def test_architecture_is_what_was_asked():
    info = ModelAdapter(tiny("gpt2", act_fn="silu", positional_embedding="rotary")).info
    assert (info.act_fn, info.positional_embedding, info.normalization, info.gated_mlp) == ("silu", "rotary", "LN", False)
    info = ModelAdapter(tiny("llama")).info
    assert (info.act_fn, info.positional_embedding, info.normalization, info.gated_mlp) == ("silu", "rotary", "RMS", True)
    assert info.d_mlp == 176  # 8/3 · 64 rounded up to a multiple of 16
    info = ModelAdapter(tiny("gpt2", attn_only=True)).info
    assert info.attn_only and info.d_mlp is None
    assert not any(k.startswith("blocks.0.mlp") for k in tiny("gpt2", attn_only=True).hook_dict)


def test_positional_none_is_a_frozen_zero_table():
    model = tiny("gpt2", positional_embedding="none")
    assert ModelAdapter(model).info.positional_embedding == "none"
    assert torch.all(model.W_pos == 0) and not model.W_pos.requires_grad
    # A repeated token: without positions every position averages identical vectors, so all positions agree;
    # learned positions make them differ.
    repeated = torch.full((1, 8), 5)
    with torch.no_grad():
        logits = model(repeated)[0]
        assert torch.allclose(logits[0], logits[-1], atol=1e-5)
        learned = tiny("gpt2", positional_embedding="learned")(repeated)[0]
        assert not torch.allclose(learned[0], learned[-1], atol=1e-3)


@pytest.mark.parametrize("arch, pos", [("gpt2", "none"), ("gpt2", "learned"), ("llama", None), ("qwen2", None)])
def test_redraw_equals_a_fresh_build(arch, pos):
    model = tiny(arch, positional_embedding=pos, seed=0)
    lens_bias.models.redraw(model, 9)
    fresh = tiny(arch, positional_embedding=pos, seed=9)
    assert model.lens_bias_spec == fresh.lens_bias_spec
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in model.state_dict().items())


def test_spec_roundtrip_and_rebuild():
    model = tiny("gpt2", act_fn="relu")
    spec = model.lens_bias_spec
    assert ModelSpec.from_dict(spec.to_dict()) == spec
    rebuilt = lens_bias.random_init(spec)
    assert all(torch.equal(v, rebuilt.state_dict()[k]) for k, v in model.state_dict().items())


def test_bfloat16_build():
    model = tiny("gpt2", d_model=64)
    half = lens_bias.random_init(model.lens_bias_spec, dtype=torch.bfloat16)
    assert half.W_Q.dtype == torch.bfloat16
    assert torch.equal(half.W_Q.float(), model.W_Q.to(torch.bfloat16).float())


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(arch="bert"), "unknown arch"),
        (dict(arch="gpt2", act_fn="tanh"), "act_fn 'tanh'"),
        (dict(arch="llama", positional_embedding="learned"), "positional_embedding 'learned'"),
        (dict(arch="gpt2", d_model=100, n_heads=8), "divisible"),
        (dict(arch="llama", d_model=12, n_heads=4), "rotary positions need an even head width: d_model / n_heads = 3"),
        (dict(arch="llama", attn_only=True), "attn_only"),
    ],
)
def test_bad_specs_raise_clear_errors(kwargs, message):
    arch = kwargs.pop("arch")
    with pytest.raises(LensBiasError, match=message):
        lens_bias.random_init(arch, **kwargs)


def test_unknown_keyword_is_a_type_error():
    with pytest.raises(TypeError, match="d_modle"):
        lens_bias.random_init("gpt2", d_modle=64)


def test_every_source_records_the_regime(tmp_path):
    from lens_bias.core.corpora import Corpus
    from lens_bias.models import load_checkpoint, redraw, save_checkpoint
    from lens_bias.training import TokenData, train

    model = tiny("llama", d_vocab=300, n_ctx=16)
    assert lens_bias.extend.ModelAdapter(model).info.regime == "init"
    save_checkpoint(model, tmp_path / "init.pt")
    assert lens_bias.extend.ModelAdapter(load_checkpoint(tmp_path / "init.pt")).info.regime == "init"
    data = TokenData.build(Corpus("tiny", ("the quick brown fox jumps over the lazy dog " * 40,) * 30), vocab_size=300, seq_len=8, cache=tmp_path)
    train(model, data, steps=1, batch_size=2, progress=False)
    assert lens_bias.extend.ModelAdapter(model).info.regime == "trained"
    save_checkpoint(model, tmp_path / "trained.pt")
    assert lens_bias.extend.ModelAdapter(load_checkpoint(tmp_path / "trained.pt")).info.regime == "trained"
    assert lens_bias.extend.ModelAdapter(redraw(model, 3)).info.regime == "init"
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=50))
    assert lens_bias.extend.ModelAdapter(lens_bias.from_hf(hf)).info.regime == "trained"
