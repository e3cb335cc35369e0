"""Trimmed vocabularies: trim_vocabulary keeps the base's rows (the trimmed model's logits are the base's on the kept
tokens), and compare's default reads a partial token map from the rows alone, in any basis, renamed or rounded too,
testing only the tokens both models hold; the same edits of a random init stay unrelated, and the part that reads
the map from the suspect's side is needed."""

from __future__ import annotations

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.core import tl
from lens_bias.models.parameters import parameters
from lens_bias.models.reparametrise import rename_vocabulary, rotate_residual
from lens_bias.models.transforms import quantize
from lens_bias.models.trim import trim_vocabulary
from lens_bias.seedprint import compare, correspondence

from ..architecture_matrix import build

SMALL = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=2000, n_ctx=16)  # 1100 tokens kept of 2000 still hold n 256 ≤ V/4
KW = dict(n=256, seq_len=8, progress=False)


@pytest.fixture(scope="module")
def base():
    return lens_bias.random_init("llama", seed=0, **SMALL)


def test_a_trimmed_vocabulary_is_the_base_on_the_tokens_it_kept_and_leaves_the_model(base):
    before = {n: p.detach().clone() for n, p in parameters(base).items()}
    trimmed = trim_vocabulary(base, 0.25, seed=1)
    kept = trimmed.lens_bias_kept
    assert len(kept) == 1500 and bool((kept[1:] > kept[:-1]).all()) and trimmed.tokenizer is None
    tokens = lens_bias.random_tokens(3, 8, 1500, seed=2)
    # the trimmed model on its own IDs is the base on the tokens they name, its logits over the kept tokens
    torch.testing.assert_close(trimmed(tokens), base(kept[tokens])[..., kept], rtol=1e-5, atol=1e-5)
    assert torch.equal(trim_vocabulary(base, kept=[5, 3, 9]).lens_bias_kept, torch.tensor([3, 5, 9]))
    assert all(torch.equal(p, before[n]) for n, p in parameters(base).items())
    for bad, match in ((dict(fraction=1.0), "0 < fraction < 1"), (dict(kept=[1, 1]), "distinct token IDs"), (dict(kept=[2000]), r"in \[0, 2000\)")):
        with pytest.raises(LensBiasError, match=match):
            trim_vocabulary(base, **bad)


SHAPES = {  # each shape, and the basis map compare's default reads through it
    "a fifth of the tokens removed": (lambda m: trim_vocabulary(m, 0.2, seed=1), "identity"),
    "nearly half removed": (lambda m: trim_vocabulary(m, 0.45, seed=1), "identity"),
    "trimmed, rotated": (lambda m: rotate_residual(trim_vocabulary(m, 0.2, seed=1), seed=2), "orthogonal"),
    "trimmed, rotated, renamed": (lambda m: rename_vocabulary(rotate_residual(trim_vocabulary(m, 0.3, seed=1), seed=2), seed=3), "orthogonal"),
    "trimmed, 4-bit": (lambda m: quantize(trim_vocabulary(m, 0.2, seed=1), 4), "identity"),
}


@pytest.mark.parametrize("shape", SHAPES)
def test_a_trimmed_descendant_is_found_on_the_tokens_both_hold_and_its_control_is_not(base, shape):
    edit, kind = SHAPES[shape]
    suspect = edit(base)
    result = compare(base, suspect, **KW)
    assert result.same_lineage and result.log10_p < -10 and result.basis_map == kind and result.token_source == "weights", str(result)
    tokens = correspondence.token_map(base, suspect)
    held = suspect.W_E.shape[0]
    assert len(tokens.shared) == held and result.tables.rows == held  # the test reads the tokens both hold, and only those
    if "renamed" not in shape:
        assert torch.equal(tokens.shared, suspect.lens_bias_kept) and torch.equal(tokens.ids[tokens.shared], torch.arange(held))
    control = compare(base, edit(lens_bias.random_init("llama", seed=7, **SMALL)), **KW)
    assert not control.same_lineage and control.token_source in ("none", "same"), str(control)


def test_reading_the_map_from_the_suspects_side_is_needed(base, monkeypatch):
    trimmed = rotate_residual(trim_vocabulary(base, 0.2, seed=1), seed=2)
    assert compare(base, trimmed, align=None, **KW).log10_p > -2  # the published test on shifted IDs: unrelated
    with monkeypatch.context() as patch:
        patch.setattr(correspondence, "_kept_rows", lambda a, b, seed: None)
        assert correspondence.token_map(base, trimmed).source == "none" and not compare(base, trimmed, **KW).same_lineage


def test_a_trimmed_vocabulary_of_trained_looking_weights_is_plain_transformers_on_the_kept_rows():
    model = build("hf:llama" if tl.tl_major() >= 4 else "tl3:gated RMS rotary (llama-like)")  # gains away from 1
    trimmed = trim_vocabulary(model, 0.3, seed=4)
    kept = trimmed.lens_bias_kept
    tokens = lens_bias.random_tokens(2, 8, len(kept), seed=5)
    torch.testing.assert_close(trimmed(tokens), model(kept[tokens])[..., kept], rtol=1e-5, atol=1e-5)
