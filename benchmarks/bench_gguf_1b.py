"""At size: a LLaMA-architecture GGUF of about 1.1B parameters (TinyLlama's shape, random float16 weights) written
with the gguf package's writer to a temporary folder, loaded with ``max_memory`` below its float32 size, and
fingerprinted (in bfloat16, as SeedPrint runs half-precision models).

Prints the anonymous resident memory at the load's peak and at the fingerprint's peak against the limit and the
model's float32 size, and the time per token. Nothing is kept: the folder is deleted at the end.

    python benchmarks/bench_gguf_1b.py                       # max_memory 1 GB, 8 sequences of 16 tokens
    python benchmarks/bench_gguf_1b.py --layers 4            # a smaller model, to check the plumbing
"""

from __future__ import annotations

import argparse
import gc
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=22)
    parser.add_argument("--d-mlp", type=int, default=5632)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--max-memory", default="1GB", help="CPU memory the loaded weights may use (below the float32 size)")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    import lens_bias
    from lens_bias.core.memory import return_freed_memory
    from lens_bias.models.huggingface import from_hf

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "llama-1b.gguf"
        started = time.perf_counter()
        params = write_gguf(path, d=args.d_model, layers=args.layers, ff=args.d_mlp, heads=32, kv_heads=4, vocab=args.vocab, ctx=2048)
        written = time.perf_counter() - started
        float32_mib = params * 4 / 2**20
        gc.collect()
        return_freed_memory()
        base, peak = _resident_mib(), _Peak()
        started = time.perf_counter()
        hf = AutoModelForCausalLM.from_pretrained(folder, gguf_file=path.name, attn_implementation="eager", dtype=torch.bfloat16,
                                                  device_map="auto", max_memory={"cpu": args.max_memory}, offload_folder=str(Path(folder) / "offload"))
        model = from_hf(hf)
        loaded = time.perf_counter() - started
        load_peak = peak.read()[0] - base[0]
        gc.collect()
        peak.reset()
        placement = list(hf.hf_device_map.values())
        lens_bias.seedprint.fingerprint(model, n=1, seq_len=args.seq_len, vocab=args.vocab, progress=False)  # warm-up
        started = time.perf_counter()
        fp = lens_bias.seedprint.fingerprint(model, n=args.n, seq_len=args.seq_len, vocab=args.vocab, progress=False)
        seconds = time.perf_counter() - started
        run_peak = peak.read()[0] - base[0]
    print(f"model: {params / 1e9:.2f}B parameters ({float32_mib:.0f} MiB in float32), GGUF float16 written in {written:.0f} s; "
          f"{placement.count('disk')} of {len(placement)} device-map entries on disk")
    print(f"limit: max_memory cpu {args.max_memory}; anonymous memory at the load's peak {load_peak:.0f} MiB ({loaded:.0f} s), "
          f"at the fingerprint's peak {run_peak:.0f} MiB")
    print(f"fingerprint: {fp.features.shape[0]} × {args.seq_len} tokens, {1000 * seconds / (args.n * args.seq_len):.0f} ms/token, "
          f"features finite: {bool(torch.isfinite(fp.features).all())}")
    print(f"fingerprint peak / float32 size: {run_peak / float32_mib:.2f}; load peak / float32 size: {load_peak / float32_mib:.2f}")


if __name__ == "__main__":
    main()
