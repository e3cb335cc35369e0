"""Interventions: each edit equals a direct computation, composes, serialises, passes gradients, cleans up."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import lens_bias
from lens_bias import LensBiasError, intervene
from lens_bias.hooks import (
    Compose,
    Intervention,
    MeanCenterMLP,
    OddActivation,
    SelfOnlyAttention,
    SubtractPositionEmbedding,
    SwapActivation,
    UniformAttention,
    ZeroSublayer,
)

from .conftest import BACKEND, assert_same_state, hook_snapshot, state_copy, tiny, warmed_snapshot

TOKENS = lens_bias.random_tokens(4, 9, 97, seed=11)
PHI = {"relu": F.relu, "silu": F.silu, "gelu": F.gelu}


def edited_cache(model, *interventions):
    """run_with_cache inside intervene: cache hooks are added after the edits, so they see edited values."""
    with torch.no_grad(), intervene(model, *interventions):
        _, cache = model.run_with_cache(TOKENS)
    return cache


def gate(cache, layer, values):
    """Multiply by the up-projection in gated MLPs."""
    key = f"blocks.{layer}.mlp.hook_pre_linear"
    return values * cache[key] if key in cache else values


@pytest.mark.parametrize("arch, act", [("gpt2", "relu"), ("gpt2", "gelu"), ("llama", "silu")])
def test_odd_activation_is_the_odd_part(arch, act):
    model = tiny(arch, act_fn=act)
    cache = edited_cache(model, OddActivation(layers=[1]))
    phi = PHI[act]
    pre = cache["blocks.1.mlp.hook_pre"]
    assert torch.allclose(cache["blocks.1.mlp.hook_post"], gate(cache, 1, (phi(pre) - phi(-pre)) / 2), atol=1e-6)
    # layer 0 untouched
    pre0 = cache["blocks.0.mlp.hook_pre"]
    assert torch.allclose(cache["blocks.0.mlp.hook_post"], gate(cache, 0, phi(pre0)), atol=1e-6)
    # and the edit reaches the MLP output: W_out applied to the edited hidden state
    if BACKEND == "bridge" and arch == "gpt2":
        expected = cache["blocks.1.mlp.hook_post"] @ model.W_out[1] + model.b_out[1]
        assert torch.allclose(cache["blocks.1.hook_mlp_out"], expected, atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_swap_activation_recomputes_from_hook_pre(arch):
    model = tiny(arch, act_fn="relu" if arch == "gpt2" else None)
    cache = edited_cache(model, SwapActivation("tanh"))
    for layer in range(2):
        pre = cache[f"blocks.{layer}.mlp.hook_pre"]
        assert torch.allclose(cache[f"blocks.{layer}.mlp.hook_post"], gate(cache, layer, torch.tanh(pre)), atol=1e-6)
    cache = edited_cache(model, SwapActivation(lambda a: 2 * a, layers=[0]))
    assert torch.allclose(cache["blocks.0.mlp.hook_post"], gate(cache, 0, 2 * cache["blocks.0.mlp.hook_pre"]), atol=1e-6)


def test_mean_center_mlp_removes_the_batch_mean():
    model = tiny("gpt2", act_fn="relu")
    plain = edited_cache(model)
    cache = edited_cache(model, MeanCenterMLP(layers=[0]))
    post = plain["blocks.0.mlp.hook_post"]
    assert torch.allclose(cache["blocks.0.mlp.hook_post"], post - post.mean(dim=(0, 1)), atol=1e-6)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_attention_patterns(arch):
    model = tiny(arch)
    cache = edited_cache(model, SelfOnlyAttention())
    for layer in range(2):  # z = v: each position keeps its own value vector
        assert torch.allclose(cache[f"blocks.{layer}.attn.hook_z"], cache[f"blocks.{layer}.attn.hook_v"], atol=1e-6)
    cache = edited_cache(model, UniformAttention(layers=[1]))
    v = cache["blocks.1.attn.hook_v"]  # [batch, pos, head, d_head]
    prefix_mean = v.cumsum(dim=1) / torch.arange(1, v.shape[1] + 1)[None, :, None, None]
    assert torch.allclose(cache["blocks.1.attn.hook_z"], prefix_mean, atol=1e-6)


@pytest.mark.parametrize("sublayer, other", [("mlp", "attn"), ("attn", "mlp")])
def test_zero_sublayer_removes_it_from_the_residual(sublayer, other):
    model = tiny("llama")
    cache = edited_cache(model, ZeroSublayer(sublayer, layers=[1]))
    expected = cache["blocks.1.hook_resid_pre"] + cache[f"blocks.1.hook_{other}_out"]
    assert torch.allclose(cache["blocks.1.hook_resid_post"], expected, atol=1e-6)
    assert not torch.allclose(edited_cache(model)["blocks.1.hook_resid_post"], expected, atol=1e-4)


def test_subtract_position_embedding():
    model = tiny("gpt2", positional_embedding="learned")
    cache = edited_cache(model, SubtractPositionEmbedding())
    assert torch.allclose(cache["blocks.0.hook_resid_pre"], cache["hook_embed"], atol=1e-7)
    assert not torch.allclose(edited_cache(model)["blocks.0.hook_resid_pre"], cache["hook_embed"], atol=1e-4)


ALL = [OddActivation(), MeanCenterMLP(), SwapActivation("gelu"), SelfOnlyAttention(), UniformAttention(), ZeroSublayer("attn", layers=[1]), ZeroSublayer("mlp", layers=[0])]


@pytest.mark.parametrize("iv", ALL, ids=lambda iv: type(iv).__name__)
def test_gradients_flow_through(iv):
    model = tiny("gpt2", act_fn="relu")
    model.zero_grad()
    with intervene(model, iv):
        loss = model(TOKENS).logsumexp(-1).mean()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is None or torch.isfinite(g).all() for g in grads.values())
    embedding = next(g for n, g in grads.items() if "embed" in n.lower() and "pos" not in n.lower())
    assert embedding is not None and embedding.abs().sum() > 0  # the very first weights still learn
    nonzero = [n for n, g in grads.items() if g is not None and g.abs().sum() > 0]
    assert len(nonzero) >= len(grads) // 2, sorted(set(grads) - set(nonzero))


def test_hooks_removed_on_exit_and_on_error():
    model = tiny("gpt2")
    before_hooks, before_state = warmed_snapshot(model), state_copy(model)
    with intervene(model, OddActivation() + SelfOnlyAttention()):
        assert hook_snapshot(model) != before_hooks
        model(TOKENS)
    assert hook_snapshot(model) == before_hooks
    with pytest.raises(RuntimeError, match="inside"):
        with intervene(model, [UniformAttention(), ZeroSublayer("mlp")]):
            model(TOKENS)
            raise RuntimeError("inside")
    with pytest.raises(KeyboardInterrupt):
        with intervene(model, MeanCenterMLP()):
            raise KeyboardInterrupt
    assert hook_snapshot(model) == before_hooks
    assert_same_state(model, before_state)


def test_run_with_hooks_and_analyze_inside_intervene():
    model = tiny("gpt2", act_fn="relu", positional_embedding="none")
    iv = OddActivation()
    with torch.no_grad():
        a = model.run_with_hooks(TOKENS, fwd_hooks=iv.fwd_hooks(model))
        with intervene(model, iv):
            b = model(TOKENS)
            edited = lens_bias.analyze(model, inputs=TOKENS, progress=False)
    assert torch.allclose(a, b)
    plain = lens_bias.analyze(model, inputs=TOKENS, progress=False)
    assert torch.allclose(edited.token_preference.p_bar, b[:, -1].double().softmax(-1).mean(0), atol=1e-6)
    assert not torch.allclose(edited.token_preference.p_bar, plain.token_preference.p_bar, atol=1e-6)


def test_compose_and_serialise():
    combo = OddActivation(layers=[0]) + SelfOnlyAttention() + ZeroSublayer("attn", layers=[1])
    assert isinstance(combo, Compose) and len(combo.parts) == 3
    assert Intervention.from_dict(combo.to_dict()) == combo
    for iv in ALL + [SubtractPositionEmbedding()]:
        assert Intervention.from_dict(iv.to_dict()) == iv
    with pytest.raises(TypeError, match="callable"):
        SwapActivation(torch.tanh).to_dict()
    assert len(combo.fwd_hooks(tiny("gpt2"))) == 2 + 2 + 1  # OddActivation reads hook_pre and edits hook_post


def test_bad_interventions():
    model = tiny("gpt2")
    with pytest.raises(LensBiasError, match="layers \\[5\\] do not exist"):
        OddActivation(layers=[5]).fwd_hooks(model)
    with pytest.raises(LensBiasError, match="attention-only"):
        OddActivation().fwd_hooks(tiny("gpt2", attn_only=True))
    with pytest.raises(LensBiasError, match="unknown activation"):
        SwapActivation("sigmoidish")
    with pytest.raises(LensBiasError, match="sublayer"):
        ZeroSublayer("ffn")
    with pytest.raises(LensBiasError, match="non-negative"):
        SelfOnlyAttention(layers=[-1])


def test_an_edit_that_never_fires_is_reported():
    """The HF llama bridge lists hook_pos_embed but has no position table; TL 3 llama has no such hook."""
    model = tiny("llama")
    if BACKEND == "bridge":
        with pytest.warns(UserWarning, match="hook_pos_embed"):
            with intervene(model, SubtractPositionEmbedding()):
                model(TOKENS)
        with pytest.raises(LensBiasError, match="never fired"):
            lens_bias.ablate(model, conditions={"no_pos": [SubtractPositionEmbedding()]}, n_sequences=4, seq_len=8, progress=False)
    else:
        with pytest.raises(LensBiasError, match="hook_pos_embed"):
            SubtractPositionEmbedding().fwd_hooks(model)
