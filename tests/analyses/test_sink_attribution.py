"""Sink attribution: every default condition against a direct computation on a tiny model (weights really zeroed
on a copy; hidden states really replaced), the verdicts against their definition, and SmolLM2's chain at small N."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.analyses.sink_attribution import VERDICTS, SinkAttributionResult, sink_attribution
from lens_bias.analyses.sink_conditions import Condition, anatomy_conditions
from lens_bias.hooks import Intervention, MaskToSelf, intervene

from ..conftest import assert_same_state, state_copy, tiny, warmed_snapshot

TOKENS = lens_bias.random_tokens(6, 12, 97, seed=5)
CALIBRATION = lens_bias.random_tokens(6, 12, 97, seed=6)


@pytest.fixture(scope="module")
def model():
    return tiny("llama")


@pytest.fixture(scope="module")
def result(model):
    return sink_attribution(model, TOKENS, calibration=CALIBRATION, eps=0.1, n_random=7, position=3, seed=2)


def _direct(model, tokens, eps):
    """Sink_0 per layer and perplexity of an (edited) copy, computed from run_with_cache."""
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    patterns = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(model.cfg.n_layers)], dim=1)  # [n, L, H, T, T]
    alpha0 = patterns.tril().sum(dim=-2)[..., 0] / tokens.shape[1]  # α_0: the column mean over all T queries
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    return (alpha0 > eps).float().mean(dim=(0, 2)) * 100, float(torch.exp(nll))


def _zeroed(model, weights):
    """A copy whose down_proj weights (layer, row, col) are really zero."""
    clone = copy.deepcopy(model)
    with torch.no_grad():
        for layer, row, col in weights:
            clone.blocks[layer].mlp.W_out[col, row] = 0.0
    return clone


def test_weight_conditions_equal_a_copy_with_the_weights_zeroed(model, result):
    before, hooks = state_copy(model), warmed_snapshot(model)
    assert result.conditions[0] == "unedited" and len(result.conditions) == 1 + 2 + 1 + 1 + 2 + 2
    for i, record in enumerate(result.interventions):
        edits = [Intervention.from_dict(d) for d in record]
        weights = []
        for iv in edits:
            if type(iv).__name__ == "RemoveWeight":
                weights.append((iv.layer, iv.row, iv.col))
            elif type(iv).__name__ == "RemoveWeights":
                weights += list(iv.weights)
            elif type(iv).__name__ == "ZeroOutputDims":  # a whole down_proj row: every column of it
                weights += [(iv.layer, d, c) for d in iv.dims for c in range(model.cfg.d_mlp)]
        if i and not weights:
            continue
        rate, ppl = _direct(_zeroed(model, weights), TOKENS, 0.1)
        torch.testing.assert_close(result.sink_rate[i], rate, atol=1e-4, rtol=0)
        assert result.perplexity[i] == pytest.approx(ppl, rel=1e-4), result.conditions[i]
    assert_same_state(model, before)
    assert warmed_snapshot(model) == hooks


def test_mean_conditions_set_position_0_to_the_calibration_means(model, result):
    with torch.no_grad():
        _, cache = model.run_with_cache(CALIBRATION)
    means = torch.stack([cache[f"blocks.{layer}.hook_resid_post"][:, 1:].mean(dim=(0, 1)) for layer in range(model.cfg.n_layers)])
    state = result.conditions.index("position 0 at the later positions' mean state")
    (compose,) = [Intervention.from_dict(d) for d in result.interventions[state]]
    assert [part.layer for part in compose.parts] == list(range(model.cfg.n_layers))
    torch.testing.assert_close(torch.tensor([part.values for part in compose.parts]), means, atol=1e-6, rtol=1e-5)
    with torch.no_grad(), intervene(model, compose):  # the hidden states are really replaced: position 0 is the mean after every block
        _, edited = model.run_with_cache(TOKENS)
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(edited[f"blocks.{layer}.hook_resid_post"][:, 0], means[layer].expand(TOKENS.shape[0], -1), atol=1e-5, rtol=1e-5)
    dims_condition = next(i for i, name in enumerate(result.conditions) if name.startswith("massive dims"))
    (dims_compose,) = [Intervention.from_dict(d) for d in result.interventions[dims_condition]]
    dims = list(dims_compose.parts[0].dims)
    assert dims == result.massive_dims and len(dims) < model.cfg.d_model
    torch.testing.assert_close(torch.tensor([part.values for part in dims_compose.parts]), means[:, dims], atol=1e-6, rtol=1e-5)
    # the massive-value column reads |h_0| in those dims after every block: with them set, it is the mean's
    assert result.massive_value[state].tolist() == pytest.approx(means[:, dims].abs().max(dim=1).values.tolist(), rel=1e-5)


def test_default_candidates_are_the_model_s_own(model):
    from lens_bias.analyses.super_weights import super_weights

    conditions = anatomy_conditions(model, CALIBRATION, n_candidates=2, n_random=5)
    found = super_weights(model, CALIBRATION, top=2)
    assert [c.interventions[0].to_dict() for c in conditions[1:3]] == [
        {"type": "RemoveWeight", "layers": None, "layer": l, "row": r, "col": c, "expert": None} for l, r, c in found.coordinates()]
    assert [c.link for c in conditions] == ["", "super weight → massive dim", "super weight → massive dim", "super neurons → massive dim", "control",
                                            "massive dim → sink", "first-token privilege → sink", "a later token made first-like", "a later token made first-like"]


def test_own_conditions_and_the_odd_even_split(model):
    result = sink_attribution(model, TOKENS, conditions={"self only at 2": [MaskToSelf(position=2)]}, eps=0.1, position=2)
    assert result.conditions == ["unedited", "self only at 2"] and result.n == 3  # odd rows calibrate, even rows are measured
    with intervene(model, MaskToSelf(position=2)):
        rate, ppl = _direct(model, TOKENS[0::2], 0.1)
    torch.testing.assert_close(result.sink_rate[1], rate, atol=1e-4, rtol=0)
    assert result.perplexity[1] == pytest.approx(ppl, rel=1e-4)
    with pytest.raises(LensBiasError, match="position must lie in"):
        sink_attribution(model, TOKENS, conditions=[Condition("x", "", "")], position=12)
    with pytest.raises(LensBiasError, match="token IDs"):
        sink_attribution(model, torch.zeros(4, 8, 64))


def _synthetic(per_sequence):
    per_sequence = torch.tensor(per_sequence, dtype=torch.float32)
    c, n = per_sequence.shape
    return SinkAttributionResult(
        conditions=[f"c{i}" for i in range(c)], descriptions=[""] * c, links=[""] + ["link"] * (c - 1), interventions=[[]] * c,
        sink_rate=torch.zeros(c, 2), sink_rate_head=torch.zeros(c, 2, 3), sink_per_sequence=per_sequence, later_per_sequence=torch.zeros(c, n),
        alpha0=torch.zeros(c, 2), massive_value=torch.zeros(c, 2), disparity=torch.zeros(c, 2), perplexity=[10.0] * c, massive_dims=[0],
        position=3, eps=0.3, n=n, seq_len=8)


def test_verdicts_follow_their_definition():
    base = [60.0, 70.0, 80.0, 70.0]
    result = _synthetic([base, [5.0, 6.0, 7.0, 6.0], [50.0, 61.0, 69.0, 60.0], [61.0, 69.0, 81.0, 70.0], [70.0, 80.0, 90.0, 80.0],
                         [58.0, 68.0, 78.0, 68.0]])
    # removed: at most 10% of the unedited mean; weakened / strengthened: a paired change beyond 3 SE and of at least
    # 5 points (the last: −2 points on every sequence, infinitely many SE, is no effect)
    assert result.verdicts() == ["", VERDICTS[0], VERDICTS[1], VERDICTS[2], VERDICTS[3], VERDICTS[2]]
    table = result.to_pandas()
    diff = torch.tensor([-10.0, -9.0, -11.0, -10.0])  # c2 - c0, paired sequence by sequence
    assert table.diff_in_se[2] == pytest.approx((diff.mean() / (diff.std() / 2)).item(), rel=1e-5)
    assert result.headline()["removed_by"] == ["c1"] and result.chain().shape[0] == 5


@pytest.mark.real_model
def test_smollm2_chain_at_small_n(smollm2):
    from lens_bias.experiments.attribution import PRESETS, run_attribution

    result = run_attribution(smollm2, PRESETS["tiny"], progress=False)  # 8 measured + 8 calibration windows of 32 tokens
    table = result.to_pandas().set_index("condition")
    unedited = table.loc["unedited"]
    assert result.massive_dims[0] == 507 and unedited.massive > 1e4 and unedited.sink_0 > 50
    sw = table.loc["super weight L11[507, 1229] removed"]  # Yu et al.'s candidate, found on the calibration text
    # measured: the massive dim shrinks (2.3e4 -> 1.8e4), perplexity ×17, but the sink stays (75% -> 71%)
    assert sw.massive < 0.85 * unedited.massive and sw.ppl_ratio > 5 and sw.sink_0 > 50
    assert table.loc["10 random weights removed"].verdict == "no effect" and table.loc["10 random weights removed"].ppl_ratio == pytest.approx(1, abs=1e-3)
    parity = table.loc["position 0 at the later positions' mean state"]  # measured: 75% -> 0.5%, perplexity ×2.1
    assert parity.verdict == "removes the sink" and parity.ppl_ratio < 5
    assert table.loc["MaskToSelf(4)"].sink_4_diff_in_se > 3
    assert isinstance(result.chain(), pd.DataFrame) and set(result.chain().link) >= {"super weight → massive dim", "massive dim → sink"}
