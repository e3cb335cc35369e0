"""Where attention sinks come from, and how to move them: the four experiments of the structural-origin paper.

1. At init, the std of attention outputs across random sequences falls as (t+1)^-1/2 with position t (0-based);
   MaskToSelf(k) gives position k the first token's spread; head-wise RMSNorm makes every position alike.
2. A small LLaMA-style model trained on stdlib prose with a fixed first token: the first-token sink per layer.
3. On that model: MaskToSelf(10) and AmplifyVariance(10, λ) against the control ScaleNorm(10, λ).
4. The same model trained with HeadwiseRMSNorm: sink, positional profile and eval loss against the baseline.

Prints every table and which claims held; writes CSVs, summary.md and the trained checkpoints to --out.

    python examples/move_the_sink.py --tiny --out out/        # ≈ 30 s: the test-suite size
    python examples/move_the_sink.py --out out/               # ≤ 20 minutes on 2 CPU cores
    python examples/move_the_sink.py --trained shipped        # experiments 2-3 on the shipped sink model
    python examples/move_the_sink.py --preset sink-model      # retrain the shipped sink model
    python examples/move_the_sink.py --preset gpu --device cuda   # d 512, 8 layers on stdlib code, for a GPU
"""

from __future__ import annotations

import argparse

from lens_bias.cli import main as lens_bias_main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="the test-suite size")
    parser.add_argument("--preset", default="default", choices=["tiny", "default", "sink-model", "gpu"])
    parser.add_argument("--device", default=None, help="e.g. cuda")
    parser.add_argument("--trained", default=None, help="a sink-model checkpoint, or 'shipped'")
    parser.add_argument("--out", default="sinks_out")
    args = parser.parse_args(argv)
    preset = "tiny" if args.tiny else args.preset
    extra = (["--trained", args.trained] if args.trained else []) + (["--device", args.device] if args.device else [])
    return lens_bias_main(["sinks", "--preset", preset, "--out", args.out, *extra])


if __name__ == "__main__":
    raise SystemExit(main())
