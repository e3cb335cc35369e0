"""A sink the model declares: GPT-OSS's learned sink logits, measured and removed on a tiny random init. The table of
the declared-sinks section of ``docs/sinks.md``.

The model (2 layers × 4 heads, a sliding layer of window 4 then a full one, every sink logit set to 3.0) and the
tokens (8 random sequences of 12 tokens) are those of ``tests/analyses/test_declared_sinks.py``, which checks each
number against the model's own eager attention; run from the repository root, with ``-m``, so that it finds them.
GPT-OSS is bridged on TransformerLens 4 only.

    python -m examples.declared_sinks --results docs/results/declared_sinks.json
"""

from __future__ import annotations

import argparse

import pandas as pd

import lens_bias
from lens_bias.analyses.sink_attribution import sink_attribution
from lens_bias.core.provenance import command_line, tables_record, write_results
from tests.analyses.test_declared_sinks import TOKENS, tiny_gpt_oss


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """The attribution table (one row per condition); the sinks section's numbers go to the results file beside it."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the numbers as a results file")
    args = parser.parse_args(argv)

    model = lens_bias.from_hf(tiny_gpt_oss())
    sinks = lens_bias.analyze(model, inputs=TOKENS, sections=["sinks"], progress=False).sinks
    # the flipped batch calibrates the edits, so no edit is fitted to the sequences it is measured on
    attribution = sink_attribution(model, TOKENS, calibration=TOKENS.flip(0), n_random=4, position=8).to_pandas()
    print(sinks.summary(), "\n")
    print(attribution.drop(columns=["edit"]).to_string())
    if args.results:  # docs/render.py renders the page's table from it
        headline = sinks.headline()
        numbers = {key: headline[key] for key in ("learned_sink_share", "first_token_mass", "learned_sink_rate", "sink_rate_0")}
        numbers |= {"heads_dominated": len(sinks.learned_dominates()), "heads": sinks.learned_share().numel()}
        command = command_line(__file__, argv, module="examples.declared_sinks")
        depends = ("examples/declared_sinks.py", "analyses/sinks.py", "analyses/sink_attribution.py", "tests/analyses/test_declared_sinks.py")
        write_results(args.results, tables_record({"conditions": attribution.drop(columns=["edit"])}, {"conditions": ["condition"]}, {},
                                                  depends, command, numbers=numbers))
    return attribution


if __name__ == "__main__":
    main()
