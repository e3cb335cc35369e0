"""Sections register themselves: a new measurement is one file, and every result goes to JSON and back exactly."""

import json
import math
from dataclasses import fields

import pandas as pd
import pytest
import torch

import lens_bias
from lens_bias import BiasReport, LensBiasError
from lens_bias.core.serialise import from_jsonable, to_jsonable
from lens_bias.extend import SECTIONS, Result

from ..conftest import shared_tiny


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
        "dtype": torch.bfloat16,  # a settings object's
    }
    back = from_jsonable(json.loads(json.dumps(to_jsonable(value))))
    assert_same(value, back)
    with pytest.raises(LensBiasError, match="cannot write a set"):
        to_jsonable({1, 2})
    with pytest.raises(LensBiasError, match="unknown dtype 'nope'"):
        from_jsonable({"__tensor__": "nope", "shape": [1], "data": [0]})


def test_every_section_round_trips_through_json():
    report = lens_bias.analyze(shared_tiny("gpt2", act_fn="relu"), [..., "ablations"], n_sequences=8, seq_len=8, progress=False)
    assert report.skipped.keys() == {"super_experts"}  # a dense model: test_super_experts round-trips that section on a mixture
    assert list(report.sections) == [*(s for s in SECTIONS if s != "super_experts"), "ablations"]
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
    report = lens_bias.analyze(shared_tiny("gpt2"), n_sequences=4, seq_len=6, sections=["sinks"], progress=False)
    assert report.sinks is report.sections["sinks"] and report.contraction is None and report.ablations is None
    with pytest.raises(AttributeError, match="no attribute or section 'sink'.*computed: \\['sinks'\\]"):
        report.sink


def test_sections_by_class_are_typed_and_each_result_names_its_own_columns():
    from lens_bias.analyses.contraction import Contraction
    from lens_bias.analyses.sinks import Sinks, SinksResult
    from lens_bias.report.layout import Layout
    from lens_bias.report.page import ROW_WORDS

    report = lens_bias.analyze(shared_tiny("llama"), [..., "ablations", "sink_attribution"], n_sequences=8, seq_len=12, regime="trained", progress=False)
    assert isinstance(report.of(Sinks), SinksResult) and report.of(Sinks) is report.sinks and report.find(Contraction) is report.contraction
    only = lens_bias.analyze(shared_tiny("llama"), n_sequences=4, seq_len=6, sections=["sinks"], progress=False)
    assert only.find(Contraction) is None
    with pytest.raises(KeyError):
        only.of(Contraction)
    # every measured column reads in words from its own result: the page keeps no glossary of the sections' columns
    naming = {"layer", "head", "rank", "position", "dim", "sequence", "condition", "hook", "component", "expert", *ROW_WORDS}
    for name, result in report.sections.items():
        unnamed = [c for c in result.to_pandas().columns if c not in naming and result.column_in_words(c) is None and "_" in c]
        assert not unnamed, (name, unnamed)
    assert report.of(Sinks).column_in_words("sink_rate_3") == "Sink_3 (% of sequences, α > ε)"
    assert report.layout == Layout("trained") and report.layout.first == ("sink_attribution", "sink_heads")
    assert str(report).startswith("lens_bias report of a trained model") and not str(only).startswith("lens_bias report of a trained")
    with pytest.raises(LensBiasError, match="regime must be one of"):
        lens_bias.analyze(shared_tiny("llama"), n_sequences=4, seq_len=6, regime="fresh", progress=False)
