"""Attention sinks: the sink metric of Gu et al. for every key position, the first token's attention share and
its residual norm.

Per head, the importance of key position k (0-based) is the mean attention it receives from the queries that
can see it, α_k = (1/(T − k)) Σ_{t ≥ k} A[t, k], diagonal included; in a sliding layer of window W only the
queries k ≤ t < k + W see key k, and α_k averages over those (``lens_bias.core.attention_layout``). Sink_k^ε is the
percentage of
(sequence, layer, head) triples with α_k > ε (strict; default ε = 0.3, Gu et al.'s threshold). α is computed
inside the ``hook_pattern`` hook (a reduction over queries), so no [N, L, H, T, T] pattern is ever held, and
summed over sequences there (Σα, and the count above every ε of ``THRESHOLDS`` and the analysis' own), so memory
does not grow with N; ``Sinks(per_sequence=True)`` also keeps α of every sequence ``[N, L, H, T]`` (paired tests,
rates at any ε).
Sink_k falls with T: compare rates at the same sequence length.

Every attention row is accounted for. A model that declares a learned sink (GPT-OSS: a per-head softmax logit no
key owns) keeps only the keys in ``hook_pattern``, so a row sums to less than 1; the missing mass is the **learned
sink**, α_learned = (1/T) Σ_t (1 − Σ_k A[t, k]), measured per sequence, layer and head beside key 0, with its rate
under the same ε rule. Rows that sum to more than 1, or to less than 1 in a model that declares no learned sink,
are refused: a Sink_k over part of the mass is never reported without saying where the rest went.

The first token's residual norm is ‖h_0‖ divided by the median ‖h_t‖ over the other positions of the same
sequence, after every block (≈ 1 without a sink; a trained sink token stands out by a large factor).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Hashable, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from lens_bias.analyses.base import Analysis, Result
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.attention_layout import describe_windows, visible_queries
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import integer_ticks, new_figure
from lens_bias.core.inputs import InputSpec
from lens_bias.core.probes import Probe

__all__ = ["Sinks", "SinksResult", "sink_rate", "key_importance", "learned_sink", "THRESHOLDS"]

DEFAULT_EPS = 0.3
# The ε at which every pass counts α > ε (besides the analysis' own): rates at these need no α per sequence.
THRESHOLDS = tuple(round(0.05 * k, 2) for k in range(20))  # 0.0, 0.05, …, 0.95


def _check_eps(eps: float) -> None:
    if not 0 <= eps < 1:
        raise LensBiasError(f"eps is a threshold on mean attention, in [0, 1): got {eps}")


def key_importance(patterns: Float[Tensor, "... query key"], window: int | None = None) -> Float[Tensor, "... key"]:
    """α_k: mean attention to key k over the queries that can see it (post-softmax patterns, causal part only).

    >>> key_importance(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    tensor([0.7500, 0.5000])

    Args:
        patterns: post-softmax attention ``[..., T, T]`` (query, key).
        window: the layer's sliding window W, where query t sees only keys k > t − W (None: every earlier key).

    Returns:
        ``[..., T]``: α for every key position.
    """
    if patterns.ndim < 2 or patterns.shape[-1] != patterns.shape[-2]:
        raise LensBiasError(f"patterns must end in [query, key] with query == key, got shape {tuple(patterns.shape)}")
    seen_by = visible_queries(patterns.shape[-1], window, patterns.device)  # T − k queries see key k, at most W in a window
    return patterns.float().tril().sum(dim=-2) / seen_by


def learned_sink(patterns: Float[Tensor, "... query key"]) -> Float[Tensor, "..."]:
    """α_learned: the mean over queries of the attention that no key received, 1 − Σ_k A[t, k] (the share of a
    learned sink logit, where the model declares one; 0 for a plain softmax over the keys).

    >>> learned_sink(torch.tensor([[0.25, 0.0], [0.25, 0.25]]))  # every row gave 0.75 or 0.5 to a learned sink
    tensor(0.6250)
    """
    return (1 - patterns.float().sum(dim=-1)).mean(dim=-1)


def sink_rate(
    patterns: Float[Tensor, "n layer head query key"], eps: float = DEFAULT_EPS, windows: Sequence[int | None] | None = None,
) -> Float[Tensor, "key"]:
    """Sink_k^ε in percent for every key position: the share of (sequence, layer, head) with α_k > ε.

    >>> A = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.8, 0.1, 0.1]])  # one head sinking on token 0
    >>> sink_rate(A[None, None, None], eps=0.3)
    tensor([100.,   0.,   0.])

    Args:
        patterns: post-softmax attention ``[N, L, H, T, T]``.
        eps: threshold on α (strict ``>``).
        windows: each layer's sliding window (None: full causal attention in every layer).

    Returns:
        ``[T]`` rates in percent.
    """
    _check_eps(eps)
    if patterns.ndim != 5:
        raise LensBiasError(f"sink_rate takes patterns [N, L, H, T, T], got shape {tuple(patterns.shape)}")
    windows = [None] * patterns.shape[1] if windows is None else list(windows)
    if len(windows) != patterns.shape[1]:
        raise LensBiasError(f"sink_rate got {len(windows)} windows for {patterns.shape[1]} layers; give one per layer (None: full attention)")
    alpha = torch.stack([key_importance(patterns[:, layer], window) for layer, window in enumerate(windows)], dim=1)
    return rate_from_importance(alpha, eps)


def rate_from_importance(alpha: Float[Tensor, "... key"], eps: float = DEFAULT_EPS) -> Float[Tensor, "key"]:
    """Sink_k^ε in percent from α ``[..., T]``, averaging over every leading axis."""
    _check_eps(eps)
    return (alpha > eps).float().reshape(-1, alpha.shape[-1]).mean(dim=0) * 100


def _importance_probe(hook: str, window: int | None) -> Probe:
    return Probe(hook, f"key_importance@w{window}", lambda p: key_importance(p, window))  # [batch, head, T, T] -> [batch, head, T]


def _importance_sums_probe(hook: str, thresholds: tuple[float, ...], window: int | None) -> Probe:
    def fn(patterns: Tensor) -> Tensor:  # [batch, head, T, T] -> [1 + K, head, T]: Σ α, then the count of α > ε_k
        alpha = key_importance(patterns, window)
        return torch.stack([alpha.sum(dim=0), *((alpha > eps).sum(dim=0).float() for eps in thresholds)])

    return Probe(hook, f"key_importance_sums@{list(thresholds)}w{window}", fn, combine="sum")


def _learned_sums_probe(hook: str, thresholds: tuple[float, ...]) -> Probe:
    def fn(patterns: Tensor) -> Tensor:  # [batch, head, T, T] -> [1 + K, head]: Σ α_learned, then the count above ε_k
        alpha = learned_sink(patterns)
        return torch.stack([alpha.sum(dim=0), *((alpha > eps).sum(dim=0).float() for eps in thresholds)])

    return Probe(hook, f"learned_sink_sums@{list(thresholds)}", fn, combine="sum")


def _row_sum_range(patterns: Tensor) -> Tensor:
    """[batch, head, T, T] -> [2, head]: how far the rows' sums over the keys rise above 1, and fall below it."""
    rows = patterns.float().sum(dim=-1)  # [batch, head, T]
    return torch.stack([(rows - 1).amax(dim=(0, 2)), (1 - rows).amax(dim=(0, 2))])


def _row_tolerance(dtype: torch.dtype) -> float:
    """How far from 1 a softmax row may sum by rounding alone: a few units in the last place of the pattern's dtype."""
    return max(1e-4, 4 * torch.finfo(dtype).eps) if dtype.is_floating_point else 1e-4


def _first_token_norm_ratio_sum(resid: Float[Tensor, "batch pos d"]) -> Float[Tensor, ""]:
    norms = resid.float().norm(dim=-1)
    return (norms[:, 0] / norms[:, 1:].median(dim=1).values).sum()


@dataclass
class SinksResult(Result):
    """Mean α and the share above ε for every (layer, head, key position), the sink rates and the first token's
    residual norm; α of every sequence when measured with ``Sinks(per_sequence=True)``; each layer's sliding window;
    and, where the model declares a learned sink, its share and rate per (layer, head)."""

    alpha_mean: Float[Tensor, "layer head key"]  # mean α over sequences
    thresholds: list[float]  # the ε at which α > ε was counted in the pass (THRESHOLDS and eps)
    above: Float[Tensor, "threshold layer head key"]  # % of sequences with α > thresholds[i]
    norm_ratio: Float[Tensor, "layer"]  # mean over sequences of ‖h_0‖ / median_t≥1 ‖h_t‖ after each block
    eps: float
    n: int
    alpha: Float[Tensor, "n layer head key"] | None = None  # per sequence: Sinks(per_sequence=True) only
    windows: list[int | None] = field(default_factory=list)  # each layer's sliding window (None: full causal attention)
    # The learned sink, where the model declares one (None elsewhere): mean α_learned, the % of sequences above each
    # threshold, and α_learned of every sequence with per_sequence.
    learned_mean: Float[Tensor, "layer head"] | None = None
    learned_above: Float[Tensor, "threshold layer head"] | None = None
    learned_alpha: Float[Tensor, "n layer head"] | None = None

    heading = "Attention sinks"
    trained_headline = ("first_token_share", "norm_ratio_0_max", "learned_sink_share", "learned_sink_rate")  # Sink_0 is in the anatomy
    key_column = "sink_rate_0"
    headline_labels = {"sink_rate_0": "Sink_0 (%)", "first_token_share": "first-token share α_0", "norm_ratio_0_max": "max ‖h_0‖ / median ‖h_t‖",
                       "learned_sink_share": "learned-sink share of every row's attention", "learned_sink_rate": "learned sink rate (%)"}
    column_words: ClassVar[Mapping[str, str]] = {
        "first_token_share": "first-token share α_0", "window": "sliding window (tokens)", "learned_sink_rate": "learned sink rate (%)",
        "learned_sink_share": "learned-sink share α_learned", r"sink_rate_(\d+)": r"Sink_\1 (% of sequences, α > ε)",
        r"norm_ratio_(\d+)": r"‖h_\1‖ / median ‖h_t‖",
    }
    plot_caption = "first-token sink per layer and head"

    def per_sequence(self) -> Float[Tensor, "n layer head key"]:
        """α of every sequence (what paired tests between conditions read); kept with ``Sinks(per_sequence=True)`` only."""
        if self.alpha is None:
            raise LensBiasError("these sinks kept means over sequences only; measure with Sinks(per_sequence=True) for α of every sequence")
        return self.alpha

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

    @property
    def layer_windows(self) -> list[int | None]:
        """Each layer's sliding window (None: full causal attention); all None for a result saved without them."""
        return self.windows or [None] * self.alpha_mean.shape[0]

    @property
    def sliding_layers(self) -> list[int]:
        return [layer for layer, window in enumerate(self.layer_windows) if window is not None]

    def mass(self) -> Float[Tensor, "layer head key"]:
        """The attention each key receives as a share of every row, averaged over all T queries: α_k × (queries
        that see k) / T. Over the keys it sums to 1 minus the learned sink's share."""
        t = self.alpha_mean.shape[-1]
        seen = torch.stack([visible_queries(t, w) for w in self.layer_windows])  # [layer, key]
        return self.alpha_mean * seen[:, None, :] / t

    @property
    def declares_sink(self) -> bool:
        """Whether the model declares a learned sink (a softmax logit no key owns), measured here."""
        return self.learned_mean is not None

    def _learned_above(self, eps: float | None) -> Float[Tensor, "layer head"]:
        if self.learned_mean is None or self.learned_above is None:
            raise LensBiasError("this model declares no learned sink: every attention row sums to 1 over the keys")
        eps = self.eps if eps is None else eps
        _check_eps(eps)
        if self.learned_alpha is not None:
            return (self.learned_alpha > eps).float().mean(dim=0) * 100
        if eps not in self.thresholds:
            raise LensBiasError(f"the learned sink was counted at ε in {self.thresholds}; for ε {eps} measure with Sinks(per_sequence=True)")
        return self.learned_above[self.thresholds.index(eps)]

    def learned_rate_by_head(self, eps: float | None = None) -> Float[Tensor, "layer head"]:
        """The learned sink's rate per (layer, head): % of sequences with α_learned > ε, the rule of Sink_k."""
        return self._learned_above(eps)

    def learned_rate(self, eps: float | None = None) -> float:
        """The learned sink's rate: % of (sequence, layer, head) with α_learned > ε."""
        return self._learned_above(eps).mean().item()

    def learned_share(self) -> Float[Tensor, "layer head"]:
        """Mean α_learned per (layer, head): the share of every row's attention that went to the learned sink."""
        if self.learned_mean is None:
            raise LensBiasError("this model declares no learned sink: every attention row sums to 1 over the keys")
        return self.learned_mean

    def learned_dominates(self) -> list[tuple[int, int]]:
        """The (layer, head) where the learned sink receives more of the attention than any key."""
        if self.learned_mean is None:
            return []
        top_key = self.mass().amax(dim=-1)
        return [(int(layer), int(head)) for layer, head in (self.learned_mean > top_key).nonzero().tolist()]

    def layer_label(self, layer: int) -> str:
        """A layer as the figures and the table mark it: "3", or "3 (window 512)" for a sliding layer."""
        window = self.layer_windows[layer]
        return f"{layer}" if window is None else f"{layer} (window {window})"

    def plot(self, position: int = 0, eps: float | None = None) -> Any:
        """Sink rate of one key position as a layer × head heatmap (sliding layers marked with their window); where
        no head passes ε (a random init), the mean attention share of that key instead, which still says where
        attention goes. A model that declares a learned sink gets a second panel: the learned sink's rate."""
        panels = 2 if self.declares_sink else 1
        fig = new_figure(6 * panels, 4)
        axes = fig.subplots(1, panels, squeeze=False)[0]
        eps = self.eps if eps is None else eps
        rate = self.rate_by_head(position, eps)
        if rate.max() > 0:
            self._heatmap(fig, axes[0], rate, f"Sink_{position} (%) at ε {eps}", vmax=100)
        else:
            self._heatmap(fig, axes[0], self.share(position), f"mean α_{position}: no head passes ε {eps}", fontsize=10)
        if self.declares_sink:
            self._heatmap(fig, axes[1], self.learned_rate_by_head(eps), f"learned sink (%) at ε {eps}", vmax=100)
        return fig

    def _heatmap(self, fig: Any, ax: Any, values: Tensor, title: str, vmax: float | None = None, fontsize: float | None = None) -> None:
        image = ax.imshow(values.numpy(), vmin=0, vmax=vmax, cmap="viridis", aspect="auto")
        ax.set_title(title, fontsize=fontsize)
        integer_ticks(ax, *values.shape)
        if self.sliding_layers:
            ax.set_yticks(ax.get_yticks(), [self.layer_label(int(t)) for t in ax.get_yticks()], fontsize=8)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        fig.colorbar(image, ax=ax)

    def summary(self) -> str:
        h = self.headline()
        per_layer = self.rate_by_head(0).mean(dim=1).tolist()
        layers = ", ".join(f"{r:.0f}%" for r in per_layer)
        norms = ", ".join(f"{r:.2f}" for r in self.norm_ratio.tolist())
        lines = [
            f"attention sinks (Sink_k = % of (sequence, layer, head) with mean attention to key k > {self.eps}):",
            f"  Sink_0 = {h['sink_rate_0']:.1f}% (per layer {layers}); largest later Sink_k (0 < k < T−1) = {h['max_sink_rate_later']:.1f}% "
            f"at k = {h['argmax_later']}",
            f"  first-token attention share {h['first_token_share']:.3f}; first-token residual norm / median token per layer: {norms}",
        ]
        if self.sliding_layers:
            lines.append(f"  {describe_windows(self.layer_windows)}: there Sink_k counts only the queries that can see key k")
        if self.declares_sink:
            dominated = self.learned_dominates()
            where = sorted({layer for layer, _ in dominated})
            lines.append(
                f"  learned sink (a softmax logit per head that no key owns, declared by the model): {h['learned_sink_share']:.3f} of every "
                f"row's attention (key 0: {h['first_token_mass']:.3f}); rate {h['learned_sink_rate']:.1f}% at ε {self.eps}; it takes more than any "
                f"key in {len(dominated)} of {self.learned_share().numel()} heads" + (f" (layers {', '.join(map(str, where))})" if where else "")
            )
        return "\n".join(lines)

    def to_pandas(self) -> pd.DataFrame:
        n_layers, n_heads = self.alpha_mean.shape[:2]
        rate, share = self.rate_by_head(0), self.share(0)
        windows, sliding = self.layer_windows, bool(self.sliding_layers)
        learned = (self.learned_rate_by_head(), self.learned_share()) if self.declares_sink else None
        rows = []
        for layer in range(n_layers):
            for head in range(n_heads):
                row: dict[str, Any] = {"layer": layer, "head": head, "sink_rate_0": rate[layer, head].item(), "first_token_share": share[layer, head].item(),
                       "norm_ratio_0": self.norm_ratio[layer].item()}
                if sliding:
                    row["window"] = "full" if windows[layer] is None else str(windows[layer])
                if learned is not None:
                    row["learned_sink_rate"], row["learned_sink_share"] = learned[0][layer, head].item(), learned[1][layer, head].item()
                rows.append(row)
        return pd.DataFrame(rows)

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
            "first_token_mass": self.mass()[..., 0].mean().item(),
            # α_0 under uniform causal attention: (1/T) Σ_t 1/(t+1), the no-sink reference for the share.
            "uniform_share": sum(1 / (t + 1) for t in range(self.alpha_mean.shape[-1])) / self.alpha_mean.shape[-1],
            "norm_ratio_0_max": self.norm_ratio.max().item(),
            "sliding_layers": self.sliding_layers,
            "learned_sink_share": self.learned_share().mean().item() if self.declares_sink else None,
            "learned_sink_rate": self.learned_rate() if self.declares_sink else None,
        }


@dataclass(frozen=True)
class Sinks(Analysis[SinksResult]):
    """Sink metric for every key position, per layer and head, and the first token's residual norm ratio."""

    name: ClassVar[str] = "sinks"
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
        windows = adapter.windows  # refuses a layer type whose visible keys it cannot tell
        for layer in range(adapter.info.n_layers):
            pattern = f"blocks.{layer}.attn.hook_pattern"
            probes["sums", layer] = _importance_sums_probe(pattern, self._thresholds(), windows[layer])
            probes["rows", layer] = Probe(pattern, "row_sum_range", _row_sum_range, combine="max")
            if adapter.info.learned_sinks:
                probes["learned", layer] = _learned_sums_probe(pattern, self._thresholds())
            if self.per_sequence:
                probes["alpha", layer] = _importance_probe(pattern, windows[layer])
                if adapter.info.learned_sinks:
                    probes["learned_alpha", layer] = Probe(pattern, "learned_sink", learned_sink)
            probes["norm_ratio", layer] = Probe(f"blocks.{layer}.hook_resid_post", "first_token_norm_ratio_sum", _first_token_norm_ratio_sum, combine="sum")
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> SinksResult:
        layers, n = range(adapter.info.n_layers), spec.n
        _check_rows(adapter, [kept["rows", layer] for layer in layers])
        sums = torch.stack([kept["sums", layer] for layer in layers], dim=1) / n  # [1 + K, layer, head, key]
        learned = torch.stack([kept["learned", layer] for layer in layers], dim=1) / n if adapter.info.learned_sinks else None  # [1 + K, layer, head]
        return SinksResult(
            alpha_mean=sums[0].float(),
            thresholds=list(self._thresholds()),
            above=(sums[1:] * 100).float(),
            norm_ratio=torch.stack([kept["norm_ratio", layer] / n for layer in layers]).float(),
            eps=self.eps,
            n=n,
            alpha=torch.stack([kept["alpha", layer] for layer in layers], dim=1) if self.per_sequence else None,
            windows=list(adapter.windows),
            learned_mean=None if learned is None else learned[0].float(),
            learned_above=None if learned is None else (learned[1:] * 100).float(),
            learned_alpha=torch.stack([kept["learned_alpha", layer] for layer in layers], dim=1).float()
            if self.per_sequence and learned is not None else None,
        )


def _check_rows(adapter: ModelAdapter, ranges: Sequence[Tensor]) -> None:
    """Refuse patterns whose rows do not add up to what lens_bias can name: above 1 never, below 1 only where the
    model declares a learned sink that holds the rest."""
    tolerance = _row_tolerance(adapter.dtype)
    over = torch.stack([r[0] for r in ranges]).amax(dim=1)  # [layer]
    under = torch.stack([r[1] for r in ranges]).amax(dim=1)
    if over.max() > tolerance:
        layer = int(over.argmax())
        raise LensBiasError(
            f"attention rows at blocks.{layer}.attn.hook_pattern sum to up to {1 + over[layer].item():.4g} over the keys, more than a softmax can: "
            "an edit of hook_pattern that does not renormalise its rows has no sink metric; check the interventions"
        )
    if not adapter.info.learned_sinks and under.max() > tolerance:
        layer = int(under.argmax())
        raise LensBiasError(
            f"attention rows at blocks.{layer}.attn.hook_pattern sum to as little as {1 - under[layer].item():.4g} over the keys, and this model "
            "declares no learned sink that could hold the rest, so no Sink_k is reported over part of the mass; check the edits of hook_pattern"
        )
