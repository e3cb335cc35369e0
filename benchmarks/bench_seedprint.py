"""SeedPrint benchmarks: every figure a ratio against a baseline measured in the same run.

1. fingerprint extraction / a full ``model(tokens)`` forward on the same inputs (target <= 0.9 when V >= 16·d:
   extraction stops after the final norm and never computes the unembedding);
2. fingerprint extraction / the plain HF inner-model forward ``hf_model.model(input_ids)``, the reference code's
   path (target <= 1.1);
3. the scipy ``kendalltau`` loop / ``lens_bias.core.stats.kendall_tau_b`` over N × k columns, on the device: the
   vectorised τ-b on CUDA (target >= 10); scipy's own loop on CPU, where it is the faster exact one (target >= 1);
4. peak memory of fingerprinting N = 2000 / N = 200 inputs, each in a fresh process (target <= 1.2);
5. a bare scipy ``kendalltau`` loop over the columns the lineage test correlates (N × k softmaxed features) / the
   whole ``lineage_test`` on those features (target >= 0.9: the test is never much slower than what it wraps);
6. ``compare`` (its default, ``align="auto"``) / the published ``compare(align=None)`` at equal N, on a descendant that needs no alignment (the
   model against its 4-bit copy): the token and basis maps read from the weights (target <= 1.3).

    python benchmarks/bench_seedprint.py                       # CPU defaults: llama d 256, 4 layers, V 8000
    python benchmarks/bench_seedprint.py --device cuda --dtype bfloat16 --d-model 768 --n-layers 12 \\
        --d-vocab 32000 --seq-len 1024 --n 256                 # the 160M toy of the papers, on a GPU
    python benchmarks/bench_seedprint.py --model smollm2-135m-instruct --n 64 --seq-len 32   # the shipped real model
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import numpy as np
import torch
from _timing import timed
from scipy.stats import kendalltau

import lens_bias
from lens_bias.core.stats import kendall_tau_b
from lens_bias.extend import ModelAdapter
from lens_bias.models.transforms import quantize
from lens_bias.seedprint import compare, fingerprint, lineage_test

TEMPERATURE = 10.0  # lineage_test's default


def build(args: argparse.Namespace):
    if args.model:  # a pretrained model: its own width, depth and vocabulary
        model = lens_bias.models.pretrained(args.model, device=args.device, dtype=getattr(torch, args.dtype))
        args.d_vocab = model.cfg.d_vocab
        return model
    return lens_bias.random_init(
        "llama", d_model=args.d_model, n_layers=args.n_layers, n_heads=max(1, args.d_model // 64), d_vocab=args.d_vocab,
        n_ctx=args.seq_len, device=args.device, dtype=getattr(torch, args.dtype),
    )


def peak_memory(args: argparse.Namespace) -> None:
    """Child process: fingerprint args.n inputs, print the peak memory in bytes."""
    model = build(args)
    torch.cuda.reset_peak_memory_stats() if args.device.startswith("cuda") else None
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fingerprint(model, n=args.n, seq_len=args.seq_len, batch_size=args.batch_size, progress=False)
    if args.device.startswith("cuda"):
        print(json.dumps({"peak": torch.cuda.max_memory_allocated()}))
    else:
        print(json.dumps({"peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "before": baseline * 1024}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a pretrained model instead of a random init, e.g. smollm2-135m-instruct")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--n-layers", type=int, default=4)
    parser.add_argument("--d-vocab", type=int, default=8000)
    parser.add_argument("--n", type=int, default=256, help="inputs for the timing ratios")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kendall-n", type=int, default=10_000)
    parser.add_argument("--kendall-k", type=int, default=400)
    parser.add_argument("--peak-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_only:
        peak_memory(args)
        return

    model = build(args)
    tokens = lens_bias.random_tokens(args.n, args.seq_len, args.d_vocab)
    batches = [tokens[i : i + args.batch_size].to(args.device) for i in range(0, args.n, args.batch_size)]
    # TL 4 bridges built from an HF model expose it; a TL 3 HookedTransformer has no HF model to compare with.
    original = getattr(model, "original_model", None)
    hf_inner = getattr(original, "model", None)

    def full_forward() -> None:
        with torch.inference_mode():
            for batch in batches:
                model(batch)

    def hf_forward() -> None:
        with torch.inference_mode():
            for batch in batches:
                hf_inner(input_ids=batch)

    def extract() -> None:
        fingerprint(model, inputs=tokens, batch_size=args.batch_size, progress=False)

    t_full, t_extract = timed(full_forward, args.repeats), timed(extract, args.repeats)
    t_hf = timed(hf_forward, args.repeats) if hf_inner is not None else float("nan")

    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.kendall_n, args.kendall_k))
    y = 0.3 * x + rng.standard_normal(x.shape)
    start = time.perf_counter()
    for j in range(args.kendall_k):
        kendalltau(x[:, j], y[:, j])
    t_scipy = time.perf_counter() - start
    xt, yt = torch.from_numpy(x).to(args.device), torch.from_numpy(y).to(args.device)
    t_kendall = timed(lambda: kendall_tau_b(xt, yt), args.repeats)

    # The lineage test on k features (every one an identity dimension) against the loop over the same columns.
    fa, fb = torch.from_numpy(x).float(), torch.from_numpy(y).float()
    pa, pb = (torch.softmax(f.double() / TEMPERATURE, dim=1).numpy() for f in (fa, fb))

    def bare_loop() -> None:
        for j in range(args.kendall_k):
            kendalltau(pa[:, j], pb[:, j])

    t_bare = timed(bare_loop, args.repeats)
    t_lineage = timed(lambda: lineage_test(fa, fb, m=args.kendall_k, mode="base", temperature=TEMPERATURE), args.repeats)

    quantised = quantize(model, 4)
    t_published = timed(lambda: compare(model, quantised, n=args.n, seq_len=args.seq_len, batch_size=args.batch_size, align=None, progress=False),
                         args.repeats)
    t_auto = timed(lambda: compare(model, quantised, n=args.n, seq_len=args.seq_len, batch_size=args.batch_size, progress=False), args.repeats)  # "auto"

    peaks = {}
    for n in (200, 2000):
        cmd = [sys.executable, __file__, "--peak-only", *(["--model", args.model] if args.model else []), "--n", str(n), "--d-model", str(args.d_model), "--n-layers", str(args.n_layers),
               "--d-vocab", str(args.d_vocab), "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
               "--device", args.device, "--dtype", args.dtype]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        peaks[n] = json.loads(out.strip().splitlines()[-1])["peak"]

    info = ModelAdapter(model).info
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.model or 'llama'} d_model {info.d_model}, {info.n_layers} layers, V {info.d_vocab} (V/d = {info.d_vocab / info.d_model:.0f}); "
          f"{args.n} inputs × {args.seq_len} tokens, batch {args.batch_size}; {device_name}, {args.dtype}")
    print(f"full model(tokens) forward:   {t_full:.3f} s")
    print(f"HF inner-model forward:       {t_hf:.3f} s" if hf_inner is not None else "HF inner-model forward:       n/a (no HF model inside)")
    print(f"fingerprint extraction:       {t_extract:.3f} s")
    path = "vectorised" if args.device.startswith("cuda") else "scipy's loop"
    print(f"scipy kendalltau loop ({args.kendall_n} × {args.kendall_k}): {t_scipy:.3f} s; kendall_tau_b ({path} on {args.device}): {t_kendall:.3f} s")
    print(f"peak memory fingerprinting 200 / 2000 inputs: {peaks[200] / 2**20:.0f} MiB / {peaks[2000] / 2**20:.0f} MiB")
    print(f"extraction / full forward:      {t_extract / t_full:.2f} (target <= 0.9)")
    print(f"extraction / HF inner forward:  {t_extract / t_hf:.2f} (target <= 1.1)" if hf_inner is not None else "extraction / HF inner forward:  n/a (target <= 1.1; needs a TL 4 bridge over an HF model)")
    print(f"scipy loop / kendall_tau_b: {t_scipy / t_kendall:.2f} (target {'>= 10' if args.device.startswith('cuda') else '>= 1'})")
    print(f"peak memory N 2000 / N 200:     {peaks[2000] / peaks[200]:.2f} (target <= 1.2)")
    print(f"scipy loop / lineage_test: {t_bare / t_lineage:.2f} (target >= 0.9; the loop {t_bare:.3f} s, the test {t_lineage:.3f} s, CPU)")
    print(f"compare auto / published:  {t_auto / t_published:.2f} (target <= 1.3; {t_auto:.3f} s against {t_published:.3f} s, a 4-bit descendant)")


if __name__ == "__main__":
    main()
