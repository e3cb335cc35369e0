"""Peak memory against the number of inputs: ``analyze`` and ``seedprint.fingerprint`` at a small and a large N.

Each pass runs in a fresh process: the model is built and warmed up with a four-sequence pass, then one pass over N
random-token sequences at a fixed batch size. Measured: the process's peak resident set (``ru_maxrss``, weights and
Python heap included, what a user's machine has to hold) and its growth above the resident set after the warm-up.
Target: ``analyze`` peak at N large / N small ≤ 1.2 (its sections sum over sequences inside the hooks; only the
readout's ``[N, d_model]`` rows grow with N). ``fingerprint`` keeps ``[N, d_model]`` by design.

    python benchmarks/bench_scale_n.py [--small 200] [--large 20000] [--batch-size 200]
    python benchmarks/bench_scale_n.py --results docs/results/scale_n.json   # what docs/performance.md renders
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(what: str, n: int, args: argparse.Namespace) -> dict:
    import lens_bias

    model = lens_bias.random_init(args.arch, d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, d_vocab=args.d_vocab,
                                  n_ctx=args.seq_len, seed=0)
    run = {
        "analyze": lambda count, batch: lens_bias.analyze(model, n_sequences=count, seq_len=args.seq_len, batch_size=batch, progress=False),
        "fingerprint": lambda count, batch: lens_bias.seedprint.fingerprint(model, n=count, seq_len=args.seq_len, batch_size=batch, progress=False),
    }[what]
    run(4, None)  # warm-up: kernels, lazy imports, hook wiring
    after_warm_up = _rss()
    start = time.perf_counter()
    run(n, args.batch_size)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"peak": peak, "growth": peak - after_warm_up, "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=200)
    parser.add_argument("--large", type=int, default=20000)
    parser.add_argument("--batch-size", type=int, default=200)
    parser.add_argument("--arch", default="llama")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--n-layers", type=int, default=2)
    parser.add_argument("--n-heads", type=int, default=4)
    parser.add_argument("--d-vocab", type=int, default=4000)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the table as a results file")
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, n = args.child
        print(json.dumps(child(what, int(n), args)))
        return
    forwarded = sys.argv[1:]
    rows = []
    print(f"{args.arch} d {args.d_model}, {args.n_layers} layers, {args.n_heads} heads, V {args.d_vocab}, {args.seq_len} tokens, batch {args.batch_size}")
    print(f"{'pass':<12} {'N':>7} {'peak MiB':>9} {'growth MiB':>11} {'seconds':>8}")
    for what in ("analyze", "fingerprint"):
        peaks = {}
        for n in (args.small, args.large):
            out = subprocess.run([sys.executable, __file__, *forwarded, "--child", what, str(n)], capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            peaks[n] = row["peak"]
            print(f"{what:<12} {n:>7} {row['peak'] / 2**20:>9.0f} {row['growth'] / 2**20:>11.0f} {row['seconds']:>8.1f}")
        target = " (target <= 1.2)" if what == "analyze" else " (keeps [N, d_model] by design)"
        print(f"{what} peak N {args.large} / N {args.small}: {peaks[args.large] / peaks[args.small]:.2f}{target}")
        rows.append({"pass": what, "small_mib": peaks[args.small] / 2**20, "large_mib": peaks[args.large] / 2**20, "ratio": peaks[args.large] / peaks[args.small]})
    if args.results:  # docs/performance.md renders its table from it (docs/render.py)
        import pandas as pd
        from _results import write_tables

        write_tables(args.results, {"passes": pd.DataFrame(rows)}, {"passes": ["pass"]}, {"small_mib": ".0f", "large_mib": ".0f", "ratio": ".2f"},
                     ("benchmarks/bench_scale_n.py", "analyses", "lens_bias/seedprint", "lens_bias/core"),
                     numbers={"small": args.small, "large": args.large, "batch_size": args.batch_size})


if __name__ == "__main__":
    main()
