"""A model bigger than memory: peak resident memory and time of an offloaded pass against the same pass in memory,
and the peak of loading a GGUF in bfloat16 against loading it in float32.

The offload comparison reads the model from a Hugging Face folder (safetensors, written first from the GGUF), which
accelerate loads tensor by tensor. The GGUF file itself is loaded offloaded too, one tensor at a time
(``lens_bias.models.gguf_offload``), against loading it whole into memory.

Each measurement runs in a process of its own and reports the peak of its anonymous resident memory (sampled
every 5 ms) above the value after its imports: what loading and running add and cannot give back to the page
cache (mapped model files and the offload folder's files are pages the kernel can drop and read again).

    python benchmarks/bench_offload.py                            # SmolLM2-135M, 150 MB of CPU memory for weights
    python benchmarks/bench_offload.py --max-memory 100MB --n 64
    python benchmarks/bench_offload.py --results docs/results/offload.json   # what docs/performance.md renders
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def _resident_mib() -> tuple[float, float]:
    """(anonymous, all) resident memory: anonymous memory cannot be dropped and read back from a file (mapped
    weight files and the offload folder's files can)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["RssAnon"].split()[0]) / 1024, int(fields["VmRSS"].split()[0]) / 1024


class _Peak:
    """The largest resident memory seen, (anonymous, all), sampled every 5 ms on a thread."""

    def __init__(self) -> None:
        self.value, self._stop = _resident_mib(), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.read()

    def reset(self) -> None:
        self.value = _resident_mib()

    def read(self) -> tuple[float, float]:
        now = _resident_mib()
        self.value = (max(self.value[0], now[0]), max(self.value[1], now[1]))
        return self.value


def child(args: argparse.Namespace) -> None:
    """One measurement; prints one JSON line."""
    import torch

    import lens_bias

    if args.save:
        from transformers import AutoModelForCausalLM

        from lens_bias.models.huggingface import load_hf

        hf, tokenizer = load_hf(args.model)
        if hasattr(hf.config, "quantization_config"):  # a GGUF-loaded model does not save itself: copy it into a plain one
            del hf.config.quantization_config
        plain = AutoModelForCausalLM.from_config(hf.config)
        plain.load_state_dict(hf.state_dict())
        plain.save_pretrained(args.save)
        tokenizer.save_pretrained(args.save)
        return
    base, peak = _resident_mib(), _Peak()
    dtype = getattr(torch, args.dtype)
    options = {"max_memory": {"cpu": args.max_memory}, "offload_folder": args.offload_folder} if args.offload else {}
    started = time.perf_counter()
    model = lens_bias.models.pretrained(args.model, dtype=dtype, **options)
    loaded = time.perf_counter() - started
    load_peak = peak.read()
    out: dict[str, float] = {"load_s": loaded, "load_peak_mib": load_peak[0] - base[0], "load_peak_all_mib": load_peak[1] - base[1],
                             "float32_mib": sum(p.numel() for p in model.parameters()) * 4 / 2**20}
    gc.collect()
    out["after_load_mib"] = _resident_mib()[0] - base[0]
    peak.reset()
    if args.n:
        lens_bias.seedprint.fingerprint(model, n=2, seq_len=args.seq_len, progress=False)  # warm-up
        started = time.perf_counter()
        lens_bias.seedprint.fingerprint(model, n=args.n, seq_len=args.seq_len, progress=False)
        out["ms_per_token"] = 1000 * (time.perf_counter() - started) / (args.n * args.seq_len)
    run_peak = peak.read()
    out["run_peak_mib"], out["run_peak_all_mib"] = run_peak[0] - base[0], run_peak[1] - base[1]
    print(json.dumps(out))


def measure(args: argparse.Namespace, *extra: str) -> dict[str, float]:
    command = [sys.executable, __file__, "--child", "--model", args.model, "--n", str(args.n), "--seq-len", str(args.seq_len),
               "--max-memory", args.max_memory, "--offload-folder", args.offload_folder, *extra]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    lines = done.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--max-memory", default="150MB", help="CPU memory the offloaded model's weights may use")
    parser.add_argument("--n", type=int, default=32, help="sequences fingerprinted")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--offload-folder", default=None)
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the figures as a results file")
    parser.add_argument("--offload", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as folder:
        args.offload_folder = args.offload_folder or str(Path(folder) / "offload")
        gguf = args.model
        measure(args, "--save", str(Path(folder) / "hf"))
        args.model = str(Path(folder) / "hf")
        memory = measure(args)
        offloaded = measure(args, "--offload")
        args.model, args.n = gguf, 0
        load32 = measure(args)
        load16 = measure(args, "--dtype", "bfloat16")
        load_offloaded = measure(args, "--offload")
    for name, m in (("in memory", memory), (f"offloaded to disk (max_memory cpu {args.max_memory})", offloaded)):
        print(f"{name}: anonymous memory at the load's peak {m['load_peak_mib']:.0f} MiB, {m['after_load_mib']:.0f} MiB held after "
              f"loading, {m['run_peak_mib']:.0f} MiB at the fingerprint's peak (all resident memory, mapped files included: "
              f"{m['run_peak_all_mib']:.0f} MiB); {m['ms_per_token']:.2f} ms/token")
    print(f"offloaded / in-memory fingerprint peak, anonymous: {offloaded['run_peak_mib'] / memory['run_peak_mib']:.2f}")
    print(f"offloaded / in-memory fingerprint peak, all resident: {offloaded['run_peak_all_mib'] / memory['run_peak_all_mib']:.2f} "
          "(target < 1: the weights on disk are not all resident at once)")
    print(f"offloaded / in-memory load peak: {offloaded['load_peak_mib'] / memory['load_peak_mib']:.2f}")
    print(f"offloaded / in-memory time per token: {offloaded['ms_per_token'] / memory['ms_per_token']:.2f}")
    print(f"GGUF load peak bfloat16 / float32: {load16['load_peak_mib'] / load32['load_peak_mib']:.2f} "
          f"({load16['load_peak_mib']:.0f} / {load32['load_peak_mib']:.0f} MiB)")
    with_copy = 1.5 * load16["float32_mib"]  # the bfloat16 model beside a float32 copy of it
    print(f"GGUF bfloat16 load peak / (bfloat16 model + a float32 copy): {load16['load_peak_mib'] / with_copy:.2f} "
          f"(target < 1: no float32 copy of the whole model at the peak; {load16['load_peak_mib']:.0f} / {with_copy:.0f} MiB)")
    print(f"GGUF load peak offloaded (read one tensor at a time) / in memory, float32: "
          f"{load_offloaded['load_peak_mib'] / load32['load_peak_mib']:.2f} ({load_offloaded['load_peak_mib']:.0f} / {load32['load_peak_mib']:.0f} MiB)")
    if args.results:  # docs/performance.md renders its offload figures from it (docs/render.py)
        import pandas as pd
        from _results import write_tables

        measures = {"resident": "run_peak_all_mib", "anonymous": "run_peak_mib", "ms_per_token": "ms_per_token"}
        fingerprint = pd.DataFrame([{"measure": name, "in_memory": memory[key], "offloaded": offloaded[key], "ratio": offloaded[key] / memory[key]}
                                    for name, key in measures.items()])
        loads = pd.DataFrame([{"load": name, "peak_mib": run["load_peak_mib"], "ratio": run["load_peak_mib"] / load32["load_peak_mib"]}
                              for name, run in (("float32", load32), ("bfloat16", load16), ("offloaded", load_offloaded))])
        write_tables(args.results, {"fingerprint": fingerprint, "gguf_load": loads}, {"fingerprint": ["measure"], "gguf_load": ["load"]},
                     {"in_memory": ".2f", "offloaded": ".2f", "peak_mib": ".0f", "ratio": ".2f"},
                     ("benchmarks/bench_offload.py", "lens_bias/models", "lens_bias/core", "lens_bias/seedprint"),
                     numbers={"max_memory": args.max_memory, "float32_mib": load16["float32_mib"], "bfloat16_with_float32_copy_mib": with_copy,
                              "bfloat16_over_with_copy": load16["load_peak_mib"] / with_copy})


if __name__ == "__main__":
    main()
