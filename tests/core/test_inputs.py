"""Random inputs: reproducible, uniform, batch-invariant, and fed through a live hook."""

import hashlib
import math
import re

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, RandomEmbeddings, RandomTokens, random_embeddings, random_tokens
from lens_bias.core import memory

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


def test_lazy_random_tokens_are_random_tokens_in_any_batching():
    whole = random_tokens(1000, 37, vocab=49152, seed=42)
    lazy = RandomTokens(1000, 37, 49152, seed=42)
    assert torch.equal(torch.cat([lazy[0:1], lazy[1:8], lazy[8:300], lazy[300:1000]]), whole)  # in order: one generator
    assert torch.equal(lazy[500:520], whole[500:520]) and torch.equal(lazy[3:9], whole[3:9])  # out of order: drawn again
    assert torch.equal(lazy.view(250, 600)[0:350], whole[250:600]) and lazy.shape == (1000, 37)
    # a fingerprint's digest of lazy tokens is the digest of the tensor they stand for (saved fingerprints stay valid)
    from lens_bias.seedprint.fingerprints import _digest

    assert _digest(lazy) == "sha256:" + hashlib.sha256(whole.numpy().tobytes()).hexdigest() == _digest(whole)
    with pytest.raises(TypeError, match="contiguous slices"):
        lazy[::2]


@pytest.mark.parametrize("count", [10**12, 10**9, pytest.param(10**7, marks=pytest.mark.slow)])  # 10**7 runs seconds of batches
def test_a_count_that_cannot_fit_is_refused_after_one_batch(count, monkeypatch):
    model = shared_tiny("gpt2", d_model=32, n_layers=1, n_heads=4, d_vocab=100, n_ctx=16)
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 16 * 2**20)  # 8 MiB usable
    forwards = []
    handle = model.blocks[0].register_forward_hook(lambda *args: forwards.append(1))
    try:
        for run in (lambda n: lens_bias.analyze(model, n_sequences=n, seq_len=8, progress=False),
                    lambda n: lens_bias.seedprint.fingerprint(model, n=n, seq_len=8, progress=False)):
            forwards.clear()
            with pytest.raises(LensBiasError) as refusal:
                run(count)
            message = str(refusal.value)
            assert "\n" not in message and "need about" in message and "can be used" in message
            assert len(forwards) == 1  # one batch, whatever the count: the inputs are drawn per batch
            largest = int(re.search(r"pass at most (\d+) sequences", message).group(1))
            assert 0 < largest < count
            if count == 10**7:  # the largest count it names runs
                assert run(largest) is not None
    finally:
        handle.remove()


def test_a_token_tensor_that_cannot_fit_is_refused_before_it_is_made(monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device=None: 2 * 2**20)  # 1 MiB usable: 16384 IDs of 8 bytes
    with pytest.raises(LensBiasError, match=r"random_tokens\(1000000000000, 8\) would hold about 58.2 TiB .* pass n <= 16384$"):
        lens_bias.random_tokens(10**12, 8, 100)
    with pytest.raises(LensBiasError, match="not even one fits: lower seq_len"):
        lens_bias.random_tokens(4, 10**12, 100)
    assert lens_bias.random_tokens(16384, 8, 100).shape == (16384, 8)  # the largest count it names is made


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
