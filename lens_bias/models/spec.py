"""What a random-init model is: :class:`ModelSpec`, every field needed to rebuild it exactly, and the registry of
architecture families it names (``ARCHITECTURES``, filled by the :class:`~lens_bias.models.architectures.base.Architecture` subclasses)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch

from lens_bias.core import tl
from lens_bias.core.errors import LensBiasError
from lens_bias.core.model_facts import ModelInfo
from lens_bias.core.registry import Registry
from lens_bias.core.serialise import Serialisable, parse_field

__all__ = ["ModelSpec", "parse_model_spec", "ARCHITECTURES"]

# Architecture name -> its Architecture object (lens_bias.models.architectures.base).
ARCHITECTURES: Registry[Any] = Registry("architecture")
# Short keys of a model spec string ("llama:d=256,L=4,seed=3") -> ModelSpec fields.
_SPEC_KEYS = {"d": "d_model", "L": "n_layers", "H": "n_heads", "V": "d_vocab", "ctx": "n_ctx", "act": "act_fn", "pos": "positional_embedding", "mlp": "d_mlp"}


@dataclass(frozen=True)
class ModelSpec(Serialisable):
    """Everything needed to rebuild a random-init model exactly (recorded on the model as ``lens_bias_spec``)."""

    # A registered architecture: "gpt2" (LayerNorm, plain MLP), "llama" (RMSNorm, SwiGLU, RoPE, no biases) or
    # "qwen2" (llama + q/k/v biases).
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
    # None: the architecture's rule (4·d_model for gpt2 and qwen2, 8/3·d_model rounded up to 16 for llama).
    d_mlp: int | None = None
    # Attention-only blocks isolate intra-sequence aggregation (gpt2 only).
    attn_only: bool = False
    # The init seed: the bias the model is born with is a function of this alone.
    seed: int = 0
    # HF's initializer_range. TL's native default (0.8/√d) is larger and makes init attention visibly sharper.
    init_std: float = 0.02

    @property
    def text(self) -> str:
        """The spec as the string :func:`parse_model_spec` reads back: the architecture, then every field that
        differs from its default.

        >>> ModelSpec("llama", d_model=64, seed=3).text
        'llama:d=64,seed=3'
        """
        short = {field: key for key, field in _SPEC_KEYS.items()}
        spec, plain = self.resolved(), ModelSpec(self.arch, d_model=self.d_model)
        # the fields left None take the architecture's rules at this width, resolved with this spec's head count: the
        # default head count may not divide a narrow width (d 24 into 8 heads of 3 dims) that this spec's does
        derived = replace(plain, n_heads=self.n_heads).resolved()
        default = {name: getattr(derived if getattr(plain, name) is None else plain, name) for name in spec.__dataclass_fields__}
        items = [f"{short.get(name, name)}={getattr(spec, name)}" for name in spec.__dataclass_fields__
                 if name != "arch" and (name == "d_model" or getattr(spec, name) != default[name])]
        return f"{self.arch}:{','.join(items)}" if items else self.arch

    @property
    def architecture(self) -> Any:
        """The registered :class:`~lens_bias.models.architectures.base.Architecture` this spec names."""
        if self.arch not in ARCHITECTURES:
            raise LensBiasError(f"unknown arch {self.arch!r}; choose one of {', '.join(ARCHITECTURES.names())}")
        return ARCHITECTURES[self.arch]

    def resolved(self) -> "ModelSpec":
        """A copy with every ``None`` default filled in by the architecture and every field validated."""
        family = self.architecture
        act = self.act_fn or family.default_act
        if act not in family.activations:
            raise LensBiasError(f"act_fn {act!r} is not available for arch {self.arch!r}; choose one of {family.activations}")
        pos = self.positional_embedding or family.positional_embeddings[0]
        if pos not in family.positional_embeddings:
            raise LensBiasError(
                f"positional_embedding {pos!r} is not available for arch {self.arch!r}; choose one of {family.positional_embeddings}"
            )
        for name in ("d_model", "n_layers", "n_heads", "d_vocab", "n_ctx"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LensBiasError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads:
            raise LensBiasError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if pos == "rotary" and (self.d_model // self.n_heads) % 2:  # rotary embeddings turn pairs of a head's dims
            raise LensBiasError(f"rotary positions need an even head width: d_model / n_heads = {self.d_model // self.n_heads}; change d_model or n_heads")
        if self.attn_only and not family.attn_only_blocks:
            raise LensBiasError(f"attn_only=True is not built for arch {self.arch!r}; use one of {[n for n, a in ARCHITECTURES.items() if a.attn_only_blocks]}")
        if not self.init_std > 0:
            raise LensBiasError(f"init_std must be > 0, got {self.init_std}")
        if not 0 <= self.seed < 2**63:
            raise LensBiasError(f"seed must be a non-negative int, got {self.seed}")
        return replace(self, act_fn=act, positional_embedding=pos, d_mlp=self.d_mlp or family.default_d_mlp(self.d_model))

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def info(self, *, family: str | None = None, device: str = "cpu", dtype: torch.dtype = torch.float32) -> ModelInfo:
        """The :class:`~lens_bias.core.model_facts.ModelInfo` of the model this spec builds, before building it (what the
        memory guard sizes a pass by)."""
        spec = self.resolved()
        arch = spec.architecture
        return ModelInfo(
            family=family or ("bridge" if tl.tl_major() >= 4 else "hooked"), architecture=spec.arch, n_layers=spec.n_layers,
            d_model=spec.d_model, n_heads=spec.n_heads, d_head=spec.d_head, d_mlp=None if spec.attn_only else spec.d_mlp,
            d_vocab=spec.d_vocab, n_ctx=spec.n_ctx, act_fn=spec.act_fn, gated_mlp=arch.gated_mlp, normalization=arch.normalization,
            positional_embedding=str(spec.positional_embedding), attn_only=spec.attn_only, device=str(torch.device(device)),
            dtype=str(dtype).removeprefix("torch."), tl_version=tl.tl_version(), regime="init",
        )


def parse_model_spec(text: str) -> ModelSpec:
    """``"llama:d=256,L=4,seed=3"`` -> ``ModelSpec(arch="llama", d_model=256, n_layers=4, seed=3)``, resolved.

    Keys: d, L, H, V, ctx, act, pos, mlp, or any :class:`ModelSpec` field.

    >>> parse_model_spec("gpt2:d=64,L=2,act=relu").act_fn
    'relu'
    """
    arch, _, rest = text.partition(":")
    fields: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = (part.strip() for part in item.partition("="))
        name = _SPEC_KEYS.get(key, key)
        if not eq or name not in ModelSpec.__dataclass_fields__ or name == "arch":
            raise LensBiasError(f"bad model spec item {item!r}: use key=value with keys {sorted(_SPEC_KEYS)} or ModelSpec fields")
        fields[name] = parse_field(ModelSpec, name, value)
    return ModelSpec(arch=arch.strip(), **fields).resolved()
