"""The real families beside SmolLM2 (Gemma 3 270M, Qwen2.5-Coder 0.5B; 1.5B where installed by hand): each loads by
name from its verified chunk wheels, computes the model's own logits on TL 4 and TL 3, and its sink and anatomy equal
a plain transformers computation with eager attention. One family is held at a time (module-scoped fixtures)."""

from __future__ import annotations

import copy
import re
import runpy
from pathlib import Path
from typing import Any

import pytest
import torch

import lens_bias
from lens_bias.core.inputs import text_tokens
from lens_bias.models import SOURCES
from lens_bias.models.huggingface import from_hf, load_hf

from ..conftest import BACKEND, _real_model_or_skip
from ..report.browser import PAGE_BUDGET, read_page, requires_chromium

pytestmark = pytest.mark.real_model

# name -> opt-in (not installed by CI: 7.6 GB of memory in float32)
FAMILIES = {"gemma-3-270m": False, "qwen2.5-coder-0.5b-instruct": False, "qwen2.5-coder-1.5b-instruct": True}
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ANATOMY_SECTIONS = ["sinks", "super_neurons", "massive_activations", "super_weights"]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> tuple[str, Any, Any, Any]:
    """(name, TL model, Hugging Face model, tokenizer), the file read once."""
    name = request.param
    _real_model_or_skip(name, opt_in=FAMILIES[name])
    hf, tokenizer = load_hf(name)
    model = from_hf(copy.deepcopy(hf) if BACKEND == "bridge" else hf, tokenizer, model_name=name)  # a bridge takes its module over
    return name, model, hf, tokenizer


def _tokens(tokenizer: Any, bos: bool) -> torch.Tensor:
    return text_tokens(tokenizer, 8, 48, bos=bos, seed=5)


def test_loads_by_name_and_computes_the_models_own_logits(family):
    name, model, hf, tokenizer = family
    assert [source for source, s in SOURCES.items() if s.matches(name)][0] == "shipped"
    # a report names the model by its published name, not its GGUF file's general.name (Qwen's says "AWQ", a quantisation it is not)
    assert lens_bias.extend.ModelAdapter(model).info.name == {"gemma-3-270m": "Gemma 3 270M", "qwen2.5-coder-0.5b-instruct": "Qwen2.5-Coder-0.5B-Instruct",
                                                       "qwen2.5-coder-1.5b-instruct": "Qwen2.5-Coder-1.5B-Instruct"}.get(name)
    assert type(model).__name__ == ("TransformerBridge" if BACKEND == "bridge" else "HookedTransformer")
    assert (model.cfg.n_layers, model.cfg.d_model) == (hf.config.num_hidden_layers, hf.config.hidden_size)
    ids = tokenizer("The capital of France is Paris. The capital of Germany is", return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs = model(ids), hf(ids).logits
    # TL 3 reorders float32 sums (GQA heads, einsum): measured 2.6e-5 on both families.
    assert (ours - theirs).abs().max().item() < 1e-4
    assert tokenizer.decode(ours[0, -1].argmax()) == " Berlin"


@pytest.mark.parametrize("bos", [False, True], ids=["no-bos", "bos"])
def test_sink_0_equals_plain_transformers_with_eager_attention(family, bos):
    """Sink_0 at ε 0.3: the share of (sequence, layer, head) whose mean attention to token 0 exceeds ε, against the
    patterns Hugging Face returns (eager attention); one borderline α may round across ε."""
    name, model, hf, tokenizer = family
    tokens = _tokens(tokenizer, bos)
    report = lens_bias.analyze(model, inputs=tokens, sections=["sinks"], progress=False)
    with torch.no_grad():
        attentions = torch.stack(hf(tokens, output_attentions=True).attentions, dim=1)  # [N, L, H, T, T]
    alpha_0 = attentions[..., :, 0].mean(dim=-1)  # every query sees key 0
    expected = (alpha_0 > 0.3).float().mean().item() * 100
    one_flip = 100 / alpha_0.numel()
    assert report.sinks.rate()[0].item() == pytest.approx(expected, abs=one_flip + 1e-6)
    assert report.sinks.share(0).mean().item() == pytest.approx(alpha_0.mean().item(), abs=1e-4)


def test_anatomy_equals_the_hidden_states_of_plain_transformers(family):
    """The anatomy's massive dimension and its size are those of Hugging Face's hidden states at position 0 (with
    the model's BOS, which Gemma expects), and every link has a measured number."""
    name, model, hf, tokenizer = family
    tokens = _tokens(tokenizer, bos=True)
    anatomy = lens_bias.analyze(model, inputs=tokens, sections=ANATOMY_SECTIONS, progress=False).anatomy()
    outputs = []
    handles = [layer.register_forward_hook(lambda module, args, out: outputs.append(out[0] if isinstance(out, tuple) else out))
               for layer in hf.model.layers]
    try:
        with torch.no_grad():
            hf(tokens)
    finally:
        for handle in handles:
            handle.remove()
    first = torch.stack(outputs, dim=1)[:, :, 0].abs().mean(dim=0)  # [L, d]: mean |h_0| of each block's output
    dim = anatomy.massive_dims[0]
    assert anatomy.massive_value == pytest.approx(first[:, dim].max().item(), rel=1e-3)
    if anatomy.onset_layer is not None:  # Sun et al.'s massive dim is the largest one at position 0
        assert dim == first[anatomy.onset_layer].argmax().item()
    # where it is written: the embedding and each layer's writes add up to Hugging Face's residual after every block
    writes = lens_bias.massive_writes(model, tokens, dim=dim)
    expected = torch.stack(outputs, dim=1)[:, :, 0, dim].mean(dim=0)  # [L]: signed mean at position 0
    scale = expected.abs().max().item()
    assert writes.to_pandas().resid_after.tolist() == pytest.approx(expected.tolist(), abs=1e-4 * scale)
    assert writes.post_norm == (name == "gemma-3-270m")  # Gemma adds each sub-layer's output through a norm
    assert set(anatomy.to_dict()) >= {"sink_rate", "sink_layers", "massive_dims", "onset_layer", "super_neuron", "disparity", "largest_spike"}
    assert 0 <= anatomy.sink_rate <= 100 and anatomy.disparity > 0 and anatomy.super_neuron


def test_the_family_anatomy_example_reads_post_norm_gains_from_the_weights(family):
    """The gains the three-family page quotes for Gemma's post-feedforward norm are Hugging Face's own (Gemma's
    RMSNorm scales by 1 + weight), at every dim; a family that adds its MLP outputs as they are has none."""
    name, model, hf, tokenizer = family
    gains = runpy.run_path(str(EXAMPLES / "family_anatomy.py"))["post_mlp_gains"]
    if name != "gemma-3-270m":
        assert gains(model, 0) is None
        return
    for dim in (163, 400):
        expected = [1 + layer.post_feedforward_layernorm.weight[dim].item() for layer in hf.model.layers]
        table = gains(model, dim)
        assert table.gain.tolist() == pytest.approx(expected, rel=1e-5)
        median = [(1 + layer.post_feedforward_layernorm.weight).abs().median().item() for layer in hf.model.layers]
        assert table.median_abs_gain.tolist() == pytest.approx(median, rel=1e-5)


@requires_chromium
def test_the_report_page_has_the_same_design_on_every_family(family, tmp_path):
    """A family's page reads like SmolLM2's (tests/experiments/test_real_model.py): named, the anatomy first, the sink
    heads' attention with the window's tokens, drawn without a console message, under 1 MB."""
    name, model, hf, tokenizer = family
    report = lens_bias.analyze(model, inputs=_tokens(tokenizer, bos=True), progress=False)
    path = report.to_html(tmp_path / "page.html")
    dom = read_page(path)
    title = lens_bias.models.SHIPPED[name].title
    assert f"<title>lens_bias report: {title}</title>" in path.read_text() and path.stat().st_size < PAGE_BUDGET
    headings = re.findall(r"<h2>([^<]*)</h2>", dom)
    assert headings[:3] == ["Anatomy of the sink", "Attention of the strongest sink heads", "Other numbers"]
    assert report.sink_heads.tokens[:3] == [tokenizer.decode([i]) for i in _tokens(tokenizer, bos=True)[0, :3].tolist()]
    assert "attention of the strongest sink heads (unedited)" in dom


@pytest.mark.slow
def test_sliding_layers_over_an_input_longer_than_gemmas_window(family):
    """600 tokens, longer than Gemma 3's local window of 512: the windows read from the model are the mask plain
    transformers applies (key 0 gets no attention from queries ≥ 512 in a sliding layer, some in a full one), and
    Sink_0 there averages α over the 512 queries that can see key 0. Qwen2.5 slides nowhere."""
    name, model, hf, tokenizer = family
    tokens = text_tokens(tokenizer, 2, 600, bos=True, seed=3)
    windows = lens_bias.extend.ModelAdapter(model).windows
    assert windows == tuple(512 if t == "sliding_attention" else None for t in hf.config.layer_types) if name.startswith("gemma") \
        else all(w is None for w in windows)
    result = lens_bias.analyze(model, inputs=tokens, sections=["sinks"], progress=False).sinks
    with torch.no_grad():
        attentions = torch.stack(hf(tokens, output_attentions=True).attentions, dim=1)  # [N, L, H, T, T]
    to_first = attentions[..., 0]  # [N, L, H, query]
    for layer, window in enumerate(windows):
        late = to_first[:, layer, :, window:] if window is not None else None
        if window is not None:
            assert late.abs().max() == 0, (layer, window)  # the model's own mask: no query ≥ 512 sees key 0
        else:  # a full layer: queries far past 512 still reach key 0 (a head may put an exact 0 there, not all of them)
            assert (to_first[:, layer, :, 512:] > 0).any(), layer
        seen = to_first[:, layer, :, :window] if window is not None else to_first[:, layer]
        assert (result.alpha_mean[layer, :, 0] - seen.mean(dim=-1).mean(dim=0)).abs().max().item() < 1e-4, layer
    if name.startswith("gemma"):
        assert result.sliding_layers and "there Sink_k counts only the queries that can see key k" in result.summary()


def test_qwen_coder_05b_and_15b_are_unrelated_by_their_tables():
    """Two widths of one family trained apart (896 and 1536 channels, one tokenizer): compare's default finds no partial
    map that makes the narrower table a pruning of the wider, in either order, and calls the pair unrelated."""
    for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):
        _real_model_or_skip(name, opt_in=FAMILIES[name])
    small, large = (lens_bias.models.pretrained(name) for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"))
    for a, b in ((small, large), (large, small)):
        result = lens_bias.compare(a, b, n=64, seq_len=4, progress=False)
        assert not result.same_lineage and result.p == 1.0 and result.basis_map == "none", str(result)
        assert result.basis_fit > 1.0 and "not a pruning" in result.reason, str(result)
