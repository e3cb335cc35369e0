"""SeedPrint fingerprints: a model's readout (the state it unembeds, after the final norm's gain) at the last position
of N recorded random inputs; beside it, the final norm's output before its gain, which the aligned tests compare.

Inputs come from :func:`lens_bias.core.inputs.resolve_inputs`, the path every analysis uses, with one convention for
embedding inputs chosen explicitly there: N(0, ``embed_std``), the same for every model of one width (two models'
fingerprints must see the same inputs, and a trained model's ``W_E`` statistics drift from its init's).

>>> import lens_bias
>>> small = dict(d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> fp = fingerprint(lens_bias.random_init("gpt2", seed=1, **small), n=8, seq_len=16, progress=False)
>>> fp.n, fp.d, fp.inputs.kind
(8, 64, 'tokens')
"""

from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import asdict, dataclass, field, fields, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, Union, overload

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from lens_bias.core import distributed as distributed_run
from lens_bias.core import offload, tl
from lens_bias.core.adapter import NORMALIZED, ModelAdapter, one_adapter_per_call
from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.files import atomic_save, load_torch_file
from lens_bias.core.model_facts import ModelInfo
from lens_bias.core.inputs import (
    Inputs,
    RandomEmbeddings,
    RandomTokens,
    resolve_inputs,
)
from lens_bias.core.probes import last_position
from lens_bias.core.serialise import Serialisable
from lens_bias.core.settings import overridden

__all__ = ["Fingerprint", "InputRecord", "FingerprintSettings", "fingerprint", "regenerate_inputs", "as_features", "check_compatible", "FeaturesLike"]

logger = logging.getLogger(__name__)

FeaturesLike = Union["Fingerprint", Tensor, np.ndarray]
# Embedding inputs of a model whose init std lens_bias did not record: the Hugging Face initializer range.
DEFAULT_EMBED_STD = 0.02


@dataclass(frozen=True)
class InputRecord(Serialisable):
    """What a fingerprint read: enough to draw its inputs again (when they were drawn) and to refuse comparing two
    fingerprints of different inputs.

    >>> InputRecord(kind="tokens", n=8, seq_len=16, seed=42, vocab=500).settings().vocab
    500
    """

    kind: str  # "tokens" or "embeddings"
    n: int  # sequences
    seq_len: int  # tokens per sequence
    seed: int | None = None  # the drawn inputs' seed; None: the caller's own tensor, of which only the digest is kept
    vocab: int | None = None  # drawn token IDs are below this
    mean: float | None = None  # drawn embedding inputs are N(mean, std)
    std: float | None = None
    digest: str | None = None  # of the exact inputs (sha256), checked when they are drawn again
    renamed: bool = False  # the base's inputs read through a renamed vocabulary (fingerprint_like): the same inputs

    def settings(self, like: FingerprintSettings | None = None) -> FingerprintSettings:
        """The settings that draw these inputs again (drawn token inputs only), with ``like``'s pass (batch size,
        device, dtype, embed_std)."""
        if self.kind != "tokens" or self.seed is None:
            raise LensBiasError("only a fingerprint made on drawn token inputs (inputs='tokens') can be made again on the same inputs")
        return replace(like or FingerprintSettings(), inputs="tokens", n=self.n, seq_len=self.seq_len, seed=self.seed, vocab=self.vocab)


@dataclass
class Fingerprint:
    """A model's SeedPrint features on a recorded set of random inputs; ``save`` once, compare many times."""

    FORMAT: ClassVar[str] = "lens_bias.Fingerprint/2"  # /1 held the final norm's output before its gain as the features

    # float32 CPU, the last position. features: the readout, the state the model unembeds (after the final norm's
    # gain; Hugging Face's last_hidden_state): the published test's features. normalized: the final norm before its
    # gain, what the aligned tests compare (a rotated basis folds the gain into the next weights, so only the
    # gain-free reading is related to the base's by the rotation); None where it is the readout itself.
    features: Float[Tensor, "n d_model"]
    inputs: InputRecord  # what it read
    model: ModelInfo  # the fingerprinted model (its regime tells the tests whether it is trained)
    spec: dict[str, Any] | None = None  # lens_bias ModelSpec when lens_bias built the model (rebuilds the null)
    versions: dict[str, str] = field(default_factory=dict)
    normalized: Float[Tensor, "n d_model"] | None = None

    @property
    def n(self) -> int:
        return self.features.shape[0]

    @property
    def d(self) -> int:
        return self.features.shape[1]

    def save(self, path: Union[str, Path]) -> None:
        """Write to ``path`` (a torch file holding only tensors and plain Python values).

        The file is written under a temporary name and renamed, so an interrupted save never leaves a partial file.
        """
        atomic_save(self.saved(), path)

    def saved(self) -> dict[str, Any]:
        """What :meth:`save` writes: tensors and plain values (the records as dicts), with the format's name."""
        return {"format": Fingerprint.FORMAT, **asdict(self)}

    @classmethod
    def from_saved(cls, data: Mapping[str, Any]) -> "Fingerprint":
        """The fingerprint :meth:`saved` wrote (the ``format`` key left out)."""
        return cls(**{**data, "inputs": InputRecord.from_dict(data["inputs"]), "model": ModelInfo.from_dict(data["model"])})

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Fingerprint":
        """Read a fingerprint written by :meth:`save`; a foreign, corrupt or non-finite file raises :class:`LensBiasError`."""
        fix = "make one with `lens-bias fingerprint` or Fingerprint.save"
        data = load_torch_file(path, "fingerprint", fix)
        kind = data.pop("format", None)
        if kind == "lens_bias.Fingerprint/1":
            raise LensBiasError(f"{path} was made by an earlier lens_bias, whose features were read before the final norm's gain; fingerprint the model again")
        if kind != Fingerprint.FORMAT:
            raise LensBiasError(f"{path} is not a lens_bias fingerprint file; {fix}")
        names = {f for f in cls.__dataclass_fields__}
        features = data.get("features")
        damaged = LensBiasError(f"{path} is a damaged lens_bias fingerprint (fields {sorted(data)}); {fix}")
        if not names >= set(data) or not isinstance(features, Tensor) or features.ndim != 2 or not features.is_floating_point() \
                or not all(isinstance(data.get(record), Mapping) for record in ("inputs", "model")):
            raise damaged
        if not torch.isfinite(features).all() or (isinstance(data.get("normalized"), Tensor) and not torch.isfinite(data["normalized"]).all()):
            raise LensBiasError(f"{path} holds NaN/inf features: the fingerprinted model overflowed or is broken; {fix} in float32 or bfloat16")
        try:
            return cls.from_saved(data)
        except LensBiasError as err:  # a record with fields this lens_bias does not know
            raise LensBiasError(f"{path} holds a fingerprint record this lens_bias cannot read ({err}); {fix}") from None


def _digest(inputs: Inputs) -> str:
    if isinstance(inputs, RandomEmbeddings):
        return "random-embeddings:" + repr(asdict(inputs))
    digest = hashlib.sha256()
    if isinstance(inputs, RandomTokens):  # the bytes of the whole tensor, drawn ≤ 2^20 IDs at a time
        rows = max(1, 2**20 // inputs.seq_len)
        for start in range(0, inputs.n, rows):
            digest.update(inputs[start : min(start + rows, inputs.n)].numpy().tobytes())
    else:
        digest.update(inputs.detach().cpu().contiguous().numpy().tobytes())
    return "sha256:" + digest.hexdigest()


def _versions() -> dict[str, str]:
    return {"lens_bias": version("lens-bias"), "transformer_lens": tl.tl_version(), "torch": str(torch.__version__)}


def _with_device_dtype(model: Any, device: Union[str, torch.device, None], dtype: torch.dtype | None) -> Any:
    """The model itself, or a copy on ``device`` / in ``dtype``: the caller's model is never moved or cast."""
    adapter = ModelAdapter.of(model)
    want_device = torch.device(device) if device is not None else adapter.device
    want_dtype = dtype
    if want_dtype is None:
        # fp16 overflows on long random sequences; the papers run half-precision models in bf16
        want_dtype = torch.bfloat16 if adapter.dtype == torch.float16 else adapter.dtype
    same_device = want_device.type == adapter.device.type and want_device.index in (None, adapter.device.index)
    if same_device and want_dtype == adapter.dtype:
        return model
    if offload.is_dispatched(model):
        raise LensBiasError(
            f"this model is placed by a device map (offloaded), so it cannot be copied to {want_device} in {want_dtype}: "
            "load it in the dtype to fingerprint in (pretrained(..., dtype=torch.bfloat16)), or pass dtype= and device= as it is"
        )
    logger.info("fingerprinting a copy of the model on %s in %s (the model you passed is not moved)", want_device, want_dtype)
    clone = copy.deepcopy(model)
    if hasattr(model, "lens_bias_spec"):
        clone.lens_bias_spec = model.lens_bias_spec
    return tl.move(tl.move(clone, want_device), want_dtype)


@dataclass(frozen=True)
class FingerprintSettings(Serialisable):
    """What a fingerprint is made from: the random inputs, and how they go through the model.

    Two fingerprints are compared only when their inputs match, so every field that shapes the inputs is recorded
    in the fingerprint; ``batch_size``, ``device`` and ``dtype`` change how the pass runs, not what it reads.

    >>> FingerprintSettings(n=512).seq_len
    1024
    """

    inputs: Union[str, Inputs] = "tokens"  # "tokens": IDs uniform in [0, vocab); "embeddings": N(0, embed_std) in place of the token
    # embedding, the same inputs for every model of one width; or explicit token IDs / embeddings (resolve_inputs)
    n: int = 2000  # random sequences: the papers' N
    seq_len: int = 1024  # tokens per sequence: the papers' length
    seed: int = 42  # seed of the random inputs: the papers'
    vocab: int | None = None  # IDs are drawn below this: the smallest vocabulary of the models compared (None: the model's)
    embed_std: float | None = None  # std of embedding inputs (None: a lens_bias model's recorded init std, else 0.02, HF's range)
    batch_size: int | None = None  # sequences per forward pass (None: what the memory plan allows)
    device: Union[str, torch.device, None] = None  # run a copy of the model there (None: where the model is)
    dtype: torch.dtype | None = None  # run a copy in this dtype (None: the model's, but bfloat16 for float16, which overflows)


@overload
def fingerprint(
    model: Any, settings: FingerprintSettings | None = None, *, progress: bool = True, distributed: Literal[False] = False, **overrides: Any
) -> Fingerprint: ...


@overload
def fingerprint(model: Any, settings: FingerprintSettings | None = None, *, progress: bool = True, distributed: bool, **overrides: Any) -> Fingerprint | None: ...


@one_adapter_per_call
def fingerprint(
    model: Any, settings: FingerprintSettings | None = None, *, progress: bool = True, distributed: bool = False, **overrides: Any
) -> Fingerprint | None:
    """SeedPrint features of ``model``: its readout at the last position of N random inputs.

    The readout is the state the model unembeds, after the final norm and its gain (Hugging Face's
    ``last_hidden_state``), as the published test defines it. The final norm's output before its gain is kept beside
    it (``Fingerprint.normalized``) for the aligned tests. The forward pass stops before the unembedding and keeps
    only the last position, so memory does not grow with N beyond the ``[N, d_model]`` results.

    Args:
        model: any TransformerLens model (never modified).
        settings: the inputs and the pass (:class:`FingerprintSettings`; its defaults are the papers').
        progress: a progress bar over batches.
        distributed: under ``torchrun --nproc_per_node K``, shard the inputs across the K ranks (whole batches,
            NCCL on GPUs with each rank on ``cuda:LOCAL_RANK``, gloo on CPU) and gather the features on rank 0 in
            input order; the result equals the single-process fingerprint.
        **overrides: fields of :class:`FingerprintSettings` (``n=512``), which replace those of ``settings``.

    Returns:
        A :class:`Fingerprint` (with ``distributed=True``: on rank 0; the other ranks get ``None``).
    """
    s = overridden(FingerprintSettings, settings, overrides, "fingerprint()")
    spec = getattr(model, "lens_bias_spec", None)
    data, described = _drawn_inputs(model, s, spec)
    adapter = ModelAdapter.of(model)
    readout = adapter.readout_probe()
    # the gain-free reading, where the readout is not already it
    probes = [readout] + ([last_position(NORMALIZED)] if adapter.has_hook(NORMALIZED) and readout.key != f"{NORMALIZED}:last" else [])
    keys = [p.key for p in probes]
    if distributed:
        distributed_run.ensure_process_group()
        runner = _with_device_dtype(model, s.device if s.device is not None else distributed_run.local_device(), s.dtype)
        readings = _sharded_readings(runner, data, probes, s.batch_size, progress)
        if readings is None:
            return None
    else:
        runner = _with_device_dtype(model, s.device, s.dtype)
        readings = ModelAdapter.of(runner).collect(data, probes, batch_size=s.batch_size, progress=progress, desc="fingerprint")
    return Fingerprint(
        features=readings[readout.key].contiguous(),
        normalized=readings[keys[1]].contiguous() if len(keys) > 1 else None,
        inputs=replace(described, digest=_digest(data)),  # after the pass: a count the memory guard refuses is refused after one batch
        model=ModelAdapter.of(runner).info,
        spec=spec.to_dict() if spec is not None else None,
        versions=_versions(),
    )


def _drawn_inputs(model: Any, s: FingerprintSettings, spec: Any) -> tuple[Inputs, InputRecord]:
    """The inputs of ``s`` for ``model``, and their record: what regenerate_inputs needs to draw them again (of the
    user's own tensor, only its digest, added after the pass)."""
    info = ModelAdapter.of(model).info
    inputs, vocab = s.inputs, s.vocab
    if isinstance(inputs, str):
        if inputs not in ("tokens", "embeddings"):  # text: a seeds null could not regenerate it from the record
            raise LensBiasError(f"inputs must be 'tokens', 'embeddings' or a tensor, got {inputs!r}")
        vocab = info.d_vocab if vocab is None or inputs == "embeddings" else vocab
        if vocab > info.d_vocab:
            raise LensBiasError(f"vocab={vocab} exceeds the model's d_vocab={info.d_vocab}")
    elif isinstance(inputs, (Tensor, RandomTokens, RandomEmbeddings)):
        vocab = info.d_vocab  # explicit token IDs are checked against the model's vocabulary
    else:
        raise WrongType(f"inputs must be 'tokens', 'embeddings', a tensor, RandomTokens or RandomEmbeddings, got {type(inputs).__name__}")
    std = s.embed_std if s.embed_std is not None else (spec.init_std if spec is not None else DEFAULT_EMBED_STD)
    data, given = resolve_inputs(inputs, model=model, d_vocab=vocab, n_sequences=s.n, seq_len=s.seq_len, seed=s.seed, embed_std=std)
    described = InputRecord(kind=given.kind, n=given.n, seq_len=given.seq_len)
    if isinstance(inputs, str):  # drawn: the record draws them again
        extra = {"mean": data.mean, "std": data.std} if isinstance(data, RandomEmbeddings) else {"vocab": vocab}
        described = replace(described, seed=given.seed, **extra)
    return data, described


def _sharded_readings(runner: Any, data: Inputs, probes: list[Any], batch_size: int | None, progress: bool) -> dict[str, Tensor] | None:
    """The probes' readings with the inputs sharded across the torchrun ranks: on rank 0, in input order; None elsewhere."""
    batch = batch_size or ModelAdapter.of(runner).default_batch_size(data.shape[1])
    keys, d_model = [p.key for p in probes], ModelAdapter.of(runner).info.d_model

    def extract(start: int, stop: int) -> Tensor:
        if start == stop:
            return torch.zeros(0, d_model * len(probes))
        shard = data.view(start, stop) if isinstance(data, (RandomTokens, RandomEmbeddings)) else data[start:stop]
        kept = ModelAdapter.of(runner).collect(shard, probes, batch_size=batch, progress=progress, desc="fingerprint")
        return torch.cat([kept[key] for key in keys], dim=1)

    gathered = distributed_run.run_sharded(extract, data.shape[0], batch)
    return None if gathered is None else dict(zip(keys, gathered.split(d_model, dim=1)))


def regenerate_inputs(base: Fingerprint) -> Inputs:
    """The exact inputs a fingerprint was made from, rebuilt from its record (checked against its digest)."""
    rec = base.inputs
    if rec.seed is None:
        raise LensBiasError("this fingerprint was made from your own input tensor, which it does not store; pass SeedsNull(fingerprints=...)")
    if rec.kind == "tokens":
        assert rec.vocab is not None  # a drawn token record holds its vocabulary
        data: Inputs = RandomTokens(rec.n, rec.seq_len, rec.vocab, rec.seed)
    else:
        assert rec.mean is not None and rec.std is not None  # a drawn embedding record holds its distribution
        data = RandomEmbeddings(rec.n, rec.seq_len, base.d, mean=rec.mean, std=rec.std, seed=rec.seed)
    if _digest(data) != rec.digest:
        raise LensBiasError("regenerated inputs do not match the fingerprint's digest (made by another lens_bias version?)")
    return data


def as_features(x: FeaturesLike, name: str, align: str | None = None) -> Float[Tensor, "n d"]:
    """The float32 CPU feature matrix of a :class:`Fingerprint` or an ``[N, D]`` array; NaN/inf are refused.

    With an ``align`` mode, a fingerprint's gain-free reading (``normalized``) where it has one: a reparametrised
    basis folds the final norm's gain into the next weights, so only that reading is related by the map.
    """
    if isinstance(x, Fingerprint):
        x = x.normalized if align is not None and x.normalized is not None else x.features
    elif isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    if isinstance(x, Tensor) and x.ndim == 2 and x.is_floating_point():
        # a NaN or inf anywhere makes its column's sum non-finite: one reduction, no [N, D] mask (finite sums that
        # overflow, of values near the float32 limit, are checked element by element)
        if not torch.isfinite(x.sum(dim=0)).all() and not torch.isfinite(x).all():
            raise LensBiasError(f"{name} holds NaN/inf features; fingerprint the model in float32 or bfloat16, or check its weights")
        return x.detach().float().cpu()
    raise WrongType(f"{name} must be a Fingerprint or a float [N, D] array/tensor, got {type(x).__name__}")


def check_compatible(a: FeaturesLike, b: FeaturesLike, fa: Tensor, fb: Tensor) -> None:
    """Refuse two feature matrices that do not come from the same inputs (shape, or the fingerprints' input records)."""
    if fa.shape[0] == fb.shape[0] and fa.shape[1:] != fb.shape[1:]:
        raise LensBiasError(f"different widths cannot share an init ({fa.shape[1]} vs {fb.shape[1]} features); SeedPrint compares models of one width")
    if fa.shape != fb.shape:
        raise LensBiasError(
            f"feature matrices must have the same shape (rows = the same inputs in the same order, same width); "
            f"got {tuple(fa.shape)} and {tuple(fb.shape)}"
        )
    if isinstance(a, Fingerprint) and isinstance(b, Fingerprint):
        keys = [f.name for f in fields(InputRecord) if f.name != "renamed"]  # renamed: the same inputs, renamed
        differ = [k for k in keys if getattr(a.inputs, k) != getattr(b.inputs, k)]
        if differ:
            detail = ", ".join(f"{k}: {getattr(a.inputs, k)!r} vs {getattr(b.inputs, k)!r}" for k in differ if k != "digest")
            raise LensBiasError(
                f"the fingerprints were made from different inputs ({detail or 'different input tensors'}); "
                "fingerprint both models with the same inputs, n, seq_len, seed and vocab (the smallest vocabulary)"
            )
