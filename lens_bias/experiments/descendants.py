"""SeedPrint against real descendants: LeaFBench in miniature, on CPU.

LeaFBench (SeedPrints paper) fingerprints each base model's descendants — fine-tunes, merges, adapters,
quantisations — and unrelated models, and reports the AUC of the lineage score. :func:`real_descendants` makes
them on the spot from any TransformerLens model with :mod:`lens_bias.models.transforms` and
:func:`lens_bias.training.trainer.fine_tune`, fingerprints the base and all of them (token inputs, analytic null)
and tabulates τ̄, k, p and the verdict per pair, with the AUC of related vs unrelated pairs.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence, Union

import numpy as np
import pandas as pd
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias import seedprint
from lens_bias.core.corpora import code
from lens_bias.core.errors import LensBiasError
from lens_bias.core.serialise import Serialisable
from lens_bias.core.tables import markdown_table
from lens_bias.experiments.base import Experiment, Outcome
from lens_bias.models import load_model
from lens_bias.models.transforms import (
    low_rank_delta,
    merge,
    prune,
    quantize,
    random_inits,
    relative_change,
)
from lens_bias.seedprint.lineage import ALPHA, STRONG
from lens_bias.training.data import TokenData
from lens_bias.training.trainer import evaluate, fine_tune

__all__ = ["auc", "DescendantsConfig", "DescendantsResult", "PRESETS", "real_descendants"]

logger = logging.getLogger(__name__)


def auc(scores: Union[Float[Tensor, "n"], Sequence[float]], labels: Sequence[bool]) -> float:
    """Area under the ROC curve: P(score of a positive > score of a negative), ties counting one half (exact)."""
    s, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    pos, neg = s[y], s[~y]
    if not len(pos) or not len(neg):
        raise LensBiasError(f"the AUC needs both labels; got {len(pos)} positives and {len(neg)} negatives")
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / diff.size)


@dataclass(frozen=True)
class DescendantsConfig(Serialisable):
    """Sizes of the experiment; ``PRESETS`` holds the tested ones."""

    # Fingerprint inputs. On SmolLM2 the weakest descendant (prune 30%) sits at z ≈ 120 with 128 inputs and 180 with
    # 256; the cost is linear in n · seq_len.
    n: int = 128
    seq_len: int = 32  # tokens per input (the papers use 1024)
    seed: int = 42  # the inputs' seed, the papers'
    # Identity dims m = ⌊ratio_k·D⌋, as the papers' 160M toys (m 400 of D 768). Their large-model 0.1 leaves
    # unrelated models ~m²/D ≈ 5 shared dims at D 576, where the analytic null ran wide on SmolLM2 (z sd 1.5 over 10
    # random inits, one at p = 0.001); at 0.5 the z's of 55 unrelated pairs had sd 0.95–1.05.
    ratio_k: float = 0.5
    group_size: int = 32  # quantisation block, GGUF's Q8_0 / Q4_0
    prune_fraction: float = 0.3
    lora_rank: int = 8
    lora_scale: float = 0.05  # ‖ΔW‖_F / ‖W‖_F per matrix: a large adapter (the 40-step fine-tune moves θ by 0.3%)
    lora_seed: int = 0
    finetune_steps: int = 40  # ~2.5 s a step for SmolLM2 on 2 cores; held-out code loss 2.83 -> 2.57 nats
    finetune_lr: float = 1e-4  # a full fine-tune's rate at 135M, well below pretraining's
    finetune_batch: int = 4
    finetune_seq_len: int = 64
    merge_weight: float = 0.5  # base and fine-tune averaged
    n_random: int = 10  # random inits of the config: the unrelated side of the AUC
    first_random_seed: int = 1_000_000  # as the seeds null's: clear of the small seeds lens_bias models are built with
    eval_blocks: int = 16  # held-out code blocks for each descendant's loss (a check that it still is a model)


PRESETS = {
    "default": DescendantsConfig(),
    # For tests on tiny random models: minutes become seconds, every code path still runs.
    "tiny": DescendantsConfig(n=128, seq_len=8, finetune_steps=4, finetune_batch=4, finetune_seq_len=16, n_random=3, eval_blocks=4),
}


@dataclass
class DescendantsResult:
    """One row per pair (the base against each descendant and each random init), and the AUC over them."""

    table: pd.DataFrame  # pair, target, related, tau_bar, k, z, p, log10_p, verdict, expected, ok, weight_change, eval_loss
    auc_log10_p: float  # score −log10 p, labels related / unrelated
    auc_tau: float  # score τ̄
    base_eval_loss: float  # held-out code loss of the base (nats)
    fingerprints: dict[str, seedprint.Fingerprint]  # "base" and every target: re-test with another m or null
    config: dict[str, Any]
    seconds: float

    @property
    def all_as_expected(self) -> bool:
        return bool(self.table.ok.all())

    def to_pandas(self) -> pd.DataFrame:
        return self.table.copy()

    def markdown(self) -> str:
        """The table as markdown, the AUCs below it."""
        t = self.table
        shown = pd.DataFrame({
            "pair": t.pair, "τ̄": t.tau_bar, "k": t.k, "log10 p": t.log10_p, "verdict": [v + ("" if ok else " ✗") for v, ok in zip(t.verdict, t.ok)],
            "expected": t.expected, "‖Δθ‖/‖θ‖": t.weight_change, "code loss": ["" if math.isnan(v) else f"{v:.3f}" for v in t.eval_loss],
        })
        tail = f"AUC (score −log10 p) = {self.auc_log10_p:.4f}; AUC (score τ̄) = {self.auc_tau:.4f}; base code loss {self.base_eval_loss:.3f} nats"
        return markdown_table(shown, formats={"τ̄": ".4f", "log10 p": ".1f", "‖Δθ‖/‖θ‖": ".3g"}) + "\n\n" + tail + "\n"


def real_descendants(
    model: Any,
    config: Union[str, DescendantsConfig] = "default",
    *,
    data: TokenData | None = None,
    progress: bool = True,
    **overrides: Any,
) -> DescendantsResult:
    """Fingerprint ``model`` and its descendants (int8, 4-bit, pruned, LoRA delta, fine-tune, merge) and random inits.

    Every descendant is expected related at p < 1e-10 and every random init unrelated (p ≥ 0.01), under the
    analytic null with token inputs (IDs uniform below d_vocab, N ≪ V/4) and m = ⌊ratio_k·D⌋ identity dims
    (D/2 by default: see :class:`DescendantsConfig`).

    Args:
        model: the base, a TransformerLens model with ``model.tokenizer`` (or pass ``data``); not modified.
        config: a preset name ("default", "tiny") or a :class:`DescendantsConfig`.
        data: fine-tuning blocks (default: the code corpus packed with ``model.tokenizer``); the held-out split
            gives every model's code loss.
        progress: a progress bar over the models.
        **overrides: fields of :class:`DescendantsConfig` replacing the preset's.

    Returns:
        A :class:`DescendantsResult`.
    """
    cfg = replace(PRESETS[config] if isinstance(config, str) else config, **overrides)
    started = time.perf_counter()
    if data is None:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise LensBiasError("the fine-tuned descendant needs model.tokenizer (load with lens_bias.models.pretrained) or data=TokenData.build(...)")
        data = TokenData.build(code(), seq_len=cfg.finetune_seq_len, tokenizer_from=tokenizer)
    held_out = data.eval[: cfg.eval_blocks]

    def fingerprint(m: Any) -> seedprint.Fingerprint:
        return seedprint.fingerprint(m, inputs="tokens", n=cfg.n, seq_len=cfg.seq_len, seed=cfg.seed, progress=False)

    total = 7 + cfg.n_random
    bar = tqdm(total=total, desc="real descendants", disable=not progress)
    base = fingerprint(model)
    prints = {"base": base}
    bar.update()
    base_loss = evaluate(model, held_out)
    rows = []

    def record(name: str, target: Any, related: bool, eval_loss: float | None = None) -> None:
        prints[name] = fingerprint(target)
        res = seedprint.lineage_test(base, prints[name], ratio_k=cfg.ratio_k, alpha=ALPHA)
        expected = f"related, p < {STRONG:g}" if related else "unrelated"
        ok = res.p < STRONG if related else res.p >= ALPHA
        rows.append({
            "pair": f"base vs {name}", "target": name, "related": related, "tau_bar": res.tau_bar, "k": res.k, "z": res.z, "p": res.p,
            "log10_p": res.log10_p, "verdict": "related" if res.same_lineage else "unrelated", "expected": expected, "ok": ok,
            "weight_change": relative_change(model, target), "eval_loss": evaluate(target, held_out) if eval_loss is None else eval_loss,
        })
        logger.info("%s: τ̄ %.4f, k %d, log10 p %.1f (%.0f s so far)", name, res.tau_bar, res.k, res.log10_p, time.perf_counter() - started)
        bar.update()

    makers: list[tuple[str, Callable[[], Any]]] = [
        ("int8", lambda: quantize(model, 8, cfg.group_size)),
        ("4-bit", lambda: quantize(model, 4, cfg.group_size)),
        (f"prune {cfg.prune_fraction:.0%}", lambda: prune(model, cfg.prune_fraction)),
        (f"low-rank delta r{cfg.lora_rank}", lambda: low_rank_delta(model, cfg.lora_rank, cfg.lora_scale, cfg.lora_seed)),
    ]
    for name, make in makers:
        record(name, make(), related=True)  # one descendant alive at a time: each is a full copy
    tuned, run = fine_tune(model, cfg.finetune_steps, data=data, lr=cfg.finetune_lr, batch_size=cfg.finetune_batch, eval_blocks=cfg.eval_blocks, progress=False)
    record(f"fine-tune {cfg.finetune_steps} steps", tuned, related=True, eval_loss=run.final_eval_loss)  # on held_out already
    record(f"merge(base, fine-tune) w {cfg.merge_weight:g}", merge(model, tuned, cfg.merge_weight), related=True)
    del tuned
    seeds = range(cfg.first_random_seed, cfg.first_random_seed + cfg.n_random)
    for seed, fresh in zip(seeds, random_inits(model, seeds)):
        record(f"random init {seed}", fresh, related=False, eval_loss=float("nan"))  # ≈ ln V, nothing to learn from it
    bar.close()
    table = pd.DataFrame(rows)
    return DescendantsResult(
        table=table,
        auc_log10_p=auc(-table.log10_p, table.related),
        auc_tau=auc(table.tau_bar, table.related),
        base_eval_loss=base_loss,
        fingerprints=prints,
        config=cfg.to_dict(),
        seconds=time.perf_counter() - started,
    )


class DescendantsExperiment(Experiment):
    """``lens-bias descendants``: :func:`real_descendants` from the command line."""

    name = "descendants"
    help = "SeedPrint against descendants of a pretrained model (quantised, pruned, adapted, fine-tuned, merged) and random inits"
    description = "LeaFBench in miniature: every descendant must be related at p < 1e-10 and every random init unrelated. Exits 1 otherwise."
    preset_help = "sizes (tiny: seconds on a tiny model; default: SmolLM2 in minutes on 2 CPU cores)"
    config_type = DescendantsConfig
    presets = PRESETS

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--model", default="smollm2-135m-instruct", metavar="MODEL", help="the base model, with a tokenizer (any MODEL string)")

    def run(self, config: DescendantsConfig, args: Any) -> Outcome:
        result = real_descendants(load_model(args.model), config, progress=not args.no_progress)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            result.table.to_csv(Path(args.out) / "descendants.csv", index=False)
            (Path(args.out) / "descendants.md").write_text(result.markdown())
        return Outcome(result.markdown(), result.all_as_expected)
