"""Wall time of ``lens_bias.analyze`` divided by the plain forward passes over the same inputs.

The baseline is ``model(tokens)`` over the same batches under ``torch.inference_mode`` (logits at every
position included, as a user would run it), measured in the same process. Target: ratio <= 2.0.

    python benchmarks/bench_analyze.py [--d-model 256 --n-layers 4 --n 256 --seq-len 128 --device cpu]
    python benchmarks/bench_analyze.py --model smollm2-135m-instruct --n 64 --seq-len 64
"""

from __future__ import annotations

import argparse

import torch
from _timing import timed

import lens_bias
from lens_bias.extend import ModelAdapter


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a pretrained model instead of a random init, e.g. smollm2-135m-instruct")
    parser.add_argument("--arch", default="gpt2")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--d-vocab", type=int, default=8000)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    if args.model:  # a pretrained model: its own width, depth and vocabulary
        model = lens_bias.models.pretrained(args.model, device=args.device, dtype=getattr(torch, args.dtype))
        args.arch, args.d_model, args.n_layers, args.d_vocab = args.model, model.cfg.d_model, model.cfg.n_layers, model.cfg.d_vocab
    else:
        model = lens_bias.random_init(
            args.arch, d_model=args.d_model, n_layers=args.n_layers, d_vocab=args.d_vocab, n_ctx=max(256, args.seq_len),
            act_fn="relu" if args.arch == "gpt2" else None, positional_embedding="rotary", device=args.device,
            dtype=getattr(torch, args.dtype),
        )
    tokens = lens_bias.random_tokens(args.n, args.seq_len, args.d_vocab)
    batch = ModelAdapter(model).default_batch_size(args.seq_len)

    def forward_only() -> None:
        with torch.inference_mode():
            for start in range(0, args.n, batch):
                model(tokens[start : start + batch].to(args.device))

    def analyze() -> None:
        lens_bias.analyze(model, inputs=tokens, batch_size=batch, progress=False)

    t_forward = timed(forward_only, args.repeats)
    t_analyze = timed(analyze, args.repeats)
    print(f"model: {args.arch} d_model {args.d_model}, {args.n_layers} layers, V {args.d_vocab}; inputs {args.n} x {args.seq_len}; "
          f"batch {batch}; {args.device}/{args.dtype}; threads {torch.get_num_threads()}")
    print(f"plain forward passes: {t_forward:.3f} s")
    print(f"analyze (v1 sections): {t_analyze:.3f} s")
    print(f"analyze / forward ratio: {t_analyze / t_forward:.2f} (target <= 2.0)")


if __name__ == "__main__":
    main()
