"""Unrelated models that every lineage test must call unrelated: the false-positive rate of each align mode.

Random inits are the easy negatives: they share nothing with each other. Models trained from other init seeds on
one corpus share what they learned (convergent learning), and with the same data order they share every batch. A
test whose verdict follows the function rather than the init calls them related. This experiment measures that:

- **trained**: ``n_trained`` models from init seeds 0, 1, ..., the first half trained on data order
  ``data_seeds[0]``, the rest on ``data_seeds[1]``; every pair of them, marked "same order" or "other order";
- **random init**: ``n_random`` pairs of fresh inits of the same configuration (seeds clear of the trained ones).

Each pair is compared (:func:`~lens_bias.seedprint.comparison.compare`, the base the lower seed) with ``compare``'s own
null, as a user would run it: the trained pairs under every mode in ``modes``, the random-init pairs under
``random_modes`` (the aligned modes' rate on inits is :func:`~lens_bias.seedprint.calibration.calibrate`'s). A
positive is a false positive; the FPR is reported with its 95% Clopper-Pearson upper bound.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, Union

import pandas as pd
from tqdm.auto import tqdm

from lens_bias import seedprint
from lens_bias.core.corpora import prose
from lens_bias.core.errors import LensBiasError
from lens_bias.core.provenance import numbers_of, results_record, table_of, write_results
from lens_bias.core.serialise import Serialisable
from lens_bias.core.tables import markdown_table
from lens_bias.experiments.base import Experiment, Outcome
from lens_bias.models import ModelSpec, random_init
from lens_bias.seedprint.lineage import ALPHA
from lens_bias.training.data import TokenData
from lens_bias.training.trainer import TrainSettings, train

__all__ = ["NegativesConfig", "NegativesResult", "PRESETS", "run_negatives", "MODES"]

logger = logging.getLogger(__name__)

# "auto" is compare()'s default; None the published test; the rest fit a map on the activations
MODES: tuple[str | None, ...] = ("auto", None, "permutation", "orthogonal", "linear")
DEPENDS = ("lens_bias/seedprint", "lens_bias/experiments/lineage_negatives.py")  # the sources its numbers come from
RANDOM_FIRST_SEED = 10_000  # the random-init pairs' seeds, clear of the trained models'


@dataclass(frozen=True)
class NegativesConfig(Serialisable):
    """Sizes of the experiment; ``PRESETS`` holds the tested ones."""

    # Where the problem shows: at d 128 a rotation fitted on activations already aligns two trained seeds (τ̄ ≈ 0.25)
    model: ModelSpec = ModelSpec("llama", d_model=128, n_layers=2, n_heads=4, d_vocab=2048, n_ctx=64)
    n_trained: int = 10  # trained models: C(10, 2) = 45 pairs, 20 in the same data order and 25 in another
    data_seeds: tuple[int, int] = (42, 7)  # the data orders of the first and second half of the trained models
    steps: int = 400  # training steps: eval loss well below the unigram entropy
    lr: float = 1e-3  # the rate at which trained pairs of other seeds were first found alike
    batch_size: int = 16
    seq_len: int = 64  # training sequence length
    n_random: int = 255  # random-init pairs: with the trained ones, 300 unrelated pairs for the default
    n: int = 512  # fingerprint inputs (the fitted modes fit on half: n/2 > 2 d_model)
    input_len: int = 16
    m: int = 64  # identity dims; about d_model / 2 at small width
    modes: tuple[str | None, ...] = MODES  # on the trained pairs
    # on the random-init pairs: the default and the published test (calibrate() measures the fitted modes on inits)
    random_modes: tuple[str | None, ...] = ("auto", None)


PRESETS = {
    "tiny": NegativesConfig(model=ModelSpec("llama", d_model=32, n_layers=1, n_heads=4, d_vocab=1024, n_ctx=32), n_trained=4, steps=80, lr=3e-3,
                            batch_size=8, seq_len=32, n_random=3, n=160, input_len=8, m=16),
    "default": NegativesConfig(),
}


@dataclass
class NegativesResult:
    """Every pair's verdict under every mode, and the false-positive rate of each mode on each kind of negative."""

    # negatives, order, base, suspect, mode, p, log10_p, tau_bar, related, token_source, basis_map, basis_fit, and with "auto" the
    # embedding tables' agreement (tables_z, tables_log10_p) and whether the verdict asked it (tables_asked: both trained)
    pairs: pd.DataFrame
    training: pd.DataFrame  # seed, data_seed, eval_loss, unigram_entropy
    config: NegativesConfig

    def rates(self) -> pd.DataFrame:
        """Per kind of negative (random init; trained, same order; trained, other order; trained, all) and mode:
        pairs, false positives, FPR, its 95% upper bound and the median τ̄."""
        frames = {"random init": self.pairs[self.pairs.negatives == "random init"]}
        trained = self.pairs[self.pairs.negatives == "trained"]
        for order in ("same order", "other order"):
            frames[f"trained, {order}"] = trained[trained.order == order]
        frames["trained, all"] = trained
        frames["all"] = self.pairs
        rows = []
        for kind, frame in frames.items():
            for mode, group in frame.groupby("mode", sort=False, dropna=False):
                positives, count = int(group.related.sum()), len(group)
                rows.append({"negatives": kind, "mode": mode, "pairs": count, "false_positives": positives, "fpr": positives / count,
                             "fpr_upper95": clopper_pearson_upper(positives, count), "median_tau_bar": float(group.tau_bar.median())})
        return pd.DataFrame(rows)

    def tables_numbers(self) -> dict[str, float]:
        """The embedding tables' agreement z (:mod:`~lens_bias.seedprint.tables`) under the default, per kind of
        negative: the largest, and the share of pairs whose bound is below α."""
        auto = self.pairs[self.pairs["mode"] == "auto"]
        numbers = {}
        for kind, frame in auto.groupby("negatives"):
            key = "tables." + str(kind).replace(" ", "_")
            numbers[f"{key}.max_z"] = float(frame.tables_z.max())
            numbers[f"{key}.below_alpha"] = float((frame.tables_log10_p < math.log10(ALPHA)).mean())
        return numbers

    def markdown(self) -> str:
        return markdown_table(_shown(self.rates()), formats=SHOWN_FORMATS)

    def save(self, out: Union[str, Path], command: str | None = None) -> None:
        """pairs.csv, rates.csv, rates.md and ``lineage_negatives.json``: the rates as a results file
        (:func:`~lens_bias.core.provenance.results_record`, which ``docs/render.py`` writes the pages from)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.pairs.to_csv(out / "pairs.csv", index=False)
        rates = self.rates()
        rates.to_csv(out / "rates.csv", index=False)
        (out / "rates.md").write_text(markdown_table(_shown(rates), formats=SHOWN_FORMATS))
        keyed = rates.assign(mode=["published" if m == "None" else m for m in rates["mode"]])
        numbers = {"config": self.config.to_dict(), "unigram_entropy": float(self.training.unigram_entropy.iloc[0]),
                   "eval_loss.min": float(self.training.eval_loss.min()), "eval_loss.max": float(self.training.eval_loss.max()),
                   **numbers_of(keyed, ["mode", "negatives"], "rates"), **self.tables_numbers()}
        labelled = rates.assign(mode=["None (published)" if m == "None" else f'"{m}"' for m in rates["mode"]])
        tables = {"rates": table_of(_shown(labelled), SHOWN_FORMATS)}
        write_results(out / "lineage_negatives.json", results_record(numbers, tables, DEPENDS, command))


SHOWN_FORMATS = {"FPR": ".3f", "95% upper": ".3f", "median τ̄": ".4f"}


def _shown(rates: pd.DataFrame) -> pd.DataFrame:
    """The rates with the column names a reader sees (:data:`SHOWN_FORMATS` formats them)."""
    return rates.set_axis(["negatives", "mode", "pairs", "false positives", "FPR", "95% upper", "median τ̄"], axis=1)


def clopper_pearson_upper(positives: int, count: int, level: float = 0.95) -> float:
    """The exact one-sided upper confidence bound of a binomial rate: the p with P(X <= positives | count, p) = 1 − level."""
    if positives >= count:
        return 1.0
    lo, hi = positives / count, 1.0
    for _ in range(60):  # bisection on the binomial tail, which falls as p rises
        mid = (lo + hi) / 2
        tail = sum(math.comb(count, k) * mid**k * (1 - mid) ** (count - k) for k in range(positives + 1))
        lo, hi = (mid, hi) if tail > 1 - level else (lo, mid)
    return hi


def run_negatives(config: NegativesConfig = NegativesConfig(), *, progress: bool = True) -> NegativesResult:
    """Train the unrelated models, draw the random-init pairs and compare every pair under every mode.

    >>> result = run_negatives(PRESETS["tiny"], progress=False)  # doctest: +SKIP
    >>> result.rates().query("negatives == 'trained, all'")[["mode", "fpr"]]  # doctest: +SKIP

    Args:
        config: the sizes (``PRESETS``).
        progress: progress bars.

    Returns:
        A :class:`NegativesResult`.
    """
    _check(config)
    trained, training = _trained(config, progress)
    rows = []
    seeds = sorted(trained)
    for a, b in tqdm(list(itertools.combinations(seeds, 2)), desc="trained pairs", disable=not progress):
        order = "same order" if _order(config, a) == _order(config, b) else "other order"
        rows += _compared(config.modes, config, trained[a], trained[b], {"negatives": "trained", "order": order, "base": f"seed {a}", "suspect": f"seed {b}"})
    for i in tqdm(range(config.n_random), desc="random-init pairs", disable=not progress):
        a, b = RANDOM_FIRST_SEED + 2 * i, RANDOM_FIRST_SEED + 2 * i + 1
        base, suspect = (random_init(dataclasses.replace(config.model, seed=s)) for s in (a, b))
        rows += _compared(config.random_modes, config, base, suspect, {"negatives": "random init", "order": "", "base": f"seed {a}", "suspect": f"seed {b}"})
    return NegativesResult(pd.DataFrame(rows), training, config)


def _check(config: NegativesConfig) -> None:
    """Refuse, before minutes of training, sizes the comparisons would refuse only afterwards."""
    n_ctx, d = config.model.n_ctx, config.model.d_model
    for name, value in (("seq_len", config.seq_len), ("input_len", config.input_len)):
        if value > n_ctx:
            raise LensBiasError(f"{name} {value} exceeds the model's context n_ctx={n_ctx}: set {name} <= {n_ctx} or model.n_ctx >= {value}")
    if config.m > d:
        raise LensBiasError(f"m {config.m} exceeds d_model {d}: set m <= {d}")
    unknown = [m for m in (*config.modes, *config.random_modes) if m not in MODES]
    if unknown:
        raise LensBiasError(f"unknown align mode(s) {unknown}; choose from {list(MODES)}")


def _order(config: NegativesConfig, seed: int) -> int:
    return config.data_seeds[0] if seed < (config.n_trained + 1) // 2 else config.data_seeds[1]


def _trained(config: NegativesConfig, progress: bool) -> tuple[dict[int, Any], pd.DataFrame]:
    data = TokenData.build(prose(), vocab_size=config.model.d_vocab, seq_len=config.seq_len, progress=False)
    settings = TrainSettings(steps=config.steps, batch_size=config.batch_size, lr=config.lr)
    models, rows, entropy = {}, [], data.unigram_entropy()
    for seed in tqdm(range(config.n_trained), desc="training", disable=not progress):
        model = random_init(dataclasses.replace(config.model, seed=seed))
        run = train(model, data, settings, data_seed=_order(config, seed), progress=False)
        models[seed] = model
        rows.append({"seed": seed, "data_seed": _order(config, seed), "eval_loss": run.final_eval_loss, "unigram_entropy": entropy})
    return models, pd.DataFrame(rows)


def _compared(modes: Sequence[str | None], config: NegativesConfig, base: Any, suspect: Any, row: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for mode in modes:
        result = seedprint.compare(base, suspect, n=config.n, seq_len=config.input_len, m=config.m, align=mode, progress=False)
        out.append({**row, "mode": "None" if mode is None else mode, "p": result.p, "log10_p": result.log10_p, "tau_bar": result.tau_bar,
                    "related": result.same_lineage, "token_source": result.token_source, "basis_map": result.basis_map, "basis_fit": result.basis_fit,
                    "tables_z": None if result.tables is None else result.tables.z, "tables_log10_p": None if result.tables is None else result.tables.log10_p,
                    "tables_asked": result.tables_asked})
    return out


def summary(result: NegativesResult) -> str:
    """The training record and the false-positive rates, as text."""
    training = result.training.to_string(index=False, float_format=lambda v: f"{v:.3f}")
    return f"training (loss in nats):\n{training}\n\nfalse positives at α = {ALPHA} (every pair is unrelated):\n{result.markdown()}"


class NegativesExperiment(Experiment):
    """``lens-bias lineage-negatives``: :func:`run_negatives` from the command line."""

    name = "lineage-negatives"
    help = "the false-positive rate of every align mode on unrelated models: random inits and models trained from other seeds on one corpus"
    description = (
        "Train models from init seeds 0..n-1 on stdlib prose (half on one data order, half on another), draw pairs of random inits, and "
        "compare every pair under every align mode. Writes pairs.csv, rates.csv and lineage_negatives.json to --out."
    )
    preset_help = "sizes (tiny: seconds; default: 45 trained pairs and 255 random-init pairs)"
    config_type = NegativesConfig
    presets = PRESETS

    def least(self, field: str) -> int:
        return 2 if field == "n_trained" else 0 if field == "n_random" else super().least(field)

    def run(self, config: NegativesConfig, args: Any) -> Outcome:
        result = run_negatives(config, progress=not args.no_progress)
        if args.out:
            result.save(args.out)
        return Outcome(summary(result))
