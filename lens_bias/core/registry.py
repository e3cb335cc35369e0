"""One registration mechanism for every extension kind: interventions, analyses, nulls, experiments,
architectures and model sources.

A kind keeps one :class:`Registry`. Subclassing the kind's base class registers the subclass under its key
(``__init_subclass__`` calls :meth:`Registry.add`), so a new extension is one file that defines one class;
:func:`discover` imports every module of a package, which is how ``lens_bias.analyses``, ``lens_bias.hooks``,
``lens_bias.experiments`` and ``lens_bias.models.architectures`` find their files without an import line each.

>>> shapes = Registry("shape")
>>> class Square: pass
>>> shapes.add("square", Square)
>>> shapes["square"] is Square, shapes.names()
(True, ['square'])
>>> shapes["circle"]
Traceback (most recent call last):
    ...
lens_bias.core.errors.LensBiasError: unknown shape 'circle'; known: ['square']
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Callable, Iterator, MutableMapping, TypeVar

from .errors import LensBiasError

__all__ = ["Registry", "discover"]

T = TypeVar("T")


def _origin(obj: Any) -> tuple[str, str]:
    """Where an entry was defined: its (module, qualified name), an instance's class's for an instance."""
    kind = obj if isinstance(obj, type) else type(obj)
    return kind.__module__, kind.__qualname__


class Registry(Mapping[str, T]):
    """Named extensions of one kind, in the order they were added (or by ``order`` when one is given).

    Adding a name again with an object of the same module and qualified name (a module reloaded, a notebook cell
    run twice) replaces it; another object under a taken name is refused, since lookups go by name alone.

    Args:
        kind: what the entries are, for error messages ("intervention", "analysis", ...).
        order: ``entry -> sort key``; entries are kept sorted by it (stable), e.g. a report section's place.
    """

    def __init__(self, kind: str, order: Callable[[T], Any] | None = None):
        self.kind = kind
        self._order = order
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T) -> None:
        """Register ``entry`` under ``name`` (see :meth:`check`)."""
        self.check(name, entry)
        self._entries[name] = entry
        order = self._order
        if order is not None:
            ordered = sorted(self._entries.items(), key=lambda item: order(item[1]))
            self._entries = dict(ordered)

    def check(self, name: str, entry: T) -> None:
        """Refuse ``name`` if another entry (defined elsewhere) holds it."""
        known = self._entries.get(name)
        if known is not None and _origin(known) != _origin(entry):
            module, qualname = _origin(known)
            article = "an" if self.kind[0] in "aeiou" else "a"
            raise LensBiasError(
                f"{article} {self.kind} named {name!r} is already registered ({module}.{qualname}); "
                f"give {'.'.join(_origin(entry))} another name"
            )

    def __getitem__(self, name: str) -> T:
        if name not in self._entries:
            raise LensBiasError(f"unknown {self.kind} {name!r}; known: {self.names()}")
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def get(self, name: str, default: Any = None) -> Any:
        return self._entries.get(name, default)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def remove(self, name: str) -> T:
        """Take an entry out again (a throwaway extension defined for one test or one notebook cell)."""
        return self._entries.pop(name)


def discover(package: str, namespace: MutableMapping[str, Any] | None = None) -> list[ModuleType]:
    """Import every public module of ``package`` (its files not starting with ``_``), in name order.

    Importing a module defines its classes, which registers them. With ``namespace`` (a package's
    ``globals()``), the names each module lists in ``__all__`` are also made available there, so users import
    ``from lens_bias.hooks import MaskToSelf`` while the package's ``__init__`` names no module.

    Returns:
        The imported modules.
    """
    parent = importlib.import_module(package)
    found = sorted(info.name for info in pkgutil.iter_modules(parent.__path__) if not info.name.startswith("_"))
    modules = []
    for module_name in found:
        module = importlib.import_module(f"{package}.{module_name}")
        modules.append(module)
        if namespace is None:
            continue
        for name in getattr(module, "__all__", ()):
            if name in found:  # the package's attribute would no longer be its module
                raise LensBiasError(f"{package}.{module_name} exports {name!r}, the name of the module {package}.{name}; rename one of them")
            namespace[name] = getattr(module, name)
    return modules
