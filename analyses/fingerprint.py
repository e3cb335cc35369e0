"""The model's own SeedPrint fingerprint summary: what the lineage test will look at.

The identity dimensions are the m dimensions of the final normalized state (last position) with the smallest
mean over the random inputs; the test softmaxes each input's values over them at temperature 10 and correlates
those across models. A large spread of the softmaxed values across inputs gives Kendall's τ something to rank.
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
from lens_bias.core.inputs import InputSpec
from lens_bias.core.probes import Probe
from lens_bias.seedprint import identity_dims

__all__ = ["FingerprintSection", "FingerprintSummary"]


@dataclass
class FingerprintSummary(Result):
    """Identity dimensions, their means, and the spread of the softmaxed identity values."""
    column_words: ClassVar[Mapping[str, str]] = {"mean": "mean final state", "softmax_mean": "softmax mean (T 10)", "softmax_std": "softmax spread"}

    heading = "SeedPrint fingerprint"

    dims: Int[Tensor, "m"]
    means: Float[Tensor, "m"]  # mean feature value over inputs
    softmax_mean: Float[Tensor, "m"]  # mean over inputs of softmax(F[:, dims] / T)
    softmax_std: Float[Tensor, "m"]  # its std over inputs: what Kendall's τ ranks
    d_model: int
    temperature: float

    def summary(self) -> str:
        shown = ", ".join(f"{d} ({v:+.2f})" for d, v in zip(self.dims.tolist()[:8], self.means.tolist()[:8]))
        more = " …" if len(self.dims) > 8 else ""
        return (
            f"SeedPrint fingerprint (m = {len(self.dims)} of {self.d_model} dims with the smallest mean final state):\n"
            f"  identity dims (mean): {shown}{more}\n"
            f"  softmax at T = {self.temperature:g} over them: mean {self.softmax_mean.mean().item():.4f}, "
            f"spread across inputs {self.softmax_std.mean().item():.2e} (uniform would be {1 / len(self.dims):.4f}, spread 0)"
        )

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(
            {"dim": self.dims.tolist(), "mean": self.means.tolist(), "softmax_mean": self.softmax_mean.tolist(), "softmax_std": self.softmax_std.tolist()}
        )

    def headline(self) -> dict[str, Any]:
        return {"m": len(self.dims), "dims": self.dims.tolist()[:10], "mean_softmax_std": self.softmax_std.mean().item()}


@dataclass(frozen=True)
class FingerprintSection(Analysis[FingerprintSummary]):
    """Summarise the features ``lens_bias.seedprint.fingerprint`` would extract on the report's inputs."""

    name: ClassVar[str] = "fingerprint"
    order = 40
    trained_order = 90
    ratio_k: float = 0.10  # m = ⌊ratio_k · d_model⌋, the SeedPrint default
    temperature: float = 10.0

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        return {"final": adapter.readout_probe()}

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> FingerprintSummary:
        features = kept["final"]
        m = max(1, int(self.ratio_k * features.shape[1]))
        dims = identity_dims(features, m).sort().values
        soft = torch.softmax(features[:, dims].double() / self.temperature, dim=1)
        return FingerprintSummary(
            dims=dims,
            means=features[:, dims].mean(0),
            softmax_mean=soft.mean(0).float(),
            softmax_std=soft.std(0).float(),
            d_model=features.shape[1],
            temperature=self.temperature,
        )
