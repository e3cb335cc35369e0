"""Random inputs: reproducible, uniform, batch-invariant, and fed through a live hook."""

import math

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, RandomEmbeddings, random_embeddings, random_tokens

from ..conftest import shared_tiny


def test_random_tokens_reproducible_and_uniform():
    a, b = random_tokens(400, 50, vocab=10, seed=42), random_tokens(400, 50, vocab=10, seed=42)
    assert torch.equal(a, b) and a.dtype == torch.long and a.shape == (400, 50)
    assert not torch.equal(a, random_tokens(400, 50, vocab=10, seed=43))
    counts = torch.bincount(a.flatten(), minlength=10).double()
    # Uniform over 10 IDs: the chi-square statistic has 9 degrees of freedom (mean 9, sd √18); 9 + 6·√18 ≈ 34.
    expected = a.numel() / 10
    assert ((counts - expected) ** 2 / expected).sum() < 9 + 6 * math.sqrt(18)
    assert a.min() >= 0 and a.max() < 10


def test_random_embeddings_rows_do_not_depend_on_batching():
    emb = RandomEmbeddings(n=10, seq_len=6, d_model=32, mean=0.1, std=0.5, seed=42)
    whole = emb.tensor()
    assert torch.equal(torch.cat([emb[0:3], emb[3:7], emb[7:10]]), whole)
    assert whole.shape == (10, 6, 32)
    # 1920 Gaussian draws: the sample mean is within 5 standard errors of 0.1.
    assert abs(whole.mean().item() - 0.1) < 5 * 0.5 / math.sqrt(whole.numel())
    assert not torch.equal(RandomEmbeddings(10, 6, 32, 0.1, 0.5, seed=43).tensor(), whole)


def test_random_embeddings_match_the_model_embedding_statistics():
    model = shared_tiny("gpt2")
    emb = random_embeddings(model, n=4, seq_len=8)
    assert emb.mean == pytest.approx(model.W_E.mean().item()) and emb.std == pytest.approx(model.W_E.std().item())
    assert emb.d_model == 64


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_embedding_inputs_replace_the_token_embedding(arch):
    """analyze(inputs=embeddings) equals a forward pass where hook_embed returns those embeddings."""
    model = shared_tiny(arch, positional_embedding="learned" if arch == "gpt2" else None)
    emb = random_embeddings(model, n=6, seq_len=10, seed=7)
    report = lens_bias.analyze(model, inputs=emb, progress=False)
    x = emb.tensor()
    with torch.no_grad():
        logits = model.run_with_hooks(torch.zeros(6, 10, dtype=torch.long), fwd_hooks=[("hook_embed", lambda a, hook: x)])
        other = model(torch.zeros(6, 10, dtype=torch.long))
    p_bar = logits[:, -1].double().softmax(-1).mean(0)
    assert torch.allclose(report.token_preference.p_bar, p_bar, atol=1e-6)
    assert not torch.allclose(other[:, -1].double().softmax(-1).mean(0), p_bar, atol=1e-4)  # the hook is live


def test_bad_counts():
    with pytest.raises(LensBiasError, match="n must be >= 1"):
        random_tokens(0, 5, 10)
    with pytest.raises(TypeError, match="seq_len must be an int"):
        random_tokens(2, 5.0, 10)
    with pytest.raises(TypeError, match="slices"):
        RandomEmbeddings(2, 3, 4, 0.0, 1.0)[0]
