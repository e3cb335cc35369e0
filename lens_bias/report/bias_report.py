"""``analyze(model)``: the report of any TransformerLens model, as a random init or as a trained model.

A section is one :class:`~lens_bias.analyses.base.Analysis` subclass (it registers itself in ``SECTIONS``); all
requested sections share one batched forward pass over the same inputs. The model's regime
(``ModelInfo.regime``, or ``analyze(..., regime=...)``) decides the report's order and
headline: a random init's opens with what it was born with (token preference, contraction, ...), a trained
model's with the anatomy of its sink (:mod:`lens_bias.report.anatomy`), and laws that hold only at init are
compared with only there.
"""

from __future__ import annotations

import copy
import dataclasses
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import torch

from lens_bias.analyses.base import SECTIONS, Analysis, Planned, run_planned
from lens_bias.analyses.plan import PASSES, AnalyzeSettings, ExtraPass, RunPlan
from lens_bias.analyses.sink_attribution import SinkAttribution, SinkAttributionResult
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call, shared_adapters
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.inputs import resolve_inputs
from lens_bias.core.settings import overridden
from lens_bias.hooks.base import edit_records
from lens_bias.report import render
from lens_bias.report.data import ReportData
from lens_bias.report.layout import Layout

__all__ = ["BiasReport", "analyze", "plan_run", "AnalyzeSettings", "SECTIONS", "PASSES"]



class BiasReport(ReportData):
    """What a model is born with, section by section (:class:`~lens_bias.report.data.ReportData`), with its page
    (:meth:`to_html`) and its text summary (``str(report)``), both :mod:`lens_bias.report.render`'s."""

    def to_html(self, path: Union[str, Path], *, views: Mapping[str, Any] | None = None, rows: int = 8) -> Path:
        """The offline page (:func:`lens_bias.report.render.page`); ``views`` adds your own circuitsvis views at the end,
        ``rows`` is how many rows of each table the page shows.

        Returns:
            The path written.
        """
        return render.page(self, path, views=views, rows=rows)

    def __str__(self) -> str:
        return render.text(self)


def _check_device(adapter: ModelAdapter, device: Union[str, torch.device, None]) -> None:
    if device is None:
        return
    want, have = torch.device(device), adapter.device
    if want.type != have.type or (want.index is not None and want.index != have.index):
        raise LensBiasError(
            f"the model is on {have} but device={want} was requested; lens_bias never moves your model: "
            f"call model.to({str(want)!r}) first, or leave device=None"
        )


@one_adapter_per_call
def analyze(
    model: Any,
    sections: Sequence[Any] | None = None,
    settings: AnalyzeSettings | None = None,
    *,
    interventions: Sequence[Any] = (),
    progress: bool = True,
    ablations: bool | None = None,
    attribution: Union[bool, SinkAttributionResult, None] = None,
    **overrides: Any,
) -> BiasReport:
    """Measure what ``model`` is born with, or for a trained model the anatomy of its sink, on one batched pass.

    With ``inputs="tokens"`` it analyses exactly ``lens_bias.random_tokens(n_sequences, seq_len, d_vocab, seed)``.
    The run is planned once (:func:`plan_run`) before any pass.

    >>> import lens_bias
    >>> from lens_bias.analyses.token_preference import TokenPreference
    >>> m = lens_bias.models.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=32,
    ...                                  act_fn="relu", positional_embedding="none")
    >>> report = analyze(m, n_sequences=16, seq_len=8, progress=False)
    >>> list(report.contraction.to_pandas().layer)
    ['embed', '0', '1', 'final']
    >>> len(analyze(m, [TokenPreference(top_k=5)], n_sequences=16, seq_len=8, progress=False).token_preference.to_pandas())
    5

    Args:
        model: a TL 4.x TransformerBridge, a TL 3.x HookedTransformer, or a HookedRootModule with standard hook
            names. It is never modified.
        sections: what to compute, as names or objects: sections (``SECTIONS``, e.g. ``TokenPreference(top_k=50)``)
            and passes of their own (``PASSES``: "ablations", "sink_attribution", "sink_heads"); ``...`` stands for
            the whole default report, so ``[..., "ablations"]`` adds the ablation table to it. Default: every
            section that can run on the model (the others are listed in ``report.skipped`` with the reason) and the
            passes a whole report runs (a trained model's strongest sink heads). Only the passes of what is named run.
        settings: how it runs (:class:`~lens_bias.analyses.plan.AnalyzeSettings`: inputs, n_sequences, seq_len,
            seed, batch_size, device, regime); keywords naming its fields override it (``n_sequences=64``).
        interventions: lens_bias.hooks interventions (or lists of them) attached for the pass; the report records
            them (``report.interventions``, their ``to_dict()``).
        progress: show tqdm progress bars.
        ablations: deprecated: name "ablations" in ``sections``.
        attribution: deprecated: name "sink_attribution" in ``sections``, or pass ``SinkAttribution(result=...)``.

    Returns:
        A :class:`BiasReport`.
    """
    sections = _old_spellings(sections, ablations, attribution)
    plan = plan_run(model, sections, overridden(AnalyzeSettings, settings, overrides, "analyze()"), interventions=interventions, progress=progress)
    records = edit_records(interventions)  # before the pass: an edit that cannot be recorded fails now
    with shared_adapters({id(model): plan.adapter}):  # helpers read the plan's regime too
        results = run_planned(plan.adapter, plan.inputs, plan.spec, plan.sections, batch_size=plan.settings.batch_size,
                              interventions=interventions, progress=progress)
        for extra in plan.passes:  # after the shared pass: a count the memory guard refuses was refused by it, after one batch
            if extra.applies(plan, results):
                results[extra.name] = extra.run(plan, results)
    return BiasReport(model=plan.adapter.info, inputs=plan.spec, sections=results, interventions=records, skipped=dict(plan.skipped))


def plan_run(model: Any, sections: Sequence[Any] | None = None, settings: AnalyzeSettings | None = None, *,
             interventions: Sequence[Any] = (), progress: bool = True) -> RunPlan:
    """What ``analyze`` would run, decided once and checked before any pass: the sections with their probes, the
    passes, the inputs and their kind, the regime. ``analyze`` runs exactly this plan.

    >>> import lens_bias
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=16)
    >>> plan = plan_run(m, [..., "ablations"], AnalyzeSettings(n_sequences=4, seq_len=8))
    >>> [p.name for p in plan.passes], plan.spec.kind, plan.regime
    (['ablations'], 'tokens', 'init')

    Raises:
        LensBiasError: an unknown or unavailable section, or inputs and options that cannot go together.
    """
    settings = settings or AnalyzeSettings()
    adapter = ModelAdapter.of(model)
    _check_device(adapter, settings.device)
    if settings.regime is not None:  # the override holds for this call only: a copy of the adapter, its hook names kept
        adapter = copy.copy(adapter)
        adapter.info = dataclasses.replace(adapter.info, regime=Layout(settings.regime).regime)  # Layout refuses a regime it does not know
    layout = Layout(adapter.info.regime)
    planned, passes, skipped = _planned(adapter, layout, sections)
    data, spec = resolve_inputs(settings.inputs, model=model, d_vocab=adapter.info.d_vocab, n_sequences=settings.n_sequences,
                                seq_len=settings.seq_len, seed=settings.seed)
    plan = RunPlan(adapter=adapter, settings=settings, sections=planned, passes=passes, skipped=skipped, inputs=data, spec=spec,
                   interventions=interventions, progress=progress)
    if spec.n < 2:
        raise LensBiasError(f"analyze needs at least 2 sequences (cosines between sequences), got {spec.n}")
    if spec.seq_len < 2:
        raise LensBiasError(f"analyze needs seq_len >= 2 (cosines between positions), got {spec.seq_len}")
    for extra in passes:
        extra.check(plan)
    return plan


def _old_spellings(sections: Sequence[Any] | None, ablations: bool | None, attribution: Any) -> Sequence[Any] | None:
    """``ablations=`` and ``attribution=`` as the sections they now are, with a DeprecationWarning at the caller's line
    (four frames up: this, ``analyze``, the one-adapter wrapper, the caller)."""
    added: list[Any] = []
    if ablations is not None:
        warnings.warn('analyze(ablations=True) is deprecated: name it among the sections, sections=[..., "ablations"]', DeprecationWarning, stacklevel=4)
        added += ["ablations"] if ablations else []
    if attribution is not None:
        warnings.warn('analyze(attribution=...) is deprecated: name it among the sections, sections=[..., "sink_attribution"] '
                      "(or SinkAttribution(result=...) for one already run)", DeprecationWarning, stacklevel=4)
        if isinstance(attribution, SinkAttributionResult):
            added.append(SinkAttribution(result=attribution))
        elif attribution:
            added.append("sink_attribution")
    if not added:
        return sections
    return [*(sections if sections is not None else [...]), *added]


def _planned(adapter: ModelAdapter, layout: Layout, sections: Sequence[Any] | None) -> tuple[list[Planned], list[ExtraPass[Any]], dict[str, str]]:
    """The sections to run, in report order, with their probes; the passes, in the order they run; and the sections
    a default run leaves out (those that cannot run on the model) with the reason."""
    wanted = [...] if sections is None else list(sections)
    if isinstance(sections, (str, Analysis, ExtraPass)):
        raise WrongType(f"sections takes a list of names or objects, got one {type(sections).__name__}: pass [{sections!r}]")
    named: dict[str, Analysis[Any] | ExtraPass[Any]] = {}
    for item in wanted:
        if item is ...:
            continue
        thing = _as_object(item)
        if thing.name in named:
            raise LensBiasError(f"section {thing.name!r} is named twice; name it once (an object carries its own settings)")
        named[thing.name] = thing
    skipped: dict[str, str] = {}
    planned: dict[str, Planned] = {}
    if ... in wanted:  # the whole default report: every section that can run, the others listed with the reason
        for name, cls in SECTIONS.items():
            if name not in named:
                plan = cls().planned(adapter)
                if plan.unavailable is None:
                    planned[name] = plan
                else:
                    skipped[name] = plan.unavailable
        named.update({name: cls() for name, cls in PASSES.items() if name not in named and cls().in_default(layout.regime)})
    for name, thing in named.items():
        if isinstance(thing, Analysis):
            plan = thing.planned(adapter)
            if plan.unavailable is not None:
                raise LensBiasError(f"section {name} cannot run on this model: {plan.unavailable}; leave it out")
            planned[name] = plan
    ordered = [planned[name] for name in layout.section_order(list(planned))]
    passes = sorted((t for t in named.values() if isinstance(t, ExtraPass)), key=lambda p: p.order)
    return ordered, passes, skipped


def _as_object(item: Any) -> Analysis[Any] | ExtraPass[Any]:
    """A section list's entry as the section or pass it names (an object stands for itself)."""
    if isinstance(item, (Analysis, ExtraPass)):
        return item
    if isinstance(item, str) and item in SECTIONS:
        return SECTIONS[item]()
    if isinstance(item, str) and item in PASSES:
        return PASSES[item]()
    if isinstance(item, str):
        raise LensBiasError(f"unknown section {item!r}; choose from {list(SECTIONS)} and the passes {list(PASSES)}")
    raise WrongType(f"a section is a name, an Analysis or an ExtraPass object, or ..., got {type(item).__name__}")
