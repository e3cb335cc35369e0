"""How the descendants experiment scores what it tested: each pair judged under each align mode, LeaFBench's
metrics over the pairs, the result with its tables, and the results record of a run over several families.

:func:`lineage_metrics` also scores pairs tested elsewhere (``examples/families_lineage.py`` scores every pair of
the families' saved models with it).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Union

import pandas as pd

from lens_bias import seedprint
from lens_bias.core.provenance import numbers_of, results_record, table_of
from lens_bias.core.stats import detection_metrics
from lens_bias.core.tables import markdown_table
from lens_bias.seedprint.lineage import ALPHA, STRONG

__all__ = ["DescendantsResult", "judge_pairs", "lineage_metrics", "families_record", "slug", "DEPENDS"]


@dataclass
class DescendantsResult:
    """One row per (target, align mode): the base against each descendant and each random init; per mode the metrics."""

    table: pd.DataFrame  # target, kind, align, covered, tau_bar, k, z, p, log10_p, verdict, expected, ok
    models: pd.DataFrame  # target, kind, weight_change, eval_loss, seconds (to make and fingerprint it)
    metrics: pd.DataFrame  # per align mode: LeaFBench's metrics over every pair (score −log10 p)
    base_eval_loss: float  # held-out code loss of the base (nats)
    fingerprints: dict[str, seedprint.Fingerprint]  # "base" and every target: re-test with another m or null
    config: dict[str, Any]
    seconds: float
    pairs: pd.DataFrame = field(default_factory=pd.DataFrame)  # every tested pair: align, a, b, related, score (−log10 p), p
    not_made: dict[str, str] = field(default_factory=dict)  # descendants this architecture cannot have, and why

    @property
    def all_as_expected(self) -> bool:
        return bool(self.table.ok.all())

    def to_pandas(self) -> pd.DataFrame:
        return self.table.copy()

    def save_fingerprints(self, folder: Union[str, Path], family: str) -> Path:
        """Write every fingerprint to ``folder`` as ``FAMILY--TARGET.pt`` and their bases to ``labels.csv`` (the base
        and its descendants share ``family``; each random init is its own), so that ``lens-bias lineage`` tests every
        pair of these models, and of other families' folders, without making them again.

        Returns:
            The labels file, for ``lens-bias lineage FOLDER... --labels``.
        """
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        rows = []
        for target, fp in self.fingerprints.items():
            name = f"{slug(family)}--{slug(target)}.pt"
            fp.save(folder / name)
            rows.append({"model": name, "base": slug(family) if not target.startswith("random init") else name})
        labels = folder / "labels.csv"
        pd.DataFrame(rows).to_csv(labels, index=False)
        return labels

    def markdown(self) -> str:
        """The verdicts (one column of log10 p per align mode), the models, the metrics."""
        t = self.table
        wide = t.pivot(index="target", columns="align", values="log10_p").reindex(self.models.target)
        verdict = t.assign(mark=[("" if ok else "✗") for ok in t.ok]).pivot(index="target", columns="align", values="mark").reindex(self.models.target)
        tau = t.pivot(index="target", columns="align", values="tau_bar").reindex(self.models.target)
        modes = list(dict.fromkeys(t["align"]))
        shown = pd.DataFrame({"target": self.models.target.values})
        for mode in modes:
            shown[f"{mode} τ̄"] = [f"{v:.3f}" for v in tau[mode].values]
            shown[f"{mode} log10 p"] = [f"{v:.1f}{m}" for v, m in zip(wide[mode].values, verdict[mode].values)]
        models = self.models.assign(eval_loss=["" if math.isnan(v) else f"{v:.3f}" for v in self.models.eval_loss])
        return (
            markdown_table(shown) + "\n\n(✗: not the expected verdict: related at p < 1e-10 where the mode covers the descendant, unrelated "
            "(p ≥ 0.01) for a random init; a descendant a mode does not cover is expected nothing)\n\n"
            + markdown_table(models, formats={"weight_change": ".3g", "seconds": ".0f"}) + "\n\n"
            + markdown_table(self.metrics, formats={c: ".4f" for c in ("auc", "accuracy", "tpr", "fpr", "tpr_at_1pct_fpr", "tpr_at_alpha", "fpr_at_alpha")})
            + f"\n\nbase code loss {self.base_eval_loss:.3f} nats\n"
            + "".join(f"\nnot made: {name}: {reason}\n" for name, reason in self.not_made.items())
        )


def judge_pairs(
    align_modes: tuple, ratio_k: float, base: seedprint.Fingerprint, prints: dict[str, seedprint.Fingerprint], covers: dict[str, tuple],
    randoms: list[str], targets: list[str], autos: dict[str, seedprint.SeedPrintResult],
    auto_pair: Callable[[str, str], seedprint.SeedPrintResult],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Under each align mode: the base against every target (a row each), the random inits against each other (more
    unrelated pairs at no fingerprinting cost: TPR at 1% FPR needs them), and the metrics over all those pairs.
    "auto" reads its tests of the base from ``autos`` and tests a pair of random inits with ``auto_pair``."""
    tests: list[dict[str, Any]] = []
    metrics: list[dict[str, Any]] = []
    pairs: list[dict[str, Any]] = []

    def test(a: seedprint.Fingerprint, b: seedprint.Fingerprint, mode: Any, tested: tuple[str, ...]) -> seedprint.SeedPrintResult:
        if mode == "auto":
            return autos[tested[0]] if len(tested) == 1 else auto_pair(*tested)
        null = seedprint.AnalyticNull() if mode is None else seedprint.SeedsNull(
            fingerprints=[prints[r] for r in randoms if r not in tested], label="random inits of the config")
        return seedprint.lineage_test(a, b, ratio_k=ratio_k, alpha=ALPHA, align=mode, null=null)

    for mode in align_modes:
        first = len(pairs)
        for name in targets:
            descendant = name not in randoms
            res = test(base, prints[name], mode, (name,))
            covered = descendant and mode in covers[name]
            expected = f"related, p < {STRONG:g}" if covered else "unrelated" if not descendant else "—"
            ok = res.same_lineage and res.p < STRONG if covered else not res.same_lineage if not descendant else True
            tests.append({"target": name, "kind": "descendant" if descendant else "random init", "align": str(mode), "covered": covered,
                          "tau_bar": res.tau_bar, "k": res.k, "z": res.z, "p": res.p, "log10_p": res.log10_p,
                          "verdict": "related" if res.same_lineage else "unrelated", "expected": expected, "ok": ok})
            pairs.append({"align": str(mode), "a": "base", "b": name, "related": descendant, **_scored(res)})
        for i, one in enumerate(randoms):
            for other in randoms[i + 1:]:
                res = test(prints[one], prints[other], mode, (one, other))
                pairs.append({"align": str(mode), "a": one, "b": other, "related": False, **_scored(res)})
        metrics.append({"align": str(mode), **_metrics(pd.DataFrame(pairs[first:])).iloc[0].to_dict()})
    return tests, metrics, pairs


def _scored(res: seedprint.SeedPrintResult) -> dict[str, float]:
    """A pair's score (−log10 p) and p for the metrics; a pair whose tables overrule p scores as p = 1."""
    return {"score": 0.0, "p": 1.0} if res.tables_disagree else {"score": -res.log10_p, "p": res.p}


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text).strip("-")


def _metrics(pairs: pd.DataFrame) -> pd.DataFrame:
    """LeaFBench's metrics of one set of pairs (score −log10 p), and the verdicts' own rates at α: the share of
    related pairs called related (TPR at α) and of unrelated pairs called related (the FPR measured)."""
    related = pairs["related"].astype(bool).to_numpy()
    called = (pairs["p"] < ALPHA).to_numpy()
    return pd.DataFrame([{**detection_metrics(pairs["score"].tolist(), related.tolist()),
                          "tpr_at_alpha": float(called[related].mean()) if related.any() else float("nan"),
                          "fpr_at_alpha": float(called[~related].mean()) if (~related).any() else float("nan")}])


def lineage_metrics(pairs: pd.DataFrame) -> pd.DataFrame:
    """The metrics per align mode of every family's pairs and of all of them pooled.

    >>> import pandas as pd
    >>> pairs = pd.DataFrame({"family": ["a", "a", "b", "b"], "align": ["None"] * 4, "related": [True, False, True, False],
    ...                       "score": [30.0, 0.5, 20.0, 1.0], "p": [1e-30, 0.3, 1e-20, 0.1]})
    >>> lineage_metrics(pairs)[["family", "align", "auc", "fpr_at_alpha"]].values.tolist()
    [['a', 'None', 1.0, 0.0], ['b', 'None', 1.0, 0.0], ['pooled', 'None', 1.0, 0.0]]

    Args:
        pairs: the ``pairs`` table of each family's :class:`DescendantsResult`, with a ``family`` column, concatenated.

    Returns:
        One row per (family or "pooled", align mode).
    """
    rows = [_metrics(group).assign(family=family, align=mode) for (family, mode), group in pairs.groupby(["family", "align"], sort=False, dropna=False)]
    rows += [_metrics(group).assign(family="pooled", align=mode) for mode, group in pairs.groupby("align", sort=False, dropna=False)]
    table = pd.concat(rows, ignore_index=True)
    return table[["family", "align"] + [c for c in table.columns if c not in ("family", "align")]]


DEPENDS = ("lens_bias/experiments/descendants.py", "lens_bias/experiments/descendant_scores.py", "lens_bias/seedprint",
            "lens_bias/models/reparametrise.py", "lens_bias/models/transforms.py")
"""The sources a families run's numbers depend on (their hashes go in its results file)."""


def families_record(results: Mapping[str, DescendantsResult], command: str | None = None) -> dict[str, Any]:
    """The results file of one run over several families (``descendants.json``; ``docs/render.py`` writes the pages
    from it): per family, each target's τ̄ and log10 p under each mode; the metrics per family and mode and pooled.

    Args:
        results: each family's :class:`DescendantsResult`, by family name.
        command: the command line recorded (default: this process's).

    Returns:
        A results record (:func:`~lens_bias.core.provenance.results_record`).
    """
    pairs = pd.concat([r.pairs.assign(family=family) for family, r in results.items()], ignore_index=True)
    metrics = lineage_metrics(pairs)
    counts = pairs.groupby(["family", "align"], sort=False).related.agg(related="sum", pairs="size").reset_index()
    counts = pd.concat([counts, counts.groupby("align", sort=False)[["related", "pairs"]].sum().reset_index().assign(family="pooled")])
    metrics = metrics.merge(counts, on=["family", "align"])
    shown = metrics.assign(align=[_mode_name(m) for m in metrics["align"]], pairs=[f"{r} / {n - r}" for r, n in zip(metrics.related, metrics.pairs)])
    shown = shown[["family", "align", "auc", "tpr_at_1pct_fpr", "tpr_at_alpha", "fpr_at_alpha", "pairs"]].set_axis(
        ["family", "mode", "AUC", "TPR @ 1% FPR", "TPR at α", "FPR at α", "related / unrelated pairs"], axis=1)
    tables = {"metrics": table_of(shown, {c: ".3f" for c in ("AUC", "TPR @ 1% FPR", "TPR at α", "FPR at α")})}
    numbers: dict[str, Any] = {"config": next(iter(results.values())).config}
    for family, r in results.items():
        key = re.sub(r"[^a-z0-9]+", "_", family.lower()).strip("_")  # as numbers_of writes the family below
        tables[f"targets_{key}"] = table_of(_targets(r))
        numbers.update({f"{key}.seconds": round(r.seconds), f"{key}.descendants": int((r.models.kind == "descendant").sum()),
                        f"{key}.base_eval_loss": r.base_eval_loss, f"{key}.as_expected": r.all_as_expected, f"{key}.not_made": list(r.not_made)})
    keyed = metrics.assign(align=["published" if m == "None" else m for m in metrics["align"]])
    numbers.update(numbers_of(keyed[["family", "align", "auc", "tpr_at_1pct_fpr", "tpr_at_alpha", "fpr_at_alpha", "related", "pairs"]], ["family", "align"], "metrics"))
    return results_record(numbers, tables, DEPENDS, command)


def _mode_name(mode: str) -> str:
    return "None (published)" if mode == "None" else f'"{mode}"'


def _targets(result: DescendantsResult) -> pd.DataFrame:
    """Each target's τ̄ and log10 p under each mode, as one cell per mode (✗ where not the expected verdict)."""
    t = result.table
    cells = {}
    for mode, rows in t.groupby("align", sort=False):
        rows = rows.set_index("target").loc[result.models.target]
        cells[_mode_name(str(mode))] = [f"{tau:.3f} ({log_p:.{0 if log_p <= -10 else 1}f})" + ("" if ok else " ✗")
                                        for tau, log_p, ok in zip(rows.tau_bar, rows.log10_p, rows.ok)]
    return pd.DataFrame({"target": result.models.target.values, **cells})
