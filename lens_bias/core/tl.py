"""Which TransformerLens is installed, and its model classes, imported lazily.

TransformerLens 4.x removed ``HookedTransformer``: importing it raises, and on 4.x even
``hasattr(transformer_lens, "HookedTransformer")`` raises, so every lookup goes through
``try/except ImportError`` here and nowhere else.
"""

from __future__ import annotations

import contextlib
import io
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from lens_bias.core.errors import LensBiasError

__all__ = ["tl_version", "tl_major", "hooked_transformer_classes", "hooked_classes", "bridge_class", "move"]


@lru_cache(maxsize=None)
def tl_version() -> str:
    """The installed transformer-lens version string, e.g. ``"4.3.0"``."""
    try:
        return version("transformer-lens")
    except PackageNotFoundError:  # a source checkout without metadata
        return "0"


def tl_major() -> int:
    """Major version of the installed transformer-lens (3 or 4)."""
    return int(tl_version().split(".")[0])


@lru_cache(maxsize=None)
def hooked_transformer_classes() -> tuple[type, type] | None:
    """``(HookedTransformer, HookedTransformerConfig)`` on TL 3.x, ``None`` on TL 4.x."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except (ImportError, AttributeError):
        return None
    return HookedTransformer, HookedTransformerConfig


def hooked_classes() -> tuple[Any, Any]:
    """``(HookedTransformer, HookedTransformerConfig)``, where a path builds a TL 3.x model; refused on TL 4.x."""
    classes = hooked_transformer_classes()
    if classes is None:
        raise LensBiasError(f"a HookedTransformer needs TransformerLens 3.x; this is {tl_version()}: use the TransformerBridge (backend='bridge')")
    return classes


@lru_cache(maxsize=None)
def bridge_class() -> type | None:
    """``TransformerBridge`` where the installed TL has it, else ``None``."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return None
    return TransformerBridge


def move(model: Any, device_or_dtype: Any) -> Any:
    """``model.to(device_or_dtype)`` without the line TransformerLens prints on stdout ("Changing model dtype to ..."):
    a library call must leave the caller's stdout alone (``lens-bias analyze --json`` prints JSON only)."""
    with contextlib.redirect_stdout(io.StringIO()):
        return model.to(device_or_dtype)
