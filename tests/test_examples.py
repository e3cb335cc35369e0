"""The example scripts run top to bottom (small settings) and show what their docstrings claim."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_born_biased_smoke(monkeypatch, capsys):
    argv = ["born_biased.py", "--d-model", "64", "--n-layers", "2", "--d-vocab", "500", "--n", "16", "--seq-len", "16"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(EXAMPLES / "born_biased.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert all(name in out for name in ("ReLU GPT", "GELU GPT", "SwiGLU llama", "attention-only GPT"))


def test_orders_of_magnitude_smoke(monkeypatch, capsys):
    argv = ["orders_of_magnitude.py", "--d-model", "128", "--d-vocab", "1000", "--n", "16", "--seq-len", "8"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(EXAMPLES / "orders_of_magnitude.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "ReLU d 128 + OddActivation" in out and "ReLU d 256" in out


def run_notebook(path: Path) -> dict:
    """Execute a notebook's code cells top to bottom in one namespace (what a kernel would do, minus display)."""
    notebook = json.loads(path.read_text())
    namespace: dict = {"__name__": "__main__"}
    for cell in notebook["cells"]:
        assert cell["cell_type"] != "code" or not cell["outputs"], f"{path.name}: outputs must be stripped"
        if cell["cell_type"] == "code":
            exec(compile("".join(cell["source"]), f"{path.name}", "exec"), namespace)
    return namespace


def test_ablation_notebook_runs_top_to_bottom():
    ns = run_notebook(EXAMPLES / "ablate_mlp_vs_attention.ipynb")
    final = ns["ablation"].final()
    assert final.loc["odd_mlp", "inter"] < 0.05 < final.loc["base", "inter"]
    assert [row["inter"] for row in ns["rows"]] == sorted(row["inter"] for row in ns["rows"])[::-1]


def test_persistence_notebook_runs_top_to_bottom():
    ns = run_notebook(EXAMPLES / "seedprint_persistence.ipynb")
    assert ns["result"].all_as_expected


def test_persistence_command_writes_files_and_exits_1_on_a_wrong_verdict(tmp_path, monkeypatch, capsys):
    """The CLI plumbing around run_persistence (the run itself is tested in test_data_train.py)."""
    import pandas as pd

    import lens_bias.persistence as persistence
    from lens_bias.cli import main

    row = dict(table=1, base="init 42", target="init 123", inputs="tokens", null="analytic", tau_bar=0.3, k=10, p=1e-5, log10_p=-5.0, same_lineage=True, expected="unrelated", ok=False)
    fake = persistence.PersistenceResult(pd.DataFrame([row]), pd.DataFrame({"step": [0], "log10_p": [-9.0]}), pd.DataFrame({"run": ["x"], "eval_loss": [1.0]}))
    monkeypatch.setattr(persistence, "run_persistence", lambda *a, **k: fake)
    assert main(["persistence", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"]) == 1
    assert "1 verdict(s) differ" in capsys.readouterr().out
    assert {p.name for p in tmp_path.iterdir()} == {"tables.csv", "tables.md", "curve.csv", "training.csv"}
    fake.tables.loc[0, "ok"] = True
    assert main(["persistence", "--preset", "tiny", "--no-progress"]) == 0
    done = subprocess.run([sys.executable, str(EXAMPLES / "seedprint_persistence.py"), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--tiny" in done.stdout


def test_move_the_sink_notebook_runs_top_to_bottom():
    ns = run_notebook(EXAMPLES / "03_move_the_sink.ipynb")
    moved = ns["moved"].set_index("condition")
    assert moved.loc[f"MaskToSelf({ns['sink_config'].position})", "diff_in_se"] > 3
    assert ns["trained"].sinks.rate(0.1)[0] > ns["fresh"].sinks.rate(0.1)[0]


def test_move_the_sink_script_help_lists_the_presets():
    done = subprocess.run([sys.executable, str(EXAMPLES / "move_the_sink.py"), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and all(p in done.stdout for p in ("--tiny", "sink-model", "gpu", "--trained"))
