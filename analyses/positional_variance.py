"""Positional variance discrepancy: how the spread of attention outputs across sequences falls with position.

Causal attention at position t averages t + 1 value vectors, the first token's output is a single one. Over
random sequences the dimension-wise std of the attention output is therefore largest at position 0 and, for
near-uniform attention over independent values, std_t / std_0 = (t + 1)^-1/2 (t 0-based; "t^-1/2 with t counted
from 1"). Measured per head before W_O (``attn.hook_z``) and per layer after it (``hook_attn_out``):

    std_t = sqrt(mean over dimensions of Var over sequences of x[:, t, d]),   r_t = std_t / std_0,

and the exponent α of r_t ∝ (t + 1)^-α by least squares on log–log axes (α = 0.5 at init). Moments are summed
inside the hooks and added up over batches, so memory does not grow with the number of sequences.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from lens_bias.analyses.base import Analysis, Result
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import integer_ticks, new_figure
from lens_bias.core.inputs import InputSpec
from lens_bias.core.probes import Probe

__all__ = ["PositionalVariance", "PositionalVarianceResult", "fit_exponent", "profile_spread"]


def _moments(x: Tensor) -> Tensor:
    """[batch, pos, ...] -> [3, pos, ...]: this batch's count, Σx and Σx² over sequences."""
    x = x.float()
    return torch.stack([torch.full_like(x[0], x.shape[0]), x.sum(dim=0), x.pow(2).sum(dim=0)])


def _moment_probe(hook: str) -> Probe:
    return Probe(hook, "sequence_moments", _moments, combine="sum")


def _std(moments: Tensor) -> Tensor:
    """Moments summed over every sequence [3, pos, ..., d] -> std over sequences pooled over the last axis [pos, ...]."""
    count, total, squares = moments
    mean = total / count
    var = (squares / count - mean.pow(2)) * count / (count - 1)  # unbiased over sequences
    return var.clamp_min(0).mean(dim=-1).sqrt().float()


def _relative(std: Tensor) -> Tensor:
    """std_t / std_0 along the last axis; NaN where std_0 is 0 (every sequence alike at position 0, e.g. one BOS)."""
    first = std[..., :1]
    return torch.where(first > 0, std / first.clamp_min(torch.finfo(std.dtype).tiny), torch.full_like(std, float("nan")))


def fit_exponent(std: Float[Tensor, "... pos"], max_position: int | None = None) -> Float[Tensor, "..."]:
    """α of std_t ∝ (t + 1)^-α, least squares of log std_t on log(t + 1) over positions 0..max_position.

    >>> t = torch.arange(64.0)
    >>> round(fit_exponent((t + 1) ** -0.5).item(), 6)
    0.5

    Args:
        std: per-position stds, position last.
        max_position: last position used in the fit (default: all).

    Returns:
        α for every leading index.
    """
    std = std[..., : None if max_position is None else max_position + 1]
    x = torch.log(torch.arange(1, std.shape[-1] + 1, dtype=torch.float64))
    y = torch.log(std.double())
    x = x - x.mean()
    slope = ((y - y.mean(dim=-1, keepdim=True)) * x).sum(dim=-1) / x.pow(2).sum()
    return (-slope).float()


@dataclass
class PositionalVarianceResult(Result):
    """Per-position std across sequences of each head's output (before W_O) and each layer's (after W_O)."""
    column_words: ClassVar[Mapping[str, str]] = {
        "std_out": "std across sequences", "r_out": "r_t = std_t / std_0", "r_out_sqrt_t": "r_t · √(t+1)",
        r"r_z_head(\d+)": r"r_t of head \1 before W_O",
    }

    heading = "Positional variance"
    trained_headline = ("r_last_median",)  # the fitted α tests the init law
    key_column = "r_out"
    headline_labels = {"alpha_out": "α of r_t, layer 0", "r_last_median": "median r_T−1 over layers"}
    plot_caption = "positional variance r_t"

    std_z: Float[Tensor, "layer head pos"]  # before W_O, pooled over d_head
    std_out: Float[Tensor, "layer pos"]  # after W_O, pooled over d_model
    n: int
    # "init": the summary compares r_t with causal averaging's (t+1)^-1/2 law, which holds only at initialisation;
    # "trained": it reports the profile as measured.
    regime: str = "init"

    @property
    def r_z(self) -> Float[Tensor, "layer head pos"]:
        return _relative(self.std_z)

    @property
    def r_out(self) -> Float[Tensor, "layer pos"]:
        return _relative(self.std_out)

    def alpha_z(self, max_position: int = 64) -> Float[Tensor, "layer head"]:
        return fit_exponent(self.std_z, max_position)

    def alpha_out(self, max_position: int = 64) -> Float[Tensor, "layer"]:
        return fit_exponent(self.std_out, max_position)

    def law_deviation(self, max_position: int = 64) -> Float[Tensor, "layer"]:
        """max over t ≤ max_position of |r_t·√(t+1) − 1| for each layer's output (0 for an exact (t+1)^-1/2 law)."""
        r = self.r_out[:, : max_position + 1]
        return (r * torch.arange(1, r.shape[1] + 1).sqrt() - 1).abs().max(dim=1).values

    def plot(self, layers: Sequence[int] | None = None) -> Any:
        """r_t against t + 1 on log–log axes, one line per layer with the (t+1)^-1/2 law of an init; for a deep or
        trained model (more than 8 layers or regime "trained", unless ``layers`` picks a few) a layer × position
        heatmap of log10 r_t instead."""
        fig = new_figure()
        ax = fig.subplots()
        r = self.r_out
        if layers is None and (r.shape[0] > 8 or self.regime == "trained"):
            image = ax.imshow(torch.log10(r).numpy(), aspect="auto", cmap="magma", interpolation="nearest")
            integer_ticks(ax, *r.shape)
            ax.set_xlabel("position t")
            ax.set_ylabel("layer")
            ax.set_title("log10 r_t = log10(std_t / std_0) after W_O")
            fig.colorbar(image, ax=ax)
            return fig
        t = torch.arange(1, r.shape[1] + 1).float()
        for layer in range(r.shape[0]) if layers is None else layers:
            ax.loglog(t, r[layer], marker=".", label=f"layer {layer}")
        if self.regime == "init":
            ax.loglog(t, t**-0.5, "k--", label="(t+1)^-1/2")
        ax.set_xlabel("position t + 1")
        ax.set_ylabel("std_t / std_0")
        ax.legend(fontsize=7)
        return fig

    def to_pandas(self) -> pd.DataFrame:
        """One row per (layer, position): r_t after W_O, r_t·√(t+1), and the heads' r_t before W_O."""
        n_layers, n_heads, n_pos = self.std_z.shape
        r_z, r_out = self.r_z, self.r_out
        rows = []
        for layer in range(n_layers):
            for t in range(n_pos):
                row = {"layer": layer, "position": t, "std_out": self.std_out[layer, t].item(), "r_out": r_out[layer, t].item(),
                       "r_out_sqrt_t": r_out[layer, t].item() * (t + 1) ** 0.5}
                row.update({f"r_z_head{h}": r_z[layer, h, t].item() for h in range(n_heads)})
                rows.append(row)
        return pd.DataFrame(rows)

    def headline(self) -> dict[str, Any]:
        out = {
            "alpha_out": self.alpha_out().tolist(),
            "alpha_z_mean": self.alpha_z().mean(dim=1).tolist(),
            "r_out_last": self.r_out[:, -1].tolist(),
            "r_last_median": self.r_out[:, -1].nanmedian().item(),
        }
        if self.regime == "init":  # the law holds at initialisation only
            out["law_deviation_layer0"] = self.law_deviation()[0].item()
        return out

    def _shown_layers(self, most: int = 8) -> list[int]:
        """Every layer of a shallow model; of a deep one the first two, the last two and those of extreme α."""
        n_layers = self.std_out.shape[0]
        if n_layers <= most:
            return list(range(n_layers))
        alpha = self.alpha_out()
        extremes = {int(alpha.nan_to_num(-1e9).argmax()), int(alpha.nan_to_num(1e9).argmin())}
        return sorted({0, 1, n_layers - 2, n_layers - 1} | extremes)

    def summary(self) -> str:
        t = self.std_out.shape[1]
        alpha, alpha_z, r_last = self.alpha_out().tolist(), self.alpha_z(), self.r_out[:, -1].tolist()
        shown = self._shown_layers()
        if self.regime == "init":
            deviation = self.law_deviation().tolist()
            rows = [f"  layer {layer}: α after W_O {alpha[layer]:.3f}, heads before W_O {alpha_z[layer].min():.3f}…{alpha_z[layer].max():.3f}; "
                    f"r_{t - 1} = {r_last[layer]:.3f} (t^-1/2 law: {t ** -0.5:.3f}), max |r_t·√(t+1) − 1| {deviation[layer]:.3f}" for layer in shown]
            head = (f"positional variance (std across {self.n} sequences at each position, r_t = std_t / std_0, fitted r_t ∝ (t+1)^-α; "
                    "causal averaging at init gives α = 0.5):")
        else:
            rows = [f"  layer {layer}: α after W_O {alpha[layer]:.3f}, heads before W_O {alpha_z[layer].min():.3f}…{alpha_z[layer].max():.3f}; "
                    f"r_{t - 1} = {r_last[layer]:.3f}" for layer in shown]
            head = (f"positional variance of a trained model (std across {self.n} sequences at each position, r_t = std_t / std_0, "
                    "fitted r_t ∝ (t+1)^-α; the init law does not apply):")
        if len(shown) < len(alpha):
            rows.append(f"  … {len(alpha) - len(shown)} more layers in to_pandas() and the figure")
        return head + "\n" + "\n".join(rows)


def profile_spread(*results: PositionalVarianceResult) -> float:
    """Largest relative difference of r_t (after W_O, every layer and position) between results, e.g. two seeds.

    Args:
        *results: at least two results over the same layers and positions.

    Returns:
        max |r_a − r_b| / r_b over pairs, layers and positions.
    """
    if len(results) < 2:
        raise LensBiasError("profile_spread compares at least two results (e.g. the same architecture at two seeds)")
    shapes = {tuple(r.std_out.shape) for r in results}
    if len(shapes) > 1:
        raise LensBiasError(f"results have different (layer, position) shapes {sorted(shapes)}: use the same model shape and seq_len")
    r = torch.stack([res.r_out for res in results])
    return float(((r[:, None] - r[None]).abs() / r[None]).max())


@dataclass(frozen=True)
class PositionalVariance(Analysis[PositionalVarianceResult]):
    """Std across sequences at every position of every head's output (``attn.hook_z``) and layer's (``hook_attn_out``)."""

    name: ClassVar[str] = "positional_variance"
    order = 50
    trained_order = 40

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        probes: dict[Hashable, Probe] = {}
        for layer in range(adapter.info.n_layers):
            probes["z", layer] = _moment_probe(f"blocks.{layer}.attn.hook_z")
            probes["out", layer] = _moment_probe(f"blocks.{layer}.hook_attn_out")
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> PositionalVarianceResult:
        layers = range(adapter.info.n_layers)
        # hook_z moments are [3, pos, head, d_head]: pool over d_head, then put heads first.
        std_z = torch.stack([_std(kept["z", layer]).T for layer in layers])
        std_out = torch.stack([_std(kept["out", layer]) for layer in layers])
        return PositionalVarianceResult(std_z=std_z, std_out=std_out, n=spec.n, regime=adapter.info.regime)
