"""The papers' real-model experiments on a pretrained model (by default the shipped SmolLM2-135M-Instruct).

1. Gu et al.'s Table 1 in miniature (:func:`sink_table`): Sink_k^ε at ε 0.3, T 64, on held-out text, uniform random
   tokens and one repeated token, with and without a BOS token, per layer and head.
2. Massive activations and 3. super weights: :mod:`lens_bias.analyses.massive`, :mod:`lens_bias.analyses.super_weights`.
4. Moving the sink (:func:`move_sink_table`): MaskToSelf(k), AmplifyVariance(k, λ) and the ScaleNorm(k, λ)
   control on text, α_k and Sink_k with standard errors over sequences (``lens_bias.experiments.sink_measures.intervention_table``).
5. SeedPrint against descendants: :mod:`lens_bias.experiments.descendants`.
6. Low precision (:func:`precision_table`): ``analyze`` in bf16 and fp16, every number finite, compared with float32.

Every table is a DataFrame; :func:`run` runs them all and :class:`RealModelResult` renders them as markdown.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from lens_bias.analyses.base import measure
from lens_bias.analyses.sinks import DEFAULT_EPS, Sinks, SinksResult
from lens_bias.core import tl
from lens_bias.core.errors import LensBiasError, NonFinite
from lens_bias.core.inputs import check_context, check_later_position, random_tokens, repeated_tokens, text_tokens, with_bos
from lens_bias.core.provenance import numbers_of, results_record, table_of, write_results
from lens_bias.core.serialise import Serialisable
from lens_bias.core.tables import markdown_table
from lens_bias.experiments.base import Experiment, Outcome
from lens_bias.experiments.sink_measures import intervention_table
from lens_bias.models import load_model
from lens_bias.report.bias_report import BiasReport, analyze

__all__ = ["sink_inputs", "SinkTable", "sink_table", "move_sink_table", "precision_table", "RealModelConfig", "RealModelResult", "run"]

logger = logging.getLogger(__name__)

INPUT_KINDS = ("text", "random", "repeated")


def _tokenizer(model: Any) -> Any:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise LensBiasError("real-model experiments read text through model.tokenizer; load the model with lens_bias.models.pretrained(...)")
    return tokenizer


def sink_inputs(model: Any, kind: str, n: int, seq_len: int, *, bos: bool = False, seed: int = 0) -> torch.Tensor:
    """Gu et al.'s three input kinds as token IDs ``[n, seq_len]``: "text", "random" (uniform IDs) or "repeated".

    With ``bos=True`` position 0 is the tokenizer's BOS token and the rest is unchanged in kind.
    """
    tokenizer = _tokenizer(model)
    if kind == "text":
        return text_tokens(tokenizer, n, seq_len, bos=bos, seed=seed)
    bos_id = None
    if bos:
        bos_id = getattr(tokenizer, "bos_token_id", None)
        if bos_id is None:
            raise LensBiasError("bos=True needs a tokenizer with a bos_token_id")
    vocab = int(model.cfg.d_vocab)
    if kind == "random":
        return with_bos(random_tokens(n, seq_len, vocab, seed=seed), bos_id)
    if kind == "repeated":
        return repeated_tokens(n, seq_len, vocab, seed=seed, bos=bos_id)
    raise LensBiasError(f"kind must be one of {INPUT_KINDS}, got {kind!r}")


@dataclass
class SinkTable:
    """Sinks results per (input kind, BOS) condition, on the same number of sequences and length."""

    results: dict[tuple[str, bool], SinksResult]
    eps: float

    def to_pandas(self) -> pd.DataFrame:
        """One row per condition: Sink_0 and Sink_1 (%), the first token's attention share and residual norm ratio."""
        rows = []
        for (kind, bos), res in self.results.items():
            rate = res.rate(self.eps)
            rows.append({
                "inputs": kind, "bos": bos, "sink_0": rate[0].item(), "sink_1": rate[1].item(),
                # not the last key: only its own query sees it
                "max_sink_later": rate[2:-1].max().item() if len(rate) > 3 else 0.0,
                "share_0": res.share(0).mean().item(), "norm_ratio_0_max": res.norm_ratio.max().item(),
            })
        return pd.DataFrame(rows)

    def by_layer(self, position: int = 0) -> pd.DataFrame:
        """Sink rate (%) of one key position per layer (mean over heads), a column per condition."""
        columns = {f"{kind}{', BOS' if bos else ''}": res.rate_by_head(position, self.eps).mean(dim=1).tolist() for (kind, bos), res in self.results.items()}
        return pd.DataFrame({"layer": range(len(next(iter(columns.values())))), **columns})

    def by_head(self, kind: str = "text", bos: bool = False, position: int = 0) -> pd.DataFrame:
        """Sink rate (%) of one key position for every (layer, head) of one condition: layers × heads."""
        rate = self.results[(kind, bos)].rate_by_head(position, self.eps)
        return pd.DataFrame(rate.numpy(), columns=[f"h{h}" for h in range(rate.shape[1])]).rename_axis("layer")


def sink_table(
    model: Any, *, n: int = 100, seq_len: int = 64, eps: float = DEFAULT_EPS, kinds: Sequence[str] = INPUT_KINDS,
    bos: Sequence[bool] = (False, True), seed: int = 0,
) -> SinkTable:
    """Experiment 1: Sink_k^ε for every input kind, without and with a BOS token (Gu et al.: ε 0.3, T 64, N 100).

    Gu et al. index the first token as 1 (their tokenizers prepend BOS); here positions are 0-based, so their
    Sink_1 with a BOS is ``sink_0`` of the BOS rows.
    """
    results = {}
    for kind in kinds:
        for with_bos_token in bos:
            tokens = sink_inputs(model, kind, n, seq_len, bos=with_bos_token, seed=seed)
            results[(kind, with_bos_token)] = measure(model, tokens, [Sinks(eps=eps)]).of(Sinks)
    return SinkTable(results, eps)


def move_sink_table(model: Any, *, n: int = 64, seq_len: int = 64, position: int = 8, factor: float = 8.0, eps: float = DEFAULT_EPS,
                    seed: int = 0, bos: bool = False) -> pd.DataFrame:
    """Experiment 4 on held-out text: α_k (mean ± SE over sequences) and Sink_k under MaskToSelf(k),
    AmplifyVariance(k, λ) and ScaleNorm(k, λ), against the unedited model; ``diff_in_se`` is the paired difference.
    With ``bos=True`` position 0 is the model's BOS token."""
    tokens = text_tokens(_tokenizer(model), n, seq_len, bos=bos, seed=seed)
    return intervention_table(model, tokens, position, factor, eps)


# Headline numbers compared across dtypes, each with its tolerance: ("rel", r) for magnitudes, ("abs", a) for
# bounded numbers (cosines, Kendall τ: a few flipped pairs move them by more than their rounding) and rates in %.
# bf16 keeps 8 significant bits (relative step 2^-8 ≈ 0.004); 30 layers of rounding measured ≤ 2 steps on SmolLM2.
_BF16_STEP = 2.0**-8
# the sources the results file's numbers come from (a page says when one changed since the run)
DEPENDS = ("lens_bias/experiments/real_model.py", "lens_bias/experiments/sink_measures.py", "analyses", "hooks")
_COMPARED: dict[str, tuple[str, float]] = {
    "sinks.sink_rate_0": ("abs", 3.0),
    "sinks.first_token_share": ("abs", 0.02),
    "sinks.norm_ratio_0_max": ("rel", 5 * _BF16_STEP),
    "super_neurons.resid_max_over_median": ("rel", 5 * _BF16_STEP),
    "super_neurons.dominance_at_max": ("rel", 5 * _BF16_STEP),
    "token_preference.entropy_ratio": ("abs", 0.02),  # H(p̄)/log V is in [0, 1]; over 3 sequences bf16 moved it 0.008 (2%)
    "token_preference.tau_halves": ("abs", 0.05),
    "contraction.inter_final": ("abs", 0.02),
    "contraction.intra_final": ("abs", 0.02),
}


def _flatten(report: BiasReport) -> dict[str, float]:
    out = {}
    for name, section in report.sections.items():
        for key, value in section.headline().items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                out[f"{name}.{key}"] = float(value)
    return out


def _all_finite(report: BiasReport) -> bool:
    """Every number in every section's headline and table is finite (no NaN or inf anywhere)."""
    if not all(math.isfinite(v) for v in _flatten(report).values()):
        return False
    for section in report.sections.values():
        table = section.to_pandas().select_dtypes("number")
        if not bool(torch.isfinite(torch.tensor(table.to_numpy(dtype=float))).all()):
            return False
    return True


def precision_table(
    model: Any, *, dtypes: Sequence[torch.dtype] = (torch.bfloat16, torch.float16), n: int = 32, seq_len: int = 64, seed: int = 0
) -> pd.DataFrame:
    """Experiment 6: ``analyze`` on held-out text in each dtype (a cast copy; ``model`` is untouched) vs float32.

    Returns one row per (dtype, number): the float32 value, the low-precision value, their absolute and
    relative difference, the stated tolerance (``_COMPARED``), whether the difference is within it, and whether
    every number of that dtype's report (headlines and tables of all sections) is finite. A dtype whose forward
    pass overflows (Gemma 3 in float16) is a measurement too: its values are NaN and ``all_finite`` is False.
    """
    tokens = text_tokens(_tokenizer(model), n, seq_len, seed=seed)
    reference = _flatten(analyze(model, inputs=tokens, progress=False))
    rows = []
    for dtype in dtypes:
        cast = tl.move(copy.deepcopy(model), dtype)
        try:
            report = analyze(cast, inputs=tokens, progress=False)
            finite, values = _all_finite(report), _flatten(report)
        except NonFinite as overflow:
            logger.info("%s: %s", dtype, overflow)
            finite, values = False, {}
        del cast
        for name, (kind, tolerance) in _COMPARED.items():
            if name not in reference:
                continue
            ref, low = reference[name], values.get(name, float("nan"))
            abs_diff, rel_diff = abs(low - ref), abs(low - ref) / max(abs(ref), 1e-12)
            rows.append({
                "dtype": str(dtype).removeprefix("torch."), "number": name, "float32": ref, "value": low, "abs_diff": abs_diff,
                "rel_diff": rel_diff, "tolerance": f"{kind} {tolerance:.3g}", "within": (abs_diff if kind == "abs" else rel_diff) <= tolerance,
                "all_finite": finite,
            })
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class RealModelConfig(Serialisable):
    """Sizes of the real-model experiments (defaults: the papers' where they give one)."""

    # Gu et al.: 100 sequences of 64 tokens, ε 0.3.
    sink_sequences: int = 100
    seq_len: int = 64
    eps: float = DEFAULT_EPS
    # Moving the sink: position k (0-based) and factor λ, on this many text sequences (SEs shrink as 1/√n).
    move_position: int = 8
    move_factor: float = 8.0
    move_sequences: int = 64
    # Moving the sink with the model's BOS first (Gemma sinks on its BOS and barely without one).
    move_bos: bool = False
    # bf16/fp16 comparison: a full analyze per dtype.
    precision_sequences: int = 32
    seed: int = 0


@dataclass
class RealModelResult:
    """The tables of :func:`run`, with the seconds each took."""

    config: RealModelConfig
    sinks: SinkTable
    move: pd.DataFrame
    precision: pd.DataFrame
    seconds: dict[str, float] = field(default_factory=dict)

    def record(self, command: str | None = None) -> dict[str, Any]:
        """The three tables as a results file (``docs/render.py`` writes the pages from it): numbers
        ``sinks.INPUTS.BOS.COLUMN``, ``move.CONDITION.COLUMN`` and ``precision.DTYPE.NUMBER.COLUMN``."""
        sinks = self.sinks.to_pandas().assign(bos=lambda f: ["bos" if b else "no_bos" for b in f.bos])
        numbers = {"config": self.config.to_dict(), **numbers_of(sinks, ["inputs", "bos"], "sinks"), **numbers_of(self.move, ["condition"], "move"),
                   **numbers_of(self.precision, ["dtype", "number"], "precision")}
        tables = {"sinks": table_of(self.sinks.to_pandas(), {"sink_0": ".1f", "sink_1": ".1f", "max_sink_later": ".1f", "share_0": ".3f", "norm_ratio_0_max": ".0f"}),
                  "move": table_of(self.move),
                  "precision": table_of(self.precision, {"float32": ".4g", "value": ".4g", "abs_diff": ".2g", "rel_diff": ".2g"})}
        return results_record(numbers, tables, DEPENDS, command)

    def markdown(self) -> str:
        parts = [
            "### Sinks by input kind\n\n" + markdown_table(self.sinks.to_pandas()),
            "### Sink_0 per layer (%)\n\n" + markdown_table(self.sinks.by_layer()),
            "### Moving the sink\n\n" + markdown_table(self.move),
            "### bf16 / fp16 vs float32\n\n" + markdown_table(self.precision),
            "### Seconds\n\n" + markdown_table(pd.DataFrame([self.seconds])),
        ]
        return "\n\n".join(parts) + "\n"


def _check_sizes(model: Any, config: RealModelConfig) -> None:
    """Refuse, before the first table, sizes that a later table would refuse only after minutes."""
    check_context(config.seq_len, int(model.cfg.n_ctx))
    check_later_position(config.move_position, config.seq_len, "move_position")
    # every table reads held-out text windows; the corpus holds a fixed number of them at this length
    text_tokens(_tokenizer(model), max(config.sink_sequences, config.move_sequences, config.precision_sequences), config.seq_len)


def run(model: Any, config: RealModelConfig = RealModelConfig(), *, progress: bool = True) -> RealModelResult:
    """Experiments 1, 4 and 6 on ``model`` (a pretrained TL model with a tokenizer)."""
    _check_sizes(model, config)
    tables = {
        "sinks": lambda: sink_table(model, n=config.sink_sequences, seq_len=config.seq_len, eps=config.eps, seed=config.seed),
        "move": lambda: move_sink_table(model, n=config.move_sequences, seq_len=config.seq_len, position=config.move_position,
                                        factor=config.move_factor, eps=config.eps, seed=config.seed, bos=config.move_bos),
        "precision": lambda: precision_table(model, n=config.precision_sequences, seq_len=config.seq_len, seed=config.seed),
    }
    seconds, done = {}, {}
    for name, make in tqdm(tables.items(), desc="real-model tables", disable=not progress):
        start = time.perf_counter()
        done[name] = make()
        seconds[name] = time.perf_counter() - start
    return RealModelResult(config, done["sinks"], done["move"], done["precision"], seconds)


class RealModelExperiment(Experiment):
    """``lens-bias real-model``: :func:`lens_bias.experiments.real_model.run` on a pretrained model from the command line."""

    name = "real-model"
    help = "the papers' real-model experiments on a pretrained model: sinks by input kind, moving the sink, bf16/fp16"
    description = "Gu et al.'s sink table, moving the sink on text, and analyze in bf16 / fp16 against float32, on --model."
    config_type = RealModelConfig
    presets = {"default": RealModelConfig()}
    model_help = "a pretrained model with a tokenizer"

    def run(self, config: RealModelConfig, args: Any) -> Outcome:
        result = run(load_model(args.model), config, progress=not args.no_progress)
        text = result.markdown()
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "summary.md").write_text(text)
            write_results(Path(args.out) / "results.json", result.record())
        return Outcome(text)
