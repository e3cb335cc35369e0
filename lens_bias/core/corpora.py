"""Offline corpora: English prose and Python code that ship with every CPython.

The experiments run offline, so they use text every machine has:

- ``prose()``: the ``pydoc_data.topics`` help texts plus the docstrings of the standard library (via ``ast``),
  deduplicated — English technical prose.
- ``code()``: the standard library's Python source with its docstrings removed.

Prose → code is a real distribution shift, like the papers' OpenWebText → code. ``text_files(paths)`` and
``hf_dataset(name_or_dataset)`` bring other text. The last 5% of a corpus' documents are held out
(:func:`held_out_documents`): :func:`lens_bias.core.inputs.text_tokens` reads real text from them, and
:class:`lens_bias.training.data.TokenData` never trains on them. Corpora are cached under ``LENS_BIAS_CACHE``
(default ``~/.cache/lens_bias``) with the Python version they came from.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import math
import os
import platform
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Union

from lens_bias.core.errors import LensBiasError
from lens_bias.core.files import atomic_write_text

__all__ = ["Corpus", "prose", "code", "text_files", "hf_dataset", "cache_dir", "held_out_documents", "EVAL_FRACTION"]

# Share of a corpus' documents (the last ones) held out for evaluation.
EVAL_FRACTION = 0.05

# Folders of the standard library that are tests, tools or third-party code rather than the library itself.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "lib2to3", "dist-packages", "turtledemo"}


def cache_dir() -> Path:
    """Where corpora and tokenizers are cached: ``$LENS_BIAS_CACHE`` or ``~/.cache/lens_bias``."""
    root = os.environ.get("LENS_BIAS_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "lens_bias")
    return Path(root)


@dataclass(frozen=True)
class Corpus:
    """A named list of documents, in a fixed order."""

    name: str
    documents: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.documents:
            raise LensBiasError(f"corpus {self.name!r} has no documents")

    @property
    def n_chars(self) -> int:
        return sum(len(d) for d in self.documents)

    def digest(self) -> str:
        """A short content hash: cache keys and provenance."""
        h = hashlib.sha256()
        for doc in self.documents:
            h.update(doc.encode("utf-8", "surrogatepass"))
            h.update(b"\0")
        return h.hexdigest()[:16]


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        files += [Path(folder) / n for n in sorted(names) if n.endswith(".py")]
    return files


def _parse(path: Path) -> tuple[str, ast.Module] | None:
    try:
        source = path.read_text(encoding="utf-8")
        return source, ast.parse(source)
    except (SyntaxError, UnicodeDecodeError, ValueError):  # a few stdlib files are templates or other encodings
        return None


_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstring_nodes(tree: ast.Module) -> list[Any]:  # ast.Expr whose value is a str Constant
    return [
        node.body[0]
        for node in ast.walk(tree)
        if isinstance(node, _DOC_NODES) and node.body and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)
    ]


def _meta(**extra: Any) -> dict[str, Any]:
    return {"python": platform.python_version(), **extra}


def _cached(name: str, min_chars: int, build: Any) -> Corpus:
    """Extracting a corpus parses the whole standard library; keep the result per Python version."""
    path = cache_dir() / f"corpus-{name}-py{platform.python_version()}-{min_chars}.json"
    if path.exists():
        saved = json.loads(path.read_text(encoding="utf-8"))
        return Corpus(name, tuple(saved["documents"]), saved["meta"])
    corpus = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"documents": corpus.documents, "meta": corpus.meta}))
    return corpus


def prose(min_chars: int = 200) -> Corpus:
    """English technical prose: pydoc topics plus standard-library docstrings of at least ``min_chars``."""
    return _cached("prose", min_chars, lambda: _prose(min_chars))


def _prose(min_chars: int) -> Corpus:
    from pydoc_data.topics import topics

    docs = [topics[k].strip() for k in sorted(topics)]
    for path in _stdlib_files():
        parsed = _parse(path)
        if parsed is None:
            continue
        docs += [inspect.cleandoc(node.value.value) for node in _docstring_nodes(parsed[1])]
    unique = list(dict.fromkeys(d for d in docs if len(d) >= min_chars))
    return Corpus("prose", tuple(unique), _meta(source="pydoc_data.topics + stdlib docstrings", min_chars=min_chars))


def code(min_chars: int = 200) -> Corpus:
    """The standard library's Python source, one document per module, docstrings removed."""
    return _cached("code", min_chars, lambda: _code(min_chars))


def _code(min_chars: int) -> Corpus:
    docs = []
    for path in _stdlib_files():
        parsed = _parse(path)
        if parsed is None:
            continue
        source, tree = parsed
        lines = source.splitlines()
        drop = {i for node in _docstring_nodes(tree) for i in range(node.lineno - 1, node.end_lineno or node.lineno)}
        text = "\n".join(line for i, line in enumerate(lines) if i not in drop).strip()
        if len(text) >= min_chars:
            docs.append(text)
    return Corpus("code", tuple(dict.fromkeys(docs)), _meta(source="stdlib source without docstrings", min_chars=min_chars))


def text_files(paths: Iterable[Union[str, Path]], name: str = "text_files") -> Corpus:
    """One document per text file, in the order given."""
    docs = tuple(Path(p).read_text(encoding="utf-8") for p in paths)
    return Corpus(name, docs, _meta(source="files"))


def hf_dataset(name_or_dataset: Any, split: str = "train", text_field: str = "text", limit: int | None = None) -> Corpus:
    """Documents from a Hugging Face dataset: a hub name (needs the network, e.g. "Skylion007/openwebtext",
    "roneneldan/TinyStories") or a ``datasets.Dataset`` you already have."""
    if isinstance(name_or_dataset, str):
        from datasets import load_dataset

        dataset = load_dataset(name_or_dataset, split=split)
        name = name_or_dataset
    else:
        dataset, name = name_or_dataset, getattr(name_or_dataset, "info", None) and name_or_dataset.info.dataset_name or "dataset"
    if text_field not in dataset.column_names:
        raise LensBiasError(f"the dataset has no column {text_field!r}; its columns are {dataset.column_names}")
    rows = dataset if limit is None else dataset.select(range(min(limit, len(dataset))))
    return Corpus(str(name), tuple(t for t in rows[text_field] if t), _meta(source="datasets", split=split))


def held_out_documents(corpus: Corpus, eval_fraction: float = EVAL_FRACTION) -> tuple[str, ...]:
    """The documents ``TokenData.build(corpus, eval_fraction=...)`` holds out: the last ``eval_fraction`` of them."""
    if not 0 < eval_fraction < 1:
        raise LensBiasError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    return corpus.documents[len(corpus.documents) - math.ceil(eval_fraction * len(corpus.documents)) :]
