"""A model bigger than memory: layers offloaded to disk by accelerate (Hugging Face's big-model inference) give
the numbers of the model in memory, through hooks, interventions, weight reads and SeedPrint."""

from __future__ import annotations

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.analyses.sink_attribution import sink_attribution
from lens_bias.core import tl
from lens_bias.core.inputs import text_tokens
from lens_bias.core.offload import is_offloaded, read_weight
from lens_bias.models.huggingface import from_hf

from ..conftest import hook_snapshot, requires_tl4

# 150 MB of CPU memory for SmolLM2's 540 MB of float32 weights: the embedding and a layer or two stay in memory,
# the rest goes to disk
SMALL_MEMORY = {"cpu": "150MB"}


def _tiny_hf_folder(folder):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=300, max_position_embeddings=64))
    hf.save_pretrained(folder)
    return hf


@requires_tl4
def test_an_offloaded_bridge_reads_weights_and_runs_like_the_model_in_memory(tmp_path):
    from transformers import AutoModelForCausalLM

    _tiny_hf_folder(tmp_path / "hf")
    memory_model = from_hf(AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager"))
    offloaded = from_hf(AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager", device_map="auto",
                                                             max_memory={"cpu": "200KB"}, offload_folder=str(tmp_path / "offload")))
    assert "disk" in set(offloaded.original_model.hf_device_map.values()) and is_offloaded(offloaded)
    for layer in range(4):  # the weight read brings the module in for the read and leaves it offloaded
        assert torch.equal(read_weight(offloaded.blocks[layer].mlp, "W_out"), read_weight(memory_model.blocks[layer].mlp, "W_out"))
        assert is_offloaded(offloaded.blocks[layer].mlp.original_component) == (offloaded.original_model.hf_device_map.get(f"model.layers.{layer}") != "cpu")
    tokens = lens_bias.random_tokens(4, 12, 300, seed=1)
    sections = ["sinks", "super_weights", "super_neurons", "massive_activations"]
    a = lens_bias.analyze(memory_model, inputs=tokens, sections=sections, progress=False)
    b = lens_bias.analyze(offloaded, inputs=tokens, sections=sections, progress=False)
    for name in sections:
        torch.testing.assert_close(torch.tensor(b.sections[name].to_pandas().select_dtypes("number").to_numpy()),
                                   torch.tensor(a.sections[name].to_pandas().select_dtypes("number").to_numpy()), equal_nan=True)
    with pytest.raises(LensBiasError, match="placed by a device map"):  # no copy of an offloaded model to another dtype
        lens_bias.seedprint.fingerprint(offloaded, n=4, seq_len=8, dtype=torch.bfloat16, progress=False)


@pytest.mark.skipif(tl.tl_major() >= 4, reason="the TL 3 refusal")
@pytest.mark.parametrize("options, reason", [
    ({"max_memory": SMALL_MEMORY}, "takes GPU indices as max_memory keys, not \\['cpu'\\]"),
    ({"max_memory": {0: "1GB", "disk": "1GB"}}, "takes GPU indices"),
    ({"offload_folder": "offload"}, "with max_memory=.* alone"),
    ({"device_map": {"": "cpu"}}, "with max_memory=.* alone"),
    ({"max_memory": {0: "1GB", 2: "1GB"}}, "needs consecutive GPUs; this names \\[0, 2\\]"),
    ({"max_memory": {torch.cuda.device_count(): "1GB"}}, "CUDA devices are visible"),
], ids=["cpu", "disk", "folder", "dict", "gap", "absent"])
def test_tl3_refuses_every_map_but_a_gpu_split_in_one_line(options, reason):
    with pytest.raises(LensBiasError, match=f"TransformerBridge.*n_devices.*{reason}") as refusal:
        lens_bias.models.pretrained("smollm2-135m-instruct", **options)  # refused before anything is loaded
    assert "\n" not in str(refusal.value)


@pytest.mark.skipif(tl.tl_major() >= 4 or not torch.cuda.is_available(), reason="a TL 3 split over GPUs")
def test_tl3_splits_a_hooked_transformer_over_the_gpus_max_memory_names(smollm2):
    gpus = torch.cuda.device_count()
    model = lens_bias.models.pretrained("smollm2-135m-instruct", max_memory={i: "40GiB" for i in range(gpus)})
    assert model.cfg.n_devices == gpus and {p.device.type for p in model.parameters()} == {"cuda"}
    tokens = text_tokens(smollm2.tokenizer, 2, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens).cpu(), smollm2(tokens), atol=1e-3, rtol=1e-3)


@pytest.mark.skipif(tl.tl_major() >= 4, reason="the TL 3 refusal")
def test_tl3_refuses_wrapping_an_offloaded_hf_model_in_one_line(tmp_path):
    from transformers import AutoModelForCausalLM

    _tiny_hf_folder(tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", attn_implementation="eager", device_map="auto", max_memory={"cpu": "200KB"},
                                              offload_folder=str(tmp_path / "offload"))
    with pytest.raises(LensBiasError, match="HookedTransformer cannot run") as refusal:
        from_hf(hf)
    assert "\n" not in str(refusal.value)


@requires_tl4
def test_a_device_and_a_device_map_are_refused_together():
    with pytest.raises(LensBiasError, match="not both"):
        lens_bias.models.pretrained("smollm2-135m-instruct", device="cpu", max_memory=SMALL_MEMORY)


# ---- SmolLM2 with most layers on disk --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def offloaded_smollm2(smollm2, tmp_path_factory):
    model = lens_bias.models.pretrained("smollm2-135m-instruct", max_memory=SMALL_MEMORY, offload_folder=tmp_path_factory.mktemp("offload"))
    placement = list(model.original_model.hf_device_map.values())
    assert placement.count("disk") >= 25  # of 30 layers and the head: most of the model is off memory
    return model


@requires_tl4
def test_smollm2_offloaded_to_disk_gives_the_same_numbers(smollm2, offloaded_smollm2):
    model = offloaded_smollm2
    tokens = text_tokens(smollm2.tokenizer, 4, 16)
    fa = lens_bias.seedprint.fingerprint(smollm2, n=8, seq_len=8, progress=False)
    fb = lens_bias.seedprint.fingerprint(model, n=8, seq_len=8, progress=False)
    torch.testing.assert_close(fb.features, fa.features, atol=1e-5, rtol=1e-5)
    a = lens_bias.analyze(smollm2, inputs=tokens, progress=False)
    hooks = hook_snapshot(model)
    b = lens_bias.analyze(model, inputs=tokens, progress=False)
    assert hook_snapshot(model) == hooks  # every hook removed afterwards
    assert b.sections["super_weights"].headline() == pytest.approx(a.sections["super_weights"].headline())
    assert (b.sections["super_weights"].headline()["layer"], b.sections["super_weights"].headline()["col"]) == (11, 1229)
    for name in a.sections:
        left, right = (r.sections[name].to_pandas().select_dtypes("number").to_numpy() for r in (a, b))
        torch.testing.assert_close(torch.tensor(right), torch.tensor(left), atol=1e-3, rtol=1e-4, equal_nan=True, msg=name)
    # the causal chain: weight removals (read from disk), mean-state edits, MaskToSelf and AmplifyVariance
    chain_a, chain_b = sink_attribution(smollm2, tokens, progress=False), sink_attribution(model, tokens, progress=False)
    left, right = (c.to_pandas() for c in (chain_a, chain_b))
    assert left.condition.tolist() == right.condition.tolist()
    torch.testing.assert_close(torch.tensor(right.sink_0.to_numpy()), torch.tensor(left.sink_0.to_numpy()), atol=1e-4, rtol=0)
    torch.testing.assert_close(torch.tensor(right.perplexity.to_numpy()), torch.tensor(left.perplexity.to_numpy()), rtol=1e-4, atol=0)


# ---- the command line -----------------------------------------------------------------------------------------


@requires_tl4
@pytest.mark.parametrize("size", ["1B", "150MB", f"{10**12}B"])  # everything on disk; most of it; nothing
def test_the_command_line_fingerprints_smollm2_at_any_max_memory(smollm2, size, tmp_path, monkeypatch, capsys):
    from lens_bias.cli import main
    from lens_bias.seedprint import Fingerprint

    monkeypatch.chdir(tmp_path)
    assert main(["fingerprint", "smollm2-135m-instruct", "-o", "fp.pt", "--n", "4", "--seq-len", "8", "--max-memory", size,
                 "--offload-folder", "offload", "--no-progress"]) == 0, capsys.readouterr().err
    expected = lens_bias.seedprint.fingerprint(smollm2, n=4, seq_len=8, progress=False)
    torch.testing.assert_close(Fingerprint.load("fp.pt").features, expected.features, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("argv, says", [
    (["analyze", "--max-memory", "0"], "'0' is not a size above 0"),
    (["analyze", "--max-memory", "lots"], "'lots' is not a size above 0"),
    (["analyze", "--max-memory", "gpu=1GB"], "'gpu' is not a device"),
    (["analyze", "--max-memory", "1GB"], "place a pretrained --model; a random init is built whole"),
    (["fingerprint", "llama:d=16,L=1,H=2,V=50", "-o", "fp.pt", "--offload-folder", "off"], "is a random-init model, which loads whole"),
    (["fingerprint", "smollm2-135m-instruct", "-o", "fp.pt", "--max-memory", "1GB", "--device", "cuda"],
     "cannot go together" if torch.cuda.is_available() else "CUDA is not available"),
], ids=["zero", "words", "device", "random-init", "spec", "device-and-map"])
def test_bad_placement_flags_are_refused_in_one_line(argv, says, capsys, tmp_path, monkeypatch):
    from lens_bias.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse: a value it cannot parse
        code = exit_.code
    err = capsys.readouterr().err.strip()
    line = err.splitlines()[-1]  # argparse prints its usage above
    assert code == 2 and says in line and line.startswith(f"lens-bias {argv[0]}: error: ") and "Traceback" not in err, err
