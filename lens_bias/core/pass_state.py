"""What one batched pass keeps, batch by batch, where the activations are: the probes' rows and running totals
(:class:`Kept`), and whether any probed activation held a NaN or an inf (:class:`FiniteCheck`), read once after the
pass so the device is never stopped per batch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping

import torch
from torch import Tensor

from lens_bias.core import memory
from lens_bias.core.errors import LensBiasError, NonFinite
from lens_bias.core.probes import HookFn, Probe, on_device

__all__ = ["Kept", "FiniteCheck", "Reading", "StopForward", "own"]

class StopForward(Exception):
    """Raised inside the last probe hook to end a forward pass whose remaining layers nobody reads."""


def _nonfinite(activation: Tensor, hook_name: str) -> Tensor:
    """A 0-dim bool tensor: does ``activation`` hold a NaN or an inf? (no device sync; read once per batch)"""
    if not activation.is_floating_point():
        return torch.zeros((), dtype=torch.bool, device=activation.device)
    if hook_name.endswith("hook_attn_scores"):  # the causal mask writes -inf there on purpose
        return torch.isnan(activation).any() | torch.isposinf(activation).any()
    return ~torch.isfinite(activation).all()


class FiniteCheck:
    """Whether each probed activation held a NaN or an inf, as flags left on the device batch by batch and read once,
    after the pass (a read per batch would stop the device there): the first one found is named."""

    def __init__(self) -> None:
        self.current: list[tuple[str, Tensor]] = []
        self.batches: list[tuple[int, int, list[str], Tensor]] = []  # (start, stop, hooks in firing order, their flags)

    def flag(self, hook_name: str, activation: Tensor) -> None:
        self.current.append((hook_name, _nonfinite(activation, hook_name)))

    def end_batch(self, start: int, stop: int) -> None:
        if self.current:
            device = self.current[0][1].device  # a model split over devices flags each layer where it runs
            self.batches.append((start, stop, [h for h, _ in self.current], torch.stack([on_device(f, device) for _, f in self.current])))
        self.current = []

    def raise_first(self, dtype: str) -> None:
        if not self.batches:
            return
        flags = torch.cat([on_device(f, self.batches[0][3].device) for *_, f in self.batches]).cpu()
        if not flags.any():
            return
        first = int(flags.nonzero()[0])
        for start, stop, hooks, batch in self.batches:
            if first < len(hooks):
                cause = (
                    f"{dtype} overflowed: run the model in bfloat16 or float32" if dtype == "float16"
                    else "the weights or an intervention produced it: check the checkpoint (torch.isfinite on its parameters) and the edits"
                )
                raise NonFinite(f"NaN/inf first appeared at hook {hooks[first]} (sequences {start}-{stop - 1}) with finite inputs; {cause}")
            first -= len(hooks)


def own(value: Tensor) -> Tensor:
    """``value`` in storage of its own: a probe's view (e.g. the last position of ``[batch, pos, d]``) would keep the
    whole batch's activation alive, and memory would grow with the number of batches."""
    return value.clone() if value.untyped_storage().nbytes() > value.numel() * value.element_size() else value


class Kept:
    """What a pass keeps, batch by batch, where the activations are: each ``"rows"`` probe's rows written into one
    ``[n, ...]`` tensor (allocated once the first batch shows the shape, so nothing is held twice; on the model's
    device when it fits there, else in CPU memory), the running totals of the ``"sum"`` (float64) and ``"max"``
    probes and the first batch of the ``"first"`` probes on the device. :meth:`result` brings each to the host once."""

    def __init__(self, probes: Mapping[str, Probe], n: int, device: torch.device):
        self.probes, self.n, self.device = probes, n, device
        self.batch: dict[str, Tensor] = {}  # this batch's values, by key
        self.out: dict[str, Tensor] = {}
        self.rows_device = torch.device("cpu")

    def check(self, batch: int) -> None:
        """After the first batch: refuse before the totals outgrow the device or the rows of all ``n`` sequences
        outgrow CPU memory (where they end), and keep the rows on the device when they fit beside the totals."""
        per_seq = sum(v.numel() * v.element_size() for k, v in self.batch.items() if self.probes[k].combine == "rows") / batch
        fixed = sum(v.numel() * (8 if self.probes[k].combine == "sum" else 4) for k, v in self.batch.items() if self.probes[k].combine != "rows")
        where = "CPU" if self.device.type == "cpu" else str(self.device)
        device_budget = memory.MEMORY_FRACTION * memory.available_bytes(self.device)
        if fixed > device_budget:
            raise LensBiasError(
                f"the probes' running totals alone need {memory.format_bytes(fixed)} of {where} memory but only {memory.format_bytes(device_budget)} "
                "can be used, whatever the number of sequences; leave out the sections (probes) that keep the largest totals"
            )
        budget = memory.MEMORY_FRACTION * memory.available_bytes("cpu")
        if per_seq * self.n + fixed > budget:
            fits = max(0, int((budget - fixed) // per_seq))  # per_seq > 0 here: the rows alone are over
            totals = f" and {memory.format_bytes(fixed)} of running totals" if fixed else ""
            raise LensBiasError(
                f"the probes keep {memory.format_bytes(per_seq)} per sequence{totals}: {self.n} sequences need about {memory.format_bytes(per_seq * self.n + fixed)} of CPU memory but only "
                f"{memory.format_bytes(budget)} can be used; pass at most {fits} sequences, or probes that reduce more inside the hook"
            )
        if per_seq * self.n + fixed <= device_budget:
            self.rows_device = self.device

    def add_batch(self, start: int, stop: int) -> None:
        for key, value in self.batch.items():
            probe, total = self.probes[key], self.out.get(key)
            if probe.combine == "rows":
                if value.shape[0] != stop - start:
                    raise LensBiasError(f"probe {key!r} returned {value.shape[0]} rows for a batch of {stop - start} sequences; a 'rows' probe keeps one per sequence")
                if total is None:
                    device = value.device if self.rows_device.type != "cpu" else self.rows_device  # a model split over devices keeps each where it is
                    total = self.out[key] = torch.empty((self.n, *value.shape[1:]), dtype=value.dtype, device=device)
                total[start:stop] = value
            elif probe.combine == "first":
                if total is None:
                    self.out[key] = value
            elif total is not None and total.shape != value.shape:
                raise LensBiasError(f"probe {key!r} returned shape {tuple(value.shape)} after {tuple(total.shape)}; a '{probe.combine}' probe returns one shape for every batch")
            elif probe.combine == "sum":
                self.out[key] = value.to(_SUM_DTYPE.get(value.device.type, torch.float64)) if total is None else total.add_(value)
            else:  # "max"
                self.out[key] = value if total is None else torch.maximum(total, value, out=total)
        self.batch.clear()

    def result(self) -> dict[str, Tensor]:
        """The kept values in CPU memory: one copy each, at the end of the pass."""
        return {key: value.cpu() for key, value in self.out.items()}


# Running sums are float64 except where the device has none (Apple's MPS).
_SUM_DTYPE = {"mps": torch.float32}


class Reading:
    """The probes of one pass: a hook per hook point that reduces each probe's activation into :class:`Kept`, flags
    non-finite values (:class:`FiniteCheck`) and stops the pass once every probed point has fired."""

    def __init__(self, probes: Mapping[str, Probe], n: int, device: torch.device):
        self.by_hook: dict[str, list[Probe]] = defaultdict(list)
        for probe in probes.values():
            self.by_hook[probe.hook].append(probe)
        self.kept = Kept(probes, n, device)
        self.finite = FiniteCheck()
        self.fired: set[str] = set()  # this batch's

    @property
    def needs_logits(self) -> bool:
        """Whether the pass must run through the unembedding: no probe stops it earlier."""
        return not self.by_hook or any(h.startswith("unembed") for h in self.by_hook)

    def hooks(self) -> list[tuple[str, HookFn]]:
        return [(name, self._hook(name, group)) for name, group in self.by_hook.items()]

    def _hook(self, hook_name: str, group: list[Probe]) -> HookFn:
        kept, probe_hooks = self.kept, set(self.by_hook)

        def hook_fn(activation: Tensor, hook: Any) -> None:
            self.finite.flag(hook_name, activation)
            for probe in group:
                if probe.combine == "first" and probe.key in kept.out:  # kept already: not computed again
                    continue
                # reduced here, on the activation's device; compact, so the activation itself is not held
                kept.batch[probe.key] = own(probe.fn(activation).detach().float())
            self.fired.add(hook_name)
            if self.fired >= probe_hooks:
                raise StopForward

        return hook_fn

    def end_batch(self, start: int, stop: int, model_name: str) -> None:
        """Refuse probed points that never fired, and keep the batch's reductions."""
        if self.fired != set(self.by_hook):
            raise LensBiasError(
                f"hook point(s) {sorted(set(self.by_hook) - self.fired)} never fired during the forward "
                f"pass of this {model_name}: they exist but are not on its computation path"
            )
        self.finite.end_batch(start, stop)
        if start == 0:
            self.kept.check(stop - start)
        self.kept.add_batch(start, stop)
        self.fired.clear()
