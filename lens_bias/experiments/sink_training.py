"""The attention-sink experiments in miniature: from the positional variance of a random model to a trained sink,
moving it, and controlling it with head-wise RMSNorm.

1. At init: r_t = std_t / std_0 of attention outputs across random sequences follows (t+1)^-1/2 (softmax and
   uniform attention, two seeds); ``MaskToSelf(k)`` gives r_k ≈ 1; ``HeadwiseRMSNorm`` makes r_t flat.
2. Train a small LLaMA-style model on stdlib prose with a fixed first token: the first-token sink metric per
   layer, init vs trained.
3. On the trained model at inference: ``MaskToSelf(k)`` and ``AmplifyVariance(k, λ)`` against the control
   ``ScaleNorm(k, λ)`` — the importance α_k of position k (mean ± standard error over sequences, and the paired
   difference from the baseline in standard errors) and Sink_k; the super neurons behind the first-token sink.
4. Train the same model (same init seed, same batches) with ``HeadwiseRMSNorm``: its sink metric, positional
   discrepancy and eval-loss curve against the baseline.

Positions are 0-based: the first token is position 0.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import pandas as pd
import torch
from torch import Tensor

from lens_bias.analyses.base import measure
from lens_bias.analyses.sinks import Sinks, SinksResult
from lens_bias.analyses.super_neurons import SuperNeurons
from lens_bias.core.corpora import code, prose
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import check_later_position, with_bos
from lens_bias.core.provenance import numbers_of, results_record, table_of, write_results
from lens_bias.core.serialise import Serialisable
from lens_bias.core.tables import markdown_table
from lens_bias.experiments.base import Experiment, Outcome
from lens_bias.experiments.sink_measures import init_variance_table, intervention_table, parity_row, sinks_by_layer
from lens_bias.hooks.base import Intervention
from lens_bias.hooks.headwise_rmsnorm import HeadwiseRMSNorm
from lens_bias.models import ModelSpec, random_init
from lens_bias.models.checkpoints import load_checkpoint, save_checkpoint
from lens_bias.training.data import TokenData
from lens_bias.training.trainer import TrainingRun, train

__all__ = ["SinkConfig", "SinkExperimentResult", "PRESETS", "run_sink_experiment", "sink_model", "SINK_MODEL_PATH", "checks", "summary", "corpus_data", "eval_tokens",
           "sinks_record"]

logger = logging.getLogger(__name__)

# The shipped sink model (trained by ``lens-bias sinks --preset sink-model``), loaded by examples and tests.
SINK_MODEL_PATH = Path(__file__).parent.parent / "assets" / "sink_model.pt"
BOS = 0  # the tokenizer's <|endoftext|>: every training and evaluation sequence starts with it


@dataclass(frozen=True)
class SinkConfig(Serialisable):
    """Sizes and settings of the experiment; ``PRESETS`` holds the tested ones."""

    # The trained model. Its d_vocab is the BPE vocabulary of the prose tokenizer; its n_ctx holds seq_len; its seed is the init's.
    model: ModelSpec = ModelSpec("llama", d_model=128, n_layers=4, n_heads=4, d_vocab=4096, n_ctx=64)
    # Training text: "prose" (stdlib docs, ~0.5M tokens at V 4096) or "code" (stdlib source, ~3M tokens, same tokenizer).
    # Code gave stronger first-token sinks than prose at the same steps in the recipe search (README).
    corpus: str = "code"
    seq_len: int = 64  # Gu et al. measure at T = 64; Sink_k falls with T, so train and measure at one T
    batch_size: int = 32
    steps: int = 1000
    lr: float = 3e-3
    # Gu et al.: weight decay 0.5 strengthens sinks (18% -> 41% at 60M).
    weight_decay: float = 0.5
    data_seed: int = 42
    position: int = 10  # the paper moves the sink to token 10
    factor: float = 8.0  # λ of AmplifyVariance / ScaleNorm
    eps: float = 0.3  # Gu et al.'s threshold; rates at 0.1 are reported too
    n_eval: int = 100  # held-out sequences for the sink metrics (Gu et al. use 100)
    # Experiment 1 (init): a separate, wider-sampled measurement on its own model (two init seeds are drawn from 0).
    init_model: ModelSpec = ModelSpec("llama", d_model=128, n_layers=2, n_heads=4, d_vocab=8000, n_ctx=64)
    init_sequences: int = 512
    train_rmsnorm: bool = True  # experiment 4 (doubles the training time)


    @property
    def vocab(self) -> int:
        """The tokenizer's vocabulary: the trained model's d_vocab."""
        return self.model.d_vocab

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SinkConfig":
        """The config ``to_dict`` wrote; one of a checkpoint written before configs held a ModelSpec (flat
        ``arch``, ``d_model``, ... fields, as the shipped sink model's) is read into one."""
        if "model" in d:
            return super().from_dict(d)
        flat = dict(d)
        shape = {name: flat.pop(name) for name in ("d_model", "n_layers", "n_heads") if name in flat}
        model = ModelSpec(flat.pop("arch", "llama"), **shape, d_vocab=flat.pop("vocab", 4096), n_ctx=flat.get("seq_len", 64), seed=flat.pop("init_seed", 0))
        width = flat.pop("init_d_model", 128)
        init = ModelSpec(model.arch, d_model=width, n_layers=flat.pop("init_n_layers", 2), n_heads=max(1, width // 32), d_vocab=8000, n_ctx=model.n_ctx)
        return super().from_dict({**flat, "model": model.to_dict(), "init_model": init.to_dict()})


PRESETS: dict[str, SinkConfig] = {
    "tiny": SinkConfig(model=ModelSpec("llama", d_model=64, n_layers=2, n_heads=1, d_vocab=1024, n_ctx=32), corpus="prose", seq_len=32, batch_size=16, steps=150, lr=3e-3,
                       position=5, n_eval=64, init_model=ModelSpec("llama", d_model=64, n_layers=2, n_heads=2, d_vocab=8000, n_ctx=32), init_sequences=256),
    "default": SinkConfig(),
    "sink-model": SinkConfig(steps=3000, train_rmsnorm=False),
    # For a GPU (``--device cuda``, bf16 autocast): width, depth and tokens closer to Gu et al.'s 60M model.
    "gpu": SinkConfig(model=ModelSpec("llama", d_model=512, n_layers=8, n_heads=8, d_vocab=4096, n_ctx=64), batch_size=128, steps=8000, lr=1e-3, n_eval=100),
}


@dataclass
class SinkExperimentResult:
    """The four experiments' tables; ``save(dir)`` writes each as CSV plus a markdown summary."""

    config: SinkConfig
    init_variance: pd.DataFrame  # experiment 1
    sinks_by_layer: pd.DataFrame  # experiment 2
    interventions: pd.DataFrame  # experiment 3
    super_neurons: pd.DataFrame  # experiment 3: units behind the first-token sink
    rmsnorm: pd.DataFrame  # experiment 4: one row per model
    loss_curves: pd.DataFrame  # experiment 4: step, model, eval_loss
    training: pd.DataFrame  # one row per training run
    extras: dict[str, Any] = field(default_factory=dict)

    def tables(self) -> dict[str, pd.DataFrame]:
        return {
            "init_variance": self.init_variance, "sinks_by_layer": self.sinks_by_layer, "interventions": self.interventions,
            "super_neurons": self.super_neurons, "rmsnorm": self.rmsnorm, "loss_curves": self.loss_curves, "training": self.training,
        }

    def save(self, out: Union[str, Path]) -> None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        for name, table in self.tables().items():
            table.to_csv(out / f"{name}.csv", index=False)
        (out / "summary.md").write_text(self.markdown())
        (out / "config.json").write_text(json.dumps(self.config.to_dict(), indent=2))

    def markdown(self) -> str:
        parts = []
        for title, table in [
            ("1. positional variance at init (layer 0 unless noted)", self.init_variance),
            ("2. first-token sink per layer, init vs trained", self.sinks_by_layer),
            (f"3. moving the sink to position {self.config.position} on the trained model", self.interventions),
            ("3b. super neurons of the trained model (first token)", self.super_neurons),
            ("4. head-wise RMSNorm in training", self.rmsnorm),
            ("training runs", self.training),
        ]:
            if len(table):
                parts.append(f"### {title}\n\n{markdown_table(table)}")
        return "\n\n".join(parts) + "\n"


def corpus_data(cfg: SinkConfig, *, progress: bool = False) -> TokenData:
    """The packed training text of ``cfg`` (the prose tokenizer in both cases, cached after the first call)."""
    if cfg.corpus not in ("prose", "code"):
        raise LensBiasError(f"corpus must be 'prose' or 'code', got {cfg.corpus!r}")
    on_prose = TokenData.build(prose(), vocab_size=cfg.vocab, seq_len=cfg.seq_len, progress=progress)
    return on_prose if cfg.corpus == "prose" else TokenData.build(code(), seq_len=cfg.seq_len, tokenizer_from=on_prose, progress=progress)


def eval_tokens(data: TokenData, n: int) -> Tensor:
    """The first ``n`` held-out sequences, starting with the BOS token like the training sequences."""
    if len(data.eval) < n:
        raise LensBiasError(f"only {len(data.eval)} held-out blocks; lower n_eval")
    return with_bos(data.eval[:n, :-1], BOS)


def _training_row(name: str, run: TrainingRun, data: TokenData, seconds: float) -> dict[str, Any]:
    return {"run": name, "steps": int(run.losses.step.iloc[-1]), "final_train_loss": float(run.losses.loss.iloc[-10:].mean()),
            "eval_loss": run.final_eval_loss, "unigram_entropy": data.unigram_entropy(), "seconds": round(seconds, 1)}


def train_sink_model(
    cfg: SinkConfig, data: TokenData, interventions: Sequence[Intervention] = (), progress: bool = True, device: Union[str, torch.device, None] = None,
    model: Any = None,
) -> tuple[Any, TrainingRun, float]:
    """Train ``cfg``'s model on ``data`` with a fixed first token; returns (model, run, seconds).

    ``model``: the init to train (default: ``random_init(cfg.model)``), e.g. the one the interventions'
    parameters were bound to. On CUDA the forward runs under bf16 autocast (weights and optimizer state stay float32).
    """
    model = random_init(cfg.model, device=device) if model is None else model
    dtype = torch.bfloat16 if torch.device(device or "cpu").type == "cuda" else None
    start = time.perf_counter()
    run = train(model, data, steps=cfg.steps, batch_size=cfg.batch_size, lr=cfg.lr, weight_decay=cfg.weight_decay, data_seed=cfg.data_seed,
                eval_every=max(1, cfg.steps // 10), bos=BOS, interventions=interventions, dtype=dtype, progress=progress)
    return model, run, time.perf_counter() - start


def sink_model(path: Union[str, Path, None] = None, device: Union[str, torch.device, None] = None) -> tuple[Any, SinkConfig]:
    """The shipped trained sink model (or one saved by :func:`run_sink_experiment`) and its config.

    >>> model, cfg = sink_model()
    >>> cfg.model.d_model, cfg.model.n_layers, cfg.position
    (128, 4, 10)
    """
    path = Path(path) if path is not None else SINK_MODEL_PATH
    if not path.exists():
        raise LensBiasError(f"no sink model at {path}: train one with `lens-bias sinks --preset sink-model --out DIR`")
    saved = torch.load(path, map_location="cpu", weights_only=True)
    return load_checkpoint(path, device=device), SinkConfig.from_dict(json.loads(saved["sink_config"]))


def run_sink_experiment(
    config: Union[str, SinkConfig] = "default",
    *,
    trained: Union[str, Path, None] = None,
    out: Union[str, Path, None] = None,
    device: Union[str, torch.device, None] = None,
    progress: bool = True,
) -> SinkExperimentResult:
    """Run experiments 1-4.

    Args:
        config: a preset name ("tiny", "default", "sink-model") or a :class:`SinkConfig`.
        trained: a sink-model checkpoint to use for experiments 2-3 instead of training one (its own config
            replaces ``config``'s model and data settings).
        out: a folder for the tables, the summary and the trained checkpoints.
        device: where the models train and run (e.g. "cuda": bf16 autocast in training).
        progress: progress bars.

    Returns:
        A :class:`SinkExperimentResult`.
    """
    if isinstance(config, str) and config not in PRESETS:
        raise LensBiasError(f"unknown preset {config!r}; choose from {list(PRESETS)}")
    cfg = PRESETS[config] if isinstance(config, str) else config
    check_later_position(cfg.position, cfg.seq_len)  # the later token the interventions move the sink to
    for name, spec in (("model", cfg.model), ("init_model", cfg.init_model)):
        if cfg.seq_len > spec.n_ctx:
            raise LensBiasError(f"seq_len {cfg.seq_len} exceeds {name}.n_ctx {spec.n_ctx}; set {name}.n_ctx={cfg.seq_len} too")
    init_table = init_variance_table(cfg.init_model, cfg.position, cfg.init_sequences, cfg.seq_len, progress=progress)
    training_rows = []
    if trained is not None:
        model, trained_cfg = sink_model(trained, device=device)
        cfg = replace(trained_cfg, train_rmsnorm=cfg.train_rmsnorm, position=cfg.position, factor=cfg.factor, eps=cfg.eps, n_eval=cfg.n_eval)
        data = corpus_data(cfg, progress=progress)
        baseline_run = None
    else:
        data = corpus_data(cfg, progress=progress)
        model, baseline_run, seconds = train_sink_model(cfg, data, progress=progress, device=device)
        training_rows.append(_training_row("baseline", baseline_run, data, seconds))
    tokens = eval_tokens(data, cfg.n_eval)
    init_model = random_init(cfg.model, device=device)
    # α of every sequence: the paired share difference, the paired intervention table, rates at ε 0.1
    init_sinks = measure(init_model, tokens, [Sinks(eps=cfg.eps, per_sequence=True)]).of(Sinks)
    trained_results = measure(model, tokens, [Sinks(eps=cfg.eps, per_sequence=True), SuperNeurons(position=0)])
    trained_sinks, neurons = trained_results.of(Sinks), trained_results.of(SuperNeurons)
    by_layer = sinks_by_layer(init_sinks, trained_sinks, cfg.eps)
    # α_0 per sequence (mean over layers and heads), paired over the same held-out sequences
    share_diff = trained_sinks.per_sequence()[..., 0].mean(dim=(1, 2)) - init_sinks.per_sequence()[..., 0].mean(dim=(1, 2))
    moved = intervention_table(model, tokens, cfg.position, cfg.factor, cfg.eps, baseline=trained_sinks)
    rms_rows, curves = _rmsnorm_parity(cfg, data, tokens, model, baseline_run, trained_sinks, training_rows, out, device, progress) if cfg.train_rmsnorm else ([], [])
    result = SinkExperimentResult(
        config=cfg, init_variance=init_table, sinks_by_layer=by_layer, interventions=moved, super_neurons=neurons.units(top=3),
        rmsnorm=pd.DataFrame(rms_rows), loss_curves=pd.DataFrame(curves), training=pd.DataFrame(training_rows),
        extras={
            "trained_super_neurons": neurons.headline(), "trained_sinks": trained_sinks.headline(),
            "share0_diff": share_diff.mean().item(), "share0_diff_in_se": (share_diff.mean() / (share_diff.std() / len(share_diff) ** 0.5)).item(),
        },
    )
    if out is not None:
        result.save(out)
        if trained is None:
            save_checkpoint(model, Path(out) / "sink_model.pt", sink_config=json.dumps(cfg.to_dict()))
    return result


def _rmsnorm_parity(
    cfg: SinkConfig, data: TokenData, tokens: Tensor, model: Any, baseline_run: TrainingRun | None, trained_sinks: SinksResult,
    training_rows: list[dict[str, Any]], out: Union[str, Path, None], device: Union[str, torch.device, None], progress: bool,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Experiment 4: train a model with head-wise RMSNorm beside the baseline (trained here when ``baseline_run`` is
    None); each one's row (:func:`parity_row`) and loss curve. Adds the runs to ``training_rows``."""
    rms_rows: list[dict[str, Any]] = []
    curves: list[dict[str, Any]] = []
    if baseline_run is None:  # the shipped checkpoint has no curve to compare with: train the baseline here
        base_model, baseline_run, seconds = train_sink_model(cfg, data, progress=progress, device=device)
        training_rows.append(_training_row("baseline", baseline_run, data, seconds))
    else:
        base_model = model
    rms_model = random_init(cfg.model, device=device)
    norm = HeadwiseRMSNorm(gain=True).bind(rms_model)
    rms_model, rms_run, seconds = train_sink_model(cfg, data, interventions=[norm], progress=progress, device=device, model=rms_model)
    training_rows.append(_training_row("HeadwiseRMSNorm", rms_run, data, seconds))
    for name, m, ivs, run in (("baseline", base_model, [], baseline_run), ("HeadwiseRMSNorm", rms_model, [norm], rms_run)):
        sinks = trained_sinks if m is model else measure(m, tokens, [Sinks(eps=cfg.eps, per_sequence=True)], interventions=ivs).of(Sinks)
        rms_rows.append({"model": name, "eval_loss": run.final_eval_loss, **parity_row(m, sinks, ivs, n_sequences=cfg.init_sequences, seq_len=cfg.seq_len, vocab=cfg.vocab, eps=cfg.eps)})
        curves += [{"model": name, "step": int(r.step), "eval_loss": float(r.eval_loss)} for r in run.evals.itertuples()]
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        save_checkpoint(rms_model, Path(out) / "rmsnorm_model.pt", sink_config=json.dumps(cfg.to_dict()), interventions=json.dumps([norm.to_dict()]))
    return rms_rows, curves


def checks(result: SinkExperimentResult) -> dict[str, bool]:
    """The experiments' claims, each as measured here (relative effects with uncertainty, never absolute rates)."""
    init, moved, k = result.init_variance.set_index("condition"), result.interventions.set_index("condition"), result.config.position
    law = init[init.index.str.startswith(("softmax, seed", "uniform, seed"))]
    out = {
        "init: r_t = (t+1)^-1/2 within 5% at layer 0 (softmax and uniform, both seeds)": bool((law.max_dev_sqrt_law < 0.05).all()),
        f"init: MaskToSelf({k}) keeps r_{k} within 5% of 1": bool(abs(init.filter(like="MaskToSelf", axis=0)[f"r_{k}"].iloc[0] - 1) < 0.05),
        "init: HeadwiseRMSNorm makes r_t flat (|α| < 0.05)": bool(abs(init.filter(like="HeadwiseRMSNorm", axis=0).alpha_layer0.iloc[0]) < 0.05),
        "trained: first-token attention share above init (> 3 SE)": result.extras["share0_diff_in_se"] > 3,
    }
    for name in moved.index[1:]:
        effect = moved.loc[name, "diff_in_se"]
        if name.startswith("ScaleNorm"):
            out[f"trained: {name} does not raise α_{k} by > 3 SE (the control)"] = bool(effect <= 3)
        else:
            out[f"trained: {name} raises α_{k} by > 3 SE"] = bool(effect > 3)
    if len(result.rmsnorm):
        rms = result.rmsnorm.set_index("model")
        out["HeadwiseRMSNorm training: lower first-token share than baseline"] = bool(rms.loc["HeadwiseRMSNorm", "share0"] < rms.loc["baseline", "share0"])
        out["HeadwiseRMSNorm training: flatter positional profile (smaller |α|) than baseline"] = bool(abs(rms.loc["HeadwiseRMSNorm", "alpha_out_mean"]) < abs(rms.loc["baseline", "alpha_out_mean"]))
        out["HeadwiseRMSNorm training: lower eval loss than baseline"] = bool(rms.loc["HeadwiseRMSNorm", "eval_loss"] < rms.loc["baseline", "eval_loss"])
    return out


def summary(result: SinkExperimentResult) -> str:
    """All tables as markdown, plus the headline of the trained model."""
    sinks = result.extras.get("trained_sinks", {})
    units = result.extras.get("trained_super_neurons", {})
    head = (f"trained model: Sink_0 = {sinks.get('sink_rate_0', float('nan')):.1f}% at ε {result.config.eps}, first-token share "
            f"{sinks.get('first_token_share', float('nan')):.3f} (uniform attention: {sinks.get('uniform_share', float('nan')):.3f}); "
            f"most first-token-selective MLP unit: layer {units.get('top_unit_layer')}, unit {units.get('top_unit')} "
            f"({units.get('top_unit_ratio', float('nan')):.1f}×)")
    claims = "\n".join(f"  [{'x' if ok else ' '}] {claim}" for claim, ok in checks(result).items())
    return f"{head}\n\nclaims, as measured here:\n{claims}\n\n{result.markdown()}"


# the sources a run's numbers depend on (a page says when one changed since the run)
DEPENDS = ("lens_bias/experiments/sink_training.py", "lens_bias/experiments/sink_measures.py", "analyses", "hooks", "lens_bias/training", "lens_bias/models")
# each table's key column: its numbers are TABLE.KEY.COLUMN (lens_bias.core.provenance.numbers_of)
_KEYS = {"init_variance": "condition", "sinks_by_layer": "layer", "interventions": "condition", "super_neurons": "rank", "rmsnorm": "model", "training": "run"}


def sinks_record(result: SinkExperimentResult, command: str | None = None) -> dict[str, Any]:
    """The experiments' results file (``sinks.json``; ``docs/render.py`` writes ``docs/experiments/sinks.md`` from
    it): every table, each cell also a number ``TABLE.KEY.COLUMN``; the trained model's headline; each model's eval
    loss at its first and last evaluation (``curve.MODEL.first`` / ``.last``, with ``.first_step``); the config.

    Args:
        result: a :func:`run_sink_experiment` result.
        command: the command line recorded (default: this process's).

    Returns:
        A results record (:func:`~lens_bias.core.provenance.results_record`).
    """
    tables = {name: table for name, table in result.tables().items() if name in _KEYS and len(table)}
    numbers: dict[str, Any] = {"config": result.config.to_dict(), "n_eval": result.config.n_eval, "share0_diff": result.extras["share0_diff"], "share0_diff_in_se": result.extras["share0_diff_in_se"]}
    numbers.update({f"trained_sinks.{k}": v for k, v in result.extras["trained_sinks"].items()})
    numbers.update({f"trained_super_neurons.{k}": v for k, v in result.extras["trained_super_neurons"].items()})
    for name, table in tables.items():
        numbers.update(numbers_of(table, [_KEYS[name]], name))
    if len(result.loss_curves):
        ends = [{"model": model, "first_step": int(curve.step.iloc[0]), "first": float(curve.eval_loss.iloc[0]), "last": float(curve.eval_loss.iloc[-1])}
                for model, curve in result.loss_curves.groupby("model", sort=False)]
        numbers.update(numbers_of(pd.DataFrame(ends), ["model"], "curve"))
    return results_record(numbers, {name: table_of(table) for name, table in tables.items()}, DEPENDS, command)


class SinkExperiment(Experiment):
    """``lens-bias sinks``: :func:`run_sink_experiment` from the command line."""

    name = "sinks"
    help = "the attention-sink experiments: positional variance at init, a trained sink, moving it, head-wise RMSNorm"
    description = (
        "Measure r_t at init, train a small LLaMA-style model on stdlib prose with a fixed first token, move its sink "
        "with MaskToSelf / AmplifyVariance (ScaleNorm as the control), and train it again with head-wise RMSNorm. "
        "Prints every table and which claims held."
    )
    preset_help = ("sizes (tiny ≈ 30 s, default ≤ 20 min on 2 CPU cores, sink-model: the shipped model's recipe, gpu: a larger "
                   "model for --device cuda)")
    config_type = SinkConfig
    presets = PRESETS

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--tiny", action="store_true", help="shorthand for --preset tiny")
        parser.add_argument("--trained", default=None, help="a sink-model checkpoint ('shipped' for the one in the package) instead of training one")
        parser.add_argument("--device", default=None, help="where to train and run, e.g. cuda (bf16 autocast in training)")
        parser.add_argument("--no-rmsnorm", action="store_true", help="skip experiment 4 (training the baseline and the head-wise RMSNorm model)")

    def run(self, config: SinkConfig, args: Any) -> Outcome:
        if args.tiny:
            config = self.config("tiny", args.set)
        if args.no_rmsnorm:
            config = replace(config, train_rmsnorm=False)
        trained = SINK_MODEL_PATH if args.trained == "shipped" else args.trained
        result = run_sink_experiment(config, trained=trained, out=args.out, device=args.device, progress=not args.no_progress)
        if args.out:
            write_results(Path(args.out) / "sinks.json", sinks_record(result))
        return Outcome(summary(result))
