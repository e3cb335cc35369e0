"""Super experts on mixture-of-experts models: each expert read through the model's own expert code, checked against
the block's output and a direct computation; RemoveWeight(expert=) against the model with that weight really zeroed."""

from __future__ import annotations

import copy

import pytest
import torch

import lens_bias
from lens_bias.core import tl
from lens_bias.core.errors import LensBiasError
from lens_bias.core.experts import expert_activations, moe_layer, route
from lens_bias.hooks import Intervention, RemoveWeight

from ..architecture_matrix import tiny_hf

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.skipif(tl.tl_major() < 4, reason="Hugging Face mixtures of experts are bridged on TransformerLens 4")]
# The layouts of Hugging Face's fused experts: [gate; up] concatenated (Mixtral), a bridge-wrapped experts module
# beside a shared expert (Qwen2-MoE), transposed, interleaved, biased weights with a clamped gate (GPT-OSS), and
# group-limited sigmoid routing after a dense first block, under multi-head latent attention (DeepSeek-V3).
LAYOUTS = ("mixtral", "qwen2_moe", "gpt_oss", "deepseek_v3")
TOKENS = lens_bias.random_tokens(16, 6, 512, seed=4)


@pytest.mark.parametrize("model_type", LAYOUTS)
def test_the_experts_read_one_at_a_time_add_up_to_the_blocks_own_output(model_type):
    model = lens_bias.from_hf(tiny_hf(model_type))
    moe = moe_layer(model, 1, "test")
    states = torch.randn(9, 64, generator=torch.Generator().manual_seed(0))
    weights, indices = route(moe, states)
    total = torch.zeros_like(states)
    for expert in range(moe.n_experts):
        units, out = expert_activations(moe, states, expert)
        bias = getattr(moe.experts, "down_proj_bias", None)
        # the captured units are what the down-projection multiplies: units @ down_proj[expert] (+ bias) is its output
        torch.testing.assert_close(units @ moe.down_weight(expert).T + (0 if bias is None else bias[expert]), out, rtol=1e-5, atol=1e-7)
        total += (weights * (indices == expert)).sum(-1, keepdim=True) * out
    torch.testing.assert_close(total, moe.experts(states, indices, weights), rtol=1e-5, atol=1e-8)


def _planted_mixtral():
    """A tiny Mixtral whose layer-1 expert (the one most first tokens go to) has unit 5 scaled up 100× on its gate and
    up rows, and down_proj[11, 5] set to 5: a planted super weight."""
    hf = tiny_hf("mixtral")
    probe = lens_bias.super_experts(lens_bias.from_hf(hf), TOKENS)
    expert = int(probe.n_routed[1].argmax())
    experts = hf.model.layers[1].mlp.experts
    d_unit = experts.down_proj.shape[2]
    with torch.no_grad():
        experts.gate_up_proj[expert, 5] *= 100
        experts.gate_up_proj[expert, d_unit + 5] *= 100
        experts.down_proj[expert, 11, 5] = 5.0
    return hf, expert


def test_a_planted_super_weight_is_found_with_the_models_own_numbers():
    hf, expert = _planted_mixtral()
    result = lens_bias.super_experts(lens_bias.from_hf(hf), TOKENS)
    assert result.found() == [(1, expert, 11, 5)], result.to_pandas().head()
    assert result.best() == RemoveWeight(layer=1, expert=expert, row=11, col=5)
    # a direct computation: the block's input at the first token from a plain Hugging Face pass, routed and run
    # through the expert by hand ([gate; up] = x W^T, silu(gate) · up, then down_proj)
    seen = {}
    block = hf.model.layers[1].mlp
    handle = block.register_forward_pre_hook(lambda module, args: seen.update(x=args[0][:, 0]))
    try:
        with torch.no_grad():
            hf(TOKENS)
            x = seen["x"]
            top = torch.topk(x @ block.gate.weight.T, 2, dim=-1).indices
            routed = x[(top == expert).any(-1)]
            gate, up = (routed @ block.experts.gate_up_proj[expert].T).chunk(2, dim=-1)
            units = torch.nn.functional.silu(gate) * up
            out = units @ block.experts.down_proj[expert].T
    finally:
        handle.remove()
    assert int(result.n_routed[1, expert]) == len(routed)
    torch.testing.assert_close(result.input_max[1, expert], units.abs().max(), rtol=1e-5, atol=0)
    torch.testing.assert_close(result.output_max[1, expert], out.abs().max(), rtol=1e-5, atol=0)
    assert result.input_max[1, expert] > 50 and result.output_max[1, expert] > 50  # the planted spike passes Yu et al.'s rule
    assert "1 found" in result.summary()


def test_an_unplanted_model_has_no_super_expert_and_says_so():
    result = lens_bias.super_experts(lens_bias.from_hf(tiny_hf("mixtral")), TOKENS)
    assert result.found() == [] and "none found" in result.summary()
    assert not result.to_pandas().isna().to_numpy().any()


def test_the_section_of_a_report_round_trips_through_json():
    import json

    from lens_bias.report.bias_report import BiasReport

    report = lens_bias.analyze(lens_bias.from_hf(tiny_hf("deepseek_v3")), inputs=TOKENS, progress=False)
    assert {"super_weights", "super_neurons"} <= report.skipped.keys() and "super_experts" in report.sections
    result = report.super_experts
    back = BiasReport.from_dict(json.loads(json.dumps(report.to_dict()))).super_experts
    assert back.layers == result.layers == [1]  # DeepSeek-V3's first block is dense
    for name in ("n_routed", "input_max", "input_unit", "output_max", "output_dim", "weight"):
        assert torch.equal(getattr(back, name), getattr(result, name)), name
    assert back.summary() == result.summary() and back.to_pandas().equals(result.to_pandas())


def _zeroed(hf, layer, expert, row, col):
    copy_ = copy.deepcopy(hf)
    experts = copy_.model.layers[layer].mlp.experts
    with torch.no_grad():
        if experts.is_transposed:
            experts.down_proj[expert, col, row] = 0
        else:
            experts.down_proj[expert, row, col] = 0
    return copy_


@pytest.mark.parametrize("model_type", LAYOUTS)
def test_removing_an_experts_weight_equals_zeroing_it(model_type):
    hf = tiny_hf(model_type)
    model = lens_bias.from_hf(hf)
    edit = lens_bias.super_experts(model, TOKENS).best()
    with torch.no_grad():
        plain = hf(TOKENS).logits
        zeroed = _zeroed(hf, edit.layer, edit.expert, edit.row, edit.col)(TOKENS).logits
        with lens_bias.intervene(model, edit):
            edited = model(TOKENS)
    effect = (zeroed - plain).abs().max()
    assert effect > 1e-4
    assert (edited - zeroed).abs().max() < 1e-3 * effect


def test_the_planted_weight_removed_is_the_model_without_it():
    hf, expert = _planted_mixtral()
    model = lens_bias.from_hf(hf)
    with torch.no_grad():
        plain, zeroed = hf(TOKENS).logits, _zeroed(hf, 1, expert, 11, 5)(TOKENS).logits
        with lens_bias.intervene(model, RemoveWeight(layer=1, expert=expert, row=11, col=5)):
            edited = model(TOKENS)
    assert (zeroed - plain).abs().max() > 0.5  # the planted weight matters (random logits move by ~1e-3)
    torch.testing.assert_close(edited, zeroed, rtol=1e-4, atol=1e-4)


def test_remove_weight_names_an_expert_exactly_where_there_are_experts():
    moe, dense = lens_bias.from_hf(tiny_hf("mixtral")), lens_bias.from_hf(tiny_hf("llama"))
    with pytest.raises(LensBiasError, match="block 0 routes tokens to 4 experts; name one with expert="):
        RemoveWeight(layer=0, row=1, col=2).fwd_hooks(moe)
    with pytest.raises(LensBiasError, match=r"blocks\[0\]\.mlp of this TransformerBridge is not one"):
        RemoveWeight(layer=0, row=1, col=2, expert=0).fwd_hooks(dense)
    with pytest.raises(LensBiasError, match="outside the model .4 experts"):
        RemoveWeight(layer=0, row=1, col=2, expert=4).fwd_hooks(moe)
    with pytest.raises(LensBiasError, match="expert is a non-negative int"):
        RemoveWeight(expert=-1)
    with pytest.raises(LensBiasError, match="this model has one MLP per layer"):
        lens_bias.super_experts(dense, TOKENS)
    edit = RemoveWeight(layer=1, row=2, col=3, expert=1)
    assert Intervention.from_dict(edit.to_dict()) == edit
