"""A small, deterministic language-model trainer for TransformerLens models built by lens_bias.

AdamW with warmup and a cosine (or constant) schedule, gradient clipping, and a data order that depends only
on ``data_seed`` — models with different init seeds see identical batches, as in the SeedPrints experiments.
Interventions from ``lens_bias.hooks`` can stay attached during training. Unlike the analyses, training changes
the model you pass: that is its purpose.
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence, Union

import pandas as pd
import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from lens_bias.core import memory
from lens_bias.core.adapter import ModelAdapter, one_adapter_per_call
from lens_bias.core.corpora import code
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import with_bos
from lens_bias.core.probes import on_device
from lens_bias.core.serialise import Serialisable
from lens_bias.core.settings import overridden
from lens_bias.hooks.base import Intervention, intervene
from lens_bias.models.checkpoints import save_checkpoint
from lens_bias.models.init import REGIME
from lens_bias.models.parameters import copy_model
from lens_bias.training.data import TokenData

__all__ = ["train", "TrainSettings", "fine_tune", "TrainingRun", "batch_order", "evaluate"]

logger = logging.getLogger(__name__)


@dataclass
class TrainingRun:
    """What a training run did: the loss curve, the held-out loss, and where checkpoints went."""

    losses: pd.DataFrame  # step, loss, lr
    evals: pd.DataFrame  # step, eval_loss
    checkpoints: list[Path] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    def to_pandas(self) -> pd.DataFrame:
        return self.losses.merge(self.evals, on="step", how="left")

    @property
    def final_eval_loss(self) -> float:
        return float(self.evals.eval_loss.iloc[-1])


def batches(n_blocks: int, batch_size: int, data_seed: int) -> Iterator[Int[Tensor, "batch"]]:
    """Block indices of one batch after another: epochs of permutations from ``data_seed`` alone, drawn as they are
    used (the memory of a run does not grow with its steps)."""
    generator = torch.Generator().manual_seed(data_seed)
    epoch, used = torch.randperm(n_blocks, generator=generator), 0
    while True:
        parts, wanted = [], batch_size
        while wanted:
            if used == n_blocks:
                epoch, used = torch.randperm(n_blocks, generator=generator), 0
            take = min(wanted, n_blocks - used)
            parts.append(epoch[used : used + take])
            used, wanted = used + take, wanted - take
        yield torch.cat(parts)


def batch_order(n_blocks: int, steps: int, batch_size: int, data_seed: int) -> Int[Tensor, "steps batch"]:
    """Block indices of every batch ``[steps, batch_size]``, as :func:`train` draws them (:func:`batches`)."""
    order = batches(n_blocks, batch_size, data_seed)
    return torch.stack([next(order) for _ in range(steps)])


def _lr(step: int, steps: int, lr: float, warmup: int, schedule: str) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    progress = (step - warmup) / max(1, steps - warmup)
    return lr * 0.5 * (1 + math.cos(math.pi * progress))


SYNC_EVERY = 50
"""Steps between reads of the loss on the host: a read waits for the device to finish, so it is not made every step."""


def _on_device(data: TokenData, order: Iterator[Tensor], bos: int | None, device: torch.device) -> Iterator[Tensor]:
    """The batches of ``order`` on ``device``, one ahead: the next batch is gathered and its copy queued (from pinned
    memory, without waiting, on CUDA) before the current one is handed out, so the device never waits for the host."""
    cuda = device.type == "cuda"

    def gather() -> Tensor:
        batch = with_bos(data.train[next(order)], bos)
        return batch.pin_memory().to(device, non_blocking=True) if cuda else on_device(batch, device)

    ahead = gather()
    while True:
        current, ahead = ahead, gather()
        yield current


def _loss(model: Any, blocks: torch.Tensor) -> torch.Tensor:
    logits = model(blocks[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), blocks[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model: Any, blocks: torch.Tensor, batch_size: int = 32, device: Any = None, bos: int | None = None) -> float:
    """Mean next-token cross-entropy (nats) over ``blocks`` (first tokens replaced by ``bos`` when given)."""
    total = torch.zeros((), dtype=torch.float64, device=device)  # summed on the device, read once
    for start in range(0, len(blocks), batch_size):
        batch = on_device(with_bos(blocks[start : start + batch_size], bos), torch.device(device or "cpu"))
        total += _loss(model, batch).double() * len(batch)
    return total.item() / len(blocks)


@dataclass(frozen=True)
class TrainSettings(Serialisable):
    """How :func:`train` trains: the optimiser, its schedule, the data order and the evaluations.

    >>> TrainSettings(steps=100).warmup_steps
    10
    """

    steps: int = 400  # optimizer steps
    batch_size: int = 32  # sequences per step
    lr: float = 3e-4  # peak learning rate (AdamW, betas 0.9 / 0.95, as the small-LM recipes use)
    weight_decay: float = 0.1  # AdamW weight decay on matrices (not on norms and biases)
    warmup: int | None = None  # linear warmup steps (None: 10% of steps, at most 200)
    schedule: str = "cosine"  # "cosine" (to zero) or "constant" after warmup
    grad_clip: float = 1.0  # max global gradient norm: keeps small-batch runs from diverging
    data_seed: int = 42  # the only source of the data order: models of different init seeds see identical batches
    eval_every: int | None = None  # steps between held-out evaluations (None: 4 per run); always at the end
    eval_blocks: int = 128  # held-out blocks per evaluation
    # a token ID that replaces every block's first token (GPT-2's <|endoftext|> role): sinks form on such a token
    bos: int | None = None
    dtype: torch.dtype | None = None  # autocast dtype on CUDA (e.g. torch.bfloat16); ignored on CPU

    @property
    def warmup_steps(self) -> int:
        return min(200, self.steps // 10) if self.warmup is None else self.warmup

    def check(self) -> None:
        """Refuse settings no run can use."""
        for name, value in (("steps", self.steps), ("batch_size", self.batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LensBiasError(f"{name} must be a positive int, got {value!r}")
        if self.schedule not in ("cosine", "constant"):
            raise LensBiasError(f"schedule must be 'cosine' or 'constant', got {self.schedule!r}")


@one_adapter_per_call
def train(
    model: Any,
    data: TokenData,
    settings: TrainSettings | None = None,
    *,
    interventions: Sequence[Intervention] = (),
    checkpoint_every: int | None = None,
    checkpoint_dir: Union[str, Path, None] = None,
    progress: bool = True,
    **overrides: Any,
) -> TrainingRun:
    """Train ``model`` in place on ``data`` (next-token prediction) and return the run's record.

    On a GPU nothing waits for the host: the next batch is copied while this one runs, AdamW is fused, and the losses
    are read every :data:`SYNC_EVERY` steps (and at evaluations and checkpoints), not every step.

    Args:
        model: a TransformerLens model whose vocabulary covers ``data``'s tokenizer.
        data: packed token blocks (``TokenData.build``); sequences are ``data.seq_len`` tokens.
        settings: :class:`TrainSettings`.
        interventions: lens_bias.hooks interventions attached for the whole run; parameters they own (e.g.
            ``HeadwiseRMSNorm``'s gains) are trained with the model's.
        checkpoint_every: save a checkpoint every this many steps (and at step 0) into ``checkpoint_dir``.
        checkpoint_dir: folder for checkpoints.
        progress: a progress bar over steps.
        **overrides: fields of :class:`TrainSettings` (``steps=40, lr=3e-3``), which replace those of ``settings``.

    Returns:
        A :class:`TrainingRun`.
    """
    s = overridden(TrainSettings, settings, overrides, "train()")
    s.check()
    folder = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if checkpoint_every and folder is None:  # before the first step
        raise LensBiasError("checkpoint_every needs checkpoint_dir")
    adapter = ModelAdapter.of(model)
    _check_fits(model, adapter, data, s)
    eval_every = s.eval_every or max(1, s.steps // 4)
    device = adapter.device
    params = [p for p in model.parameters() if p.requires_grad] + [p for iv in interventions for p in iv.parameters(model)]
    optimizer = _optimizer(params, s, device)
    order = _on_device(data, batches(len(data.train), s.batch_size, s.data_seed), s.bos, device)
    held_out = data.eval[:s.eval_blocks]
    autocast = torch.autocast("cuda", dtype=s.dtype) if s.dtype is not None and device.type == "cuda" else nullcontext()
    book, evals, checkpoints = _Losses(s.lr), [], []
    model.train()
    try:
        with intervene(model, *interventions):
            if checkpoint_every:
                checkpoints.append(_checkpoint(model, folder, 0))
            for step in tqdm(range(s.steps), desc="train", disable=not progress, leave=False):
                rate = _lr(step, s.steps, s.lr, s.warmup_steps, s.schedule)
                for group in optimizer.param_groups:
                    group["lr"] = rate
                with autocast:
                    loss = _loss(model, next(order))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, s.grad_clip)
                optimizer.step()
                setattr(model, REGIME, "trained")  # what analyze reports it as, and checkpoints record
                book.add(step + 1, loss, rate)
                done, evaluated = step + 1 == s.steps, (step + 1) % eval_every == 0
                saved = bool(checkpoint_every) and (step + 1) % checkpoint_every == 0
                if (step + 1) % SYNC_EVERY == 0 or evaluated or done or saved:
                    book.read()
                if evaluated or done:
                    model.eval()
                    with autocast:
                        evals.append({"step": step + 1, "eval_loss": evaluate(model, held_out, device=device, bos=s.bos)})
                    model.train()
                if saved:
                    checkpoints.append(_checkpoint(model, folder, step + 1))
    finally:  # after an error or a KeyboardInterrupt too: eval mode is back, and intervene's scope removed the hooks
        model.eval()
    config = {**{k: v for k, v in s.to_dict().items() if k not in ("eval_every", "eval_blocks", "dtype")}, "warmup": s.warmup_steps,
              "corpus": data.corpus_name, "seq_len": data.seq_len, "interventions": [iv.to_dict() for iv in interventions]}
    return TrainingRun(pd.DataFrame(book.rows), pd.DataFrame(evals), checkpoints, config)


def _checkpoint(model: Any, folder: Path | None, step: int) -> Path:
    if folder is None:
        raise LensBiasError("checkpoint_every needs checkpoint_dir")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step{step:06d}.pt"
    save_checkpoint(model, path, step=step)
    return path


def _check_fits(model: Any, adapter: ModelAdapter, data: TokenData, s: TrainSettings) -> None:
    """Refuse data the model cannot read, and a run whose memory cannot fit, before the first step."""
    if data.vocab_size > adapter.info.d_vocab:
        raise LensBiasError(f"the tokenizer has {data.vocab_size} tokens but the model's d_vocab is {adapter.info.d_vocab}")
    if data.seq_len > adapter.info.n_ctx:
        raise LensBiasError(f"blocks of {data.seq_len} tokens exceed the model's n_ctx={adapter.info.n_ctx}")
    act_dtype = s.dtype if s.dtype is not None and adapter.device.type == "cuda" else adapter.dtype
    n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    memory.check_train(adapter.info, batch_size=s.batch_size, seq_len=data.seq_len, n_params=n_params, device=adapter.device, act_dtype=act_dtype)


def _optimizer(params: list[torch.nn.Parameter], s: TrainSettings, device: torch.device) -> torch.optim.Optimizer:
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": s.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # On CUDA the fused AdamW kernel: one launch for every parameter instead of several per tensor
    return torch.optim.AdamW(groups, lr=s.lr, betas=(0.9, 0.95), fused=device.type == "cuda")


class _Losses:
    """The loss of every step, kept on the device and brought to the host a stretch at a time (a read waits for the
    device to finish)."""

    def __init__(self, lr: float):
        self.lr = lr
        self.rows: list[dict[str, float]] = []
        self.pending: list[Tensor] = []

    def add(self, step: int, loss: Tensor, rate: float) -> None:
        self.pending.append(loss.detach())
        self.rows.append({"step": step, "loss": math.nan, "lr": rate})

    def read(self) -> None:
        """Bring the stretch's losses to the host in one read; stop at a non-finite one."""
        values = torch.stack(self.pending).tolist()
        first = len(self.rows) - len(values)
        for i, value in enumerate(values):
            self.rows[first + i]["loss"] = value
            if not math.isfinite(value):
                raise LensBiasError(
                    f"the training loss is {value} at step {first + i + 1} (losses are read every {SYNC_EVERY} steps, so the weights were "
                    f"updated {len(values) - i} more times; reload a checkpoint): the weights or activations overflowed; lower lr (now {self.lr}), "
                    "keep grad_clip, or train in float32 / bfloat16 rather than float16"
                )
        self.pending.clear()


def fine_tune(
    model: Any,
    steps: int = 40,
    *,
    data: TokenData | None = None,
    lr: float = 1e-4,
    batch_size: int = 4,
    seq_len: int = 64,
    weight_decay: float = 0.0,
    data_seed: int = 42,
    eval_blocks: int = 16,
    progress: bool = True,
) -> tuple[Any, TrainingRun]:
    """A short full fine-tune of a copy of ``model`` on the standard library's code (:func:`lens_bias.core.corpora.code`).

    Args:
        model: a TransformerLens model with ``model.tokenizer`` (e.g. from ``lens_bias.models.pretrained``); not
            modified.
        steps: optimizer steps (AdamW, 10% warmup, cosine).
        data: packed blocks to train on instead (default: the code corpus packed with ``model.tokenizer``,
            ``seq_len`` tokens per block; the held-out split is never trained on).
        lr: peak learning rate; a fine-tune's, well below pretraining's.
        batch_size: sequences per step.
        seq_len: tokens per training sequence when ``data`` is built here.
        weight_decay: AdamW weight decay on matrices.
        data_seed: the data order.
        eval_blocks: held-out blocks of the one evaluation at the end.
        progress: a progress bar over steps.

    Returns:
        ``(fine-tuned copy, its TrainingRun)``. On a TL 3 HookedTransformer a tied ``W_U`` trains as its own
        parameter, so the copy's embedding and unembedding drift apart by the fine-tune's updates.
    """
    if data is None:
        tokenizer = getattr(model, "tokenizer", None)
        if tokenizer is None:
            raise LensBiasError("fine_tune packs the code corpus with model.tokenizer, and this model has none: set model.tokenizer, or pass data=TokenData.build(...)")
        data = TokenData.build(code(), seq_len=seq_len, tokenizer_from=tokenizer)
    tuned = copy_model(model)
    run = train(tuned, data, steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay, data_seed=data_seed, eval_every=steps, eval_blocks=eval_blocks, progress=progress)
    return tuned, run
