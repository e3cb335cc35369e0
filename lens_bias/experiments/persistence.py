"""The SeedPrint persistence experiment in miniature: does the init bias survive training and a distribution shift?

Init seeds {42, 123, 1000, 2000}, data seed 42. Every model is pretrained on ``prose``; the models from seeds 1000
and 123 are then continued on ``code`` (the shift). The papers' four tables:

| table | base vs target | expected |
|---|---|---|
| 1 | init s_i vs init s_j (4 pairs) | unrelated (p > 0.01) |
| 2 | init s vs trained s (4) | related, p < 1e-10 |
| 3 | init s_i vs trained s_j, same data and order (4 pairs) | unrelated |
| 4 | trained 1000 vs code-continued from 1000 / from 123 | related / unrelated |

each with token inputs and with embedding inputs, plus the lineage of one run's checkpoints against its init
(log10 p by step, token inputs).

Which null judges a comparison (``null_for``): the analytic one (N ≤ V/4) for token inputs when at least one model
is an init; for embedding inputs, the seeds null of fresh inits when the target is an init (the shared residual
path makes the analytic null unsafe there). Two models trained on the same prose (table 4) resemble each other far
beyond the analytic null (measured at the default size: τ̄ from −0.013 to +0.057 over the six pairs of trained
seeds, analytic sd 0.0036), and a trained model answers embedding inputs less through its residual path than an
init does; so every other comparison uses a data-matched null: the base against the models pretrained on the same
batches from init seeds outside both lineages (the other main seeds plus ``n_null_trained`` extra ones), a
``SeedsNull`` labelled "trained seeds".
"""

from __future__ import annotations

import copy
import logging
import math
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence, Union

import pandas as pd
from tqdm.auto import tqdm

from lens_bias import seedprint
from lens_bias.core import memory
from lens_bias.core.corpora import code, prose
from lens_bias.core.errors import LensBiasError
from lens_bias.core.figures import new_figure
from lens_bias.core.provenance import results_record, write_results
from lens_bias.core.serialise import Serialisable
from lens_bias.core.tables import markdown_table
from lens_bias.experiments.base import Experiment, Outcome
from lens_bias.models import ModelSpec, random_init
from lens_bias.models.checkpoints import load_checkpoint
from lens_bias.seedprint.lineage import ALPHA, STRONG
from lens_bias.training.data import TokenData
from lens_bias.training.trainer import TrainSettings, train

__all__ = ["PersistenceConfig", "PersistenceResult", "PRESETS", "run_persistence"]

logger = logging.getLogger(__name__)

SEEDS = (42, 123, 1000, 2000)
DATA_SEED = 42
CYCLE = [(SEEDS[i], SEEDS[(i + 1) % len(SEEDS)]) for i in range(len(SEEDS))]  # the 4 pairs of tables 1 and 3
DEPENDS = ("lens_bias/experiments/persistence.py", "lens_bias/seedprint", "lens_bias/training")  # the sources its numbers come from


@dataclass(frozen=True)
class PersistenceConfig(Serialisable):
    """Sizes of the experiment; ``PRESETS`` holds the tested ones."""

    # The models (seeds are the experiment's). d_vocab is the BPE vocabulary (token fingerprints need N <= d_vocab / 4);
    # n_ctx holds the training and fingerprint lengths.
    model: ModelSpec = ModelSpec("llama", d_model=128, n_layers=4, n_heads=4, d_vocab=4096, n_ctx=64)
    seq_len: int = 64  # training sequence length
    batch_size: int = 16
    pretrain_steps: int = 600
    pretrain_lr: float = 6e-4  # eval loss ~1.2 nats below the unigram entropy; 2e-3 erases the lineage (README)
    continue_steps: int = 200
    continue_lr: float = 5e-4  # continued training uses a smaller rate, as in the papers (2e-5 at 160M)
    weight_decay: float = 0.1
    checkpoint_every: int = 50  # the lineage curve of the seed-42 run
    n_inputs: int = 1000  # fingerprint inputs
    input_len: int = 64
    m: int = 64  # identity dims; about d_model / 2 at small width
    n_null: int = 20  # fresh inits in the seeds null (embedding inputs, tables 1-3)
    n_null_trained: int = 2  # extra seeds pretrained on the same data, for the data-matched null


PRESETS = {
    "tiny": PersistenceConfig(model=ModelSpec("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=2048, n_ctx=32), seq_len=32, batch_size=8, pretrain_steps=60, continue_steps=30, pretrain_lr=3e-3, continue_lr=1e-3, checkpoint_every=20, n_inputs=400, input_len=32, m=32, n_null=12),
    "default": PersistenceConfig(),
    # The papers' 160M LLaMA toy (d 768, 12 layers, ffn 2048) for GPU users: 2048-token blocks, batch 32, lr 3e-4.
    "scale": PersistenceConfig(model=ModelSpec("llama", d_model=768, n_layers=12, n_heads=12, d_vocab=32000, n_ctx=2048), seq_len=2048, batch_size=32, pretrain_steps=5000, pretrain_lr=3e-4, continue_steps=2000, continue_lr=2e-5, checkpoint_every=500, n_inputs=2000, input_len=1024, m=76, n_null=20),
}


@dataclass
class PersistenceResult:
    """The four tables (both input kinds), the lineage curve, and the training record."""

    tables: pd.DataFrame  # table, base, target, inputs, null, tau_bar, k, p, log10_p, same_lineage, expected, ok
    curve: pd.DataFrame  # step, log10_p, tau_bar, same_lineage (seed 42: init vs each checkpoint, token inputs)
    training: pd.DataFrame  # run, steps, final_train_loss, eval_loss, unigram_entropy

    @property
    def all_as_expected(self) -> bool:
        return bool(self.tables.ok.all())

    def plot(self) -> Any:
        """log10 p of the lineage test along the seed-42 run's checkpoints (a matplotlib Figure)."""
        fig = new_figure()
        ax = fig.subplots()
        ax.plot(self.curve.step, self.curve.log10_p, marker="o")
        ax.axhline(math.log10(ALPHA), color="k", linestyle="--", label=f"α = {ALPHA}")
        ax.set_xlabel("training step")
        ax.set_ylabel("log10 p (init vs checkpoint)")
        ax.legend()
        return fig

    def save(self, out: Union[str, Path], command: str | None = None) -> None:
        """tables.csv, tables.md, curve.csv, training.csv and ``persistence.json``: the verdicts, their ranges per
        table, the curve and the training record as a results file (:func:`~lens_bias.core.provenance.results_record`,
        which ``docs/render.py`` writes the pages from)."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        columns = ["table", "base", "target", "inputs", "tau_bar", "k", "p", "same_lineage", "expected"]
        self.tables[columns].to_csv(out / "tables.csv", index=False)
        (out / "tables.md").write_text(self.markdown())
        self.curve.to_csv(out / "curve.csv", index=False)
        self.training.to_csv(out / "training.csv", index=False)
        write_results(out / "persistence.json", results_record(self.numbers(), {}, DEPENDS, command))

    def numbers(self) -> dict[str, Any]:
        """The named numbers a page quotes: the verdict counts; per table row group (``t1``…``t3``, ``t4_related``,
        ``t4_unrelated``) and input kind the range of τ̄ and p; the curve's τ̄ at its first checkpoints and over its
        second half, and its largest log10 p; the eval losses on prose and code against their unigram entropies."""
        t = self.tables
        numbers: dict[str, Any] = {"verdicts": len(t), "as_expected": int(t.ok.sum())}
        for kind, frame in t.groupby("inputs"):
            numbers[f"{kind}.verdicts"], numbers[f"{kind}.as_expected"] = len(frame), int(frame.ok.sum())
            groups = {f"t{n}": frame[frame.table == n] for n in (1, 2, 3)}
            groups |= {f"t4_{e}": frame[(frame.table == 4) & (frame.expected == e)] for e in ("related", "unrelated")}
            for name, group in groups.items():
                for column in ("tau_bar", "p"):
                    numbers[f"{kind}.{name}.{column}.min"], numbers[f"{kind}.{name}.{column}.max"] = float(group[column].min()), float(group[column].max())
        curve = self.curve.sort_values("step")
        late = curve[curve.step >= curve.step.max() / 2]
        numbers |= {f"curve.tau_bar.step{int(r.step)}": float(r.tau_bar) for r in curve.head(3).itertuples()}
        numbers |= {"curve.late.from_step": int(late.step.min()), "curve.late.tau_bar.min": float(late.tau_bar.min()),
                    "curve.late.tau_bar.max": float(late.tau_bar.max()), "curve.log10_p.max": float(curve.log10_p.max())}
        for corpus, frame in (("prose", self.training[self.training.run.str.startswith("pretrain")]), ("code", self.training[self.training.run.str.startswith("continue")])):
            if frame.empty:
                continue
            numbers |= {f"training.{corpus}.eval_loss.min": float(frame.eval_loss.min()), f"training.{corpus}.eval_loss.max": float(frame.eval_loss.max()),
                        f"training.{corpus}.unigram_entropy": float(frame.unigram_entropy.iloc[0])}
        return numbers

    def markdown(self) -> str:
        parts = []
        for kind, frame in self.tables.groupby("inputs", sort=False):
            verdicts = [("related" if same else "unrelated") + ("" if ok else " ✗") for same, ok in zip(frame.same_lineage, frame.ok)]
            shown = pd.DataFrame({"table": frame.table, "base": frame.base, "target": frame.target, "null": frame.null, "τ̄": frame.tau_bar,
                                  "k": frame.k, "p": frame.p, "verdict": verdicts, "expected": frame.expected})
            parts.append(f"{kind} inputs:\n\n" + markdown_table(shown, formats={"τ̄": ".4f", "p": ".2g"}))
        return "\n\n".join(parts) + "\n"


KINDS = ("tokens", "embeddings")


def null_for(
    kind: str, base: str, target: str, *, fresh: Sequence[seedprint.Fingerprint], trained: dict[int, seedprint.Fingerprint]
) -> seedprint.Null:
    """The null that judges ``base`` vs ``target`` (model names such as "init 42", "trained 1000") on ``kind`` inputs.

    Args:
        kind: "tokens" or "embeddings".
        base: the base model's name.
        target: the suspect's name.
        fresh: fingerprints of fresh inits on these inputs (the seeds null of embedding-input table 1).
        trained: init seed -> fingerprint of the model pretrained from it on these inputs (the data-matched null
            takes those outside both lineages).

    Returns:
        ``AnalyticNull()``, ``SeedsNull(fingerprints=fresh)``, or the data-matched ``SeedsNull`` labelled
        "trained seeds".
    """
    both_trained = not base.startswith("init") and not target.startswith("init")
    if kind == "tokens" and not both_trained:
        return seedprint.AnalyticNull()
    if kind == "embeddings" and target.startswith("init"):
        return seedprint.SeedsNull(fingerprints=fresh)
    outside = {_lineage(base), _lineage(target)}
    return seedprint.SeedsNull(fingerprints=[fp for seed, fp in trained.items() if seed not in outside], label="trained seeds")


def _lineage(name: str) -> int:
    return int(name.split()[-1])


def run_persistence(
    config: Union[str, PersistenceConfig] = "default", *, inputs: Sequence[str] = ("tokens",), progress: bool = True
) -> PersistenceResult:
    """Train the seven models (and the null's extra seeds), fingerprint them, and build the tables and the curve.

    Args:
        config: a preset name ("tiny", "default", "scale") or a :class:`PersistenceConfig`.
        inputs: fingerprint input kinds: "tokens" and/or "embeddings" (see :func:`null_for` for their nulls).
        progress: progress bars.

    Returns:
        A :class:`PersistenceResult`; ``save(dir)`` writes tables.csv, tables.md, curve.csv, training.csv and the results file
        persistence.json.
    """
    cfg = PRESETS[config] if isinstance(config, str) else config
    kinds = list(inputs)
    if not kinds or any(k not in KINDS for k in kinds):
        raise LensBiasError(f"inputs must be a non-empty subset of {list(KINDS)}, got {inputs!r}")
    spec = cfg.model
    if cfg.n_inputs > spec.d_vocab // 4:
        raise LensBiasError(f"token fingerprints need n_inputs <= model.d_vocab / 4 (got {cfg.n_inputs} > {spec.d_vocab // 4})")
    if cfg.m > spec.d_model:  # before any training: the fingerprints come last
        raise LensBiasError(f"m (identity dims) must be <= model.d_model {spec.d_model}, got {cfg.m}")
    if max(cfg.seq_len, cfg.input_len) > spec.n_ctx:
        raise LensBiasError(f"seq_len {cfg.seq_len} and input_len {cfg.input_len} must fit model.n_ctx {spec.n_ctx}; set model.n_ctx={max(cfg.seq_len, cfg.input_len)}")
    # every model's fingerprints are kept until the tables: the seeds' inits, trained and continued models, the nulls
    models = 2 * len(SEEDS) + 2 + cfg.n_null_trained + (cfg.n_null if "embeddings" in kinds else 0)
    memory.check_held("the persistence fingerprints", models, len(kinds) * cfg.n_inputs * spec.d_model * 4, "8 + n_null_trained (+ n_null with embedding inputs)", "n_inputs or model.d_model")
    on_prose = TokenData.build(prose(), vocab_size=spec.d_vocab, seq_len=cfg.seq_len, progress=progress)
    on_code = TokenData.build(code(), seq_len=cfg.seq_len, tokenizer_from=on_prose, progress=progress)
    prints, training, checkpoints, curve_base, null_seeds, work = _trained_prints(cfg, kinds, on_prose, on_code, progress)
    nulls = {}
    if "embeddings" in kinds:
        nulls["embeddings"] = seedprint.seed_null_fingerprints(prints["init 42"]["embeddings"], n_null=cfg.n_null, avoid=list(SEEDS), progress=progress)
    comparisons = (
        [(1, f"init {a}", f"init {b}", "unrelated") for a, b in CYCLE]
        + [(2, f"init {s}", f"trained {s}", "related") for s in SEEDS]
        + [(3, f"init {a}", f"trained {b}", "unrelated") for a, b in CYCLE]
        + [(4, "trained 1000", "code-continued 1000", "related"), (4, "trained 1000", "code-continued 123", "unrelated")]
    )
    rows = []
    for kind in kinds:
        for table, base, target, expected in comparisons:
            trained_prints = {s: prints[f"trained {s}"][kind] for s in [*SEEDS, *null_seeds]}
            null = null_for(kind, base, target, fresh=nulls.get(kind, ()), trained=trained_prints)
            res = seedprint.lineage_test(prints[base][kind], prints[target][kind], m=cfg.m, null=null)
            if table == 2 and isinstance(null, seedprint.AnalyticNull):
                expected = f"related, p < {STRONG:g}"  # a null fitted to a few models is not trusted that far into its tail
            rows.append({
                "table": table, "base": base, "target": target, "inputs": kind, "null": null.label, "tau_bar": res.tau_bar,
                "k": res.k, "p": res.p, "log10_p": res.log10_p, "same_lineage": res.same_lineage, "expected": expected,
                "ok": _as_expected(res.p, expected),
            })
    curve = []
    for path in checkpoints:  # init vs its own checkpoint: one side untrained, so the analytic null holds
        res = seedprint.lineage_test(curve_base, _fingerprint(cfg, load_checkpoint(path), "tokens"), m=cfg.m)
        curve.append({"step": int(path.stem.removeprefix("step")), "log10_p": res.log10_p, "tau_bar": res.tau_bar, "same_lineage": res.same_lineage})
    shutil.rmtree(work, ignore_errors=True)
    return PersistenceResult(pd.DataFrame(rows), pd.DataFrame(curve), pd.DataFrame(training))


def _fingerprint(cfg: PersistenceConfig, model: Any, kind: str) -> seedprint.Fingerprint:
    return seedprint.fingerprint(model, inputs=kind, n=cfg.n_inputs, seq_len=cfg.input_len, progress=False)


def _trained_prints(
    cfg: PersistenceConfig, kinds: list[str], on_prose: TokenData, on_code: TokenData, progress: bool
) -> tuple[dict[str, dict[str, seedprint.Fingerprint]], list[dict[str, Any]], list[Path], seedprint.Fingerprint, list[int], Path]:
    """Pretrain every seed on prose (the null's extra seeds too) and continue two of them on code, fingerprinting each
    model at init and after each stage: the fingerprints by model and input kind, the training rows, the seed-42
    checkpoints (in a temporary folder, also returned) with the init fingerprint their curve starts from, and the
    null's seeds."""
    # each run's own bar under the runs' bar: a long run shows its steps and ETA
    pretrain = TrainSettings(steps=cfg.pretrain_steps, batch_size=cfg.batch_size, lr=cfg.pretrain_lr, weight_decay=cfg.weight_decay, data_seed=DATA_SEED)
    prints: dict[str, dict[str, seedprint.Fingerprint]] = {}

    def fingerprints(model: Any) -> dict[str, seedprint.Fingerprint]:
        return {kind: _fingerprint(cfg, model, kind) for kind in kinds}

    training: list[dict[str, Any]] = []
    trained: dict[int, Any] = {}
    checkpoints: list[Path] = []
    work = Path(tempfile.mkdtemp(prefix="lens_bias_persistence_"))  # the seed-42 checkpoints, read back by the curve
    null_seeds = [s for s in range(1, cfg.n_null_trained + len(SEEDS) + 1) if s not in SEEDS][: cfg.n_null_trained]
    for seed in tqdm([*SEEDS, *null_seeds], desc="pretraining", disable=not progress):
        model = random_init(replace(cfg.model, seed=seed))
        if seed in SEEDS:
            prints[f"init {seed}"] = fingerprints(model)
        if seed == 42:  # the lineage curve uses token inputs whatever the tables use
            curve_base = prints["init 42"]["tokens"] if "tokens" in kinds else _fingerprint(cfg, model, "tokens")
        run = train(model, on_prose, pretrain, progress=progress, checkpoint_every=cfg.checkpoint_every if seed == 42 else None,
                    checkpoint_dir=work / "seed42" if seed == 42 else None)
        checkpoints = run.checkpoints if seed == 42 else checkpoints
        training.append(_training_row(f"pretrain {seed} on prose" + ("" if seed in SEEDS else " (null)"), run, on_prose))
        prints[f"trained {seed}"] = fingerprints(model)
        if seed in (1000, 123):
            trained[seed] = model
    for seed in tqdm((1000, 123), desc="continuing on code", disable=not progress):
        model = copy.deepcopy(trained[seed])
        model.lens_bias_spec = trained[seed].lens_bias_spec
        run = train(model, on_code, replace(pretrain, steps=cfg.continue_steps, lr=cfg.continue_lr), progress=progress)
        training.append(_training_row(f"continue {seed} on code", run, on_code))
        prints[f"code-continued {seed}"] = fingerprints(model)
    return prints, training, checkpoints, curve_base, null_seeds, work


def _as_expected(p: float, expected: str) -> bool:
    if expected == "unrelated":
        return p >= ALPHA
    if expected == "related":
        return p < ALPHA
    return p < STRONG


def _training_row(name: str, run: Any, data: TokenData) -> dict[str, Any]:
    return {
        "run": name,
        "steps": int(run.losses.step.iloc[-1]),
        "final_train_loss": float(run.losses.loss.iloc[-10:].mean()),
        "eval_loss": run.final_eval_loss,
        "unigram_entropy": data.unigram_entropy(),
    }


def summary(result: PersistenceResult) -> str:
    """Training record, the four tables and the lineage curve, as text."""
    training = result.training.to_string(index=False, float_format=lambda v: f"{v:.3f}")
    curve = result.curve.to_string(index=False, float_format=lambda v: f"{v:.3g}")
    wrong = result.tables[~result.tables.ok]
    verdict = "every verdict as expected" if wrong.empty else f"{len(wrong)} verdict(s) differ from the expected ones: " + "; ".join(
        f"table {r.table} {r.base} vs {r.target} ({r.inputs}): p = {r.p:.2g}, expected {r.expected}" for r in wrong.itertuples()
    )
    return f"training (loss in nats; a model that learned anything beats the unigram entropy):\n{training}\n\n{result.markdown()}\nlineage of the seed-42 run, init vs each checkpoint:\n{curve}\n\n{verdict}"


class PersistenceExperiment(Experiment):
    """``lens-bias persistence``: :func:`run_persistence` from the command line."""

    name = "persistence"
    help = "the SeedPrint persistence experiment: train small models on prose and code, test lineage (tables 1-4)"
    description = (
        "Pretrain init seeds 42, 123, 1000, 2000 on stdlib prose (data seed 42), continue 1000 and 123 on stdlib code, "
        "and test lineage between inits, trained and continued models. Exits 1 when a verdict differs from the expected one."
    )
    preset_help = "sizes (tiny ≈ 2 min, default ≤ 20 min on 2 CPU cores, scale: the 160M toy on a GPU)"
    config_type = PersistenceConfig
    presets = PRESETS

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--inputs", nargs="+", choices=list(KINDS), default=["tokens"], help="fingerprint input kinds")

    def run(self, config: PersistenceConfig, args: Any) -> Outcome:
        result = run_persistence(config, inputs=args.inputs, progress=not args.no_progress)
        if args.out:
            result.save(args.out)
        return Outcome(summary(result), result.all_as_expected)
