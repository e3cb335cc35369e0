"""Where a massive activation is written: one residual dimension at one position, split into what the embedding and
each layer's attention and MLP add to it.

The residual stream is a sum, ``h_L = embed + Σ_l (attn_l + mlp_l)``, so the value of dimension ``dim`` at
``position`` after the last block is exactly the sum of the writes this analysis reads (``hook_embed`` or
``blocks.0.hook_resid_pre``, then ``hook_attn_out`` and ``hook_mlp_out`` of every block), averaged over sequences;
``residual`` checks it. On a LLaMA-style model (SmolLM2, Qwen2.5) the MLP writes its down-projection straight into
the residual, so a super weight of ``down_proj`` can be the writer. Gemma 3 normalises each sub-layer's output
before adding it (its ``post_feedforward_layernorm`` and ``post_attention_layernorm``): ``hook_mlp_out`` is after
that norm, and the write is bounded by the norm's gain at ``dim`` times √d, whatever the weights before it. The
table says which layer writes, and ``post_norm`` says whether the write passed through such a norm.

>>> import lens_bias
>>> m = lens_bias.random_init("llama", d_model=32, n_layers=2, n_heads=4, d_vocab=50, n_ctx=8)
>>> w = massive_writes(m, lens_bias.random_tokens(4, 8, 50, seed=0), dim=3)
>>> abs(w.total - w.residual) < 1e-4 * max(1.0, abs(w.residual))
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor

from lens_bias.analyses.base import Result
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.probes import Probe
from lens_bias.core.token_inputs import takes_token_inputs

__all__ = ["massive_writes", "MassiveWrites"]


@dataclass
class MassiveWrites(Result):
    """Mean writes into residual dimension ``dim`` at ``position``: the embedding's, then each layer's attention and MLP."""

    dim: int
    position: int
    embed: float  # the embedding's value at (position, dim)
    attn: list[float]  # per layer
    mlp: list[float]  # per layer
    residual: float  # the residual after the last block, read directly (the sum of the writes, to float32 rounding)
    post_norm: bool  # the sub-layers' outputs pass through a norm before they are added (Gemma's sandwich norms)
    n: int

    @property
    def total(self) -> float:
        """embed + Σ attn + Σ mlp: equals ``residual``."""
        return self.embed + sum(self.attn) + sum(self.mlp)

    def top_writer(self) -> tuple[str, int | None]:
        """("embed", None), ("attn", layer) or ("mlp", layer): the largest single write towards the value at its peak
        (a later layer that erases the activation writes against it and is not its writer)."""
        running, peak = self.embed, self.embed
        for a, m in zip(self.attn, self.mlp):
            running += a + m
            peak = running if abs(running) > abs(peak) else peak
        sign = 1.0 if peak >= 0 else -1.0
        candidates = [("embed", None, self.embed)] + [("attn", l, v) for l, v in enumerate(self.attn)] + [("mlp", l, v) for l, v in enumerate(self.mlp)]
        kind, layer, _ = max(candidates, key=lambda c: sign * c[2])
        return kind, layer

    def to_pandas(self) -> pd.DataFrame:
        """One row per layer: the attention's and the MLP's write, and the residual after the block (running sum)."""
        running, rows = self.embed, []
        for layer, (a, m) in enumerate(zip(self.attn, self.mlp)):
            running += a + m
            rows.append({"layer": layer, "attn_write": a, "mlp_write": m, "resid_after": running})
        return pd.DataFrame(rows)

    def summary(self) -> str:
        kind, layer = self.top_writer()
        writer = "the embedding" if layer is None else f"layer {layer}'s {'attention' if kind == 'attn' else 'MLP'}"
        norm = " (through a post-sub-layer norm)" if self.post_norm and layer is not None else ""
        peak = self.to_pandas().resid_after.abs().max()
        return (f"dim {self.dim} at position {self.position}: |h| up to {peak:.4g}, {self.residual:.4g} after the last block; "
                f"its largest write is {writer}{norm}, the embedding gives {self.embed:.4g}")

    def headline(self) -> dict[str, Any]:
        kind, layer = self.top_writer()
        return {"dim": self.dim, "position": self.position, "value": self.residual, "embed": self.embed,
                "top_writer": kind if layer is None else f"{kind} {layer}", "post_norm": self.post_norm}


def _at(position: int, absolute: bool) -> Any:
    """Sum over the batch of the state at ``position``, every dimension (|h| with ``absolute``): [d], on the device."""
    return lambda x: (x[:, position].abs() if absolute else x[:, position]).double().sum(dim=0)


@takes_token_inputs
@one_adapter_per_call
def massive_writes(model: Any, inputs: Int[Tensor, "n seq"], *, dim: int | None = None, position: int = 0, batch_size: int | None = None,
                   progress: bool = True) -> MassiveWrites:
    """The writes into residual dimension ``dim`` at ``position``, averaged over ``inputs``' sequences.

    Args:
        model: a TransformerLens model (not modified).
        inputs: token IDs ``[n, seq]``.
        dim: the residual dimension (default: the one whose mean |h| at ``position`` peaks highest over the block
            outputs).
        position: the token position (0: the first token, where massive activations live).
        batch_size: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.
        progress: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.

    Returns:
        A :class:`MassiveWrites`.
    """
    adapter = ModelAdapter.of(model)
    info = adapter.info
    if not 0 <= position < inputs.shape[1]:
        raise LensBiasError(f"position {position} is outside sequences of {inputs.shape[1]} tokens")
    if dim is not None and not 0 <= dim < info.d_model:
        raise LensBiasError(f"dim {dim} is outside the residual stream's {info.d_model} dimensions")
    last = f"blocks.{info.n_layers - 1}.hook_resid_post"
    hooks = ["blocks.0.hook_resid_pre", last] + [f"blocks.{l}.hook_{part}_out" for l in range(info.n_layers) for part in ("attn", "mlp")]
    missing = [h for h in hooks if not adapter.has_hook(h)]
    if missing:
        raise LensBiasError(f"massive_writes reads {missing[0]}, which this model does not have")
    # one pass keeps every dimension at the position ([d] per hook): the default dim is chosen from the same pass
    outputs = [f"blocks.{l}.hook_resid_post" for l in range(info.n_layers)] if dim is None else []
    probes = [Probe(h, f"at_{position}", _at(position, False), combine="sum") for h in hooks]
    peaks = [Probe(h, f"abs_at_{position}", _at(position, True), combine="sum") for h in outputs]
    kept = adapter.collect(inputs, probes + peaks, batch_size=batch_size, progress=progress, desc="massive writes")
    if dim is None:  # the dimension whose mean |h| at the position peaks highest over the block outputs
        dim = int(torch.stack([kept[p.key] for p in peaks]).amax(dim=0).argmax())
    mean = {p.hook: float(kept[p.key][dim]) / inputs.shape[0] for p in probes}
    names = {name for name, _ in model.named_modules()}
    post_norm = any(n.endswith(("ln2_post", "post_feedforward_layernorm")) for n in names)
    return MassiveWrites(
        dim=dim, position=position, embed=mean["blocks.0.hook_resid_pre"],
        attn=[mean[f"blocks.{l}.hook_attn_out"] for l in range(info.n_layers)],
        mlp=[mean[f"blocks.{l}.hook_mlp_out"] for l in range(info.n_layers)],
        residual=mean[last], post_norm=post_norm, n=int(inputs.shape[0]),
    )
