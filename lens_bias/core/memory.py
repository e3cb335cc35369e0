"""How much memory a pass needs, how much the device has, and the guard that sizes batches from the two.

Every lens_bias pass goes through :meth:`lens_bias.core.adapter.ModelAdapter.collect`, which asks :func:`plan_batch` for its
batch size: the estimated peak of one sequence (:func:`forward_bytes`) against :func:`available_bytes`. When even
one sequence does not fit, the pass is refused before it starts, with the estimate, the limit and the longest
sequence that fits, instead of running until the kernel kills the process. :func:`train_bytes` does the same for
a training step (activations kept for the backward pass, gradients and AdamW state).

The estimate counts the tensors that are alive at once at the peak of an eager forward pass under
``torch.inference_mode``: the residual stream and the layer's inputs and outputs, the MLP hidden state, the
attention scores and pattern ``[heads, T, T]`` (materialised whether or not a probe reads them), and the logits
``[T, d_vocab]`` when the pass runs through the unembedding. The constants were measured against the peak
resident memory of real passes on TL 3 and TL 4 (``benchmarks/bench_memory.py`` prints estimate vs measurement).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any, Union

import torch

from lens_bias.core.errors import LensBiasError

__all__ = ["check_held", "available_bytes", "forward_bytes", "train_bytes", "plan_batch", "check_train", "check_device", "format_bytes", "MEMORY_FRACTION",
           "release_freed", "return_freed_memory"]

logger = logging.getLogger(__name__)

# Share of the available memory a pass may plan for: the rest is headroom for the allocator, the kept results
# and whatever else the process holds.
MEMORY_FRACTION = 0.5
# Tokens per batch beyond which bigger batches stop paying off on a CPU (and the old fixed default).
MAX_TOKENS_PER_BATCH = 2**15

# Tensors alive at the peak, in units of one activation of that shape, per model family (fitted to the peak
# resident memory of passes on CPU; see the module docstring). TL 3's attention keeps one more pattern-sized
# tensor (the NaN mask after the softmax); on TL 4 bridges the allocator reuses only part of the attention's
# memory for the MLP ("overlap": the share of the smaller of the two peaks that adds to the larger).
_COPIES = {
    "bridge": {"pattern": 3.0, "resid": 11.5, "mlp": 3.0, "overlap": 0.5},
    "hooked": {"pattern": 4.25, "resid": 14.0, "mlp": 4.3, "overlap": 0.0},
}
_LOGIT_COPIES = 2.0  # logits, and their float32 copy or soft-capped version


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_held(what: str, count: int, per_item: int, fix: str, each: str) -> None:
    """Refuse, in one line, to hold ``count`` items of ``per_item`` bytes in CPU memory when they cannot fit.

    ``fix`` names the count to lower (the message gives the largest that fits); ``each``, what makes one item large,
    for when not even one fits.
    """
    budget = MEMORY_FRACTION * available_bytes("cpu")
    if count * per_item > budget:
        fits = int(budget // per_item)
        advice = f"pass {fix} <= {fits}" if fits >= 1 else f"not even one fits: lower {each}"
        raise LensBiasError(
            f"{what} would hold about {format_bytes(count * per_item)} ({count} × {format_bytes(per_item)}) but only "
            f"{format_bytes(budget)} of CPU memory can be used; {advice}"
        )


def check_device(device: Union[str, torch.device, None]) -> torch.device:
    """``device`` as a ``torch.device``, or a :class:`LensBiasError` saying why it cannot be used here."""
    try:
        dev = torch.device("cpu" if device is None else device)
    except (RuntimeError, TypeError) as err:
        raise LensBiasError(f"{device!r} is not a torch device ({err}); use e.g. 'cpu', 'cuda' or 'cuda:1'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise LensBiasError(
                f"device {device!r} was requested but CUDA is not available "
                f"(torch {torch.__version__}, built {'with' if torch.backends.cuda.is_built() else 'without'} CUDA); "
                "use --device cpu, or install a CUDA build of torch on a machine with a GPU"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise LensBiasError(f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type == "meta":  # shapes without data: every pass lens_bias runs reads real values
        raise LensBiasError(f"device {device!r} holds no data, and lens_bias runs real forward passes; use --device cpu or cuda")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise LensBiasError(f"device {device!r} was requested but MPS is not available; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        backend = getattr(torch, dev.type, None)
        if backend is None or not getattr(backend, "is_available", lambda: False)():
            raise LensBiasError(f"device {device!r} is not available in this torch build; use --device cpu")
    return dev


def _cgroup_available() -> int | None:
    """Bytes left under this process's cgroup memory limit (containers), if it has one."""
    for limit_file, usage_file in (("memory.max", "memory.current"), ("memory.limit_in_bytes", "memory.usage_in_bytes")):
        for root in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/memory")):
            try:
                limit = (root / limit_file).read_text().strip()
                usage = int((root / usage_file).read_text().strip())
            except (OSError, ValueError):
                continue
            if limit == "max" or int(limit) >= 2**60:
                return None
            return max(0, int(limit) - usage)
    return None


def _host_available() -> int:
    """The machine's available memory: MemAvailable from /proc/meminfo, else free pages."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30  # no way to ask (e.g. macOS without /proc): assume a laptop's worth


def available_bytes(device: Union[str, torch.device, None] = None) -> int:
    """Free memory a pass on ``device`` can use: ``torch.cuda.mem_get_info`` on CUDA, the machine's available
    memory (the tighter of MemAvailable and a container's cgroup limit) on CPU."""
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda":
        free, _total = torch.cuda.mem_get_info(dev)
        return int(free)
    if dev.type != "cpu":  # mps and others report no free memory: plan as on the host, which shares it
        return _host_available()
    cgroup = _cgroup_available()
    host = _host_available()
    return host if cgroup is None else min(host, cgroup)


def forward_bytes(
    *, seq_len: int, d_model: int, n_heads: int, d_mlp: int | None, d_vocab: int, dtype: torch.dtype = torch.float32,
    logits: bool = False, gated_mlp: bool = False, family: str = "bridge",
) -> int:
    """Estimated peak bytes one sequence adds to an eager, inference-mode forward pass.

    >>> forward_bytes(seq_len=1024, d_model=256, n_heads=8, d_mlp=1024, d_vocab=8000) // 2**20  # MiB
    113

    Args:
        seq_len: tokens in the sequence.
        d_model: the model's width.
        n_heads: its number of attention heads.
        d_mlp: its MLP width (None for attention-only models).
        d_vocab: its vocabulary size.
        dtype: the activations' dtype (attention softmax and logits are counted in float32 where TL upcasts).
        logits: the pass runs through the unembedding (no probe stops it earlier).
        gated_mlp: the MLP keeps a gate activation too.
        family: "bridge" (TL 4 ``TransformerBridge``) or "hooked" (TL 3 ``HookedTransformer``), as in ModelInfo.
    """
    c = _COPIES["hooked" if family == "hooked" else "bridge"]
    size = torch.empty(0, dtype=dtype).element_size()
    t = seq_len
    pattern = c["pattern"] * n_heads * t * t * max(size, 4)  # the softmax runs in float32 on both TL versions
    resid = c["resid"] * t * d_model * size
    mlp = (c["mlp"] + (1 if gated_mlp else 0)) * t * (d_mlp or 0) * size
    out = _LOGIT_COPIES * t * d_vocab * max(size, 4) if logits else 0.0
    return int(resid + max(pattern, mlp) + c["overlap"] * min(pattern, mlp) + out)


def _describe(info: Any) -> dict[str, Any]:
    return dict(d_model=info.d_model, n_heads=info.n_heads, d_mlp=info.d_mlp, d_vocab=info.d_vocab, gated_mlp=info.gated_mlp, family=info.family)


def _longest_fitting(info: Any, dtype: torch.dtype, logits: bool, budget: float) -> int:
    """The longest sequence whose one-sequence estimate fits ``budget`` (0 when none does)."""
    lo, hi = 0, max(1, int(info.n_ctx))
    if forward_bytes(seq_len=hi, dtype=dtype, logits=logits, **_describe(info)) <= budget:
        return hi
    while lo < hi - 1:
        mid = (lo + hi) // 2
        if forward_bytes(seq_len=mid, dtype=dtype, logits=logits, **_describe(info)) <= budget:
            lo = mid
        else:
            hi = mid
    return lo


def plan_batch(
    info: Any, *, n: int, seq_len: int, dtype: torch.dtype, device: Union[str, torch.device], logits: bool = False,
    batch_size: int | None = None, what: str = "this pass", available: int | None = None,
) -> int:
    """The batch size of a forward pass: ``batch_size`` checked, or the largest that fits (at most ``n``).

    Raises :class:`LensBiasError` with the estimate, the limit, and the largest ``seq_len`` / ``batch_size``
    that fits when the pass would not fit in ``MEMORY_FRACTION`` of :func:`available_bytes`.

    Args:
        info: the model's :class:`~lens_bias.core.model_facts.ModelInfo` (widths and ``n_ctx``).
        n: sequences in the pass.
        seq_len: tokens per sequence.
        dtype: the model's dtype.
        device: the model's device.
        logits: the pass computes the unembedding.
        batch_size: the caller's choice (None: pick one).
        what: names the pass in the error.
        available: bytes to plan against (default: :func:`available_bytes` of ``device``).
    """
    free = available_bytes(device) if available is None else available
    budget = MEMORY_FRACTION * free
    per_seq = forward_bytes(seq_len=seq_len, dtype=dtype, logits=logits, **_describe(info))
    where = f"{torch.device(device).type} memory"
    if per_seq > budget:
        longest = _longest_fitting(info, dtype, logits, budget)
        fix = f"pass seq_len <= {longest}" if longest >= 1 else "use a machine with more memory or a smaller model"
        raise LensBiasError(
            f"{what} needs about {format_bytes(per_seq)} for one sequence of {seq_len} tokens but only "
            f"{format_bytes(budget)} of {where} can be used ({MEMORY_FRACTION:.0%} of {format_bytes(free)} available); {fix}"
        )
    fits = int(budget // per_seq)
    if batch_size is not None:
        if batch_size > fits and min(batch_size, n) > fits:
            raise LensBiasError(
                f"{what} with batch_size={batch_size} needs about {format_bytes(per_seq * min(batch_size, n))} but only "
                f"{format_bytes(budget)} of {where} can be used ({MEMORY_FRACTION:.0%} of {format_bytes(free)} available); "
                f"pass batch_size <= {fits} (or leave it unset)"
            )
        return batch_size
    return max(1, min(n, fits, MAX_TOKENS_PER_BATCH // seq_len))


def train_bytes(
    info: Any, *, batch_size: int, seq_len: int, n_params: int, param_dtype: torch.dtype = torch.float32,
    act_dtype: torch.dtype = torch.float32, extra_params: int = 0,
) -> int:
    """Estimated peak bytes of one training step: weights' gradients and AdamW's two moments, plus the
    activations every layer keeps for the backward pass and the logits with their gradient."""
    psize = torch.empty(0, dtype=param_dtype).element_size()
    state = 3 * (n_params + extra_params) * psize  # grad, exp_avg, exp_avg_sq
    per_layer = forward_bytes(seq_len=seq_len, dtype=act_dtype, **_describe(info))
    logits = 3 * seq_len * info.d_vocab * 4  # logits, their float32 copy for the loss, and its gradient
    return int(state + batch_size * (info.n_layers * per_layer + logits))


def check_train(info: Any, *, batch_size: int, seq_len: int, n_params: int, device: Union[str, torch.device], act_dtype: torch.dtype) -> None:
    """Refuse a training run whose step would not fit in memory, naming the largest batch size that fits."""
    free = available_bytes(device)
    budget = MEMORY_FRACTION * free
    need = train_bytes(info, batch_size=batch_size, seq_len=seq_len, n_params=n_params, act_dtype=act_dtype)
    if need <= budget:
        return
    one = train_bytes(info, batch_size=1, seq_len=seq_len, n_params=n_params, act_dtype=act_dtype)
    per_seq = max(1, train_bytes(info, batch_size=2, seq_len=seq_len, n_params=n_params, act_dtype=act_dtype) - one)
    fits = int((budget - (one - per_seq)) // per_seq)
    fix = f"pass batch_size <= {fits}" if fits >= 1 else "use shorter sequences (seq_len), a smaller model, or a machine with more memory"
    raise LensBiasError(
        f"a training step with batch_size={batch_size} and seq_len={seq_len} needs about {format_bytes(need)} but only "
        f"{format_bytes(budget)} of {torch.device(device).type} memory can be used ({MEMORY_FRACTION:.0%} of "
        f"{format_bytes(free)} available); {fix}"
    )


# glibc's mallopt parameter, and its initial value: fixing the threshold also turns its dynamic raising off
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 128 * 1024


@functools.lru_cache(maxsize=1)
def _glibc() -> Any:
    """The C library when it is glibc (it has ``malloc_trim`` and ``mallopt``), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc_trim, libc.mallopt  # noqa: B018  (musl and others have neither)
    except (OSError, AttributeError, TypeError):
        return None
    return libc


def release_freed() -> None:
    """Give the pages of freed heap memory back to the system (glibc ``malloc_trim(0)``; nothing elsewhere).

    A pass frees each batch's activations, but glibc serves them from the heap once large frees have raised its
    dynamic mmap threshold, and the small values kept between them pin the heap: without this, the resident memory
    of a long pass grew with its batches, by up to 4.6 GB over 100 batches in 2 runs of 3 (analyze, N 20,000). Called
    after every batch; it costs well under a millisecond.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def return_freed_memory() -> bool:
    """Make glibc serve every allocation above 128 KiB with its own mapping, returned to the system when freed (a
    process-wide malloc setting, ``mallopt(M_MMAP_THRESHOLD, 128 KiB)``): what an offloaded model needs, whose
    layers' weights are allocated and freed inside each forward. Returns whether it was set (glibc only)."""
    libc = _glibc()
    done = libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD))
    if done:
        logger.info("glibc mmap threshold fixed at %d bytes: freed weights and activations go back to the system", _MMAP_THRESHOLD)
    return done
