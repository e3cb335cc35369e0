"""GPT-2: LayerNorm, a plain MLP, learned (or rotary, or no) positions; HF GPT-2's init, whose residual-output
projections are scaled by 1/√(2·n_layers). On TL 4 a TL-native bridge, on TL 3 a ``HookedTransformer``; its
checkpoints stay on the TL line that wrote them."""

from __future__ import annotations

from typing import Any

from lens_bias.models.architectures.base import Architecture, freeze_zero, tl_config
from lens_bias.models.spec import ModelSpec

__all__ = ["GPT2"]


class GPT2(Architecture):
    name = "gpt2"
    hf_architecture = "GPT2LMHeadModel"
    activations = ("gelu_new", "relu", "gelu", "silu", "solu")
    default_act = "gelu_new"
    positional_embeddings = ("learned", "none", "rotary")
    normalization = "LN"
    attn_only_blocks = True
    scales_residual_outputs = True
    bridge_mask_bytes = 4  # the native bridge keeps a float [n_ctx, n_ctx] mask per layer

    def build_bridge(self, spec: ModelSpec) -> Any:
        from transformer_lens.config import TransformerBridgeConfig
        from transformer_lens.model_bridge.sources.native import boot

        cfg = TransformerBridgeConfig(
            **tl_config(spec),
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
            original: Any = model.original_model  # the bridged HF module: its attributes are its submodules
            freeze_zero(original.pos.weight)
        return model

    def redraw_bridge(self, model: Any, spec: ModelSpec) -> None:
        from transformer_lens.model_bridge.sources.native import initialize_native_model

        initialize_native_model(model.original_model, model.original_model.cfg, seed=spec.seed)
        if spec.positional_embedding == "none":
            freeze_zero(model.original_model.pos.weight)

    def hooked_config(self, spec: ModelSpec) -> dict[str, Any]:
        return dict(normalization_type="LN", final_rms=False, gated_mlp=False, eps=1e-5)
