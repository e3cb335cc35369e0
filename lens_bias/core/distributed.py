"""Sharding a feature extraction across ``torch.distributed`` ranks (``torchrun --nproc_per_node K``).

Every rank runs whole batches of the same size as a single process would — rank r takes the r-th contiguous run
of batches — so each feature row is computed by the same kernels on the same batch shape, and rank 0 receives the
rows in input order. NCCL on GPUs (each rank on ``cuda:LOCAL_RANK``), gloo on CPU.
"""

from __future__ import annotations

import math
import os
from typing import Callable

import torch
from torch import Tensor

from lens_bias.core.errors import LensBiasError

__all__ = ["ensure_process_group", "shard_rows", "gather_rows", "local_device"]


def ensure_process_group() -> tuple[int, int]:
    """(rank, world size), starting the default process group from torchrun's environment if needed."""
    import torch.distributed as dist

    if not dist.is_available():
        raise LensBiasError("distributed=True needs a PyTorch build with torch.distributed")
    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            raise LensBiasError(
                "distributed=True runs under torchrun: `torchrun --nproc_per_node K your_script.py` (or call "
                "torch.distributed.init_process_group yourself first)"
            )
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def local_device() -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` with NCCL, else CPU."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


def shard_rows(n: int, batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """Rows [start, stop) of this rank: a contiguous run of whole batches (the last rank may get fewer or none).

    >>> [shard_rows(10, 3, r, 2) for r in range(2)]
    [(0, 6), (6, 10)]
    """
    per_rank = math.ceil(math.ceil(n / batch_size) / world) * batch_size
    return min(n, rank * per_rank), min(n, (rank + 1) * per_rank)


def gather_rows(rows: Tensor, n: int, batch_size: int, rank: int, world: int) -> Tensor | None:
    """Concatenate every rank's rows in rank order on rank 0 (``None`` elsewhere); each rank passes its shard."""
    import torch.distributed as dist

    device = local_device()
    width = rows.shape[1]
    shards = [shard_rows(n, batch_size, r, world) for r in range(world)]
    longest = max(stop - start for start, stop in shards)
    padded = torch.zeros(longest, width, dtype=rows.dtype, device=device)
    padded[: rows.shape[0]] = rows.to(device)
    bucket = [torch.empty_like(padded) for _ in range(world)] if rank == 0 else None
    dist.gather(padded, bucket, dst=0)
    if bucket is None:  # a rank other than 0: its shard was sent
        return None
    return torch.cat([b[: stop - start].cpu() for b, (start, stop) in zip(bucket, shards)])


def run_sharded(extract: Callable[[int, int], Tensor], n: int, batch_size: int) -> Tensor | None:
    """``extract(start, stop) -> [rows, D]`` on this rank's shard, gathered on rank 0 in input order."""
    rank, world = ensure_process_group()
    start, stop = shard_rows(n, batch_size, rank, world)
    rows = extract(start, stop)
    return gather_rows(rows, n, batch_size, rank, world)
