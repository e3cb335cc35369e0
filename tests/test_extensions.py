"""Every kind of extension is one file: a throwaway analysis, null and experiment, each written to a file of its
own and imported, are picked up by everything that lists their kind (the report, the lineage test and calibration,
the command line), and each kind's registry refuses a second definition under a taken name."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import pathlib
import sys
import textwrap

import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, seedprint
from lens_bias.analyses.base import SECTIONS
from lens_bias.cli import build_parser, main
from lens_bias.experiments.base import EXPERIMENTS

from .conftest import shared_tiny

CONTRIBUTING = pathlib.Path(__file__).parents[1] / "docs" / "contributing.md"


def _walkthrough(heading: str) -> str:
    """The first python block under ``heading`` in the contributing guide: the walk-through runs as it is written."""
    text = CONTRIBUTING.read_text().split(f"\n{heading}\n", 1)[1]
    return text.split("```python\n", 1)[1].split("\n```", 1)[0]


ANALYSIS = _walkthrough("## Add an analysis")

NULL = '''
"""A null that judges τ̄ against a fixed normal N(0, sd²): a SeedPrint null in one file."""
import math
from dataclasses import dataclass
from typing import ClassVar

from scipy.stats import norm

from lens_bias.seedprint.nulls import Judgement, Null


@dataclass(frozen=True)
class FixedNormalNull(Null):
    sd: float = 0.01
    label: str = "fixed normal"
    kind: ClassVar[str] = "fixed-normal"

    def judge(self, case):
        z = case.statistic.tau_bar / self.sd
        return Judgement(float(norm.logsf(z)), z, {"sd": self.sd})
'''

EXPERIMENT = '''
"""Count the parameters of a random init: an experiment in one file."""
from dataclasses import dataclass

from lens_bias.core.serialise import Serialisable
from lens_bias.experiments.base import Experiment, Outcome
from lens_bias.models import random_init


@dataclass(frozen=True)
class CountConfig(Serialisable):
    d_model: int = 32  # the init's width
    n_layers: int = 1


class CountParameters(Experiment):
    name = "count-parameters"
    help = "the number of parameters of a small random-init llama"
    config_type = CountConfig
    presets = {"default": CountConfig(), "wide": CountConfig(d_model=64)}

    def add_arguments(self, parser):
        parser.add_argument("--exit-1", action="store_true", help="report a failed check")

    def run(self, config, args):
        model = random_init("llama", d_model=config.d_model, n_layers=config.n_layers, n_heads=4, d_vocab=50, n_ctx=8)
        count = sum(p.numel() for p in model.parameters())
        if args.out:
            (__import__("pathlib").Path(args.out) / "count.json").write_text(str(count))
        return Outcome(f"{count} parameters", ok=not args.exit_1)
'''


def _import_file(tmp_path, name: str, source: str):
    """Import ``source`` as a module from its own file, as a user's extension would be."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def extensions(tmp_path):
    """The three files, imported; their registrations are taken out again afterwards."""
    modules = {name: _import_file(tmp_path, name, source) for name, source in (
        ("resid_norm_ext", ANALYSIS), ("fixed_null_ext", NULL), ("count_ext", EXPERIMENT))}
    try:
        yield modules
    finally:
        SECTIONS.remove("resid_norm")
        seedprint.NULLS.remove("fixed-normal")
        EXPERIMENTS.remove("count-parameters")
        for name in modules:
            sys.modules.pop(name)


def test_an_analysis_is_one_file(extensions, tmp_path):
    from lens_bias import BiasReport

    assert SECTIONS.names()[-1] == "resid_norm"
    model = shared_tiny("llama")
    tokens = lens_bias.random_tokens(8, 8, 97, seed=0)
    report = lens_bias.analyze(model, inputs=tokens, sections=["contraction", "resid_norm"], progress=False)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    direct = torch.stack([cache[f"blocks.{layer}.hook_resid_post"].norm(dim=-1).mean() for layer in range(2)])
    assert torch.allclose(report.resid_norm.norms, direct, rtol=1e-5)
    assert ("Residual norm", "mean ‖h‖, last block", f"{direct[-1].item():.4g}") in report.headline_table()
    assert list(report.figures()) == ["contraction per layer", "mean ‖h‖ per layer"]
    assert "residual norm per block" in str(report) and "<h2>Residual norm</h2>" in report.to_html(tmp_path / "r.html").read_text()
    back = BiasReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert torch.equal(back.resid_norm.norms, report.resid_norm.norms)
    assert "resid_norm" in build_parser().parse_args(["analyze", "--sections", "resid_norm"]).sections
    # in the default set, last (order 100); left out for a model its applies_to refuses
    assert list(lens_bias.analyze(model, inputs=tokens, progress=False).sections)[-1] == "resid_norm"
    attn_only = shared_tiny("gpt2", attn_only=True)
    assert "resid_norm" not in lens_bias.analyze(attn_only, inputs=tokens, progress=False).sections
    with pytest.raises(LensBiasError, match="cannot run on this model: resid_norm does not apply to this attention-only"):
        lens_bias.analyze(attn_only, inputs=tokens, sections=["resid_norm"], progress=False)


def test_a_null_is_one_file(extensions):
    null_class = extensions["fixed_null_ext"].FixedNormalNull
    assert seedprint.NULLS["fixed-normal"] is null_class
    small = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
    a = seedprint.fingerprint(lens_bias.random_init("llama", seed=1, **small), n=64, seq_len=8, progress=False)
    b = seedprint.fingerprint(lens_bias.random_init("llama", seed=2, **small), n=64, seq_len=8, progress=False)
    result = seedprint.lineage_test(a, b, m=32, null=null_class(sd=0.02))
    from scipy.stats import norm

    assert result.z == pytest.approx(result.tau_bar / 0.02) and result.p == pytest.approx(norm.sf(result.tau_bar / 0.02), rel=1e-9)
    assert result.null == "fixed normal" and result.null_details == {"sd": 0.02}
    assert seedprint.Null.from_dict(result.null_settings) == null_class(sd=0.02)
    assert seedprint.null_named("fixed-normal", sd=0.5) == null_class(sd=0.5)
    calibration = seedprint.calibrate(lambda s: lens_bias.random_init("llama", seed=s, **small), kinds="tokens", n_pairs=2, n=64, seq_len=8,
                                      nulls=[null_class(sd=0.02)], m=32, progress=False)
    assert calibration.null.tolist() == ["fixed normal"] and calibration.pairs.tolist() == [2]
    assert "fixed-normal" in build_parser().parse_args(["seedprint", "a.pt", "b.pt", "--null", "fixed-normal"]).null


def test_an_experiment_is_one_file(extensions, tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["count-parameters", "--preset", "wide", "--set", "n_layers=2", "--out", str(tmp_path)])
    model = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=50, n_ctx=8)
    count = sum(p.numel() for p in model.parameters())
    assert code == 0 and out.getvalue().strip() == f"{count} parameters" and (tmp_path / "count.json").read_text() == str(count)
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["count-parameters", "--exit-1"]) == 1
    config = extensions["count_ext"].CountConfig(d_model=48)
    assert type(config).from_dict(config.to_dict()) == config
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["count-parameters", "--set", "width=3"]) == 2
    assert "CountConfig has no field 'width'" in err.getvalue()


def test_each_registry_refuses_a_taken_name():
    from lens_bias.analyses.base import Analysis
    from lens_bias.experiments.base import Experiment
    from lens_bias.hooks import INTERVENTIONS, Intervention
    from lens_bias.models import ARCHITECTURES
    from lens_bias.models.architectures.base import Architecture

    before = (dict(SECTIONS), dict(seedprint.NULLS), dict(EXPERIMENTS), dict(INTERVENTIONS), dict(ARCHITECTURES))
    with pytest.raises(LensBiasError, match="an analysis named 'contraction' is already registered"):
        type("Contraction", (Analysis,), {"name": "contraction"})
    with pytest.raises(LensBiasError, match="a null named 'seeds' is already registered"):
        type("MySeeds", (seedprint.Null,), {"kind": "seeds"})
    with pytest.raises(LensBiasError, match="an experiment named 'sinks' is already registered"):
        type("MySinks", (Experiment,), {"name": "sinks"})
    with pytest.raises(LensBiasError, match="an intervention named 'MaskToSelf' is already registered"):
        type("MaskToSelf", (Intervention,), {})
    with pytest.raises(LensBiasError, match="an architecture named 'llama' is already registered"):
        type("MyLlama", (Architecture,), {"name": "llama"})
    with pytest.raises(LensBiasError, match=r"names no result type; subclass Analysis\[YourResult\]"):
        type("Untyped", (Analysis,), {"name": "untyped"})
    assert before == (dict(SECTIONS), dict(seedprint.NULLS), dict(EXPERIMENTS), dict(INTERVENTIONS), dict(ARCHITECTURES))


def test_the_root_holds_what_a_user_calls_and_extend_the_plumbing():
    import lens_bias.extend

    plumbing = {"ModelAdapter", "ModelInfo", "Probe", "Analysis", "Result", "run_analyses", "SECTIONS", "InputSpec"}
    assert not plumbing & set(lens_bias.__all__) and plumbing <= set(lens_bias.extend.__all__)
    with pytest.warns(DeprecationWarning, match="use lens_bias.extend.ModelAdapter"):
        assert lens_bias.ModelAdapter is lens_bias.extend.ModelAdapter
    with pytest.raises(AttributeError):
        lens_bias.no_such_name  # noqa: B018
