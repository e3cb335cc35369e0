"""analyze(): the report, its tables, clean-up of the user's model, and clear errors for bad input."""

import json

import pandas as pd
import pytest
import torch

import lens_bias
from lens_bias import LensBiasError

from ..conftest import BACKEND, assert_same_state, hook_snapshot, shared_tiny, state_copy, warmed_snapshot


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
def test_analyze_report_and_model_left_unchanged(arch):
    model = shared_tiny(arch, act_fn="relu")
    before_hooks, before_state = warmed_snapshot(model), state_copy(model)
    report = lens_bias.analyze(model, n_sequences=12, seq_len=8, progress=False)
    assert hook_snapshot(model) == before_hooks
    assert_same_state(model, before_state)
    assert report.model.family == BACKEND
    assert report.inputs == lens_bias.extend.InputSpec("tokens", 12, 8, 42, 97)
    assert isinstance(report.token_preference.to_pandas(), pd.DataFrame)
    assert len(report.token_preference.to_pandas()) == 20
    assert len(report.contraction.to_pandas()) == 2 + 2  # embed, 2 blocks, final
    text = str(report)
    assert "token preference" in text and "contraction" in text and f"V {97}" in text
    json.dumps(report.to_dict())  # JSON-ready


def test_analyze_reproduces_random_tokens_by_hand():
    model = shared_tiny("gpt2")
    a = lens_bias.analyze(model, n_sequences=6, seq_len=5, seed=3, progress=False)
    b = lens_bias.analyze(model, inputs=lens_bias.random_tokens(6, 5, 97, seed=3), progress=False)
    assert torch.equal(a.token_preference.p_bar, b.token_preference.p_bar)
    c = lens_bias.analyze(model, n_sequences=6, seq_len=5, seed=4, progress=False)
    assert not torch.equal(a.token_preference.p_bar, c.token_preference.p_bar)


def test_sections_and_embedding_inputs():
    model = shared_tiny("gpt2")
    report = lens_bias.analyze(model, inputs="embeddings", n_sequences=4, seq_len=6, sections=["contraction"], progress=False)
    assert report.token_preference is None and report.contraction is not None
    assert report.inputs.kind == "embeddings" and list(report.sections) == ["contraction"]


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(seq_len=33), LensBiasError, "n_ctx=32"),
        (dict(n_sequences=1), LensBiasError, "at least 2 sequences"),
        (dict(seq_len=1), LensBiasError, "seq_len >= 2"),
        (dict(inputs="words"), LensBiasError, "'tokens', 'text', 'embeddings'"),
        (dict(inputs=torch.full((3, 4), 500)), LensBiasError, "d_vocab=97"),
        (dict(sections=["sink"]), LensBiasError, "unknown section"),
        (dict(device="meta"), LensBiasError, "never moves your model"),
        (dict(batch_size=0), LensBiasError, "batch_size"),
    ],
)
def test_bad_input_gets_a_clear_error_and_leaves_the_model_alone(kwargs, error, message):
    model = shared_tiny("gpt2")
    before_hooks, before_state = warmed_snapshot(model), state_copy(model)
    kwargs = {"n_sequences": 4, "seq_len": 8, "progress": False, **kwargs}
    with pytest.raises(error, match=message):
        lens_bias.analyze(model, **kwargs)
    assert hook_snapshot(model) == before_hooks
    assert_same_state(model, before_state)


def test_plain_module_is_refused():
    with pytest.raises(TypeError, match="TransformerBridge"):
        lens_bias.analyze(torch.nn.Sequential(torch.nn.Embedding(10, 4)))


def test_decomposition_and_ablation_sections():
    model = shared_tiny("llama")
    report = lens_bias.analyze(model, [..., "ablations"], n_sequences=8, seq_len=8, progress=False)
    components = list(report.decomposition.to_pandas().component)
    assert components == ["embed", "attn_0", "mlp_0", "attn_1", "mlp_1"]  # rotary: no position table
    assert report.decomposition.reconstruction_error < 1e-4
    conditions = set(report.ablations.to_pandas().condition)
    assert {"base", "odd_mlp", "self_only_attention", "odd_mlp+self_only_attention", "act=tanh"} <= conditions
    # the ablation's base condition is the report's own measurement
    assert report.ablations.final().loc["base", "inter"] == pytest.approx(report.contraction.inter[-1].item(), abs=1e-6)
    assert "ablations" in str(report) and "residual decomposition" in str(report)
    json.dumps(report.to_dict())


def test_analyze_and_ablate_record_their_interventions_as_to_dict():
    from lens_bias.hooks import Intervention, OddActivation, SelfOnlyAttention, intervene

    model = shared_tiny("gpt2", act_fn="relu")
    tokens = lens_bias.random_tokens(8, 8, 97, seed=1)
    iv = OddActivation(layers=[1])
    report = lens_bias.analyze(model, inputs=tokens, interventions=[iv], sections=["token_preference"], progress=False)
    assert report.to_dict()["interventions"] == [{"type": "OddActivation", "layers": [1]}]
    assert [Intervention.from_dict(d) for d in report.interventions] == [iv]
    assert "measured under: OddActivation" in str(report)
    with torch.no_grad(), intervene(model, iv):
        logits = model(tokens)[:, -1]
    assert torch.allclose(report.token_preference.p_bar, logits.double().softmax(-1).mean(0), atol=1e-6)
    assert lens_bias.analyze(model, inputs=tokens, sections=["token_preference"], progress=False).interventions == []
    named = lens_bias.ablate(model, conditions=["base", "odd_mlp+self_only_attention"], inputs=tokens, progress=False)
    assert named.conditions == {"base": [], "odd_mlp+self_only_attention": [OddActivation().to_dict(), SelfOnlyAttention().to_dict()]}
    own = lens_bias.ablate(model, conditions={"odd@1": [iv]}, inputs=tokens, progress=False)
    assert own.conditions == {"odd@1": [iv.to_dict()]}
    assert own.final().loc["odd@1", "inter"] == pytest.approx(
        lens_bias.analyze(model, inputs=tokens, interventions=[iv], sections=["contraction"], progress=False).contraction.inter[-1].item(), abs=1e-6)
    with pytest.raises(LensBiasError, match="the ablations run their own edits"):
        lens_bias.analyze(model, [..., "ablations"], inputs=tokens, interventions=[iv], progress=False)


def test_the_regime_orders_the_report_and_picks_its_laws(tmp_path):
    model = shared_tiny("llama")
    init = lens_bias.analyze(model, n_sequences=8, seq_len=8, progress=False)
    assert init.model.regime == "init" and list(init.sections)[:2] == ["token_preference", "contraction"]
    assert "t^-1/2 law" in init.positional_variance.summary() and "law_deviation_layer0" in init.positional_variance.headline()
    assert init.anatomy() is not None and "anatomy" not in str(init)  # an init's report does not open with it
    trained = lens_bias.analyze(model, n_sequences=8, seq_len=8, progress=False, regime="trained")
    assert trained.model.regime == "trained"
    assert list(trained.sections)[:4] == ["sinks", "massive_activations", "super_weights", "super_neurons"]
    # a trained model's report also shows its strongest sink heads (one short pass on the first sequence)
    assert list(trained.sections)[-2:] == ["fingerprint", "sink_heads"] and set(trained.sections) == set(init.sections) | {"sink_heads"}
    assert "law" not in trained.positional_variance.headline().__repr__() and "the init law does not apply" in str(trained)
    text = str(trained)
    assert text.index("anatomy of the first-token sink") < text.index("attention sinks") < text.index("token preference")
    # the anatomy has its own block: the headline table holds the other numbers that apply to a trained model, once
    assert not {"Anatomy of the sink", "Massive activations", "Super weights", "Token preference"} & {row[0] for row in trained.headline_table()}
    # and a random init's only what means something at init: no super-weight candidate below Yu et al.'s rule
    assert {row[0] for row in init.headline_table()} >= {"Token preference", "Contraction", "Massive activations"}
    assert "Super weights" not in {row[0] for row in init.headline_table()} and init.super_weights.input_max.max() < 50
    page = trained.to_html(tmp_path / "trained.html").read_text()
    # the page and the text name the model: a random init by its spec, which parse_model_spec reads back
    name = f"random init {model.lens_bias_spec.text}"
    assert f"<title>lens_bias report: {name}</title>" in page and f"model: {name}" in str(trained)
    assert lens_bias.models.parse_model_spec(model.lens_bias_spec.text) == model.lens_bias_spec
    assert page.index("<h2>Anatomy of the sink</h2>") < page.index("<h2>Attention sinks</h2>") < page.index("<h2>Token preference</h2>")
    with pytest.raises(LensBiasError, match="regime must be one of"):
        lens_bias.analyze(model, n_sequences=8, seq_len=8, progress=False, regime="pretrained")


def test_the_anatomy_reads_the_sections_it_names():
    model = shared_tiny("llama")
    report = lens_bias.analyze(model, n_sequences=8, seq_len=8, progress=False)
    anatomy = report.anatomy()
    sinks, neurons, weights = report.sinks, report.super_neurons, report.super_weights
    assert anatomy.sink_rate == pytest.approx(sinks.rate()[0].item())
    assert anatomy.massive_dims == [neurons.massive_dim]  # no activation is massive at init: the largest dim, named as such
    assert anatomy.massive_value == pytest.approx(neurons.resid_at[:, neurons.massive_dim].max().item())
    # nothing passes the papers' rules at init: no claim, only the largest value seen
    spike = torch.minimum(weights.input_max, weights.output_max).max().item()
    assert spike < 50 and anatomy.largest_spike == pytest.approx(spike) and anatomy.super_weights == [] and anatomy.super_neuron == {}
    table = anatomy.to_pandas().set_index("link")
    assert table.loc["super weight", "where"] == "none found by Yu et al.'s spike rule" and f"{spike:.3g}" in table.loc["super weight", "measured"]
    assert table.loc["massive dims", "where"] == "none found by Sun et al.'s rule" and anatomy.headline()["massive_dims"] == []
    assert table.loc["super neuron", "where"] == "none found: no massive dim to write into"
    assert anatomy.disparity == pytest.approx(neurons.dominance_at.max().item()) and anatomy.chain == []
    assert type(anatomy).from_dict(json.loads(json.dumps(anatomy.to_dict()))) == anatomy
    assert lens_bias.analyze(model, n_sequences=8, seq_len=8, sections=["sinks"], progress=False).anatomy() is None


def test_attribution_joins_the_report_and_its_anatomy():
    model = shared_tiny("llama")
    report = lens_bias.analyze(model, [..., "sink_attribution"], n_sequences=8, seq_len=12, progress=False, regime="trained")
    attribution = report.sink_attribution
    assert attribution.n == 4 and attribution.conditions[0] == "unedited"  # the even rows measured, the odd ones calibrate
    assert report.anatomy().chain == attribution.chain().to_dict(orient="records")
    assert "what removes it (sink_attribution" in str(report)
    with pytest.raises(LensBiasError, match="token inputs"):
        lens_bias.analyze(model, [..., "sink_attribution"], inputs="embeddings", n_sequences=8, seq_len=12, progress=False)
