"""Super neurons, dimension disparity and massive activations: how a high-variance token becomes a sink.

For a chosen position p (default 0, the first token), per layer:
- super neurons, ranked by what makes them super (Yu et al.'s recipe): an MLP unit's mean activation at p
  (``mlp.hook_post``, the down-projection's input) times its down-projection weight into the **massive
  dimension** j* — the residual dimension whose mean |h| at p is largest over the block outputs — is what the
  unit writes into the massive activation. Units are ranked by that write; the input spike (mean |a| at p)
  stands beside it. The selectivity ratio, mean |a| at p over mean |a| at the other positions, stays as a
  column, with the layer's median unit as the denominator's floor: a unit silent everywhere cannot divide by
  its own near-zero.
- dimension disparity: the dominance ratio max_d |x_d| / mean_d |x_d| of the post-norm representation that
  enters each block (``ln1.hook_normalized``) at p, against the same ratio at the other positions (Llama-2-7B
  has ≈ 263× at layer 2's input; Gaussian noise of width d has ≈ √(2 ln 2d)/√(2/π)).
- massive activations (Sun et al.): top-3 |h| and the median |h| of each block's output (``hook_resid_post``)
  over all positions and dimensions; massive means |h| > ``massive_abs`` and ≥ ``massive_ratio`` × the median.
- super activation (Yu et al.): the largest |value| entering (``mlp.hook_post``) and leaving (``hook_mlp_out``)
  each MLP.
Unit and dimension statistics are summed inside the hooks, one row per batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_bias.analyses.base import Analysis, Result
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import InputSpec
from lens_bias.core.model_facts import ModelInfo
from lens_bias.core.offload import read_weight
from lens_bias.core.probes import Probe

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
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d_mlp] -> [3, d_mlp]: Σ |a| at p, Σ a at p, Σ mean |a| elsewhere
        _check_position(position, x.shape[1])
        a = x.float()
        others = torch.cat([a[:, :position], a[:, position + 1 :]], dim=1).abs().mean(dim=1)
        return torch.stack([a[:, position].abs().sum(0), a[:, position].sum(0), others.sum(0)])

    return Probe(hook, f"unit_sums@{position}", fn, combine="sum")


def _abs_sum_probe(hook: str, position: int) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [d]: Σ |h| at p over the batch
        _check_position(position, x.shape[1])
        return x[:, position].float().abs().sum(0)

    return Probe(hook, f"abs_sum@{position}", fn, combine="sum")


def _dominance_probe(hook: str, position: int) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [2]: Σ ratio at p, Σ median ratio elsewhere
        _check_position(position, x.shape[1])
        ratios = dominance_ratio(x)
        others = torch.cat([ratios[:, :position], ratios[:, position + 1 :]], dim=1)
        return torch.stack([ratios[:, position].sum(), others.median(dim=1).values.sum()])

    return Probe(hook, f"dominance_sum@{position}", fn, combine="sum")


def _top3(x: Tensor) -> Tensor:  # [batch, pos, d] -> [3]: each rank's largest of the sequences' top-3 |h|
    return x.float().abs().flatten(1).topk(3, dim=1).values.max(dim=0).values


def _median_sum(x: Tensor) -> Tensor:  # [batch, pos, d] -> []: Σ over the batch of each sequence's median |h|
    return x.float().abs().flatten(1).median(dim=1).values.sum()


def _max_abs(x: Tensor) -> Tensor:  # [batch, ...] -> []
    return x.float().abs().max()


@dataclass
class SuperNeuronsResult(Result):
    """Per layer and MLP unit: what it writes into the massive dimension at one position; the outlier measures."""
    column_words: ClassVar[Mapping[str, str]] = {
        "top_unit": "top unit", "top_unit_writes": "top unit's write into the massive dim", "massive_dim_value": "massive dim mean |h_0|",
        "dominance_at": "disparity max/mean |x_0|", "dominance_elsewhere": "disparity at other positions", "resid_top1": "largest |h|",
        "resid_median": "median |h|", "resid_max_over_median": "largest / median |h| (×)", "mlp_in_max": "MLP input max |x|",
        "mlp_out_max": "MLP output max |y|", "massive": "massive (> 100 and ≥ 1000× median)",
    }

    position: int
    massive_dim: int  # j*: the residual dimension with the largest mean |h| at the position over the block outputs
    unit_at: Float[Tensor, "layer d_mlp"]  # mean |activation| at the position: the input spike
    unit_signed_at: Float[Tensor, "layer d_mlp"]  # mean activation at the position
    unit_elsewhere: Float[Tensor, "layer d_mlp"]  # mean |activation| at the other positions
    w_massive: Float[Tensor, "layer d_mlp"]  # W_out[unit, j*]: each unit's down-projection weight into the massive dim
    row_norm: Float[Tensor, "layer d_mlp"]  # ‖W_out[unit]‖ (HF down_proj[:, unit])
    row_max_over_mean: Float[Tensor, "layer d_mlp"]  # max|w| / mean|w| of that row: its heavy tail
    row_top_dims: Int[Tensor, "layer d_mlp 3"]  # the residual dims it writes into most
    resid_at: Float[Tensor, "layer d_model"]  # mean |h| at the position of each block's output, per dimension
    dominance_at: Float[Tensor, "layer"]  # mean over sequences, post-norm input of each block
    dominance_elsewhere: Float[Tensor, "layer"]
    massive_top: Float[Tensor, "layer 3"]  # top-3 |h| of each block's output (max over sequences)
    massive_median: Float[Tensor, "layer"]  # median |h| (mean over sequences)
    mlp_in_max: Float[Tensor, "layer"]
    mlp_out_max: Float[Tensor, "layer"]
    massive_abs: float
    massive_ratio: float

    heading = "Super neurons"
    trained_headline = ()  # in the anatomy
    init_headline = ("dominance_at_max", "resid_max_over_median")  # no massive dim at init: nothing to write into
    key_column = "massive_dim_value"
    headline_labels = {"top_unit_writes": "top super neuron's write into the massive dim", "massive_dim": "massive dim",
                       "dominance_at_max": "dimension disparity at the position", "resid_max_over_median": "residual max/median |h|"}

    @property
    def writes(self) -> Float[Tensor, "layer d_mlp"]:
        """What each unit writes into the massive dimension at the position: mean activation × W_out[unit, j*]."""
        return self.unit_signed_at * self.w_massive

    @property
    def selectivity(self) -> Float[Tensor, "layer d_mlp"]:
        """mean |a| at the position over mean |a| elsewhere, the denominator floored at the layer's median unit."""
        floor = self.unit_elsewhere.median(dim=1, keepdim=True).values
        return self.unit_at / torch.maximum(self.unit_elsewhere, floor).clamp_min(1e-12)

    def ranked_units(self, top: int = 10) -> list[tuple[int, int]]:
        """The ``top`` (layer, unit) pairs that write the most into the massive dimension, by |write| (by the input
        spike where the model exposes no ``W_out``)."""
        score = self.writes.abs()
        flat = (self.unit_at if torch.isnan(score).all() else score.nan_to_num(-1.0)).flatten()
        d_mlp = self.writes.shape[1]
        return [divmod(int(i), d_mlp) for i in flat.topk(min(top, flat.numel())).indices]

    def units(self, top: int = 10) -> pd.DataFrame:
        """The ``top`` super neurons over all layers, by what they write into the massive dimension."""
        rows = []
        for rank, (layer, unit) in enumerate(self.ranked_units(top)):
            value = self.resid_at[layer, self.massive_dim].item()
            rows.append({
                "rank": rank, "layer": layer, "unit": unit, "writes": self.writes[layer, unit].item(),
                "share_of_massive": self.writes[layer, unit].item() / value if value else float("nan"),
                "act_at": self.unit_at[layer, unit].item(), "act_elsewhere": self.unit_elsewhere[layer, unit].item(),
                "selectivity": self.selectivity[layer, unit].item(), "w_massive": self.w_massive[layer, unit].item(),
                "row_max_over_mean": self.row_max_over_mean[layer, unit].item(), "top_dims": self.row_top_dims[layer, unit].tolist(),
            })
        return pd.DataFrame(rows)

    def is_massive(self) -> Tensor:
        top1 = self.massive_top[:, 0]
        return (top1 > self.massive_abs) & (top1 >= self.massive_ratio * self.massive_median)

    def summary(self) -> str:
        h = self.headline()
        return (
            f"super neurons at position {self.position} (ranked by what they write into the massive dim {h['massive_dim']}, mean |h| up to "
            f"{h['massive_dim_value']:.4g}): unit {h['top_unit']} in layer {h['top_unit_layer']} writes {h['top_unit_writes']:.4g} "
            f"({h['top_unit_share']:.0%} of the dim's value after that block) from a mean activation of {h['top_unit_act']:.4g} "
            f"(selectivity {h['top_unit_selectivity']:.1f}× the other positions)\n"
            f"  dimension disparity (max/mean |x| after the pre-attention norm): position {self.position} up to "
            f"{h['dominance_at_max']:.1f}, other positions up to {h['dominance_elsewhere_max']:.1f}\n"
            f"  residual max/median |h| up to {h['resid_max_over_median']:.0f}; massive activations (>{self.massive_abs:g} and "
            f"≥{self.massive_ratio:g}× median) in layers {h['massive_layers'] or 'none'}"
        )

    def to_pandas(self) -> pd.DataFrame:
        writes = self.writes.abs()
        best = writes.max(dim=1)
        return pd.DataFrame(
            {
                "layer": range(writes.shape[0]),
                "top_unit": best.indices.tolist(),
                "top_unit_writes": [self.writes[layer, unit].item() for layer, unit in enumerate(best.indices.tolist())],
                "massive_dim_value": self.resid_at[:, self.massive_dim].tolist(),
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
        layer, unit = self.ranked_units(1)[0]
        value = self.resid_at[layer, self.massive_dim].item()
        return {
            "position": self.position,
            "massive_dim": self.massive_dim,
            "massive_dim_value": self.resid_at[:, self.massive_dim].max().item(),
            "top_unit_layer": layer,
            "top_unit": unit,
            "top_unit_writes": self.writes[layer, unit].item(),
            "top_unit_share": self.writes[layer, unit].item() / value if value else float("nan"),
            "top_unit_act": self.unit_at[layer, unit].item(),
            "top_unit_selectivity": self.selectivity[layer, unit].item(),
            "dominance_at_max": self.dominance_at.max().item(),
            "dominance_at_argmax": int(self.dominance_at.argmax()),
            "dominance_elsewhere_max": self.dominance_elsewhere.max().item(),
            "resid_max_over_median": (self.massive_top[:, 0] / self.massive_median).max().item(),
            "massive_layers": [i for i, m in enumerate(self.is_massive().tolist()) if m],
        }


@dataclass(frozen=True)
class SuperNeurons(Analysis[SuperNeuronsResult]):
    """Super neurons ranked by their write into the massive dimension, dimension disparity and massive activations."""

    name: ClassVar[str] = "super_neurons"
    order = 70
    trained_order = 30
    # The sink position whose outlier status is measured; 0 is the first token.
    position: int = 0
    # Sun et al.'s absolute threshold for a massive activation in 7B models.
    massive_abs: float = 100.0
    # ... and its ratio to the median |h| of the same hidden state.
    massive_ratio: float = 1000.0

    def __post_init__(self) -> None:
        if isinstance(self.position, bool) or not isinstance(self.position, int) or self.position < 0:
            raise LensBiasError(f"position must be a non-negative int, got {self.position!r}")

    dense_mlp_only = True  # ranks one MLP's units per layer, not each expert's

    def applies_to(self, info: ModelInfo) -> bool:
        return not info.attn_only  # no MLP units to rank

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        p, probes = self.position, dict[Hashable, Probe]()
        for layer in range(adapter.info.n_layers):
            probes["units", layer] = _unit_probe(f"blocks.{layer}.mlp.hook_post", p)
            probes["mlp_in_max", layer] = Probe(f"blocks.{layer}.mlp.hook_post", "max_abs", _max_abs, combine="max")
            probes["mlp_out_max", layer] = Probe(f"blocks.{layer}.hook_mlp_out", "max_abs", _max_abs, combine="max")
            probes["dominance", layer] = _dominance_probe(f"blocks.{layer}.ln1.hook_normalized", p)
            probes["massive_top", layer] = Probe(f"blocks.{layer}.hook_resid_post", "top3_max", _top3, combine="max")
            probes["massive_median", layer] = Probe(f"blocks.{layer}.hook_resid_post", "median_sum", _median_sum, combine="sum")
            probes["resid", layer] = _abs_sum_probe(f"blocks.{layer}.hook_resid_post", p)
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> SuperNeuronsResult:
        layers, n = range(adapter.info.n_layers), spec.n
        units = torch.stack([kept["units", layer] / n for layer in layers]).float()  # [layer, 3, d_mlp]
        resid = torch.stack([kept["resid", layer] / n for layer in layers]).float()  # [layer, d_model]
        massive_dim = int(resid.max(dim=0).values.argmax())
        dominance = torch.stack([kept["dominance", layer] / n for layer in layers]).float()  # [layer, 2]
        blocks: Any = getattr(adapter.model, "blocks", None)
        try:
            w_out = [read_weight(blocks[layer].mlp, "W_out").float().cpu() for layer in layers]  # each [d_mlp, d_model]
        except (AttributeError, TypeError):  # a HookedRootModule without TL weight names: no writes to rank by
            w_out = [torch.full((units.shape[-1], resid.shape[-1]), float("nan")) for _ in layers]
        magnitude = [w.abs() for w in w_out]
        return SuperNeuronsResult(
            position=self.position,
            massive_dim=massive_dim,
            unit_at=units[:, 0],
            unit_signed_at=units[:, 1],
            unit_elsewhere=units[:, 2],
            w_massive=torch.stack([w[:, massive_dim] for w in w_out]),
            row_norm=torch.stack([w.norm(dim=1) for w in w_out]),
            row_max_over_mean=torch.stack([m.max(dim=1).values / m.mean(dim=1).clamp_min(1e-12) for m in magnitude]),
            row_top_dims=torch.stack([m.topk(min(3, m.shape[1]), dim=1).indices for m in magnitude]),
            resid_at=resid,
            dominance_at=dominance[:, 0],
            dominance_elsewhere=dominance[:, 1],
            massive_top=torch.stack([kept["massive_top", layer] for layer in layers]),
            massive_median=torch.stack([kept["massive_median", layer] / n for layer in layers]).float(),
            mlp_in_max=torch.stack([kept["mlp_in_max", layer] for layer in layers]),
            mlp_out_max=torch.stack([kept["mlp_out_max", layer] for layer in layers]),
            massive_abs=self.massive_abs,
            massive_ratio=self.massive_ratio,
        )
