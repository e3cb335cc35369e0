"""Training text as packed token blocks: ``TokenData.build(corpus)`` trains a byte-level BPE tokenizer (the
``tokenizers`` library, deterministic), packs a :class:`~lens_bias.core.corpora.Corpus` into fixed-length blocks
and keeps its held-out documents apart; everything is cached under ``LENS_BIAS_CACHE`` (default
``~/.cache/lens_bias``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, Union

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.core.corpora import EVAL_FRACTION, Corpus, cache_dir, held_out_documents
from lens_bias.core.errors import LensBiasError
from lens_bias.core.files import atomic_save, atomic_write_text

__all__ = ["TokenData"]


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
        tokenizer_from: TokenData | Any = None,
        cache: Union[str, Path, None] = None,
        progress: bool = False,
    ) -> TokenData:
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
            progress: a progress bar over its three steps (the tokenizer, the training blocks, the held-out blocks).
        """
        if not 0 < eval_fraction < 1:
            raise LensBiasError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
            raise LensBiasError(f"seq_len must be a positive int, got {seq_len!r}")
        folder = Path(cache) if cache is not None else cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        with tqdm(total=3, desc=f"tokenizing {corpus.name}", disable=not progress, leave=False) as bar:
            return cls._build(corpus, vocab_size, seq_len, eval_fraction, tokenizer_from, folder, bar)

    @classmethod
    def _build(cls, corpus: Corpus, vocab_size: int, seq_len: int, eval_fraction: float, tokenizer_from: Any, folder: Path, bar: Any) -> TokenData:
        if isinstance(tokenizer_from, TokenData):
            tokenizer_path, vocab_size = tokenizer_from.tokenizer_path, tokenizer_from.vocab_size
        elif tokenizer_from is not None:
            tokenizer_path, vocab_size = _save_pretrained(tokenizer_from, folder)
        else:
            _check_vocab_size(vocab_size, corpus)
            tokenizer_path = folder / f"tokenizer-{corpus.name}-{corpus.digest()}-{vocab_size}.json"
            if not tokenizer_path.exists():
                atomic_write_text(tokenizer_path, _train_tokenizer(corpus.documents, vocab_size).to_str())
        bar.update()
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
        bar.update()
        held_out = _pack(tokenizer, corpus.documents[split:], seq_len, eot)
        bar.update()
        if len(train) == 0 or len(held_out) == 0:
            raise LensBiasError(f"corpus {corpus.name!r} is too small for blocks of {seq_len + 1} tokens")
        meta = {**corpus.meta, "corpus": corpus.name, "digest": corpus.digest(), "documents": len(corpus.documents), "seq_len": seq_len, "vocab_size": vocab_size}
        atomic_save({"train": train, "eval": held_out, "meta": json.dumps(meta)}, blocks_path)  # a cache: never half-written
        return cls(corpus.name, train, held_out, vocab_size, tokenizer_path, meta)


# The byte-level alphabet and the end-of-text token: what a BPE vocabulary holds before its first merge.
_BASE_VOCAB = 257


def _check_vocab_size(vocab_size: Any, corpus: Corpus) -> None:
    """Every merge joins two neighbouring symbols of the corpus, so it has fewer merges than characters; the BPE
    trainer reserves a table of ``vocab_size`` entries at once, so a larger size would only exhaust memory."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < _BASE_VOCAB:
        raise LensBiasError(f"vocab_size must be an int >= {_BASE_VOCAB} (the byte alphabet and the end-of-text token), got {vocab_size!r}")
    largest = _BASE_VOCAB + sum(len(doc) for doc in corpus.documents)
    if vocab_size > largest:
        raise LensBiasError(
            f"vocab_size {vocab_size} is more than the {corpus.name!r} corpus can give a BPE tokenizer (fewer merges than its "
            f"characters); pass vocab_size <= {largest}"
        )


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
        atomic_write_text(path, text)
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
