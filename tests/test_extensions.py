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

import pandas as pd
import pytest
import torch

import lens_bias
from lens_bias import LensBiasError, seedprint
from lens_bias.analyses.base import SECTIONS
from lens_bias.analyses.plan import PASSES
from lens_bias.cli import build_parser, main
from lens_bias.experiments.base import EXPERIMENTS

from .conftest import shared_tiny

CONTRIBUTING = pathlib.Path(__file__).parents[1] / "docs" / "contributing.md"


def _walkthrough(heading: str) -> str:
    """The first python block under ``heading`` in the contributing guide: the walk-through runs as it is written."""
    text = CONTRIBUTING.read_text().split(f"\n{heading}\n", 1)[1]
    return text.split("```python\n", 1)[1].split("\n```", 1)[0]


ANALYSIS = _walkthrough("## Add an analysis")

MULTI_PASS = _walkthrough("## Add a section with passes of its own")
INTERVENTION = _walkthrough("## Add an intervention")
NULL = _walkthrough("## Add a null")
EXPERIMENT = _walkthrough("## Add an experiment")


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
    from lens_bias.hooks import INTERVENTIONS

    modules = {name: _import_file(tmp_path, name, source) for name, source in (
        ("resid_norm_ext", ANALYSIS), ("uniform_shift_ext", MULTI_PASS), ("scale_residual_ext", INTERVENTION), ("fixed_null_ext", NULL),
        ("depth_ext", EXPERIMENT))}
    try:
        yield modules
    finally:
        SECTIONS.remove("resid_norm")
        PASSES.remove("uniform_shift")
        INTERVENTIONS.remove("ScaleResidual")
        seedprint.NULLS.remove("fixed-normal")
        EXPERIMENTS.remove("depth")
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


def test_a_section_with_passes_of_its_own_is_one_file(extensions, tmp_path, monkeypatch):
    from lens_bias import BiasReport
    from lens_bias.core import adapter as adapter_module
    from lens_bias.hooks import UniformAttention
    from lens_bias.report import plan_run

    assert PASSES.names()[-1] == "uniform_shift"
    model = shared_tiny("llama")
    tokens = lens_bias.random_tokens(8, 8, 97, seed=0)
    reads = []
    real = adapter_module.read_model_info
    monkeypatch.setattr(adapter_module, "read_model_info", lambda m: reads.append(m) or real(m))
    report = lens_bias.analyze(model, ["contraction", "uniform_shift"], inputs=tokens, progress=False)
    assert len(reads) == 1  # the pass ran on the call's one adapter
    with torch.no_grad():
        _, plain = model.run_with_cache(tokens)
        with lens_bias.intervene(model, UniformAttention()):
            _, edited = model.run_with_cache(tokens)
    norm = lambda cache, layer: cache[f"blocks.{layer}.hook_resid_post"].norm(dim=-1).mean()  # noqa: E731
    direct = torch.stack([norm(edited, layer) / norm(plain, layer) for layer in range(2)])
    assert torch.allclose(report.uniform_shift.shift, direct, rtol=1e-5) and not torch.allclose(direct, torch.ones(2))
    assert list(report.sections) == ["contraction", "uniform_shift"]
    assert "<h2>Uniform attention</h2>" in report.to_html(tmp_path / "r.html").read_text() and "under uniform attention" in str(report)
    back = BiasReport.from_dict(json.loads(json.dumps(report.to_dict())))
    assert torch.equal(back.uniform_shift.shift, report.uniform_shift.shift)
    assert "uniform_shift" in build_parser().parse_args(["analyze", "--sections", "uniform_shift"]).sections
    assert "uniform_shift" in [p.name for p in plan_run(model, [..., "uniform_shift"]).passes]
    assert "uniform_shift" not in lens_bias.analyze(model, inputs=tokens, progress=False).sections  # not in the default report


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


def test_an_intervention_is_one_file(extensions):
    from lens_bias.hooks import INTERVENTIONS, Intervention

    scale = extensions["scale_residual_ext"].ScaleResidual
    assert INTERVENTIONS["ScaleResidual"] is scale
    edit = scale(factor=2.0, layers=[1])
    assert Intervention.from_dict(json.loads(json.dumps(edit.to_dict()))) == edit
    model = shared_tiny("llama")
    tokens = lens_bias.random_tokens(4, 8, 97, seed=0)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
        with lens_bias.intervene(model, edit):
            edited, edited_cache = model.run_with_cache(tokens)
        # layer 1's output doubled, read through the model's own final norm and head: the edit acted
        assert torch.allclose(edited_cache["blocks.1.hook_resid_post"], 2 * cache["blocks.1.hook_resid_post"], rtol=1e-5, atol=1e-6)
        assert torch.allclose(edited, model.unembed(model.ln_final(2 * cache["blocks.1.hook_resid_post"])), rtol=1e-4, atol=1e-5)
    report = lens_bias.ablate(model, conditions={"base": (), "doubled": (edit,)}, inputs=tokens, progress=False)
    assert set(report.final().index) >= {"base", "doubled"}


def test_an_experiment_is_one_file(extensions, tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["depth", "--preset", "tiny", "--set", "max_layers=3", "--out", str(tmp_path), "--no-progress"])
    table = pd.read_csv(tmp_path / "depth.csv")
    tokens = lens_bias.random_tokens(8, 16, 500)
    for depth, inter in zip(table.depth, table.inter):  # each depth's cosine as analyze measures that model
        model = lens_bias.random_init("llama", d_model=64, n_layers=depth, n_heads=4, d_vocab=500, n_ctx=16)
        direct = lens_bias.analyze(model, inputs=tokens, sections=["contraction"], progress=False).contraction.inter[-1].item()
        assert inter == pytest.approx(direct, rel=1e-6)
    assert code == 0 and list(table.depth) == [1, 2, 3] and f"| 3 | {table.inter.iloc[-1]:.3f} |" in out.getvalue()
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["depth", "--preset", "tiny", "--max-inter", "-1", "--no-progress"]) == 1
    config = extensions["depth_ext"].DepthConfig(d_model=48)
    assert type(config).from_dict(config.to_dict()) == config
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["depth", "--set", "width=3"]) == 2
    assert "DepthConfig has no field 'width'" in err.getvalue()


def test_every_analysis_and_intervention_module_has_its_api_page_line():
    root = pathlib.Path(__file__).parents[1]
    for folder, page in (("analyses", "analyses"), ("hooks", "hooks")):
        listed = set((root / "docs" / "api" / f"{page}.md").read_text().split())
        missing = [p.stem for p in sorted((root / folder).glob("*.py")) if p.stem != "__init__" and f"lens_bias.{folder}.{p.stem}" not in listed]
        assert not missing, f"docs/api/{page}.md lacks a ':::' line for {missing}"


def test_each_registry_refuses_a_taken_name():
    from lens_bias.analyses.ablation import AblationResult
    from lens_bias.analyses.base import Analysis
    from lens_bias.analyses.plan import ExtraPass
    from lens_bias.experiments.base import Experiment
    from lens_bias.hooks import INTERVENTIONS, Intervention
    from lens_bias.models import ARCHITECTURES
    from lens_bias.models.architectures.base import Architecture

    before = (dict(SECTIONS), dict(PASSES), dict(seedprint.NULLS), dict(EXPERIMENTS), dict(INTERVENTIONS), dict(ARCHITECTURES))
    with pytest.raises(LensBiasError, match="a pass named 'ablations' is already registered"):
        class MyAblations(ExtraPass[AblationResult]):
            name = "ablations"
    with pytest.raises(LensBiasError, match="pass 'sinks' is already a section's name"):
        class MySinksPass(ExtraPass[AblationResult]):
            name = "sinks"
    with pytest.raises(LensBiasError, match=r"names no result type; subclass ExtraPass\[YourResult\]"):
        type("UntypedPass", (ExtraPass,), {"name": "untyped_pass"})
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
    assert before == (dict(SECTIONS), dict(PASSES), dict(seedprint.NULLS), dict(EXPERIMENTS), dict(INTERVENTIONS), dict(ARCHITECTURES))


def test_the_root_holds_what_a_user_calls_and_extend_the_plumbing():
    import lens_bias.extend

    plumbing = {"ModelAdapter", "ModelInfo", "Probe", "Analysis", "Result", "run_analyses", "SECTIONS", "InputSpec"}
    assert not plumbing & set(lens_bias.__all__) and plumbing <= set(lens_bias.extend.__all__)
    with pytest.warns(DeprecationWarning, match="use lens_bias.extend.ModelAdapter"):
        assert lens_bias.ModelAdapter is lens_bias.extend.ModelAdapter
    with pytest.raises(AttributeError):
        lens_bias.no_such_name  # noqa: B018
