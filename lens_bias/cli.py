"""The ``lens-bias`` command line: ``lens-bias analyze [options]`` prints the report of a random-init model."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Sequence

import torch

from .errors import LensBiasError
from .models import ACTIVATIONS, ARCHS, POSITIONAL_EMBEDDINGS, random_init
from .report import SECTIONS, analyze

__all__ = ["main", "build_parser"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_ALL_ACTS = sorted({a for acts in ACTIVATIONS.values() for a in acts})
_ALL_POS = sorted({p for ps in POSITIONAL_EMBEDDINGS.values() for p in ps})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lens-bias", description="What randomly initialised transformers are born with (TransformerLens)."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    a = sub.add_parser(
        "analyze",
        help="report token preference and contraction of a random-init model, offline",
        description="Build a random-init model offline and print its lens_bias report. The defaults give a "
        "ReLU GPT-style model with rotary positions, where both MLP and attention forces are visible.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    m = a.add_argument_group("model")
    m.add_argument("--arch", choices=ARCHS, default="gpt2", help="architecture family")
    m.add_argument("--act", choices=_ALL_ACTS, default=None, help="MLP activation (default: relu for gpt2, silu otherwise)")
    m.add_argument("--pos", choices=_ALL_POS, default="rotary", help="positional embedding")
    m.add_argument("--d-model", type=int, default=256, help="width")
    m.add_argument("--n-layers", type=int, default=4, help="depth")
    m.add_argument("--n-heads", type=int, default=8, help="attention heads")
    m.add_argument("--d-vocab", type=int, default=8000, help="vocabulary size")
    m.add_argument("--n-ctx", type=int, default=None, help="context length (default: max(256, --seq-len))")
    m.add_argument("--attn-only", action="store_true", help="attention-only blocks (gpt2)")
    m.add_argument("--seed", type=int, default=0, help="init seed of the model")
    m.add_argument("--backend", choices=["auto", "bridge", "hooked"], default="auto", help="TL model class")
    m.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    m.add_argument("--dtype", choices=sorted(_DTYPES), default="float32", help="model dtype")
    r = a.add_argument_group("inputs and output")
    r.add_argument("--inputs", choices=["tokens", "embeddings"], default="tokens", help="random token IDs or Gaussian embeddings")
    r.add_argument("--n-sequences", type=int, default=256, help="random sequences")
    r.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    r.add_argument("--input-seed", type=int, default=42, help="seed of the random inputs")
    r.add_argument("--batch-size", type=int, default=None, help="sequences per forward pass (default: automatic)")
    r.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=None, help="sections to compute (default: all)")
    r.add_argument("--ablations", action="store_true", help="add the ablation table (one more pass per condition)")
    r.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    r.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _analyze(args: argparse.Namespace) -> str:
    act = args.act or ("relu" if args.arch == "gpt2" else "silu")
    model = random_init(
        args.arch,
        d_model=args.d_model,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        d_vocab=args.d_vocab,
        n_ctx=args.n_ctx or max(256, args.seq_len),
        act_fn=act,
        positional_embedding=args.pos,
        attn_only=args.attn_only,
        seed=args.seed,
        backend=args.backend,
        device=args.device,
        dtype=_DTYPES[args.dtype],
    )
    report = analyze(
        model,
        inputs=args.inputs,
        n_sequences=args.n_sequences,
        seq_len=args.seq_len,
        seed=args.input_seed,
        batch_size=args.batch_size,
        progress=not args.no_progress,
        sections=args.sections,
        ablations=args.ablations,
    )
    return json.dumps(report.to_dict(), indent=2) if args.json else str(report)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``lens-bias`` and ``python -m lens_bias``; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "analyze":
            print(_analyze(args))
    except (LensBiasError, TypeError) as err:
        print(f"lens-bias {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0
