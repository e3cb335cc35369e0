"""Massive activations (Sun et al., "Massive Activations in Large Language Models", COLM 2024).

A handful of residual-stream values, up to ~10⁴× the typical magnitude, in fixed dimensions and (mostly) at the
first token. The report section ``massive_activations`` (:class:`MassiveActivations`, in the shared pass of
``analyze``) and :func:`massive_activations` (one pass over your tokens) measure them alike: per block output
(``blocks.{l}.hook_resid_post``) each sequence's
top-k |h| with their position and dimension, and its median |h|, reduced inside the hook (nothing of size
``[n, seq, d_model]`` is kept). A layer's median is the mean over sequences of the per-sequence medians, as Sun
et al. average per-sequence statistics. An activation is massive when |h| > ``massive_abs`` (100) and
|h| ≥ ``massive_ratio`` (1000) × that median.

Where they appear: :meth:`~MassiveActivationsResult.first_layer` is the first layer the rule flags;
:meth:`~MassiveActivationsResult.onset_layer` is the flagged layer where the largest |h| jumps most over the layer
before — Sun et al.'s "appear abruptly after one layer". They differ when a dimension is already large but
borderline earlier: in SmolLM2-135M dim 507 holds ≈ 900–1050 from layer 2 on (≈ 1000× the median: flagged on 100
prose sequences, not on 16), at the first token and at some " the" tokens, and jumps to ≈ 2.5·10⁴ at the first
token in layer 11 (with dim 247 at ≈ 2·10³), where it stays until it fades in layers 28–29.

:func:`massive_ablation` is Sun et al.'s test that they act as fixed biases: set them to zero at the onset layer
(perplexity explodes) or to their mean over many sequences (perplexity unchanged), with
:class:`lens_bias.hooks.activations.SetActivations`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from lens_bias.analyses.base import Analysis, Result, measure
from lens_bias.analyses.perplexity import PerplexityTable, perplexity_table
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import layer_axis, new_figure
from lens_bias.core.inputs import InputSpec
from lens_bias.core.probes import Probe
from lens_bias.core.token_inputs import takes_token_inputs
from lens_bias.hooks.activations import SetActivations
from lens_bias.hooks.base import Compose

__all__ = ["MassiveActivations", "massive_activations", "MassiveActivationsResult", "massive_ablation"]

logger = logging.getLogger(__name__)


def _top_probe(hook: str, top: int) -> Probe:
    def fn(x: Tensor) -> Tensor:  # [batch, pos, d] -> [batch, 3·top + 1]: top |h|, their positions, dims; median |h|
        a = x.float().abs().flatten(1)
        values, flat = a.topk(top, dim=1)
        d_model = x.shape[-1]
        # positions and dims travel as floats (collect keeps float32): exact below 2**24
        return torch.cat([values, (flat // d_model).float(), (flat % d_model).float(), a.median(dim=1, keepdim=True).values], dim=1)

    return Probe(hook, f"massive_top{top}", fn)


@dataclass
class MassiveActivationsResult(Result):
    """Per layer and sequence: the top-k |h| of the block output with where they are, and the median |h|."""
    column_words: ClassVar[Mapping[str, str]] = {
        "value": "|h| (mean over sequences)", "median": "median |h| of the block", "massive": "massive (> 100 and ≥ 1000× median)",
    }

    top_values: Float[Tensor, "layer n top"]  # |h|, descending within each sequence
    top_positions: Int[Tensor, "layer n top"]
    top_dims: Int[Tensor, "layer n top"]
    sequence_median: Float[Tensor, "layer n"]  # median |h| over positions and dims of each sequence
    input_max: float  # largest |h| entering block 0 (the embedding): the reference for a jump at layer 0
    massive_abs: float
    massive_ratio: float

    heading = "Massive activations"
    trained_headline = ()  # a trained model's page states them in its anatomy
    init_headline = ("max_over_median",)  # none is massive at init
    key_column = "value"
    headline_labels = {"onset_layer": "onset layer", "onset_dims": "massive dims at onset", "max_top1": "largest |h|", "max_over_median": "largest |h| / median"}
    plot_caption = "largest |h| and median |h| per block output"

    @property
    def n_layers(self) -> int:
        return self.top_values.shape[0]

    @property
    def median(self) -> Float[Tensor, "layer"]:
        """Each layer's median |h|: the mean over sequences of the per-sequence medians."""
        return self.sequence_median.mean(dim=1)

    @property
    def top1(self) -> Float[Tensor, "layer"]:
        """The largest |h| of each layer over all sequences."""
        return self.top_values[:, :, 0].max(dim=1).values

    def is_massive(self) -> Bool[Tensor, "layer n top"]:
        """Which kept entries are massive: |h| > massive_abs and ≥ massive_ratio × the layer's median."""
        return (self.top_values > self.massive_abs) & (self.top_values >= self.massive_ratio * self.median[:, None, None])

    def massive_layers(self) -> list[int]:
        return [layer for layer, flag in enumerate(self.is_massive().flatten(1).any(dim=1).tolist()) if flag]

    def first_layer(self) -> int | None:
        """The first layer with a massive activation by the rule, or None."""
        layers = self.massive_layers()
        return layers[0] if layers else None

    def onset_layer(self) -> int | None:
        """Where massive activations appear: the flagged layer whose largest |h| grows most over the layer before."""
        layers = self.massive_layers()
        if not layers:
            return None
        before = torch.cat([torch.tensor([self.input_max]), self.top1[:-1]]).clamp_min(1e-12)
        jump = self.top1 / before
        return max(layers, key=lambda layer: jump[layer].item())

    def coordinates(self, layer: int | None = None) -> pd.DataFrame:
        """Where the massive activations are: one row per (layer, position, dim), with in how many sequences."""
        massive = self.is_massive()
        layers = range(self.n_layers) if layer is None else [self._check_layer(layer)]
        rows = []
        for l in layers:
            keys: dict[tuple[int, int], list[float]] = {}
            for s, k in massive[l].nonzero().tolist():
                key = (int(self.top_positions[l, s, k]), int(self.top_dims[l, s, k]))
                keys.setdefault(key, []).append(self.top_values[l, s, k].item())
            for (position, dim), values in keys.items():
                rows.append({"layer": l, "position": position, "dim": dim, "sequences": len(values), "max_value": max(values)})
        columns = ["layer", "position", "dim", "sequences", "max_value"]
        frame = pd.DataFrame(rows, columns=columns)
        return frame.sort_values(["layer", "max_value"], ascending=[True, False], ignore_index=True)

    def dims(self, layer: int | None = None, positions: Sequence[int] | None = None) -> list[int]:
        """The dimensions holding massive activations (at ``layer`` / ``positions`` if given), largest first."""
        frame = self.coordinates(layer)
        if positions is not None:
            frame = frame[frame.position.isin(list(positions))]
        return [int(d) for d in frame.groupby("dim").max_value.max().sort_values(ascending=False).index]

    def largest_at_first(self) -> tuple[int, int, float]:
        """(layer, dim, mean |h_0|) of the largest first-token activation kept: per layer, the mean over sequences of
        the largest |h| at position 0 among each sequence's top values (0 where position 0 is not among them)."""
        at_first = torch.where(self.top_positions == 0, self.top_values, torch.zeros_like(self.top_values))  # [layer, n, top]
        by_layer = at_first.amax(dim=2).mean(dim=1)
        layer = int(by_layer.argmax())
        dim = int(self.top_dims[layer].flatten()[int(at_first[layer].flatten().argmax())])
        return layer, dim, by_layer[layer].item()

    def _check_layer(self, layer: int) -> int:
        if not 0 <= layer < self.n_layers:
            raise LensBiasError(f"layer {layer} does not exist; the result has layers 0..{self.n_layers - 1}")
        return layer

    def plot(self) -> Any:
        """Sun et al.'s picture: the largest |h| and the median |h| of every block's output, on a log axis."""
        fig = new_figure()
        ax = fig.subplots()
        layers = range(self.n_layers)
        ax.semilogy(layers, self.top1.clamp_min(1e-12).numpy(), marker="o", label="largest |h|")
        ax.semilogy(layers, self.median.clamp_min(1e-12).numpy(), marker=".", label="median |h|")
        onset = self.onset_layer()
        if onset is not None:
            ax.axvline(onset, color="k", linestyle="--", label=f"onset, layer {onset}")
        ax.set_xlabel("layer")
        layer_axis(ax.xaxis)
        ax.set_ylabel("|h| of the block output")
        ax.legend(fontsize=8)
        return fig

    def to_pandas(self) -> pd.DataFrame:
        """Per layer, the top-k |h| over all sequences with their (sequence, position, dim), and the median."""
        n_layers, n, top = self.top_values.shape
        massive, median = self.is_massive(), self.median
        rows = []
        for l in range(n_layers):
            values, flat = self.top_values[l].flatten().topk(min(top, n * top))
            for rank, (value, i) in enumerate(zip(values.tolist(), flat.tolist())):
                s, k = divmod(i, top)
                rows.append({"layer": l, "rank": rank, "value": value, "sequence": s, "position": int(self.top_positions[l, s, k]),
                             "dim": int(self.top_dims[l, s, k]), "median": median[l].item(), "massive": bool(massive[l, s, k])})
        return pd.DataFrame(rows)

    def headline(self) -> dict[str, Any]:
        onset = self.onset_layer()
        ratio = self.top1 / self.median.clamp_min(1e-12)
        return {
            "n_sequences": self.top_values.shape[1],
            "massive_layers": self.massive_layers(),
            "first_layer": self.first_layer(),
            "onset_layer": onset,
            "onset_top1": None if onset is None else self.top1[onset].item(),
            "onset_median": None if onset is None else self.median[onset].item(),
            "onset_dims": [] if onset is None else self.dims(onset),
            "max_top1": self.top1.max().item(),
            "max_over_median": ratio.max().item(),
        }

    def summary(self) -> str:
        h = self.headline()
        text = (
            f"massive activations (|h| > {self.massive_abs:g} and ≥ {self.massive_ratio:g}× the median) over "
            f"{h['n_sequences']} sequences: layers {h['massive_layers'] or 'none'}; largest |h| {h['max_top1']:.4g}, "
            f"up to {h['max_over_median']:.3g}× the median"
        )
        if h["onset_layer"] is not None:
            where = self.coordinates(h["onset_layer"]).head(3)
            spots = ", ".join(f"position {p} dim {d} ({c} seq)" for p, d, c in zip(where.position, where.dim, where.sequences))
            text += (
                f"\n  first flagged in layer {h['first_layer']}; they appear (largest jump) in layer {h['onset_layer']}: "
                f"|h| {h['onset_top1']:.4g} vs median {h['onset_median']:.3g}, at {spots}"
            )
        return text


def _input_max(x: Tensor) -> Tensor:  # [batch, pos, d] -> []
    return x.float().abs().max()


@dataclass(frozen=True)
class MassiveActivations(Analysis[MassiveActivationsResult]):
    """Top-``top`` |h| with their position and dimension, and the median |h|, of every block's output (Sun et al.)."""

    name: ClassVar[str] = "massive_activations"
    order = 75
    trained_order = 20
    # Entries kept per sequence and layer (Sun et al. plot the top 3).
    top: int = 3
    # Sun et al.'s rule for 7B models: |h| > massive_abs ...
    massive_abs: float = 100.0
    # ... and ≥ massive_ratio × the layer's median |h|.
    massive_ratio: float = 1000.0

    def __post_init__(self) -> None:
        if isinstance(self.top, bool) or not isinstance(self.top, int) or self.top < 1:
            raise LensBiasError(f"top must be a positive int, got {self.top!r}")
        if not (self.massive_abs >= 0 and self.massive_ratio >= 0):
            raise LensBiasError(f"massive_abs and massive_ratio must be >= 0, got {self.massive_abs!r}, {self.massive_ratio!r}")

    def probes(self, adapter: ModelAdapter) -> dict[Hashable, Probe]:
        probes: dict[Hashable, Probe] = {layer: _top_probe(f"blocks.{layer}.hook_resid_post", self.top) for layer in range(adapter.info.n_layers)}
        probes["input"] = Probe("blocks.0.hook_resid_pre", "max_abs", _input_max, combine="max")
        return probes

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> MassiveActivationsResult:
        top = self.top
        packed = torch.stack([kept[layer] for layer in range(adapter.info.n_layers)])  # [layer, n, 3·top + 1]
        result = MassiveActivationsResult(
            top_values=packed[..., :top],
            top_positions=packed[..., top : 2 * top].long(),
            top_dims=packed[..., 2 * top : 3 * top].long(),
            sequence_median=packed[..., -1],
            input_max=kept["input"].item(),
            massive_abs=float(self.massive_abs),
            massive_ratio=float(self.massive_ratio),
        )
        logger.info("massive activations: layers %s, onset %s", result.massive_layers(), result.onset_layer())
        return result


@takes_token_inputs
@one_adapter_per_call
def massive_activations(
    model: Any,
    inputs: Int[Tensor, "n seq"],
    *,
    top: int = 3,
    massive_abs: float = 100.0,
    massive_ratio: float = 1000.0,
    batch_size: int | None = None,
    progress: bool = True,
) -> MassiveActivationsResult:
    """Top-``top`` |h| and median |h| of every block's output (Sun et al.), from one batched pass over ``inputs``.

    >>> import lens_bias
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=32, seed=0)
    >>> r = massive_activations(m, lens_bias.random_tokens(4, 16, 97))
    >>> r.to_pandas().columns.tolist()
    ['layer', 'rank', 'value', 'sequence', 'position', 'dim', 'median', 'massive']
    >>> r.onset_layer() is None  # a random init has none
    True

    Args:
        model: any TransformerLens model; never modified.
        inputs: token IDs ``[n, seq]`` (real text: :func:`lens_bias.core.inputs.text_tokens`).
        top: entries kept per sequence and layer (Sun et al. plot the top 3).
        massive_abs: the absolute threshold of the rule.
        massive_ratio: the threshold relative to the layer's median |h|.
        batch_size: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.
        progress: as in :meth:`lens_bias.core.adapter.ModelAdapter.collect`.

    Returns:
        A :class:`MassiveActivationsResult`.
    """
    analysis = MassiveActivations(top=top, massive_abs=massive_abs, massive_ratio=massive_ratio)
    width = inputs.shape[1] * ModelAdapter.of(model).info.d_model
    if top > width:
        raise LensBiasError(f"top={top} exceeds the {width} values of one sequence's hidden state; pass top <= {width}")
    return measure(model, inputs, [analysis], batch_size=batch_size, progress=progress).of(MassiveActivations)


@takes_token_inputs
@one_adapter_per_call
def massive_ablation(
    model: Any,
    inputs: Int[Tensor, "n seq"],
    eval_inputs: Int[Tensor, "m seq2"],
    *,
    layer: int | None = None,
    dims: Sequence[int] | None = None,
    positions: Sequence[int] = (0,),
    batch_size: int | None = None,
    progress: bool = True,
) -> PerplexityTable:
    """Perplexity of ``eval_inputs`` unedited, with the massive activations set to zero, and set to their mean.

    The edit is :class:`lens_bias.hooks.activations.SetActivations` at ``blocks.{layer}.hook_resid_post``, at ``positions``
    (default the first token, where Sun et al. and SmolLM2 have them) in ``dims``. Without ``layer`` / ``dims``
    they come from :func:`massive_activations` on ``inputs``: the onset layer and its massive dims at those
    positions. The mean is over ``inputs`` (the same positions and dims), so it is not fitted to ``eval_inputs``.

    Args:
        model: any TransformerLens model; never modified.
        inputs: token IDs ``[n, seq]`` for finding the activations and their mean (e.g. 100 sequences).
        eval_inputs: held-out token IDs ``[m, seq2]`` whose perplexity is measured (disjoint from ``inputs``).
        layer: the block whose output is edited (default: the onset layer).
        dims: the residual dimensions to edit (default: the massive ones at ``layer`` and ``positions``).
        positions: the token positions to edit.
        batch_size: as in :func:`lens_bias.analyses.perplexity.perplexity`.
        progress: as in :func:`lens_bias.analyses.perplexity.perplexity`.

    Returns:
        A :class:`~lens_bias.analyses.perplexity.PerplexityTable` with conditions baseline, zero, mean.
    """
    positions = tuple(positions)
    if not positions or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in positions):
        raise LensBiasError(f"positions must be non-negative ints (0 = first token), got {positions!r}")
    too_far = [p for p in positions if p >= min(inputs.shape[1], eval_inputs.shape[1])]
    if too_far:
        raise LensBiasError(f"positions {too_far} lie outside the sequences ({inputs.shape[1]} and {eval_inputs.shape[1]} tokens)")
    if layer is None or dims is None:
        found = massive_activations(model, inputs, batch_size=batch_size, progress=progress)
        if layer is None:
            layer = found.onset_layer()
            if layer is None:
                raise LensBiasError(
                    "no massive activations in any layer by Sun et al.'s rule (|h| > 100 and ≥ 1000× the median); "
                    "pass layer= and dims= to ablate chosen dimensions"
                )
        if dims is None:
            dims = found.dims(layer, positions=positions)
            if not dims:
                raise LensBiasError(
                    f"layer {layer} has no massive activations at positions {positions}; pass dims= (or other positions=)"
                )
    dims = tuple(dims)
    zero = SetActivations(layer=layer, dims=dims, positions=positions, values=(0.0,))  # validates before a pass
    hook = f"blocks.{layer}.hook_resid_post"
    probe = Probe(hook, f"at{list(positions)}x{list(dims)}", lambda x: x[:, list(positions)][:, :, list(dims)])
    mean = ModelAdapter.of(model).collect(inputs, [probe], batch_size=batch_size, progress=progress, desc="massive mean")[probe.key].mean(dim=0)
    at_mean = Compose(tuple(SetActivations(layer=layer, dims=dims, positions=(p,), values=tuple(mean[i].tolist())) for i, p in enumerate(positions)))
    where = f"h[:, {list(positions)}, {list(dims)}] at {hook}"
    logger.info("massive ablation at layer %d, positions %s, dims %s; mean %s", layer, positions, dims, mean.tolist())
    return perplexity_table(
        model,
        eval_inputs,
        [
            ("baseline", "unedited", ()),
            ("zero", f"{where} = 0", (zero,)),
            ("mean", f"{where} = mean over {inputs.shape[0]} sequences ({', '.join(f'{v:.4g}' for v in mean.flatten().tolist())})", (at_mean,)),
        ],
        title=f"massive activations set to zero or to their mean (layer {layer})",
        batch_size=batch_size,
        progress=progress,
    )
