"""Super neurons, dimension disparity and massive activations: how a high-variance token becomes a sink.

For a chosen position p (default 0, the first token), per layer:
- super neurons: MLP units (``mlp.hook_post``, the down-projection's input) whose mean |activation| at p is
  extreme relative to the other positions of the same sequences. Ranked by that ratio; each unit's
  down-projection row W_out[u] ([d_mlp, d_model] in TransformerLens, HF down_proj[:, u]) is summarised by the
  residual dimensions it writes into most and its heavy-tailedness max|w| / mean|w|.
- dimension disparity: the dominance ratio max_d |x_d| / mean_d |x_d| of the post-norm representation that
  enters each block (``ln1.hook_normalized``) at p, against the same ratio at the other positions (Llama-2-7B
  has ≈ 263× at layer 2's input; Gaussian noise of width d has ≈ √(2 ln 2d)/√(2/π)).
- massive activations (Sun et al.): top-3 |h| and the median |h| of each block's output (``hook_resid_post``)
  over all positions and dimensions; massive means |h| > ``massive_abs`` and ≥ ``massive_ratio`` × the median.
  Small models rarely reach the absolute 100, so the scale-free max/median is reported too.
- super activation (Yu et al.): the largest |value| entering (``mlp.hook_post``) and leaving (``hook_mlp_out``)
  each MLP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping

import pandas as pd
import torch
from jaxtyping import Float
from lens_bias.analyses.base import Analysis, Result
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter, ModelInfo, Probe
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import InputSpec

__all__ = ["SuperNeurons", "SuperNeuronsResult", "dominance_ratio"]


def dominance_ratio(x: Float[Tensor, "... d"]) -> Float[Tensor, "..."]:
    """max_d |x_d| / mean_d |x_d| (1 for a constant-magnitude vector, d for a one-hot one).

    >>> dominance_ratio(torch.tensor([4.0, 0.0, 0.0, 0.0]))
    tensor(4.)
    """
    a = x.float().abs()
    return a.max(dim=-1).values / a.mean(dim=-1)


def _check_position(position: int, seq_len: int) -> None:
    if position >= seq_len:
        raise LensBiasError(f"super_neurons: position {position} is outside sequences of {seq_len} tokens; pick position < {seq_len}")


def _unit_probe(hook: str, position: int) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d_mlp] -> [batch, 2, d_mlp]: |a| at p, mean |a| elsewhere
        _check_position(position, x.shape[1])
        a = x.float().abs()
        others = torch.cat([a[:, :position], a[:, position + 1 :]], dim=1).mean(dim=1)
        return torch.stack([a[:, position], others], dim=1)

    return Probe(hook, f"unit_magnitude@{position}", fn)


def _dominance_probe(hook: str, position: int) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [batch, 2]: ratio at p, median ratio elsewhere
        _check_position(position, x.shape[1])
        ratios = dominance_ratio(x)
        others = torch.cat([ratios[:, :position], ratios[:, position + 1 :]], dim=1)
        return torch.stack([ratios[:, position], others.median(dim=1).values], dim=1)

    return Probe(hook, f"dominance@{position}", fn)


def _massive(x: Tensor) -> Tensor:  # [batch, pos, d] -> [batch, 4]: top-3 |h| and the median |h|
    a = x.float().abs().flatten(1)
    return torch.cat([a.topk(3, dim=1).values, a.median(dim=1, keepdim=True).values], dim=1)


def _max_abs(x: Tensor) -> Tensor:  # [batch, ...] -> [batch]
    return x.float().abs().flatten(1).max(dim=1).values


@dataclass
class SuperNeuronsResult(Result):
    """Per layer: units ranked by how selectively they fire at one position, and the outlier measures."""

    position: int
    unit_at: Float[Tensor, "layer d_mlp"]  # mean |activation| at the position
    unit_elsewhere: Float[Tensor, "layer d_mlp"]  # mean |activation| at the other positions
    w_out: Float[Tensor, "layer d_mlp d_model"] | None  # down-projection rows (None when the model exposes none)
    dominance_at: Float[Tensor, "layer"]  # mean over sequences, post-norm input of each block
    dominance_elsewhere: Float[Tensor, "layer"]
    massive_top: Float[Tensor, "layer 3"]  # top-3 |h| of each block's output (max over sequences)
    massive_median: Float[Tensor, "layer"]  # median |h| (mean over sequences)
    mlp_in_max: Float[Tensor, "layer"]
    mlp_out_max: Float[Tensor, "layer"]
    massive_abs: float
    massive_ratio: float

    heading = "Super neurons"
    headline_labels = {"top_unit_ratio": "top unit, first token vs elsewhere", "resid_max_over_median": "residual max/median |h|"}

    @property
    def unit_ratio(self) -> Float[Tensor, "layer d_mlp"]:
        """Selectivity of each unit for the position: mean |a| there over mean |a| elsewhere."""
        return self.unit_at / self.unit_elsewhere.clamp_min(1e-12)

    def units(self, top: int = 5) -> pd.DataFrame:
        """The ``top`` most position-selective units of every layer, with where their down-projection writes."""
        rows = []
        ratio = self.unit_ratio
        for layer in range(ratio.shape[0]):
            values, units = ratio[layer].topk(min(top, ratio.shape[1]))
            for rank, (value, unit) in enumerate(zip(values.tolist(), units.tolist())):
                row = {"layer": layer, "rank": rank, "unit": unit, "ratio": value, "act_at": self.unit_at[layer, unit].item(),
                       "act_elsewhere": self.unit_elsewhere[layer, unit].item()}
                if self.w_out is not None:
                    w = self.w_out[layer, unit].abs()
                    dims = w.topk(min(3, w.numel())).indices.tolist()
                    row.update({"write_norm": self.unit_at[layer, unit].item() * w.norm().item(), "top_dims": dims,
                                "row_max_over_mean": (w.max() / w.mean()).item()})
                rows.append(row)
        return pd.DataFrame(rows)

    def is_massive(self) -> Tensor:
        top1 = self.massive_top[:, 0]
        return (top1 > self.massive_abs) & (top1 >= self.massive_ratio * self.massive_median)

    def summary(self) -> str:
        h = self.headline()
        return (
            f"super neurons at position {self.position}: most selective unit {h['top_unit']} in layer {h['top_unit_layer']} "
            f"(mean |activation| {h['top_unit_ratio']:.1f}× its value at the other positions)\n"
            f"  dimension disparity (max/mean |x| after the pre-attention norm): position {self.position} up to "
            f"{h['dominance_at_max']:.1f}, other positions up to {h['dominance_elsewhere_max']:.1f}\n"
            f"  residual max/median |h| up to {h['resid_max_over_median']:.0f}; massive activations (>{self.massive_abs:g} and "
            f"≥{self.massive_ratio:g}× median) in layers {h['massive_layers'] or 'none'}"
        )

    def to_pandas(self) -> pd.DataFrame:
        ratio = self.unit_ratio
        best = ratio.max(dim=1)
        return pd.DataFrame(
            {
                "layer": range(ratio.shape[0]),
                "top_unit": best.indices.tolist(),
                "top_unit_ratio": best.values.tolist(),
                "dominance_at": self.dominance_at.tolist(),
                "dominance_elsewhere": self.dominance_elsewhere.tolist(),
                "resid_top1": self.massive_top[:, 0].tolist(),
                "resid_median": self.massive_median.tolist(),
                "resid_max_over_median": (self.massive_top[:, 0] / self.massive_median).tolist(),
                "massive": self.is_massive().tolist(),
                "mlp_in_max": self.mlp_in_max.tolist(),
                "mlp_out_max": self.mlp_out_max.tolist(),
            }
        )

    def headline(self) -> dict[str, Any]:
        ratio = self.unit_ratio
        flat = int(ratio.argmax())
        return {
            "position": self.position,
            "top_unit_layer": flat // ratio.shape[1],
            "top_unit": flat % ratio.shape[1],
            "top_unit_ratio": ratio.max().item(),
            "dominance_at_max": self.dominance_at.max().item(),
            "dominance_elsewhere_max": self.dominance_elsewhere.max().item(),
            "resid_max_over_median": (self.massive_top[:, 0] / self.massive_median).max().item(),
            "massive_layers": [i for i, m in enumerate(self.is_massive().tolist()) if m],
        }


@dataclass(frozen=True)
class SuperNeurons(Analysis):
    """Position-selective MLP units, dimension disparity and massive activations (see module docstring)."""

    name: ClassVar[str] = "super_neurons"
    result_type = SuperNeuronsResult
    order = 70
    # The sink position whose outlier status is measured; 0 is the first token.
    position: int = 0
    # Sun et al.'s absolute threshold for a massive activation in 7B models.
    massive_abs: float = 100.0
    # ... and its ratio to the median |h| of the same hidden state.
    massive_ratio: float = 1000.0

    def __post_init__(self) -> None:
        if isinstance(self.position, bool) or not isinstance(self.position, int) or self.position < 0:
            raise LensBiasError(f"position must be a non-negative int, got {self.position!r}")

    def applies_to(self, info: ModelInfo) -> bool:
        return not info.attn_only  # no MLP units to rank

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        p, probes = self.position, {}
        for layer in range(adapter.info.n_layers):
            probes["units", layer] = _unit_probe(f"blocks.{layer}.mlp.hook_post", p)
            probes["mlp_in_max", layer] = Probe(f"blocks.{layer}.mlp.hook_post", "max_abs", _max_abs)
            probes["mlp_out_max", layer] = Probe(f"blocks.{layer}.hook_mlp_out", "max_abs", _max_abs)
            probes["dominance", layer] = _dominance_probe(f"blocks.{layer}.ln1.hook_normalized", p)
            probes["massive", layer] = Probe(f"blocks.{layer}.hook_resid_post", "massive", _massive)
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> SuperNeuronsResult:
        layers, p = range(adapter.info.n_layers), self.position
        units = torch.stack([kept["units", layer].mean(dim=0) for layer in layers])
        dominance = torch.stack([kept["dominance", layer].mean(dim=0) for layer in layers])
        massive = torch.stack([kept["massive", layer] for layer in layers])  # [layer, n, 4]
        blocks = getattr(adapter.model, "blocks", None)
        try:
            w_out = torch.stack([blocks[layer].mlp.W_out.detach().float().cpu() for layer in layers])
        except (AttributeError, TypeError):  # a HookedRootModule without TL weight names
            w_out = None
        return SuperNeuronsResult(
            position=p,
            unit_at=units[:, 0],
            unit_elsewhere=units[:, 1],
            w_out=w_out,
            dominance_at=dominance[:, 0],
            dominance_elsewhere=dominance[:, 1],
            massive_top=massive[..., :3].max(dim=1).values,
            massive_median=massive[..., 3].mean(dim=1),
            mlp_in_max=torch.stack([kept["mlp_in_max", layer].max() for layer in layers]),
            mlp_out_max=torch.stack([kept["mlp_out_max", layer].max() for layer in layers]),
            massive_abs=self.massive_abs,
            massive_ratio=self.massive_ratio,
        )
