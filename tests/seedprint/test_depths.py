"""Depths and experts: removed and repeated blocks (stack_layers, checked against plain transformers and against the
base's own blocks run by hand) and MLPs upcycled into experts (the dense model's logits), each found by compare's
default, with the other edits too, while the same edits of a random init stay unrelated."""

from __future__ import annotations

import copy

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.core import tl
from lens_bias.models.depth import duplicate_layers, remove_layers, stack_layers
from lens_bias.models.parameters import parameters
from lens_bias.models.reparametrise import rename_vocabulary, rotate_residual
from lens_bias.models.transforms import quantize
from lens_bias.models.upcycle import upcycle_experts
from lens_bias.seedprint import compare

from ..architecture_matrix import tiny_hf, with_trained_norms

# d 64: compare's m = 0.1·D leaves a test after a depth edit (at d 32 a repeated pair of blocks leaves one identity dim)
SMALL = dict(d_model=64, n_layers=4, n_heads=4, d_vocab=2000, n_ctx=16)
KW = dict(n=256, seq_len=8, progress=False)
requires_tl4 = pytest.mark.skipif(tl.hooked_transformer_classes() is not None, reason="needs TransformerLens 4.x (TransformerBridge)")
requires_tl3 = pytest.mark.skipif(tl.hooked_transformer_classes() is None, reason="needs TransformerLens 3.x (HookedTransformer)")


@pytest.fixture(scope="module")
def base():
    return lens_bias.random_init("llama", seed=0, **SMALL)


def _unchanged(model, before):
    return all(torch.equal(p, before[n]) for n, p in parameters(model).items())


@requires_tl4
def test_stacked_layers_are_the_base_blocks_as_plain_transformers_stacks_them():
    dense = with_trained_norms(tiny_hf("llama"))  # its norms' names hold "norm": trained-looking gains in Hugging Face's names
    model = lens_bias.from_hf(copy.deepcopy(dense))  # a bridge takes its module over
    tokens = lens_bias.random_tokens(2, 8, 256, seed=1)
    for order in ([0], [1, 0], [0, 1, 1], [1, 1, 0, 0]):
        plain = copy.deepcopy(dense)
        plain.model.layers = torch.nn.ModuleList(copy.deepcopy(dense.model.layers[i]) for i in order)
        for j, layer in enumerate(plain.model.layers):
            layer.self_attn.layer_idx = j
        plain.config.num_hidden_layers = len(order)
        stacked = stack_layers(model, order)
        assert stacked.cfg.n_layers == len(order) and stacked.lens_bias_layers.tolist() == order
        torch.testing.assert_close(stacked(tokens), plain(tokens, use_cache=False).logits, rtol=1e-5, atol=1e-5)


@requires_tl3
def test_stacked_layers_are_the_base_blocks_run_by_hand(base):
    tokens = lens_bias.random_tokens(2, 8, SMALL["d_vocab"], seed=1)
    for order in ([0, 3], [0, 1, 2, 1, 2, 3]):
        x = base.embed(tokens)
        for i in order:
            x = base.blocks[i](x)
        torch.testing.assert_close(stack_layers(base, order)(tokens), base.unembed(base.ln_final(x)), rtol=1e-5, atol=1e-5)


def test_remove_and_duplicate_name_their_orders_and_leave_the_model(base):
    before = {n: p.detach().clone() for n, p in parameters(base).items()}
    assert remove_layers(base, [1, 2]).lens_bias_layers.tolist() == [0, 3]
    assert duplicate_layers(base, [1, 2]).lens_bias_layers.tolist() == [0, 1, 2, 1, 2, 3]
    removed = remove_layers(base, [0])
    torch.testing.assert_close(parameters(removed)["blocks.0.attn.W_O" if "blocks.0.attn.W_O" in before else "blocks.0.attn.o.weight"],
                               before["blocks.1.attn.W_O" if "blocks.1.attn.W_O" in before else "blocks.1.attn.o.weight"], rtol=0, atol=0)
    assert _unchanged(base, before)
    for bad, match in ((lambda: stack_layers(base, []), "at least one"), (lambda: stack_layers(base, [0, 4]), "blocks 0 to 3"),
                       (lambda: remove_layers(base, [0, 1, 2, 3]), "keeps one at least"), (lambda: duplicate_layers(base, []), "repeats some")):
        with pytest.raises(LensBiasError, match=match):
            bad()


def test_upcycled_experts_compute_the_dense_model_and_leave_it(base):
    before = {n: p.detach().clone() for n, p in parameters(base).items()}
    tokens = lens_bias.random_tokens(2, 8, SMALL["d_vocab"], seed=2)
    for n_experts, top_k in ((4, 2), (2, 1), (3, 3)):
        moe = upcycle_experts(base, n_experts, top_k, seed=n_experts)
        assert moe.lens_bias_experts == (n_experts, top_k) and getattr(moe.cfg, "num_experts", None) == n_experts
        torch.testing.assert_close(moe(tokens), base(tokens), rtol=1e-5, atol=1e-5)  # identical experts: the dense MLP
    assert _unchanged(base, before)
    with pytest.raises(LensBiasError, match="1 to n_experts"):
        upcycle_experts(base, 2, 3)


@requires_tl4
def test_upcycling_on_trained_looking_norms_gives_a_mixtral_and_refuses_other_families():
    model = with_trained_norms(lens_bias.from_hf(tiny_hf("llama")))
    tokens = lens_bias.random_tokens(2, 8, 256, seed=3)
    moe = upcycle_experts(model, 4, 2)
    assert type(moe.original_model).__name__ == "MixtralForCausalLM"
    torch.testing.assert_close(moe(tokens), model.original_model(tokens).logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(LensBiasError, match="LLaMA model into a Mixtral"):
        upcycle_experts(lens_bias.from_hf(tiny_hf("qwen2")))


# each shape, and the basis map compare's default reads through it
SHAPES = {
    # one of four blocks, as layer pruning removes a few (half of a 4-block init leaves no identity dims in common on TL 3)
    "1 of 4 blocks removed": (lambda m: remove_layers(m, [2]), "identity"),
    "2 blocks repeated (depth up-scaling)": (lambda m: duplicate_layers(m, [1, 2]), "identity"),
    "MLPs upcycled into 4 experts": (lambda m: upcycle_experts(m, 4, 2), "identity"),
    "blocks repeated, then upcycled": (lambda m: upcycle_experts(duplicate_layers(m, [1, 2]), 4, 2), "identity"),
    "a block removed, rotated, renamed": (lambda m: rename_vocabulary(rotate_residual(remove_layers(m, [2]), seed=1), seed=2), "orthogonal"),
    "upcycled, 4-bit": (lambda m: quantize(upcycle_experts(m, 4, 2), 4), "identity"),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_depth_or_expert_descendant_is_found_and_its_control_is_not(base, shape):
    edit, kind = SHAPES[shape]
    suspect = edit(base)
    result = compare(base, suspect, **KW)
    assert result.same_lineage and result.log10_p < -10 and result.basis_map == kind, str(result)
    published = compare(base, suspect, align=None, **KW)  # in the kept basis the default is the published test; a disguise hides it
    assert published.p == result.p if kind == "identity" else published.log10_p > -2, str(published)
    control = compare(base, edit(lens_bias.random_init("llama", seed=7, **SMALL)), **KW)
    assert not control.same_lineage, str(control)
