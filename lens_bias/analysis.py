"""The contract between an analysis and the report: declare probes, then turn what they kept into a result.

An analysis never runs the model itself; ``run_analyses`` merges the probes of every requested analysis and
runs *one* batched pass for all of them, so adding a section to ``analyze`` costs no extra forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

import pandas as pd
from torch import Tensor

from .adapter import ModelAdapter, Probe
from .inputs import Inputs, InputSpec

__all__ = ["Analysis", "Result", "run_analyses"]


class Result:
    """Base of every section's result: a dataclass with a table, headline numbers and a one-paragraph summary."""

    def to_pandas(self) -> pd.DataFrame:
        """The section's main table."""
        raise NotImplementedError

    def headline(self) -> dict[str, Any]:
        """The few numbers the summary quotes, as plain Python values (JSON-ready)."""
        raise NotImplementedError

    def summary(self) -> str:
        """A short human-readable paragraph."""
        raise NotImplementedError

    def plot(self, **kwargs: Any) -> Any:
        """This section's matplotlib Figure (needs ``lens-bias[plot]``); see :mod:`lens_bias.viz`."""
        from . import viz

        return viz.plot(self, **kwargs)

    def show(self, **kwargs: Any) -> Any:
        """This section's circuitsvis view (renders in Jupyter; ``viz.save_html`` writes it to a page)."""
        from . import viz

        return viz.show(self, **kwargs)

    def __str__(self) -> str:
        return self.summary()


@dataclass(frozen=True)
class Analysis:
    """One measurement. Subclasses set ``name`` (the BiasReport field) and implement the two methods."""

    name: ClassVar[str]

    def probes(self, adapter: ModelAdapter) -> list[Probe]:
        """The hook reads this analysis needs; ``adapter.require`` is checked by the runner."""
        raise NotImplementedError

    def finalize(self, adapter: ModelAdapter, kept: Mapping[str, Tensor], spec: InputSpec) -> Result:
        """Build the result from ``{probe.key: tensor[n, ...]}``."""
        raise NotImplementedError


def run_analyses(
    adapter: ModelAdapter,
    inputs: Inputs,
    spec: InputSpec,
    analyses: Sequence[Analysis],
    *,
    batch_size: int | None = None,
    interventions: Sequence[Any] = (),
    progress: bool = True,
) -> dict[str, Result]:
    """Run every analysis on ``inputs`` with one shared batched forward pass; results by analysis name.

    ``interventions``: lens_bias.hooks interventions and/or ``(hook_name, fn)`` pairs attached for the pass, as in
    :meth:`~lens_bias.adapter.ModelAdapter.collect`.
    """
    probes = [p for a in analyses for p in a.probes(adapter)]
    kept = adapter.collect(inputs, probes, batch_size=batch_size, interventions=interventions, progress=progress)
    return {a.name: a.finalize(adapter, kept, spec) for a in analyses}
