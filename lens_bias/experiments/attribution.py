"""What makes a trained model's sink, link by link: :func:`lens_bias.analyses.sink_attribution.sink_attribution` on a
pretrained model, from the command line (``lens-bias attribution --model MODEL``).

The measured and the calibration sequences are disjoint windows of held-out text (or independent random tokens),
so the means the conditions set come from sequences that are never measured.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from lens_bias.analyses.sink_attribution import SinkAttribution, SinkAttributionResult, sink_attribution
from lens_bias.core.errors import LensBiasError, MissingExtra
from lens_bias.core.inputs import check_context, random_tokens, text_tokens
from lens_bias.core.provenance import numbers_of, results_record, table_of, write_results
from lens_bias.core.serialise import Serialisable
from lens_bias.core.tables import markdown_table
from lens_bias.experiments.base import Experiment, Outcome
from lens_bias.models import load_model
from lens_bias.report import analyze

__all__ = ["AttributionConfig", "PRESETS", "run_attribution", "attribution_tokens", "attribution_record", "AttributionExperiment"]

# the sources the results file's numbers come from (a page says when one changed since the run)
DEPENDS = ("lens_bias/experiments/attribution.py", "analyses/sink_attribution.py", "hooks")


@dataclass(frozen=True)
class AttributionConfig(Serialisable):
    """Sizes of the attribution; ``PRESETS`` holds the tested ones."""

    # Measured sequences: Sink_0's standard error shrinks as 1/√n; each condition costs two passes over them.
    n: int = 32
    # Gu et al. measure at T = 64 (Sink_k falls with T).
    seq_len: int = 64
    # Calibration sequences: where the anatomy and the per-layer means the edits set are found.
    calibration: int = 32
    # "text" (held-out prose through the model's tokenizer) or "tokens" (uniform random IDs).
    inputs: str = "text"
    # Put the model's BOS token first (text only): Gemma is trained with one, SmolLM2 and Qwen2.5 without.
    bos: bool = False
    eps: float = 0.3
    n_candidates: int = 2  # super-weight candidates removed one at a time
    n_random: int = 100  # random weights of the same matrix removed together (the control)
    position: int = 8  # the later token of MaskToSelf and AmplifyVariance
    factor: float = 8.0  # λ of AmplifyVariance
    seed: int = 0


PRESETS = {
    "default": AttributionConfig(),
    # Seconds on a tiny model; the real-model tests use it on SmolLM2 too.
    "tiny": AttributionConfig(n=8, seq_len=32, calibration=8, n_random=10, position=4),
}


def attribution_record(result: SinkAttributionResult, config: AttributionConfig, command: str | None = None) -> dict[str, Any]:
    """The attribution table as a results file (``docs/render.py`` writes the pages from it): numbers
    ``conditions.CONDITION.COLUMN`` (the condition in lower case, non-alphanumerics as ``_``)."""
    table = result.to_pandas().drop(columns=["edit", "link"])
    numbers = {"config": config.to_dict(), **numbers_of(table, ["condition"], "conditions")}
    return results_record(numbers, {"conditions": table_of(table)}, DEPENDS, command)


def run_attribution(model: Any, config: AttributionConfig = AttributionConfig(), *, progress: bool = True) -> SinkAttributionResult:
    """``sink_attribution`` on ``config.n`` measured and ``config.calibration`` calibration sequences of ``model``."""
    tokens, calibration = attribution_tokens(model, config)
    return sink_attribution(
        model, tokens, calibration=calibration, eps=config.eps, n_candidates=config.n_candidates, n_random=config.n_random,
        position=config.position, factor=config.factor, seed=config.seed, progress=progress,
    )


def attribution_tokens(model: Any, config: AttributionConfig) -> tuple[Tensor, Tensor]:
    """The measured and the calibration token windows of ``config``, disjoint."""
    total = config.n + config.calibration
    check_context(config.seq_len, int(model.cfg.n_ctx))  # before any tokens are made
    if config.inputs == "text":
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise LensBiasError("inputs='text' needs model.tokenizer; use a pretrained model, or --set inputs=tokens")
        windows = text_tokens(tokenizer, total, config.seq_len, bos=config.bos, seed=config.seed)  # distinct windows: none shared
        tokens, calibration = windows[: config.n], windows[config.n :]
    elif config.inputs == "tokens":
        if config.bos:
            raise LensBiasError("bos=true applies to inputs='text'; random tokens have no BOS here")
        vocab = int(model.cfg.d_vocab)
        tokens = random_tokens(config.n, config.seq_len, vocab, seed=config.seed)
        calibration = random_tokens(config.calibration, config.seq_len, vocab, seed=config.seed + 1)
    else:
        raise LensBiasError(f"inputs must be 'text' or 'tokens', got {config.inputs!r}")
    return tokens, calibration


def _markdown(result: SinkAttributionResult) -> str:
    table = result.to_pandas().drop(columns=["edit"])
    return (
        "### Conditions\n\n" + markdown_table(table, formats={"diff_in_se": ".1f", f"sink_{result.position}_diff_in_se": ".1f"})
        + "\n\n### The chain\n\n" + markdown_table(result.chain()) + "\n"
    )


class AttributionExperiment(Experiment):
    """``lens-bias attribution``: :func:`run_attribution` from the command line."""

    name = "attribution"
    help = "what makes a trained model's sink: remove the super weight, the massive dims, the first token's privilege; Sink_0 and perplexity"
    description = (
        "Find the model's super weights and massive dimensions on calibration text, then edit one link of the sink's chain at a time "
        "(super weight, its down_proj row, random weights as control, the massive dims or the whole first-token state set to their mean, "
        "MaskToSelf / AmplifyVariance at a later token) and measure Sink_0 per layer, the massive dims, the disparity and the perplexity "
        "of held-out text."
    )
    preset_help = "sizes (default: 32 + 32 sequences of 64 tokens, a few minutes for SmolLM2 on 2 CPU cores; tiny: seconds)"
    config_type = AttributionConfig
    presets = PRESETS
    model_help = "a trained model"

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--html", default=None, metavar="PATH",
                            help="also write the model's report page with this attribution (as lens-bias analyze --attribution does) to PATH")

    def run(self, config: AttributionConfig, args: Any) -> Outcome:
        model = load_model(args.model)
        result = run_attribution(model, config, progress=not args.no_progress)
        if args.html:  # the report of the measured windows, with this attribution after its anatomy
            analyze(model, [..., SinkAttribution(result=result)], inputs=attribution_tokens(model, config)[0], progress=not args.no_progress).to_html(args.html)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            result.to_pandas().to_csv(out / "attribution.csv", index=False)
            result.chain().to_csv(out / "chain.csv", index=False)
            (out / "attribution.md").write_text(_markdown(result))
            write_results(out / "results.json", attribution_record(result, config))
            try:
                result.plot().savefig(out / "sink_by_condition.png", dpi=120)
            except MissingExtra:  # no matplotlib: the tables only
                pass
        return Outcome(result.summary() + "\n\n" + _markdown(result))
