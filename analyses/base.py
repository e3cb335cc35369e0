"""The contract between an analysis and the report: declare probes, then turn what they kept into a result.

An analysis never runs the model itself; ``run_analyses`` merges the probes of every requested analysis and
runs *one* batched pass for all of them, so adding a section to ``analyze`` costs no extra forward pass.

A new section is one file in ``analyses/``: an :class:`Analysis` subclass with a ``name`` registers itself in
``SECTIONS`` when its class is defined (every module of ``lens_bias.analyses`` is imported, no import line
needed), and its :class:`Result` says how it is titled, and plotted and viewed when it overrides :meth:`Result.plot`
and :meth:`Result.show`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Hashable, Mapping, Sequence, TypeVar, Union, cast, get_args, get_origin

import pandas as pd
from jaxtyping import Int
from torch import Tensor

from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import Inputs, InputSpec, RandomTokens
from lens_bias.core.model_facts import ModelInfo
from lens_bias.core.probes import Probe
from lens_bias.core.registry import Registry
from lens_bias.core.serialise import Serialisable
from lens_bias.hooks.base import edit_hooks, fix_for_inputs

__all__ = ["Analysis", "Planned", "Result", "Results", "SECTIONS", "run_analyses", "run_planned", "measure", "result_type_of"]


class Result(Serialisable):
    """Base of every section's result: a dataclass with a table, headline numbers and a one-paragraph summary.

    Class attributes say how the report shows it: ``heading`` (its part of the page), ``headline_labels``
    (headline key -> label of the numbers the page opens with), ``trained_headline`` and ``init_headline`` (the keys
    among them that mean something for a trained model, for a random init; None: all), ``key_column`` (the page shows the rows with its largest values), ``column_words``,
    ``plot_caption`` and ``view_caption``. A result
    with a figure overrides :meth:`plot`, one with a circuitsvis view overrides :meth:`show`. ``to_dict`` /
    ``from_dict`` write and read every field (tensors exactly).
    """

    heading: ClassVar[str] = ""
    headline_labels: ClassVar[Mapping[str, str]] = {}
    trained_headline: ClassVar[tuple[str, ...] | None] = None
    init_headline: ClassVar[tuple[str, ...] | None] = None
    key_column: ClassVar[str] = ""
    # This table's columns in words with their units, for the page (to_pandas keeps the short names for code); a key
    # may be a regular expression of numbered columns (r"sink_(\d+)": r"Sink_\1 (%)"). Columns that name a row
    # (layer, head, condition, ...) read as they are.
    column_words: ClassVar[Mapping[str, str]] = {}
    plot_caption: ClassVar[str] = ""
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

    def page_summary(self) -> str:
        """What the report page prints beside the figure: the summary, less what the page's table already shows."""
        return self.summary().replace("to_pandas()", "the CSV")

    def plot(self) -> Any:
        """This section's matplotlib Figure (needs ``lens-bias[plot]``)."""
        raise LensBiasError(f"{type(self).__name__} has no figure; its numbers are in .to_pandas()")

    def show(self) -> Any:
        """This section's circuitsvis view (renders in Jupyter; ``lens_bias.viz.save_html`` writes it to a page)."""
        raise LensBiasError(f"{type(self).__name__} has no circuitsvis view (lens_bias.viz.attention_view(model, tokens) draws attention)")

    def views(self) -> dict[str, Any]:
        """Every circuitsvis view of this section by caption (one, :meth:`show`'s, unless a section has more)."""
        return {self.view_caption or type(self).__name__: self.show()}

    @property
    def has_figure(self) -> bool:
        return type(self).plot is not Result.plot

    @property
    def has_view(self) -> bool:
        return type(self).show is not Result.show

    @classmethod
    def column_in_words(cls, column: str) -> str | None:
        """``column`` in words with its unit (from ``column_words``), or None where this result names none."""
        if column in cls.column_words:
            return cls.column_words[column]
        for pattern, words in cls.column_words.items():
            if re.fullmatch(pattern, column):
                return re.sub(pattern, words, column)
        return None

    def __str__(self) -> str:
        return self.summary()


def result_type_of(cls: type, generic: type) -> type[Result] | None:
    """The Result a subclass names as ``generic``'s argument (``class Sinks(Analysis[SinksResult])``), or None."""
    typed = [get_args(base)[0] for base in getattr(cls, "__orig_bases__", ()) if get_origin(base) is generic and get_args(base)]
    return typed[0] if typed and isinstance(typed[0], type) and issubclass(typed[0], Result) else None


# Section name -> its analysis, in report order (``Analysis.order``); every named subclass adds itself.
SECTIONS: Registry[type["Analysis"]] = Registry("analysis", order=lambda cls: cls.order)


R = TypeVar("R", bound=Result)


@dataclass(frozen=True)
class Analysis(Generic[R]):
    """One measurement, registered as a report section by subclassing with a ``name``.

    A subclass names its result type as the generic argument (``class Sinks(Analysis[SinksResult])``), sets
    ``name`` (the section, ``report.<name>``) and optionally ``order`` (place in the report) and
    :meth:`applies_to`, and implements :meth:`probes` and :meth:`finalize`. Fields of the (frozen) dataclass are
    the analysis' parameters; ``analyze`` builds it with their defaults. ``results.of(Sinks)`` is then a
    ``SinksResult`` to the type checker as well as at run time.
    """

    name: ClassVar[str]
    result_type: ClassVar[type[Result]] = Result  # read from the generic argument
    # Place in the report of a random init; ``trained_order`` (when set) of a trained model, whose page opens with
    # the anatomy of its sink rather than with what it was born with.
    order: ClassVar[float] = 100.0
    trained_order: ClassVar[float | None] = None
    # True for an analysis that reads one MLP per layer: unavailable on a mixture of experts.
    dense_mlp_only: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:  # a subclass without its own name is a base for others, not a section
            return
        SECTIONS.check(cls.name, cls)
        typed = result_type_of(cls, Analysis)
        if typed is not None:
            cls.result_type = typed
        if cls.result_type is Result:  # BiasReport.from_dict rebuilds the section through it
            raise LensBiasError(f"{cls.__qualname__} names no result type; subclass Analysis[YourResult], the Result dataclass its finalize returns")
        SECTIONS.add(cls.name, cls)

    @classmethod
    def place(cls, regime: str) -> float:
        """Where the section goes in the report of a model in this regime ("init" or "trained")."""
        return cls.trained_order if regime == "trained" and cls.trained_order is not None else cls.order

    def applies_to(self, info: ModelInfo) -> bool:
        """Whether this model has what the analysis reads (``analyze`` leaves the others out by default)."""
        return True

    def unavailable(self, adapter: ModelAdapter) -> str | None:
        """Why this analysis cannot run on the model, in one line; ``None`` when it can. ``analyze`` skips such a
        section by default and lists the reason (``BiasReport.skipped``); asked for by name, it is refused with it."""
        return self.planned(adapter).unavailable

    def planned(self, adapter: ModelAdapter) -> "Planned":
        """This analysis on the model: its probes and whether it can run, computed once for the plan and the pass. A
        section with reasons of its own to refuse a model overrides this and returns ``Planned(self, {}, why)``."""
        if self.dense_mlp_only and adapter.info.n_experts is not None:
            return Planned(self, {}, f"{self.name} ranks the units of one MLP per layer; this model routes each token to {adapter.info.n_experts} "
                                     "experts' MLPs (super_experts reads them per expert)")
        if not self.applies_to(adapter.info):
            kind = "attention-only " if adapter.info.attn_only else ""
            return Planned(self, {}, f"{self.name} does not apply to this {kind}{adapter.info.architecture or adapter.info.family} model")
        try:
            probes = self.probes(adapter)
        except LensBiasError as err:
            return Planned(self, {}, str(err))
        missing = sorted({p.hook for p in probes.values() if not adapter.has_hook(p.hook)})
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            return Planned(self, {}, f"{self.name} reads {missing[0]}{more}, which this {adapter.info.architecture or adapter.info.family} model does not have")
        return Planned(self, probes, None)

    def probes(self, adapter: ModelAdapter) -> Mapping[Hashable, Probe]:
        """The hook reads this analysis needs, by names of its own choosing (e.g. ``("alpha", layer)``)."""
        raise NotImplementedError

    def finalize(self, adapter: ModelAdapter, kept: Mapping[Hashable, Tensor], spec: InputSpec) -> R:
        """Build the result from ``{name in probes(): tensor[n, ...]}``."""
        raise NotImplementedError


@dataclass(frozen=True)
class Planned:
    """An analysis with the probes it reads on one model, or why it cannot run there (then no probes)."""

    analysis: Analysis[Any]
    probes: Mapping[Hashable, Probe]
    unavailable: str | None


class Results(dict[str, Result]):
    """Section results by name; :meth:`of` finds one by its analysis class, typed as that analysis' result.

    >>> import lens_bias
    >>> from lens_bias.analyses.sinks import Sinks
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=16)
    >>> measure(m, lens_bias.random_tokens(4, 8, 97), [Sinks()]).of(Sinks).alpha_mean.shape  # a SinksResult
    torch.Size([2, 4, 8])
    """

    def of(self, analysis: type[Analysis[R]]) -> R:
        """The result of ``analysis`` (a class); KeyError when that section was not computed."""
        result = self[analysis.name]
        if not isinstance(result, analysis.result_type):
            raise TypeError(f"section {analysis.name} holds a {type(result).__name__}, not the {analysis.result_type.__name__} {analysis.__name__} makes")
        return cast(R, result)  # R is analysis.result_type, checked above

    def find(self, analysis: type[Analysis[R]]) -> R | None:
        """The result of ``analysis``, or None when that section was not computed."""
        return self.of(analysis) if analysis.name in self else None


def run_analyses(
    adapter: ModelAdapter,
    inputs: Inputs,
    spec: InputSpec,
    analyses: Sequence[Analysis],
    *,
    batch_size: int | None = None,
    interventions: Sequence[Any] = (),
    progress: bool = True,
) -> Results:
    """Run every analysis on ``inputs`` with one shared batched forward pass; results by analysis name.

    ``interventions``: lens_bias.hooks interventions and/or ``(hook_name, fn)`` pairs attached for the pass, in
    order (:func:`lens_bias.hooks.base.edit_hooks`).
    """
    return run_planned(adapter, inputs, spec, [a.planned(adapter) for a in analyses], batch_size=batch_size, interventions=interventions,
                       progress=progress)


def run_planned(
    adapter: ModelAdapter,
    inputs: Inputs,
    spec: InputSpec,
    planned: Sequence[Planned],
    *,
    batch_size: int | None = None,
    interventions: Sequence[Any] = (),
    progress: bool = True,
) -> Results:
    """:func:`run_analyses` on analyses already planned on this model (:meth:`Analysis.planned`): their probes are
    not asked for again."""
    if spec.n != inputs.shape[0]:  # sums over sequences are divided by spec.n
        raise LensBiasError(f"the input spec says {spec.n} sequences but the inputs hold {inputs.shape[0]}; describe the inputs passed")
    for plan in planned:
        if plan.unavailable is not None:
            raise LensBiasError(f"section {plan.analysis.name} cannot run on this model: {plan.unavailable}; leave it out")
    hooks = edit_hooks(adapter.model, fix_for_inputs(adapter.model, interventions, inputs, batch_size))  # the same at any batch size
    kept = adapter.collect(inputs, [p for plan in planned for p in plan.probes.values()], batch_size=batch_size, hooks=hooks, progress=progress)
    return Results(
        (plan.analysis.name, plan.analysis.finalize(adapter, {local: kept[p.key] for local, p in plan.probes.items()}, spec)) for plan in planned
    )


@one_adapter_per_call
def measure(
    model: Any, tokens: Union[Int[Tensor, "n seq"], RandomTokens], analyses: Sequence[Analysis[Any]], *, interventions: Sequence[Any] = (), batch_size: int | None = None,
    progress: bool = False,
) -> Results:
    """:func:`run_analyses` on your own token IDs: one batched pass of ``model`` for every analysis, results by name
    (``.of(AnalysisClass)`` gives one with its type).

    >>> import lens_bias
    >>> from lens_bias.analyses.sinks import Sinks
    >>> m = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=97, n_ctx=16)
    >>> measure(m, lens_bias.random_tokens(4, 8, 97), [Sinks()]).of(Sinks).alpha_mean.shape  # [layer, head, key]
    torch.Size([2, 4, 8])
    """
    spec = InputSpec(kind="tokens", n=tokens.shape[0], seq_len=tokens.shape[1], seed=None)
    return run_analyses(ModelAdapter.of(model), tokens, spec, analyses, batch_size=batch_size, interventions=interventions, progress=progress)
