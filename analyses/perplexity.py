"""Perplexity of held-out tokens, with or without interventions: the yardstick of the real-model ablations.

``perplexity(model, tokens)`` is exp of the mean next-token negative log-likelihood over every position of
``[n, seq]`` token IDs (position t predicts token t + 1; ``n · (seq − 1)`` predictions), with the log-softmax in
float32 whatever the model's dtype. Interventions are attached only for the passes, through
:func:`lens_bias.hooks.base.intervene`; the model is left as it was. :class:`PerplexityTable` is the result of the
experiments that compare several edits on the same tokens (``massive_ablation``, ``super_weight_table``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Sequence

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.analyses.base import Result
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.probes import on_device
from lens_bias.core.token_inputs import takes_token_inputs
from lens_bias.hooks.base import InterventionLike, fix_for_inputs, intervene

__all__ = ["perplexity", "PerplexityTable", "perplexity_table"]

logger = logging.getLogger(__name__)

# Float32 logits per forward pass: the default batch keeps [batch, seq, d_vocab] within 256 MB.
_LOGIT_FLOATS_PER_BATCH = 2**26


def _check_tokens(adapter: ModelAdapter, tokens: Any) -> None:
    if tokens.shape[0] < 1 or tokens.shape[1] < 2:
        raise LensBiasError(f"perplexity needs at least 1 sequence of at least 2 tokens, got {tuple(tokens.shape)}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= adapter.info.d_vocab:
        raise LensBiasError(f"token IDs must lie in [0, {adapter.info.d_vocab}), the model's vocabulary; got [{int(tokens.min())}, {int(tokens.max())}]")
    adapter.check_inputs(tokens)


@takes_token_inputs
@one_adapter_per_call
def perplexity(
    model: Any,
    inputs: Int[Tensor, "n seq"],
    *,
    interventions: Sequence[InterventionLike] = (),
    batch_size: int | None = None,
    progress: bool = True,
) -> float:
    """exp(mean next-token NLL) of ``inputs`` under ``model``, with ``interventions`` attached for the passes.

    >>> import lens_bias
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=32, seed=0)
    >>> ppl = perplexity(m, lens_bias.random_tokens(4, 16, 97, seed=0))
    >>> 50 < ppl < 200  # a random init is about uniform over its 97 tokens
    True

    Args:
        model: a TransformerLens model; never modified.
        inputs: token IDs ``[n, seq]``, seq >= 2.
        interventions: lens_bias.hooks interventions (or lists of them), attached with ``intervene``.
        batch_size: sequences per forward pass (default: keeps the float32 logits of a batch within 256 MB).
        progress: a tqdm bar over batches.

    Returns:
        The perplexity, a Python float.
    """
    adapter = ModelAdapter.of(model)
    _check_tokens(adapter, inputs)
    n, seq_len = inputs.shape
    if batch_size is None:
        batch_size = max(1, min(adapter.default_batch_size(seq_len), _LOGIT_FLOATS_PER_BATCH // (seq_len * adapter.info.d_vocab)))
    elif isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise LensBiasError(f"batch_size must be a positive int or None, got {batch_size!r}")
    interventions = fix_for_inputs(model, interventions, inputs, batch_size)  # batch-free edits: the same at any batch size
    total: Tensor | None = None  # the summed NLL where the logits are (float64; float32 on MPS, which has none), read once
    was_training = model.training
    if was_training:
        model.eval()
    try:
        with torch.inference_mode(), intervene(model, *interventions):
            for start in tqdm(range(0, n, batch_size), desc="perplexity", disable=not progress, unit="batch"):
                batch = on_device(inputs[start : start + batch_size], adapter.device)
                logits = model(batch)[:, :-1].float()  # [batch, seq - 1, d_vocab]
                loss = F.cross_entropy(logits.flatten(0, 1), on_device(batch[:, 1:].flatten(), logits.device), reduction="sum")
                total = loss.to(torch.float32 if loss.device.type == "mps" else torch.float64) if total is None else total + loss
            assert total is not None  # n >= 1 (_check_tokens)
            nll = total.item() / (n * (seq_len - 1))
    finally:
        if was_training:
            model.train()
    logger.debug("perplexity: mean NLL %.4f over %d predictions", nll, n * (seq_len - 1))
    return math.exp(nll)


@dataclass
class PerplexityTable(Result):
    """Perplexity of the same held-out tokens under several conditions; the first condition is the baseline."""

    title: str
    conditions: list[str]
    descriptions: list[str]  # what each condition edits, in words
    perplexities: list[float]
    interventions: list[list[dict[str, Any]]]  # each condition's interventions, as to_dict()
    n_sequences: int
    seq_len: int

    def to_pandas(self) -> pd.DataFrame:
        base = self.perplexities[0]
        return pd.DataFrame(
            {
                "condition": self.conditions,
                "edit": self.descriptions,
                "perplexity": self.perplexities,
                "ratio": [p / base for p in self.perplexities],
            }
        )

    def headline(self) -> dict[str, Any]:
        return {"n_sequences": self.n_sequences, "seq_len": self.seq_len, **dict(zip(self.conditions, self.perplexities))}

    def summary(self) -> str:
        lines = [f"{self.title} (perplexity of {self.n_sequences} held-out sequences of {self.seq_len} tokens):"]
        for name, edit, ppl in zip(self.conditions, self.descriptions, self.perplexities):
            lines.append(f"  {name:<14} {ppl:>12.4g}  ({ppl / self.perplexities[0]:.3g}× baseline)  {edit}")
        return "\n".join(lines)


@one_adapter_per_call
def perplexity_table(
    model: Any,
    eval_tokens: Int[Tensor, "n seq"],
    conditions: Sequence[tuple[str, str, Sequence[Any]]],
    *,
    title: str,
    batch_size: int | None = None,
    progress: bool = True,
) -> PerplexityTable:
    """A :class:`PerplexityTable` from ``(name, description, interventions)`` triples, the baseline first."""
    ppls = [perplexity(model, eval_tokens, interventions=ivs, batch_size=batch_size, progress=progress) for _, _, ivs in conditions]
    return PerplexityTable(
        title=title,
        conditions=[name for name, _, _ in conditions],
        descriptions=[desc for _, desc, _ in conditions],
        perplexities=ppls,
        interventions=[[iv.to_dict() for iv in ivs] for _, _, ivs in conditions],
        n_sequences=int(eval_tokens.shape[0]),
        seq_len=int(eval_tokens.shape[1]),
    )
