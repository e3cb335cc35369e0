"""Inputs: the protocol of the born-biased papers (uniform token IDs, no BOS; or Gaussian embeddings), and real
text and repeated tokens for pretrained models (the attention-sink papers' three input kinds).

Everything here is seeded through a local ``torch.Generator`` so that a number in a report can be reproduced
by hand: ``analyze(model, seed=s)`` analyses exactly ``random_tokens(n, seq_len, d_vocab, seed=s)``, and
``analyze(model, inputs="text", seed=s)`` exactly ``text_tokens(model.tokenizer, n, seq_len, seed=s)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Union

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from lens_bias.core import memory
from lens_bias.core.corpora import Corpus, code, held_out_documents, prose
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.serialise import Serialisable

__all__ = ["check_context", "check_later_position", "random_tokens", "text_tokens", "repeated_tokens", "with_bos", "random_embeddings", "RandomTokens", "RandomEmbeddings", "InputSpec", "Inputs", "resolve_inputs", "is_tokens", "token_ids"]

# The corpora real text is cut from, by name.
CORPORA = {"prose": prose, "code": code}


def _check_count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WrongType(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise LensBiasError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_context(seq_len: int, n_ctx: int) -> None:
    """Refuse, in one line, sequences longer than the model's context."""
    if seq_len > n_ctx:
        raise LensBiasError(f"seq_len {seq_len} exceeds the model's context n_ctx={n_ctx}; pass seq_len <= {n_ctx}")


def check_later_position(position: int, seq_len: int, name: str = "position") -> None:
    """Refuse, in one line, a position that is not a later token than the first of ``seq_len``."""
    if not 0 < position < seq_len:
        raise LensBiasError(f"{name} must lie in 1..{seq_len - 1} (a later token than the first), got {position}")


def random_tokens(
    n: int, seq_len: int, vocab: int, seed: int = 42, *, device: Union[str, torch.device, None] = None
) -> Int[Tensor, "n seq"]:
    """Token IDs drawn i.i.d. uniform from ``[0, vocab)``, no BOS.

    >>> random_tokens(2, 5, vocab=100, seed=42).shape
    torch.Size([2, 5])

    Args:
        n: number of sequences.
        seq_len: tokens per sequence.
        vocab: IDs are drawn from ``[0, vocab)``; use the smallest vocabulary of the models you compare.
        seed: seed of the local generator (the papers use 42).
        device: where to put the result (drawn on CPU, so the IDs do not depend on the device).

    Returns:
        A ``torch.long`` tensor of shape ``[n, seq_len]``.
    """
    _check_count("n", n, 1)
    _check_count("seq_len", seq_len, 1)
    _check_count("vocab", vocab, 1)
    memory.check_held(f"random_tokens({n}, {seq_len})", n, seq_len * 8, "n", "seq_len")  # int64 IDs; RandomTokens draws per batch
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (n, seq_len), generator=generator)
    return tokens if device is None else tokens.to(device)


def _encode(tokenizer: Any, text: str) -> list[int]:
    """Token IDs of ``text`` without special tokens, for a Hugging Face or a ``tokenizers`` tokenizer."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return list(ids.ids) if hasattr(ids, "ids") else list(ids)


def _bos_id(tokenizer: Any) -> int:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        raise LensBiasError("bos=True needs a tokenizer with a bos_token_id; pass bos=False, or with_bos(tokens, id) with your own ID")
    return int(bos)


def with_bos(tokens: Int[Tensor, "n seq"], bos: int | None) -> Int[Tensor, "n seq"]:
    """A copy of ``tokens`` whose first column is ``bos`` (unchanged when ``bos`` is None); the length stays.

    >>> with_bos(torch.tensor([[5, 6, 7]]), 1)
    tensor([[1, 6, 7]])
    """
    if bos is None:
        return tokens
    out = tokens.clone()
    out[:, 0] = bos
    return out


def text_tokens(
    tokenizer: Any, n: int, seq_len: int, *, corpus: str = "prose", bos: bool = False, seed: int = 0
) -> Int[Tensor, "n seq"]:
    """``n`` windows of real text, ``seq_len`` tokens each, from the held-out split of a standard-library corpus.

    The corpus is :func:`lens_bias.core.corpora.prose` or :func:`lens_bias.core.corpora.code`; its held-out documents (the last 5%,
    the split ``TokenData.build`` never trains on) are tokenized with ``tokenizer``, joined with its EOS token,
    cut into consecutive non-overlapping windows, and ``n`` windows are picked by a permutation drawn from a local
    generator seeded with ``seed``.

    >>> from tokenizers import Tokenizer, models, pre_tokenizers
    >>> tok = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")); tok.pre_tokenizer = pre_tokenizers.Whitespace()
    >>> text_tokens(tok, 2, 8).shape
    torch.Size([2, 8])

    Args:
        tokenizer: a Hugging Face tokenizer (``model.tokenizer``) or a ``tokenizers.Tokenizer``.
        n: number of sequences.
        seq_len: tokens per sequence, the BOS token included when ``bos=True``.
        corpus: "prose" (English help texts and docstrings) or "code" (Python source).
        bos: make the first token the tokenizer's BOS token (the window then holds ``seq_len − 1`` text tokens).
        seed: which windows are picked.

    Returns:
        A ``torch.long`` tensor ``[n, seq_len]``.
    """
    _check_count("n", n, 1)
    _check_count("seq_len", seq_len, 2 if bos else 1)
    if corpus not in CORPORA:
        raise LensBiasError(f"corpus must be one of {list(CORPORA)}, got {corpus!r}")
    stream = _held_out_stream(tokenizer, CORPORA[corpus]())
    width = seq_len - 1 if bos else seq_len
    n_windows = len(stream) // width
    if n > n_windows:
        raise LensBiasError(
            f"the held-out {corpus} corpus has {len(stream)} tokens under this tokenizer: at most {n_windows} "
            f"sequences of {seq_len}; ask for fewer or shorter sequences"
        )
    order = torch.randperm(n_windows, generator=torch.Generator().manual_seed(seed))[:n]
    windows = torch.tensor(stream[: n_windows * width], dtype=torch.long).view(n_windows, width)[order]
    if bos:
        windows = torch.cat([torch.full((n, 1), _bos_id(tokenizer), dtype=torch.long), windows], dim=1)
    return windows


def _held_out_stream(tokenizer: Any, corpus: Corpus) -> list[int]:
    eos = getattr(tokenizer, "eos_token_id", None)
    stream: list[int] = []
    for document in held_out_documents(corpus):
        stream += _encode(tokenizer, document) + ([int(eos)] if eos is not None else [])
    return stream


def repeated_tokens(n: int, seq_len: int, vocab: int, seed: int = 42, *, bos: int | None = None) -> Int[Tensor, "n seq"]:
    """Each sequence one token ID repeated ``seq_len`` times (drawn uniform in ``[0, vocab)`` per sequence).

    Gu et al.'s third input kind: RoPE models lose the first-token sink on it (every position looks alike).

    >>> repeated_tokens(2, 4, vocab=10, seed=0)
    tensor([[4, 4, 4, 4],
            [9, 9, 9, 9]])

    Args:
        n: number of sequences.
        seq_len: tokens per sequence.
        vocab: the repeated IDs are drawn below this.
        seed: seed of the local generator.
        bos: a token ID for position 0 (None: none).

    Returns:
        A ``torch.long`` tensor ``[n, seq_len]``.
    """
    _check_count("seq_len", seq_len, 1)
    memory.check_held(f"repeated_tokens({n}, {seq_len})", n, seq_len * 8, "n", "seq_len")
    ids = random_tokens(n, 1, vocab, seed)
    return with_bos(ids.expand(n, seq_len).clone(), bos)


@dataclass(frozen=True)
class RandomTokens:
    """Lazily drawn token IDs, uniform below ``vocab``: exactly the IDs of :func:`random_tokens` (one CPU generator
    seeded with ``seed``, drawn row after row), made batch by batch so that ``n × seq_len`` IDs are never held at
    once and a pass over any ``n`` starts at once.

    Consecutive slices continue the generator where the last one stopped; any other slice draws again from row 0
    (so read them in order, as every lens_bias pass does).

    >>> toks = RandomTokens(n=5, seq_len=4, vocab=100, seed=42)
    >>> torch.equal(torch.cat([toks[0:2], toks[2:5]]), random_tokens(5, 4, 100, seed=42))
    True
    """

    n: int
    seq_len: int
    vocab: int
    seed: int = 42
    # Index of this object's row 0 in the seed's row stream: ``view`` shards without drawing anything.
    first: int = 0
    # [generator, the next row it draws]: where the last slice stopped
    _cursor: list = field(default_factory=list, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_count("n", self.n, 1)
        _check_count("seq_len", self.seq_len, 1)
        _check_count("vocab", self.vocab, 1)

    def __len__(self) -> int:
        return self.n

    @property
    def shape(self) -> tuple[int, int]:
        return (self.n, self.seq_len)

    def __getitem__(self, rows: slice) -> Int[Tensor, "batch seq"]:
        if not isinstance(rows, slice) or rows.step not in (None, 1):
            raise WrongType("RandomTokens supports contiguous slices only, e.g. tokens[0:32]")
        start, stop, _ = rows.indices(self.n)
        if stop <= start:
            return torch.empty(0, self.seq_len, dtype=torch.long)
        start, stop = start + self.first, stop + self.first
        if not self._cursor or self._cursor[1] != start:
            self._cursor[:] = [torch.Generator().manual_seed(self.seed), 0]
            while self._cursor[1] < start:  # draw and drop the rows before this slice, ≤ 2^20 IDs at a time
                skip = min(start - self._cursor[1], max(1, 2**20 // self.seq_len))
                torch.randint(0, self.vocab, (skip, self.seq_len), generator=self._cursor[0])
                self._cursor[1] += skip
        out = torch.randint(0, self.vocab, (stop - start, self.seq_len), generator=self._cursor[0])
        self._cursor[1] = stop
        return out

    def view(self, start: int, stop: int) -> "RandomTokens":
        """Rows ``[start, stop)`` as a lazy RandomTokens of their own (the same IDs as ``self[start:stop]``)."""
        if not 0 <= start < stop <= self.n:
            raise LensBiasError(f"view needs 0 <= start < stop <= {self.n}, got [{start}, {stop})")
        return replace(self, n=stop - start, first=self.first + start)

    def tensor(self) -> Int[Tensor, "n seq"]:
        """All rows at once (``n × seq_len`` int64: mind the memory)."""
        return self[0 : self.n]


@dataclass(frozen=True)
class RandomEmbeddings:
    """Lazily drawn Gaussian input embeddings ``N(mean, std)`` of shape ``[n, seq_len, d_model]``.

    Row ``i`` comes from its own generator, numpy's PCG64 seeded with the entropy ``[seed, i]`` (torch's CPU
    generator keeps only 32 bits of a seed, so distinct (seed, row) pairs could collide there). A row is the
    same whatever batch it is drawn in, and ``n × seq_len × d_model`` floats are never held at once.

    >>> emb = RandomEmbeddings(n=4, seq_len=3, d_model=8, mean=0.0, std=0.02, seed=42)
    >>> torch.equal(emb[1:3], emb.tensor()[1:3])
    True
    """

    n: int
    seq_len: int
    d_model: int
    mean: float
    std: float
    seed: int = 42
    # Index of this object's row 0 in the seed's row stream: ``view`` shards without drawing anything.
    first: int = 0

    def __post_init__(self) -> None:
        _check_count("n", self.n, 1)
        _check_count("seq_len", self.seq_len, 1)
        _check_count("d_model", self.d_model, 1)
        if self.seed < 0:
            raise LensBiasError(f"seed must be non-negative, got {self.seed}")
        if not (np.isfinite(self.mean) and np.isfinite(self.std)):
            raise LensBiasError(
                f"embedding mean and std must be finite, got mean={self.mean}, std={self.std} "
                "(random_embeddings reads them from the model's W_E: check its weights for NaN/inf)"
            )

    def __len__(self) -> int:
        return self.n

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.n, self.seq_len, self.d_model)

    def __getitem__(self, rows: slice) -> Float[Tensor, "batch seq d_model"]:
        if not isinstance(rows, slice):
            raise WrongType("RandomEmbeddings supports slices only, e.g. emb[0:32]")
        out = [self._row(i) for i in range(*rows.indices(self.n))]
        return torch.stack(out) if out else torch.empty(0, self.seq_len, self.d_model)

    def view(self, start: int, stop: int) -> "RandomEmbeddings":
        """Rows ``[start, stop)`` as a lazy RandomEmbeddings of their own (the same values as ``self[start:stop]``)."""
        if not 0 <= start < stop <= self.n:
            raise LensBiasError(f"view needs 0 <= start < stop <= {self.n}, got [{start}, {stop})")
        return replace(self, n=stop - start, first=self.first + start)

    def _row(self, i: int) -> Float[Tensor, "seq d_model"]:
        draws = np.random.default_rng([self.seed, self.first + i]).standard_normal((self.seq_len, self.d_model), dtype=np.float32)
        return torch.from_numpy(draws) * self.std + self.mean

    def tensor(self) -> Float[Tensor, "n seq d_model"]:
        """All rows at once (``n × seq_len × d_model`` floats: mind the memory)."""
        return self[0 : self.n]


def random_embeddings(model: Any, n: int, seq_len: int, seed: int = 42, *, std: float | None = None) -> RandomEmbeddings:
    """Gaussian input embeddings: N(mean, std) of ``model``'s own embedding matrix, or N(0, ``std``) when given.

    The two conventions answer two questions. W_E's statistics (the default, what ``analyze`` uses) put the inputs
    on the scale this model's embeddings have. A fixed N(0, ``std``) gives every model of one width the very same
    inputs, whatever its weights: what comparing two models needs (:func:`lens_bias.seedprint.fingerprint` passes
    the init std, so a trained model and its init see identical inputs).

    The model receives them in place of its token embedding (lens_bias replaces the output of ``hook_embed``),
    so learned position embeddings, where the model has them, are still added.

    >>> import lens_bias
    >>> m = lens_bias.models.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=16)
    >>> round(random_embeddings(m, 8, 16).std, 2)
    0.02
    >>> random_embeddings(m, 8, 16, std=1.0).mean, random_embeddings(m, 8, 16, std=1.0).std
    (0.0, 1.0)

    Args:
        model: a TransformerLens model (its ``W_E`` is read, never modified).
        n: number of sequences.
        seq_len: positions per sequence.
        seed: seed of the per-row generators.
        std: draw N(0, std) instead of following ``W_E`` (whose width is still read).

    Returns:
        A :class:`RandomEmbeddings` that draws rows on demand.
    """
    w_e = getattr(model, "W_E", None)
    if not isinstance(w_e, Tensor):
        raise WrongType(f"random_embeddings needs a TransformerLens model with a W_E matrix, got {type(model).__name__}")
    if std is not None:
        return RandomEmbeddings(n=n, seq_len=seq_len, d_model=w_e.shape[-1], mean=0.0, std=std, seed=seed)
    w_e = w_e.detach().float()
    return RandomEmbeddings(n=n, seq_len=seq_len, d_model=w_e.shape[-1], mean=w_e.mean().item(), std=w_e.std().item(), seed=seed)


Inputs = Union[Int[Tensor, "n seq"], Float[Tensor, "n seq d_model"], RandomTokens, RandomEmbeddings]


def is_tokens(inputs: Inputs) -> bool:
    """Whether ``inputs`` are token IDs (a tensor [n, seq] or :class:`RandomTokens`) rather than embeddings: the one
    place the input kind is read off the inputs themselves (an :class:`InputSpec` records it as ``kind``)."""
    return isinstance(inputs, RandomTokens) or (isinstance(inputs, Tensor) and inputs.ndim == 2)


def token_ids(inputs: Inputs) -> Int[Tensor, "n seq"] | None:
    """The token IDs of ``inputs``, drawn now for :class:`RandomTokens`; None for embedding inputs."""
    if isinstance(inputs, RandomTokens):
        return inputs.tensor()
    return inputs if is_tokens(inputs) else None  # type: ignore[return-value]  # is_tokens: a 2-d tensor


@dataclass(frozen=True)
class InputSpec(Serialisable):
    """What an analysis was run on: enough to regenerate the inputs."""

    kind: str  # "tokens", "text" or "embeddings"
    n: int
    seq_len: int
    seed: int | None  # None when the user passed their own tensor
    vocab: int | None = None  # token inputs: IDs were drawn from [0, vocab)
    corpus: str | None = None  # text inputs: the held-out corpus they were cut from

    def describe(self) -> str:
        """E.g. "256 random tokens sequences of length 128, seed 42"."""
        what = f"held-out {self.corpus} text" if self.kind == "text" else self.kind if self.seed is None else f"random {self.kind}"
        return f"{self.n} {what} sequences of length {self.seq_len}" + (f", seed {self.seed}" if self.seed is not None else "")


def resolve_inputs(
    inputs: Union[str, Inputs], *, model: Any, d_vocab: int, n_sequences: int, seq_len: int, seed: int, embed_std: float | None = None
) -> tuple[Inputs, InputSpec]:
    """Turn ``"tokens"`` / ``"text"`` / ``"embeddings"`` / a tensor into concrete inputs plus their :class:`InputSpec`.

    ``"embeddings"`` follow :func:`random_embeddings`: the model's W_E statistics, or N(0, ``embed_std``) when
    ``embed_std`` is given (the same inputs for every model of one width, as SeedPrint's fingerprints use).
    """
    if isinstance(inputs, str):
        _check_count("n_sequences", n_sequences, 1)
        _check_count("seq_len", seq_len, 1)
        if inputs == "tokens":
            return RandomTokens(n_sequences, seq_len, d_vocab, seed), InputSpec("tokens", n_sequences, seq_len, seed, d_vocab)
        if inputs == "embeddings":
            return random_embeddings(model, n_sequences, seq_len, seed, std=embed_std), InputSpec("embeddings", n_sequences, seq_len, seed)
        if inputs == "text":
            tokenizer = getattr(model, "tokenizer", None)
            if tokenizer is None:
                raise LensBiasError("inputs='text' needs model.tokenizer (lens_bias.models.pretrained sets it); pass token IDs from text_tokens(your_tokenizer, ...) instead")
            return text_tokens(tokenizer, n_sequences, seq_len, seed=seed), InputSpec("text", n_sequences, seq_len, seed, corpus="prose")
        raise LensBiasError(f"inputs must be 'tokens', 'text', 'embeddings' or a tensor, got {inputs!r}")
    if isinstance(inputs, RandomEmbeddings):
        return inputs, InputSpec("embeddings", inputs.n, inputs.seq_len, inputs.seed)
    if isinstance(inputs, RandomTokens):
        if inputs.vocab > d_vocab:
            raise LensBiasError(f"RandomTokens draw IDs below {inputs.vocab}, beyond the model's d_vocab={d_vocab}")
        return inputs, InputSpec("tokens", inputs.n, inputs.seq_len, inputs.seed, inputs.vocab)
    if isinstance(inputs, Tensor):
        if inputs.dtype in (torch.int64, torch.int32) and inputs.ndim == 2:
            if inputs.numel() and (int(inputs.min()) < 0 or int(inputs.max()) >= d_vocab):
                raise LensBiasError(f"token IDs must lie in [0, d_vocab={d_vocab}); got [{int(inputs.min())}, {int(inputs.max())}]")
            return inputs.long(), InputSpec("tokens", inputs.shape[0], inputs.shape[1], None, None)
        if inputs.is_floating_point() and inputs.ndim == 3:
            return inputs, InputSpec("embeddings", inputs.shape[0], inputs.shape[1], None)
        raise LensBiasError(
            f"a tensor input must be token IDs [n, seq] (int64) or embeddings [n, seq, d_model] (float); "
            f"got dtype {inputs.dtype} and shape {tuple(inputs.shape)}"
        )
    raise WrongType(f"inputs must be 'tokens', 'text', 'embeddings', a tensor or RandomEmbeddings, got {type(inputs).__name__}")
