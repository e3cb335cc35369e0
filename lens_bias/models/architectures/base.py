"""The architecture object: one random-init model family, everything lens_bias needs to know about it.

A family gives its defaults (activation, positions, MLP width), builds a model for a TL 4 ``TransformerBridge``
and a TL 3 ``HookedTransformer``, re-draws a built model's weights for another seed, and converts a checkpoint
between the two TL lines' weight layouts. A new family is one file in this folder with one subclass that sets
``name``: defining it registers it, and ``random_init(name, ...)``, ``ModelSpec``, model spec strings
(``"name:d=128"``) and checkpoints accept it.

Weights follow the Hugging Face defaults: N(0, ``init_std``) matrices (the residual outputs scaled by
``output_scale``), norm gains 1 and biases 0, drawn on CPU in float32 from a local ``torch.Generator`` seeded with
the spec's seed (:func:`init_parameters`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, ClassVar, Iterable

import torch

from lens_bias.core import tl
from lens_bias.core.errors import LensBiasError
from lens_bias.models.spec import ARCHITECTURES, ModelSpec

__all__ = ["Architecture", "init_parameters", "is_bias", "freeze_zero", "tl_config", "HOOKED_OUTPUTS"]

# TL 3 residual-output projections (the weights gpt2 scales by 1/√(2·n_layers)).
HOOKED_OUTPUTS = ("W_O", "W_out")


def is_bias(name: str) -> bool:
    """Whether a parameter name (HF ``bias``; TL 3 ``b``, ``b_Q``, GQA's ``_b_K``) is a bias."""
    leaf = name.rsplit(".", 1)[-1].lstrip("_")
    return leaf in ("bias", "b") or leaf.startswith("b_")


def init_parameters(
    params: Iterable[tuple[str, torch.nn.Parameter]], *, seed: int, std: float, output_std: float | None = None,
    is_output: Callable[[str], bool] = lambda name: False,
) -> None:
    """Re-draw parameters in place, in the order given: biases 0, vectors (norm gains) 1, matrices N(0, ``std``),
    residual outputs (``is_output``) N(0, ``output_std``); draws on CPU in float32 from ``torch.Generator(seed)``, so
    the values do not depend on the device or dtype."""
    generator = torch.Generator().manual_seed(seed)
    for name, p in params:
        with torch.no_grad():
            if is_bias(name):
                p.zero_()
            elif p.ndim == 1:
                p.fill_(1.0)
            else:
                scale = output_std if output_std is not None and is_output(name) else std
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, scale, generator=generator))


def freeze_zero(table: torch.nn.Parameter) -> None:
    """Positional embedding "none": keep the (hooked) table, but at zero and out of training."""
    with torch.no_grad():
        table.zero_()
    table.requires_grad_(False)


class Architecture:
    """One family of random-init models (the base class; subclasses set ``name`` and register themselves)."""

    name: ClassVar[str]
    hf_architecture: ClassVar[str]  # the Hugging Face class name TL keys its adapters on
    activations: ClassVar[tuple[str, ...]]  # the MLP activations it can be built with
    default_act: ClassVar[str]
    positional_embeddings: ClassVar[tuple[str, ...]]  # the first one is the default
    normalization: ClassVar[str]  # "LN" or "RMS"
    gated_mlp: ClassVar[bool] = False
    attn_only_blocks: ClassVar[bool] = False  # whether attn_only=True can be built
    # GPT-2 scales its residual-output projections by 1/√(2·n_layers); the others draw them like every matrix.
    scales_residual_outputs: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            ARCHITECTURES.add(cls.name, cls())

    # Bytes per entry of the [n_ctx, n_ctx] causal mask a TL 4 bridge of this family keeps per layer (0: none).
    bridge_mask_bytes: ClassVar[int] = 0

    def default_d_mlp(self, d_model: int) -> int:
        return 4 * d_model

    def parameter_count(self, spec: ModelSpec) -> int:
        """Parameters of the model ``spec`` builds (embedding, unembedding, attention and MLP matrices)."""
        d, mlp = spec.d_model, 0 if spec.attn_only else (spec.d_mlp or self.default_d_mlp(spec.d_model))
        per_layer = 4 * d * d + (3 if self.gated_mlp else 2) * d * mlp
        positions = spec.n_ctx * d if spec.positional_embedding in ("learned", "none") else 0
        return spec.n_layers * per_layer + 2 * spec.d_vocab * d + positions

    def build_bytes(self, spec: ModelSpec, hooked: bool) -> int:
        """Memory a freshly built model holds: float32 weights, and the per-layer causal masks TransformerLens keeps
        (a TL 3 ``HookedTransformer``'s are bool; a TL 4 native bridge's are ``bridge_mask_bytes`` per entry)."""
        mask = 1 if hooked else self.bridge_mask_bytes
        return 4 * self.parameter_count(spec) + spec.n_layers * spec.n_ctx**2 * mask

    def output_std(self, spec: ModelSpec) -> float:
        return spec.init_std / math.sqrt(2 * spec.n_layers) if self.scales_residual_outputs else spec.init_std

    # ---- building -------------------------------------------------------------------------------------------

    def build_bridge(self, spec: ModelSpec) -> Any:
        """A TL 4 ``TransformerBridge`` with ``spec``'s weights."""
        raise NotImplementedError

    def redraw_bridge(self, model: Any, spec: ModelSpec) -> None:
        """Re-draw a bridge built by :meth:`build_bridge` in place, as :meth:`build_bridge` would for ``spec``."""
        raise NotImplementedError

    def hooked_config(self, spec: ModelSpec) -> dict[str, Any]:
        """The ``HookedTransformerConfig`` fields of this family (besides the sizes every family shares)."""
        raise NotImplementedError

    def build_hooked(self, spec: ModelSpec) -> Any:
        """A TL 3 ``HookedTransformer`` with ``spec``'s weights."""
        HookedTransformer, HookedTransformerConfig = tl.hooked_classes()
        cfg = HookedTransformerConfig(
            **tl_config(spec),
            **self.hooked_config(spec),
            d_mlp=None if spec.attn_only else spec.d_mlp,
            rotary_dim=spec.d_head if spec.positional_embedding == "rotary" else None,
            original_architecture=self.hf_architecture,
            model_name=f"lens_bias-{spec.arch}-seed{spec.seed}",
            # lens_bias draws the weights itself: TL 3.x's seeded init would reseed the global RNG.
            init_weights=False,
            device="cpu",
            default_prepend_bos=False,
        )
        model = HookedTransformer(cfg)
        self.redraw_hooked(model, spec)
        return model

    def redraw_hooked(self, model: Any, spec: ModelSpec) -> None:
        """Re-draw a ``HookedTransformer`` of this family in place for ``spec``."""
        init_parameters(
            model.named_parameters(), seed=spec.seed, std=spec.init_std, output_std=self.output_std(spec),
            is_output=lambda name: name.rsplit(".", 1)[-1] in HOOKED_OUTPUTS,
        )
        if spec.positional_embedding == "none":
            freeze_zero(model.pos_embed.W_pos)

    # ---- checkpoints across TL lines ---------------------------------------------------------------------------

    def bridge_to_hooked(self, state: dict[str, torch.Tensor], spec: ModelSpec, target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """A TL 4 bridge's state dict in the layout of the TL 3 ``HookedTransformer`` whose state is ``target``."""
        raise LensBiasError(f"{self.name} checkpoints from a TL 4 bridge load on TL 4 only; retrain on TL 3 or install transformer-lens>=4")

    def hooked_to_bridge(self, state: dict[str, torch.Tensor], spec: ModelSpec) -> dict[str, torch.Tensor]:
        """A TL 3 ``HookedTransformer``'s state dict in the layout of this family's TL 4 bridge."""
        raise LensBiasError(f"{self.name} checkpoints from TL 3 load on TL 3 only; retrain on TL 4 or install transformer-lens<4")


def tl_config(spec: ModelSpec) -> dict[str, Any]:
    """The config fields a TL 4 native bridge and a TL 3 ``HookedTransformer`` take alike."""
    return dict(
        d_model=spec.d_model, d_head=spec.d_head, n_layers=spec.n_layers, n_ctx=spec.n_ctx, n_heads=spec.n_heads, d_vocab=spec.d_vocab,
        act_fn=spec.act_fn, attn_only=spec.attn_only,
        positional_embedding_type="rotary" if spec.positional_embedding == "rotary" else "standard",
    )
