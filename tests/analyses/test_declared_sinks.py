"""Sinks the model declares and windows it slides: GPT-OSS's learned sink logits measured against the model's own
eager attention and its ``sinks`` parameter, their removal against the same model with the logits at −∞, rows that
do not add up refused, and Sink_k in a sliding layer over the queries that can see key k."""

from __future__ import annotations

import copy
import inspect
import json
import runpy
from pathlib import Path
from typing import Any

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, intervene
from lens_bias.analyses.base import measure
from lens_bias.analyses.sink_attribution import SinkAttribution, sink_attribution
from lens_bias.analyses.sinks import Sinks, key_importance, sink_rate
from lens_bias.core import tl
from lens_bias.core.attention_layout import layer_windows, visible_queries, window_mask
from lens_bias.hooks import Intervention, RemoveLearnedSinks

from ..architecture_matrix import _EXTRA, HF_ARCHITECTURES, tiny_hf
from ..conftest import assert_same_state, state_copy, tiny

bridge_only = pytest.mark.skipif(tl.tl_major() < 4, reason="GPT-OSS and Hugging Face sliding windows are bridged on TL 4")
WINDOW, SINK, T = 4, 3.0, 12
TOKENS = torch.randint(0, 512, (8, T), generator=torch.Generator().manual_seed(11))


def tiny_gpt_oss(sink: float = SINK) -> Any:
    """A tiny GPT-OSS: 2 layers × 4 heads, a sliding layer of window 4 then a full one, every sink logit at ``sink``."""
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          vocab_size=512, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2, sliding_window=WINDOW,
                          layer_types=["sliding_attention", "full_attention"])
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.sinks.fill_(sink)
    return hf


@pytest.fixture(scope="module")
def gpt_oss() -> tuple[Any, Any]:
    """(the TL model, the same Hugging Face model apart from it): a bridge takes over the module it wraps."""
    hf = tiny_gpt_oss()
    return lens_bias.from_hf(copy.deepcopy(hf)), hf


def _direct_learned_sink(hf: Any, tokens: torch.Tensor) -> torch.Tensor:
    """α_learned [n, layer, head] from the model's own eager attention: its q, k and mask, and its ``sinks`` logit as
    one more softmax column, the probability of that column averaged over the queries."""
    from transformers.models.gpt_oss import modeling_gpt_oss

    eager, found = modeling_gpt_oss.eager_attention_forward, []

    def capture(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        logits = query @ modeling_gpt_oss.repeat_kv(key, module.num_key_value_groups).transpose(2, 3) * scaling
        if attention_mask is not None:
            mask = attention_mask[..., : logits.shape[-1]]
            logits = logits.masked_fill(~mask, -torch.inf) if mask.dtype == torch.bool else logits + mask
        sink = module.sinks.reshape(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
        found.append(torch.cat([logits, sink], dim=-1).softmax(dim=-1)[..., -1].mean(dim=-1))  # [batch, head]
        return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)

    modeling_gpt_oss.eager_attention_forward = capture  # the model's own eager attention, read on its way
    try:
        with torch.no_grad():
            hf(tokens)
    finally:
        modeling_gpt_oss.eager_attention_forward = eager
    return torch.stack(found, dim=1).double()


@bridge_only
def test_learned_sink_share_and_rate_equal_the_models_own_attention(gpt_oss):
    model, hf = gpt_oss
    result = measure(model, TOKENS, [Sinks(per_sequence=True)])["sinks"]
    direct = _direct_learned_sink(hf, TOKENS)  # [n, layer, head]
    assert result.declares_sink and direct.mean() > 0.5  # a sink logit of 3 takes most of every row
    assert (result.learned_alpha.double() - direct).abs().max() < 1e-6
    assert (result.learned_share().double() - direct.mean(dim=0)).abs().max() < 1e-6
    assert result.learned_rate() == pytest.approx((direct > 0.3).double().mean().item() * 100)
    # every row accounted for: the keys' mass and the learned sink's add up to 1 in every (layer, head)
    assert (result.mass().sum(dim=-1) + result.learned_share() - 1).abs().max() < 1e-5
    # the rates counted in the pass equal those from α per sequence
    plain = measure(model, TOKENS, [Sinks()])["sinks"]
    assert torch.allclose(plain.learned_rate_by_head(), result.learned_rate_by_head())
    assert (plain.learned_share() - result.learned_share()).abs().max() < 1e-6
    assert result.learned_dominates() == [(layer, head) for layer in range(2) for head in range(4)]


@bridge_only
def test_summary_page_and_anatomy_show_the_learned_sink(gpt_oss, tmp_path):
    model, _ = gpt_oss
    report = lens_bias.analyze(model, inputs=TOKENS, progress=False)
    share = report.sinks.learned_share().mean().item()
    assert f"learned sink (a softmax logit per head that no key owns, declared by the model): {share:.3f}" in report.sinks.summary()
    anatomy = report.anatomy()
    assert anatomy is not None and anatomy.learned_sink_leads and anatomy.headline()["model_sink"] == "learned sink"
    sink_row = anatomy.to_pandas().set_index("link").loc["sink"]
    assert sink_row["where"].startswith(f"the learned sink (a softmax logit no key owns): {share:.0%}")
    assert "layer 0 slides (window 4)" in sink_row["measured"]
    table = report.sinks.to_pandas()
    assert table.window.tolist() == ["4"] * 4 + ["full"] * 4
    assert table.learned_sink_share.tolist() == pytest.approx(report.sinks.learned_share().flatten().tolist())
    page = report.to_html(tmp_path / "report.html").read_text()
    for words in ("learned-sink share α_learned", "learned sink rate (%)", "sliding window (tokens)", "the learned sink (a softmax logit no key owns)"):
        assert words in page, words
    fig = report.sinks.plot()
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["mean α_0: no head passes ε 0.3", "learned sink (%) at ε 0.3"]
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["0 (window 4)", "1"]


@bridge_only
def test_remove_learned_sinks_is_the_model_with_its_sink_logits_at_minus_infinity(gpt_oss):
    model, _ = gpt_oss
    reference = tiny_gpt_oss(sink=-float("inf"))
    before = state_copy(model)
    with torch.no_grad(), intervene(model, RemoveLearnedSinks()):
        edited = model(TOKENS)
    assert (edited - reference(TOKENS).logits).abs().max() < 1e-5
    assert_same_state(model, before)
    removed = measure(model, TOKENS, [Sinks()], interventions=[RemoveLearnedSinks()])["sinks"]
    assert removed.learned_share().abs().max() < 1e-6
    assert Intervention.from_dict(RemoveLearnedSinks(layers=(1,)).to_dict()) == RemoveLearnedSinks(layers=(1,))
    with pytest.raises(LensBiasError, match="declares no learned sink"):
        with intervene(tiny("llama"), RemoveLearnedSinks()):
            pass


@bridge_only
def test_sink_attribution_removes_the_learned_sinks_and_says_where_their_attention_went(gpt_oss):
    model, _ = gpt_oss
    result = sink_attribution(model, TOKENS, calibration=TOKENS.flip(0), n_random=4, position=8)
    table = result.to_pandas().set_index("condition")
    row = table.loc["learned sinks removed"]
    assert row.link == "learned sink → attention" and abs(row.learned_sink) < 1e-6
    assert table.loc["unedited"].learned_sink == pytest.approx(result.learned_share[0].mean().item())
    # the perplexity of the condition is that of the model with its sink logits at −∞
    reference = lens_bias.from_hf(tiny_gpt_oss(sink=-float("inf")))
    assert row.perplexity == pytest.approx(lens_bias.perplexity(reference, TOKENS), rel=1e-5)
    # where the freed attention went: the keys' gains add up to what the learned sink gave up
    freed = result.learned_share[0].mean() - result.learned_share[-1].mean()
    gain = result.key_mass[-1] - result.key_mass[0]
    assert gain.sum().item() == pytest.approx(freed.item(), abs=1e-5)
    assert row.freed_attention.endswith(f"of the {freed:.2f} freed)")
    # the anatomy tests the learned sink at the sink itself, in its table and under the sink in its figure
    anatomy = lens_bias.analyze(model, [..., SinkAttribution(result=result)], inputs=TOKENS, progress=False).anatomy()
    assert anatomy.to_pandas().set_index("link").loc["sink", "causal test"].startswith("learned sinks removed: ")
    texts = [t.get_text() for t in anatomy.plot().axes[0].texts]
    assert any(t.startswith("learned sinks removed:") for t in texts), texts
    # the default conditions of a model without learned sinks leave the condition out
    assert "learned sinks removed" not in sink_attribution(tiny("llama"), lens_bias.random_tokens(8, 12, 97), n_random=4).conditions


@pytest.mark.slow  # the whole example (analyze and the attribution): out of the inner loop, in the full suite
@bridge_only
def test_the_pages_example_writes_the_models_own_learned_sink(gpt_oss, tmp_path):
    # docs/sinks.md renders its table from what examples/declared_sinks.py writes: the learned sink's share equals the
    # model's own eager attention, and the removal row is the attribution's
    _, hf = gpt_oss
    results = tmp_path / "declared.json"
    table = runpy.run_path(str(Path(__file__).parents[2] / "examples" / "declared_sinks.py"))["main"](["--results", str(results)])
    numbers = json.loads(results.read_text())["numbers"]
    assert numbers["learned_sink_share"] == pytest.approx(_direct_learned_sink(hf, TOKENS).mean().item(), abs=1e-5)
    removed = table.set_index("condition").loc["learned sinks removed"]
    assert numbers["conditions.learned_sinks_removed.sink_0"] == removed.sink_0 and numbers["heads"] == 8
    assert numbers["conditions.learned_sinks_removed.freed_attention"] == removed.freed_attention != ""


def test_rows_that_do_not_add_up_are_refused_in_one_line():
    model = tiny("llama")
    halve = ("blocks.1.attn.hook_pattern", lambda pattern, hook: pattern * 0.5)
    with pytest.raises(LensBiasError, match=r"sum to as little as 0\.5 over the keys, and this model declares no learned sink") as err:
        measure(model, lens_bias.random_tokens(4, 8, 97), [Sinks()], interventions=[halve])
    assert "\n" not in str(err.value) and "blocks.1.attn.hook_pattern" in str(err.value)
    double = ("blocks.0.attn.hook_pattern", lambda pattern, hook: pattern * 2)
    with pytest.raises(LensBiasError, match=r"sum to up to 2 over the keys, more than a softmax can"):
        measure(model, lens_bias.random_tokens(4, 8, 97), [Sinks()], interventions=[double])


@bridge_only
def test_sliding_sink_k_counts_only_the_queries_that_see_key_k(gpt_oss):
    model, hf = gpt_oss
    result = measure(model, TOKENS, [Sinks(per_sequence=True)])["sinks"]
    with torch.no_grad():
        attentions = torch.stack(tiny_gpt_oss()(TOKENS, output_attentions=True).attentions, dim=1).double()  # [n, layer, head, T, T]
    assert torch.equal(attentions[0, 0, 0] > 0, window_mask(T, WINDOW))  # the model's own mask is the window read from its config
    # α_0 of the sliding layer: the mean over queries 0..W−1, the only ones that see key 0
    assert (result.alpha[:, 0, :, 0].double() - attentions[:, 0, :, :WINDOW, 0].mean(dim=-1)).abs().max() < 1e-6
    assert (result.alpha[:, 1, :, 0].double() - attentions[:, 1, :, :, 0].mean(dim=-1)).abs().max() < 1e-6
    assert sink_rate(attentions.float(), 0.05, windows=[WINDOW, None]).tolist() == pytest.approx(result.rate(0.05).tolist())
    assert "layer 0 slides (window 4): there Sink_k counts only the queries that can see key k" in result.summary()
    assert result.headline()["sliding_layers"] == [0]


def test_key_importance_in_a_window():
    pattern = window_mask(5, 2).float()
    pattern = pattern / pattern.sum(dim=-1, keepdim=True)
    # key 0 is seen by queries 0 (all of it) and 1 (half): α_0 = 0.75, not (1 + 0.5) / 5
    assert key_importance(pattern, 2).tolist() == pytest.approx([0.75, 0.5, 0.5, 0.5, 0.5])
    assert visible_queries(5, 2).tolist() == [2, 2, 2, 2, 1]


def _window_key(model_type: str) -> str | None:
    """The config field that sets a window, where this architecture's config takes one."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    params = inspect.signature(CONFIG_MAPPING[model_type].__init__).parameters
    return next((k for k in ("sliding_window", "window_size") if k in params), None)


@bridge_only
@pytest.mark.parametrize("model_type", [a for a in HF_ARCHITECTURES if a != "codegen" and _window_key(a)])
def test_the_window_read_from_the_config_is_the_mask_the_model_applies(model_type):
    """Every architecture of the matrix whose config takes a window, with a window of 4 under 10 tokens: the keys
    each query attends to (a pattern entry above 0) are those the window read from the config allows."""
    key = _window_key(model_type)
    saved = _EXTRA.get(model_type)
    _EXTRA[model_type] = {**(saved or {}), key: WINDOW}
    try:
        model = lens_bias.from_hf(tiny_hf(model_type))
    finally:
        _EXTRA.pop(model_type) if saved is None else _EXTRA.__setitem__(model_type, saved)
    windows = layer_windows(model, 2)
    patterns = {}
    with torch.no_grad():
        model.run_with_hooks(TOKENS[:1, :10], fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", lambda p, hook: patterns.__setitem__(hook.name, p))
                                                         for layer in range(2)])
    for layer in range(2):
        seen = patterns[f"blocks.{layer}.attn.hook_pattern"][0].gt(0).all(dim=0)
        assert torch.equal(seen, window_mask(10, windows[layer])), (model_type, layer, windows)


@pytest.mark.skipif(tl.tl_major() >= 4, reason="TL 3 configs name local attention in cfg.attn_types")
def test_tl3_local_attention_window_is_read_and_applied():
    HookedTransformer, HookedTransformerConfig = tl.hooked_transformer_classes()
    fields = dict(d_model=64, d_head=16, n_heads=4, n_layers=2, n_ctx=16, d_vocab=97, act_fn="gelu", attn_types=["local", "global"], window_size=WINDOW, seed=0)
    # TL 3 builds local attention only with use_local_attn: without it, attn_types alone leaves every layer global
    assert layer_windows(HookedTransformer(HookedTransformerConfig(**fields)), 2) == (None, None)
    model = HookedTransformer(HookedTransformerConfig(**fields, use_local_attn=True)).eval()
    assert layer_windows(model, 2) == (WINDOW, None)
    tokens = lens_bias.random_tokens(4, 10, 97)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    assert torch.equal(cache["blocks.0.attn.hook_pattern"][0].gt(0).all(dim=0), window_mask(10, WINDOW))
    result = measure(model, tokens, [Sinks(per_sequence=True)])["sinks"]
    assert (result.alpha[:, 0, :, 0] - cache["blocks.0.attn.hook_pattern"][:, :, :WINDOW, 0].mean(dim=-1)).abs().max() < 1e-6


@bridge_only
def test_uniform_attention_stays_inside_a_sliding_window(gpt_oss):
    """UniformAttention spreads each row over the keys the model lets it see: the window in a sliding layer."""
    from lens_bias.hooks import UniformAttention

    model, _ = gpt_oss
    patterns = {}
    with torch.no_grad(), intervene(model, UniformAttention()):
        model.run_with_hooks(TOKENS[:1], fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", lambda p, hook: patterns.__setitem__(hook.name, p.clone()))
                                                     for layer in range(2)])
    t = torch.arange(T)
    for layer, window in enumerate((WINDOW, None)):
        expected = window_mask(T, window).float() / torch.clamp(t + 1, max=window or T)[:, None]
        assert torch.allclose(patterns[f"blocks.{layer}.attn.hook_pattern"][0, 0], expected), layer
