"""The root verbs take their inputs one way: ``inputs=`` (``eval_inputs=`` for held-out text), a token tensor or
RandomTokens; the old ``tokens=`` keywords warn and give the same numbers; a name, embeddings or floats are refused."""

import inspect
import math

import pytest
import torch
import torch.nn.functional as F

import lens_bias
from lens_bias import LensBiasError, RandomTokens

from ..conftest import shared_tiny

VOCAB = 61


def tiny():
    return shared_tiny("llama", d_model=32, n_layers=2, n_heads=4, d_vocab=VOCAB, n_ctx=16, seed=3)


# each single-purpose verb, with the keyword arguments that make it run on the tiny model
VERBS = {
    "perplexity": {},
    "super_weights": {"top": 2},
    "super_weight_table": {"n_random": 5},
    "massive_activations": {},
    "massive_ablation": {"layer": 0, "dims": [0, 1]},
    "massive_writes": {"dim": 3},
    "sink_attribution": {"n_random": 5, "position": 4},
}
HELD_OUT = {"super_weight_table", "massive_ablation"}  # these also take eval_inputs


def _table(result):
    return result if isinstance(result, float) else result.to_pandas()


def _same(a, b):
    a, b = _table(a), _table(b)
    if isinstance(a, float):
        return a == b
    return a.equals(b)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_spelling_of_the_inputs_gives_the_same_numbers(verb):
    model, fn, kwargs = tiny(), getattr(lens_bias, verb), dict(VERBS[verb], progress=False)
    lazy, held_lazy = RandomTokens(8, 12, VOCAB, seed=1), RandomTokens(6, 12, VOCAB, seed=2)
    tokens, held = lazy.tensor(), held_lazy.tensor()
    extra, extra_lazy, extra_old = ((held,), {"eval_inputs": held_lazy}, {"eval_tokens": held}) if verb in HELD_OUT else ((), {}, {})
    positional = fn(model, tokens, *extra, **kwargs)
    assert _same(fn(model, inputs=lazy, **extra_lazy, **kwargs), positional)  # RandomTokens are their tensor
    with pytest.warns(DeprecationWarning, match=rf"{verb}\(tokens=\.\.\.\) is deprecated: pass inputs="):
        assert _same(fn(model, tokens=tokens, **extra_old, **kwargs), positional)


def test_the_perplexity_of_inputs_is_the_models_own_cross_entropy():
    model, tokens = tiny(), RandomTokens(8, 12, VOCAB, seed=1)
    ids = tokens.tensor()
    with torch.inference_mode():
        logits = model(ids)[:, :-1].double()
    direct = math.exp(F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).item())
    assert lens_bias.perplexity(model, inputs=tokens, progress=False) == pytest.approx(direct, rel=1e-6)


def test_massive_writes_reads_the_residual_it_names():
    model, ids = tiny(), RandomTokens(8, 12, VOCAB, seed=1).tensor()
    writes = lens_bias.massive_writes(model, inputs=ids, dim=3, progress=False)
    _, cache = model.run_with_cache(ids)
    last = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][:, 0, 3].double().mean().item()
    assert writes.residual == pytest.approx(last, rel=1e-5, abs=1e-7)
    # the residual is the embedding plus every write: the parts add up
    assert writes.embed + sum(writes.attn) + sum(writes.mlp) == pytest.approx(last, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("verb", sorted(VERBS) + ["super_experts"])
@pytest.mark.parametrize("bad, says", [
    ("text", "reads your own token IDs, not inputs='text'"),
    (torch.randn(4, 8), "must be token IDs, an integer tensor [n, seq]"),
    (torch.zeros(4, 8, 32), "must be token IDs, an integer tensor [n, seq]"),
    ([[1, 2, 3]], "must be token IDs (an integer tensor [n, seq] or RandomTokens), got list"),
])
def test_inputs_that_are_not_token_ids_are_refused_in_one_line(verb, bad, says):
    extra = (torch.zeros(2, 8, dtype=torch.long),) if verb in HELD_OUT else ()
    with pytest.raises(LensBiasError) as refusal:
        getattr(lens_bias, verb)(tiny(), bad, *extra)
    message = str(refusal.value)
    assert message.startswith(verb) and says in message and "\n" not in message


def test_the_old_and_new_keyword_together_are_refused():
    ids = torch.zeros(2, 8, dtype=torch.long)
    with pytest.raises(LensBiasError, match=r"perplexity got both tokens= and inputs=: pass inputs= only"):
        lens_bias.perplexity(tiny(), tokens=ids, inputs=ids)


def test_the_root_verbs_share_the_inputs_keyword_and_the_progress_default():
    verbs = {name: getattr(lens_bias, name) for name in lens_bias.__all__ if inspect.isfunction(getattr(lens_bias, name))}
    params = {name: inspect.signature(fn).parameters for name, fn in verbs.items()}
    assert not [name for name, p in params.items() if {"tokens", "eval_tokens"} & set(p)]  # the old spellings
    assert {name for name, p in params.items() if "inputs" in p} >= set(VERBS) | {"super_experts", "ablate"}
    progress = {name: p["progress"].default for name, p in params.items() if "progress" in p}
    assert set(progress) >= set(VERBS) | {"analyze", "ablate", "fingerprint", "compare", "train"}
    assert set(progress.values()) == {True}
    # analyze, fingerprint and compare take inputs= through their settings' overrides
    model = tiny()
    ids = RandomTokens(4, 8, VOCAB, seed=1)
    report = lens_bias.analyze(model, sections=["token_preference"], inputs=ids, progress=False)
    assert report.inputs.n == 4 and report.inputs.seq_len == 8
