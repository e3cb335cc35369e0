"""Does the init bias survive training and a distribution shift? The SeedPrint tables 1-4 in miniature.

Pretrains init seeds 42, 123, 1000 and 2000 on stdlib prose with the same data order, continues 1000 and 123 on
stdlib code, and tests lineage between the inits, the trained and the continued models (token inputs; add
embedding inputs with --inputs). Two models trained on the same prose are judged against a data-matched null (two
extra seeds pretrained on the same batches). Writes tables.csv, tables.md, curve.csv and training.csv to --out and
exits 1 when a verdict differs from the expected one.

    python examples/seedprint_persistence.py --tiny --out out/   # under a minute
    python examples/seedprint_persistence.py --out out/          # 17 minutes on 2 CPU cores
    python examples/seedprint_persistence.py --scale --out out/  # the papers' 160M LLaMA toy, for a GPU
    python examples/seedprint_persistence.py --inputs tokens embeddings --out out/   # 18.6 minutes, 28 verdicts
"""

from __future__ import annotations

import argparse

from lens_bias.cli import main as lens_bias_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--tiny", action="store_true", help="the test-suite size")
    size.add_argument("--scale", action="store_true", help="the 160M configuration (GPU)")
    parser.add_argument("--inputs", nargs="+", default=["tokens"], choices=["tokens", "embeddings"])
    parser.add_argument("--out", default="persistence_out")
    args = parser.parse_args(argv)
    preset = "tiny" if args.tiny else "scale" if args.scale else "default"
    return lens_bias_main(["persistence", "--preset", preset, "--inputs", *args.inputs, "--out", args.out])


if __name__ == "__main__":
    raise SystemExit(main())
