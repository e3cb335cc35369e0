"""Offline corpora for training small models: English prose and Python code that ship with every CPython.

No dataset hub is reachable here, so the training experiments use text every machine has:

- ``prose()``: the ``pydoc_data.topics`` help texts plus the docstrings of the standard library (via ``ast``),
  deduplicated — English technical prose.
- ``code()``: the standard library's Python source with its docstrings removed.

Prose → code is a real distribution shift, like the papers' OpenWebText → code. ``text_files(paths)`` and
``hf_dataset(name_or_dataset)`` bring other text. ``TokenData.build(corpus)`` trains a byte-level BPE tokenizer
(the ``tokenizers`` library, deterministic), packs the documents into fixed-length blocks and holds out a split;
everything is cached under ``LENS_BIAS_CACHE`` (default ``~/.cache/lens_bias``) with the Python version the
corpus came from.
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
from typing import Any, Iterable, Sequence, Union

import torch
from jaxtyping import Int
from torch import Tensor

from .errors import LensBiasError

__all__ = ["Corpus", "TokenData", "prose", "code", "text_files", "hf_dataset", "cache_dir", "held_out_documents", "EVAL_FRACTION"]

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


def _docstring_nodes(tree: ast.Module) -> list[ast.Expr]:
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
    path.write_text(json.dumps({"documents": corpus.documents, "meta": corpus.meta}), encoding="utf-8")
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
        drop = {i for node in _docstring_nodes(tree) for i in range(node.lineno - 1, node.end_lineno)}
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


@dataclass
class TokenData:
    """A corpus as packed token blocks, with its tokenizer and a held-out split."""

    corpus_name: str
    train: Int[Tensor, "blocks block_len"]  # each block is seq_len + 1 tokens: inputs [:-1], targets [1:]
    eval: Int[Tensor, "blocks block_len"]
    vocab_size: int
    tokenizer_path: Path
    meta: dict[str, Any]

    @property
    def seq_len(self) -> int:
        return self.train.shape[1] - 1

    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.tokenizer_path))

    def unigram_entropy(self) -> float:
        """Entropy (nats) of the training tokens' unigram distribution: the loss of a model that ignores context."""
        counts = torch.bincount(self.train[:, 1:].flatten(), minlength=self.vocab_size).double()
        p = counts[counts > 0] / counts.sum()
        return float(-(p * p.log()).sum())

    @classmethod
    def build(
        cls,
        corpus: Corpus,
        *,
        vocab_size: int = 4096,
        seq_len: int = 128,
        eval_fraction: float = EVAL_FRACTION,
        tokenizer_from: "TokenData | Any" = None,
        cache: Union[str, Path, None] = None,
    ) -> "TokenData":
        """Tokenize and pack ``corpus`` (cached by content, vocabulary size and sequence length).

        Args:
            corpus: the documents.
            vocab_size: BPE vocabulary size of a tokenizer trained on this corpus.
            seq_len: tokens per training sequence (blocks hold seq_len + 1).
            eval_fraction: share of the documents (the last ones) held out for evaluation.
            tokenizer_from: reuse another TokenData's tokenizer (continued training on a new distribution must
                keep the model's vocabulary), or a pretrained one — a Hugging Face fast tokenizer such as a
                pretrained model's ``model.tokenizer``, or a ``tokenizers.Tokenizer`` — to train that model.
            cache: cache folder (default :func:`cache_dir`).
        """
        if not 0 < eval_fraction < 1:
            raise LensBiasError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        folder = Path(cache) if cache is not None else cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        if isinstance(tokenizer_from, TokenData):
            tokenizer_path, vocab_size = tokenizer_from.tokenizer_path, tokenizer_from.vocab_size
        elif tokenizer_from is not None:
            tokenizer_path, vocab_size = _save_pretrained(tokenizer_from, folder)
        else:
            tokenizer_path = folder / f"tokenizer-{corpus.name}-{corpus.digest()}-{vocab_size}.json"
            if not tokenizer_path.exists():
                _train_tokenizer(corpus.documents, vocab_size).save(str(tokenizer_path))
        key = hashlib.sha256(f"{corpus.digest()}|{tokenizer_path.name}|{seq_len}|{eval_fraction}".encode()).hexdigest()[:16]
        blocks_path = folder / f"blocks-{corpus.name}-{key}.pt"
        if blocks_path.exists():
            saved = torch.load(blocks_path, weights_only=True)
            return cls(corpus.name, saved["train"], saved["eval"], vocab_size, tokenizer_path, json.loads(saved["meta"]))
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(tokenizer_path))
        split = len(corpus.documents) - len(held_out_documents(corpus, eval_fraction))
        eot = _separator(tokenizer, tokenizer_from)
        train = _pack(tokenizer, corpus.documents[:split], seq_len, eot)
        held_out = _pack(tokenizer, corpus.documents[split:], seq_len, eot)
        if len(train) == 0 or len(held_out) == 0:
            raise LensBiasError(f"corpus {corpus.name!r} is too small for blocks of {seq_len + 1} tokens")
        meta = {**corpus.meta, "corpus": corpus.name, "digest": corpus.digest(), "documents": len(corpus.documents), "seq_len": seq_len, "vocab_size": vocab_size}
        torch.save({"train": train, "eval": held_out, "meta": json.dumps(meta)}, blocks_path)
        return cls(corpus.name, train, held_out, vocab_size, tokenizer_path, meta)


def _train_tokenizer(documents: Sequence[str], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on ``documents``; deterministic for the same documents and size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(documents, trainer=trainer, length=len(documents))
    return tokenizer


def _save_pretrained(tokenizer: Any, folder: Path) -> tuple[Path, int]:
    """A pretrained tokenizer written to the cache under its content hash; returns the file and its vocabulary size."""
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # a HF fast tokenizer wraps a tokenizers.Tokenizer
    if not hasattr(backend, "to_str"):
        raise LensBiasError(
            f"tokenizer_from must be a TokenData, a Hugging Face fast tokenizer or a tokenizers.Tokenizer, got "
            f"{type(tokenizer).__name__} (load the tokenizer with AutoTokenizer.from_pretrained(..., use_fast=True))"
        )
    text = backend.to_str()
    path = folder / f"tokenizer-pretrained-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.exists():
        path.write_text(text, encoding="utf-8")
    return path, backend.get_vocab_size(with_added_tokens=True)


def _separator(tokenizer: Any, source: Any) -> int:
    """The token between packed documents: <|endoftext|>, else a pretrained tokenizer's end-of-sequence token."""
    eot = tokenizer.token_to_id("<|endoftext|>")
    if eot is None and getattr(source, "eos_token", None) is not None:
        eot = tokenizer.token_to_id(source.eos_token)
    if eot is None:
        raise LensBiasError("the tokenizer has neither <|endoftext|> nor an eos_token to separate documents; add one (tokenizer.add_special_tokens)")
    return eot


def _pack(tokenizer: Any, documents: Sequence[str], seq_len: int, eot: int) -> Tensor:
    """Concatenate the documents (separated by ``eot``) and cut into blocks of seq_len + 1 tokens."""
    ids: list[int] = []
    for encoding in tokenizer.encode_batch(list(documents)):
        ids += encoding.ids + [eot]
    n_blocks = len(ids) // (seq_len + 1)
    return torch.tensor(ids[: n_blocks * (seq_len + 1)], dtype=torch.long).view(n_blocks, seq_len + 1)
