"""The benchmark scripts run (tiny sizes, through run_all.py) and report every ratio; timings are not asserted."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import BACKEND, requires_tl4

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
        "scipy loop / lineage_test",
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


@pytest.mark.slow
@requires_tl4  # an offloaded model runs only under a bridge
def test_the_gguf_at_size_benchmark_runs_at_a_tiny_size():
    lines = run("bench_gguf_1b.py", "--d-model", "64", "--layers", "2", "--d-mlp", "128", "--vocab", "300", "--max-memory", "100KB",
                "--n", "2", "--seq-len", "8")
    assert "1 of 1 device-map entries on disk" in lines[0]  # 100 KB holds no module: everything is read back from disk
    assert sum("features finite: True" in line for line in lines) == 2
    ratio = re.search(r"one tensor at a time / whole: ([0-9.]+)", "\n".join(lines))
    assert ratio and float(ratio.group(1)) > 0
