"""``analyze``'s run plan: built once, read by every pass; sections and passes as objects or names; run options in
an ``AnalyzeSettings``; one adapter per call; the old spellings warn and give the same numbers."""

from __future__ import annotations

import copy

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError
from lens_bias.analyses.ablation import Ablations
from lens_bias.analyses.base import SECTIONS
from lens_bias.analyses.plan import PASSES, AnalyzeSettings
from lens_bias.analyses.sinks import Sinks
from lens_bias.analyses.token_preference import TokenPreference
from lens_bias.core import adapter as adapter_module
from lens_bias.core.adapter import ModelAdapter, shared_adapters
from lens_bias.core.errors import WrongType
from lens_bias.report.bias_report import plan_run
from lens_bias.report.layout import Layout

from ..conftest import assert_same_state, shared_tiny, state_copy


def test_the_plan_holds_each_sections_probes_in_report_order_and_the_inputs_kind():
    model = shared_tiny("llama")
    plan = plan_run(model, None, AnalyzeSettings(n_sequences=4, seq_len=8, regime="trained"))
    names = [p.analysis.name for p in plan.sections]
    assert names == Layout("trained").section_order([n for n in SECTIONS if n not in plan.skipped])
    adapter = ModelAdapter(model)
    for planned in plan.sections:  # the probes the pass will read are the analysis' own, asked for once
        assert {k: p.key for k, p in planned.probes.items()} == {k: p.key for k, p in planned.analysis.probes(adapter).items()}
    assert [p.name for p in plan.passes] == ["sink_heads"] and plan.regime == "trained" and plan.spec.kind == "tokens"
    assert torch.equal(plan.tokens, lens_bias.random_tokens(4, 8, 97))
    embedded = plan_run(model, ["contraction"], AnalyzeSettings(inputs="embeddings", n_sequences=4, seq_len=8))
    assert embedded.spec.kind == "embeddings" and embedded.tokens is None and embedded.passes == [] and embedded.regime == "init"


def test_a_section_object_carries_its_own_settings():
    model = shared_tiny("gpt2")
    by_name = lens_bias.analyze(model, ["token_preference"], n_sequences=8, seq_len=8, progress=False).token_preference
    top5 = lens_bias.analyze(model, [TokenPreference(top_k=5)], n_sequences=8, seq_len=8, progress=False).token_preference
    assert len(top5.to_pandas()) == 5 < len(by_name.to_pandas())
    assert torch.equal(top5.p_bar, by_name.p_bar)
    # p̄ of the model's own softmax at the last position, with the top 5 in its order
    logits = model(lens_bias.random_tokens(8, 8, 97))[:, -1].double()
    p_bar = logits.softmax(-1).mean(0)
    assert torch.allclose(top5.p_bar, p_bar, atol=1e-6)
    assert list(top5.to_pandas().token) == p_bar.topk(5).indices.tolist()


def test_settings_and_keywords_are_one_spelling():
    model = shared_tiny("gpt2")
    settings = AnalyzeSettings(n_sequences=8, seq_len=8, seed=3)
    assert AnalyzeSettings.from_dict(settings.to_dict()) == settings
    a = lens_bias.analyze(model, ["contraction"], settings, progress=False)
    b = lens_bias.analyze(model, ["contraction"], n_sequences=8, seq_len=8, seed=3, progress=False)
    c = lens_bias.analyze(model, ["contraction"], AnalyzeSettings(n_sequences=8, seq_len=99, seed=3), seq_len=8, progress=False)
    assert torch.equal(a.contraction.inter, b.contraction.inter) and torch.equal(a.contraction.inter, c.contraction.inter)
    with pytest.raises(WrongType, match="n_sequence") as err:
        lens_bias.analyze(model, n_sequence=8)
    assert "\n" not in str(err.value)


def test_the_default_report_and_the_ellipsis_are_one_set():
    model = shared_tiny("llama")
    plain = lens_bias.analyze(model, n_sequences=6, seq_len=8, regime="trained", progress=False)
    more = lens_bias.analyze(model, [..., "ablations"], n_sequences=6, seq_len=8, regime="trained", progress=False)
    assert set(more.sections) == {*plain.sections, "ablations"} and more.skipped == plain.skipped
    direct = lens_bias.ablate(model, n_sequences=6, seq_len=8, progress=False)
    assert more.ablations.to_pandas().equals(direct.to_pandas())  # the pass is ablate itself, on the same inputs
    assert torch.equal(more.sinks.alpha_mean, plain.sinks.alpha_mean)


def test_the_old_spellings_warn_and_give_the_same_report():
    model = shared_tiny("llama")
    new = lens_bias.analyze(model, [..., "ablations", "sink_attribution"], n_sequences=8, seq_len=12, regime="trained", progress=False)
    with pytest.warns(DeprecationWarning, match=r'sections=\[\.\.\., "ablations"\]'):
        old = lens_bias.analyze(model, n_sequences=8, seq_len=12, regime="trained", ablations=True, attribution=True, progress=False)
    assert list(old.sections) == list(new.sections)
    assert old.ablations.to_pandas().equals(new.ablations.to_pandas())
    assert torch.equal(old.sink_attribution.sink_rate, new.sink_attribution.sink_rate)
    with pytest.warns(DeprecationWarning, match="SinkAttribution"):
        reused = lens_bias.analyze(model, n_sequences=8, seq_len=12, regime="trained", attribution=new.sink_attribution, progress=False)
    assert reused.sink_attribution is new.sink_attribution


def test_one_adapter_per_call_and_the_regime_override_stays_inside_it(monkeypatch):
    model = shared_tiny("llama")
    before = state_copy(model)
    reads = []
    real = adapter_module.read_model_info
    monkeypatch.setattr(adapter_module, "read_model_info", lambda m: reads.append(m) or real(m))
    report = lens_bias.analyze(model, [..., "ablations", "sink_attribution"], n_sequences=8, seq_len=12, regime="trained", progress=False)
    assert {"ablations", "sink_attribution", "sink_heads"} <= set(report.sections)
    assert len(reads) == 1  # ablate, sink_attribution, sink_heads and every intervention's hooks shared it
    reads.clear()
    lens_bias.ablate(model, n_sequences=4, seq_len=8, progress=False)
    assert len(reads) == 1
    reads.clear()
    ModelAdapter.of(model), ModelAdapter.of(model)  # outside a call: one each
    assert len(reads) == 2
    with shared_adapters():
        outer = ModelAdapter.of(model)
        assert outer.info.regime == "init"  # analyze's "trained" did not leak out of its call
        stand_in = copy.copy(outer)
        with shared_adapters({id(model): stand_in}):
            assert ModelAdapter.of(model) is stand_in
        assert ModelAdapter.of(model) is outer
    assert_same_state(model, before)


def test_bad_section_lists_get_one_line():
    model = shared_tiny("gpt2")
    cases = [
        (["sinks", Sinks()], LensBiasError, "named twice"),
        (["nope"], LensBiasError, "unknown section 'nope'"),
        (["sink_heads"], LensBiasError, "sink_heads view shows the heads the sinks section ranks"),
        ("sinks", WrongType, "a list of names"),
        ([3], WrongType, "a name, an Analysis"),
        (["super_experts"], LensBiasError, "cannot run on this model"),
    ]
    for sections, kind, words in cases:
        with pytest.raises(kind, match=words) as err:
            lens_bias.analyze(model, sections, n_sequences=4, seq_len=8, progress=False)
        assert "\n" not in str(err.value)
    with pytest.raises(LensBiasError, match="the ablations run their own edits"):
        plan_run(model, [Ablations()], AnalyzeSettings(n_sequences=4, seq_len=8), interventions=[lens_bias.hooks.UniformAttention()])


def test_every_pass_is_registered_with_its_result_type():
    assert list(PASSES) == ["ablations", "sink_attribution", "sink_heads"]  # in the order they run
    assert all(PASSES[name].result_type.__name__.endswith("Result") for name in PASSES)
    assert not set(PASSES) & set(SECTIONS)
