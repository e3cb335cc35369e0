"""Born biased, in one table: random-init models of four kinds on the same random token sequences.

ReLU MLPs have the largest mean activation, so they pull the hidden states of *different* sequences onto one
seed-fixed direction (high inter-sequence cosine) and favour some next tokens over others; GELU less, gated SiLU
(llama) much less; an attention-only stack makes the positions of *one* sequence alike (intra) but shares
nothing across sequences (inter ≈ 0).

    python examples/born_biased.py                 # d_model 256, 4 layers, 256 sequences of 64 tokens (~20 s)
    python examples/born_biased.py --results docs/results/born_biased.json   # the table the docs render
    python examples/born_biased.py --d-model 64 --n-layers 2 --n 16 --seq-len 16   # a smoke run
"""

from __future__ import annotations

import argparse

import pandas as pd

import lens_bias
from lens_bias.core.provenance import numbers_of, results_record, table_of, write_results

MODELS = {
    "ReLU GPT": dict(arch="gpt2", act_fn="relu", positional_embedding="rotary"),
    "GELU GPT": dict(arch="gpt2", act_fn="gelu", positional_embedding="rotary"),
    "SwiGLU llama": dict(arch="llama"),
    "attention-only GPT": dict(arch="gpt2", attn_only=True, positional_embedding="rotary"),
}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--d-vocab", type=int, default=8000)
    parser.add_argument("--n", type=int, default=256, help="random sequences")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0, help="init seed of every model")
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the table as a results file (docs/results/born_biased.json)")
    args = parser.parse_args(argv)

    rows = []
    for name, kind in MODELS.items():
        model = lens_bias.random_init(
            **kind, d_model=args.d_model, n_layers=args.n_layers, d_vocab=args.d_vocab, n_ctx=max(256, args.seq_len), seed=args.seed
        )
        report = lens_bias.analyze(model, n_sequences=args.n, seq_len=args.seq_len, progress=False)
        tp, c = report.token_preference, report.contraction
        rows.append(
            {
                "model": name,
                "inter": c.inter[-1].item(),
                "intra": c.intra[-1].item(),
                "max/min p̄": tp.max_min_ratio,
                "V·max p̄": tp.uniform_ratio,
                "H(p̄)/log V": tp.entropy_ratio,
                "τ halves": tp.tau_halves,
            }
        )
    table = pd.DataFrame(rows).set_index("model")
    print(f"d_model {args.d_model}, {args.n_layers} layers, V {args.d_vocab}; {args.n} random sequences of {args.seq_len} tokens")
    print(table.to_string(float_format=lambda v: f"{v:.3f}"))
    if args.results:  # the docs render their numbers from it (docs/render.py)
        frame = table.reset_index()
        tables = {"models": table_of(frame, {column: ".3f" for column in table.columns})}
        write_results(args.results, results_record(numbers_of(frame, ["model"], "models"), tables, ("examples/born_biased.py", "analyses"),
                                                   command="python examples/born_biased.py --results docs/results/born_biased.json"))
    return table


if __name__ == "__main__":
    main()
