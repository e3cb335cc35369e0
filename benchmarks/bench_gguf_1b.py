"""At size: a LLaMA-architecture GGUF of about 1.1B parameters (TinyLlama's shape, random float16 weights) written
with the gguf package's writer to a temporary folder, loaded in bfloat16 with ``max_memory`` below its float32 size,
and fingerprinted.

It is loaded twice, each in a process of its own: one tensor at a time (``load_gguf_offloaded``, what
``lens_bias.models.pretrained`` does for a GGUF with a device map) and, as the baseline, whole by transformers' GGUF
loader. Prints the anonymous resident memory at the load's peak and at the fingerprint's peak against the limit and
the model's float32 size, and the time per token. Nothing is kept: the folder is deleted at the end.

    python benchmarks/bench_gguf_1b.py                       # max_memory 1 GB, 8 sequences of 16 tokens
    python benchmarks/bench_gguf_1b.py --layers 4            # a smaller model, to check the plumbing
    python benchmarks/bench_gguf_1b.py --results docs/results/gguf_1b.json   # what docs/performance.md renders
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_offload import _Peak, _resident_mib


def write_gguf(path: Path, *, d: int, layers: int, ff: int, heads: int, kv_heads: int, vocab: int, ctx: int, seed: int = 0) -> int:
    """A random-weight LLaMA GGUF (float16 tensors, norm gains 1); returns the parameter count."""
    import gguf

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(ctx)
    writer.add_embedding_length(d)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(d // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    head = d // heads
    shapes = {"token_embd.weight": (vocab, d), "output.weight": (vocab, d), "output_norm.weight": (d,)}
    for i in range(layers):
        shapes.update({
            f"blk.{i}.attn_norm.weight": (d,), f"blk.{i}.ffn_norm.weight": (d,),
            f"blk.{i}.attn_q.weight": (d, d), f"blk.{i}.attn_k.weight": (kv_heads * head, d), f"blk.{i}.attn_v.weight": (kv_heads * head, d),
            f"blk.{i}.attn_output.weight": (d, d), f"blk.{i}.ffn_gate.weight": (ff, d), f"blk.{i}.ffn_up.weight": (ff, d),
            f"blk.{i}.ffn_down.weight": (d, ff),
        })
    count = 0
    for name, shape in shapes.items():
        if len(shape) == 1:
            writer.add_tensor(name, np.ones(shape, dtype=np.float32))
        else:
            writer.add_tensor(name, (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16))
        count += int(np.prod(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return count


def child(args: argparse.Namespace) -> None:
    """Load ``args.path`` with one reader and fingerprint it; prints one JSON line."""
    import torch

    import lens_bias
    from lens_bias.core.memory import return_freed_memory
    from lens_bias.models.gguf_offload import load_gguf_offloaded
    from lens_bias.models.huggingface import from_hf

    path, offload = Path(args.path), str(Path(args.path).parent / f"offload-{args.reader}")
    return_freed_memory()
    base, peak = _resident_mib(), _Peak()
    started = time.perf_counter()
    if args.reader == "streamed":
        hf = load_gguf_offloaded(path, dtype=torch.bfloat16, max_memory={"cpu": args.max_memory}, offload_folder=offload, progress=False)
    else:
        from transformers import AutoModelForCausalLM

        hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, attn_implementation="eager", dtype=torch.bfloat16,
                                                  device_map="auto", max_memory={"cpu": args.max_memory}, offload_folder=offload)
    model = from_hf(hf)
    out = {"load_s": time.perf_counter() - started, "load_peak_mib": peak.read()[0] - base[0]}
    placement = list(getattr(hf, "hf_device_map", {"": "cpu"}).values())  # transformers sets none when all fits
    gc.collect()
    peak.reset()
    lens_bias.seedprint.fingerprint(model, n=1, seq_len=args.seq_len, vocab=args.vocab, progress=False)  # warm-up
    started = time.perf_counter()
    fp = lens_bias.seedprint.fingerprint(model, n=args.n, seq_len=args.seq_len, vocab=args.vocab, progress=False)
    out |= {"ms_per_token": 1000 * (time.perf_counter() - started) / (args.n * args.seq_len), "run_peak_mib": peak.read()[0] - base[0],
            "on_disk": placement.count("disk"), "entries": len(placement), "finite": bool(torch.isfinite(fp.features).all())}
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--d-mlp", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--max-memory", default="1GB", help="CPU memory the loaded weights may use (below the float32 size)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the figures as a results file")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--path", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reader", default="streamed", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "llama-1b.gguf"
        started = time.perf_counter()
        params = write_gguf(path, d=args.d_model, layers=args.layers, ff=args.d_mlp, heads=32, kv_heads=4, vocab=args.vocab, ctx=2048)
        written = time.perf_counter() - started
        runs = {}
        for reader in ("streamed", "transformers"):  # each in a process of its own: freed memory stays in a process's heap
            command = [sys.executable, __file__, "--child", "--path", str(path), "--reader", reader, "--max-memory", args.max_memory,
                       "--n", str(args.n), "--seq-len", str(args.seq_len), "--vocab", str(args.vocab)]
            runs[reader] = json.loads(subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    float32_mib = params * 4 / 2**20
    streamed, baseline = runs["streamed"], runs["transformers"]
    print(f"model: {params / 1e9:.2f}B parameters ({float32_mib:.0f} MiB in float32), GGUF float16 written in {written:.0f} s; "
          f"{streamed['on_disk']} of {streamed['entries']} device-map entries on disk; limit: max_memory cpu {args.max_memory}")
    for name, run in (("read one tensor at a time (lens_bias)", streamed), ("read whole (transformers' GGUF loader)", baseline)):
        print(f"{name}: anonymous memory at the load's peak {run['load_peak_mib']:.0f} MiB ({run['load_s']:.0f} s), at the "
              f"fingerprint's peak {run['run_peak_mib']:.0f} MiB; {run['ms_per_token']:.0f} ms/token; features finite: {run['finite']}")
    print(f"load peak, one tensor at a time / whole: {streamed['load_peak_mib'] / baseline['load_peak_mib']:.2f}; "
          f"against the float32 size: {streamed['load_peak_mib'] / float32_mib:.2f}")
    print(f"fingerprint peak / float32 size: {streamed['run_peak_mib'] / float32_mib:.2f}")
    if args.results:  # docs/performance.md renders its at-size figures from it (docs/render.py)
        import pandas as pd
        from _results import write_tables
        from accelerate.utils import convert_file_size_to_int

        limit_mib = convert_file_size_to_int(args.max_memory) / 2**20
        peaks = pd.DataFrame([{"peak": name, "streamed_mib": streamed[key], "whole_mib": baseline[key], "streamed_over_limit": streamed[key] / limit_mib,
                               "whole_over_limit": baseline[key] / limit_mib, "streamed_over_float32": streamed[key] / float32_mib,
                               "whole_over_float32": baseline[key] / float32_mib, "streamed_over_whole": streamed[key] / baseline[key]}
                              for name, key in (("load", "load_peak_mib"), ("fingerprint", "run_peak_mib"))])
        write_tables(args.results, {"peaks": peaks}, {"peaks": ["peak"]}, {"streamed_mib": ".0f", "whole_mib": ".0f"},
                     ("benchmarks/bench_gguf_1b.py", "lens_bias/models", "lens_bias/core", "lens_bias/seedprint"),
                     numbers={"parameters": params, "float32_mib": float32_mib, "limit_mib": limit_mib, "max_memory": args.max_memory,
                              "written_s": written, "on_disk": streamed["on_disk"], "entries": streamed["entries"],
                              **{f"{reader}.{k}": v for reader, run in runs.items() for k, v in run.items() if k in ("load_s", "ms_per_token", "finite")}})


if __name__ == "__main__":
    main()
