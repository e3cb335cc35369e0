"""The contract between an analysis and the report: declare probes, then turn what they kept into a result.

An analysis never runs the model itself; ``run_analyses`` merges the probes of every requested analysis and
runs *one* batched pass for all of them, so adding a section to ``analyze`` costs no extra forward pass.

A new section is one file in ``analyses/``: an :class:`Analysis` subclass with a ``name`` registers itself in
``SECTIONS`` when its class is defined, and its :class:`Result` says how it is titled, plotted and viewed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, Hashable, Mapping, Sequence, TypeVar

import pandas as pd
from torch import Tensor

from ._jsonable import from_jsonable, to_jsonable
from .adapter import ModelAdapter, ModelInfo, Probe
from .errors import LensBiasError
from .inputs import Inputs, InputSpec

__all__ = ["Analysis", "Result", "SECTIONS", "run_analyses"]

R = TypeVar("R", bound="Result")


class Result:
    """Base of every section's result: a dataclass with a table, headline numbers and a one-paragraph summary.

    Class attributes say how the report shows it: ``heading`` (its part of the page), ``headline_labels``
    (headline key -> label of the numbers the page opens with), ``plot_fn`` / ``plot_caption`` (a function
    ``fn(result, **kwargs) -> matplotlib Figure``) and ``view_fn`` / ``view_caption`` (``-> circuitsvis view``).
    """

    heading: ClassVar[str] = ""
    headline_labels: ClassVar[Mapping[str, str]] = {}
    plot_fn: ClassVar[Callable[..., Any] | None] = None
    plot_caption: ClassVar[str] = ""
    view_fn: ClassVar[Callable[..., Any] | None] = None
    view_caption: ClassVar[str] = ""

    def to_pandas(self) -> pd.DataFrame:
        """The section's main table."""
        raise NotImplementedError

    def headline(self) -> dict[str, Any]:
        """The few numbers the summary quotes, as plain Python values (JSON-ready)."""
        raise NotImplementedError

    def summary(self) -> str:
        """A short human-readable paragraph."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (tensors with their dtype and shape); :meth:`from_dict` gives the result back."""
        return {f.name: to_jsonable(getattr(self, f.name)) for f in fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
        """The result :meth:`to_dict` wrote (tensors equal to the last bit)."""
        names = [f.name for f in fields(cls)]  # type: ignore[arg-type]
        missing = [n for n in names if n not in d]
        if missing:
            raise LensBiasError(f"{cls.__name__}.from_dict: missing field(s) {missing}; pass what {cls.__name__}.to_dict() wrote")
        return cls(**{n: from_jsonable(d[n]) for n in names})

    def plot(self, **kwargs: Any) -> Any:
        """This section's matplotlib Figure (needs ``lens-bias[plot]``); see :mod:`lens_bias.viz`."""
        if self.plot_fn is None:
            raise LensBiasError(f"{type(self).__name__} has no figure; its numbers are in .to_pandas()")
        return type(self).plot_fn(self, **kwargs)  # through the class: a plain function, not bound to self

    def show(self, **kwargs: Any) -> Any:
        """This section's circuitsvis view (renders in Jupyter; ``viz.save_html`` writes it to a page)."""
        if self.view_fn is None:
            raise LensBiasError(f"{type(self).__name__} has no circuitsvis view (viz.attention_view(model, tokens) draws attention)")
        return type(self).view_fn(self, **kwargs)

    def __str__(self) -> str:
        return self.summary()


# Section name -> its analysis, in report order (``Analysis.order``); every named subclass adds itself.
SECTIONS: dict[str, type["Analysis"]] = {}


def _register(cls: type["Analysis"]) -> None:
    old = SECTIONS.get(cls.name)
    # Redefining the same class (a re-run notebook cell, a reload) replaces it; another class may not take the name.
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise LensBiasError(f"an analysis named {cls.name!r} already exists ({old.__module__}.{old.__qualname__}); give {cls.__qualname__} another name")
    if cls.result_type is Result:  # BiasReport.from_dict rebuilds the section through it
        raise LensBiasError(f"{cls.__qualname__} sets no result_type; set it to the Result dataclass its finalize returns")
    SECTIONS[cls.name] = cls
    ordered = sorted(SECTIONS.items(), key=lambda item: item[1].order)  # stable: equal orders keep definition order
    SECTIONS.clear()
    SECTIONS.update(ordered)  # in place: modules that imported SECTIONS see the new section


@dataclass(frozen=True)
class Analysis:
    """One measurement, registered as a report section by subclassing with a ``name``.

    Subclasses set ``name`` (the section, ``report.<name>``), ``result_type`` and optionally ``order`` (place in
    the report) and :meth:`applies_to`, and implement :meth:`probes` and :meth:`finalize`. Fields of the
    (frozen) dataclass are the analysis' parameters; ``analyze`` builds it with their defaults.
    """

    name: ClassVar[str]
    result_type: ClassVar[type[Result]] = Result
    order: ClassVar[float] = 100.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:  # a subclass without its own name is a base for others, not a section
            _register(cls)

    def applies_to(self, info: ModelInfo) -> bool:
        """Whether this model has what the analysis reads (``analyze`` leaves the others out by default)."""
        return True

    def probes(self, adapter: ModelAdapter) -> Mapping[Hashable, Probe]:
        """The hook reads this analysis needs, by names of its own choosing (e.g. ``("alpha", layer)``)."""
        raise NotImplementedError

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> Result:
        """Build the result from ``{name in probes(): tensor[n, ...]}``."""
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
    refused = [a.name for a in analyses if not a.applies_to(adapter.info)]
    if refused:
        kind = "attention-only " if adapter.info.attn_only else ""
        raise LensBiasError(f"section(s) {refused} do not apply to this {kind}{adapter.info.architecture or adapter.info.family} model; leave them out")
    wanted = [a.probes(adapter) for a in analyses]
    kept = adapter.collect(inputs, [p for probes in wanted for p in probes.values()], batch_size=batch_size, interventions=interventions, progress=progress)
    return {
        a.name: a.finalize(adapter, {local: kept[p.key] for local, p in probes.items()}, spec)
        for a, probes in zip(analyses, wanted)
    }
