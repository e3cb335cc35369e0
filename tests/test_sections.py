"""Sections register themselves: a new measurement is one file, and every result goes to JSON and back exactly."""

import json
import math
from dataclasses import dataclass, fields
from typing import ClassVar

import pandas as pd
import pytest
import torch

import lens_bias
from lens_bias import SECTIONS, Analysis, BiasReport, LensBiasError, Probe, Result
from lens_bias._jsonable import from_jsonable, to_jsonable

from .conftest import tiny


def assert_same(a, b, where="result"):
    """Equal to the last bit: tensors in dtype, shape and value (NaN where NaN), frames cell by cell."""
    assert type(a) is type(b), where
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=where)
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    elif isinstance(a, Result):
        for f in fields(a):
            assert_same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b), where
    else:
        assert a == b, where


def test_tensors_and_frames_survive_json_exactly():
    value = {
        "f32": torch.tensor([[1 / 3, float("nan")], [float("inf"), -0.0]]),
        "f64": torch.tensor([math.pi, 1e-300], dtype=torch.float64),
        "bf16": torch.tensor([1 / 3, 300.5], dtype=torch.bfloat16),
        "long": torch.arange(6).reshape(1, 2, 3),
        "bool": torch.tensor([True, False]),
        "empty": torch.zeros(0, 5),
        "scalar": torch.tensor(2.5),
        "frame": pd.DataFrame({"layer": ["embed", "0"], "inter": [0.1 + 0.2, 1e-9]}),
        "plain": [1, "a", None, {"x": 2.0}],
    }
    back = from_jsonable(json.loads(json.dumps(to_jsonable(value))))
    assert_same(value, back)
    with pytest.raises(LensBiasError, match="cannot write a set"):
        to_jsonable({1, 2})
    with pytest.raises(LensBiasError, match="unknown tensor dtype 'nope'"):
        from_jsonable({"__tensor__": "nope", "shape": [1], "data": [0]})


def test_every_section_round_trips_through_json():
    report = lens_bias.analyze(tiny("gpt2", act_fn="relu"), n_sequences=8, seq_len=8, ablations=True, progress=False)
    assert list(report.sections) == [*SECTIONS, "ablations"]
    for name, result in report.sections.items():
        assert_same(result, type(result).from_dict(json.loads(json.dumps(result.to_dict()))), name)
    data = json.loads(json.dumps(report.to_dict()))
    back = BiasReport.from_dict(data)
    assert back.model == report.model and back.inputs == report.inputs and list(back.sections) == list(report.sections)
    for name in report.sections:
        assert_same(report.sections[name], back.sections[name], name)
    assert str(back) == str(report) and back.headline_table() == report.headline_table()
    summary = report.to_dict(results=False)  # what `lens-bias analyze --json` prints: headlines and tables only
    assert "result" not in summary["sections"]["sinks"] and summary["sections"]["sinks"] == {k: v for k, v in data["sections"]["sinks"].items() if k != "result"}
    with pytest.raises(LensBiasError, match="to_dict\\(results=True\\)"):
        BiasReport.from_dict(summary)
    with pytest.raises(LensBiasError, match="unknown section 'nope'"):
        BiasReport.from_dict({**data, "sections": {"nope": {}}})
    with pytest.raises(LensBiasError, match="missing field"):
        type(report.sinks).from_dict({"eps": 0.3})


def test_sections_by_attribute():
    report = lens_bias.analyze(tiny("gpt2"), n_sequences=4, seq_len=6, sections=["sinks"], progress=False)
    assert report.sinks is report.sections["sinks"] and report.contraction is None and report.ablations is None
    with pytest.raises(AttributeError, match="no attribute or section 'sink'.*computed: \\['sinks'\\]"):
        report.sink


def plot_norms(result):
    from matplotlib.figure import Figure

    fig = Figure()
    fig.subplots().plot(result.norms.numpy())
    return fig


@dataclass
class ResidNormResult(Result):
    """Mean ‖h‖ of each block's output."""

    norms: torch.Tensor  # [layer]

    heading = "Residual norm"
    headline_labels = {"final_norm": "mean ‖h‖, last block"}
    plot_fn, plot_caption = plot_norms, "mean ‖h‖ per layer"

    def to_pandas(self):
        return pd.DataFrame({"layer": range(len(self.norms)), "norm": self.norms.tolist()})

    def headline(self):
        return {"final_norm": self.norms[-1].item()}

    def summary(self):
        return "residual norm per block: " + ", ".join(f"{v:.3f}" for v in self.norms.tolist())


@pytest.fixture
def resid_norm():
    """One file's worth: a result and an analysis defined in this test; registered for the test only."""

    def norm(x):  # [batch, pos, d] -> [batch]: mean ‖h‖ over positions
        return x.norm(dim=-1).mean(dim=1)

    @dataclass(frozen=True)
    class ResidNorm(Analysis):
        name: ClassVar[str] = "resid_norm"
        result_type = ResidNormResult

        def applies_to(self, info):
            return not info.attn_only

        def probes(self, adapter):
            return {layer: Probe(f"blocks.{layer}.hook_resid_post", "mean_norm", norm) for layer in range(adapter.info.n_layers)}

        def finalize(self, adapter, kept, spec):
            return ResidNormResult(norms=torch.stack([kept[layer].mean() for layer in range(adapter.info.n_layers)]))

    try:
        yield ResidNorm
    finally:
        SECTIONS.pop("resid_norm")


def test_a_new_analysis_is_one_definition(resid_norm, tmp_path):
    assert list(SECTIONS)[-1] == "resid_norm" and lens_bias.report.SECTIONS is SECTIONS
    model = tiny("llama")
    tokens = lens_bias.random_tokens(8, 8, 97, seed=0)
    report = lens_bias.analyze(model, inputs=tokens, sections=["contraction", "resid_norm"], progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    direct = torch.stack([cache[f"blocks.{layer}.hook_resid_post"].norm(dim=-1).mean() for layer in range(2)])
    assert torch.allclose(report.resid_norm.norms, direct, rtol=1e-5)
    assert list(report.sections) == ["contraction", "resid_norm"]
    assert ("Residual norm", "mean ‖h‖, last block", f"{direct[-1].item():.4g}") in report.headline_table()
    assert list(report.figures()) == ["contraction per layer", "mean ‖h‖ per layer"]
    assert "residual norm per block" in str(report) and "<h2>Residual norm</h2>" in report.to_html(tmp_path / "r.html").read_text()
    assert_same(report.resid_norm, BiasReport.from_dict(json.loads(json.dumps(report.to_dict()))).resid_norm)
    # in the default set, last (order 100); not for a model its applies_to refuses
    assert list(lens_bias.analyze(model, inputs=tokens, progress=False).sections)[-1] == "resid_norm"
    attn_only = tiny("gpt2", attn_only=True)
    assert "resid_norm" not in lens_bias.analyze(attn_only, inputs=tokens, progress=False).sections
    with pytest.raises(LensBiasError, match="do not apply to this attention-only"):
        lens_bias.analyze(attn_only, inputs=tokens, sections=["resid_norm"], progress=False)


def test_a_second_analysis_may_not_take_a_name():
    before = dict(SECTIONS)
    with pytest.raises(LensBiasError, match="an analysis named 'contraction' already exists"):

        @dataclass(frozen=True)
        class Contraction(Analysis):
            name: ClassVar[str] = "contraction"

    with pytest.raises(LensBiasError, match="Untyped sets no result_type"):

        @dataclass(frozen=True)
        class Untyped(Analysis):
            name: ClassVar[str] = "untyped"

    assert SECTIONS == before
