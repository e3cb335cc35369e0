"""A GGUF file read one tensor at a time into an accelerate-dispatched model gives transformers' own weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lens_bias import LensBiasError
from lens_bias.models.gguf_offload import load_gguf_offloaded

D, LAYERS, HEADS, KV_HEADS, D_MLP, VOCAB = 64, 4, 4, 2, 128, 300


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A random LLaMA GGUF with a tied head (no ``output.weight``): float32 norms, float16 matrices."""
    gguf = pytest.importorskip("gguf")
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), "llama")
    for add, value in [(writer.add_context_length, 64), (writer.add_embedding_length, D), (writer.add_block_count, LAYERS),
                       (writer.add_feed_forward_length, D_MLP), (writer.add_head_count, HEADS), (writer.add_head_count_kv, KV_HEADS),
                       (writer.add_rope_dimension_count, D // HEADS), (writer.add_layer_norm_rms_eps, 1e-5), (writer.add_vocab_size, VOCAB)]:
        add(value)
    kv = KV_HEADS * D // HEADS
    shapes = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,)}
    for i in range(LAYERS):
        shapes |= {f"blk.{i}.attn_norm.weight": (D,), f"blk.{i}.ffn_norm.weight": (D,), f"blk.{i}.attn_q.weight": (D, D),
                   f"blk.{i}.attn_k.weight": (kv, D), f"blk.{i}.attn_v.weight": (kv, D), f"blk.{i}.attn_output.weight": (D, D),
                   f"blk.{i}.ffn_gate.weight": (D_MLP, D), f"blk.{i}.ffn_up.weight": (D_MLP, D), f"blk.{i}.ffn_down.weight": (D, D_MLP)}
    for name, shape in shapes.items():  # norm gains away from 1, so a gain left at its init would show
        value = 1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1 else 0.1 * rng.standard_normal(shape)
        writer.add_tensor(name, value.astype(np.float32 if len(shape) == 1 else np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _in_memory(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, attn_implementation="eager", dtype=dtype).eval()


def _logits(hf, dtype=torch.float32):
    tokens = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return hf(tokens).logits.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("split", [False, True])  # everything on disk (the tied embedding and head too); them and a layer in memory
def test_streamed_weights_are_transformers_weights(tiny_gguf, tmp_path, split, dtype):
    cpu = f"{100 * dtype.itemsize}KB" if split else "1KB"  # a float32 layer is about 150 KB, the embedding 77 KB
    hf = load_gguf_offloaded(tiny_gguf, dtype=dtype, max_memory={"cpu": cpu}, offload_folder=tmp_path, progress=False)
    assert set(hf.hf_device_map.values()) == ({"cpu", "disk"} if split else {"disk"}), hf.hf_device_map
    reference = _in_memory(tiny_gguf, dtype)
    assert torch.equal(_logits(hf), _logits(reference))  # the same weights, the same float operations
    loaded = {n for n, p in hf.named_parameters() if p.device.type != "meta"}
    for name, param in reference.named_parameters():  # those held in memory, bit for bit; the rest are on disk
        if name in loaded:
            assert torch.equal(hf.get_parameter(name), param), name
    assert hf.lm_head.weight is hf.model.embed_tokens.weight or "lm_head" not in loaded


def test_a_dict_device_map_places_each_module_where_it_says(tiny_gguf, tmp_path):
    device_map = {"model.embed_tokens": "cpu", "lm_head": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu",
                  **{f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(LAYERS)}}
    hf = load_gguf_offloaded(tiny_gguf, device_map=device_map, offload_folder=tmp_path, progress=False)
    assert hf.hf_device_map == device_map
    assert all(p.device.type == "meta" for p in hf.model.layers[1].parameters())
    assert all(p.device.type == "cpu" for p in hf.model.layers[0].parameters())
    assert torch.equal(_logits(hf), _logits(_in_memory(tiny_gguf)))


def test_disk_without_a_folder_and_a_bad_map_are_refused_in_one_line(tiny_gguf):
    with pytest.raises(LensBiasError, match="pass offload_folder=") as refusal:
        load_gguf_offloaded(tiny_gguf, max_memory={"cpu": "1KB"}, progress=False)
    with pytest.raises(LensBiasError, match="device_map must be") as bad:
        load_gguf_offloaded(tiny_gguf, device_map="everywhere", progress=False)
    with pytest.raises(LensBiasError, match="places no module holding model.embed_tokens.weight") as partial:
        load_gguf_offloaded(tiny_gguf, device_map={"lm_head": "cpu"}, progress=False)
    assert all("\n" not in str(e.value) for e in (refusal, bad, partial))
