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

__all__ = ["Serialisable", "to_jsonable", "from_jsonable", "parse_field", "parse_assignments"]

S = TypeVar("S", bound="Serialisable")

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
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[S], d: Mapping[str, Any]) -> S:
        """The object :meth:`to_dict` wrote (tensors equal to the last bit); fields left out take their defaults."""
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(d) - set(fields))
        if unknown:
            raise LensBiasError(f"{cls.__name__}.from_dict: unknown field(s) {unknown}; its fields are {list(fields)}")
        required = [n for n, f in fields.items() if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [n for n in required if n not in d]
        if missing:
            raise LensBiasError(f"{cls.__name__}.from_dict: missing field(s) {missing}; pass what {cls.__name__}.to_dict() wrote")
        values = {}
        for name, value in d.items():
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
