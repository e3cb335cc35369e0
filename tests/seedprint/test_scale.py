"""A uniformly scaled residual: scale_residual is the same function (checked against the base's own logits and plain
transformers), and compare's default finds a scaled descendant alone or with the other edits (rotated, permuted,
renamed, 4-bit, pruned) while the same edits of a random init stay unrelated; each scale-aware part is needed."""

from __future__ import annotations

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.core import tl
from lens_bias.models.parameters import copy_model, parameters
from lens_bias.models.reparametrise import permute_residual, rename_vocabulary, rotate_residual, scale_residual
from lens_bias.models.transforms import quantize
from lens_bias.models.width import prune_residual
from lens_bias.seedprint import compare, correspondence

from ..architecture_matrix import tiny_hf, with_trained_norms

SMALL = dict(d_model=32, n_layers=2, n_heads=4, d_vocab=1200, n_ctx=16)  # as test_auto_align.py: n <= V/4
WIDE = dict(SMALL, d_model=64, d_vocab=2000)  # as test_widths.py: 48 channels kept still leave compare's m = 0.1·D a test
KW = dict(n=256, seq_len=8, progress=False)
requires_tl4 = pytest.mark.skipif(tl.hooked_transformer_classes() is not None, reason="needs TransformerLens 4.x (TransformerBridge)")


def _without_eps(model):
    """``model`` with every RMSNorm's epsilon 0 (Hugging Face's ``variance_epsilon``, TL 3's ``eps``)."""
    norms = [(module, name) for module in model.modules() for name in ("variance_epsilon", "eps") if isinstance(getattr(module, name, None), float)]
    assert norms
    for module, name in norms:
        setattr(module, name, 0.0)
    return model


@pytest.fixture(scope="module")
def base():
    return lens_bias.random_init("llama", seed=0, **SMALL)


@pytest.fixture(scope="module")
def wide():
    return lens_bias.random_init("llama", seed=0, **WIDE)


def test_a_scaled_residual_is_the_same_function_and_leaves_the_model(base):
    before = {n: p.detach().clone() for n, p in parameters(base).items()}
    tokens = lens_bias.random_tokens(3, 8, SMALL["d_vocab"], seed=1)
    for factor in (4.0, 0.25):
        scaled = scale_residual(base, factor)
        assert scaled.lens_bias_scale == factor
        # RMSNorm divides the factor out up to its epsilon, which is not scaled: without it, the logits are the base's
        torch.testing.assert_close(_without_eps(scaled)(tokens), _without_eps(copy_model(base))(tokens), rtol=0, atol=0)
        assert (scaled(tokens) - base(tokens)).abs().max() < 0.05 * base(tokens).abs().max()  # with it, near
        new = parameters(scaled)
        for name, p in before.items():
            role = "write" if name.endswith(("attn.o.weight", "mlp.out.weight", "attn.W_O", "mlp.W_out")) else name
            expected = p * factor if role in ("write", "embed.weight", "embed.W_E") else p
            torch.testing.assert_close(new[name].detach(), expected, rtol=1e-6, atol=0, msg=name)
    assert all(torch.equal(p, before[n]) for n, p in parameters(base).items())
    with pytest.raises(LensBiasError, match="positive factor"):
        scale_residual(base, -1.0)


@requires_tl4
def test_a_tied_model_gets_an_unscaled_unembedding_as_plain_transformers_computes_it():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-6)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = LlamaForCausalLM(config).eval()
    model = with_trained_norms(lens_bias.from_hf(hf))
    plain = model.original_model  # the trained-looking gains, in Hugging Face's own forward
    tokens = lens_bias.random_tokens(2, 8, 300, seed=2)
    _without_eps(plain)
    expected = plain(tokens).logits
    scaled = _without_eps(scale_residual(model, 8.0))
    torch.testing.assert_close(scaled(tokens), expected, rtol=1e-5, atol=1e-5)
    assert not scaled.original_model.config.tie_word_embeddings
    torch.testing.assert_close(scaled.original_model.get_output_embeddings().weight, plain.get_output_embeddings().weight, rtol=0, atol=0)


@requires_tl4
def test_models_the_scale_cannot_pass_through_are_refused():
    with pytest.raises(LensBiasError, match="post-sub-layer norms"):
        scale_residual(lens_bias.from_hf(tiny_hf("gemma3_text")))
    with pytest.raises(LensBiasError, match="RMSNorms"):
        scale_residual(lens_bias.from_hf(tiny_hf("gpt2")))


# each shape: the edit, and the basis map compare's default reads through it (a uniform scale is a linear map; between
# two widths the partial map absorbs the scale in its fit)
SHAPES = {
    "scaled": (lambda m: scale_residual(m, 4.0), "linear"),
    "scaled down, rotated, renamed": (lambda m: rename_vocabulary(rotate_residual(scale_residual(m, 0.25), seed=1), seed=2), "linear"),
    "scaled, permuted, renamed, 4-bit": (lambda m: quantize(rename_vocabulary(permute_residual(scale_residual(m, 4.0), seed=1), seed=2), 4),
                                         "linear"),
    "scaled, pruned": (lambda m: prune_residual(scale_residual(m, 4.0), 48), "partial-permutation"),
    "scaled, rotated, pruned": (lambda m: prune_residual(rotate_residual(scale_residual(m, 4.0), seed=1), 48), "partial-orthogonal"),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_scaled_descendant_is_found_and_its_control_is_not(base, wide, shape):
    edit, kind = SHAPES[shape]
    spec, base = (WIDE, wide) if "pruned" in shape else (SMALL, base)
    result = compare(base, edit(base), **KW)
    assert result.same_lineage and result.log10_p < -10 and result.basis_map == kind, str(result)
    assert result.renamed_vocabulary == ("renamed" in shape), str(result)
    control = compare(base, edit(lens_bias.random_init("llama", seed=7, **spec)), **KW)
    assert not control.same_lineage and control.basis_map == "none", str(control)


def test_the_scale_aware_parts_are_needed(base, wide, monkeypatch):
    # the published test reads normalised features, which a scale alone leaves as they are; the disguise hides it
    assert compare(base, scale_residual(base, 4.0), align=None, **KW).log10_p < -10
    disguised = rename_vocabulary(rotate_residual(scale_residual(base, 4.0), seed=1), seed=2)
    assert compare(base, disguised, align=None, **KW).log10_p > -2
    with monkeypatch.context() as patch:  # the descriptions read at the suspect's own scale: no row is matched
        patch.setattr(correspondence, "SCALE_TOLERANCE", float("inf"))
        tokens = correspondence.token_map(base, disguised)
        assert tokens.source == "none" and not compare(base, disguised, **KW).same_lineage
    tokens = correspondence.token_map(base, disguised)
    assert tokens.source == "weights" and torch.equal(tokens.ids, disguised.lens_bias_vocabulary)
    # between two widths: the partial map's own matrix, judged without the fitted factor, leaves the residual of the scale
    pruned = prune_residual(scale_residual(wide, 4.0), 48)
    same = correspondence.TokenMap(torch.arange(WIDE["d_vocab"]), "same")
    basis = correspondence.basis_map(wide, pruned, same)
    assert basis.kind == "partial-permutation" and basis.residual < 1e-6
    a, b = basis.compared(wide.W_E.detach().double(), pruned.W_E.detach().double())
    a, b = a - a.mean(0), b - b.mean(0)
    unscaled = ((b - a).norm() / a.norm()).item()
    assert unscaled == pytest.approx(3.0, rel=1e-4) and unscaled > correspondence.FIT  # |4 - 1|: without the factor, no map
