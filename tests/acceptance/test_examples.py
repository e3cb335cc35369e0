"""The example scripts run top to bottom (small settings) and show what their docstrings claim."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lens_bias
from lens_bias.core import tl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_born_biased_smoke(monkeypatch, capsys, tmp_path):
    results = tmp_path / "born_biased.json"
    argv = ["born_biased.py", "--d-model", "64", "--n-layers", "2", "--d-vocab", "500", "--n", "16", "--seq-len", "16", "--results", str(results)]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(EXAMPLES / "born_biased.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert all(name in out for name in ("ReLU GPT", "GELU GPT", "SwiGLU llama", "attention-only GPT"))
    record = json.loads(results.read_text())
    assert [row[0] for row in record["tables"]["models"]["rows"]] == ["ReLU GPT", "GELU GPT", "SwiGLU llama", "attention-only GPT"]
    assert -1 <= record["numbers"]["models.relu_gpt.inter"] <= 1 and record["numbers"]["models.relu_gpt.max_min_p"] >= 1


def test_ablations_smoke(capsys, tmp_path):
    """The ablations example's table is ablate's own, at the final norm, and its results file holds it."""
    results = tmp_path / "ablations.json"
    argv = ["--d-model", "64", "--n-layers", "2", "--d-vocab", "500", "--n", "16", "--seq-len", "16", "--results", str(results)]
    table = runpy.run_path(str(EXAMPLES / "ablations.py"))["main"](argv)
    assert "odd_mlp+self_only_attention" in capsys.readouterr().out
    record = json.loads(results.read_text())
    assert record["numbers"]["conditions.base.inter"] == pytest.approx(table.loc["base", "inter"])
    # odd activations remove the shared direction that a ReLU MLP writes (the page's claim, at this small size too)
    assert abs(table.loc["odd_mlp", "inter"]) < table.loc["base", "inter"]


def test_real_model_anatomy_smoke(smollm2, monkeypatch, capsys, tmp_path):
    """The anatomy example on SmolLM2 (the session's copy, at a small size): its results file holds the tables it
    returns, and they show SmolLM2's known anatomy: dim 507 massive from layer 11, the super weight [507, 1229] there,
    and its removal costing far more perplexity than either control."""
    monkeypatch.setattr(lens_bias.models, "pretrained", lambda name: smollm2)
    results = tmp_path / "anatomy.json"
    argv = ["--n", "8", "--held-out", "4", "--seq-len", "32", "--results", str(results)]
    tables = runpy.run_path(str(EXAMPLES / "real_model_anatomy.py"))["main"](argv)
    assert "super_weight" in capsys.readouterr().out
    numbers = json.loads(results.read_text())["numbers"]
    assert numbers["onset_layer"] == 11 and 507 in numbers["massive_dims"]
    assert (numbers["candidates.0.layer"], numbers["candidates.0.row"], numbers["candidates.0.col"]) == (11, 507, 1229)
    removal = tables["removal"].set_index("condition").ratio
    assert numbers["removal.super_weight.ratio"] == pytest.approx(removal["super_weight"])
    assert removal["super_weight"] > 5 * max(removal["largest_other"], removal["random"])


def test_family_anatomy_smoke(smollm2, monkeypatch, capsys, tmp_path):
    """The three-family anatomy example on SmolLM2 (small): its super weight and massive dim are the known ones, and
    the writes it records for dim 507 add up to the model's own residual after the last block."""
    monkeypatch.setattr(lens_bias.models, "pretrained", lambda name: smollm2)
    results = tmp_path / "anatomy.json"
    tables = runpy.run_path(str(EXAMPLES / "family_anatomy.py"))["main"](["--n", "4", "--seq-len", "32", "--results", str(results)])
    assert "writes_507" in capsys.readouterr().out
    numbers = json.loads(results.read_text())["numbers"]
    assert 507 in numbers["massive_dims"] and numbers["onset_layer"] == 11
    assert (numbers["super_weight.0.layer"], numbers["super_weight.0.row"], numbers["super_weight.0.col"]) == (11, 507, 1229)
    tokens = lens_bias.text_tokens(smollm2.tokenizer, 4, 32)
    with torch.no_grad():
        _, cache = smollm2.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_resid_post"))
    last = cache[f"blocks.{smollm2.cfg.n_layers - 1}.hook_resid_post"][:, 0, 507].mean().item()
    assert tables["writes_507"].resid_after.iloc[-1] == pytest.approx(last, rel=1e-4)
    assert numbers["peak_507"] == pytest.approx(tables["writes_507"].resid_after.abs().max())
    assert numbers["peak_from_507"] <= numbers["peak_at_507"] <= numbers["peak_to_507"]


def test_calibration_smoke(capsys, tmp_path):
    """The calibration example's results file holds calibrate's table, and the embeddings' analytic null, which the
    shared residual path fools, calls more unrelated pairs related than the seeds null (the page's point)."""
    results = tmp_path / "calibration.json"
    argv = ["--pairs", "4", "--n", "64", "--seq-len", "8", "--d-vocab", "1000", "--results", str(results)]
    table = runpy.run_path(str(EXAMPLES / "calibration.py"))["main"](argv).set_index(["inputs", "null"])
    assert "embeddings" in capsys.readouterr().out
    numbers = json.loads(results.read_text())["numbers"]
    assert numbers["calibration.embeddings.analytic.fpr"] == table.loc[("embeddings", "analytic"), "fpr"]
    assert table.loc[("embeddings", "analytic"), "fpr"] > table.loc[("embeddings", "seeds"), "fpr"]


def test_calibration_of_the_align_modes_smoke(tmp_path):
    """With --aligns the example tests each pair under each mode, and its results file keys the rows by input kind,
    mode and null, as seedprint.md's aligned table names them; the command recorded is the one that ran."""
    results = tmp_path / "aligned.json"
    argv = ["--pairs", "3", "--n", "64", "--seq-len", "8", "--d-vocab", "1000", "--kinds", "tokens", "--aligns", "permutation", "--results", str(results)]
    table = runpy.run_path(str(EXAMPLES / "calibration.py"))["main"](argv)
    assert set(table["align"]) == {"permutation"} and set(table["inputs"]) == {"tokens"} and (table.pairs == 3).all()
    record = json.loads(results.read_text())
    assert record["numbers"]["calibration.tokens.permutation.seeds.fpr"] == table.set_index("null").loc["seeds", "fpr"]
    assert record["command"] == "python examples/calibration.py " + " ".join(argv)


def test_orders_of_magnitude_smoke(capsys):
    """The example's table holds each model's max/min p̄ as the model's own softmax gives it, and prints it."""
    argv = ["--d-model", "128", "--d-vocab", "1000", "--n", "16", "--seq-len", "8"]
    table = runpy.run_path(str(EXAMPLES / "orders_of_magnitude.py"))["main"](argv)
    assert list(table.index) == ["ReLU d 128", "ReLU d 128 + OddActivation", "ReLU d 256"]
    for d_model in (128, 256):  # built as the example builds it, read on the inputs analyze draws (seed 42)
        model = lens_bias.random_init("gpt2", d_model=d_model, n_layers=2, n_heads=max(1, d_model // 128), d_vocab=1000, n_ctx=8, act_fn="relu",
                                      positional_embedding="none", seed=0)
        with torch.no_grad():
            p_bar = model(lens_bias.random_tokens(16, 8, 1000))[:, -1].double().softmax(-1).mean(0)
        assert table.loc[f"ReLU d {d_model}", "max/min p̄"] == pytest.approx((p_bar.max() / p_bar.min()).item(), rel=1e-6)
    assert table.loc["ReLU d 128 + OddActivation", "max/min p̄"] < table.loc["ReLU d 128", "max/min p̄"]
    assert f"{table.loc['ReLU d 256', 'max/min p̄']:.3g}" in capsys.readouterr().out


def run_notebook(path: Path):
    """Execute a notebook in a fresh Jupyter kernel (nbclient), as CI and users do; any error fails the test.

    Each notebook ends with assertions on its own numbers, so running it is also checking what its text claims.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), f"{path.name}: strip outputs"
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    if tl.tl_major() >= 4:  # the docs site (built in the TL 4 env) renders this executed copy: docs/hooks.py
        executed = EXAMPLES.parent / "build" / "notebooks"
        executed.mkdir(parents=True, exist_ok=True)
        nbformat.write(notebook, executed / path.name)
    return notebook


def outputs_text(notebook) -> str:
    return "\n".join(
        str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", "")) + str(out.get("data", {}).get("text/html", ""))[:200]
        for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs
    )


NOTEBOOKS = sorted(EXAMPLES.glob("[0-9][0-9]_*.ipynb"))


def test_the_five_notebooks_are_there():
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path):
    if path.name.startswith("05_"):  # the real model: skipped without its wheel, except under CI
        from ..conftest import _real_model_or_skip

        _real_model_or_skip("smollm2-135m-instruct")
    notebook = run_notebook(path)
    text = outputs_text(notebook)
    expected = {"01": "lens_bias report", "02": "odd_mlp", "03": "MaskToSelf(10)", "04": "same lineage?", "05": "all claims hold on this run"}[path.name[:2]]
    assert expected in text


def test_persistence_command_writes_files_and_exits_1_on_a_wrong_verdict(tmp_path, monkeypatch, capsys):
    """The CLI plumbing around run_persistence (the run itself is tested in test_data_train.py)."""
    import pandas as pd

    import lens_bias.experiments.persistence as persistence
    from lens_bias.cli import main

    row = dict(table=1, base="init 42", target="init 123", inputs="tokens", null="analytic", tau_bar=0.3, k=10, p=1e-5, log10_p=-5.0, same_lineage=True, expected="unrelated", ok=False)
    curve = pd.DataFrame({"step": [0], "log10_p": [-9.0], "tau_bar": [1.0], "same_lineage": [True]})
    training = pd.DataFrame({"run": ["pretrain 42 on prose"], "steps": [1], "final_train_loss": [1.0], "eval_loss": [1.0], "unigram_entropy": [2.0]})
    fake = persistence.PersistenceResult(pd.DataFrame([row]), curve, training)
    monkeypatch.setattr(persistence, "run_persistence", lambda *a, **k: fake)
    assert main(["persistence", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"]) == 1
    assert "1 verdict(s) differ" in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} == {"tables.csv", "tables.md", "curve.csv", "training.csv", "persistence.json"}
    fake.tables.loc[0, "ok"] = True
    assert main(["persistence", "--preset", "tiny", "--no-progress"]) == 0
    done = subprocess.run([sys.executable, str(EXAMPLES / "seedprint_persistence.py"), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--tiny" in done.stdout


def test_move_the_sink_script_help_lists_the_presets():
    done = subprocess.run([sys.executable, str(EXAMPLES / "move_the_sink.py"), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and all(p in done.stdout for p in ("--tiny", "sink-model", "gpu", "--trained"))
