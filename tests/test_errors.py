"""Errors that never hide a bug: the command line refuses in one line only what lens_bias refuses (a LensBiasError,
or the OS's and the memory's on the user's paths); a bare TypeError or ValueError from our own code keeps its
traceback; a figure that fails for any reason but a missing matplotlib fails the page; an edit whose output depends
on the batch gives the same numbers at every batch size; the extra views run only where they were asked for."""

from __future__ import annotations

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, intervene
from lens_bias.analyses.base import measure
from lens_bias.analyses.sink_attribution import sink_attribution
from lens_bias.analyses.sinks import Sinks
from lens_bias.cli import main
from lens_bias.core import figures
from lens_bias.core.errors import MissingExtra, WrongType
from lens_bias.hooks import AmplifyVariance, Intervention, MaskToSelf

from .conftest import tiny

ARGV = ["analyze", "--d-model", "16", "--n-layers", "1", "--n-heads", "2", "--d-vocab", "50", "--n-sequences", "3", "--seq-len", "6"]


@pytest.mark.parametrize("bug", [TypeError, ValueError])
def test_a_bug_in_our_code_keeps_its_traceback(bug, monkeypatch, capsys):
    def planted(self, adapter, kept, spec):
        raise bug("a bug in our own code")

    monkeypatch.setattr(Sinks, "finalize", planted)
    with pytest.raises(bug, match="a bug in our own code"):  # out of main: the interpreter prints it and exits 1
        main(ARGV)
    monkeypatch.setattr(Sinks, "finalize", lambda *a: (_ for _ in ()).throw(LensBiasError("a refusal")))
    assert main(ARGV) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "lens-bias analyze: error: a refusal"


def test_bad_arguments_are_lens_bias_errors_that_are_also_type_errors():
    with pytest.raises(WrongType, match="needs a TransformerLens model") as err:
        lens_bias.analyze(torch.nn.Linear(2, 2))
    assert isinstance(err.value, TypeError) and isinstance(err.value, LensBiasError)
    with pytest.raises(WrongType, match="unknown argument"):
        lens_bias.random_init("gpt2", colour="blue")


def test_only_a_missing_matplotlib_leaves_the_figures_out(monkeypatch, tmp_path):
    report = lens_bias.analyze(tiny("gpt2"), n_sequences=4, seq_len=8, sections=["sinks", "token_preference"], progress=False)

    def broken(self, **kwargs):
        raise RuntimeError("a figure's own bug")

    monkeypatch.setattr(type(report.sinks), "plot", broken)
    with pytest.raises(RuntimeError, match="a figure's own bug"):
        report.to_html(tmp_path / "a.html")
    monkeypatch.undo()

    def no_matplotlib(*args, **kwargs):
        raise MissingExtra('plots need matplotlib: pip install "lens-bias[plot]"')

    monkeypatch.setattr(figures, "new_figure", no_matplotlib)
    for module in ("lens_bias.analyses.sinks", "lens_bias.analyses.token_preference"):
        monkeypatch.setattr(f"{module}.new_figure", no_matplotlib, raising=False)
    page = report.to_html(tmp_path / "b.html").read_text()
    assert "<img" not in page and "Attention sinks" in page


@pytest.mark.parametrize("batch_size", [1, 2, 7, None])
def test_amplify_variance_gives_the_same_numbers_at_every_batch_size(batch_size):
    """μ is taken once over the inputs, layer by layer: every split equals one batch of all 14 sequences, which is
    what the edit inside intervene() computes on that one batch."""
    model = tiny("llama")
    tokens = lens_bias.random_tokens(14, 12, 97, seed=1)
    edit = AmplifyVariance(position=5, factor=8.0)
    split = measure(model, tokens, [Sinks(per_sequence=True)], interventions=[edit], batch_size=batch_size)["sinks"].alpha
    with torch.no_grad(), intervene(model, edit):  # the batch mean of the whole set at once, by hand
        _, cache = model.run_with_cache(tokens)
    by_hand = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"] for layer in range(2)], dim=1)  # [n, L, H, T, T]
    from lens_bias.analyses.sinks import key_importance

    assert (split - key_importance(by_hand)).abs().max() < 1e-5
    ppl = lens_bias.perplexity(model, tokens, interventions=[edit], batch_size=batch_size)
    assert ppl == pytest.approx(lens_bias.perplexity(model, tokens, interventions=[edit], batch_size=14), rel=1e-6)
    fixed = edit.fixed_for(model, tokens)
    assert len(fixed.mean) == 2 and Intervention.from_dict(fixed.to_dict()) == fixed


def test_amplify_variance_composed_is_fixed_with_the_other_edits_attached():
    model = tiny("llama")
    tokens = lens_bias.random_tokens(6, 12, 97, seed=2)
    edits = [MaskToSelf(position=3) + AmplifyVariance(position=5, factor=4.0)]
    one = sink_attribution(model, tokens, calibration=tokens, conditions={"both": edits}, batch_size=1)
    all_ = sink_attribution(model, tokens, calibration=tokens, conditions={"both": edits}, batch_size=6)
    assert torch.allclose(one.sink_rate_head, all_.sink_rate_head) and one.perplexity == pytest.approx(all_.perplexity, rel=1e-6)


def test_a_report_under_a_users_edit_runs_only_the_passes_of_its_sections():
    """The reported failure: AmplifyVariance attached by the user, sinks of a trained model asked for; the sink heads'
    pass of one sequence (which AmplifyVariance cannot centre) is a view nobody asked for, so it does not run."""
    model = tiny("llama")
    tokens = lens_bias.random_tokens(8, 16, 97, seed=3)
    with intervene(model, AmplifyVariance(position=10, factor=8.0)):
        report = lens_bias.analyze(model, inputs=tokens, sections=["sinks"], batch_size=8, regime="trained", progress=False)
    assert list(report.sections) == ["sinks"]
    asked = lens_bias.analyze(model, inputs=tokens, sections=["sinks", "sink_heads"], regime="trained", progress=False)
    assert list(asked.sections) == ["sinks", "sink_heads"]
    assert "sink_heads" in lens_bias.analyze(model, inputs=tokens, regime="trained", progress=False).sections
    with pytest.raises(LensBiasError, match="ask for sections"):
        lens_bias.analyze(model, inputs=tokens, sections=["sink_heads"], regime="trained", progress=False)


@pytest.mark.slow
def test_every_intervention_under_analyze_and_sink_attribution_on_smollm2(smollm2):
    """Each intervention of the registry on the real model: a result with numbers, or a one-line refusal."""
    from lens_bias.hooks.base import INTERVENTIONS

    from .architecture_matrix import INTERVENTION_CELLS

    tokens = lens_bias.text_tokens(smollm2.tokenizer, 4, 16, seed=4)
    interventions = {**INTERVENTION_CELLS, "RemoveWeights": lens_bias.hooks.RemoveWeights(weights=((11, 507, 1229), (3, 1, 2))),
                     "Compose": MaskToSelf(position=4) + AmplifyVariance(position=6)}
    assert {type(iv).__name__ for iv in interventions.values()} == set(INTERVENTIONS)
    outcomes = {}
    for name, iv in interventions.items():
        try:
            report = lens_bias.analyze(smollm2, inputs=tokens, sections=["sinks", "token_preference"], interventions=[iv], progress=False)
            assert not report.sinks.to_pandas().select_dtypes("number").isna().to_numpy().any(), name
            outcomes[name] = "result"
        except LensBiasError as err:
            assert "\n" not in str(err), (name, str(err))
            outcomes[name] = f"refused: {err}"
    # the accepted ones as the conditions of one attribution (the unedited model measured once)
    accepted = {name: [iv] for name, iv in interventions.items() if outcomes[name] == "result"}
    result = sink_attribution(smollm2, tokens, calibration=tokens, conditions=accepted, position=8)
    assert result.conditions == ["unedited", *accepted] and all(p > 0 for p in result.perplexity)
    assert not result.to_pandas().select_dtypes("number").isna().to_numpy().any()
    # the edits SmolLM2 has the hooks for act on it; the per-expert and learned-sink edits are refused
    refused = sorted(name for name, outcome in outcomes.items() if outcome != "result")
    assert refused == ["RemoveLearnedSinks", "RemoveWeight(expert=0)", "SubtractPositionEmbedding"], outcomes
