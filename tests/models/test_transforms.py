"""The descendants' weight transforms (lens_bias.models.transforms), each checked exactly on tiny models: quantisation
within half a step of its group, pruning of exactly the smallest weights, merges as averages, low-rank deltas of
the asked rank and norm, random inits redrawn like Hugging Face's, tied embeddings kept tied."""

from __future__ import annotations

import math

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.models import transforms as T
from lens_bias.models.architectures.base import is_bias
from lens_bias.models.parameters import parameters

from ..conftest import assert_same_state, state_copy, tiny

ARCHS = ("llama", "gpt2")


def _weights(model):
    """Weight matrices by state_dict name, as the transforms see them."""
    return T._weight_matrices(parameters(model), blocks_only=False)


def _others(model):
    """Every parameter that is not a weight matrix (norm gains, biases)."""
    weights = _weights(model)
    return {n: p for n, p in parameters(model).items() if n not in weights}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("bits, group_size", [(8, 32), (4, 32), (4, 24), (4, 10**12)])  # a group longer than a row: the row
def test_quantize_moves_each_weight_by_at_most_half_its_groups_step(arch, bits, group_size):
    model = tiny(arch)
    before = state_copy(model)
    quantized = T.quantize(model, bits=bits, group_size=group_size)
    assert_same_state(model, before)
    levels = 2 ** (bits - 1) - 1
    new = _weights(quantized)
    for name, w in _weights(model).items():
        rows, out = w.detach().reshape(-1, w.shape[-1]), new[name].detach().reshape(-1, w.shape[-1])
        for start in range(0, rows.shape[1], group_size):  # the closed form, group by group (a short last one)
            group, got = rows[:, start : start + group_size], out[:, start : start + group_size]
            step = group.abs().amax(1, keepdim=True) / levels
            assert ((got - group).abs() <= step / 2 * (1 + 1e-6)).all(), name
            q = got / step
            assert (q - q.round()).abs().max() < 1e-4 and q.abs().max() <= levels + 1e-4, name  # on the grid
        assert not torch.equal(w, new[name]), f"{name} was not quantised"
    for name, p in _others(model).items():
        assert torch.equal(p, _others(quantized)[name]), f"{name} is not a weight matrix and must stay"


def test_quantize_rejects_bad_settings():
    model = tiny("llama")
    for kwargs in ({"bits": 1}, {"bits": 16}, {"bits": 4.0}, {"group_size": 0}):
        with pytest.raises(LensBiasError):
            T.quantize(model, **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
def test_prune_zeroes_exactly_the_smallest_fraction_of_each_block_matrix(arch):
    model = tiny(arch)
    before = state_copy(model)
    pruned = _weights(T.prune(model, 0.3))
    assert_same_state(model, before)
    for name, w in _weights(model).items():
        got = pruned[name]
        if not name.startswith("blocks."):
            assert torch.equal(got, w), f"{name}: embeddings are not pruned"
            continue
        zeroed = got == 0
        assert int(zeroed.sum()) == round(0.3 * w.numel()), name
        assert torch.equal(got[~zeroed], w[~zeroed]), name
        assert w[zeroed].abs().max() <= w[~zeroed].abs().min(), f"{name}: a larger weight was pruned before a smaller one"
    with pytest.raises(LensBiasError):
        T.prune(model, 1.0)


@pytest.mark.parametrize("arch", ARCHS)
def test_merge_is_the_weight_average(arch):
    a, b = tiny(arch, seed=0), tiny(arch, seed=1)
    before_a, before_b = state_copy(a), state_copy(b)
    pa, pb = parameters(a), parameters(b)
    half = parameters(T.merge(a, b))
    for name in pa:
        assert torch.equal(half[name], (pa[name] + pb[name]) / 2), name  # halving is exact in floating point
    assert all(torch.equal(p, pa[n]) for n, p in parameters(T.merge(a, b, weight=0.0)).items())
    assert all(torch.equal(p, pb[n]) for n, p in parameters(T.merge(a, b, weight=1.0)).items())
    assert_same_state(a, before_a)
    assert_same_state(b, before_b)
    with pytest.raises(LensBiasError, match="same parameter names and shapes"):
        T.merge(a, tiny(arch, d_model=32))
    with pytest.raises(LensBiasError):
        T.merge(a, b, weight=1.5)


@pytest.mark.parametrize("arch", ARCHS)
def test_low_rank_delta_has_rank_r_and_the_asked_relative_norm(arch):
    model = tiny(arch)
    before = state_copy(model)
    rank, scale = 3, 0.05
    adapted = _weights(T.low_rank_delta(model, rank=rank, scale=scale, seed=5))
    assert_same_state(model, before)
    for name, w in _weights(model).items():
        if not name.startswith("blocks."):
            assert torch.equal(adapted[name], w), f"{name}: only attention and MLP matrices are adapted"
            continue
        delta, _ = T._matrix(name, (adapted[name] - w).detach())
        matrix, _ = T._matrix(name, w.detach())
        s = torch.linalg.svdvals(delta.double())
        assert s[rank] / s[0] < 1e-4, f"{name}: the change has rank > {rank}"
        assert s[rank - 1] / s[0] > 1e-3, f"{name}: the change has rank < {rank}"
        assert math.isclose(float(delta.norm() / matrix.norm()), scale, rel_tol=1e-4), name
    again = _weights(T.low_rank_delta(model, rank=rank, scale=scale, seed=5))
    other = _weights(T.low_rank_delta(model, rank=rank, scale=scale, seed=6))
    assert all(torch.equal(p, adapted[n]) for n, p in again.items())
    assert not all(torch.equal(p, adapted[n]) for n, p in other.items())
    with pytest.raises(LensBiasError, match=r"rank 1000000000000 exceeds the .* matrix .*; pass rank <= "):  # before any allocation
        T.low_rank_delta(model, rank=10**12)


@pytest.mark.parametrize("arch", ARCHS)
def test_random_inits_redraw_one_copy_per_seed_like_hugging_face(arch):
    model = tiny(arch, d_model=128)
    before = state_copy(model)
    rng = torch.random.get_rng_state()
    drawn, objects = [], set()
    for fresh in T.random_inits(model, [3, 4, 3]):
        objects.add(id(fresh))
        drawn.append({n: p.detach().clone() for n, p in parameters(fresh).items()})
    assert len(objects) == 1 and id(model) not in objects
    assert torch.equal(torch.random.get_rng_state(), rng), "the global RNG was used"
    assert_same_state(model, before)
    first, second, third = drawn
    base = parameters(model)
    for name, p in first.items():
        assert torch.equal(p, third[name]), f"{name}: one seed, one init"
        if is_bias(name):
            assert not p.any(), name
        elif p.ndim == 1:
            assert (p == 1).all(), name
        else:
            assert not torch.equal(p, second[name]) and not torch.equal(p, base[name]), name
            if p.numel() >= 4096:
                assert abs(float(p.std()) - 0.02) < 0.002, name


def test_tied_embeddings_stay_tied():
    """Bridges share one parameter; a HookedTransformer holds W_U as a copy of W_Eᵀ, which must keep up."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=97, tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):
        model = lens_bias.models.from_hf(LlamaForCausalLM(config))

    def tied(m):
        params = parameters(m)
        if "unembed.W_U" in params:
            return torch.equal(params["unembed.W_U"], params["embed.W_E"].T)
        state = m.state_dict(keep_vars=True)
        return state["unembed.weight"] is state["embed.weight"] and "unembed.weight" not in params

    assert tied(model)
    for made in (T.quantize(model, bits=4), T.prune(model), T.low_rank_delta(model), T.merge(model, T.quantize(model)), next(T.random_inits(model, [1]))):
        assert tied(made)
