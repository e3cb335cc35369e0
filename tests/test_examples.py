"""The example scripts run top to bottom (small settings) and show what their docstrings claim."""

import runpy
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_born_biased_smoke(monkeypatch, capsys):
    argv = ["born_biased.py", "--d-model", "64", "--n-layers", "2", "--d-vocab", "500", "--n", "16", "--seq-len", "16"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(EXAMPLES / "born_biased.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert all(name in out for name in ("ReLU GPT", "GELU GPT", "SwiGLU llama", "attention-only GPT"))
