"""Super experts: super weights found per expert of a mixture of experts (Su et al., "Unveiling Super Experts in
Mixture-of-Experts Large Language Models", 2025; Yu et al.'s spike rule within each expert).

A mixture of experts has no single down-projection per layer: each token goes through ``top_k`` of the layer's
experts. At one position (the first token, where the massive activation lives), the pass keeps the block's input
(``blocks.{l}.mlp.hook_in``); each expert then runs, through the model's own expert code
(:mod:`lens_bias.core.experts`), on the states its router actually sent it. Per (layer, expert): the largest
|unit| entering its down-projection and the largest |value| leaving it, and where. Where both exceed Yu et al.'s
:data:`~lens_bias.analyses.super_weights.SPIKE`, the output's residual dim (row) and the input's unit (col) name
one weight, ``down_proj[expert][row, col]``: a super expert's super weight, ``(layer, expert, row, col)``, which
:class:`lens_bias.hooks.weights.RemoveWeight` removes with ``expert=``. The unit is the expert's super neuron.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_bias.analyses.base import Analysis, Planned, Result, measure
from lens_bias.analyses.super_weights import SPIKE, check_top_and_position
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.experts import expert_activations, moe_layer, moe_layers, route
from lens_bias.core.inputs import InputSpec
from lens_bias.core.model_facts import ModelInfo
from lens_bias.core.probes import Probe
from lens_bias.core.token_inputs import takes_token_inputs
from lens_bias.hooks.base import InterventionLike
from lens_bias.hooks.weights import RemoveWeight

__all__ = ["super_experts", "SuperExpertsResult"]

logger = logging.getLogger(__name__)


def _states_at(position: int) -> Any:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [batch, d]: the block's input at the position
        if position >= x.shape[1]:
            raise LensBiasError(f"super_experts: position {position} is outside sequences of {x.shape[1]} tokens")
        return x[:, position]

    return fn


@dataclass
class SuperExpertsResult(Result):
    """Per (MoE layer, expert), on the sequences routed to it at the position: its down-projection's spikes and the
    weight that joins them. Row i of each tensor is layer ``layers[i]``."""
    column_words: ClassVar[Mapping[str, str]] = {
        "input_spike": "input spike max |x|", "output_spike": "output spike max |y|", "row": "row (residual dim)", "col": "col (MLP unit)",
    }

    layers: list[int]  # the blocks with a mixture of experts (DeepSeek-V3's first blocks are dense)
    n_routed: Int[Tensor, "moe_layer expert"]  # sequences whose token at the position went to the expert
    input_max: Float[Tensor, "moe_layer expert"]  # max |unit| entering the expert's down_proj (0 where none was routed)
    input_unit: Int[Tensor, "moe_layer expert"]  # the unit (col) holding it
    output_max: Float[Tensor, "moe_layer expert"]  # max |value| leaving it, before the router's weight
    output_dim: Int[Tensor, "moe_layer expert"]  # the residual dim (row) holding it
    weight: Float[Tensor, "moe_layer expert"]  # down_proj[expert][row, col]
    n_sequences: int
    top: int
    position: int = 0

    heading = "Super experts"
    headline_labels = {"layer": "top candidate: layer", "expert": "expert", "row": "row (residual dim)", "col": "col (expert unit)"}

    def spikes(self) -> Float[Tensor, "moe_layer expert"]:
        """Yu et al.'s score: the smaller of the input and output spike."""
        return torch.minimum(self.input_max, self.output_max)

    def coordinates(self) -> list[tuple[int, int, int, int]]:
        """The ``top`` candidates by spike as ``(layer, expert, row, col)``, whether or not they pass the rule."""
        order = self.spikes().flatten().argsort(descending=True)[: self.top].tolist()
        n_experts = self.spikes().shape[1]
        return [(self.layers[i // n_experts], i % n_experts, int(self.output_dim.flatten()[i]), int(self.input_unit.flatten()[i])) for i in order]

    def found(self) -> list[tuple[int, int, int, int]]:
        """The super experts' weights: candidates whose input and output both spike above ``SPIKE``."""
        return [c for c in self.coordinates() if self._at(self.spikes(), c) > SPIKE]

    def _at(self, values: Tensor, coordinate: tuple[int, ...]) -> Tensor:
        return values[self.layers.index(coordinate[0]), coordinate[1]]

    def best(self) -> RemoveWeight:
        """The intervention that removes the top candidate."""
        layer, expert, row, col = self.coordinates()[0]
        return RemoveWeight(layer=layer, expert=expert, row=row, col=col)

    def to_pandas(self) -> pd.DataFrame:
        """Every (layer, expert), largest spike first: sequences routed, spikes, where, the weight, whether it passes."""
        spikes = self.spikes()
        rows = [{"layer": layer, "expert": e, "n_routed": int(self.n_routed[i, e]), "row": int(self.output_dim[i, e]), "col": int(self.input_unit[i, e]),
                 "weight": self.weight[i, e].item(), "input_spike": self.input_max[i, e].item(), "output_spike": self.output_max[i, e].item(),
                 "spike": spikes[i, e].item(), "super": bool(spikes[i, e] > SPIKE)}
                for i, layer in enumerate(self.layers) for e in range(spikes.shape[1])]
        return pd.DataFrame(rows).sort_values("spike", ascending=False, kind="stable").reset_index(drop=True)

    def headline(self) -> dict[str, Any]:
        top = self.coordinates()[0]
        layer, expert, row, col = top
        return {"n_sequences": self.n_sequences, "layer": layer, "expert": expert, "row": row, "col": col,
                "weight": self._at(self.weight, top).item(), "spike": self._at(self.spikes(), top).item(), "n_found": len(self.found())}

    def summary(self) -> str:
        h = self.headline()
        where = f"layer {h['layer']} expert {h['expert']} down_proj[{h['row']}, {h['col']}] = {h['weight']:.4g}"
        if not h["n_found"]:
            return (f"super experts (position {self.position}, {h['n_sequences']} sequences): none found; the largest spike, "
                    f"{h['spike']:.3g} at {where}, does not exceed {SPIKE:g} in and out")
        return f"super experts (position {self.position}, {h['n_sequences']} sequences): {h['n_found']} found; the largest, {where}, spikes {h['spike']:.4g}"


@dataclass(frozen=True)
class SuperExperts(Analysis[SuperExpertsResult]):
    """Super weights per expert of a mixture of experts, from the experts' own down-projection spikes (see module
    docstring)."""

    name: ClassVar[str] = "super_experts"
    order = 79
    trained_order = 26
    # Candidates in coordinates() (the table lists every expert).
    top: int = 5
    # The position whose spikes are read; the first token by default, as for super weights.
    position: int = 0

    def __post_init__(self) -> None:
        check_top_and_position(self.top, self.position)

    def applies_to(self, info: ModelInfo) -> bool:
        return info.n_experts is not None

    def planned(self, adapter: ModelAdapter) -> Planned:
        if adapter.info.n_experts is None:
            return Planned(self, {}, f"{self.name} reads the experts of a mixture of experts; this model has one MLP per layer (see super_weights)")
        if not moe_layers(adapter.model):
            return Planned(self, {}, f"{self.name} reads Hugging Face sparse mixture-of-experts blocks (fused experts with a down_proj [expert, ...] "
                                     f"and a router) through a TransformerLens 4 bridge; this {type(adapter.model).__name__} has none")
        return super().planned(adapter)

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        return {layer: Probe(f"blocks.{layer}.mlp.hook_in", f"states@{self.position}", _states_at(self.position))
                for layer in moe_layers(adapter.model)}

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> SuperExpertsResult:
        fields: dict[str, list[list[Any]]] = {k: [] for k in ("n_routed", "input_max", "input_unit", "output_max", "output_dim", "weight")}
        layers = moe_layers(adapter.model)
        for layer in layers:
            moe = moe_layer(adapter.model, layer, self.name)
            down: Tensor = moe.experts.down_proj
            states = kept[layer].to(device=down.device, dtype=down.dtype)
            with torch.no_grad():
                _, indices = route(moe, states)
            row: dict[str, list[Any]] = {k: [] for k in fields}
            for expert in range(moe.n_experts):
                routed = (indices == expert).any(dim=-1)
                row["n_routed"].append(int(routed.sum()))
                if not routed.any():  # nothing went there: no spike, and no weight named
                    for k in ("input_max", "output_max", "weight"):
                        row[k].append(0.0)
                    row["input_unit"].append(0)
                    row["output_dim"].append(0)
                    continue
                units, out = expert_activations(moe, states[routed], expert)
                a_max, o_max = units.float().abs().amax(dim=0), out.float().abs().amax(dim=0)
                unit, dim = int(a_max.argmax()), int(o_max.argmax())
                row["input_max"].append(a_max[unit].item())
                row["input_unit"].append(unit)
                row["output_max"].append(o_max[dim].item())
                row["output_dim"].append(dim)
                row["weight"].append(moe.down_weight(expert)[dim, unit].float().item())
            for k in fields:
                fields[k].append(row[k])
        result = SuperExpertsResult(
            layers=layers, n_routed=torch.tensor(fields["n_routed"]), input_max=torch.tensor(fields["input_max"]), input_unit=torch.tensor(fields["input_unit"]),
            output_max=torch.tensor(fields["output_max"]), output_dim=torch.tensor(fields["output_dim"]), weight=torch.tensor(fields["weight"]),
            n_sequences=spec.n, top=min(self.top, len(layers) * len(fields["weight"][0])), position=self.position,
        )
        logger.info("super expert candidates: %s", result.coordinates())
        return result


@takes_token_inputs
@one_adapter_per_call
def super_experts(
    model: Any,
    inputs: Int[Tensor, "n seq"],
    *,
    top: int = 5,
    position: int = 0,
    interventions: Sequence[InterventionLike] = (),
    batch_size: int | None = None,
    progress: bool = True,
) -> SuperExpertsResult:
    """Super weights per expert of a mixture of experts, ``(layer, expert, row, col)``; see module docstring.

    >>> import lens_bias
    >>> from transformers import MixtralConfig, MixtralForCausalLM
    >>> hf = MixtralForCausalLM(MixtralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
    ...                                       num_key_value_heads=1, vocab_size=50, num_local_experts=4))
    >>> r = super_experts(lens_bias.from_hf(hf), lens_bias.random_tokens(8, 6, 50), top=3)
    >>> len(r.coordinates()), r.to_pandas().columns.tolist()[:3]
    (3, ['layer', 'expert', 'n_routed'])

    Args:
        model: a TransformerLens 4 bridge of a Hugging Face mixture-of-experts model; never modified.
        inputs: token IDs ``[n, seq]``.
        top: candidates in :meth:`SuperExpertsResult.coordinates`.
        position: the position whose spikes are read (the first token by default).
        interventions: edits attached for the pass, e.g. removing the super weights found so far.
        batch_size: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.
        progress: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.

    Returns:
        A :class:`SuperExpertsResult`.
    """
    analysis = SuperExperts(top=top, position=position)
    why = analysis.unavailable(ModelAdapter.of(model))
    if why is not None:
        raise LensBiasError(why)
    return measure(model, inputs, [analysis], interventions=interventions, batch_size=batch_size, progress=progress).of(SuperExperts)
