"""The lens-bias command: in process, as `python -m lens_bias`, and as the installed console script."""

import base64
import gzip
import io
import json
import re
import shutil
import subprocess
import sys

import pytest

import lens_bias
from lens_bias.cli import main

SMALL = ["--d-model", "64", "--n-layers", "2", "--n-heads", "4", "--d-vocab", "200", "--n-sequences", "8", "--seq-len", "16", "--no-progress"]


def test_analyze_prints_the_report(capsys):
    assert main(["analyze", *SMALL, "--act", "gelu", "--pos", "none"]) == 0
    out = capsys.readouterr().out
    assert "gelu MLP" in out and "none positions" in out and "token preference over 8" in out


def test_default_model_is_random_inits(capsys):
    """One default: the CLI builds exactly the model random_init builds with no activation or positions given."""
    assert main(["analyze", *SMALL, "--json", "--sections", "contraction"]) == 0
    info = json.loads(capsys.readouterr().out)["model"]
    spec = lens_bias.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=200, n_ctx=256).lens_bias_spec
    assert (info["act_fn"], info["positional_embedding"]) == (spec.act_fn, spec.positional_embedding) == ("gelu_new", "learned")


def test_ablations_flag(capsys):
    assert main(["analyze", *SMALL, "--ablations", "--sections", "contraction"]) == 0
    out = capsys.readouterr().out
    assert "ablations" in out and "odd_mlp+self_only_attention" in out


def test_json_output(capsys):
    assert main(["analyze", *SMALL, "--json", "--sections", "contraction"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert list(data["sections"]) == ["contraction"] and data["model"]["d_model"] == 64


@pytest.mark.parametrize(
    "argv, message",
    [(["--act", "gelu_new", "--arch", "llama"], "act_fn 'gelu_new'"), (["--seq-len", "300", "--n-ctx", "64"], "n_ctx=64")],
)
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    assert main(["analyze", *SMALL, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


@pytest.mark.slow
@pytest.mark.parametrize("command", [[sys.executable, "-m", "lens_bias"], ["lens-bias"]])
def test_entry_points(command):
    if command == ["lens-bias"] and shutil.which("lens-bias") is None:
        pytest.fail("the lens-bias console script is not installed: pip install -e .")
    done = subprocess.run([*command, "analyze", *SMALL], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "contraction" in done.stdout


def test_fingerprint_then_seedprint(tmp_path, capsys):
    paths = []
    for seed in (1, 2):
        path = tmp_path / f"fp{seed}.pt"
        spec = f"llama:d=64,L=2,H=4,V=4000,ctx=32,seed={seed}"
        assert main(["fingerprint", spec, "-o", str(path), "--n", "200", "--seq-len", "16", "--no-progress"]) == 0
        paths.append(str(path))
    capsys.readouterr()
    assert main(["seedprint", paths[0], paths[0], "--m", "32", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["same_lineage"] and same["tau_bar"] == pytest.approx(1.0)
    assert main(["seedprint", *paths, "--m", "32"]) == 0
    assert "SeedPrint (analytic null" in capsys.readouterr().out


def test_model_spec_strings():
    from lens_bias.models import parse_model_spec

    spec = parse_model_spec("gpt2:d=128,L=3,act=relu,pos=none,seed=7,init_std=0.01,attn_only=false")
    assert (spec.arch, spec.d_model, spec.n_layers, spec.act_fn, spec.positional_embedding, spec.seed, spec.init_std, spec.attn_only) == (
        "gpt2", 128, 3, "relu", "none", 7, 0.01, False
    )
    assert main(["fingerprint", "llama:d=6x4", "-o", "x.pt"]) == 2
    # a narrow width whose default head count would not make even rotary heads (24 / 8) is named by its own count
    for text in ("llama:d=24,H=2", "llama:d=128,H=4,V=500", "gpt2:d=24,H=3"):
        assert parse_model_spec(text).text == text and parse_model_spec(parse_model_spec(text).text) == parse_model_spec(text)
    assert main(["fingerprint", "llama:width=64", "-o", "x.pt"]) == 2


def test_analyze_with_attribution_makes_the_page_with_the_chain(tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["analyze", *SMALL, "--arch", "llama", "--attribution", "--html", str(page), "--sections", "sinks", "super_neurons"]) == 0
    text = page.read_text()
    assert "<h2>What removes the sink</h2>" in text and "sink attribution (4 sequences of 16 tokens" in capsys.readouterr().out


def test_html_report(tmp_path, capsys):
    page = tmp_path / "report.html"
    assert main(["analyze", *SMALL, "--html", str(page), "--sections", "token_preference", "positional_variance"]) == 0
    text = page.read_text()
    assert text.count('DecompressionStream("gzip")') == 2 and "<h2>Positional variance</h2>" in text and "data:image/png" in text  # bundle, CSV links


def test_train_then_fingerprint_the_checkpoint(tmp_path, capsys):
    spec = "llama:d=64,L=2,H=2,V=512,ctx=32,seed=4"
    out = tmp_path / "run"
    assert main(["train", spec, "--out", str(out), "--steps", "12", "--batch-size", "4", "--seq-len", "32", "--lr", "3e-3", "--bos", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert "trained" in said and "eval loss" in said
    training = (out / "training.csv").read_text().splitlines()
    assert len(training) == 13 and training[0].startswith("step,loss,lr")
    fp = tmp_path / "fp.pt"
    assert main(["fingerprint", str(out / "final.pt"), "-o", str(fp), "--n", "16", "--seq-len", "16", "--no-progress"]) == 0
    from lens_bias import seedprint

    assert seedprint.Fingerprint.load(fp).spec["seed"] == 4
    assert main(["fingerprint", str(tmp_path / "missing.pt"), "-o", str(fp)]) == 2
    assert "no checkpoint at" in capsys.readouterr().err


def test_fingerprint_default_length_fits_the_models_context(tmp_path, capsys):
    """The README's `lens-bias fingerprint llama:...` with no --seq-len: the papers' 1024 is cut to n_ctx (256)."""
    out = tmp_path / "fa.pt"
    assert main(["fingerprint", "llama:d=64,L=2,H=4,V=200,seed=3", "-o", str(out), "--sequences", "4", "--no-progress"]) == 0
    fp = lens_bias.Fingerprint.load(out)
    assert fp.inputs.seq_len == 256 and fp.features.shape == (4, 64)


def test_attribution_command_writes_its_tables(tmp_path, capsys):
    code = main(["attribution", "--model", "llama:d=64,L=2,H=4,V=97,ctx=32", "--preset", "tiny", "--set", "inputs=tokens",
                 "--out", str(tmp_path), "--html", str(tmp_path / "page.html"), "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "sink attribution (8 sequences of 32 tokens" in out and "### The chain" in out
    table = __import__("pandas").read_csv(tmp_path / "attribution.csv")
    # --html: the report page of the measured windows, with this attribution's table (its CSV in the page) after the anatomy
    page = (tmp_path / "page.html").read_text()
    packed = re.search(r'data-name="sink_attribution.csv" data-csv="([^"]+)"', page)[1]
    in_page = __import__("pandas").read_csv(io.BytesIO(gzip.decompress(base64.b64decode(packed))))
    assert in_page.condition.tolist() == table.condition.tolist() and in_page.sink_0.tolist() == pytest.approx(table.sink_0.tolist(), rel=1e-5)
    assert "<h2>What removes the sink</h2>" in page
    assert table.condition[0] == "unedited" and len(table) == 9 and (tmp_path / "chain.csv").exists() and (tmp_path / "sink_by_condition.png").exists()
    # the results file the docs render from: the same numbers, named by condition and column
    record = json.loads((tmp_path / "results.json").read_text())
    assert record["numbers"]["conditions.unedited.sink_0"] == table.sink_0[0] and record["numbers"]["config"]["n"] == 8
    assert record["tables"]["conditions"]["rows"][0][0] == "unedited" and record["command"].startswith("lens-bias") and record["depends"]
    assert main(["attribution", "--model", "llama:d=64,L=2,H=4,V=97,ctx=32", "--preset", "tiny", "--no-progress"]) == 2  # text needs a tokenizer
    assert "needs model.tokenizer" in capsys.readouterr().err
