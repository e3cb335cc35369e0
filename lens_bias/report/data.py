"""A report's data: the model, the inputs and each section's result, found by name or by analysis class, with
what reads them (the anatomy, the figures, the views, the headline numbers) and its JSON round trip.

Rendering it (the page, the text summary) is :mod:`lens_bias.report.render`'s; :class:`~lens_bias.report.BiasReport`
adds both to this data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, TypeVar

from lens_bias.analyses.base import SECTIONS, Analysis, Result, Results
from lens_bias.analyses.plan import PASSES
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import InputSpec
from lens_bias.core.model_facts import ModelInfo
from lens_bias.report.anatomy import SinkAnatomy, anatomy_of
from lens_bias.report.layout import Layout
from lens_bias.report.page import fmt

__all__ = ["ReportData"]

R = TypeVar("R", bound=Result)
D = TypeVar("D", bound="ReportData")



def _result_type(name: str) -> type[Result] | None:
    """The result type of a section of the shared pass (``SECTIONS``) or of one with passes of its own (``PASSES``)."""
    return SECTIONS[name].result_type if name in SECTIONS else PASSES[name].result_type if name in PASSES else None


@dataclass
class ReportData:
    """What a model is born with, section by section.

    ``sections`` holds the computed results by section name, in report order; ``report.<name>`` is one of them
    (``None`` for a known section that was not computed), and ``report.of(Sinks)`` one typed as its result.
    """

    model: ModelInfo
    inputs: InputSpec
    sections: Results = field(default_factory=Results)
    # The edits every section was measured under, as Intervention.to_dict() (empty: the unedited model).
    interventions: list[dict[str, Any]] = field(default_factory=list)
    # Sections a default run left out because they cannot run on this model -> why, in one line.
    skipped: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.sections, Results):
            self.sections = Results(self.sections)

    @property
    def layout(self) -> Layout:
        """How this report reads: the model's regime decides it once."""
        return Layout(self.model.regime)

    def of(self, analysis: type[Analysis[R]]) -> R:
        """The result of the section ``analysis`` (a class, e.g. ``Sinks``), typed as its result; KeyError when it
        was not computed."""
        return self.sections.of(analysis)

    def find(self, analysis: type[Analysis[R]]) -> R | None:
        """The result of the section ``analysis``, or None when it was not computed."""
        return self.sections.find(analysis)

    def __getattr__(self, name: str) -> Any:
        # Only reached when ordinary lookup fails: report.sinks and the other sections by name.
        sections = self.__dict__.get("sections", {})
        if name in sections:
            return sections[name]
        if name in SECTIONS or name in PASSES:
            return None
        raise AttributeError(f"BiasReport has no attribute or section {name!r}; sections: {list(SECTIONS) + list(PASSES)}, computed: {list(sections)}")

    def to_dict(self, *, results: bool = True) -> dict[str, Any]:
        """Model, inputs, interventions and each section's headline numbers and table, JSON-ready.

        Args:
            results: also each section's whole result (``Result.to_dict``: every tensor), which
                :meth:`from_dict` reads back. ``False`` keeps the summary that ``lens-bias analyze --json`` prints.
        """
        sections = {}
        for name, r in self.sections.items():
            sections[name] = {"headline": r.headline(), "table": r.to_pandas().to_dict(orient="records")}
            if results:
                sections[name]["result"] = r.to_dict()
        return {"model": self.model.to_dict(), "inputs": self.inputs.to_dict(), "interventions": self.interventions, "sections": sections,
                "skipped": dict(self.skipped)}

    @classmethod
    def from_dict(cls: type[D], d: Mapping[str, Any]) -> D:
        """The report :meth:`to_dict` wrote (with ``results=True``)."""
        sections = Results()
        for name, section in d["sections"].items():
            kind = _result_type(name)
            if kind is None:
                raise LensBiasError(f"unknown section {name!r}; import the module that defines its Analysis or ExtraPass before BiasReport.from_dict")
            if "result" not in section:
                raise LensBiasError(f"section {name!r} holds only its summary: write the report with to_dict(results=True)")
            sections[name] = kind.from_dict(section["result"])
        return cls(model=ModelInfo.from_dict(d["model"]), inputs=InputSpec.from_dict(d["inputs"]), sections=sections,
                   interventions=list(d["interventions"]), skipped=dict(d.get("skipped", {})))

    def anatomy(self) -> SinkAnatomy | None:
        """The anatomy of the first-token sink (super weight → massive dim → disparity → sink) from the computed
        sections, or None without the ``sinks`` and ``super_neurons`` sections. A trained model's report opens with it."""
        return anatomy_of(self.sections)

    def figures(self) -> dict[str, Any]:
        """matplotlib figures of the computed sections that have one (``result.plot()``; needs ``lens-bias[plot]``)."""
        return {r.plot_caption or name: r.plot() for name, r in self.sections.items() if r.has_figure}

    def views(self) -> dict[str, Any]:
        """circuitsvis views of the computed sections that have one (``result.show()``), by heading."""
        return {caption: view for r in self.sections.values() if r.has_view for caption, view in r.views().items()}

    def headline_table(self) -> list[tuple[str, str, str]]:
        """The report's headline numbers as (section, number, value) rows, each once and only where it applies: a
        trained model's page gives its sink's anatomy a block of its own (:meth:`anatomy`), so its rows here are
        the other sections' numbers that mean something for a trained model (``Result.trained_headline``); a random
        init's, those that mean something at init (``Result.init_headline``)."""
        rows = []
        for name, result in self.sections.items():
            numbers = result.headline()
            applies = self.layout.headline_keys(result)
            for key, label in result.headline_labels.items():
                if applies is not None and key not in applies:
                    continue
                value = numbers.get(key)
                if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):  # names: all of them
                    value = ", ".join(value) or "none"
                elif isinstance(value, (list, tuple)):  # per layer: the first layer's
                    value = value[0] if value else None
                if value is not None:
                    rows.append((result.heading or name, label, fmt(value)))
        return rows
