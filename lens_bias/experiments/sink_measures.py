"""The measurements of the attention-sink experiments, each a table from a model: the positional variance at init
(experiment 1), the sink per layer, init against trained (2), the interventions that move it (3, also run on
pretrained models by :mod:`~lens_bias.experiments.real_model`) and one model's sink and positional spread (4).

:mod:`~lens_bias.experiments.sink_training` trains the models and runs these on them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import pandas as pd
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.analyses.base import measure
from lens_bias.analyses.positional_variance import PositionalVariance
from lens_bias.analyses.sinks import Sinks, SinksResult
from lens_bias.core.inputs import RandomTokens
from lens_bias.hooks.attention import MaskToSelf, UniformAttention
from lens_bias.hooks.base import Intervention
from lens_bias.hooks.headwise_rmsnorm import HeadwiseRMSNorm
from lens_bias.hooks.variance import AmplifyVariance, ScaleNorm
from lens_bias.models import ModelSpec, random_init

__all__ = ["init_variance_table", "sinks_by_layer", "intervention_table", "parity_row"]


def init_variance_table(spec: ModelSpec, position: int, n_sequences: int, seq_len: int, seeds: Sequence[int] = (0, 1), *,
                        progress: bool = False) -> pd.DataFrame:
    """Experiment 1: r_t at init for softmax and uniform attention, two seeds, MaskToSelf, HeadwiseRMSNorm: inits of
    ``spec`` on ``n_sequences`` random sequences of ``seq_len`` tokens, the interventions at ``position``."""
    k = position
    tokens = RandomTokens(n_sequences, seq_len, spec.d_vocab, seed=7)  # random_tokens' IDs, drawn per batch
    conditions: list[tuple[str, int, float, list[Intervention]]] = []
    for seed in seeds:
        conditions += [(f"softmax, seed {seed}", seed, spec.init_std, []), (f"uniform, seed {seed}", seed, spec.init_std, [UniformAttention()])]
    conditions += [
        (f"MaskToSelf({k}), seed {seeds[0]}", seeds[0], spec.init_std, [MaskToSelf(position=k)]),
        (f"HeadwiseRMSNorm, seed {seeds[0]}", seeds[0], spec.init_std, [HeadwiseRMSNorm(gain=False)]),
        (f"softmax, init std 0.2, seed {seeds[0]}", seeds[0], 0.2, []),
    ]
    rows = []
    for name, seed, std, ivs in tqdm(conditions, desc="init variance", disable=not progress):
        res = measure(random_init(replace(spec, seed=seed, init_std=std)), tokens, [PositionalVariance()], interventions=ivs).of(PositionalVariance)
        r, t = res.r_out[0], res.r_out.shape[1]
        rows.append({
            "condition": name, "alpha_layer0": res.alpha_out()[0].item(), "alpha_heads_z": res.alpha_z()[0].mean().item(),
            "max_dev_sqrt_law": res.law_deviation()[0].item(), f"r_{k}": r[k].item(), f"r_{k}_law": (k + 1) ** -0.5,
            f"r_{t - 1}": r[-1].item(), "alpha_by_layer": [round(a, 3) for a in res.alpha_out().tolist()],
        })
    return pd.DataFrame(rows)


def sinks_by_layer(init: SinksResult, trained: SinksResult, eps: float) -> pd.DataFrame:
    """Experiment 2: per layer, Sink_0 at ε and at 0.1, first-token share and residual norm ratio, init vs trained."""
    rows = []
    for layer in range(trained.alpha_mean.shape[0]):
        row: dict[str, Any] = {"layer": layer}
        for name, res in (("init", init), ("trained", trained)):
            row[f"{name}_sink0@{eps:g}"] = res.rate_by_head(0, eps)[layer].mean().item()
            row[f"{name}_sink0@0.1"] = res.rate_by_head(0, 0.1)[layer].mean().item()
            row[f"{name}_share0"] = res.share(0)[layer].mean().item()
            row[f"{name}_norm_ratio0"] = res.norm_ratio[layer].item()
        rows.append(row)
    return pd.DataFrame(rows)


def intervention_table(model: Any, tokens: Tensor, position: int, factor: float, eps: float, baseline: SinksResult | None = None) -> pd.DataFrame:
    """Experiment 3: α_k (mean ± SE over sequences) and Sink_k under each intervention, against the baseline.

    ``baseline``: the unedited model's Sinks result on ``tokens`` at ``eps``, when already computed.
    """
    conditions: list[tuple[str, list[Intervention]]] = [
        ("baseline", []),
        (f"MaskToSelf({position})", [MaskToSelf(position=position)]),
        (f"AmplifyVariance({position}, {factor:g})", [AmplifyVariance(position=position, factor=factor)]),
        (f"ScaleNorm({position}, {factor:g})", [ScaleNorm(position=position, factor=factor)]),
    ]
    per_sequence: dict[str, Tensor] = {}
    rows = []
    for name, ivs in conditions:
        if not ivs and baseline is not None:
            res = baseline
        else:
            res = measure(model, tokens, [Sinks(eps=eps, per_sequence=True)], interventions=ivs).of(Sinks)
        alpha_k = res.per_sequence()[..., position].mean(dim=(1, 2))  # [n]: mean over layers and heads
        per_sequence[name] = alpha_k
        diff = alpha_k - per_sequence["baseline"]
        se_diff = diff.std() / len(diff) ** 0.5
        rows.append({
            "condition": name, f"alpha_{position}": alpha_k.mean().item(), "se": (alpha_k.std() / len(alpha_k) ** 0.5).item(),
            "diff_vs_baseline": diff.mean().item(), "diff_in_se": (diff.mean() / se_diff).item() if se_diff > 0 else 0.0,
            f"sink{position}@{eps:g}": res.rate(eps)[position].item(), f"sink{position}@0.1": res.rate(0.1)[position].item(),
            "sink0@0.1": res.rate(0.1)[0].item(), "share0": res.share(0).mean().item(),
        })
    return pd.DataFrame(rows)


def parity_row(model: Any, sinks: SinksResult, interventions: Sequence[Intervention], *, n_sequences: int, seq_len: int, vocab: int,
               eps: float) -> dict[str, float]:
    """Experiment 4's numbers of one model: its sink on text (``sinks``, read at ``eps``), and its positional spread
    across ``n_sequences`` *random* sequences of ``seq_len`` IDs below ``vocab`` (on text every sequence starts with
    the same BOS)."""
    variance = measure(model, RandomTokens(n_sequences, seq_len, vocab, seed=7), [PositionalVariance()], interventions=interventions)
    spread = variance.of(PositionalVariance)
    return {
        f"sink0@{eps:g}": sinks.rate(eps)[0].item(), "sink0@0.1": sinks.rate(0.1)[0].item(), "share0": sinks.share(0).mean().item(),
        "norm_ratio0_max": sinks.norm_ratio.max().item(), "alpha_out_mean": spread.alpha_out().mean().item(),
        "r_last_mean": spread.r_out[:, -1].mean().item(),
    }
