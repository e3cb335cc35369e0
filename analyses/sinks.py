"""Attention sinks: the sink metric of Gu et al. for every key position, the first token's attention share and
its residual norm.

Per head, the importance of key position k (0-based) is the mean attention it receives from the queries that
can see it, α_k = (1/(T − k)) Σ_{t ≥ k} A[t, k], diagonal included; Sink_k^ε is the percentage of
(sequence, layer, head) triples with α_k > ε (strict; default ε = 0.3, Gu et al.'s threshold). α is computed
inside the ``hook_pattern`` hook (a reduction over queries), so no [N, L, H, T, T] pattern is ever held, and
summed over sequences there (Σα, and the count above every ε of ``THRESHOLDS`` and the analysis' own), so memory
does not grow with N; ``Sinks(per_sequence=True)`` also keeps α of every sequence ``[N, L, H, T]`` (paired tests,
rates at any ε).
Sink_k falls with T: compare rates at the same sequence length.

The first token's residual norm is ‖h_0‖ divided by the median ‖h_t‖ over the other positions of the same
sequence, after every block (≈ 1 without a sink; a trained sink token stands out by a large factor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from lens_bias.analyses.base import Analysis, Result
from lens_bias.core.adapter import ModelAdapter, Probe
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import integer_ticks, new_figure
from lens_bias.core.inputs import InputSpec

__all__ = ["Sinks", "SinksResult", "sink_rate", "key_importance", "THRESHOLDS"]

DEFAULT_EPS = 0.3
# The ε at which every pass counts α > ε (besides the analysis' own): rates at these need no α per sequence.
THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(20))  # 0.0, 0.05, …, 0.95


def _check_eps(eps: float) -> None:
    if not 0 <= eps < 1:
        raise LensBiasError(f"eps is a threshold on mean attention, in [0, 1): got {eps}")


def key_importance(patterns: Float[Tensor, "... query key"]) -> Float[Tensor, "... key"]:
    """α_k: mean attention to key k over the queries t ≥ k (post-softmax patterns, causal part only).

    >>> key_importance(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    tensor([0.7500, 0.5000])

    Args:
        patterns: post-softmax attention ``[..., T, T]`` (query, key).

    Returns:
        ``[..., T]``: α for every key position.
    """
    if patterns.ndim < 2 or patterns.shape[-1] != patterns.shape[-2]:
        raise LensBiasError(f"patterns must end in [query, key] with query == key, got shape {tuple(patterns.shape)}")
    t = patterns.shape[-1]
    seen_by = torch.arange(t, 0, -1, device=patterns.device, dtype=torch.float32)  # T − k queries see key k
    return patterns.float().tril().sum(dim=-2) / seen_by


def sink_rate(patterns: Float[Tensor, "n layer head query key"], eps: float = DEFAULT_EPS) -> Float[Tensor, "key"]:
    """Sink_k^ε in percent for every key position: the share of (sequence, layer, head) with α_k > ε.

    >>> A = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.8, 0.1, 0.1]])  # one head sinking on token 0
    >>> sink_rate(A[None, None, None], eps=0.3)
    tensor([100.,   0.,   0.])

    Args:
        patterns: post-softmax attention ``[N, L, H, T, T]``.
        eps: threshold on α (strict ``>``).

    Returns:
        ``[T]`` rates in percent.
    """
    _check_eps(eps)
    if patterns.ndim != 5:
        raise LensBiasError(f"sink_rate takes patterns [N, L, H, T, T], got shape {tuple(patterns.shape)}")
    return rate_from_importance(key_importance(patterns), eps)


def rate_from_importance(alpha: Float[Tensor, "... key"], eps: float = DEFAULT_EPS) -> Float[Tensor, "key"]:
    """Sink_k^ε in percent from α ``[..., T]``, averaging over every leading axis."""
    _check_eps(eps)
    return (alpha > eps).float().reshape(-1, alpha.shape[-1]).mean(dim=0) * 100


def _importance_probe(hook: str) -> Probe:
    return Probe(hook, "key_importance", key_importance)  # [batch, head, T, T] -> [batch, head, T]


def _importance_sums_probe(hook: str, thresholds: tuple[float, ...]) -> Probe:
    def fn(patterns: Tensor) -> Tensor:  # [batch, head, T, T] -> [1 + K, head, T]: Σ α, then the count of α > ε_k
        alpha = key_importance(patterns)
        return torch.stack([alpha.sum(dim=0), *((alpha > eps).sum(dim=0).float() for eps in thresholds)])

    return Probe(hook, f"key_importance_sums@{list(thresholds)}", fn, combine="sum")


def _first_token_norm_ratio_sum(resid: Float[Tensor, "batch pos d"]) -> Float[Tensor, ""]:
    norms = resid.float().norm(dim=-1)
    return (norms[:, 0] / norms[:, 1:].median(dim=1).values).sum()


@dataclass
class SinksResult(Result):
    """Mean α and the share above ε for every (layer, head, key position), the sink rates and the first token's
    residual norm; α of every sequence when measured with ``Sinks(per_sequence=True)``."""

    alpha_mean: Float[Tensor, "layer head key"]  # mean α over sequences
    thresholds: list[float]  # the ε at which α > ε was counted in the pass (THRESHOLDS and eps)
    above: Float[Tensor, "threshold layer head key"]  # % of sequences with α > thresholds[i]
    norm_ratio: Float[Tensor, "layer"]  # mean over sequences of ‖h_0‖ / median_t≥1 ‖h_t‖ after each block
    eps: float
    n: int
    alpha: Float[Tensor, "n layer head key"] | None = None  # per sequence: Sinks(per_sequence=True) only

    heading = "Attention sinks"
    trained_headline = ("first_token_share", "norm_ratio_0_max")  # Sink_0 is in the anatomy
    key_column = "sink_rate_0"
    headline_labels = {"sink_rate_0": "Sink_0 (%)", "first_token_share": "first-token share α_0", "norm_ratio_0_max": "max ‖h_0‖ / median ‖h_t‖"}
    plot_caption = "first-token sink per layer and head"

    def _above(self, eps: float | None) -> Float[Tensor, "layer head key"]:
        """% of sequences with α > eps per (layer, head, key): counted in the pass at the thresholds, else from α."""
        eps = self.eps if eps is None else eps
        _check_eps(eps)
        if self.alpha is not None:
            return (self.alpha > eps).float().mean(dim=0) * 100
        if eps not in self.thresholds:
            raise LensBiasError(
                f"these sinks were counted at ε in {self.thresholds}; for ε {eps} measure with Sinks(eps={eps}) or Sinks(per_sequence=True)"
            )
        return self.above[self.thresholds.index(eps)]

    def rate(self, eps: float | None = None) -> Float[Tensor, "key"]:
        """Sink_k^ε in percent for every key position (``eps`` defaults to the analysis' threshold)."""
        return self._above(eps).mean(dim=(0, 1))

    def rate_by_head(self, position: int = 0, eps: float | None = None) -> Float[Tensor, "layer head"]:
        """Sink rate of one key position per (layer, head), in percent over sequences."""
        return self._above(eps)[..., position]

    def share(self, position: int = 0) -> Float[Tensor, "layer head"]:
        """Mean α of one key position per (layer, head); for position 0 the first token's attention share."""
        return self.alpha_mean[..., position]

    def plot(self, position: int = 0, eps: float | None = None) -> Any:
        """Sink rate of one key position as a layer × head heatmap; where no head passes ε (a random init), the
        mean attention share of that key instead, which still says where attention goes."""
        fig = new_figure()
        ax = fig.subplots()
        eps = self.eps if eps is None else eps
        rate = self.rate_by_head(position, eps)
        if rate.max() > 0:
            image = ax.imshow(rate.numpy(), vmin=0, vmax=100, cmap="viridis", aspect="auto")
            ax.set_title(f"Sink_{position} (%) at ε {eps}")
        else:
            share = self.share(position)
            image = ax.imshow(share.numpy(), vmin=0, cmap="viridis", aspect="auto")
            ax.set_title(f"mean α_{position}: no head passes ε {eps}", fontsize=10)
        integer_ticks(ax, *rate.shape)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(image, ax=ax)
        return fig

    def summary(self) -> str:
        h = self.headline()
        per_layer = self.rate_by_head(0).mean(dim=1).tolist()
        layers = ", ".join(f"{r:.0f}%" for r in per_layer)
        norms = ", ".join(f"{r:.2f}" for r in self.norm_ratio.tolist())
        return (
            f"attention sinks (Sink_k = % of (sequence, layer, head) with mean attention to key k > {self.eps}):\n"
            f"  Sink_0 = {h['sink_rate_0']:.1f}% (per layer {layers}); largest later Sink_k (0 < k < T−1) = {h['max_sink_rate_later']:.1f}% "
            f"at k = {h['argmax_later']}\n"
            f"  first-token attention share {h['first_token_share']:.3f}; first-token residual norm / median token per "
            f"layer: {norms}"
        )

    def to_pandas(self) -> pd.DataFrame:
        n_layers, n_heads = self.alpha_mean.shape[:2]
        rate, share = self.rate_by_head(0), self.share(0)
        return pd.DataFrame(
            [
                {"layer": layer, "head": head, "sink_rate_0": rate[layer, head].item(), "first_token_share": share[layer, head].item(),
                 "norm_ratio_0": self.norm_ratio[layer].item()}
                for layer in range(n_layers)
                for head in range(n_heads)
            ]
        )

    def headline(self) -> dict[str, Any]:
        rate = self.rate()
        # later keys, not the last: key T−1 is seen only by its own query, so its α is that token attending to itself
        later = rate[1:-1]
        return {
            "eps": self.eps,
            "sink_rate_0": rate[0].item(),
            "max_sink_rate_later": later.max().item() if len(later) else 0.0,
            "argmax_later": int(later.argmax()) + 1 if len(later) else None,
            "first_token_share": self.share(0).mean().item(),
            # α_0 under uniform causal attention: (1/T) Σ_t 1/(t+1), the no-sink reference for the share.
            "uniform_share": sum(1 / (t + 1) for t in range(self.alpha_mean.shape[-1])) / self.alpha_mean.shape[-1],
            "norm_ratio_0_max": self.norm_ratio.max().item(),
        }


@dataclass(frozen=True)
class Sinks(Analysis):
    """Sink metric for every key position, per layer and head, and the first token's residual norm ratio."""

    name: ClassVar[str] = "sinks"
    result_type = SinksResult
    order = 60
    trained_order = 10
    eps: float = DEFAULT_EPS
    # Keep α of every sequence ([N, L, H, T] floats: memory grows with N) for paired tests and rates at other ε;
    # the rates at eps and the mean α are summed in the pass either way.
    per_sequence: bool = False

    def __post_init__(self) -> None:
        _check_eps(self.eps)

    def _thresholds(self) -> tuple[float, ...]:
        return tuple(sorted({*THRESHOLDS, self.eps}))

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        probes: dict[Hashable, Probe] = {}
        for layer in range(adapter.info.n_layers):
            pattern = f"blocks.{layer}.attn.hook_pattern"
            probes["sums", layer] = _importance_sums_probe(pattern, self._thresholds())
            if self.per_sequence:
                probes["alpha", layer] = _importance_probe(pattern)
            probes["norm_ratio", layer] = Probe(f"blocks.{layer}.hook_resid_post", "first_token_norm_ratio_sum", _first_token_norm_ratio_sum, combine="sum")
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> SinksResult:
        layers, n = range(adapter.info.n_layers), spec.n
        sums = torch.stack([kept["sums", layer] for layer in layers], dim=1) / n  # [1 + K, layer, head, key]
        return SinksResult(
            alpha_mean=sums[0].float(),
            thresholds=list(self._thresholds()),
            above=(sums[1:] * 100).float(),
            norm_ratio=torch.stack([kept["norm_ratio", layer] / n for layer in layers]).float(),
            eps=self.eps,
            n=n,
            alpha=torch.stack([kept["alpha", layer] for layer in layers], dim=1) if self.per_sequence else None,
        )
