"""Dataclasses as JSON-ready dicts and back, exactly: :class:`Serialisable` gives every config, spec and result
its ``to_dict`` / ``from_dict``.

Tensors keep their dtype and shape (their values as a flat list: float32, float64 and bfloat16 all survive a
Python float, and ``json.dumps`` writes floats that read back bit for bit); DataFrames keep their columns and
rows. A marker key tells the two apart from an ordinary dict.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence, TypeVar

import pandas as pd
import torch

from lens_bias.core.errors import LensBiasError

__all__ = ["Serialisable", "to_jsonable", "from_jsonable", "parse_field", "parse_assignments", "with_assignments", "int_fields"]

S = TypeVar("S", bound="Serialisable")
T = TypeVar("T")

_TENSOR, _FRAME, _DTYPE = "__tensor__", "__frame__", "__dtype__"


def to_jsonable(value: Any) -> Any:
    """``value`` with every tensor, dtype, device and DataFrame inside it (lists, tuples, dicts) as plain JSON-ready data."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return {_TENSOR: str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": t.flatten().tolist()}
    if isinstance(value, torch.dtype):
        return {_DTYPE: str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):  # read back as its name, which every device argument takes
        return str(value)
    if isinstance(value, Serialisable):  # a nested settings object (a config's ModelSpec): read back by its field's default
        return value.to_dict()
    if isinstance(value, pd.DataFrame):
        return {_FRAME: [str(c) for c in value.columns], "records": value.to_dict(orient="records")}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise LensBiasError(f"cannot write a {type(value).__name__} as JSON; result fields hold tensors, DataFrames and plain values")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise LensBiasError(f"unknown dtype {name!r} in a saved result; was it written by lens_bias?")
    return dtype


def from_jsonable(value: Any) -> Any:
    """The inverse of :func:`to_jsonable` (tuples come back as lists)."""
    if isinstance(value, dict) and _TENSOR in value:
        return torch.tensor(value["data"], dtype=_dtype(value[_TENSOR])).reshape(value["shape"])
    if isinstance(value, dict) and _DTYPE in value:
        return _dtype(value[_DTYPE])
    if isinstance(value, dict) and _FRAME in value:
        return pd.DataFrame.from_records(value["records"], columns=value[_FRAME])
    if isinstance(value, dict):
        return {k: from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value


class Serialisable:
    """Mixin for dataclasses: ``to_dict`` writes every field JSON-ready, ``from_dict`` reads it back.

    Fields whose default is a tuple come back as tuples (JSON has only lists), so frozen configs compare equal
    after a round trip.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Config(Serialisable):
    ...     steps: int = 10
    ...     seeds: tuple = (1, 2)
    >>> Config.from_dict(Config(steps=3).to_dict()) == Config(steps=3)
    True
    >>> Config.from_dict({"step": 3})
    Traceback (most recent call last):
        ...
    lens_bias.core.errors.LensBiasError: Config.from_dict: unknown field(s) ['step']; its fields are ['steps', 'seeds']
    """

    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (tensors with their dtype and shape, DataFrames with their columns)."""
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]  # a mixin of dataclasses

    @classmethod
    def from_dict(cls: type[S], d: Mapping[str, Any]) -> S:
        """The object :meth:`to_dict` wrote (tensors equal to the last bit); fields left out take their defaults."""
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]  # a mixin of dataclasses
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise LensBiasError(f"{cls.__name__}.from_dict: unknown field(s) {unknown}; its fields are {list(fields)}")
        required = [n for n, f in fields.items() if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in d]
        if missing:
            raise LensBiasError(f"{cls.__name__}.from_dict: missing field(s) {missing}; pass what {cls.__name__}.to_dict() wrote")
        values = {}
        for name, value in d.items():
            nested = fields[name].default
            if isinstance(nested, Serialisable) and isinstance(value, Mapping):
                values[name] = type(nested).from_dict(value)
                continue
            value = from_jsonable(value)
            if isinstance(value, list) and isinstance(fields[name].default, tuple):
                value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
            values[name] = value
        return cls(**values)


def parse_field(cls: type, name: str, text: str) -> Any:
    """``text`` as a value of dataclass ``cls``'s field ``name``, by the field's annotation (bool, int, float, else
    str): how command lines set one field (``--set steps=200``, ``llama:d=256``).

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Config:
    ...     steps: int = 10
    ...     lr: float = 1e-3
    >>> parse_field(Config, "lr", "3e-4")
    0.0003
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if name not in fields:
        raise LensBiasError(f"{cls.__name__} has no field {name!r}; its fields are {list(fields)}")
    annotation = fields[name].type  # a type, or its text under `from __future__ import annotations`: "int", "str | None"
    kind = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    try:
        if kind.startswith("bool"):
            if text.lower() not in ("1", "true", "yes", "0", "false", "no"):
                raise ValueError(text)
            return text.lower() in ("1", "true", "yes")
        if kind.startswith("float"):
            return float(text)
        if kind.startswith("int"):
            return int(text)
    except ValueError:
        raise LensBiasError(f"{name}={text!r} is not a {kind}") from None
    return text


def parse_assignments(cls: type, items: Sequence[str], flag: str) -> dict[str, Any]:
    """``["steps=200", "lr=3e-4"]`` as ``{"steps": 200, "lr": 0.0003}``, each typed by :func:`parse_field`; ``flag``
    names the command-line option in errors."""
    values = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq:
            raise LensBiasError(f"{flag} takes FIELD=VALUE, got {item!r}")
        values[name.strip()] = parse_field(cls, name.strip(), text.strip())
    return values


def with_assignments(config: T, items: Sequence[str], flag: str) -> T:
    """The frozen dataclass ``config`` with ``["steps=200", "model.d_model=64"]`` applied, each value typed by
    :func:`parse_field`; a dotted name sets a field of a nested settings object (an experiment's ``ModelSpec``).

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Inner:
    ...     d: int = 1
    >>> @dataclass(frozen=True)
    ... class Outer:
    ...     steps: int = 10
    ...     inner: Inner = Inner()
    >>> with_assignments(Outer(), ["steps=3", "inner.d=4"], "--set")
    Outer(steps=3, inner=Inner(d=4))
    """
    top: dict[str, Any] = {}
    nested: dict[str, list[str]] = {}
    for item in items:
        name, eq, text = item.partition("=")
        if not eq:
            raise LensBiasError(f"{flag} takes FIELD=VALUE, got {item!r}")
        outer, dot, inner = name.strip().partition(".")
        if dot:
            nested.setdefault(outer, []).append(f"{inner}={text}")
        else:
            top[outer] = parse_field(type(config), outer, text.strip())
    for outer, assignments in nested.items():
        inner_config = top.get(outer, getattr(config, outer, None))
        if not dataclasses.is_dataclass(inner_config) or isinstance(inner_config, type):
            raise LensBiasError(f"{type(config).__name__} has no settings object {outer!r} for {flag} {outer}.FIELD=VALUE")
        top[outer] = with_assignments(inner_config, assignments, flag)
    changed: Any = config  # a dataclass instance: parse_field refused anything else
    return dataclasses.replace(changed, **top)


def int_fields(config: Any, prefix: str = "") -> list[tuple[str, int]]:
    """Every integer field of a dataclass, nested settings objects' as dotted names (what ``--set`` can change)."""
    out: list[tuple[str, int]] = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if type(value) is int:
            out.append((prefix + f.name, value))
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += int_fields(value, f"{prefix}{f.name}.")
    return out
