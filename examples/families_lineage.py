"""Every pair of the three families' models at once, under every test: ``compare``'s default (``"auto"``), the
published test and the three activation-fitted alignments, corrected for testing all pairs (Holm) and grouped into
families; the metrics per test, per family and pooled. The tables of ``docs/experiments/families-lineage.md``.

Its input is what ``lens-bias descendants --model A B C --preset family --out families`` saves: one folder per family,
each with ``fingerprints/*.pt`` and their ``labels.csv``, and ``readings/*.pt`` (each model's embedding table and its
fingerprints with the tokens they read: :mod:`lens_bias.seedprint.readings`), from which ``"auto"`` reads its maps.

    python examples/families_lineage.py families --results docs/results/families_lineage.json --figure docs/assets/lineage_families.png
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from lens_bias.core.provenance import command_line, tables_record, write_results
from lens_bias.experiments.descendant_scores import lineage_metrics
from lens_bias.seedprint import Fingerprint, LineageMatrix, pairwise_lineage
from lens_bias.seedprint.readings import ReadingFiles

# (align mode, m as a share of D): the published test also at lens-bias lineage's default m, 0.1·D, which the
# earlier run of this page used; every other test at the descendants tables' 0.5·D
TESTS = (("auto", 0.5), (None, 0.1), (None, 0.5), ("permutation", 0.5), ("orthogonal", 0.5), ("linear", 0.5))
FIGURE_MODE = "auto"  # the matrix the page shows: the default test


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
    # "auto" reads each model's reading (saved beside its fingerprint under its name), one family's at a time
    readings = ReadingFiles({f.name: f.parent.parent / "readings" / f.name for f in files}, hold=max(len(list(folder.glob("*.pt"))) for folder in folders))
    rows, apart, matrices, metrics, maps = [], [], {}, [], []
    for mode, ratio_k in TESTS:
        began = time.perf_counter()
        result = pairwise_lineage(prints, names=names, labels=labels, align=mode, ratio_k=ratio_k, readings=readings if mode == "auto" else None,
                                  null_fingerprints=randoms if mode not in (None, "auto") else (), progress=False)
        pairs = result.to_pandas().query("tested")
        same = pairs.same_base
        key = f"{str(mode).lower()}_{ratio_k:g}".replace(".", "")
        matrices[key] = result
        rows.append({"key": key, "mode": {None: "None (published)", "auto": '"auto" (the default)'}.get(mode, f'"{mode}"'), "m": f"{ratio_k:g}·D",
                     "null": {None: "analytic", "auto": "analytic, after the maps"}.get(mode, "seeds (the saved random inits of the width)"),
                     "auc": result.metrics["auc"], "tpr_at_1pct_fpr": result.metrics["tpr_at_1pct_fpr"],
                     "related_found": int((pairs.related & same).sum()), "related": int(same.sum()),
                     "unrelated_called": int((pairs.related & ~same).sum()), "unrelated": int((~same).sum()),
                     "untestable": len(result.untestable), "families": len(result.families), "seconds": time.perf_counter() - began})
        apart += _apart(rows[-1]["mode"], rows[-1]["m"], result.families, labels, {n for n in names if labels[n] != n})
        metrics.append(_per_family(key, pairs))
        if mode == "auto":
            maps = _maps(pairs)
        if mode == FIGURE_MODE and args.figure:
            result.plot().savefig(args.figure, dpi=120)
        print(result.summary(), "\n")
    table = pd.DataFrame(rows)
    print(table.to_string())
    if args.results:  # docs/render.py renders the page's table from it
        bases = sum(name.endswith("--base.pt") for name in names)
        numbers = {"models": len(files), "bases": bases, "descendants": len(files) - bases - len(randoms), "random_inits": len(randoms),
                   "pairs": int(len(pairs)), "pairs_across_widths": len(files) * (len(files) - 1) // 2 - int(len(pairs))}  # pairs tested: of one width
        command = command_line(__file__, argv)
        per_family = pd.concat(metrics, ignore_index=True)
        write_results(args.results, tables_record({"tests": table, "apart": pd.DataFrame(apart), "per_family": per_family, "auto_maps": maps},
                                                  {"tests": ["key"], "apart": ["test", "base"], "per_family": ["test", "family"],
                                                   "auto_maps": ["pairs", "token_source", "basis_map"]},
                                                  {"auc": ".4f", "tpr_at_1pct_fpr": ".3f", "tpr_at_alpha": ".3f", "fpr_at_alpha": ".3f", "seconds": ".0f",
                                                   "largest_fit": ".3g", "smallest_fit": ".3g"},
                                                  ("examples/families_lineage.py", "lens_bias/seedprint", "lens_bias/experiments/descendant_scores.py"), command, numbers=numbers))
    return table, matrices


def _per_family(key: str, pairs: pd.DataFrame) -> pd.DataFrame:
    """One test's metrics per family (a family's base, descendants and random inits: one width) and pooled, with the
    FPR measured at α (unrelated pairs at raw p < α). A pair whose tables overrule its p (``"auto"`` between trained
    models) scores as p = 1, as its verdict does."""
    overruled = pairs.get("tables_disagree", pd.Series(False, index=pairs.index)).eq(True)
    scored = pairs.assign(family=pairs.a.str.split("--").str[0], align=key, related=pairs.same_base,
                          score=(-pairs.log10_p).where(~overruled, 0.0), p=(10.0 ** pairs.log10_p).where(~overruled, 1.0))
    table = lineage_metrics(scored).rename(columns={"align": "test"})
    return table[["test", "family", "auc", "tpr_at_1pct_fpr", "tpr_at_alpha", "fpr_at_alpha", "positives", "negatives"]]


def _maps(pairs: pd.DataFrame) -> pd.DataFrame:
    """What ``"auto"`` read, per kind of pair (related or not) and maps: how many pairs, how many it called related,
    the basis maps' fits, and the fewest inputs a pair was tested on (fewer than all where its token map pairs some
    token otherwise than the map a saved fingerprint was made through: ``readings.MIN_SHARE``)."""
    kinds = pairs.assign(pairs=pairs.same_base.map({True: "related", False: "unrelated"}))
    return (kinds.groupby(["pairs", "token_source", "basis_map"]).agg(count=("a", "size"), called_related=("related", "sum"),
                                                                     smallest_fit=("basis_fit", "min"), largest_fit=("basis_fit", "max"),
                                                                     fewest_inputs=("inputs", "min"))
            .reset_index().astype({"called_related": int, "fewest_inputs": int}))


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
