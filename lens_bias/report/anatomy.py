"""The anatomy of a trained model's attention sink, read off one ``analyze`` pass: the headline of its report.

Four links, each with its numbers: the super weight (Yu et al.'s top candidate, and the share of the spike it
writes) → the massive dimension (Sun et al.: which dims, how large, from which layer) → the dimension disparity
at position 0 (max/mean |x| after the pre-attention norm) → the sink (Sink_0 and the layers that sink). Whether
each link is *necessary* is a separate, causal question: ``lens_bias.analyses.sink_attribution.sink_attribution``
edits one link at a time, and its verdicts join the anatomy when the report holds them
(``analyze(..., sections=[..., "sink_attribution"])``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from lens_bias.analyses.base import Result, Results
from lens_bias.analyses.massive import MassiveActivations, MassiveActivationsResult
from lens_bias.analyses.sink_attribution import SinkAttributionResult
from lens_bias.analyses.sink_conditions import LEARNED_LINK
from lens_bias.analyses.sinks import Sinks
from lens_bias.analyses.super_neurons import SuperNeurons
from lens_bias.analyses.super_weights import SPIKE, SuperWeights
from lens_bias.core.attention_layout import describe_windows
from lens_bias.core.figures import new_figure

__all__ = ["SinkAnatomy", "anatomy_of", "SINK_LAYER_RATE", "EARLY_RATIO"]

# A layer sinks when at least this share of its (sequence, head) pairs put more than ε of their attention on token 0.
SINK_LAYER_RATE = 50.0
_PER_EXPERT = "per expert on a mixture of experts: see super_experts"
# A mixture of experts' super weight, super neuron and disparity rows: each is read per expert, not here.
_PER_EXPERT_ROWS = [("super weight", _PER_EXPERT, ""), ("super neuron", _PER_EXPERT, ""),
                    ("disparity", "not measured here", "super_neurons reads it, on one MLP per layer")]
# Before its onset a massive dim can already stand out: an early rise is a pre-onset value at least this many times
# its block's median |h| (Sun et al.'s massive needs 1000×); it is dated where the dim first reaches half that peak.
EARLY_RATIO = 100.0


@dataclass
class SinkAnatomy(Result):
    """The links of the first-token sink, measured in one pass (see module docstring)."""

    heading = "Anatomy of the sink"
    plot_caption = "the chain, link by link"

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
    rise_layer: int | None = None  # the massive dim's early rise before its onset (EARLY_RATIO), where there is one
    rise_value: float | None = None  # its mean |h_0| there
    rise_ratio: float | None = None  # that over the block's median |h|
    # The learned sink, where the model declares one (GPT-OSS): its share of every row's attention and its rate;
    # beside it key 0's share of every row (its α_0 averaged over all queries, so the two compare)
    learned_sink_share: float | None = None
    learned_sink_rate: float | None = None
    first_token_mass: float | None = None
    windows: list[int | None] = field(default_factory=list)  # each layer's sliding window (None: full attention)
    per_expert: bool = False  # a mixture of experts: super weights and neurons are per expert (super_experts), not here

    @property
    def learned_sink_leads(self) -> bool:
        """Whether the model's sink is the one it declares: the learned sink takes more attention than key 0."""
        return self.learned_sink_share is not None and self.learned_sink_share > (self.first_token_mass or 0.0)

    def to_pandas(self) -> pd.DataFrame:
        """One row per link, in the order the chain runs: massive dims (with onset), super weight (with its spike
        share), super neuron, disparity, sink layers (with the massive dim's early rise); with the chain, the verdict
        and the perplexity cost of the condition that tests each link."""
        weight = self.super_weights[0] if self.super_weights else {}
        massive = self.onset_layer is not None
        dim = self.massive_dims[0]
        sinks = f"layers {_ranges(self.sink_layers) or 'none'} sink (≥ {SINK_LAYER_RATE:.0f}% of heads)"
        if self.onset_layer is not None and self.sink_layers and self.sink_layers[0] < self.onset_layer:
            sinks += f"; from layer {self.sink_layers[0]}, before the onset at {self.onset_layer}"
            if self.rise_layer is not None:
                sinks += f": dim {dim} already rises at layer {self.rise_layer} (|h_0| {self.rise_value:.3g}, {self.rise_ratio:.0f}× the median)"
        sink_where = f"Sink_0 {self.sink_rate:.1f}% at ε {self.eps}"
        if self.learned_sink_leads:
            sink_where = (f"the learned sink (a softmax logit no key owns): {self.learned_sink_share:.0%} of every row's attention, "
                          f"key 0 {self.first_token_mass:.0%}; its rate {self.learned_sink_rate:.1f}%, Sink_0 {self.sink_rate:.1f}% at ε {self.eps}")
        elif self.learned_sink_share is not None:
            sinks += f"; the declared learned sink takes {self.learned_sink_share:.0%} of every row, less than key 0's {self.first_token_mass:.0%}"
        sliding = describe_windows(self.windows)
        if sliding:
            sinks += f"; {sliding}: their Sink_0 counts the queries that see key 0"
        rows = [
            ("massive dims", f"dims {self.massive_dims} at position 0, from layer {self.onset_layer}" if massive else "none found by Sun et al.'s rule",
             f"|h_0| {self.massive_value:.4g} vs median {self.massive_median:.3g} ({self.massive_value / self.massive_median:.3g}×)" if massive
             else f"largest |h_0| {self.massive_value:.4g} (dim {dim}) vs median {self.massive_median:.3g}; massive needs > 100 and ≥ 1000× the median"),
            *(_PER_EXPERT_ROWS if self.per_expert else self._dense_rows(weight, dim)),
            ("sink", sink_where, sinks),
        ]
        frame = pd.DataFrame(rows, columns=["link", "where", "measured"])
        if self.chain:
            verdicts: dict[str, str] = {}
            for row in self.chain:  # the first condition of a link: the top candidate's
                verdicts.setdefault(row["link"], f"{row['condition']}: {row['verdict']} ({row['sink_0']}, perplexity ×{row['ppl_ratio']:.3g})")
            sink_link = LEARNED_LINK if self.learned_sink_leads else "first-token privilege → sink"
            links = ("massive dim → sink", "super weight → massive dim", "super neurons → massive dim", "", sink_link)
            frame["causal test"] = [verdicts.get(link, "") for link in links]
        return frame

    def _dense_rows(self, weight: dict[str, Any], dim: int) -> list[tuple[str, str, str]]:
        """The super weight, super neuron and disparity rows of a model with one MLP per layer."""
        return [
            ("super weight", f"layers[{weight.get('layer')}].mlp.down_proj.weight[{weight.get('row')}, {weight.get('col')}]" if weight
             else "none found by Yu et al.'s spike rule",
             f"writes {weight['share']:.0%} of the layer's output spike" if weight
             else f"largest down-projection spike {self.largest_spike:.3g} (a spike exceeds {SPIKE:g} in and out)"),
            ("super neuron", f"layer {self.super_neuron.get('layer')} unit {self.super_neuron.get('unit')}" if self.super_neuron
             else "none found: no massive dim to write into",
             f"writes {self.super_neuron['writes']:.4g} into dim {dim}" if self.super_neuron else ""),
            ("disparity", f"max/mean |x_0| {self.disparity:.3g} (layer {self.disparity_layer})", f"other positions up to {self.disparity_elsewhere:.3g}"),
        ]

    def page_summary(self) -> str:
        return ""  # the page's table is the anatomy

    def summary(self) -> str:
        lines = ["anatomy of the first-token sink:"]
        lines += [f"  {row.link:<13} {row.where}; {row.measured}" for row in self.to_pandas().itertuples()]
        if self.chain:
            lines += ["  what removes it (sink_attribution, paired over the same sequences):"]
            lines += [f"    {row['link']}: {row['condition']} {row['verdict']} ({row['sink_0']}; perplexity ×{row['ppl_ratio']:.3g})" for row in self.chain]
        else:
            lines += ["  which links are necessary: lens_bias.sink_attribution(model, tokens) edits each one (or analyze(model, [..., \"sink_attribution\"]))"]
        return "\n".join(lines)

    def headline(self) -> dict[str, Any]:
        weight = self.super_weights[0] if self.super_weights else {}
        return {
            "sink_rate": self.sink_rate, "sink_layers": _ranges(self.sink_layers), "massive_dims": self.massive_dims if self.onset_layer is not None else [],
            "massive_value": self.massive_value, "onset_layer": self.onset_layer,
            "super_weight": f"L{weight['layer']}[{weight['row']}, {weight['col']}]" if weight else None,
            "super_weight_share": weight.get("share"), "disparity": self.disparity,
            "model_sink": "learned sink" if self.learned_sink_leads else "key 0", "learned_sink_share": self.learned_sink_share,
        }

    def plot(self) -> Any:
        """The chain as a picture: four boxes with their numbers; under each arrow, what editing that link does to
        the sink; first-token parity, which tests no single link, drawn apart below."""
        fig = new_figure(12, 4.6 if self.chain else 3.0)
        ax = fig.subplots()
        ax.set_axis_off()
        ax.set_xlim(0, 4)
        ax.set_ylim(0, 1)
        top = 0.72 if self.chain else 0.5
        table = self.to_pandas().set_index("link")
        weight = self.super_weights[0] if self.super_weights else {}
        boxes = [("super weight", f"L{weight['layer']} down_proj[{weight['row']}, {weight['col']}]" if weight else table.loc["super weight", "where"],
                  table.loc["super weight", "measured"])]
        boxes += [(title, table.loc[link, "where"], table.loc[link, "measured"])
                  for title, link in (("massive dimension", "massive dims"), ("dimension disparity", "disparity"), ("attention sink", "sink"))]
        for i, (title, where, measured) in enumerate(boxes):
            ax.text(i + 0.5, top, f"{title}\n\n{_wrap(where, 28)}\n{_wrap(measured, 28)}", ha="center", va="center", fontsize=9,
                    bbox={"boxstyle": "round,pad=0.5", "facecolor": "#eef3fb", "edgecolor": "#335"})
        for i in range(3):
            ax.annotate("", xy=(i + 1.13, top), xytext=(i + 0.87, top), arrowprops={"arrowstyle": "->", "lw": 1.5})
        if not self.chain:
            fig.suptitle("the first-token sink, link by link (which links are necessary: analyze(model, [..., 'sink_attribution']))", fontsize=10)
            return fig
        fig.suptitle("the first-token sink, link by link; in red, what editing each link does to Sink_0 and to perplexity", fontsize=10)
        by_link: dict[str, list[dict[str, Any]]] = {}
        for row in self.chain:
            by_link.setdefault(row["link"], []).append(row)

        def verdicts(link: str) -> str:
            return "\n".join(_wrap(f"{r['condition']}: {r['verdict']}, Sink_0 {r['sink_0']}, perplexity ×{r['ppl_ratio']:.3g}", 48)
                             for r in by_link.get(link, []))

        # super weight → massive dim (its candidates and the down_proj row) under the first arrow; the massive dims
        # edited test massive dim → disparity → sink, so their verdict spans the other two arrows
        first = "\n".join(t for t in (verdicts("super weight → massive dim"), verdicts("super neurons → massive dim")) if t)
        ax.text(1.0, top - 0.22, first, ha="center", va="top", fontsize=8, color="#722")
        if "massive dim → sink" in by_link:
            ax.plot([1.5, 3.5], [top - 0.2, top - 0.2], color="#722", lw=1)
            ax.text(2.5, top - 0.22, verdicts("massive dim → sink"), ha="center", va="top", fontsize=8, color="#722")
        if LEARNED_LINK in by_link:  # the sink the model declares: removing it is tested at the sink itself
            ax.text(3.5, top - 0.22, verdicts(LEARNED_LINK), ha="center", va="top", fontsize=8, color="#722")
        parity = verdicts("first-token privilege → sink")
        if parity:
            ax.text(2.0, 0.02, "apart from the chain (tests no single link):\n" + parity, ha="center", va="bottom", fontsize=8, color="#722",
                    bbox={"boxstyle": "round,pad=0.4", "facecolor": "white", "edgecolor": "#722", "linestyle": "--"})
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


def anatomy_of(sections: Results) -> SinkAnatomy | None:
    """The anatomy from a report's sections (``sinks`` and ``super_neurons`` at least, or ``sinks`` and
    ``massive_activations`` on a mixture of experts; ``massive_activations``, ``super_weights`` and
    ``sink_attribution`` where computed), or None when they are not there."""
    sinks, neurons = sections.find(Sinks), sections.find(SuperNeurons)
    massive, weights = sections.find(MassiveActivations), sections.find(SuperWeights)
    attribution = sections.get("sink_attribution")
    if not isinstance(attribution, SinkAttributionResult):  # an extra section, with a pass of its own: not an Analysis
        attribution = None
    if sinks is None or (neurons is None and (massive is None or "super_experts" not in sections)):
        return None
    per_layer = sinks.rate_by_head(0).mean(dim=1)
    common: dict[str, Any] = dict(
        sink_rate=sinks.rate()[0].item(), sink_layers=[i for i, r in enumerate(per_layer.tolist()) if r >= SINK_LAYER_RATE],
        first_token_share=sinks.share(0).mean().item(), eps=sinks.eps,
        learned_sink_share=sinks.learned_share().mean().item() if sinks.declares_sink else None,
        learned_sink_rate=sinks.learned_rate() if sinks.declares_sink else None,
        first_token_mass=sinks.mass()[..., 0].mean().item(), windows=list(sinks.layer_windows),
        chain=attribution.chain().to_dict(orient="records") if attribution is not None else [],
    )
    onset = massive.onset_layer() if massive is not None else None
    if neurons is None:
        assert massive is not None  # checked above: a mixture of experts' anatomy reads its massive activations
        return _per_expert_anatomy(massive, onset, common)
    dims = (massive.dims(onset, positions=(0,)) if massive is not None and onset is not None else []) or [neurons.massive_dim]
    value_by_layer = neurons.resid_at[:, dims[0]]
    peak = int(value_by_layer.argmax())
    ratio_by_layer = value_by_layer / neurons.massive_median
    rise = None
    if onset is not None and onset > 0 and ratio_by_layer[:onset].max() >= EARLY_RATIO:
        rise = int((value_by_layer[:onset] >= value_by_layer[:onset].max() / 2).nonzero()[0])
    top_layer, top_unit = neurons.ranked_units(1)[0]
    h = neurons.headline()
    candidates, largest_spike = [], float("nan")
    if weights is not None:
        spikes = torch.minimum(weights.input_max, weights.output_max)
        largest_spike = spikes.max().item()
        for layer, row, col in weights.coordinates():
            if spikes[layer] > SPIKE:  # Yu et al.'s rule: only a spiking layer has a super weight
                candidates.append({"layer": layer, "row": row, "col": col, "weight": weights.weight[layer].item(), "share": weights.share[layer].item()})
    return SinkAnatomy(
        massive_dims=[int(d) for d in dims], massive_value=value_by_layer[peak].item(), massive_median=neurons.massive_median[peak].item(),
        onset_layer=onset, super_weights=candidates, largest_spike=largest_spike,
        super_neuron={"layer": top_layer, "unit": top_unit, "writes": h["top_unit_writes"], "share": h["top_unit_share"], "act": h["top_unit_act"]}
        if onset is not None else {},
        disparity=h["dominance_at_max"], disparity_layer=h["dominance_at_argmax"], disparity_elsewhere=h["dominance_elsewhere_max"],
        rise_layer=rise, rise_value=value_by_layer[rise].item() if rise is not None else None,
        rise_ratio=ratio_by_layer[rise].item() if rise is not None else None, **common,
    )


def _per_expert_anatomy(massive: MassiveActivationsResult, onset: int | None, common: dict[str, Any]) -> SinkAnatomy:
    """A mixture of experts' anatomy from the block outputs alone: the largest |h| at position 0 and where it sits
    (its super weights and neurons are per expert, in the super_experts section)."""
    peak, largest, value = massive.largest_at_first()
    dims = (massive.dims(onset, positions=(0,)) if onset is not None else []) or [largest]  # no massive activation: the largest
    return SinkAnatomy(massive_dims=dims, massive_value=value, massive_median=massive.median[peak].item(), onset_layer=onset,
                       per_expert=True, **common)
