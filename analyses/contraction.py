"""Contraction: how hidden states of random inputs collapse toward one seed-fixed direction, layer by layer.

Two cosines per layer, both from sums over sequences taken inside the hooks, so memory does not grow with N
(``lens_bias.core.stats.mean_pairwise_cosine``, whose identity needs only Σ of the unit vectors):
- inter-sequence: mean pairwise cosine of the last-position states of different sequences. MLP asymmetry
  (ReLU/GELU/SiLU have non-zero mean) drives it up; odd activations and attention alone leave it ≈ 0.
- intra-sequence: mean pairwise cosine across the positions of one sequence, averaged over sequences. Causal
  attention averages value vectors over the prefix and drives it up.
The seed direction is the mean of the unit-normalised final states; the energy share of a layer is
E[(x·s)²] / E[‖x‖²] = sᵀGs / tr G for its last-position states x, with G = Σ x xᵀ summed in the pass (a d_model²
total per layer, less than the layer's weights; 1/d_model for a direction unrelated to the states).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from lens_bias.analyses.base import Analysis, Result
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import new_figure
from lens_bias.core.inputs import InputSpec
from lens_bias.core.probes import Probe, last_unit_sum
from lens_bias.core.stats import mean_pairwise_cosine, unit

__all__ = ["Contraction", "ContractionResult", "plot_contraction"]


def plot_contraction(table: pd.DataFrame) -> Any:
    """Inter- and intra-sequence cosine per layer from a table with columns layer, inter, intra: one line per
    ``condition`` (an ablation table), or one for the model."""
    fig = new_figure(9, 3.5)
    ax_inter, ax_intra = fig.subplots(1, 2, sharex=True)
    if "condition" not in table:
        table = table.assign(condition="model")
    for name, rows in table.groupby("condition", sort=False):
        ax_inter.plot(range(len(rows)), rows.inter, marker="o", label=name)
        ax_intra.plot(range(len(rows)), rows.intra, marker="o", label=name)
        labels = list(rows.layer)
    step = -(-len(labels) // 12)  # at most ~12 labels: deep models' layer names would overlap
    shown = list(range(0, len(labels), step))
    shown[-1] = len(labels) - 1  # the last ("final") is always labelled
    for ax, name in ((ax_inter, "inter-sequence cosine"), (ax_intra, "intra-sequence cosine")):
        ax.set_xticks(shown, [labels[i] for i in shown])
        ax.set_xlabel("layer")
        ax.set_title(name)
    ax_intra.legend(fontsize=7)
    return fig


def _last_probe(hook: str, kind: str) -> Probe:
    return _last_probes(hook)[kind]


def _last_probes(hook: str) -> dict[str, Probe]:
    """Sums over the batch at the last position: Σ unit(x) [d], G = Σ x xᵀ [d, d]; and Σ of each sequence's mean
    pairwise cosine across its positions []."""

    def gram(x: Tensor) -> Tensor:
        last = x[:, -1].float()
        return last.T @ last

    def intra_sum(x: Tensor) -> Tensor:
        return mean_pairwise_cosine(x).sum()

    return {"unit_sum": last_unit_sum(hook), "gram": Probe(hook, "last_gram", gram, combine="sum"),
            "intra": Probe(hook, "intra_cosine_sum", intra_sum, combine="sum")}


@dataclass
class ContractionResult(Result):
    """Per-layer inter/intra-sequence cosine and the build-up of the seed direction."""
    column_words: ClassVar[Mapping[str, str]] = {
        "inter": "cos between sequences (inter)", "intra": "cos within a sequence (intra)", "energy_share": "energy along the seed direction",
        "cos_to_seed": "cos to the seed direction",
    }

    heading = "Contraction"
    trained_headline = ()  # the contraction toward one seed direction is what an init is born with
    key_column = "inter"
    headline_labels = {"inter_final": "inter (final norm)", "intra_final": "intra (final norm)", "energy_share_final": "energy along the seed direction"}
    plot_caption = "contraction per layer"

    layers: list[str]  # "embed", "0" … str(n_layers - 1), "final"
    hooks: list[str]
    inter: Float[Tensor, "layer"]
    intra: Float[Tensor, "layer"]
    energy_share: Float[Tensor, "layer"]  # E[(x·s)²]/E[‖x‖²] along the final seed direction s
    cos_to_seed: Float[Tensor, "layer"]  # cosine between each layer's mean direction and s
    seed_direction: Float[Tensor, "d_model"]  # unit vector: mean of the unit-normalised final states
    n: int

    def summary(self, most: int = 10) -> str:
        """One line per layer, at most ``most`` (a deep model's: the embedding, every k-th layer and the final norm;
        every row is in ``to_pandas()``)."""
        d = self.seed_direction.numel()
        columns = list(zip(self.layers, self.inter.tolist(), self.intra.tolist(), self.energy_share.tolist()))
        shown = list(range(len(columns)))
        if len(columns) > most:
            step = -(-(len(columns) - 1) // (most - 1))
            shown = sorted({*range(0, len(columns) - 1, step), len(columns) - 1})
        rows = "\n".join(f"  {layer:>6}  inter {i:+.3f}  intra {a:+.3f}  energy along seed {e:.3f}" for layer, i, a, e in (columns[k] for k in shown))
        if len(shown) < len(columns):
            rows += f"\n  … every row of the {len(columns)} in to_pandas()"
        return (
            f"contraction (last position across {self.n} sequences = inter; positions within a sequence = intra;\n"
            f"  energy along the final seed direction, chance level 1/d = {1 / d:.4f}):\n{rows}"
        )

    def plot(self) -> Any:
        """Inter- and intra-sequence cosine per layer."""
        return plot_contraction(self.to_pandas())

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "layer": self.layers,
                "hook": self.hooks,
                "inter": self.inter.tolist(),
                "intra": self.intra.tolist(),
                "energy_share": self.energy_share.tolist(),
                "cos_to_seed": self.cos_to_seed.tolist(),
            }
        )

    def headline(self) -> dict[str, Any]:
        return {
            "inter_final": self.inter[-1].item(),
            "intra_final": self.intra[-1].item(),
            "energy_share_final": self.energy_share[-1].item(),
            "inter_embed": self.inter[0].item(),
            "intra_embed": self.intra[0].item(),
        }


@dataclass(frozen=True)
class Contraction(Analysis[ContractionResult]):
    """Inter- and intra-sequence cosine at the embedding, after every block, and after the final norm."""

    name: ClassVar[str] = "contraction"
    order = 20
    trained_order = 70

    def _hooks(self, adapter: ModelAdapter) -> tuple[list[str], list[str]]:
        n_layers = adapter.info.n_layers
        labels = ["embed"] + [str(layer) for layer in range(n_layers)] + ["final"]
        hooks = ["blocks.0.hook_resid_pre"] + [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]
        return labels, hooks + [adapter.readout_hook]

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        labels, hooks = self._hooks(adapter)
        probes: dict[Hashable, Probe] = {(kind, label): probe for label, hook in zip(labels[:-1], hooks[:-1]) for kind, probe in _last_probes(hook).items()}
        for kind in _last_probes(hooks[-1]):  # the final row reads what the model unembeds: after the final norm's gain
            probes[kind, "final"] = adapter.readout_probe(functools.partial(_last_probe, kind=kind))
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> ContractionResult:
        labels, hooks = self._hooks(adapter)
        n = spec.n
        if n < 2:
            raise LensBiasError(f"contraction compares sequences: it needs at least 2, got {n}")
        unit_sums = torch.stack([kept["unit_sum", label] for label in labels])  # [layer, d], float64
        # Σ_{i≠j} u_i·u_j = ‖Σ u_i‖² − n for unit vectors (mean_pairwise_cosine's identity)
        inter = (unit_sums.pow(2).sum(dim=-1) - n) / (n * (n - 1))
        mean_dirs = unit(unit_sums)  # [layer, d]
        seed = mean_dirs[-1]
        s = seed.double()
        energy = torch.stack([s @ kept["gram", label] @ s / kept["gram", label].trace() for label in labels])
        return ContractionResult(
            layers=labels,
            hooks=hooks,
            inter=inter.float(),
            intra=torch.stack([kept["intra", label] / n for label in labels]).float(),
            energy_share=energy.float(),
            cos_to_seed=mean_dirs @ seed,
            seed_direction=seed,
            n=n,
        )
