"""Timing shared by the benchmark scripts: median wall time after one warm-up, synchronised on CUDA."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def timed(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
