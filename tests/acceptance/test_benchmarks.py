"""The benchmark scripts run (tiny sizes, through run_all.py) and report every ratio; timings are not asserted."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import BACKEND, _real_model_or_skip, requires_tl4

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def run(script, *args):
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_run_all_prints_one_row_per_figure(tmp_path):
    lines = run("run_all.py", "--tiny", "--results", str(tmp_path / "performance.json"))
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| figure")]
    assert [row.split("|")[1].strip() for row in rows] == [
        "analyze / forward ratio", "extraction / full forward", "extraction / HF inner forward", "scipy loop / kendall_tau_b", "peak memory N 2000 / N 200",
        "scipy loop / lineage_test", "compare auto / published",
    ]
    ratios = {row.split("|")[1].strip(): row.split("|")[2].strip() for row in rows}
    if BACKEND == "hooked":  # a TL 3 HookedTransformer has no HF model inside to time
        assert ratios.pop("extraction / HF inner forward") == "n/a"
    for name, ratio in ratios.items():
        assert math.isfinite(float(ratio)) and float(ratio) > 0, f"{name}: {ratio}"
    numbers = json.loads((tmp_path / "performance.json").read_text())["numbers"]  # the results file holds the printed table
    assert {name: numbers[f"figures.{re.sub(r'[^a-z0-9]+', '_', name.lower()).strip('_')}.ratio"] for name in ratios} == {n: float(r) for n, r in ratios.items()}


def test_the_memory_guard_benchmark_writes_the_guards_own_estimate(tmp_path):
    """bench_memory's results file (what performance.md renders): each size's estimate is the guard's own
    batch × forward_bytes, and its ratio the estimate over the measured peak."""
    import lens_bias
    from lens_bias.core import memory

    run("bench_memory.py", "--tiny", "--results", str(tmp_path / "memory.json"))
    numbers = json.loads((tmp_path / "memory.json").read_text())["numbers"]
    model = lens_bias.random_init("llama", d_model=128, n_layers=2, n_heads=4, d_vocab=500, n_ctx=128)  # the second tiny size
    info = lens_bias.extend.ModelAdapter(model).info
    estimate = 32 * memory.forward_bytes(seq_len=128, d_model=128, n_heads=4, d_mlp=info.d_mlp, d_vocab=500, gated_mlp=info.gated_mlp, family=info.family)
    key = "sizes.llama_d128_l2_h4_v500_32_x_128"
    assert numbers[f"{key}.estimate_mib"] * 2**20 == estimate
    assert numbers[f"{key}.measured_mib"] > 0 and numbers[f"{key}.ratio"] == pytest.approx(numbers[f"{key}.estimate_mib"] / numbers[f"{key}.measured_mib"], rel=1e-2)


@requires_tl4  # an offloaded model runs only under a bridge
def test_the_gguf_at_size_benchmark_runs_at_a_tiny_size(tmp_path):
    """bench_gguf_1b at a tiny size, and its results file (what performance.md renders): the parameter count of the
    file it wrote, by the LLaMA shapes, and each ratio from the peaks it records."""
    d, layers, ff, vocab, heads, kv_heads = 64, 2, 128, 300, 32, 4
    lines = run("bench_gguf_1b.py", "--d-model", str(d), "--layers", str(layers), "--d-mlp", str(ff), "--vocab", str(vocab), "--max-memory", "100KB",
                "--n", "2", "--seq-len", "8", "--results", str(tmp_path / "gguf.json"))
    assert "1 of 1 device-map entries on disk" in lines[0]  # 100 KB holds no module: everything is read back from disk
    assert sum("features finite: True" in line for line in lines) == 2
    ratio = re.search(r"one tensor at a time / whole: ([0-9.]+)", "\n".join(lines))
    assert ratio and float(ratio.group(1)) > 0
    record = json.loads((tmp_path / "gguf.json").read_text())
    assert record["command"].startswith("python benchmarks/bench_gguf_1b.py --d-model 64 ")
    numbers, kv = record["numbers"], kv_heads * d // heads
    assert numbers["parameters"] == 2 * vocab * d + d + layers * (2 * d + 2 * d * d + 2 * kv * d + 3 * ff * d)
    assert numbers["limit_mib"] == 100_000 / 2**20
    for peak in ("load", "fingerprint"):
        row = {k.rsplit(".", 1)[1]: v for k, v in numbers.items() if k.startswith(f"peaks.{peak}.")}
        assert row["streamed_mib"] > 0 and row["whole_mib"] > 0
        assert row["streamed_over_whole"] == pytest.approx(row["streamed_mib"] / row["whole_mib"])
        assert row["streamed_over_float32"] == pytest.approx(row["streamed_mib"] / numbers["float32_mib"])
        assert numbers["float32_mib"] == numbers["parameters"] * 4 / 2**20


def test_the_scale_benchmark_writes_each_pass_peak_ratio(tmp_path):
    """bench_scale_n at a tiny size: one row per pass, its ratio the large N's peak over the small N's, as printed."""
    lines = run("bench_scale_n.py", "--small", "8", "--large", "64", "--batch-size", "8", "--d-model", "32", "--n-layers", "1", "--d-vocab", "100",
                "--seq-len", "8", "--results", str(tmp_path / "scale.json"))
    numbers = json.loads((tmp_path / "scale.json").read_text())["numbers"]
    for what in ("analyze", "fingerprint"):
        printed = re.search(rf"{what} peak N 64 / N 8: ([0-9.]+)", "\n".join(lines))
        assert printed and round(numbers[f"passes.{what}.ratio"], 2) == float(printed.group(1))
        assert numbers[f"passes.{what}.ratio"] == pytest.approx(numbers[f"passes.{what}.large_mib"] / numbers[f"passes.{what}.small_mib"])
    assert (numbers["small"], numbers["large"]) == (8, 64)


@pytest.mark.real_model
@requires_tl4  # an offloaded model runs only under a bridge
def test_the_offload_benchmark_writes_its_ratios(tmp_path):
    """bench_offload on SmolLM2 (two sequences): each ratio of its results file is the offloaded figure over the
    in-memory one, and the offloaded fingerprint holds less resident memory than the model in memory."""
    _real_model_or_skip("smollm2-135m-instruct")
    run("bench_offload.py", "--n", "2", "--seq-len", "8", "--results", str(tmp_path / "offload.json"))
    numbers = json.loads((tmp_path / "offload.json").read_text())["numbers"]
    for measure in ("resident", "anonymous", "ms_per_token"):
        assert numbers[f"fingerprint.{measure}.ratio"] == pytest.approx(numbers[f"fingerprint.{measure}.offloaded"] / numbers[f"fingerprint.{measure}.in_memory"])
    assert numbers["fingerprint.resident.ratio"] < 1
    assert numbers["gguf_load.float32.ratio"] == 1 and numbers["gguf_load.bfloat16.peak_mib"] < numbers["gguf_load.float32.peak_mib"]
    assert numbers["float32_mib"] == pytest.approx(134.5e6 * 4 / 2**20, rel=0.01)  # SmolLM2-135M's parameters
