"""What lens_bias knows about a model before running it: its architecture and shapes (read from ``model.cfg``, and
from the weights where the config disagrees), which TransformerLens family it is, and whether its weights are a
random init or trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lens_bias.core import attention_layout, tl
from lens_bias.core.errors import WrongType
from lens_bias.core.serialise import Serialisable

__all__ = ["ModelInfo", "read_model_info", "family", "REGIME_ATTRIBUTE", "REGIMES", "NAME_ATTRIBUTE"]

# The attribute lens_bias.models records a model's regime in ("init" or "trained").
REGIME_ATTRIBUTE = "lens_bias_regime"
REGIMES = ("init", "trained")
# ... and the name a report shows for it (a GGUF file's general.name, a Hugging Face name_or_path).
NAME_ATTRIBUTE = "lens_bias_name"


@dataclass(frozen=True)
class ModelInfo(Serialisable):
    """What lens_bias knows about a model: its architecture (read from ``model.cfg``) and whether its weights are a
    random init or trained (``regime``)."""

    family: str  # "bridge" (TL 4.x TransformerBridge), "hooked" (TL 3.x HookedTransformer) or "hooked-root"
    architecture: str | None
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int | None
    d_vocab: int
    n_ctx: int
    act_fn: str | None
    gated_mlp: bool
    normalization: str | None  # "LN", "RMS", ... or None
    positional_embedding: str  # "learned", "rotary", "none", ...
    attn_only: bool
    device: str
    dtype: str
    tl_version: str
    # "init" (random_init, a redrawn model, a fresh config) or "trained" (pretrained, from_hf, a checkpoint, a model
    # lens_bias trained): which laws a report compares the model with. Models lens_bias did not make count as trained.
    regime: str = "trained"
    # Experts per mixture-of-experts MLP (None: a dense MLP), from the model's config.
    n_experts: int | None = None
    # What the model is called: the recorded name (GGUF general.name, HF name_or_path), a random init's spec, or
    # TL's cfg.model_name.
    name: str | None = None
    # Whether the attention declares a learned sink: a softmax logit per head that no key owns (GPT-OSS).
    learned_sinks: bool = False


def family(model: Any) -> str:
    """"bridge" (TL 4.x TransformerBridge), "hooked" (TL 3.x HookedTransformer) or "hooked-root"; refuses anything else."""
    bridge = tl.bridge_class()
    if bridge is not None and isinstance(model, bridge):
        return "bridge"
    hooked = tl.hooked_transformer_classes()
    if hooked is not None and isinstance(model, hooked[0]):
        return "hooked"
    if isinstance(model, torch.nn.Module) and hasattr(model, "hook_dict") and hasattr(model, "hooks"):
        return "hooked-root"
    raise WrongType(
        f"lens_bias needs a TransformerLens model (TransformerBridge on TL 4.x, HookedTransformer on TL 3.x, or a "
        f"HookedRootModule with the standard hook names); got {type(model).__module__}.{type(model).__name__}. "
        "Build one with lens_bias.models.random_init(...), or wrap a Hugging Face model with "
        "TransformerBridge.boot_transformers(name) / build_bridge_from_module(hf_model, architecture)."
    )


def _name(model: Any, cfg: Any) -> str | None:
    recorded = getattr(model, NAME_ATTRIBUTE, None)
    if recorded:
        return str(recorded)
    spec = getattr(model, "lens_bias_spec", None)
    if spec is not None:
        return f"random init {spec.text}"
    return getattr(cfg, "model_name", None)


def _architecture(model: Any, cfg: Any) -> str | None:
    spec = getattr(model, "lens_bias_spec", None)
    if spec is not None:
        return spec.arch
    return getattr(cfg, "original_architecture", None) or getattr(cfg, "architecture", None)


def _d_mlp(model: Any, configured: int | None) -> int | None:
    """The MLP width read from the first block's ``W_out`` ([d_mlp, d_model]), not the config: TL 4.3's OPT bridge
    reports cfg.d_mlp 256 for a W_out of 128 × 64. Its shape only, so an offloaded (meta) weight is never loaded.
    The config's value where the MLP exposes no ``W_out`` (a mixture of experts)."""
    blocks: Any = getattr(model, "blocks", None)
    try:
        return int(blocks[0].mlp.W_out.shape[0])
    except Exception:  # noqa: BLE001 - no blocks, no MLP, or an MLP without a single W_out
        return configured


def _experts(model: Any, cfg: Any) -> int | None:
    """Experts per MLP of a mixture-of-experts model (its TL or Hugging Face config), else None."""
    hf_cfg = getattr(getattr(model, "original_model", None), "config", None)
    for source in (cfg, hf_cfg):
        for key in ("num_experts", "num_local_experts", "n_routed_experts"):
            value = getattr(source, key, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 1:
                return value
    return None


def _positional(model: Any, cfg: Any) -> str:
    spec = getattr(model, "lens_bias_spec", None)
    if spec is not None:  # lens_bias factories record "none", which TL configs cannot express
        return spec.positional_embedding
    kind = getattr(cfg, "positional_embedding_type", None) or "standard"
    return "learned" if kind == "standard" else kind


def read_model_info(model: Any) -> ModelInfo:
    """The :class:`ModelInfo` of a TransformerLens model, read from its ``cfg`` and its modules (shapes from the weights)."""
    kind = family(model)
    cfg = getattr(model, "cfg", None)
    if cfg is None:
        raise WrongType(f"{type(model).__name__} has no .cfg; lens_bias reads the architecture from a TL config")
    param = next(model.parameters(), None)
    if param is None:
        raise WrongType(f"{type(model).__name__} has no parameters")
    n_heads = int(cfg.n_heads)
    d_model = int(cfg.d_model)
    return ModelInfo(
        family=kind,
        architecture=_architecture(model, cfg),
        n_layers=int(cfg.n_layers),
        d_model=d_model,
        n_heads=n_heads,
        d_head=int(getattr(cfg, "d_head", 0) or d_model // n_heads),
        d_mlp=None if getattr(cfg, "attn_only", False) else _d_mlp(model, getattr(cfg, "d_mlp", None)),
        d_vocab=int(cfg.d_vocab),
        n_ctx=int(cfg.n_ctx),
        act_fn=getattr(cfg, "act_fn", None),
        gated_mlp=bool(getattr(cfg, "gated_mlp", False)),
        normalization=getattr(cfg, "normalization_type", None),
        positional_embedding=_positional(model, cfg),
        attn_only=bool(getattr(cfg, "attn_only", False)),
        device=str(param.device),
        dtype=str(param.dtype).removeprefix("torch."),
        tl_version=tl.tl_version(),
        regime=getattr(model, REGIME_ATTRIBUTE, None) or "trained",
        n_experts=_experts(model, cfg),
        name=_name(model, cfg),
        learned_sinks=attention_layout.declares_learned_sinks(model),
    )
