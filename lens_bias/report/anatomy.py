"""The anatomy of a trained model's attention sink, read off one ``analyze`` pass: the headline of its report.

Four links, each with its numbers: the super weight (Yu et al.'s top candidate, and the share of the spike it
writes) → the massive dimension (Sun et al.: which dims, how large, from which layer) → the dimension disparity
at position 0 (max/mean |x| after the pre-attention norm) → the sink (Sink_0 and the layers that sink). Whether
each link is *necessary* is a separate, causal question: ``lens_bias.analyses.sink_attribution.sink_attribution``
edits one link at a time, and its verdicts join the anatomy when the report holds them
(``analyze(..., attribution=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import pandas as pd
import torch

from lens_bias.analyses.base import Result
from lens_bias.analyses.super_weights import SPIKE
from lens_bias.core.figures import new_figure
from lens_bias.core.serialise import Serialisable

__all__ = ["SinkAnatomy", "anatomy_of", "SINK_LAYER_RATE"]

# A layer sinks when at least this share of its (sequence, head) pairs put more than ε of their attention on token 0.
SINK_LAYER_RATE = 50.0


@dataclass
class SinkAnatomy(Serialisable):
    """The links of the first-token sink, measured in one pass (see module docstring)."""

    sink_rate: float  # Sink_0 (%) over (sequence, layer, head)
    sink_layers: list[int]  # layers where Sink_0 ≥ SINK_LAYER_RATE
    first_token_share: float  # mean α_0
    eps: float
    massive_dims: list[int]  # at position 0, at the onset layer (or the largest dim when no activation is massive)
    massive_value: float  # mean |h_0| of the first massive dim, at its peak over the block outputs
    massive_median: float  # the median |h| of that block output
    onset_layer: int | None  # where the massive activation appears (None: none by Sun et al.'s rule)
    # top candidates in spiking layers (Yu et al.'s rule, SPIKE): layer, row, col, weight, share; empty when none spikes
    super_weights: list[dict[str, Any]] = field(default_factory=list)
    # the unit writing most into the massive dim; empty when no dim is massive by Sun et al.'s rule
    super_neuron: dict[str, Any] = field(default_factory=dict)
    disparity: float = float("nan")  # max over layers of max/mean |x_0| after the pre-attention norm
    disparity_layer: int = 0
    disparity_elsewhere: float = float("nan")  # the same at the other positions
    chain: list[dict[str, Any]] = field(default_factory=list)  # sink_attribution's verdicts per link, when run
    largest_spike: float = float("nan")  # max over layers of the smaller of the down-projection's input and output spikes

    def to_pandas(self) -> pd.DataFrame:
        weight = self.super_weights[0] if self.super_weights else {}
        massive = self.onset_layer is not None
        rows = [
            ("super weight", f"layers[{weight.get('layer')}].mlp.down_proj.weight[{weight.get('row')}, {weight.get('col')}]" if weight
             else "none found by Yu et al.'s spike rule",
             f"writes {weight['share']:.0%} of the layer's output spike" if weight
             else f"largest down-projection spike {self.largest_spike:.3g} (a spike exceeds {SPIKE:g} in and out)"),
            ("super neuron", f"layer {self.super_neuron.get('layer')} unit {self.super_neuron.get('unit')}" if self.super_neuron
             else "none found: no massive dim to write into",
             f"writes {self.super_neuron['writes']:.4g} into dim {self.massive_dims[0]}" if self.super_neuron else ""),
            ("massive dims", f"{self.massive_dims} at position 0" if massive else "none found by Sun et al.'s rule",
             f"|h| {self.massive_value:.4g} vs median {self.massive_median:.3g}, from layer {self.onset_layer}" if massive
             else f"largest |h_0| {self.massive_value:.4g} (dim {self.massive_dims[0]}) vs median {self.massive_median:.3g}; "
                  "massive needs > 100 and ≥ 1000× the median"),
            ("disparity", f"max/mean |x_0| {self.disparity:.3g} (layer {self.disparity_layer})", f"other positions up to {self.disparity_elsewhere:.3g}"),
            ("sink", f"Sink_0 {self.sink_rate:.1f}% at ε {self.eps}", f"layers {_ranges(self.sink_layers) or 'none'} sink (≥ {SINK_LAYER_RATE:.0f}%)"),
        ]
        frame = pd.DataFrame(rows, columns=["link", "where", "measured"])
        if self.chain:
            verdicts = {}
            for row in self.chain:  # the first condition of a link: the top candidate's
                verdicts.setdefault(row["link"], f"{row['condition']}: {row['verdict']} ({row['sink_0']}, perplexity ×{row['ppl_ratio']:.3g})")
            links = ("super weight → massive dim", "super neurons → massive dim", "massive dim → sink", "", "first-token privilege → sink")
            frame["causal test"] = [verdicts.get(link, "") for link in links]
        return frame

    def summary(self) -> str:
        lines = ["anatomy of the first-token sink:"]
        lines += [f"  {row.link:<13} {row.where}; {row.measured}" for row in self.to_pandas().itertuples()]
        if self.chain:
            lines += ["  what removes it (sink_attribution, paired over the same sequences):"]
            lines += [f"    {row['link']}: {row['condition']} {row['verdict']} ({row['sink_0']}; perplexity ×{row['ppl_ratio']:.3g})" for row in self.chain]
        else:
            lines += ["  which links are necessary: lens_bias.sink_attribution(model, tokens) edits each one (or analyze(..., attribution=True))"]
        return "\n".join(lines)

    def headline(self) -> dict[str, Any]:
        weight = self.super_weights[0] if self.super_weights else {}
        return {
            "sink_rate": self.sink_rate, "sink_layers": _ranges(self.sink_layers), "massive_dims": self.massive_dims if self.onset_layer is not None else [],
            "massive_value": self.massive_value, "onset_layer": self.onset_layer,
            "super_weight": f"L{weight['layer']}[{weight['row']}, {weight['col']}]" if weight else None,
            "super_weight_share": weight.get("share"), "disparity": self.disparity,
        }

    def plot(self) -> Any:
        """The chain as a picture: four boxes, each with its numbers, and the causal verdicts on the arrows."""
        fig = new_figure(11, 3.0)
        fig.suptitle("the first-token sink, link by link" + (" (below the arrows: what editing the link does)" if self.chain else ""), fontsize=10)
        ax = fig.subplots()
        ax.set_axis_off()
        ax.set_xlim(0, 4)
        ax.set_ylim(0, 1)
        table = self.to_pandas()
        boxes = [table.iloc[0], table.iloc[2], table.iloc[3], table.iloc[4]]
        titles = ["super weight", "massive dimension", "dimension disparity", "attention sink"]
        for i, (title, row) in enumerate(zip(titles, boxes)):
            ax.text(i + 0.42, 0.58, f"{title}\n\n{_wrap(row['where'])}\n{_wrap(row['measured'])}", ha="center", va="center", fontsize=8,
                    bbox={"boxstyle": "round,pad=0.6", "facecolor": "#eef3fb", "edgecolor": "#335"})
        verdicts: dict[str, Any] = {}
        for row in self.chain:
            verdicts.setdefault(row["link"], row)
        for i, link in enumerate(("super weight → massive dim", "massive dim → sink", "first-token privilege → sink")):
            ax.annotate("", xy=(i + 1.03, 0.58), xytext=(i + 0.83, 0.58), arrowprops={"arrowstyle": "->", "lw": 1.5})
            if link in verdicts:  # what editing this link does to the sink (sink_attribution)
                row = verdicts[link]
                ax.text(i + 0.93, 0.06, _wrap(f"{row['condition']}: {row['verdict']}, Sink_0 {row['sink_0']}, perplexity ×{row['ppl_ratio']:.3g}", 26),
                        ha="center", va="bottom", fontsize=7, color="#722")
        return fig


def _wrap(text: str, width: int = 30) -> str:
    words, lines, line = str(text).split(), [], ""
    for word in words:
        if line and len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return "\n".join([*lines, line])


def _ranges(layers: list[int]) -> str:
    """[2, 3, 4, 7] -> "2–4, 7"."""
    out, start = [], None
    for i, layer in enumerate(layers):
        if start is None:
            start = layer
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            out.append(f"{start}" if start == layer else f"{start}–{layer}")
            start = None
    return ", ".join(out)


def anatomy_of(sections: Mapping[str, Result]) -> SinkAnatomy | None:
    """The anatomy from a report's sections (``sinks`` and ``super_neurons`` at least; ``massive_activations``,
    ``super_weights`` and ``sink_attribution`` where computed), or None when they are not there."""
    sinks, neurons = sections.get("sinks"), sections.get("super_neurons")
    if sinks is None or neurons is None:
        return None
    massive, weights, attribution = sections.get("massive_activations"), sections.get("super_weights"), sections.get("sink_attribution")
    per_layer = sinks.rate_by_head(0).mean(dim=1)  # type: ignore[attr-defined]
    onset = massive.onset_layer() if massive is not None else None  # type: ignore[attr-defined]
    dims = (massive.dims(onset, positions=(0,)) if onset is not None else []) or [neurons.massive_dim]  # type: ignore[attr-defined]
    value_by_layer = neurons.resid_at[:, dims[0]]  # type: ignore[attr-defined]
    peak = int(value_by_layer.argmax())
    top_layer, top_unit = neurons.ranked_units(1)[0]  # type: ignore[attr-defined]
    h = neurons.headline()
    candidates, largest_spike = [], float("nan")
    if weights is not None:
        spikes = torch.minimum(weights.input_max, weights.output_max)  # type: ignore[attr-defined]
        largest_spike = spikes.max().item()
        for layer, row, col in weights.coordinates():  # type: ignore[attr-defined]
            if spikes[layer] > SPIKE:  # Yu et al.'s rule: only a spiking layer has a super weight
                candidates.append({"layer": layer, "row": row, "col": col, "weight": weights.weight[layer].item(), "share": weights.share[layer].item()})  # type: ignore[attr-defined]
    return SinkAnatomy(
        sink_rate=sinks.rate()[0].item(), sink_layers=[i for i, r in enumerate(per_layer.tolist()) if r >= SINK_LAYER_RATE],  # type: ignore[attr-defined]
        first_token_share=sinks.share(0).mean().item(), eps=sinks.eps,  # type: ignore[attr-defined]
        massive_dims=[int(d) for d in dims], massive_value=value_by_layer[peak].item(), massive_median=neurons.massive_median[peak].item(),  # type: ignore[attr-defined]
        onset_layer=onset, super_weights=candidates, largest_spike=largest_spike,
        super_neuron={"layer": top_layer, "unit": top_unit, "writes": h["top_unit_writes"], "share": h["top_unit_share"], "act": h["top_unit_act"]}
        if onset is not None else {},
        disparity=h["dominance_at_max"], disparity_layer=h["dominance_at_argmax"], disparity_elsewhere=h["dominance_elsewhere_max"],
        chain=attribution.chain().to_dict(orient="records") if attribution is not None else [],  # type: ignore[attr-defined]
    )
