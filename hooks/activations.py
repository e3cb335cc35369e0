"""Set residual-stream activations to fixed values: Sun et al.'s intervention on massive activations.

``SetActivations(layer=l, dims=(d,), positions=(0,), values=(v,))`` writes ``h[:, p, d] = v`` into the output of
block ``l`` (``blocks.{l}.hook_resid_post``), for every sequence. Zero destroys a model whose massive activations
act as fixed biases; their mean over many sequences leaves it intact (Sun et al., "Massive Activations in Large
Language Models", 2024).

``hook_resid_post`` is a live edit point on TL 3 and on TL 4 bridges (native and HF-built): the edited value is
what the next block and the final norm read. Tests check it against editing ``blocks.{l+1}.hook_resid_pre`` and,
for the last block, against the final norm and unembedding applied by hand. (``hook_resid_mid`` on a TL 4.3
bridge is not: an edit there does not reach the residual sum, so edits inside a block go to ``hook_attn_out`` /
``hook_mlp_out``.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.probes import FwdHook, on_device
from lens_bias.hooks.base import Intervention

__all__ = ["SetActivations"]


def _index_tuple(values: Any, name: str) -> tuple[int, ...]:
    try:
        out = tuple(values)
    except TypeError:
        raise LensBiasError(f"SetActivations: {name} must be a sequence of non-negative ints, got {values!r}") from None
    if not out or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in out):
        raise LensBiasError(f"SetActivations: {name} must be a non-empty sequence of non-negative ints, got {values!r}")
    return out


@dataclass(frozen=True)
class SetActivations(Intervention):
    """Set dimensions ``dims`` of block ``layer``'s output to ``values`` at ``positions`` (0 = first token).

    ``values`` holds one number per dimension (the same at every listed position), or one number for all of
    them. For different values at different positions, compose several (``a + b``).

    >>> SetActivations(layer=11, dims=(507,), values=(0.0,)).to_dict()
    {'type': 'SetActivations', 'layers': None, 'layer': 11, 'dims': [507], 'positions': [0], 'values': [0.0]}
    """

    layer: int = 0
    dims: tuple[int, ...] = (0,)
    positions: tuple[int, ...] = (0,)
    values: tuple[float, ...] = (0.0,)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers is not None:
            raise LensBiasError("SetActivations edits one block: pass layer=, not layers=")
        if isinstance(self.layer, bool) or not isinstance(self.layer, int) or self.layer < 0:
            raise LensBiasError(f"SetActivations: layer must be a non-negative int, got {self.layer!r}")
        object.__setattr__(self, "dims", _index_tuple(self.dims, "dims"))
        object.__setattr__(self, "positions", _index_tuple(self.positions, "positions"))
        values = (self.values,) if isinstance(self.values, (int, float)) else tuple(self.values)
        if len(values) not in (1, len(self.dims)) or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise LensBiasError(
                f"SetActivations: values must be one number, or one per dim ({len(self.dims)}); got {self.values!r}"
            )
        object.__setattr__(self, "values", tuple(float(v) for v in values))

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        adapter = ModelAdapter.of(model)
        info = adapter.info
        if self.layer >= info.n_layers:
            raise LensBiasError(f"SetActivations: layer {self.layer} does not exist; the model has {info.n_layers} layers")
        too_wide = [d for d in self.dims if d >= info.d_model]
        if too_wide:
            raise LensBiasError(f"SetActivations: dims {too_wide} do not exist; d_model is {info.d_model}")
        name = f"blocks.{self.layer}.hook_resid_post"
        adapter.require([name], "SetActivations")
        positions, dims = list(self.positions), list(self.dims)
        values = torch.tensor(self.values).expand(len(dims))

        def hook_fn(resid: Tensor, hook: Any) -> Tensor:  # [batch, pos, d_model]
            if max(positions) >= resid.shape[1]:
                raise LensBiasError(
                    f"SetActivations(positions={tuple(positions)}) on sequences of {resid.shape[1]} tokens: use positions < {resid.shape[1]}"
                )
            resid = resid.clone()
            for p in positions:
                resid[:, p, dims] = on_device(values, resid.device, resid.dtype)
            return resid

        return [(name, hook_fn)]
