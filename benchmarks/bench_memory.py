"""The memory guard's estimate against the measured peak of real passes, on three sizes.

Each size runs in a fresh subprocess: the model is built and warmed up with a one-sequence pass, then one
``analyze`` pass (every section, the attention patterns read by the sinks probes) runs at a fixed batch size.
Measured peak: on CPU the growth of the process's peak resident set (``VmHWM`` reset through
``/proc/self/clear_refs`` after the warm-up, minus ``VmRSS`` at that point, so the weights and the Python heap
are not counted); on CUDA ``torch.cuda.max_memory_allocated`` minus the allocation before the pass. Estimate:
``batch × lens_bias.core.memory.forward_bytes(...)``, what the guard plans with. Target: within 25%.

    python benchmarks/bench_memory.py [--device cpu] [--tiny]
    python benchmarks/bench_memory.py --results docs/results/memory_guard_tl4.json   # what docs/performance.md renders
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

# (arch, d_model, n_layers, n_heads, d_vocab, seq_len, batch): patterns dominate, MLP and residual matter, a mix.
SIZES = [
    ("gpt2", 256, 2, 8, 8000, 512, 8),
    ("llama", 512, 2, 8, 8000, 256, 32),
    ("gpt2", 128, 2, 4, 4000, 1024, 4),
]
TINY = [
    ("gpt2", 64, 2, 4, 500, 256, 8),
    ("llama", 128, 2, 4, 500, 128, 32),
    ("gpt2", 64, 2, 4, 500, 512, 2),
]


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(arch: str, d: int, layers: int, heads: int, vocab: int, seq: int, batch: int, device: str) -> dict:
    import lens_bias
    from lens_bias.core import memory

    model = lens_bias.random_init(arch, d_model=d, n_layers=layers, n_heads=heads, d_vocab=vocab, n_ctx=max(seq, 16), device=device)
    info = lens_bias.extend.ModelAdapter(model).info
    tokens = lens_bias.random_tokens(batch, seq, vocab)
    lens_bias.analyze(model, inputs=tokens[:2, :16], progress=False)  # warm-up: kernels, lazy imports, hook wiring
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        before = _status("VmRSS")
    lens_bias.analyze(model, inputs=tokens, batch_size=batch, progress=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - before
    else:
        measured = _status("VmHWM") - before
    estimate = batch * memory.forward_bytes(seq_len=seq, d_model=d, n_heads=heads, d_mlp=info.d_mlp, d_vocab=vocab, gated_mlp=info.gated_mlp, family=info.family)
    return {"size": f"{arch} d{d} L{layers} H{heads} V{vocab}, {batch} x {seq}", "estimate": estimate, "measured": measured}


def main(argv: list[str] | None = None) -> pd.DataFrame:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tiny", action="store_true", help="small sizes (seconds; the ratios are noisier)")
    parser.add_argument("--child", nargs=7, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the table as a results file (one per TransformerLens version)")
    args = parser.parse_args(argv)
    if args.child:
        arch, *numbers = args.child
        print(json.dumps(child(arch, *map(int, numbers), device=args.device)))
        return pd.DataFrame()
    from lens_bias.core.memory import format_bytes

    print(f"{'size':<44} {'estimate':>10} {'measured':>10} {'ratio':>6}")
    rows = []
    for size in TINY if args.tiny else SIZES:
        cmd = [sys.executable, __file__, "--device", args.device, "--child", *map(str, size)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append({**row, "ratio": row["estimate"] / max(1, row["measured"])})
        print(f"{row['size']:<44} {format_bytes(row['estimate']):>10} {format_bytes(row['measured']):>10} {rows[-1]['ratio']:>6.2f}")
    table = pd.DataFrame(rows)
    print(f"largest deviation: {(table.ratio - 1).abs().max():.0%} (target <= 25%); threads {torch.get_num_threads()}, torch {torch.__version__}")
    if args.results:  # docs/performance.md renders its memory-guard table from it (docs/render.py)
        from _results import write_tables

        shown = table.assign(estimate=table.estimate / 2**20, measured=table.measured / 2**20).rename(columns={"estimate": "estimate_mib", "measured": "measured_mib"})
        write_tables(args.results, {"sizes": shown}, {"sizes": ["size"]}, {"estimate_mib": ".0f", "measured_mib": ".0f", "ratio": ".2f"},
                     ("benchmarks/bench_memory.py", "lens_bias/core/memory.py", "analyses"))
    return table


if __name__ == "__main__":
    main()
