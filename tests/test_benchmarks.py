"""The benchmark scripts run (tiny sizes) and end with their ratio lines; their timings are not asserted."""

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def run(script, *args):
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_bench_analyze_prints_its_ratio_last():
    lines = run("bench_analyze.py", "--d-model", "64", "--n-layers", "2", "--d-vocab", "500", "--n", "8", "--seq-len", "16", "--repeats", "1")
    assert lines[-1].startswith("analyze / forward ratio:")


def test_bench_seedprint_prints_its_ratios_last():
    lines = run(
        "bench_seedprint.py", "--d-model", "64", "--n-layers", "2", "--d-vocab", "1024", "--n", "8", "--seq-len", "16",
        "--batch-size", "4", "--repeats", "1", "--kendall-n", "200", "--kendall-k", "4",
    )
    assert [line.split(":")[0].strip() for line in lines[-4:]] == [
        "extraction / full forward", "extraction / HF inner forward", "scipy loop / vectorised Kendall", "peak memory N 2000 / N 200",
    ]


def test_run_all_prints_one_row_per_figure():
    lines = run("run_all.py", "--tiny")
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| figure")]
    assert [row.split("|")[1].strip() for row in rows] == [
        "analyze / forward ratio", "extraction / full forward", "extraction / HF inner forward", "scipy loop / vectorised Kendall", "peak memory N 2000 / N 200",
    ]
    assert all(row.split("|")[2].strip() != "n/a" for row in rows if "HF inner" not in row)
