"""Variance edits of one token's attention output at ``blocks.L.hook_attn_out`` (Li et al., "The Structural Origin
of Attention Sink"); positions are 0-based, the first token is position 0.

- AmplifyVariance(position=k, factor=λ): o_k ← λ(o_k − μ) + μ, μ the mean at position k over the inputs. Spreads
  token k's attention output across sequences like the first token's. ``analyze``, ``measure``, ``perplexity`` and
  ``sink_attribution`` take μ once over all their inputs (:meth:`AmplifyVariance.fixed_for`: one pass per edited
  layer, in order), so the numbers do not depend on how the inputs are split into batches; inside a bare
  ``intervene`` block, which sees one batch at a time, μ is the batch's mean.
- ScaleNorm(position=k, factor=λ): o_k ← λ·o_k, the control: a larger norm but the same *relative* spread.

``hook_attn_out`` is a live edit point on TL 3 and on TL 4 bridges (native and HF-built): tests check each edit
against a direct computation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import Inputs
from lens_bias.core.probes import FwdHook, Probe, on_device
from lens_bias.hooks.base import Intervention, check_in_sequence, check_position, edit_hooks

__all__ = ["AmplifyVariance", "ScaleNorm"]


@dataclass(frozen=True)
class _EditAtPosition(Intervention):
    """Shared part of AmplifyVariance and ScaleNorm: replace o_k, token k's attention output, by what ``_editor(layer)`` makes of it."""

    position: int = 0
    factor: float = 4.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_position(self.position, type(self).__name__)

    def _editor(self, layer: int) -> Callable[[Tensor], Tensor]:
        """The edit of o_k at ``layer``: [batch, d_model] -> [batch, d_model]."""
        raise NotImplementedError

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        k, name, edit = self.position, type(self).__name__, self._editor(layer)

        def hook_fn(out: Tensor, hook: Any) -> Tensor:  # [batch, pos, d_model]
            check_in_sequence(k, out.shape[1], name)
            out = out.clone()
            out[:, k] = edit(out[:, k])
            return out

        return [(f"blocks.{layer}.hook_attn_out", hook_fn)]


@dataclass(frozen=True)
class AmplifyVariance(_EditAtPosition):
    """Mean-centred amplification of token ``position``'s attention output: λ(o_k − μ) + μ, μ its mean over the
    inputs.

    ``mean`` holds μ per layer of the model (``[n_layers][d_model]``), fixed for a set of inputs by
    :meth:`fixed_for`, which ``analyze``, ``measure``, ``perplexity`` and ``sink_attribution`` call; without it (a bare
    ``intervene`` block) μ is the batch's mean, and batches need at least 2 sequences.

    >>> AmplifyVariance(position=10, factor=4.0, layers=[1]).to_dict()
    {'type': 'AmplifyVariance', 'layers': [1], 'position': 10, 'factor': 4.0, 'mean': None}
    """

    mean: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mean is not None:
            object.__setattr__(self, "mean", tuple(tuple(float(v) for v in row) for row in self.mean))

    def _editor(self, layer: int) -> Callable[[Tensor], Tensor]:
        factor = float(self.factor)
        fixed = None if self.mean is None else torch.tensor(self.mean[layer])  # made once, moved where the pass runs once

        def edit(out_k: Tensor) -> Tensor:
            nonlocal fixed
            if fixed is not None:
                mean = fixed = on_device(fixed, out_k.device, out_k.dtype)
            elif out_k.shape[0] < 2:
                raise LensBiasError("AmplifyVariance inside intervene() centres on each batch's mean: run batches of at least 2 sequences, or pass "
                                    "it to analyze / measure / perplexity (interventions=...), which take the mean once over all the inputs")
            else:
                mean = out_k.mean(dim=0, keepdim=True)
            return factor * (out_k - mean) + mean

        return edit

    def fixed_for(self, model: Any, inputs: Inputs, others: Sequence[Any] = (), batch_size: int | None = None) -> "AmplifyVariance":
        """This edit with μ taken once over ``inputs``: layer by layer, in order, each mean measured with the edits of
        the layers before it (and ``others``, the edits it is applied with) attached, so the result equals one
        batch of every input and does not depend on the batch size. One pass per edited layer, each stopped there."""
        if self.mean is not None:
            return self
        check_in_sequence(self.position, int(inputs.shape[1]), "AmplifyVariance")
        adapter = ModelAdapter.of(model)
        k, n = self.position, int(inputs.shape[0])
        means = torch.zeros(adapter.info.n_layers, adapter.info.d_model, dtype=torch.float64)
        done = replace(self, mean=tuple(map(tuple, means.tolist())), layers=())
        for layer in self.model_layers(model):
            probe = Probe(f"blocks.{layer}.hook_attn_out", f"sum@{k}", lambda out: out[:, k].double().sum(dim=0), combine="sum")
            hooks = edit_hooks(model, [*others, done] if done.layers else list(others))
            means[layer] = adapter.collect(inputs, [probe], batch_size=batch_size, hooks=hooks, progress=False)[probe.key] / n
            done = replace(done, mean=tuple(map(tuple, means.tolist())), layers=(*(done.layers or ()), layer))
        return replace(self, mean=tuple(map(tuple, means.tolist())))


@dataclass(frozen=True)
class ScaleNorm(_EditAtPosition):
    """Plain scaling of token ``position``'s attention output, λ·o_k: the control for :class:`AmplifyVariance`.

    >>> ScaleNorm(position=10, factor=4.0).to_dict()
    {'type': 'ScaleNorm', 'layers': None, 'position': 10, 'factor': 4.0}
    """

    def _editor(self, layer: int) -> Callable[[Tensor], Tensor]:
        factor = float(self.factor)
        return lambda out_k: factor * out_k
