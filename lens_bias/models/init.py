"""Randomly initialised TransformerLens models, built offline and deterministically from a seed.

``random_init("gpt2" | "llama" | "qwen2", ...)`` returns a TL 4.x ``TransformerBridge`` (TL-native for gpt2, a
random Hugging Face model wrapped by ``build_bridge_from_module`` for llama / qwen2) or, on TL 3.x, a
``HookedTransformer``. Weights follow the Hugging Face defaults of each architecture: N(0, 0.02) everywhere,
and for gpt2 the residual-output projections (W_O, W_out) scaled by 1/√(2·n_layers) as in HF GPT-2. Every
draw comes from a local ``torch.Generator`` seeded with ``seed``; the caller's global RNG is left as it was.
Each family is an :class:`~lens_bias.models.architectures.base.Architecture` (one file in
``lens_bias/models/architectures/``).

Pretrained models for users who are online: ``TransformerBridge.boot_transformers("gpt2")`` (TL 4.x) or
``HookedTransformer.from_pretrained("gpt2")`` (TL 3.x); every lens_bias function takes them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Union

import torch

from lens_bias.core import memory, tl
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.model_facts import NAME_ATTRIBUTE, REGIME_ATTRIBUTE, REGIMES
from lens_bias.models.spec import ModelSpec

__all__ = ["random_init", "redraw", "resolve_backend", "mark"]

# What lens_bias records on the models it builds or loads: how to rebuild it, where it came from, and whether
# its weights are a random init or trained (``ModelInfo.regime``).
SPEC, SOURCE, REGIME, NAME = "lens_bias_spec", "lens_bias_source", REGIME_ATTRIBUTE, NAME_ATTRIBUTE


def mark(model: Any, *, regime: str, spec: ModelSpec | None = None, source: str | None = None, name: str | None = None) -> Any:
    """Record on ``model`` what lens_bias knows of it (``regime`` "init" or "trained", and the name a report shows:
    a GGUF file's ``general.name``, a Hugging Face ``name_or_path``); returns the model."""
    if regime not in REGIMES:
        raise LensBiasError(f"regime must be one of {REGIMES}, got {regime!r}")
    setattr(model, REGIME, regime)
    for attribute, value in ((SPEC, spec), (SOURCE, source), (NAME, name)):
        if value is not None:
            setattr(model, attribute, value)
        elif hasattr(model, attribute):
            delattr(model, attribute)
    return model


def resolve_backend(backend: str) -> str:
    """"auto" -> "bridge" on TL 4.x, "hooked" on TL 3.x; "bridge" / "hooked" checked against the installed TL."""
    has_hooked = tl.hooked_transformer_classes() is not None
    if backend == "auto":
        return "bridge" if tl.tl_major() >= 4 or not has_hooked else "hooked"
    if backend == "hooked" and not has_hooked:
        raise LensBiasError(f"backend='hooked' needs TransformerLens 3.x (HookedTransformer); {tl.tl_version()} has only TransformerBridge")
    if backend == "bridge" and tl.tl_major() < 4:
        raise LensBiasError(f"backend='bridge' needs TransformerLens 4.x; {tl.tl_version()} is installed (use backend='hooked')")
    if backend not in ("bridge", "hooked"):
        raise LensBiasError(f"backend must be 'auto', 'bridge' or 'hooked', got {backend!r}")
    return backend


def _check_build(spec: ModelSpec, hooked: bool) -> None:
    """Refuse, before allocating anything, a model whose weights and masks would not fit in memory."""
    family = spec.architecture
    need, budget = family.build_bytes(spec, hooked), memory.MEMORY_FRACTION * memory.available_bytes("cpu")
    if need <= budget:
        return
    lo, hi = 0, spec.n_ctx  # the longest context that fits, the rest of the spec kept
    while lo < hi - 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if family.build_bytes(replace(spec, n_ctx=mid), hooked) <= budget else (lo, mid)
    fix = f"pass n_ctx <= {lo}" if lo >= 1 else "build a smaller model (d_model, n_layers, d_vocab)"
    raise LensBiasError(
        f"building this {spec.arch} model (n_ctx {spec.n_ctx}, {spec.n_layers} layers) needs about {memory.format_bytes(need)} "
        f"but only {memory.format_bytes(budget)} of CPU memory can be used; {fix}"
    )


def random_init(
    arch: Union[str, ModelSpec] = "gpt2",
    *,
    backend: str = "auto",
    device: Union[str, torch.device, None] = None,
    dtype: torch.dtype | None = None,
    **spec: Any,
) -> Any:
    """Build a randomly initialised TransformerLens model, offline.

    >>> m = random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=32, act_fn="relu", seed=0)
    >>> m.cfg.d_model, m.lens_bias_spec.seed
    (64, 0)

    Args:
        arch: a registered architecture ("gpt2", "llama", "qwen2"), or a :class:`ModelSpec` (then no other spec
            keywords).
        backend: "auto" (TransformerBridge on TL 4.x, HookedTransformer on TL 3.x), "bridge" or "hooked".
        device: where the model lives (weights are drawn on CPU, so they do not depend on the device).
        dtype: e.g. ``torch.bfloat16``; weights are drawn in float32 and cast.
        **spec: the fields of :class:`ModelSpec` (d_model, n_layers, n_heads, d_vocab, n_ctx, act_fn,
            positional_embedding, d_mlp, attn_only, seed, init_std).

    Returns:
        The model, with its :class:`ModelSpec` as ``model.lens_bias_spec``.
    """
    if isinstance(arch, ModelSpec):
        if spec:
            raise WrongType(f"pass either a ModelSpec or keyword fields, not both (got {sorted(spec)})")
        model_spec = arch.resolved()
    else:
        unknown = set(spec) - set(ModelSpec.__dataclass_fields__)
        if unknown:
            raise WrongType(f"random_init got unknown argument(s) {sorted(unknown)}; valid: {sorted(ModelSpec.__dataclass_fields__)}")
        model_spec = ModelSpec(arch=arch, **spec).resolved()
    family = model_spec.architecture
    hooked = resolve_backend(backend) == "hooked"
    _check_build(model_spec, hooked)
    # Constructors draw default inits from the global RNG before we overwrite them: fork it so the caller's
    # RNG state is exactly as it was.
    with torch.random.fork_rng(devices=[]):
        model = family.build_hooked(model_spec) if hooked else family.build_bridge(model_spec)
    # TL's .to() logs even when nothing changes; only call it when something does.
    if device is not None and torch.device(device) != torch.device("cpu"):
        model = tl.move(model, device)
    if dtype is not None and dtype != torch.float32:
        model = tl.move(model, dtype)
    model.eval()
    return mark(model, regime="init", spec=model_spec)


def redraw(model: Any, seed: int) -> Any:
    """Re-draw the weights of a lens_bias-built model in place, exactly as ``random_init`` would for ``seed``.

    Building a bridge costs far more than drawing its weights; experiments over many init seeds (the SeedPrint
    seeds null, null calibration) re-draw one model instead. Only for models you built for that purpose: the
    model *is* changed.

    >>> m = random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=16, seed=0)
    >>> w = redraw(m, 7).W_Q.clone()
    >>> torch.equal(w, random_init(m.lens_bias_spec).W_Q), m.lens_bias_spec.seed
    (True, 7)

    Args:
        model: a model returned by :func:`random_init`.
        seed: the new init seed.

    Returns:
        The same model object, with weights and ``lens_bias_spec`` for ``seed``.
    """
    spec = getattr(model, SPEC, None)
    if spec is None:
        raise LensBiasError("redraw needs a model built by lens_bias.random_init (it reads model.lens_bias_spec)")
    spec = replace(spec, seed=seed)
    hooked_classes = tl.hooked_transformer_classes()
    with torch.random.fork_rng(devices=[]):
        if hooked_classes is not None and isinstance(model, hooked_classes[0]):
            spec.architecture.redraw_hooked(model, spec)
        else:
            spec.architecture.redraw_bridge(model, spec)
    return mark(model, regime="init", spec=spec)
