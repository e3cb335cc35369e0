"""Settings objects with keyword shorthand: a function takes a frozen settings dataclass, and keywords that name its
fields override it (``compare(a, b, n=512)`` is ``compare(a, b, FingerprintSettings(n=512))``).

The defaults live in the dataclass alone, and a keyword that no settings class has is refused with the fields
each one takes, so a typo never passes silently.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Steps:
...     steps: int = 10
>>> overridden(Steps, None, {"steps": 3}, "train()")
Steps(steps=3)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, TypeVar

from lens_bias.core.errors import WrongType

__all__ = ["overridden", "route_keywords"]

T = TypeVar("T")


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def route_keywords(keywords: Mapping[str, Any], classes: Mapping[str, type], where: str) -> dict[str, dict[str, Any]]:
    """Split ``keywords`` by the settings class whose field each names (``classes``: argument name -> class).

    Raises:
        WrongType: a keyword no class has, naming every class's fields.
    """
    routed: dict[str, dict[str, Any]] = {name: {} for name in classes}
    unknown = []
    for key, value in keywords.items():
        owner = next((name for name, cls in classes.items() if key in _field_names(cls)), None)
        if owner is None:
            unknown.append(key)
        else:
            routed[owner][key] = value
    if unknown:
        takes = "; ".join(f"{cls.__name__} ({name}=): {_field_names(cls)}" for name, cls in classes.items())
        raise WrongType(f"{where} got unexpected keyword(s) {sorted(unknown)}; it takes the fields of {takes}")
    return routed


def overridden(cls: type[T], settings: T | None, keywords: Mapping[str, Any], where: str) -> T:
    """``settings`` (default ``cls()``) with the fields ``keywords`` name replaced.

    Raises:
        WrongType: ``settings`` is not a ``cls``, or a keyword is not one of its fields.
    """
    if settings is not None and not isinstance(settings, cls):
        raise WrongType(f"{where} takes a {cls.__name__} as its settings, got {type(settings).__name__}")
    fields = route_keywords(keywords, {"settings": cls}, where)["settings"]
    base: Any = settings if settings is not None else cls()
    return dataclasses.replace(base, **fields)
