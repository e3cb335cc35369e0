"""SeedPrint's null calibration: the false-positive rate of each null on pairs of independent random inits.

No two of these models share an initialisation, so every pair called related is a false positive. The table is
``seedprint.calibrate``'s: per input kind and null, the pairs, the false positives, the FPR and the median τ̄ and
log10 p.

    python examples/calibration.py                                                # 200 pairs, d 64, ~3 min
    python examples/calibration.py --results docs/results/calibration.json        # the table the docs render
    python examples/calibration.py --pairs 4 --n 64 --seq-len 8                   # a smoke run
    python examples/calibration.py --pairs 100 --kinds tokens --aligns permutation orthogonal linear \
        --results docs/results/calibration_aligned.json                           # the aligned tests' table

With ``--aligns`` each pair is tested under each align mode: the map is fitted on the first half of the inputs and the
test runs on the other half, so an alignment that overfits unrelated models shows as a false-positive rate.
"""

from __future__ import annotations

import argparse

import pandas as pd

import lens_bias
from lens_bias import seedprint
from lens_bias.core.provenance import command_line, tables_record, write_results


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=200, help="pairs of independent inits")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--d-vocab", type=int, default=8000)
    parser.add_argument("--n", type=int, default=500, help="inputs per fingerprint")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--m", type=int, default=32, help="identity dimensions")
    parser.add_argument("--kinds", nargs="+", default=["tokens", "embeddings"], choices=["tokens", "embeddings"], help="input kinds")
    parser.add_argument("--aligns", nargs="+", default=None, choices=["permutation", "orthogonal", "linear"],
                        help="test each pair under these align modes instead of the published test")
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the table as a results file (docs/results/calibration.json)")
    args = parser.parse_args(argv)

    # one llama-style model, its weights re-drawn per seed (as random_init draws them)
    model = lens_bias.random_init("llama", d_model=args.d_model, n_layers=args.n_layers, n_heads=4, d_vocab=args.d_vocab, n_ctx=args.seq_len)
    table = seedprint.calibrate(lambda seed: lens_bias.models.redraw(model, seed), n_pairs=args.pairs, n=args.n, seq_len=args.seq_len, m=args.m,
                                kinds=args.kinds, aligns=args.aligns or (None,), progress=False)
    print(table.to_string())
    if args.results:  # the docs render their numbers from it (docs/render.py)
        formats = {"fpr": ".1%", "median_tau_bar": ".4f", "median_log10_p": ".2f"}
        keys = ["inputs", "null"] if args.aligns is None else ["inputs", "align", "null"]
        command = command_line(__file__, argv)
        write_results(args.results, tables_record({"calibration": table}, {"calibration": keys}, formats,
                                                  ("examples/calibration.py", "lens_bias/seedprint"), command))
    return table


if __name__ == "__main__":
    main()
