"""Randomly initialised TransformerLens models, built offline and deterministically from a seed.

``random_init("gpt2" | "llama" | "qwen2", ...)`` returns a TL 4.x ``TransformerBridge`` (TL-native for gpt2, a
random Hugging Face model wrapped by ``build_bridge_from_module`` for llama / qwen2) or, on TL 3.x, a
``HookedTransformer``. Weights follow the Hugging Face defaults of each architecture: N(0, 0.02) everywhere,
and for gpt2 the residual-output projections (W_O, W_out) scaled by 1/√(2·n_layers) as in HF GPT-2. Every
draw comes from a local ``torch.Generator`` seeded with ``seed``; the caller's global RNG is left as it was.

Pretrained models for users who are online: ``TransformerBridge.boot_transformers("gpt2")`` (TL 4.x) or
``HookedTransformer.from_pretrained("gpt2")`` (TL 3.x); every lens_bias function takes them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Union

import torch

from . import _tl
from .errors import LensBiasError

__all__ = ["ModelSpec", "random_init", "redraw", "parse_model_spec", "load_model", "pretrained", "from_hf", "ARCHS", "ACTIVATIONS", "POSITIONAL_EMBEDDINGS"]

ARCHS = ("gpt2", "llama", "qwen2")
# Activations each architecture family can be built with.
ACTIVATIONS = {
    "gpt2": ("relu", "gelu", "gelu_new", "silu", "solu"),
    "llama": ("silu", "gelu", "relu"),
    "qwen2": ("silu", "gelu", "relu"),
}
POSITIONAL_EMBEDDINGS = {"gpt2": ("none", "learned", "rotary"), "llama": ("rotary",), "qwen2": ("rotary",)}
_HF_ARCHITECTURE = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_HOOKED_OUTPUTS = ("W_O", "W_out")  # TL 3 residual-output projections (scaled for gpt2)
# Short keys of a model spec string ("llama:d=256,L=4,seed=3") -> ModelSpec fields.
_SPEC_KEYS = {"d": "d_model", "L": "n_layers", "H": "n_heads", "V": "d_vocab", "ctx": "n_ctx", "act": "act_fn", "pos": "positional_embedding", "mlp": "d_mlp"}


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to rebuild a random-init model exactly (recorded on the model as ``lens_bias_spec``)."""

    # "gpt2": LayerNorm, plain MLP; "llama": RMSNorm, SwiGLU, RoPE, no biases; "qwen2": llama + q/k/v biases.
    arch: str
    # Width sets the logit spread (≈ σ√d), so it decides how extreme the token preference can get.
    d_model: int = 256
    # Depth lets the MLPs' shared direction accumulate (inter-sequence cosine rises with depth).
    n_layers: int = 4
    n_heads: int = 8
    # The papers compare models over IDs < 32000; 8000 keeps CPU runs fast.
    d_vocab: int = 8000
    n_ctx: int = 256
    # None: the architecture's own (gpt2 "gelu_new", llama/qwen2 "silu"). The MLP's asymmetry is the bias source.
    act_fn: str | None = None
    # None: gpt2 "learned", llama/qwen2 "rotary". Learned positions are shared across sequences and inflate the
    # inter-sequence cosine on their own; "none" keeps a zero, frozen position table (the function has no positions).
    positional_embedding: str | None = None
    # None: 4·d_model (gpt2, qwen2) or 8/3·d_model rounded up to a multiple of 16 (llama).
    d_mlp: int | None = None
    # Attention-only blocks isolate intra-sequence aggregation (gpt2 only).
    attn_only: bool = False
    # The init seed: the bias the model is born with is a function of this alone.
    seed: int = 0
    # HF's initializer_range. TL's native default (0.8/√d) is larger and makes init attention visibly sharper.
    init_std: float = 0.02

    def resolved(self) -> "ModelSpec":
        """A copy with every ``None`` default filled in and every field validated."""
        if self.arch not in ARCHS:
            raise LensBiasError(f"unknown arch {self.arch!r}; choose one of {', '.join(ARCHS)}")
        act = self.act_fn or ("gelu_new" if self.arch == "gpt2" else "silu")
        if act not in ACTIVATIONS[self.arch]:
            raise LensBiasError(f"act_fn {act!r} is not available for arch {self.arch!r}; choose one of {ACTIVATIONS[self.arch]}")
        pos = self.positional_embedding or ("learned" if self.arch == "gpt2" else "rotary")
        if pos not in POSITIONAL_EMBEDDINGS[self.arch]:
            raise LensBiasError(
                f"positional_embedding {pos!r} is not available for arch {self.arch!r}; choose one of "
                f"{POSITIONAL_EMBEDDINGS[self.arch]}"
            )
        for name in ("d_model", "n_layers", "n_heads", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LensBiasError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise LensBiasError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.attn_only and self.arch != "gpt2":
            raise LensBiasError("attn_only=True is built for arch='gpt2' (use positional_embedding='rotary' or 'none')")
        if not self.init_std > 0:
            raise LensBiasError(f"init_std must be > 0, got {self.init_std}")
        if not 0 <= self.seed < 2**63:
            raise LensBiasError(f"seed must be a non-negative int, got {self.seed}")
        d_mlp = self.d_mlp or (16 * math.ceil(8 * self.d_model / 3 / 16) if self.arch == "llama" else 4 * self.d_model)
        return replace(self, act_fn=act, positional_embedding=pos, d_mlp=d_mlp)

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ModelSpec":
        return cls(**d)


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
        arch: "gpt2", "llama" or "qwen2", or a :class:`ModelSpec` (then no other spec keywords).
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
            raise TypeError(f"pass either a ModelSpec or keyword fields, not both (got {sorted(spec)})")
        model_spec = arch.resolved()
    else:
        unknown = set(spec) - set(ModelSpec.__dataclass_fields__)
        if unknown:
            raise TypeError(f"random_init got unknown argument(s) {sorted(unknown)}; valid: {sorted(ModelSpec.__dataclass_fields__)}")
        model_spec = ModelSpec(arch=arch, **spec).resolved()
    backend = _resolve_backend(backend)
    # Constructors draw default inits from the global RNG before we overwrite them: fork it so the caller's
    # RNG state is exactly as it was.
    with torch.random.fork_rng(devices=[]):
        if backend == "hooked":
            model = _build_hooked(model_spec)
        elif model_spec.arch == "gpt2":
            model = _build_native(model_spec)
        else:
            model = _build_hf(model_spec)
    # TL's .to() logs even when nothing changes; only call it when something does.
    if device is not None and torch.device(device) != torch.device("cpu"):
        model = model.to(device)
    if dtype is not None and dtype != torch.float32:
        model = model.to(dtype)
    model.eval()
    model.lens_bias_spec = model_spec
    return model


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
    spec = getattr(model, "lens_bias_spec", None)
    if spec is None:
        raise LensBiasError("redraw needs a model built by lens_bias.random_init (it reads model.lens_bias_spec)")
    spec = replace(spec, seed=seed)
    with torch.random.fork_rng(devices=[]):
        if _tl.hooked_transformer_classes() is not None and isinstance(model, _tl.hooked_transformer_classes()[0]):
            _init_params(model.named_parameters(), spec, is_output=lambda name: name.rsplit(".", 1)[-1] in _HOOKED_OUTPUTS)
            if spec.positional_embedding == "none":
                _freeze_zero(model.pos_embed.W_pos)
        elif spec.arch == "gpt2":
            from transformer_lens.model_bridge.sources.native import initialize_native_model

            initialize_native_model(model.original_model, model.original_model.cfg, seed=seed)
            if spec.positional_embedding == "none":
                _freeze_zero(model.original_model.pos.weight)
        else:
            _init_params(model.original_model.named_parameters(), spec, is_output=lambda name: False)
    model.lens_bias_spec = spec
    return model


def parse_model_spec(text: str) -> ModelSpec:
    """``"llama:d=256,L=4,seed=3"`` -> ``ModelSpec(arch="llama", d_model=256, n_layers=4, seed=3)``, resolved.

    Keys: d, L, H, V, ctx, act, pos, mlp, or any :class:`ModelSpec` field.

    >>> parse_model_spec("gpt2:d=64,L=2,act=relu").act_fn
    'relu'
    """
    arch, _, rest = text.partition(":")
    fields: dict[str, object] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = (part.strip() for part in item.partition("="))
        name = _SPEC_KEYS.get(key, key)
        if not eq or name not in ModelSpec.__dataclass_fields__ or name == "arch":
            raise LensBiasError(f"bad model spec item {item!r}: use key=value with keys {sorted(_SPEC_KEYS)} or ModelSpec fields")
        kind = str(ModelSpec.__dataclass_fields__[name].type)  # "int", "float", "bool", "str | None", ...
        try:
            fields[name] = (value.lower() in ("1", "true", "yes")) if kind == "bool" else float(value) if kind == "float" else int(value) if kind.startswith("int") else value
        except ValueError:
            raise LensBiasError(f"model spec {name}={value!r} is not a {kind}") from None
    return ModelSpec(arch=arch.strip(), **fields).resolved()


def load_model(text: str, device: Union[str, torch.device, None] = None, dtype: torch.dtype | None = None) -> Any:
    """The model one string names (the CLI's MODEL): a shipped model name (smollm2-135m-instruct), a .gguf file, a
    Hugging Face folder, a lens_bias checkpoint, a random-init spec (:func:`parse_model_spec`), or (online) a hub
    name."""
    from .checkpoints import load_checkpoint  # checkpoints builds its models with random_init from here

    if text in SHIPPED or text.endswith(".gguf") or Path(text).is_dir():
        return pretrained(text, device=device, dtype=dtype)
    if Path(text).is_file():
        model = load_checkpoint(text, device=device)
        return model.to(dtype) if dtype is not None else model
    arch = text.partition(":")[0].strip()
    if arch in ARCHS:
        return random_init(parse_model_spec(text), device=device, dtype=dtype)
    if text.endswith(".pt"):
        raise FileNotFoundError(f"no checkpoint at {text}")
    return pretrained(text, device=device, dtype=dtype)


def _resolve_backend(backend: str) -> str:
    has_hooked = _tl.hooked_transformer_classes() is not None
    if backend == "auto":
        return "bridge" if _tl.tl_major() >= 4 or not has_hooked else "hooked"
    if backend == "hooked" and not has_hooked:
        raise LensBiasError(f"backend='hooked' needs TransformerLens 3.x (HookedTransformer); {_tl.tl_version()} has only TransformerBridge")
    if backend == "bridge" and _tl.tl_major() < 4:
        raise LensBiasError(f"backend='bridge' needs TransformerLens 4.x; {_tl.tl_version()} is installed (use backend='hooked')")
    if backend not in ("bridge", "hooked"):
        raise LensBiasError(f"backend must be 'auto', 'bridge' or 'hooked', got {backend!r}")
    return backend


def _normal(generator: torch.Generator, std: float) -> Callable[[torch.Tensor], None]:
    """An in-place N(0, std) init that draws on CPU in float32, so values do not depend on device or dtype."""

    def init(t: torch.Tensor) -> None:
        staged = torch.empty(t.shape, dtype=torch.float32).normal_(0.0, std, generator=generator)
        with torch.no_grad():
            t.copy_(staged)

    return init


def _init_params(
    params: Iterable[tuple[str, torch.nn.Parameter]], spec: ModelSpec, is_output: Callable[[str], bool]
) -> None:
    """Re-initialise every parameter: matrices N(0, std) (outputs scaled for gpt2), norm gains 1, biases 0."""
    generator = torch.Generator().manual_seed(spec.seed)
    normal = _normal(generator, spec.init_std)
    scale = 1 / math.sqrt(2 * spec.n_layers) if spec.arch == "gpt2" else 1.0
    output = _normal(generator, spec.init_std * scale)
    for name, p in params:
        leaf = name.rsplit(".", 1)[-1]
        with torch.no_grad():
            if leaf == "bias" or (leaf.startswith("b") and leaf != "weight"):  # HF "bias", TL3 "b_Q", "b", ...
                p.zero_()
            elif p.ndim == 1 or leaf == "w":  # norm gains (HF 1-D "weight", TL3 "w")
                p.fill_(1.0)
            elif is_output(name):
                output(p)
            else:
                normal(p)


def _tl_config(spec: ModelSpec) -> dict[str, Any]:
    """The config fields a TL 4 native bridge (gpt2) and a TL 3 ``HookedTransformer`` take alike."""
    return dict(
        d_model=spec.d_model, d_head=spec.d_head, n_layers=spec.n_layers, n_ctx=spec.n_ctx, n_heads=spec.n_heads, d_vocab=spec.d_vocab,
        act_fn=spec.act_fn, attn_only=spec.attn_only,
        positional_embedding_type="rotary" if spec.positional_embedding == "rotary" else "standard",
    )


def _build_native(spec: ModelSpec) -> Any:
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge.sources.native import boot

    cfg = TransformerBridgeConfig(
        **_tl_config(spec),
        d_mlp=spec.d_mlp,
        normalization_type="LN",
        # The native "gpt2" init mode is HF GPT-2's: N(0, initializer_range), residual outputs / √(2·n_layers),
        # drawn from a local generator seeded with `seed`.
        init_mode="gpt2",
        initializer_range=spec.init_std,
        seed=spec.seed,
        model_name=f"lens_bias-gpt2-seed{spec.seed}",
        tokenizer_prepends_bos=False,
    )
    model = boot(cfg)
    if spec.positional_embedding == "none":
        _freeze_zero(model.original_model.pos.weight)
    return model


def _build_hf(spec: ModelSpec) -> Any:
    from transformer_lens.model_bridge.sources._bridge_builder import build_bridge_from_module

    common = dict(
        vocab_size=spec.d_vocab,
        hidden_size=spec.d_model,
        intermediate_size=spec.d_mlp,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=spec.n_heads,
        num_key_value_heads=spec.n_heads,
        hidden_act=spec.act_fn,
        max_position_embeddings=spec.n_ctx,
        initializer_range=spec.init_std,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        # Eager attention materialises the pattern, so hook_pattern edits act on the real computation.
        attn_implementation="eager",
    )
    if spec.arch == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        hf = LlamaForCausalLM(LlamaConfig(**common, attention_bias=False, mlp_bias=False))
    else:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        hf = Qwen2ForCausalLM(Qwen2Config(**common, use_sliding_window=False))
    _init_params(hf.named_parameters(), spec, is_output=lambda name: False)
    hf.eval()
    return build_bridge_from_module(hf, _HF_ARCHITECTURE[spec.arch], hf_config=hf.config, model_name=f"lens_bias-{spec.arch}-seed{spec.seed}")


def _build_hooked(spec: ModelSpec) -> Any:
    HookedTransformer, HookedTransformerConfig = _tl.hooked_transformer_classes()  # type: ignore[misc]
    llama_like = spec.arch != "gpt2"
    cfg = HookedTransformerConfig(
        **_tl_config(spec),
        d_mlp=None if spec.attn_only else spec.d_mlp,
        normalization_type="RMS" if llama_like else "LN",
        final_rms=llama_like,
        gated_mlp=llama_like,
        eps=1e-6 if llama_like else 1e-5,
        rotary_dim=spec.d_head if spec.positional_embedding == "rotary" else None,
        original_architecture=_HF_ARCHITECTURE[spec.arch],
        model_name=f"lens_bias-{spec.arch}-seed{spec.seed}",
        # lens_bias draws the weights itself: TL 3.x's seeded init would reseed the global RNG.
        init_weights=False,
        device="cpu",
        default_prepend_bos=False,
    )
    model = HookedTransformer(cfg)
    _init_params(model.named_parameters(), spec, is_output=lambda name: name.rsplit(".", 1)[-1] in _HOOKED_OUTPUTS)
    if spec.positional_embedding == "none":
        _freeze_zero(model.pos_embed.W_pos)
    return model


def _freeze_zero(table: torch.nn.Parameter) -> None:
    """Positional embedding "none": keep the (hooked) table, but at zero and out of training."""
    with torch.no_grad():
        table.zero_()
    table.requires_grad_(False)


from .pretrained import SHIPPED, from_hf, pretrained  # noqa: E402  (re-exported: lens_bias.models is the one place models come from)
