"""A real model's massive activations and super weight, measured: Sun et al.'s per-layer top |h| and their
intervention, Yu et al.'s super-weight candidates and the perplexity without the top one, against two controls.

The activations are found on 100 held-out prose windows of 64 tokens and every perplexity is of 32 other windows
(one draw of 132 windows, split), so nothing is fitted to the text it is judged on.

    python examples/real_model_anatomy.py                                                   # SmolLM2, ~3 min
    python examples/real_model_anatomy.py --results docs/results/anatomy_smollm2.json      # what the docs render
    python examples/real_model_anatomy.py --n 8 --held-out 4 --seq-len 32                  # a smoke run
"""

from __future__ import annotations

import argparse

import pandas as pd

import lens_bias
from lens_bias.analyses.massive import massive_ablation, massive_activations
from lens_bias.analyses.super_weights import super_weight_table, super_weights
from lens_bias.core.inputs import text_tokens
from lens_bias.core.provenance import tables_record, write_results


def main(argv: list[str] | None = None) -> dict[str, pd.DataFrame]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a pretrained model with a tokenizer")
    parser.add_argument("--n", type=int, default=100, help="windows the activations and candidates are found on")
    parser.add_argument("--held-out", type=int, default=32, help="other windows whose perplexity is measured")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the tables as a results file (docs/results/anatomy_smollm2.json)")
    args = parser.parse_args(argv)

    model = lens_bias.models.pretrained(args.model)
    windows = text_tokens(model.tokenizer, args.n + args.held_out, args.seq_len, seed=0)
    tokens, held_out = windows[: args.n], windows[args.n:]
    massive = massive_activations(model, tokens)
    onset = massive.onset_layer()
    dims = massive.dims(onset, positions=(0,)) if onset is not None else ()
    tables = {
        # per layer, the largest |h| over all sequences, where it is, and the layer's median |h|
        "massive": massive.to_pandas().query("rank == 0").drop(columns="rank").reset_index(drop=True),
        "candidates": super_weights(model, tokens).to_pandas(),
        "removal": super_weight_table(model, tokens, held_out, n_random=100).to_pandas(),
    }
    if onset is not None:  # set to zero and to their mean at the onset layer
        tables["ablation"] = massive_ablation(model, tokens, held_out, layer=onset, dims=dims).to_pandas()
    for name, frame in tables.items():
        print(f"{name}\n{frame.to_string()}\n")
    if args.results:  # the docs render their numbers from it (docs/render.py)
        keys = {"massive": ["layer"], "candidates": ["rank"], "removal": ["condition"], "ablation": ["condition"]}
        formats = {"value": ",.0f", "median": ".3g", "perplexity": ".1f", "ratio": ".2f"}
        write_results(args.results, tables_record(tables, keys, formats, ("examples/real_model_anatomy.py", "analyses"),
                                                  f"python examples/real_model_anatomy.py --results {args.results}",
                                                  numbers={"onset_layer": onset, "massive_dims": list(dims)}))
    return tables


if __name__ == "__main__":
    main()
