"""Token preference and contraction equal direct computations from run_with_cache / full logits."""

import itertools

import pytest
import torch
from scipy.stats import kendalltau

import lens_bias
from lens_bias import random_tokens

from ..conftest import final_state, shared_tiny, trained_tiny


def _pairwise_cos_loop(x):
    """Mean cosine over pairs i != j, by brute force."""
    u = torch.nn.functional.normalize(x.double(), dim=-1)
    pairs = [(u[i] @ u[j]).item() for i, j in itertools.permutations(range(len(u)), 2)]
    return sum(pairs) / len(pairs)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_contraction_equals_direct_computation(arch):
    model = trained_tiny(arch, act_fn="relu")  # a final gain and bias away from 1 and 0, as training leaves them
    tokens = random_tokens(9, 7, 97, seed=5)
    # batches of 4, 4 and 1: the sums over sequences taken in the pass add up across batches
    table = lens_bias.analyze(model, inputs=tokens, batch_size=4, progress=False).contraction.to_pandas()
    _, cache = model.run_with_cache(tokens)
    hooks = ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"]
    assert list(table.hook) == hooks + [lens_bias.extend.ModelAdapter(model).readout_hook] and list(table.layer) == ["embed", "0", "1", "final"]
    states = [cache[hook] for hook in hooks] + [final_state(model, cache[hooks[-1]])]  # the final row: what the model unembeds
    final_u = torch.nn.functional.normalize(states[-1][:, -1].double(), dim=-1)
    seed = torch.nn.functional.normalize(final_u.mean(0), dim=0)
    for row, acts in zip(table.itertuples(), states):
        acts = acts.double()
        assert row.inter == pytest.approx(_pairwise_cos_loop(acts[:, -1]), abs=1e-5)
        intra = sum(_pairwise_cos_loop(seq) for seq in acts) / len(acts)
        assert row.intra == pytest.approx(intra, abs=1e-5)
        last = acts[:, -1]
        assert row.energy_share == pytest.approx(((last @ seed) ** 2).mean().item() / (last**2).sum(-1).mean().item(), abs=1e-5)


@pytest.mark.parametrize("positions", ["last", "all"])
def test_decomposition_equals_direct_computation(positions):
    from lens_bias.analyses.decomposition import Decomposition, components

    model = trained_tiny("llama", act_fn="relu")
    tokens = random_tokens(9, 7, 97, seed=5)
    adapter = lens_bias.extend.ModelAdapter(model)
    spec = lens_bias.extend.InputSpec("tokens", 9, 7, 5, 97)
    result = lens_bias.extend.run_analyses(adapter, tokens, spec, [Decomposition(positions=positions)], batch_size=4, progress=False)["decomposition"]
    _, cache = model.run_with_cache(tokens)
    final_u = torch.nn.functional.normalize(final_state(model, cache["blocks.1.hook_resid_post"])[:, -1].double(), dim=-1)
    seed = torch.nn.functional.normalize(final_u.mean(0), dim=0)
    cumulative = 0
    for i, (name, hook) in enumerate(components(adapter)):
        x = cache[hook].double()
        x = x[:, -1] if positions == "last" else x.flatten(0, 1)  # every (sequence, position) is an input
        mean = x.mean(0)
        cumulative = cumulative + mean
        assert result.components[i] == name
        assert result.shared_energy[i].item() == pytest.approx(mean.pow(2).sum().item(), rel=1e-4)
        assert result.fluctuating_energy[i].item() == pytest.approx((x - mean).pow(2).sum(-1).mean().item(), rel=1e-4, abs=1e-6)
        assert result.seed_projection[i].item() == pytest.approx((mean @ seed).item(), rel=1e-4, abs=1e-6)
        assert result.cumulative_shared_norm[i].item() == pytest.approx(cumulative.norm().item(), rel=1e-4)
    assert result.reconstruction_error < 1e-5


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_token_preference_equals_full_logits(arch):
    model = trained_tiny(arch, act_fn="relu")  # the final gain and bias must reach the logits
    tokens = random_tokens(10, 6, 97, seed=3)
    result = lens_bias.analyze(model, inputs=tokens, progress=False).token_preference
    with torch.no_grad():
        last = model(tokens)[:, -1].double()
    p_bar = last.softmax(-1).mean(0)
    assert torch.allclose(result.p_bar, p_bar, atol=1e-6)
    assert torch.allclose(result.mean_logits, last.mean(0), atol=1e-5)
    assert not torch.allclose(shared_tiny(arch, act_fn="relu")(tokens)[:, -1].double().softmax(-1).mean(0), p_bar, atol=1e-3)  # the gain matters
    assert torch.equal(result.argmax_counts, torch.bincount(last.argmax(-1), minlength=97))
    tau = kendalltau(last[:5].mean(0).numpy(), last[5:].mean(0).numpy()).statistic
    assert result.tau_halves == pytest.approx(tau, abs=1e-6)
    assert result.max_min_ratio == pytest.approx((p_bar.max() / p_bar.min()).item())
    assert result.entropy_ratio == pytest.approx((-(p_bar * p_bar.log()).sum() / torch.log(torch.tensor(97.0))).item())
    top = result.to_pandas()
    assert list(top.token[:3]) == torch.argsort(p_bar, descending=True)[:3].tolist()
    assert top.ratio_to_uniform.iloc[0] == pytest.approx(result.uniform_ratio)
