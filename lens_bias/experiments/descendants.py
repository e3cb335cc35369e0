"""SeedPrint against real descendants: LeaFBench in miniature, on CPU.

LeaFBench (SeedPrints paper) fingerprints each base model's descendants — fine-tunes, merges, adapters,
quantisations — and unrelated models, and reports the AUC of the lineage score. :func:`real_descendants` makes
them on the spot from any LLaMA-family TransformerLens model with :mod:`lens_bias.models.transforms` and
:func:`lens_bias.training.trainer.fine_tune` — those that keep the basis, those that reparametrise it (a
residual permutation, a rotation with the norm gains folded, and that rotation fine-tuned or 4-bit quantised), those
that rename the vocabulary, and those that do both at once — fingerprints the base and all of them, and tests each
under the published test, ``compare``'s default (``"auto"``: the maps read from the weights) and every activation-
fitted align mode (:mod:`lens_bias.seedprint.align`), with LeaFBench's metrics per mode.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Union

import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias import seedprint
from lens_bias.core import memory
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.corpora import code
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import check_context
from lens_bias.core.provenance import write_results
from lens_bias.core.serialise import Serialisable
from lens_bias.core.tables import markdown_table
from lens_bias.experiments.base import DEFAULT_MODEL, Experiment, Outcome
from lens_bias.experiments.descendant_scores import DescendantsResult, families_record, judge_pairs, lineage_metrics, slug
from lens_bias.models import load_model
from lens_bias.models.parameters import copy_model
from lens_bias.models.reparametrise import permute_residual, rename_vocabulary, rotate_residual
from lens_bias.models.transforms import low_rank_delta, merge, prune, quantize, random_inits, relative_change
from lens_bias.seedprint.comparison import Maps, auto_test, mapped_inputs, through_maps
from lens_bias.seedprint.correspondence import Embedding
from lens_bias.seedprint.lineage import ALPHA
from lens_bias.seedprint.readings import Reading, drawn_tokens
from lens_bias.seedprint.vocabulary import renamed_tokens
from lens_bias.training.data import TokenData
from lens_bias.training.trainer import evaluate, fine_tune

__all__ = ["DescendantsConfig", "PRESETS", "real_descendants"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DescendantsConfig(Serialisable):
    """Sizes of the experiment; ``PRESETS`` holds the tested ones."""

    # Fingerprint inputs. On SmolLM2 the weakest basis-keeping descendant (prune 30%) sits at z ≈ 120 with 128
    # inputs; an alignment is fitted on half of them and tested on the other half, and the orthogonal and linear
    # maps of D = 576 dims need more fit rows than dims. The cost is linear in n · seq_len.
    n: int = 1536
    seq_len: int = 16  # tokens per input (the papers use 1024)
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
    basis_seed: int = 1  # the permutation's and the rotation's seed
    n_random: int = 10  # random inits of the config: the unrelated side of the metrics, and the aligned tests' seeds null
    first_random_seed: int = 1_000_000  # as the seeds null's: clear of the small seeds lens_bias models are built with
    eval_blocks: int = 16  # held-out code blocks for each descendant's loss (a check that it still is a model)
    # The tests run under each: None is the published test (analytic null); "auto" (compare's default) reads the token
    # and basis maps from the weights, then runs the published test; the others align on the activations first and
    # are judged against the random inits aligned the same way (a seeds null; a random init against the others).
    align_modes: tuple = (None, "auto", "permutation", "orthogonal", "linear")


PRESETS = {
    "default": DescendantsConfig(),
    # For tests on tiny random models: minutes become seconds, every code path still runs.
    # n_random stays 10: an aligned test's seeds null of k inits needs z > 32 for p < 1e-10 at k = 10 (Student-t,
    # k − 1 dof), z > 2489 at k = 4.
    "tiny": DescendantsConfig(n=256, seq_len=8, finetune_steps=4, finetune_batch=4, finetune_seq_len=16, eval_blocks=4),
    # Across the real families on 2 CPU cores (docs/experiments/families-descendants.md): 512 inputs of 8 tokens (a
    # Qwen2.5-0.5B fingerprint is ~1 min), so the orthogonal and linear fits see 256 rows, fewer than D (they need
    # more than 2·D inputs to cover a rotation); 5-step fine-tunes; 8 random inits give 8 + 28 unrelated pairs per family.
    "family": DescendantsConfig(n=512, seq_len=8, finetune_steps=5, n_random=8),
}

# Which align modes can see through each kind of descendant (a basis kept is the identity map, which every mode fits).
_KEEPS_BASIS = (None, "auto", "permutation", "orthogonal", "linear")
_PERMUTED = ("auto", "permutation", "orthogonal", "linear")
_ROTATED = ("auto", "orthogonal", "linear")
# A renaming in another basis: only the weights' maps find which token is which (the activation-fitted modes read
# the renamed model on the base's token IDs, which mean other tokens to it).
_DISGUISED = ("auto",)


def real_descendants(
    model: Any,
    config: Union[str, DescendantsConfig] = "default",
    *,
    data: TokenData | None = None,
    progress: bool = True,
    keep: Callable[[str, Reading], None] | None = None,
    **overrides: Any,
) -> DescendantsResult:
    """Fingerprint ``model``, its descendants and random inits of its configuration, and test the base against each
    under every align mode.

    The descendants keep the basis (int8, 4-bit, pruned, LoRA delta, fine-tune, merge) or reparametrise it
    (residual permutation, rotation with the norm gains folded, that rotation fine-tuned, that rotation 4-bit
    round-tripped). A descendant is expected related at p < 1e-10 under every align mode that covers it, and every
    random init unrelated (p ≥ 0.01) under every mode; with ``align=None`` the analytic null judges (token inputs,
    IDs uniform below d_vocab, N ≪ V/4), with an alignment a seeds null of the random inits aligned the same way.

    Args:
        model: the base, a LLaMA-family TransformerLens model with ``model.tokenizer`` (or pass ``data``); not modified.
        config: a preset name ("default", "tiny") or a :class:`DescendantsConfig`.
        data: fine-tuning blocks (default: the code corpus packed with ``model.tokenizer``); the held-out split
            gives every model's code loss.
        progress: a progress bar over the models.
        keep: called with each model's name ("base", a descendant's, "random init S") and its
            :class:`~lens_bias.seedprint.readings.Reading` as it is made (``lens-bias descendants --out`` saves them), so
            that ``compare``'s default can test every pair of the saved models later without them.
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
    makers = _makers(model, cfg, data)
    _check_sizes(model, cfg, data, n_models=1 + len(makers) + cfg.n_random)
    bar = tqdm(total=1 + len(makers) + cfg.n_random, desc="real descendants", disable=not progress)
    base = seedprint.fingerprint(model, _prints(cfg), progress=False)
    bar.update()
    base_loss = evaluate(model, held_out)
    auto = "auto" in cfg.align_modes
    read = Embedding.of(model)
    # with keep: the inputs besides the drawn IDs that every pair of this family's models asks for (compare draws among
    # the tokens both tokenizers name, where they name fewer than the table's rows: Qwen2.5's)
    shared = [] if keep is None else list(mapped_inputs(Maps.read(read, read), _prints(cfg)) or ())[:1]
    if keep is not None:
        keep("base", _reading(model, [(drawn_tokens(base), base)], shared, cfg))
    prints, rows, covers, not_made, autos = _descendants(model, read, base, makers, held_out, bar, started, cfg, keep, shared)
    seeds = range(cfg.first_random_seed, cfg.first_random_seed + cfg.n_random)
    randoms: dict[str, int] = {}
    embeddings: dict[str, Embedding] = {}  # the random inits' tables (float16), for their pairs' maps
    began = time.perf_counter()
    for seed, fresh in zip(seeds, random_inits(model, seeds)):
        name = f"random init {seed}"
        prints[name] = seedprint.fingerprint(fresh, _prints(cfg), progress=False)
        randoms[name] = seed
        reading = None
        if keep is not None:
            keep(name, reading := _reading(fresh, [(drawn_tokens(base), prints[name])], shared, cfg))
        if auto:
            autos[name] = _auto(model, Maps.read(read, fresh), fresh, base, prints[name], cfg)
            if reading is not None:  # its table is already the float16 copy
                embeddings[name] = reading.embedding
            else:
                drawn = Embedding.of(fresh)
                embeddings[name] = Embedding(drawn.table.half(), drawn.words)
        rows.append({"target": name, "kind": "random init", "weight_change": float("nan"), "eval_loss": float("nan"), "seconds": time.perf_counter() - began})
        began = time.perf_counter()
        bar.update()
    bar.close()
    models = pd.DataFrame(rows)
    def auto_pair(one: str, other: str) -> seedprint.SeedPrintResult:
        """The default test of two random inits, through the maps their tables give."""
        maps = Maps.read(embeddings[one], embeddings[other])
        if mapped_inputs(maps, _prints(cfg)) is None:
            return through_maps(maps, prints[one], prints[other], _test(cfg), both_trained=False)
        # a token map between two fresh inits: both drawn again, to be fingerprinted on its inputs
        a, b = (copy_model(next(random_inits(model, [randoms[name]]))) for name in (one, other))
        return auto_test(a, b, _prints(cfg), _test(cfg), maps=maps)

    tests, metrics, pairs = judge_pairs(cfg.align_modes, cfg.ratio_k, base, prints, covers, list(randoms), list(models.target), autos, auto_pair)
    return DescendantsResult(
        table=pd.DataFrame(tests), models=models, metrics=pd.DataFrame(metrics), base_eval_loss=base_loss, fingerprints=prints,
        config=cfg.to_dict(), seconds=time.perf_counter() - started, pairs=pd.DataFrame(pairs), not_made=not_made,
    )


Maker = tuple[str, tuple, Callable[[], tuple[Any, Union[float, None]]]]


def _prints(cfg: DescendantsConfig) -> seedprint.FingerprintSettings:
    return seedprint.FingerprintSettings(n=cfg.n, seq_len=cfg.seq_len, seed=cfg.seed)


def _test(cfg: DescendantsConfig) -> seedprint.LineageSettings:
    """The published test at the experiment's m, which "auto" runs after its maps."""
    return seedprint.LineageSettings(ratio_k=cfg.ratio_k, alpha=ALPHA, align=None)


def _auto(model: Any, maps: Maps, target: Any, base: seedprint.Fingerprint, made: seedprint.Fingerprint, cfg: DescendantsConfig) -> seedprint.SeedPrintResult:
    """``compare``'s default test of the base against ``target`` through ``maps`` (read from the base's embedding,
    read once for every target), reusing both fingerprints where the maps leave the inputs alone (``made`` read
    renamed tokens where ``fingerprint_like`` found a renaming: not reused)."""
    return auto_test(model, target, _prints(cfg), _test(cfg), maps=maps, made=(base, None if made.inputs.renamed else made))


def _reading(target: Any, made: list[tuple[Tensor, seedprint.Fingerprint]], wanted: list[Tensor], cfg: DescendantsConfig) -> Reading:
    """``target``'s reading: its fingerprints ``made`` (with the tokens each read), and its fingerprint on each of
    the ``wanted`` inputs that none of them read (on the drawn IDs themselves, with their record, as ``compare``
    makes it: the published test checks that two fingerprints' records agree)."""
    reading = Reading.of(target, made)
    for tokens in wanted:
        if reading.on(tokens) is None:
            drawn = reading.drawn is not None and torch.equal(tokens, reading.drawn)
            fp = seedprint.fingerprint(target, _prints(cfg), progress=False) if drawn else seedprint.fingerprint(target, _prints(cfg), inputs=tokens, progress=False)
            reading = replace(reading, prints=(*reading.prints, (tokens, fp)))
    return reading


def _descendant_reading(model: Any, target: Any, base: seedprint.Fingerprint, made: seedprint.Fingerprint, maps: Maps, shared: list[Tensor],
                        cfg: DescendantsConfig) -> Reading:
    """A descendant's reading: its fingerprint ``made`` with the tokens it read (the base's renamed, where
    ``fingerprint_like`` found a renaming); its fingerprints on the drawn IDs themselves (which its pairs with models
    that do not share its renaming, random inits, read), on the ``shared`` inputs every pair of the family may ask
    for, and on those the base's ``maps`` ask for (a renaming in another basis, which ``fingerprint_like`` does not
    see: its pairs with the base's other descendants read them)."""
    drawn = drawn_tokens(base)
    renamed = renamed_tokens(model, target, drawn) if made.inputs.renamed else None  # what fingerprint_like read, found again
    inputs = mapped_inputs(maps, _prints(cfg))
    return _reading(target, [(drawn if renamed is None else renamed, made)], [drawn, *shared, *([] if inputs is None else [inputs[1]])], cfg)


def _makers(model: Any, cfg: DescendantsConfig, data: TokenData) -> list[Maker]:
    """Each descendant's name, the align modes that cover it, and how it is made (with its code loss where a
    fine-tune measured it); later ones may be made from earlier ones."""
    made: dict[str, Any] = {}

    def tune(m: Any) -> tuple[Any, float]:
        tuned, run = fine_tune(m, cfg.finetune_steps, data=data, lr=cfg.finetune_lr, batch_size=cfg.finetune_batch, eval_blocks=cfg.eval_blocks, progress=False)
        return tuned, run.final_eval_loss

    def keep(key: str, made_as: tuple[Any, float | None]) -> tuple[Any, float | None]:
        made[key], made[f"{key}_loss"] = made_as
        return made_as

    rotated = f"rotated (seed {cfg.basis_seed})"
    return [
        ("int8", _KEEPS_BASIS, lambda: (quantize(model, 8, cfg.group_size), None)),
        ("4-bit", _KEEPS_BASIS, lambda: (quantize(model, 4, cfg.group_size), None)),
        (f"prune {cfg.prune_fraction:.0%}", _KEEPS_BASIS, lambda: (prune(model, cfg.prune_fraction), None)),
        (f"low-rank delta r{cfg.lora_rank}", _KEEPS_BASIS, lambda: (low_rank_delta(model, cfg.lora_rank, cfg.lora_scale, cfg.lora_seed), None)),
        (f"fine-tune {cfg.finetune_steps} steps", _KEEPS_BASIS, lambda: keep("tuned", tune(model))),
        (f"merge(base, fine-tune) w {cfg.merge_weight:g}", _KEEPS_BASIS, lambda: (merge(model, made["tuned"], cfg.merge_weight), None)),
        (f"permuted (seed {cfg.basis_seed})", _PERMUTED, lambda: (permute_residual(model, cfg.basis_seed), None)),
        (rotated, _ROTATED, lambda: keep("rotated", (rotate_residual(model, cfg.basis_seed), None))),
        (f"{rotated}, fine-tuned {cfg.finetune_steps} steps", _ROTATED, lambda: tune(made["rotated"])),
        (f"{rotated}, 4-bit", _ROTATED, lambda: (quantize(made["rotated"], 4, cfg.group_size), None)),
        # a renamed vocabulary keeps the basis; compare reads it through its renamed tokens (fingerprint_like)
        (f"renamed vocabulary (seed {cfg.basis_seed})", _KEEPS_BASIS, lambda: (rename_vocabulary(model, cfg.basis_seed), None)),
        (f"renamed, fine-tuned {cfg.finetune_steps} steps", _KEEPS_BASIS, lambda: (rename_vocabulary(made["tuned"], cfg.basis_seed), made["tuned_loss"])),
        ("renamed, 4-bit", _KEEPS_BASIS, lambda: (quantize(rename_vocabulary(model, cfg.basis_seed), 4, cfg.group_size), None)),
        # both edits at once, as an adversary would hide a descendant
        (f"permuted + renamed (seed {cfg.basis_seed})", _DISGUISED, lambda: (rename_vocabulary(permute_residual(model, cfg.basis_seed), cfg.basis_seed), None)),
        (f"{rotated} + renamed", _DISGUISED, lambda: (rename_vocabulary(made["rotated"], cfg.basis_seed), None)),
    ]


def _descendants(
    model: Any, read: Embedding, base: seedprint.Fingerprint, makers: list[Maker], held_out: Tensor, bar: Any, started: float,
    cfg: DescendantsConfig, keep: Callable[[str, Reading], None] | None, shared: list[Tensor],
) -> tuple[dict[str, seedprint.Fingerprint], list[dict[str, Any]], dict[str, tuple], dict[str, str], dict[str, seedprint.SeedPrintResult]]:
    """Make and fingerprint each descendant: the fingerprints (the base's among them), a row per descendant, the
    modes that cover each, why those not made were not, and, with "auto" among the modes, its test of each (made
    while the descendant is at hand: its maps read its weights against the base's, ``read``); each reading to ``keep``."""
    prints, rows, covers, not_made, autos = {"base": base}, [], {}, {}, {}
    for name, covered, make in makers:
        began = time.perf_counter()
        try:
            target, loss = make()
        except (LensBiasError, KeyError) as err:  # e.g. a rotation cannot be folded into Gemma's post-norms; KeyError: its parent was not made
            reason = str(err) if isinstance(err, LensBiasError) else f"needs the {err.args[0]} descendant, which was not made"
            logger.info("%s not made: %s", name, reason)
            not_made[name] = reason
            bar.update()
            continue
        prints[name] = seedprint.fingerprint_like(target, model, base)  # a renamed vocabulary reads the base's tokens renamed
        covers[name] = covered
        maps = Maps.read(read, target) if keep is not None or "auto" in cfg.align_modes else None
        if keep is not None and maps is not None:
            keep(name, _descendant_reading(model, target, base, prints[name], maps, shared, cfg))
        if maps is not None and "auto" in cfg.align_modes:
            autos[name] = _auto(model, maps, target, base, prints[name], cfg)
        # a weight change is only defined in the base's basis (and vocabulary order)
        change = relative_change(model, target) if covered == _KEEPS_BASIS and not prints[name].inputs.renamed else float("nan")
        renaming = getattr(target, "lens_bias_vocabulary", None)  # a renamed model reads the held-out text renamed
        rows.append({"target": name, "kind": "descendant", "weight_change": change,
                     "eval_loss": evaluate(target, held_out if renaming is None else renaming[held_out]) if loss is None else loss,
                     "seconds": time.perf_counter() - began})
        logger.info("%s fingerprinted (%.0f s so far)", name, time.perf_counter() - started)
        bar.update()
    return prints, rows, covers, not_made, autos


def _check_sizes(model: Any, cfg: DescendantsConfig, data: TokenData, n_models: int) -> None:
    """Refuse, before the first descendant, sizes that a later one would refuse only after minutes."""
    adapter = ModelAdapter.of(model)
    info = adapter.info
    check_context(cfg.seq_len, info.n_ctx)
    if cfg.lora_rank > info.d_model:
        raise LensBiasError(f"lora_rank {cfg.lora_rank} exceeds d_model {info.d_model}, the smallest side of the adapted matrices; pass lora_rank <= {info.d_model}")
    if cfg.eval_blocks > len(data.eval):
        raise LensBiasError(f"eval_blocks {cfg.eval_blocks} exceeds the {len(data.eval)} held-out blocks of {cfg.finetune_seq_len + 1} tokens; pass eval_blocks <= {len(data.eval)}")
    # the fine-tunes' training step, and every model's [n, d_model] fingerprint kept until the tests
    memory.check_train(info, batch_size=cfg.finetune_batch, seq_len=cfg.finetune_seq_len, n_params=sum(p.numel() for p in model.parameters()),
                       device=adapter.device, act_dtype=adapter.dtype)
    memory.check_held("the fingerprints of the base, its descendants and the random inits", n_models, cfg.n * info.d_model * 4,
                      f"n_random + {n_models - cfg.n_random}", "n")


class DescendantsExperiment(Experiment):
    """``lens-bias descendants``: :func:`real_descendants` from the command line, on one base or several families."""

    name = "descendants"
    help = "SeedPrint against descendants of a pretrained model (quantised, pruned, adapted, fine-tuned, merged, permuted, rotated, renamed) and random inits"
    description = ("LeaFBench in miniature, under every align mode: every descendant must be related at p < 1e-10 under each mode that covers "
                   "it, and every random init unrelated under every mode. With several --model, one family each, and the metrics pooled. "
                   "Exits 1 otherwise.")
    preset_help = "sizes (tiny: seconds on a tiny model; default: SmolLM2 in about 25 minutes on 2 CPU cores; family: each of three real families)"
    config_type = DescendantsConfig
    presets = PRESETS
    model_help = "the base model, with a tokenizer"

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--model", nargs="+", default=[DEFAULT_MODEL], metavar="MODEL",
                            help=f"{self.model_help}; several: one family each, run one after the other (any MODEL strings)")

    def run(self, config: DescendantsConfig, args: Any) -> Outcome:
        results: dict[str, DescendantsResult] = {}
        for text in args.model:
            family = Path(text).name.removesuffix(".gguf")
            folder = (Path(args.out) if len(args.model) == 1 else Path(args.out) / slug(family)) if args.out else None

            def keep(target: str, reading: Reading, folder: Path | None = folder, family: str = family) -> None:
                assert folder is not None  # passed only with --out: beside the fingerprints, under the same names
                (folder / "readings").mkdir(parents=True, exist_ok=True)
                reading.save(folder / "readings" / f"{slug(family)}--{slug(target)}.pt")

            results[family] = result = real_descendants(load_model(text), config, progress=not args.no_progress, keep=keep if folder is not None else None)
            if folder is not None:
                result.table.to_csv(folder / "descendants.csv", index=False)
                result.pairs.to_csv(folder / "pairs.csv", index=False)
                (folder / "descendants.md").write_text(result.markdown())
                result.save_fingerprints(folder / "fingerprints", family)  # with its own labels.csv
        if args.out:
            write_results(Path(args.out) / "descendants.json", families_record(results))
        text = "\n\n".join(f"## {family}\n\n{r.markdown()}" for family, r in results.items()) if len(results) > 1 else next(iter(results.values())).markdown()
        if len(results) > 1:
            text += "\n\n## pooled\n\n" + markdown_table(lineage_metrics(pd.concat([r.pairs.assign(family=f) for f, r in results.items()])))
        return Outcome(text, all(r.all_as_expected for r in results.values()))
