"""Pruned widths: prune_residual is the base's channels sliced (checked against plain transformers), and compare's
default finds a width-pruned descendant in any basis through a partial map, while models of two widths that share no
init are called unrelated with the fit that says so."""

from __future__ import annotations

import gc

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.core import tl
from lens_bias.models.parameters import copy_model, parameters
from lens_bias.models.reparametrise import permute_residual, rotate_residual
from lens_bias.models.transforms import quantize
from lens_bias.models.width import channel_importance, prune_residual
from lens_bias.seedprint import compare, correspondence

SMALL = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=2000, n_ctx=16)
KW = dict(n=256, seq_len=8, progress=False)  # compare's default test otherwise (m = 0.1·D)
requires_tl4 = pytest.mark.skipif(tl.hooked_transformer_classes() is not None, reason="needs TransformerLens 4.x (TransformerBridge)")


@pytest.fixture(scope="module")
def base():
    return lens_bias.random_init("llama", seed=0, **SMALL)


@pytest.fixture(scope="module")
def unrelated():
    return lens_bias.random_init("llama", seed=7, **SMALL)


@requires_tl4
def test_pruned_width_is_the_base_sliced_as_plain_transformers_computes_it(base):
    from transformers import LlamaForCausalLM

    pruned = prune_residual(base, 48)
    kept = pruned.lens_bias_channels
    assert torch.equal(kept, channel_importance(base).topk(48).indices.sort().values)
    hf = base.original_model
    config = hf.config.to_dict() | {"hidden_size": 48, "head_dim": 16}
    plain = LlamaForCausalLM(type(hf.config).from_dict(config)).eval()
    sliced, wanted = {}, set(plain.state_dict())
    for wrapped, w in hf.state_dict().items():  # by hand, in Hugging Face's names: which axis holds the residual
        name = wrapped.replace("._original_component", "")  # the bridge wraps the modules it reads
        if name not in wanted:
            continue
        if name.endswith(("embed_tokens.weight", "lm_head.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "gate_proj.weight", "up_proj.weight")):
            w = w[:, kept]
        elif name.endswith(("o_proj.weight", "down_proj.weight", "layernorm.weight", "norm.weight")):
            w = w[kept]
        sliced[name] = w
    plain.load_state_dict(sliced)
    tokens = lens_bias.random_tokens(3, 8, SMALL["d_vocab"], seed=1)
    torch.testing.assert_close(pruned(tokens), plain(tokens).logits, rtol=1e-5, atol=1e-5)


def test_prune_residual_keeps_the_named_channels_and_leaves_the_model(base):
    before = {n: p.detach().clone() for n, p in parameters(base).items()}
    channels = list(range(0, 64, 2))
    pruned = prune_residual(base, 32, channels)
    assert pruned.cfg.d_model == 32 and pruned.cfg.d_head == base.cfg.d_head
    torch.testing.assert_close(pruned.W_E, base.W_E[:, channels], rtol=0, atol=0)
    assert all(torch.equal(p, before[n]) for n, p in parameters(base).items())
    with pytest.raises(LensBiasError, match="keeps 1 to 63"):
        prune_residual(base, 64)
    with pytest.raises(LensBiasError, match="distinct residual channels"):
        prune_residual(base, 2, [3, 3])


def test_a_copy_of_a_bridge_that_has_run_wires_its_own_hooks():
    model = lens_bias.random_init("llama", seed=2, **SMALL)
    tokens = lens_bias.random_tokens(2, 8, SMALL["d_vocab"], seed=3)
    expected = model(tokens)
    hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
    copy = copy_model(model)
    del model
    gc.collect()  # the copy must not reach the original's modules
    torch.testing.assert_close(copy(tokens), expected, rtol=0, atol=0)
    assert sum(len(m._forward_pre_hooks) for m in copy.modules()) == hooks


# edit, the map it needs, the channels the test compares: those kept where pruned in the base's basis, all 64 where
# pruned after a rotation (the kept span then holds a share of every base channel)
SHAPES = {
    "pruned": (lambda m: prune_residual(m, 48), "partial-permutation", 48),
    "pruned, then permuted": (lambda m: permute_residual(prune_residual(m, 48), seed=2), "partial-permutation", 48),
    "rotated, then pruned": (lambda m: prune_residual(rotate_residual(m, seed=1), 48), "partial-orthogonal", 64),
    "pruned, then rotated": (lambda m: rotate_residual(prune_residual(m, 40), seed=3), "partial-orthogonal", 40),
    "pruned, then 4-bit": (lambda m: quantize(prune_residual(m, 48), 4), "partial-permutation", 48),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_default_finds_a_pruned_width_and_not_an_unrelated_one(base, unrelated, shape):
    edit, kind, compared = SHAPES[shape]
    found = compare(base, edit(base), **KW)
    assert found.same_lineage and found.log10_p < -10 and found.basis_map == kind and found.basis_fit < 0.1
    assert found.m == int(0.1 * compared)
    control = compare(base, edit(unrelated), **KW)  # the same shape, of another init
    assert not control.same_lineage and control.basis_map == "none" and control.p == 1.0
    assert "not a pruning" in control.reason and control.basis_fit > correspondence.FIT


def test_either_order_and_a_wider_unrelated_model(base, unrelated):
    pruned = prune_residual(base, 48)
    assert compare(pruned, base, **KW).same_lineage  # the pruned model as the base: the wider suspect's map has orthonormal columns
    narrow = lens_bias.random_init("llama", seed=3, **{**SMALL, "d_model": 32})
    assert not compare(base, narrow, **KW).same_lineage and not compare(narrow, base, **KW).same_lineage


def test_a_rotated_width_needs_the_partial_orthogonal_map(base, monkeypatch):
    rotated = prune_residual(rotate_residual(base, seed=1), 48)
    monkeypatch.setattr(correspondence, "PARTIAL_KINDS", ("partial-permutation",))
    assert not compare(base, rotated, **KW).same_lineage


def test_the_published_test_refuses_two_widths_in_one_line(base):
    with pytest.raises(LensBiasError, match="align=None compares models of one width") as error:
        compare(base, prune_residual(base, 48), align=None, **KW)
    assert "\n" not in str(error.value)
