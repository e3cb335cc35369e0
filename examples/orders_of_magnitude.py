"""Orders of magnitude: at LLaMA-7B width a random-init ReLU transformer prefers some tokens ~1000× over others.

The logit spread over the vocabulary grows with the width (≈ σ√d per unit of alignment), so the extreme
preference needs a *wide* model, not a deep one. This builds GPT-style ReLU models (no position embedding) at
d_model 4096 and 256 with vocabulary 32000, analyses them on the last-position-only path (logits are never
formed for every position), and compares the wide model with its MLP asymmetry removed (OddActivation).

    python examples/orders_of_magnitude.py            # ≈ 1–2 minutes and ≈ 4 GB on 2 CPU cores
"""

from __future__ import annotations

import argparse
import resource
import time

import pandas as pd

import lens_bias
from lens_bias.core.provenance import numbers_of, results_record, table_of, write_results
from lens_bias.hooks import Intervention, OddActivation


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=4096, help="the wide model's width")
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--d-vocab", type=int, default=32000)
    parser.add_argument("--n", type=int, default=128, help="random sequences")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the table as a results file (docs/results/orders_of_magnitude.json)")
    args = parser.parse_args(argv)

    rows = []

    def build(d_model: int):
        return lens_bias.random_init(
            "gpt2", d_model=d_model, n_layers=args.n_layers, n_heads=max(1, d_model // 128), d_vocab=args.d_vocab,
            n_ctx=args.seq_len, act_fn="relu", positional_embedding="none", seed=0,
        )

    def measure(label: str, model, *interventions: Intervention) -> None:
        start = time.perf_counter()
        with lens_bias.intervene(model, *interventions):
            report = lens_bias.analyze(model, n_sequences=args.n, seq_len=args.seq_len, sections=["token_preference", "contraction"], progress=False)
        tp = report.token_preference
        rows.append(
            {
                "model": label,
                "max/min p̄": tp.max_min_ratio,
                "V·max p̄": tp.uniform_ratio,
                "H(p̄)/log V": tp.entropy_ratio,
                "argmax share": tp.argmax_share,
                "inter": report.contraction.inter[-1].item(),
                "analyze seconds": time.perf_counter() - start,
            }
        )

    wide = build(args.d_model)
    measure(f"ReLU d {args.d_model}", wide)
    measure(f"ReLU d {args.d_model} + OddActivation", wide, OddActivation())
    del wide
    measure("ReLU d 256", build(256))
    table = pd.DataFrame(rows).set_index("model")
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"{args.n_layers} layers, V {args.d_vocab}, {args.n} random sequences of {args.seq_len} tokens; peak memory {peak_gib:.1f} GiB")
    print(table.to_string(float_format=lambda v: f"{v:.3g}"))
    if args.results:  # the docs render their numbers from it (docs/render.py)
        frame = table.reset_index().drop(columns=["analyze seconds"])
        numbers = {"peak_gib": peak_gib, **numbers_of(frame, ["model"], "models")}
        tables = {"models": table_of(frame, {"max/min p̄": ".3g", "V·max p̄": ".3g", "H(p̄)/log V": ".3f", "argmax share": ".3f", "inter": ".3f"})}
        write_results(args.results, results_record(numbers, tables, ("examples/orders_of_magnitude.py", "analyses", "hooks/mlp.py"),
                                                   command="python examples/orders_of_magnitude.py"))
    return table


if __name__ == "__main__":
    main()
