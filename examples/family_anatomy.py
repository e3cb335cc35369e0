"""One family's sink anatomy in one ``analyze`` pass, and where its massive activation is written: the Python of
the three-family page's sections 2 and 3, writing the results file those sections render.

Sections 2 and 3 of ``docs/experiments/families-sinks.md`` are these four runs:

    python examples/family_anatomy.py --model smollm2-135m-instruct --results docs/results/family_anatomy_smollm2.json
    python examples/family_anatomy.py --model gemma-3-270m --bos --dim 400 --dim 163 --results docs/results/family_anatomy_gemma_bos.json
    python examples/family_anatomy.py --model gemma-3-270m --dim 400 --dim 163 --results docs/results/family_anatomy_gemma.json
    python examples/family_anatomy.py --model qwen2.5-coder-0.5b-instruct --results docs/results/family_anatomy_qwen.json
    python examples/family_anatomy.py --n 4 --seq-len 16                                   # a smoke run
"""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd
import torch

import lens_bias
from lens_bias.core.inputs import text_tokens
from lens_bias.core.provenance import command_line, tables_record, write_results

SECTIONS = ["sinks", "super_neurons", "massive_activations", "super_weights"]


def post_mlp_gains(model: Any, dim: int) -> pd.DataFrame | None:
    """Per layer, the gain at ``dim`` of the norm an MLP's output passes before it is added (Gemma's post-feedforward
    norm), and the layer's median |gain|; None where MLP outputs are added as they are (LLaMA, Qwen2)."""
    norms = [m for name, m in model.named_modules() if name.endswith(("post_feedforward_layernorm._original_component", "ln2_post"))]
    if not norms:
        return None
    rows = []
    for layer, norm in enumerate(norms):
        weight = next(norm.parameters())
        with torch.no_grad():  # an RMSNorm maps a vector of ones (RMS 1) to its gain, however it stores the gain
            gain = norm(torch.ones(1, weight.shape[-1], dtype=weight.dtype, device=weight.device))[0].float().cpu()
        rows.append({"layer": layer, "gain": float(gain[dim]), "median_abs_gain": float(gain.abs().median())})
    return pd.DataFrame(rows)


def main(argv: list[str] | None = None) -> dict[str, pd.DataFrame]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a pretrained model with a tokenizer")
    parser.add_argument("--bos", action="store_true", help="put the tokenizer's BOS token first")
    parser.add_argument("--n", type=int, default=32, help="held-out prose windows")
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--dim", type=int, action="append", help="a residual dimension whose writes to split (repeatable; default: the first massive dim)")
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the numbers as a results file")
    args = parser.parse_args(argv)

    model = lens_bias.models.pretrained(args.model)
    tokens = text_tokens(model.tokenizer, args.n, args.seq_len, bos=args.bos)
    anatomy = lens_bias.analyze(model, inputs=tokens, sections=SECTIONS, progress=False).anatomy()
    tables = {"anatomy": anatomy.to_pandas()}
    numbers: dict[str, Any] = {
        "sink_0": anatomy.sink_rate, "sink_layers": anatomy.sink_layers, "massive_dims": anatomy.massive_dims,
        "massive_value": anatomy.massive_value, "massive_median": anatomy.massive_median, "onset_layer": anatomy.onset_layer,
        "rise_layer": anatomy.rise_layer, "disparity": anatomy.disparity, "disparity_layer": anatomy.disparity_layer,
        "disparity_elsewhere": anatomy.disparity_elsewhere,
        **{f"super_weight.{rank}.{key}": value for rank, weight in enumerate(anatomy.super_weights) for key, value in weight.items()},
        **{f"super_neuron.{key}": value for key, value in anatomy.super_neuron.items()},
    }
    for dim in args.dim or anatomy.massive_dims[:1]:
        writes = lens_bias.massive_writes(model, tokens, dim=dim).to_pandas()
        gains = post_mlp_gains(model, dim)
        tables[f"writes_{dim}"] = writes if gains is None else writes.merge(gains, on="layer")
        # the peak of the mean h_0, its layer, and the layers where it stays at least half that
        size = writes.resid_after.abs()
        held = writes.layer[size >= size.max() / 2]
        numbers.update({f"peak_{dim}": float(size.max()), f"peak_at_{dim}": int(writes.layer[size.idxmax()]),
                        f"peak_from_{dim}": int(held.min()), f"peak_to_{dim}": int(held.max())})
    for name, frame in tables.items():
        print(f"{name}\n{frame.to_string()}\n")
    print("\n".join(f"{key}: {value}" for key, value in numbers.items()))
    if args.results:  # docs/render.py renders sections 2 and 3 from it
        command = command_line(__file__, argv)
        keys = {name: ["link"] if name == "anatomy" else ["layer"] for name in tables}
        formats = {"attn_write": ".4g", "mlp_write": ".4g", "resid_after": ".4g", "gain": ".3g", "median_abs_gain": ".3g"}
        write_results(args.results, tables_record(tables, keys, formats, ("examples/family_anatomy.py", "analyses", "lens_bias/report/anatomy.py"),
                                                  command, numbers=numbers))
    return tables


if __name__ == "__main__":
    main()
