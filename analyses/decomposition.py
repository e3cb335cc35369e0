"""Residual decomposition at init: which sublayers create the seed direction, and which amplify it.

The residual stream before the final norm is the sum of its components: the token embedding, the position
embedding (where the model adds one), and every block's attention and MLP output. For each component c with
values x_c over the inputs, split the energy into the input-mean ("shared") part and the fluctuating part,

    E‖x_c‖² = ‖μ_c‖² + E‖x_c − μ_c‖²,   μ_c = E[x_c],

and compare μ_c with the final seed direction s (mean of the unit-normalised final states, as in the
contraction section): its cosine with s, its signed projection μ_c·s, and the cumulative sum Σ_{c'≤c} μ_c'
as the stream is built up. A component with a large shared part along s creates or amplifies the seed
direction; attention on random tokens has (almost) no shared part of its own.

``positions="last"`` uses the readout position; ``positions="all"`` treats every (sequence, position) as an
input. Both sum inside the hooks over the batch (Σx and Σ‖x‖²), so memory does not grow with N; the check that
the components add back to the residual reads the first batch's sequences.
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
from lens_bias.core.inputs import InputSpec
from lens_bias.core.probes import Probe, last_unit_sum
from lens_bias.core.stats import unit

__all__ = ["Decomposition", "DecompositionResult", "components"]

def components(adapter: ModelAdapter) -> list[tuple[str, str]]:
    """``(component, hook)`` pairs whose sum is the residual stream after the last block."""
    info = adapter.info
    parts = [("embed", "hook_embed")]
    if info.positional_embedding in ("learned", "none"):  # a position table added to the residual stream
        parts.append(("pos_embed", "hook_pos_embed"))
    for layer in range(info.n_layers):
        parts.append((f"attn_{layer}", f"blocks.{layer}.hook_attn_out"))
        if not info.attn_only:
            parts.append((f"mlp_{layer}", f"blocks.{layer}.hook_mlp_out"))
    return parts


def _rows(x: Float[Tensor, "batch pos d"], positions: str) -> Float[Tensor, "batch ... d"]:
    return x[:, -1:].float() if positions == "last" else x.float()


def _moments_probe(hook: str, positions: str) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [d + 1]: Σ x over the batch (and positions), then Σ ‖x‖²
        rows = _rows(x, positions)
        return torch.cat([rows.sum(dim=(0, 1)), rows.pow(2).sum()[None]])

    return Probe(hook, f"moments_{positions}", fn, combine="sum")


def _first_batch_probe(hook: str, positions: str) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [batch, d]: each sequence's x (at the last position, or summed)
        return _rows(x, positions).sum(dim=1)

    return Probe(hook, f"first_batch_{positions}", fn, combine="first")


@dataclass
class DecompositionResult(Result):
    """Shared vs fluctuating energy of each residual component and its alignment with the seed direction."""
    column_words: ClassVar[Mapping[str, str]] = {
        "shared_energy": "shared energy", "fluctuating_energy": "fluctuating energy", "shared_fraction": "shared share of the energy",
        "seed_projection": "along the seed direction", "cos_to_seed": "cos to the seed direction",
        "cumulative_cos_to_seed": "cumulative cos to the seed", "cumulative_shared_norm": "cumulative shared norm",
    }

    heading = "Residual decomposition"

    components: list[str]
    hooks: list[str]
    shared_energy: Float[Tensor, "component"]  # ‖μ_c‖²
    fluctuating_energy: Float[Tensor, "component"]  # E‖x_c − μ_c‖²
    cos_to_seed: Float[Tensor, "component"]  # cos(μ_c, s)
    seed_projection: Float[Tensor, "component"]  # μ_c · s
    cumulative_cos_to_seed: Float[Tensor, "component"]  # cos(Σ_{c'≤c} μ_c', s)
    cumulative_shared_norm: Float[Tensor, "component"]  # ‖Σ_{c'≤c} μ_c'‖
    reconstruction_error: float  # max relative error of Σ_c x_c against the residual after the last block (first batch)
    positions: str

    @property
    def shared_fraction(self) -> Tensor:
        return self.shared_energy / (self.shared_energy + self.fluctuating_energy).clamp_min(1e-30)

    def summary(self, most: int = 12) -> str:
        """One line per component, at most ``most`` of them (the first, the last, and those with the most shared
        energy); a deep model's other rows are in ``to_pandas()``."""
        columns = list(zip(self.components, self.shared_energy.tolist(), self.shared_fraction.tolist(), self.cos_to_seed.tolist(),
                           self.seed_projection.tolist(), self.cumulative_cos_to_seed.tolist()))
        shown: Sequence[int] = range(len(columns))
        if len(columns) > most:
            largest = self.shared_energy.topk(most - 2).indices.tolist()
            shown = sorted({0, len(columns) - 1, *largest})
        rows = "\n".join(
            f"  {c:>9}  shared {s:.3g} ({f:.1%} of its energy)  cos to seed {cs:+.3f}  along seed {p:+.3g}  cumulative cos {cc:+.3f}"
            for c, s, f, cs, p, cc in (columns[i] for i in shown)
        )
        if len(shown) < len(columns):
            rows += f"\n  … {len(columns) - len(shown)} more components (less shared energy) in to_pandas()"
        kinds = ", ".join(f"{k} {v:.3g}" for k, v in self.energy_by_kind().items())
        return (
            f"residual decomposition ({self.positions} position{'s' if self.positions == 'all' else ''}; shared = input mean):\n"
            f"{rows}\n  shared energy by kind: {kinds}; parts add back to the residual within {self.reconstruction_error:.1e}"
        )

    def to_pandas(self) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "component": self.components,
                "hook": self.hooks,
                "shared_energy": self.shared_energy.tolist(),
                "fluctuating_energy": self.fluctuating_energy.tolist(),
                "shared_fraction": self.shared_fraction.tolist(),
                "cos_to_seed": self.cos_to_seed.tolist(),
                "seed_projection": self.seed_projection.tolist(),
                "cumulative_cos_to_seed": self.cumulative_cos_to_seed.tolist(),
                "cumulative_shared_norm": self.cumulative_shared_norm.tolist(),
            }
        )

    def energy_by_kind(self) -> dict[str, float]:
        """Shared energy summed over component kinds (embed, pos_embed, attn, mlp)."""
        out: dict[str, float] = {}
        for name, energy in zip(self.components, self.shared_energy.tolist()):
            kind = name.split("_")[0] if name[-1].isdigit() else name
            out[kind] = out.get(kind, 0.0) + energy
        return out

    def headline(self) -> dict[str, Any]:
        top = int(self.seed_projection.argmax())
        return {
            "shared_energy_by_kind": self.energy_by_kind(),
            "largest_seed_projection": self.components[top],
            "reconstruction_error": self.reconstruction_error,
        }


@dataclass(frozen=True)
class Decomposition(Analysis[DecompositionResult]):
    """Split the residual stream into its components and measure each one's shared part."""

    name: ClassVar[str] = "decomposition"
    order = 30
    trained_order = 80
    positions: str = "last"  # "last" (the readout position) or "all"

    def __post_init__(self) -> None:
        if self.positions not in ("last", "all"):
            raise LensBiasError(f"positions must be 'last' or 'all', got {self.positions!r}")

    def _target(self, adapter: ModelAdapter) -> str:
        return f"blocks.{adapter.info.n_layers - 1}.hook_resid_post"

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        probes: dict[Hashable, Probe] = {"final": adapter.readout_probe(last_unit_sum)}
        for name, hook in [*components(adapter), ("target", self._target(adapter))]:
            probes["moments", name] = _moments_probe(hook, self.positions)
            probes["first", name] = _first_batch_probe(hook, self.positions)
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> DecompositionResult:
        names, hooks = zip(*components(adapter))
        seed = unit(kept["final"])
        moments = torch.stack([kept["moments", name] for name in names])  # [component, d + 1], float64
        count = spec.n * (1 if self.positions == "last" else spec.seq_len)
        sums, sq = moments[:, :-1], moments[:, -1]
        rows = torch.stack([kept["first", name] for name in names]).double()  # [component, batch, d]
        rows_target = kept["first", "target"].double()
        mean = sums / count  # [component, d]
        shared = mean.pow(2).sum(-1)
        cumulative = mean.cumsum(dim=0)
        error = ((rows.sum(0) - rows_target).norm(dim=-1) / rows_target.norm(dim=-1).clamp_min(1e-30)).max().item()
        seed = seed.double()
        return DecompositionResult(
            components=list(names),
            hooks=list(hooks),
            shared_energy=shared.float(),
            fluctuating_energy=(sq / count - shared).clamp_min(0).float(),
            cos_to_seed=(unit(mean) @ seed.float()),
            seed_projection=(mean @ seed).float(),
            cumulative_cos_to_seed=(unit(cumulative) @ seed.float()),
            cumulative_shared_norm=cumulative.norm(dim=-1).float(),
            reconstruction_error=error,
            positions=self.positions,
        )
