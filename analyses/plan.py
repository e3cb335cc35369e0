"""One run of ``analyze``, planned once: its settings, the sections and their probes, the extra passes, the inputs and
the regime, read by everything downstream.

The sections share one batched pass (:mod:`lens_bias.analyses.base`). What needs passes of its own (the ablation
table, the sink attribution, the sink heads view) is an :class:`ExtraPass`: a subclass with a ``name`` registers
itself in ``PASSES`` as a section does in ``SECTIONS``, so each is one file, named in ``analyze(sections=...)`` like
a section. It runs after the shared pass, in ``order``, on the plan and the results so far, with the plan's adapter.

>>> import lens_bias
>>> sorted(PASSES)
['ablations', 'sink_attribution', 'sink_heads']
>>> AnalyzeSettings(n_sequences=16).to_dict()["seq_len"]
128
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Mapping, Sequence, TypeVar, Union

import torch
from jaxtyping import Int
from torch import Tensor

from lens_bias.analyses.base import SECTIONS, Planned, Result, Results, result_type_of
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import Inputs, InputSpec, token_ids
from lens_bias.core.registry import Registry
from lens_bias.core.serialise import Serialisable

__all__ = ["AnalyzeSettings", "ExtraPass", "PASSES", "RunPlan"]

R = TypeVar("R", bound=Result)


@dataclass(frozen=True)
class AnalyzeSettings(Serialisable):
    """How ``analyze`` runs: its inputs, how they go through the model, and the regime the report reads in.

    ``analyze(model, n_sequences=64)`` is ``analyze(model, settings=AnalyzeSettings(n_sequences=64))``.
    """

    # "tokens" (IDs uniform in [0, d_vocab)), "text" (held-out prose through model.tokenizer), "embeddings" (Gaussian
    # with the model's embedding mean and std), or token IDs [n, seq], embeddings [n, seq, d_model], RandomEmbeddings
    inputs: Union[str, Inputs] = "tokens"
    n_sequences: int = 256  # random sequences, at least 2 (ignored for tensor inputs): p̄ over a 50k vocabulary settles
    seq_len: int = 128  # tokens per sequence, 2 to the model's n_ctx (ignored for tensor inputs): the 1/t law shows
    seed: int = 42  # seed of the random inputs
    batch_size: int | None = None  # sequences per forward pass (None: what the memory plan allows at this length)
    device: Union[str, torch.device, None] = None  # the device the model is on, as a check: lens_bias never moves a model
    # "init" or "trained" instead of what lens_bias recorded of the model (ModelInfo.regime: a model it did not build
    # or load counts as trained); the report's order and headline follow it
    regime: str | None = None


@dataclass
class RunPlan:
    """What one ``analyze`` call runs, decided once before any pass: everything downstream reads it."""

    adapter: ModelAdapter  # the call's one adapter, in the plan's regime
    settings: AnalyzeSettings
    sections: Sequence[Planned]  # in report order, each with its probes
    passes: Sequence["ExtraPass[Any]"]  # in the order they run
    skipped: Mapping[str, str]  # sections a default run leaves out -> why
    inputs: Inputs
    spec: InputSpec  # its kind says whether the inputs are token IDs
    interventions: Sequence[Any] = ()
    progress: bool = True

    @property
    def model(self) -> Any:
        return self.adapter.model

    @property
    def regime(self) -> str:
        return self.adapter.info.regime

    @functools.cached_property
    def tokens(self) -> Int[Tensor, "n seq"] | None:
        """The token IDs the sections read (drawn on first use, after the shared pass), None for embedding inputs."""
        return token_ids(self.inputs)


PASSES: Registry[type["ExtraPass[Any]"]] = Registry("pass", order=lambda cls: cls.order)


@dataclass(frozen=True)
class ExtraPass(Generic[R]):
    """A part of the report with passes of its own, run after the shared pass; subclassing with a ``name`` registers it.

    A subclass sets ``name`` (its key in the report, ``report.<name>``), its result type as the generic argument,
    ``order`` (when it runs among the passes), and implements :meth:`run`; :meth:`check` refuses a plan it cannot
    run on before any pass, :meth:`applies` leaves it out quietly, and :meth:`in_default` says whether a whole report
    runs it. Its fields are its settings.
    """

    name: ClassVar[str]
    result_type: ClassVar[type[Result]] = Result
    order: ClassVar[float] = 100.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            return
        if cls.name in SECTIONS:
            raise LensBiasError(f"pass {cls.name!r} is already a section's name; pick another")
        typed = result_type_of(cls, ExtraPass)
        if typed is None:
            raise LensBiasError(f"{cls.__qualname__} names no result type; subclass ExtraPass[YourResult]")
        cls.result_type = typed
        PASSES.check(cls.name, cls)
        PASSES.add(cls.name, cls)

    def in_default(self, regime: str) -> bool:
        """Whether a whole report (``sections`` left out, or ``...``) runs this pass for a model in ``regime``."""
        return False

    def check(self, plan: RunPlan) -> None:
        """Raise a one-line LensBiasError, before any pass, when this pass cannot run with the plan's inputs or edits."""

    def applies(self, plan: RunPlan, results: Results) -> bool:
        """Whether to run on this plan, given the shared pass' results; False leaves it out without a word."""
        return True

    def run(self, plan: RunPlan, results: Results) -> R:
        """The result, from the plan (its adapter, inputs and settings) and the results so far."""
        raise NotImplementedError
