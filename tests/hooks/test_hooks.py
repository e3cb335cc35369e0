"""Interventions: each edit equals a direct computation, composes, serialises, passes gradients, cleans up."""

import re

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
    RemoveWeight,
    SelfOnlyAttention,
    SubtractPositionEmbedding,
    SwapActivation,
    UniformAttention,
    ZeroSublayer,
)

from ..conftest import BACKEND, assert_same_state, hook_snapshot, state_copy, tiny, warmed_snapshot

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
# The parameters each edit cuts off from the loss, as (layer, part): a replaced pattern no longer depends on the
# queries and keys; a zeroed sublayer's own parameters (and its input norm) no longer reach the residual sum.
CUT = {
    "SelfOnlyAttention": {(layer, part) for layer in range(2) for part in "qk"},
    "UniformAttention": {(layer, part) for layer in range(2) for part in "qk"},
    "ZeroSublayer-attn": {(1, part) for part in ("ln1", "q", "k", "v", "o")},
    "ZeroSublayer-mlp": {(0, part) for part in ("ln2", "mlp_in", "mlp_out")},
}


def param_part(name):
    """(layer, part, is_bias) of a parameter of a TL 3 HookedTransformer or a TL 4 bridge; layer None outside blocks."""
    name = name.replace("._original_component", "")
    match = re.match(r"(?:blocks|layers)\.(\d+)\.(ln1|ln2|attn|mlp)\.(.+)", name)
    if match is None:
        return None, name, False
    layer, module, rest = int(match[1]), match[2], match[3]
    bias = rest in ("b", "bias") or rest.startswith("b_") or rest.endswith(".bias")
    if module == "attn":
        part = re.match(r"(?:[Wb]_)?([QKVOqkvo])(?:\.|$)", rest)[1].lower()
    elif module == "mlp":
        part = "mlp_in" if "in" in rest else "mlp_out"
    else:
        part = module
    return layer, part, bias


@pytest.mark.parametrize("iv", ALL, ids=lambda iv: type(iv).__name__ + (f"-{iv.sublayer}" if isinstance(iv, ZeroSublayer) else ""))
def test_gradients_flow_through(iv, request):
    model = tiny("gpt2", act_fn="relu")
    model.zero_grad()
    with intervene(model, iv):
        loss = model(TOKENS).logsumexp(-1).mean()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert all(g is None or torch.isfinite(g).all() for g in grads.values())
    cut = CUT.get(request.node.callspec.id, set())
    for name, g in grads.items():
        layer, part, bias = param_part(name)
        reaches = g is not None and g.abs().sum() > 0
        if (layer, part) in cut:
            assert not reaches, f"{name} is cut off by the edit but got a gradient"
        elif not (part == "k" and bias):  # b_K never has one: softmax ignores a shift shared by every key
            assert reaches, f"{name} still reaches the loss past the edit but got no gradient"
    assert sum(param_part(n)[1] == "mlp_in" for n in grads) == 4 and sum(param_part(n)[1] == "q" for n in grads) == 4  # the names were all read


def test_composition_runs_in_order_and_refuses_to_drop_an_edit():
    model = tiny("gpt2", act_fn="gelu")
    centred_odd = edited_cache(model, OddActivation(layers=[1]) + MeanCenterMLP(layers=[1]))
    pre = centred_odd["blocks.1.mlp.hook_pre"]
    odd = (F.gelu(pre) - F.gelu(-pre)) / 2
    assert torch.allclose(centred_odd["blocks.1.mlp.hook_post"], odd - odd.mean(dim=(0, 1)), atol=1e-6)
    # OddActivation recomputes hook_post from hook_pre: after MeanCenterMLP it would drop the centring
    for combo in (MeanCenterMLP() + OddActivation(), [MeanCenterMLP(), OddActivation()], [MeanCenterMLP(), [SwapActivation("tanh")]]):
        with pytest.raises(LensBiasError, match="would be lost: list (OddActivation|SwapActivation) first"):
            with intervene(model, *([combo] if isinstance(combo, Compose) else combo)):
                pass
    with pytest.raises(LensBiasError, match="would be lost"):
        (ZeroSublayer("attn") + SelfOnlyAttention() + UniformAttention()).fwd_hooks(model)
    # RemoveWeight reads mlp.hook_post to subtract one weight's share: an edit after it would make that stale
    with pytest.raises(LensBiasError, match="MeanCenterMLP edits blocks.0.mlp.hook_post after RemoveWeight read it"):
        (RemoveWeight(layer=0, row=1, col=2) + MeanCenterMLP()).fwd_hooks(model)
    assert len((MeanCenterMLP() + RemoveWeight(layer=0, row=1, col=2)).fwd_hooks(model)) == 2 + 2
    assert len((MeanCenterMLP(layers=[0]) + OddActivation(layers=[1])).fwd_hooks(model)) == 1 + 2  # other layers
    with pytest.raises(LensBiasError, match="would be lost"):
        lens_bias.ablate(model, conditions={"bad": [MeanCenterMLP(), OddActivation()]}, n_sequences=4, seq_len=8, progress=False)


def test_the_registry_refuses_a_second_class_of_the_same_name():
    from lens_bias.hooks import INTERVENTIONS

    assert "_EditAtPosition" not in INTERVENTIONS and "AmplifyVariance" in INTERVENTIONS
    with pytest.raises(LensBiasError, match="'OddActivation' is already registered \\(lens_bias.hooks.mlp.OddActivation\\)"):
        type("OddActivation", (Intervention,), {})
    assert INTERVENTIONS["OddActivation"] is OddActivation
    assert Intervention.from_dict({"type": "OddActivation", "layers": [1]}) == OddActivation(layers=[1])


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
        with pytest.raises(LensBiasError, match="hook_pos_embed never fired"):  # refused before any pass runs under it
            with intervene(model, SubtractPositionEmbedding()):
                model(TOKENS)
        with pytest.raises(LensBiasError, match="never fired"):
            lens_bias.ablate(model, conditions={"no_pos": [SubtractPositionEmbedding()]}, n_sequences=4, seq_len=8, progress=False)
    else:
        with pytest.raises(LensBiasError, match="hook_pos_embed"):
            SubtractPositionEmbedding().fwd_hooks(model)
