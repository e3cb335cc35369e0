"""Every pair of the three families' models at once, under each test that saved fingerprints allow: the published
test and the three activation-fitted alignments, corrected for testing all pairs (Holm) and grouped into families.
The table of ``docs/experiments/families-lineage.md``.

Its input is what ``lens-bias descendants --model A B C --preset family --out families`` saves: one folder per family,
each with ``fingerprints/*.pt`` and their ``labels.csv``. Saved fingerprints hold no weights, so ``"auto"`` (which
reads the token and basis maps from the weights) cannot run here; the descendants tables test it, base against each
descendant.

    python examples/families_lineage.py families --results docs/results/families_lineage.json --figure docs/assets/lineage_families.png
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from lens_bias.core.provenance import tables_record, write_results
from lens_bias.seedprint import Fingerprint, LineageMatrix, pairwise_lineage

# (align mode, m as a share of D): the published test also at lens-bias lineage's default m, 0.1·D, which the
# earlier run of this page used; every other test at the descendants tables' 0.5·D
TESTS = ((None, 0.1), (None, 0.5), ("permutation", 0.5), ("orthogonal", 0.5), ("linear", 0.5))
FIGURE_MODE = "permutation"  # the matrix the page shows


def main(argv: list[str] | None = None) -> tuple[pd.DataFrame, dict[str, LineageMatrix]]:
    """The table (one row per test) and each test's matrix, by the table's key."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="the --out folder of a several-family lens-bias descendants run")
    parser.add_argument("--results", default=None, metavar="PATH", help="also write the table as a results file")
    parser.add_argument("--figure", default=None, metavar="PATH", help=f"save the {FIGURE_MODE} test's −log10 p matrix here")
    args = parser.parse_args(argv)

    folders = sorted(p.parent for p in Path(args.folder).glob("*/fingerprints/labels.csv"))  # one per family
    if not folders:
        parser.error(f"{args.folder} holds no FAMILY/fingerprints/labels.csv: pass the --out folder of lens-bias descendants with several --model")
    labels = {row.model: row.base for folder in folders for row in pd.read_csv(folder / "labels.csv").itertuples()}
    files = sorted(f for folder in folders for f in folder.glob("*.pt"))
    names = [f.name for f in files]
    prints = [Fingerprint.load(f) for f in files]
    randoms = [fp for name, fp in zip(names, prints) if labels[name] == name]  # a random init is its own base
    rows, apart, matrices = [], [], {}
    for mode, ratio_k in TESTS:
        began = time.perf_counter()
        result = pairwise_lineage(prints, names=names, labels=labels, align=mode, ratio_k=ratio_k,
                                  null_fingerprints=randoms if mode is not None else (), progress=False)
        pairs = result.to_pandas().query("tested")
        same = pairs.same_base
        key = f"{str(mode).lower()}_{ratio_k:g}".replace(".", "")
        matrices[key] = result
        rows.append({"key": key, "mode": "None (published)" if mode is None else f'"{mode}"', "m": f"{ratio_k:g}·D",
                     "null": "analytic" if mode is None else "seeds (the saved random inits of the width)",
                     "auc": result.metrics["auc"], "tpr_at_1pct_fpr": result.metrics["tpr_at_1pct_fpr"],
                     "related_found": int((pairs.related & same).sum()), "related": int(same.sum()),
                     "unrelated_called": int((pairs.related & ~same).sum()), "unrelated": int((~same).sum()),
                     "families": len(result.families), "seconds": time.perf_counter() - began})
        apart += _apart(rows[-1]["mode"], rows[-1]["m"], result.families, labels, {n for n in names if labels[n] != n})
        if mode == FIGURE_MODE and args.figure:
            result.plot().savefig(args.figure, dpi=120)
        print(result.summary(), "\n")
    table = pd.DataFrame(rows)
    print(table.to_string())
    if args.results:  # docs/render.py renders the page's table from it
        bases = sum(name.endswith("--base.pt") for name in names)
        numbers = {"models": len(files), "bases": bases, "descendants": len(files) - bases - len(randoms), "random_inits": len(randoms),
                   "pairs": int(len(pairs)), "pairs_across_widths": len(files) * (len(files) - 1) // 2 - int(len(pairs))}  # pairs tested: of one width
        command = " ".join(["python examples/families_lineage.py", *(argv if argv is not None else sys.argv[1:])])
        write_results(args.results, tables_record({"tests": table, "apart": pd.DataFrame(apart)}, {"tests": ["key"], "apart": ["test", "base"]},
                                                  {"auc": ".4f", "tpr_at_1pct_fpr": ".3f", "seconds": ".0f"},
                                                  ("examples/families_lineage.py", "lens_bias/seedprint"), command, numbers=numbers))
    return table, matrices


def _apart(mode: str, m: str, families: list[list[str]], labels: dict[str, str], descended: set[str]) -> list[dict]:
    """For each base: how many of its descendants one test puts in the base's family, and which it leaves apart."""
    rows = []
    for base in sorted({labels[name] for name in descended}):
        own = {name for name in descended if labels[name] == base and not name.endswith("--base.pt")}
        family = next(set(f) for f in families if f"{base}--base.pt" in f)
        left = sorted(name.removeprefix(f"{base}--").removesuffix(".pt") for name in own - family)
        rows.append({"test": f"{mode}, m {m}", "base": base, "in_its_family": len(own & family), "descendants": len(own),
                     "left_apart": ", ".join(left) or "none"})
    return rows


if __name__ == "__main__":
    main()
