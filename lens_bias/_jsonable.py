"""Dataclass fields as JSON-ready values and back, exactly: what ``Result.to_dict`` / ``Result.from_dict`` use.

Tensors keep their dtype and shape (their values as a flat list: float32, float64 and bfloat16 all survive a
Python float, and ``json.dumps`` writes floats that read back bit for bit); DataFrames keep their columns and
rows. A marker key tells the two apart from an ordinary dict.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from .errors import LensBiasError

__all__ = ["to_jsonable", "from_jsonable"]

_TENSOR, _FRAME = "__tensor__", "__frame__"


def to_jsonable(value: Any) -> Any:
    """``value`` with every tensor and DataFrame inside it (lists, tuples, dicts) as plain JSON-ready data."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        return {_TENSOR: str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "data": t.flatten().tolist()}
    if isinstance(value, pd.DataFrame):
        return {_FRAME: [str(c) for c in value.columns], "records": value.to_dict(orient="records")}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise LensBiasError(f"cannot write a {type(value).__name__} as JSON; result fields hold tensors, DataFrames and plain values")


def from_jsonable(value: Any) -> Any:
    """The inverse of :func:`to_jsonable` (tuples come back as lists)."""
    if isinstance(value, dict) and _TENSOR in value:
        dtype = getattr(torch, value[_TENSOR], None)
        if not isinstance(dtype, torch.dtype):
            raise LensBiasError(f"unknown tensor dtype {value[_TENSOR]!r} in a saved result; was it written by lens_bias?")
        return torch.tensor(value["data"], dtype=dtype).reshape(value["shape"])
    if isinstance(value, dict) and _FRAME in value:
        return pd.DataFrame.from_records(value["records"], columns=value[_FRAME])
    if isinstance(value, dict):
        return {k: from_jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value
