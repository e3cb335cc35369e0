"""The paper's claims, measured on small random-init models (d 256, 4 layers, N 256, T 64, fixed seeds).

Tolerances: Kendall τ between two independent length-V vectors has sd √(2(2V+5)/(9V(V−1))) under the null;
cosine orderings are asserted with margins of about half the measured gaps.
"""

import math

import pytest
import torch
from scipy.stats import kendalltau

import lens_bias

N, T = 256, 64
WIDE = dict(d_model=256, n_layers=4, n_heads=8, d_vocab=8000, n_ctx=128)
SECTIONS = ["contraction", "token_preference"]  # the claims below read these two


def tau_null_sd(n: int) -> float:
    return math.sqrt(2 * (2 * n + 5) / (9 * n * (n - 1)))


@pytest.fixture(scope="module")
def reports():
    """relu / gelu gpt2 and gated-silu llama (all rotary), plus relu with another init seed."""
    builds = {
        "relu": dict(arch="gpt2", act_fn="relu", positional_embedding="rotary"),
        "gelu": dict(arch="gpt2", act_fn="gelu", positional_embedding="rotary"),
        "llama": dict(arch="llama"),
        "relu_seed1": dict(arch="gpt2", act_fn="relu", positional_embedding="rotary", seed=1),
    }
    return {
        name: lens_bias.analyze(lens_bias.random_init(**kw, **WIDE), n_sequences=N, seq_len=T, sections=SECTIONS, progress=False)
        for name, kw in builds.items()
    }


@pytest.mark.wide  # four analyses at WIDE width: the README's command, not the inner loop
def test_inter_sequence_cosine_ordering(reports):
    inter = {k: r.contraction.inter[-1].item() for k, r in reports.items()}
    # measured: relu 0.51, gelu 0.11, gated silu 0.012
    assert inter["relu"] > 0.4 and inter["relu"] - inter["gelu"] > 0.2
    assert inter["gelu"] - inter["llama"] > 0.05
    assert 0 <= inter["llama"] < 0.05


@pytest.mark.wide
def test_inter_sequence_cosine_rises_with_depth_for_relu(reports):
    inter = reports["relu"].contraction.inter
    assert abs(inter[0]) < 0.01  # token embeddings of random inputs share nothing
    assert torch.all(inter[1:-1].diff() > 0)


@pytest.mark.wide
def test_preference_is_fixed_by_the_seed(reports):
    sd = tau_null_sd(WIDE["d_vocab"])
    for name in ("relu", "gelu"):  # measured 0.93 / 0.81
        assert reports[name].token_preference.tau_halves > 0.5
    assert reports["llama"].token_preference.tau_halves > 10 * sd  # gated: weaker, but far from chance (0.40)
    a, b = reports["relu"].token_preference.mean_logits, reports["relu_seed1"].token_preference.mean_logits
    across_seeds = kendalltau(a.numpy(), b.numpy()).statistic
    assert abs(across_seeds) < 5 * sd  # 5 sd = 0.037


@pytest.mark.wide
def test_relu_prefers_some_tokens_more_than_gelu(reports):
    tp = {k: r.token_preference for k, r in reports.items()}
    assert tp["relu"].max_min_ratio > tp["gelu"].max_min_ratio > 1.5
    assert tp["relu"].entropy_ratio < tp["gelu"].entropy_ratio < 1


def test_attention_only_contracts_within_sequences_not_across():
    model = lens_bias.random_init("gpt2", attn_only=True, positional_embedding="rotary", **WIDE)
    c = lens_bias.analyze(model, n_sequences=N, seq_len=T, progress=False).contraction
    blocks = c.intra[1:-1]  # after each block; measured 0.07, 0.31, 0.56, 0.70
    assert c.intra[-1] > 0.5 and torch.all(blocks.diff() > 0)
    assert torch.all(c.inter.abs() < 0.05)
