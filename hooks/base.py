"""The intervention object: a named, frozen, serialisable edit of a TransformerLens forward pass.

An intervention knows which hook points it needs and returns TL hook functions for a given model; it holds no
model and no tensors, so one object can be reused across models, saved with ``to_dict`` and restored with
``Intervention.from_dict``. Interventions compose with ``a + b`` (or a list), and attach through scoped
contexts only: :func:`intervene`, or TL's own ``model.run_with_hooks(x, fwd_hooks=iv.fwd_hooks(model))``.

Composition is ordered: on a shared hook point the hooks run in the order the interventions are listed, each
reading what the one before returned. A hook declares what it does with the value that reaches it (:func:`reads`,
:func:`replaces`; by default it edits it), and composing refuses an order that would drop an edit silently: a
hook that replaces a value another intervention already edited, or an edit of a value another intervention
already read (that one would have used the unedited value).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, Iterator, Mapping, Sequence, TypeGuard, TypeVar, Union, cast, overload

from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.probes import READS, ROLE_ATTRIBUTE, FwdHook, HookFn, counting
from lens_bias.core.registry import Registry

__all__ = ["INTERVENTIONS", "Intervention", "Compose", "intervene", "as_hooks", "edit_hooks", "edit_records", "fix_for_inputs", "refusal", "reads", "replaces",
           "check_position", "check_in_sequence"]

# Intervention class name -> class: what from_dict finds a class by; subclassing registers (private names excepted).
INTERVENTIONS: Registry[type["Intervention"]] = Registry("intervention")
_STARTED = "<forward started>"

# What a hook does with the activation that reaches it; unmarked hooks edit it.
EDITS, REPLACES = "edits", "replaces"
_ROLE = ROLE_ATTRIBUTE
_Fn = TypeVar("_Fn", bound=HookFn)


def reads(fn: _Fn) -> _Fn:
    """Mark a hook function that only reads its activation (returns None), for the composition check."""
    setattr(fn, _ROLE, READS)
    return fn


def replaces(fn: _Fn) -> _Fn:
    """Mark a hook function whose output ignores the activation that reaches it, for the composition check."""
    setattr(fn, _ROLE, REPLACES)
    return fn


def check_position(position: Any, owner: str) -> None:
    """Refuse a position that is not a non-negative int (0 is the first token)."""
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise LensBiasError(f"{owner}: position must be a non-negative int (0 = first token), got {position!r}")


def check_in_sequence(position: int, seq_len: int, owner: str) -> None:
    """Refuse a position past the end of the sequences the pass runs on."""
    if position >= seq_len:
        raise LensBiasError(f"{owner}(position={position}) on sequences of {seq_len} tokens: use position < {seq_len}")


@dataclass(frozen=True)
class Intervention:
    """Base class. Subclasses implement ``layer_hooks`` (per layer) or override ``fwd_hooks``."""

    # Layers to edit; None means every layer of the model the hooks are made for.
    layers: tuple[int, ...] | None = field(default=None, kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__name__.startswith("_"):  # private helpers are never serialised on their own
            return
        INTERVENTIONS.add(cls.__name__, cls)

    def __post_init__(self) -> None:
        if self.layers is not None:
            layers = tuple(self.layers)
            if not all(isinstance(layer, int) and not isinstance(layer, bool) and layer >= 0 for layer in layers):
                raise LensBiasError(f"layers must be non-negative ints, got {self.layers!r}")
            object.__setattr__(self, "layers", layers)

    def model_layers(self, model: Any) -> list[int]:
        """The layers this intervention edits in ``model``."""
        n_layers = int(model.cfg.n_layers)
        if self.layers is None:
            return list(range(n_layers))
        too_deep = [layer for layer in self.layers if layer >= n_layers]
        if too_deep:
            raise LensBiasError(f"{type(self).__name__}: layers {too_deep} do not exist; the model has {n_layers} layers")
        return list(self.layers)

    def layer_hooks(self, model: Any, layer: int) -> list[FwdHook]:
        """The ``(hook_name, fn)`` pairs that edit one layer."""
        raise NotImplementedError

    def parameters(self, model: Any) -> list[Any]:
        """Learnable tensors this intervention owns for ``model`` (most own none); ``lens_bias.training.trainer`` trains them."""
        return []

    def fixed_for(self, model: Any, inputs: Any, others: Sequence[Any] = (), batch_size: int | None = None) -> "Intervention":
        """This intervention as it acts on ``inputs`` whatever their batches: one whose edit depends on the batch
        (AmplifyVariance's mean) measures what it needs once over all of them, with ``others`` attached; most
        depend on nothing and return themselves (:func:`fix_for_inputs`)."""
        return self

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        """TL forward hooks that apply this intervention to ``model``; fresh closures on every call."""
        hooks = [hook for layer in self.model_layers(model) for hook in self.layer_hooks(model, layer)]
        ModelAdapter.of(model).require([name for name, _ in hooks], type(self).__name__)
        return hooks

    def __add__(self, other: "Intervention") -> "Compose":
        if not isinstance(other, Intervention):
            return NotImplemented
        return Compose(_parts(self) + _parts(other))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready description that :meth:`from_dict` turns back into an equal object."""
        out: dict[str, Any] = {"type": type(self).__name__}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Intervention":
        """Rebuild an intervention from :meth:`to_dict` output."""
        d = dict(d)
        name = d.pop("type", None)
        if name not in INTERVENTIONS:
            raise LensBiasError(f"unknown intervention type {name!r}; known: {sorted(INTERVENTIONS)}")
        if name == "Compose":
            return Compose(tuple(Intervention.from_dict(p) for p in d["parts"]))
        return INTERVENTIONS[name](**d)


def _parts(iv: Intervention) -> tuple[Intervention, ...]:
    return iv.parts if isinstance(iv, Compose) else (iv,)


@dataclass(frozen=True)
class Compose(Intervention):
    """Several interventions applied together, in order (``a + b``)."""

    parts: tuple[Intervention, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layers is not None:
            raise LensBiasError("Compose takes no layers=; set layers on its parts")
        object.__setattr__(self, "parts", tuple(self.parts))

    def fwd_hooks(self, model: Any) -> list[FwdHook]:
        return as_hooks(model, self.parts)

    def parameters(self, model: Any) -> list[Any]:
        return [p for part in self.parts for p in part.parameters(model)]

    def fixed_for(self, model: Any, inputs: Any, others: Sequence[Any] = (), batch_size: int | None = None) -> "Compose":
        return Compose(tuple(_fixed_each(model, self.parts, inputs, others, batch_size)))

    def to_dict(self) -> dict[str, Any]:
        return {"type": "Compose", "parts": [p.to_dict() for p in self.parts]}


InterventionLike = Union[Intervention, Sequence[Intervention]]


def _flatten(interventions: Sequence[InterventionLike]) -> list[Intervention]:
    flat: list[Intervention] = []
    for item in interventions:
        items = [item] if isinstance(item, Intervention) else list(item)
        for iv in items:
            if not isinstance(iv, Intervention):
                raise WrongType(f"expected lens_bias.hooks interventions, got {type(iv).__name__}")
            flat += _flatten(iv.parts) if isinstance(iv, Compose) else [iv]
    return flat


def _check_order(name: str, role: str, owner: str, earlier: list[tuple[str, str]]) -> None:
    """Refuse a hook of ``owner`` on ``name`` that would drop what earlier interventions did there."""
    for earlier_role, earlier_owner in earlier:
        if role == REPLACES and earlier_role != READS:
            raise LensBiasError(
                f"{owner} replaces {name} without reading it, so {earlier_owner}'s edit there, attached before it, "
                f"would be lost: list {owner} first ({owner} + {earlier_owner}) to edit its output"
            )
        if role != READS and earlier_role == READS:
            raise LensBiasError(
                f"{owner} edits {name} after {earlier_owner} read it there, so {earlier_owner} would use the "
                f"unedited value: list {owner} first ({owner} + {earlier_owner})"
            )


def as_hooks(model: Any, interventions: Sequence[InterventionLike]) -> list[FwdHook]:
    """Forward hooks of several interventions (or lists of them), in order; see the module docstring on order.

    Raises:
        LensBiasError: if a hook would drop an earlier intervention's edit, or edit what an earlier one read.
    """
    return edit_hooks(model, interventions, raw=False)


Edit = Union[Intervention, Sequence[Intervention], FwdHook]


def _is_raw(item: Any) -> TypeGuard[FwdHook]:
    return isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and callable(item[1])


def edit_hooks(model: Any, edits: Sequence[Edit], *, raw: bool = True) -> list[FwdHook]:
    """Forward hooks of interventions (or lists of them) and, with ``raw``, plain ``(hook_name, fn)`` pairs, in order.

    Interventions are checked against each other as in :func:`as_hooks`; plain pairs are taken as they are.
    """
    hooks: list[FwdHook] = []
    seen: dict[str, list[tuple[str, str]]] = {}  # hook name -> (role, owner) of the interventions before
    for item in edits:
        if raw and _is_raw(item):
            hooks.append(item)
            continue
        for iv in _flatten([cast(InterventionLike, item)]):  # not a plain pair: an intervention or a list of them
            own = iv.fwd_hooks(model)
            owner = type(iv).__name__
            for name, fn in own:
                _check_order(name, getattr(fn, _ROLE, EDITS), owner, seen.get(name, []))
            for name, fn in own:
                seen.setdefault(name, []).append((getattr(fn, _ROLE, EDITS), owner))
            hooks += own
    return hooks


@overload
def fix_for_inputs(model: Any, edits: Sequence[InterventionLike], inputs: Any, batch_size: int | None = None) -> Sequence[InterventionLike]: ...


@overload
def fix_for_inputs(model: Any, edits: Sequence[Edit], inputs: Any, batch_size: int | None = None) -> Sequence[Edit]: ...


def fix_for_inputs(model: Any, edits: Sequence[Edit], inputs: Any, batch_size: int | None = None) -> Sequence[Edit]:
    """``edits`` with every intervention fixed for ``inputs`` (:meth:`Intervention.fixed_for`), so a pass over them gives
    the same numbers however they are split into batches; plain ``(hook_name, fn)`` pairs are kept as they are."""
    return _fixed_each(model, edits, inputs, (), batch_size)


def _fixed_each(model: Any, items: Sequence[Any], inputs: Any, others: Sequence[Any], batch_size: int | None) -> list[Any]:
    """Each item fixed in turn, with ``others`` and the other items (those before it already fixed) attached."""
    fixed = list(items)
    for i, item in enumerate(fixed):
        rest = [*others, *fixed[:i], *fixed[i + 1:]]
        if isinstance(item, Intervention):
            fixed[i] = item.fixed_for(model, inputs, rest, batch_size)
        elif not _is_raw(item):  # a list of interventions
            fixed[i] = Compose(tuple(_flatten([item]))).fixed_for(model, inputs, rest, batch_size)
    return fixed


def refusal(model: Any, interventions: Sequence[InterventionLike]) -> str | None:
    """Why ``interventions`` cannot act on ``model`` (a hook it lacks, a hook off its forward path, a read-only copy),
    in one line; ``None`` when every edit acts. What a default run skips, and says it skipped."""
    try:
        hooks = as_hooks(model, interventions)
        ModelAdapter.of(model).check_edits_act(hooks)
    except LensBiasError as err:
        return str(err)
    return None


def edit_records(edits: Sequence[Edit]) -> list[dict[str, Any]]:
    """What a result records of the edits it was measured under: each intervention's ``to_dict()``, in order.

    A plain ``(hook_name, fn)`` pair is recorded as ``{"type": "fwd_hook", "hook": hook_name}`` (a function cannot
    be serialised).
    """
    out: list[dict[str, Any]] = []
    for item in edits:
        if _is_raw(item):
            out.append({"type": "fwd_hook", "hook": item[0]})
        elif isinstance(item, Intervention):
            out.append(item.to_dict())
        elif isinstance(item, (list, tuple)):
            out += edit_records(item)
        else:
            raise WrongType(f"expected lens_bias.hooks interventions or (hook_name, fn) pairs, got {type(item).__name__}")
    return out


@contextmanager
def intervene(model: Any, *interventions: InterventionLike) -> Iterator[Any]:
    """Attach interventions for the duration of a ``with`` block; they are removed on exit, also on errors.

    >>> import torch, lens_bias
    >>> from lens_bias.hooks import SelfOnlyAttention
    >>> m = lens_bias.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=16)
    >>> with intervene(m, SelfOnlyAttention(layers=[0])):
    ...     logits = m(torch.zeros(1, 4, dtype=torch.long))
    >>> logits.shape
    torch.Size([1, 4, 100])

    Args:
        model: a TransformerLens model.
        *interventions: interventions, or lists of them.

    Yields:
        The model, with the interventions attached through its own scoped ``model.hooks(...)``.

    Raises:
        LensBiasError: if an edit cannot act on this model (its hook is off the forward path, or a read-only copy;
            see :meth:`~lens_bias.core.adapter.ModelAdapter.check_edits_act`).
    """
    fired: set[str] = set()
    hooks = as_hooks(model, interventions)
    ModelAdapter.of(model).check_edits_act(hooks)
    # Observe the start of every forward pass, so edits that never fire are told apart from no pass at all.
    started = ("blocks.0.hook_resid_pre", lambda x, hook: fired.add(_STARTED))
    with model.hooks(fwd_hooks=[started] + [(name, counting(name, fn, fired)) for name, fn in hooks]):
        yield model
    silent = sorted({name for name, _ in hooks} - fired)
    if _STARTED in fired and silent:
        warnings.warn(
            f"intervention hook(s) {silent} never fired while attached: on this model they are not on the "
            "forward path (or the pass stopped before them), so those edits had no effect",
            stacklevel=3,
        )
