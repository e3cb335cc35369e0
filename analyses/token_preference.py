"""Token preference: which next tokens a model favours over random input sequences.

p̄ = (1/N) Σ_i softmax(logits_i[last]) is the mean next-token distribution at the readout position. A neutral
model has p̄ ≈ 1/V everywhere; a randomly initialised one prefers some tokens by orders of magnitude (at width),
and which ones is fixed by the init seed: the mean-logit vectors of two disjoint halves of the inputs agree
(Kendall τ high), those of two seeds do not (τ ≈ 0). Logits are the model's own: its head applied to the readout
(the final norm's output after its gain) at the last position only, never as ``[N, T, V]``, with whatever the model
does to its head's output (logit scale, soft cap), checked once against the model's logits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping

import pandas as pd
import torch
from jaxtyping import Float, Int
from scipy.stats import kendalltau
from torch import Tensor

from lens_bias.analyses.base import Analysis, Result
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.figures import new_figure
from lens_bias.core.inputs import InputSpec
from lens_bias.core.probes import Probe

__all__ = ["TokenPreference", "TokenPreferenceResult"]

# Rows of logits computed at once: bounds memory at chunk × d_vocab floats.
_LOGIT_CHUNK = 256


@dataclass
class TokenPreferenceResult(Result):
    """Mean next-token distribution over random inputs and how lopsided it is."""
    column_words: ClassVar[Mapping[str, str]] = {
        "token": "token ID", "token_str": "token", "p_bar": "mean probability p̄", "ratio_to_uniform": "V · p̄ (× uniform)",
        "mean_logit": "mean logit", "argmax_count": "inputs where it is the argmax",
    }

    heading = "Token preference"
    trained_headline = ()  # over text a trained model prefers what text continues with, not an init's seed direction
    headline_labels = {"max_min_ratio": "max/min p̄", "uniform_ratio": "V·max p̄", "entropy_ratio": "H(p̄)/log V", "tau_halves": "τ halves"}
    plot_caption = "sorted V·p̄"
    view_caption = "preferred tokens (log10 V·p̄)"

    p_bar: Float[Tensor, "d_vocab"]  # mean softmax at the last position (float64)
    mean_logits: Float[Tensor, "d_vocab"]  # mean logits at the last position (float64)
    argmax_counts: Int[Tensor, "d_vocab"]  # how many inputs have each token as their argmax
    tau_halves: float  # Kendall τ-b between the mean logits of inputs [0, N/2) and [N/2, N)
    n: int
    top_k: int
    token_strings: list[str] | None  # decoded vocabulary when the model has a tokenizer

    @property
    def d_vocab(self) -> int:
        return self.p_bar.numel()

    @property
    def max_min_ratio(self) -> float:
        """max p̄ / min p̄: 1 for a neutral model."""
        return (self.p_bar.max() / self.p_bar.min()).item()

    @property
    def uniform_ratio(self) -> float:
        """V · max p̄: how many times more likely the favourite token is than under the uniform distribution."""
        return (self.d_vocab * self.p_bar.max()).item()

    @property
    def entropy_ratio(self) -> float:
        """H(p̄) / log V: 1 for the uniform distribution."""
        p = self.p_bar[self.p_bar > 0]
        return (-(p * p.log()).sum() / math.log(self.d_vocab)).item()

    @property
    def argmax_share(self) -> float:
        """Share of inputs whose argmax is the most common argmax."""
        return self.argmax_counts.max().item() / self.n

    @property
    def distinct_argmax(self) -> int:
        """Number of distinct argmax tokens over the inputs."""
        return int((self.argmax_counts > 0).sum())

    def plot(self) -> Any:
        """The sorted V·p̄ curve on a log axis: how many orders of magnitude separate favourite and least favourite."""
        fig = new_figure()
        ax = fig.subplots()
        p_bar = self.p_bar.double()
        ax.semilogy(torch.sort(p_bar * p_bar.numel(), descending=True).values.numpy())
        ax.axhline(1.0, color="k", linestyle="--", label="uniform")
        ax.set_xlabel("token rank")
        ax.set_ylabel("V · p̄")
        ax.legend()
        return fig

    def show(self, top: int = 40) -> Any:
        """circuitsvis ``colored_tokens`` of the ``top`` most preferred tokens, coloured by log10(V·p̄)."""
        from circuitsvis.tokens import colored_tokens

        p_bar = self.p_bar.double()
        values, ids = p_bar.topk(min(top, p_bar.numel()))
        labels = [self.token_strings[i] if self.token_strings else str(i) for i in ids.tolist()]
        return colored_tokens(tokens=labels, values=torch.log10(values * p_bar.numel()).float().tolist())

    def summary(self) -> str:
        top = self.to_pandas().head(5)
        names = ", ".join(
            f"{t if s is None else repr(s)} ({r:.1f}×)" for t, s, r in zip(top.token, top.get("token_str", [None] * len(top)), top.ratio_to_uniform)
        )
        return (
            f"token preference over {self.n} inputs (V = {self.d_vocab}):\n"
            f"  max/min p̄ = {self.max_min_ratio:.3g}, V·max p̄ = {self.uniform_ratio:.3g}, "
            f"H(p̄)/log V = {self.entropy_ratio:.4f}\n"
            f"  argmax: {self.distinct_argmax} distinct tokens, the most common takes {self.argmax_share:.1%} of inputs\n"
            f"  seed-fixed: Kendall τ between the mean logits of two disjoint input halves = {self.tau_halves:.3f}\n"
            f"  favourites: {names}"
        )

    def to_pandas(self) -> pd.DataFrame:
        """The ``top_k`` most preferred tokens: p̄, its ratio to uniform, and how often each is the argmax."""
        order = torch.argsort(self.p_bar, descending=True)[: self.top_k]
        return pd.DataFrame(
            {
                "rank": range(1, len(order) + 1),
                "token": order.tolist(),
                **({"token_str": [self.token_strings[i] for i in order]} if self.token_strings else {}),
                "p_bar": self.p_bar[order].tolist(),
                "ratio_to_uniform": (self.p_bar[order] * self.d_vocab).tolist(),
                "mean_logit": self.mean_logits[order].tolist(),
                "argmax_count": self.argmax_counts[order].tolist(),
            }
        )

    def headline(self) -> dict[str, Any]:
        return {
            "max_min_ratio": self.max_min_ratio,
            "uniform_ratio": self.uniform_ratio,
            "entropy_ratio": self.entropy_ratio,
            "argmax_share": self.argmax_share,
            "distinct_argmax": self.distinct_argmax,
            "tau_halves": self.tau_halves,
        }


@dataclass(frozen=True)
class TokenPreference(Analysis[TokenPreferenceResult]):
    """Measure p̄ over the inputs from the readout at the last position: the state the model unembeds."""

    name: ClassVar[str] = "token_preference"
    order = 10
    trained_order = 60
    top_k: int = 20  # rows of the favourites table

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        return {"final": adapter.readout_probe()}

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> TokenPreferenceResult:
        final = kept["final"]  # [N, d_model]
        n = final.shape[0]
        half = n // 2
        d_vocab = adapter.info.d_vocab
        p_sum = torch.zeros(d_vocab, dtype=torch.float64)
        logit_sums = torch.zeros(2, d_vocab, dtype=torch.float64)  # first half, second half
        argmax_counts = torch.zeros(d_vocab, dtype=torch.long)
        for start in range(0, n, _LOGIT_CHUNK):
            logits = adapter.unembed(final[start : start + _LOGIT_CHUNK]).cpu().double()  # [chunk, V]
            p_sum += logits.softmax(dim=-1).sum(0)
            argmax_counts += torch.bincount(logits.argmax(dim=-1), minlength=d_vocab)
            rows = torch.arange(start, start + logits.shape[0])
            logit_sums[0] += logits[rows < half].sum(0)
            logit_sums[1] += logits[rows >= half].sum(0)
        tau = float("nan")
        if half >= 1:
            tau = float(kendalltau(logit_sums[0].numpy(), logit_sums[1].numpy()).statistic)
        return TokenPreferenceResult(
            p_bar=p_sum / n,
            mean_logits=logit_sums.sum(0) / n,
            argmax_counts=argmax_counts,
            tau_halves=tau,
            n=n,
            top_k=self.top_k,
            token_strings=_token_strings(adapter.model, d_vocab),
        )


def _token_strings(model: Any, d_vocab: int) -> list[str] | None:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        return None
    known = min(len(tokenizer), d_vocab)  # models often pad d_vocab beyond the tokenizer's vocabulary
    try:  # the text each token stands for (" the"), not the tokenizer's byte-level spelling ("Ġthe")
        strings = list(tokenizer.batch_decode([[i] for i in range(known)]))
    except Exception:  # noqa: BLE001 - a tokenizer that cannot decode single IDs: its own spelling
        strings = list(tokenizer.convert_ids_to_tokens(list(range(known))))
    return strings + [f"<{i}>" for i in range(known, d_vocab)]
