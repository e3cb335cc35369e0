"""Remove the sinks a model declares: every head's learned sink logit set to −∞ (GPT-OSS).

A learned sink is a per-head logit that joins the softmax as one more column, owned by no key; ``hook_pattern``
keeps only the keys, so each row sums to 1 minus the sink's share. Setting that logit to −∞ is the softmax over the
keys alone, which is each row of the pattern divided by its sum: the edit acts at ``blocks.L.attn.hook_pattern``
and leaves the weights alone. What the freed attention does instead (go to key 0, spread over the keys) is what
``sink_attribution``'s "learned sinks removed" condition measures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.probes import FwdHook
from lens_bias.hooks.base import Intervention

__all__ = ["RemoveLearnedSinks"]


def _keys_only(pattern: Tensor, hook: Any) -> Tensor:
    """softmax over the keys alone: the row over its sum (the learned sink's share goes back to the keys, in
    proportion to what each already had)."""
    return pattern / pattern.sum(dim=-1, keepdim=True)


@dataclass(frozen=True)
class RemoveLearnedSinks(Intervention):
    """Every head's learned sink logit at −∞: attention goes to the keys only, as in a plain softmax.

    >>> RemoveLearnedSinks(layers=[1]).to_dict()
    {'type': 'RemoveLearnedSinks', 'layers': [1]}
    """

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        if not ModelAdapter.of(model).info.learned_sinks:
            raise LensBiasError("RemoveLearnedSinks: this model declares no learned sink (no attention module has a `sinks` logit); its rows already sum to 1")
        return super().fwd_hooks(model)

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        return [(f"blocks.{layer}.attn.hook_pattern", _keys_only)]
