"""Ablations: the two forces that contract a random init's hidden states, switched off one at a time.

A GPT-style ReLU model without position embedding runs once per condition of ``lens_bias.ablate`` on the same
random token sequences: an odd MLP activation removes the shared direction (inter-sequence cosine near 0) while
attention still makes the positions of one sequence alike (intra); self-only attention takes that away (intra falls
to inter); the activation sweep orders the shared direction by the activation's mean.

    python examples/ablations.py                  # d_model 320, 4 layers, 256 sequences of 64 tokens (~1 min)
    python examples/ablations.py --d-model 64 --n-layers 2 --n 16 --seq-len 16   # a smoke run
"""

from __future__ import annotations

import argparse

import pandas as pd

import lens_bias
from lens_bias.core.provenance import numbers_of, results_record, table_of, write_results


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=320)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--d-vocab", type=int, default=8000)
    parser.add_argument("--n", type=int, default=256, help="random sequences")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="init seed")
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the table as a results file (docs/results/ablations.json)")
    args = parser.parse_args(argv)

    model = lens_bias.random_init(
        "gpt2", d_model=args.d_model, n_layers=args.n_layers, d_vocab=args.d_vocab, n_ctx=max(256, args.seq_len),
        act_fn="relu", positional_embedding="none", seed=args.seed,
    )
    table = lens_bias.ablate(model, n_sequences=args.n, seq_len=args.seq_len, progress=False).final()[["inter", "intra", "max_min_ratio"]]
    table = table.rename(columns={"max_min_ratio": "max/min p̄"})
    print(f"GPT-style ReLU, no position embedding, d_model {args.d_model}, {args.n_layers} layers, V {args.d_vocab}; "
          f"{args.n} random sequences of {args.seq_len} tokens; after the final norm")
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    if args.results:  # the docs render their numbers from it (docs/render.py)
        frame = table.reset_index()
        tables = {"conditions": table_of(frame, {"inter": ".3f", "intra": ".3f", "max/min p̄": ".3g"})}
        write_results(args.results, results_record(numbers_of(frame, ["condition"], "conditions"), tables, ("examples/ablations.py", "analyses", "hooks"),
                                                   command="python examples/ablations.py --results docs/results/ablations.json"))
    return table


if __name__ == "__main__":
    main()
