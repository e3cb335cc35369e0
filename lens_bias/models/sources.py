"""One loader for every model a string can name (the CLI's MODEL): :func:`load_model` asks an ordered list of
sources, and the first whose ``matches`` accepts the string loads it.

| order | source | the string |
|---|---|---|
| 10 | shipped | a shipped model's name (``smollm2-135m-instruct``) |
| 20 | gguf | a ``.gguf`` file |
| 30 | hf-folder | a Hugging Face model folder |
| 40 | checkpoint | a lens_bias checkpoint file |
| 50 | random-init | a random-init spec, ``"llama:d=256,L=4,seed=3"`` (:func:`~lens_bias.models.spec.parse_model_spec`) |
| 60 | missing-checkpoint | a ``.pt`` path that does not exist (an error, not a hub lookup) |
| 100 | hub | anything else: a Hugging Face hub name (online, or from the local hub cache) |

A new source is one :class:`Source` passed to ``SOURCES.add(name, source)``.

>>> [name for name in SOURCES]
['shipped', 'gguf', 'hf-folder', 'checkpoint', 'random-init', 'missing-checkpoint', 'hub']
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

import torch

from lens_bias.core import tl
from lens_bias.core.errors import LensBiasError
from lens_bias.core.registry import Registry
from lens_bias.models.checkpoints import load_checkpoint
from lens_bias.models.huggingface import SHIPPED, pretrained
from lens_bias.models.init import random_init
from lens_bias.models.spec import ARCHITECTURES, parse_model_spec

__all__ = ["Source", "SOURCES", "load_model"]

Loader = Callable[..., Any]  # (text, device, dtype) -> model; a source that places also takes max_memory=, offload_folder=


@dataclass(frozen=True)
class Source:
    """Where models come from: ``matches(text)`` says whether this source reads the string, ``load`` reads it."""

    order: float  # sources are asked in this order
    matches: Callable[[str], bool]
    load: Loader
    places: bool = False  # load also takes max_memory= / offload_folder= (a model bigger than memory)


SOURCES: Registry[Source] = Registry("model source", order=lambda source: source.order)


def _pretrained(text: str, device: Any, dtype: Any, **placement: Any) -> Any:
    return pretrained(text, device=device, dtype=dtype, **placement)


def _checkpoint(text: str, device: Any, dtype: Any) -> Any:
    model = load_checkpoint(text, device=device)
    return tl.move(model, dtype) if dtype is not None else model


def _missing(text: str, device: Any, dtype: Any) -> Any:
    raise FileNotFoundError(f"no checkpoint at {text}")


SOURCES.add("shipped", Source(10, lambda text: text in SHIPPED, _pretrained, places=True))
SOURCES.add("gguf", Source(20, lambda text: text.endswith(".gguf"), _pretrained, places=True))
SOURCES.add("hf-folder", Source(30, lambda text: Path(text).is_dir(), _pretrained, places=True))
SOURCES.add("checkpoint", Source(40, lambda text: Path(text).is_file(), _checkpoint))
SOURCES.add("random-init", Source(50, lambda text: text.partition(":")[0].strip() in ARCHITECTURES,
                                  lambda text, device, dtype: random_init(parse_model_spec(text), device=device, dtype=dtype)))
SOURCES.add("missing-checkpoint", Source(60, lambda text: text.endswith(".pt"), _missing))
SOURCES.add("hub", Source(100, lambda text: True, _pretrained, places=True))


def load_model(text: str, device: Union[str, torch.device, None] = None, dtype: torch.dtype | None = None, *,
               max_memory: dict[Any, Any] | None = None, offload_folder: Union[str, Path, None] = None) -> Any:
    """The model one string names: the first of ``SOURCES`` (in order) that matches it loads it.

    Args:
        text: a shipped model name, a .gguf file, a Hugging Face folder, a lens_bias checkpoint, a random-init spec,
            or (online) a hub name.
        device: where the model lives.
        dtype: its dtype.
        max_memory: for a model bigger than memory, the most each device may hold (see
            :func:`~lens_bias.models.huggingface.pretrained`); pretrained models only.
        offload_folder: where the layers that fit nowhere are written; pretrained models only.
    """
    placement = {k: v for k, v in {"max_memory": max_memory, "offload_folder": offload_folder}.items() if v is not None}
    for name, source in SOURCES.items():
        if source.matches(text):
            if placement and not source.places:
                raise LensBiasError(f"{text} is a {name} model, which loads whole: max_memory / offload_folder apply to pretrained "
                                    "models (a .gguf file, a Hugging Face folder, a shipped or hub name)")
            return source.load(text, device, dtype, **placement)
    raise AssertionError("the hub source matches every string")
