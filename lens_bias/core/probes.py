"""What a forward pass reads: a :class:`Probe` is a hook name and a reduction applied inside the hook, and says how
batches add up (``combine``); hook functions and their roles; moving small tensors to where an activation is.

Probes with one key are computed once (two analyses asking for the same reduction share it), so a key names one
reduction, and two probes with one key and different functions are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

import torch
from torch import Tensor

from lens_bias.core.errors import LensBiasError, WrongType
from lens_bias.core.stats import unit

__all__ = ["Probe", "COMBINES", "HookFn", "FwdHook", "ROLE_ATTRIBUTE", "READS", "last_position", "last_unit_sum", "counting", "on_device"]

HookFn = Callable[..., Union[Tensor, None]]  # TransformerLens hook signature: fn(activation, hook) -> tensor | None
FwdHook = tuple[str, HookFn]

# What a hook function does with its activation, for the composition check (lens_bias.hooks.base) and the check
# that edits act.
ROLE_ATTRIBUTE = "_lens_bias_role"
READS = "reads"
"""The role of a hook function that only reads its activation: it need not reach the output, so
:meth:`lens_bias.core.adapter.ModelAdapter.check_edits_act` does not check it."""


COMBINES = ("rows", "sum", "max", "first")


@dataclass(frozen=True)
class Probe:
    """Read one hook point: ``fn`` reduces the activation ``[batch, ...]`` to what is kept.

    ``combine`` says how batches add up: ``"rows"`` keeps one row per sequence (``fn`` returns ``[batch, ...]``,
    the pass returns ``[n, ...]``: memory grows with n); ``"sum"`` and ``"max"`` fold each batch into one running
    total (``fn`` returns the batch's sum or max ``[...]``, the pass returns the total over every sequence, summed
    in float64; memory flat in n); ``"first"`` keeps the first batch's rows only (a bounded sample).

    Probes with the same ``key`` are computed once, so two analyses asking for the same reduction share it; a key
    therefore names one reduction, and two probes with one key and different functions are refused.
    """

    hook: str
    reduction: str  # a name for what fn keeps, e.g. "last"; part of the key
    fn: Callable[[Tensor], Tensor]
    combine: str = "rows"

    def __post_init__(self) -> None:
        if self.combine not in COMBINES:
            raise LensBiasError(f"Probe combine must be one of {COMBINES}, got {self.combine!r}")

    @property
    def key(self) -> str:
        return f"{self.hook}:{self.reduction}"


def _same_reduction(f: Callable[..., Any], g: Callable[..., Any]) -> bool:
    """One function, or closures of one definition over equal values (two ``last_position(hook)`` probes)."""
    if f is g:
        return True
    code = getattr(f, "__code__", None)
    if code is None or code is not getattr(g, "__code__", None):
        return False
    try:
        cells_f, cells_g = (tuple(c.cell_contents for c in h.__closure__ or ()) for h in (f, g))
        same_cells = len(cells_f) == len(cells_g) and all(
            _same_reduction(a, b) if callable(a) and callable(b) and hasattr(a, "__code__") else a == b for a, b in zip(cells_f, cells_g)
        )
        return bool(f.__defaults__ == g.__defaults__ and same_cells)
    except (RuntimeError, TypeError, ValueError):  # values without a plain ==, e.g. tensors: not provably equal
        return False


def unique_probes(probes: Sequence[Probe]) -> dict[str, Probe]:
    """The probes by key, each computed once; two probes with one key and different reductions are refused."""
    unique: dict[str, Probe] = {}
    for probe in probes:
        kept = unique.setdefault(probe.key, probe)
        if kept.combine != probe.combine or not _same_reduction(kept.fn, probe.fn):
            raise LensBiasError(
                f"two probes share the key {probe.key!r} but reduce differently "
                f"({getattr(kept.fn, '__qualname__', kept.fn)!r} combined by {kept.combine!r}, "
                f"{getattr(probe.fn, '__qualname__', probe.fn)!r} by {probe.combine!r}); "
                "only one would be computed: give one of them another reduction name"
            )
    return unique


def counting(name: str, fn: HookFn, fired: set[str]) -> HookFn:
    """``fn`` as a hook that adds ``name`` to ``fired`` whenever it runs: how lens_bias tells an edit that never fired."""

    def hook_fn(activation: Tensor, hook: Any) -> Union[Tensor, None]:
        fired.add(name)
        return fn(activation, hook)

    return hook_fn


def check_hooks(hooks: Sequence[Any]) -> list[FwdHook]:
    """``hooks`` as a list of ``(hook_name, fn)`` pairs; anything else is refused."""
    pairs = list(hooks)
    for item in pairs:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str) and callable(item[1])):
            raise WrongType(
                f"hooks are (hook_name, fn) pairs, got {type(item).__name__}; for interventions pass "
                "lens_bias.hooks.edit_hooks(model, interventions)"
            )
    return pairs


def last_position(hook: str) -> Probe:
    """A probe that keeps the last position of ``hook``: ``[batch, pos, d] -> [batch, d]``."""
    return Probe(hook, "last", lambda x: x[:, -1])


def last_unit_sum(hook: str) -> Probe:
    """A probe that sums the unit vectors of the last position over every sequence: ``[batch, pos, d] -> [d]``.

    The mean direction, and through ``‖Σ u‖² − n`` the mean pairwise cosine, without a row per sequence.
    """
    return Probe(hook, "last_unit_sum", lambda x: unit(x[:, -1]).sum(dim=0), combine="sum")


def on_device(value: Tensor, device: torch.device, dtype: torch.dtype | None = None) -> Tensor:
    """``value`` on ``device`` (and in ``dtype``), copied only where it is elsewhere: hooks move their small constant
    tensors (indices, values) to the activation's device this way, never bringing anything back to the host."""
    if value.device == device and (dtype is None or value.dtype == dtype):
        return value
    return value.to(device=device, dtype=dtype)
