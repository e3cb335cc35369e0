"""Where :func:`~lens_bias.seedprint.families.pairwise_lineage` finds its models and keeps their fingerprints: MODEL
strings expanded from folders, a model's identity as the SHA-256 of its content, fingerprints, embedding sketches and
embedding tables cached on disk under that identity and the input spec, and the fingerprint a ``.pt`` file holds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

import torch
from torch import Tensor

from lens_bias.core.corpora import cache_dir
from lens_bias.core.errors import LensBiasError
from lens_bias.core.files import atomic_save
from lens_bias.models import SHIPPED, shipped_gguf
from lens_bias.seedprint.correspondence import Embedding
from lens_bias.seedprint.fingerprints import Fingerprint
from lens_bias.seedprint.vocabulary import SKETCH_DIMS, embedding_sketch

__all__ = ["expand_models", "content_key", "FingerprintCache", "fingerprint_file"]

_MODEL_FILES = (".gguf", ".pt", ".safetensors")


def expand_models(sources: Sequence[str]) -> list[str]:
    """MODEL strings with every folder that is not itself a Hugging Face model replaced by the models it holds
    (its ``.gguf``, ``.pt`` and ``.safetensors`` files and its Hugging Face subfolders), in name order."""
    out: list[str] = []
    for source in sources:
        path = Path(source)
        if path.is_dir() and not (path / "config.json").exists():
            found = sorted(str(p) for p in path.iterdir() if (p.is_file() and p.suffix in _MODEL_FILES) or (p.is_dir() and (p / "config.json").exists()))
            if not found:
                raise LensBiasError(f"{source} holds no model: no .gguf, .pt or .safetensors file, no Hugging Face folder")
            out += found
        else:
            out.append(source)
    return out


def content_key(source: str) -> str:
    """SHA-256 of what a MODEL string names: the file's bytes, every file of a folder, or the string itself."""
    digest = hashlib.sha256()
    path = Path(shipped_gguf(source)) if source in SHIPPED else Path(source)
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []
    if not files:  # a random-init spec or a hub name: the text is the identity
        digest.update(source.encode())
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return digest.hexdigest()[:32]


class FingerprintCache:
    """Fingerprints on disk, keyed by model content and input spec (``cache=False``: none)."""

    def __init__(self, folder: Union[str, Path, None, bool]):
        self.folder = None if folder is False else Path(folder) if isinstance(folder, (str, Path)) else cache_dir() / "fingerprints"

    def path(self, key: str, spec: Mapping[str, Any]) -> Path | None:
        if self.folder is None:
            return None
        # the file format is part of the key: a fingerprint of an earlier format is made again, not read
        spec_key = hashlib.sha256(json.dumps({**spec, "format": Fingerprint.FORMAT}, sort_keys=True).encode()).hexdigest()[:16]
        return self.folder / f"{key}-{spec_key}.pt"

    def load(self, key: str, spec: Mapping[str, Any]) -> Fingerprint | None:
        path = self.path(key, spec)
        return Fingerprint.load(path) if path is not None and path.exists() else None

    def save(self, key: str, spec: Mapping[str, Any], fp: Fingerprint) -> None:
        path = self.path(key, spec)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            fp.save(path)

    def embedding_path(self, key: str | None) -> Path | None:
        """Where the model ``key``'s embedding is kept (None without a folder)."""
        return self.folder / f"{key}-embedding.pt" if self.folder is not None and key is not None else None

    def embedding(self, key: str | None, model: Callable[[], Any]) -> Embedding:
        """The model's :class:`~lens_bias.seedprint.correspondence.Embedding` (its table, kept in float16, and its
        tokenizer's vocabulary), read from the folder when it is there; the same rounding whether read or made."""
        path = self.embedding_path(key)
        if path is not None and path.exists():
            data = torch.load(path, map_location="cpu", weights_only=True)
            return Embedding(data["table"].float(), data["words"])
        made = Embedding.of(model())
        table = made.table.half()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_save({"table": table, "words": made.words}, path)
        return Embedding(table.float(), made.words)

    def sketch(self, key: str | None, model: Callable[[], Any]) -> Tensor:
        """The model's :func:`~lens_bias.seedprint.vocabulary.embedding_sketch`, read from the folder when it is there."""
        path = self.folder / f"{key}-sketch{SKETCH_DIMS}.pt" if self.folder is not None and key is not None else None
        if path is not None and path.exists():
            return torch.load(path, map_location="cpu", weights_only=True)
        sketch = embedding_sketch(model())
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_save(sketch, path)
        return sketch


def fingerprint_file(source: str) -> Fingerprint | None:
    """The fingerprint a ``.pt`` MODEL string holds (written by ``lens-bias fingerprint``), else None (a checkpoint)."""
    if not source.endswith(".pt") or not Path(source).is_file():
        return None
    try:  # memory-mapped: a checkpoint is not read into memory just to learn that it is one
        data = torch.load(source, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not a torch zip file: load_model reports what it is
        return None
    return Fingerprint.load(source) if isinstance(data, dict) and data.get("format") == Fingerprint.FORMAT else None
