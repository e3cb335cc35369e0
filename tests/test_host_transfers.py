"""Reductions stay where the activations are: a pass brings its kept values to the host once, at the end.

Every call that brings a tensor to the host, or waits for the device to read one (``Tensor.cpu``, ``.item``,
``.tolist``, ``.numpy``, ``.to("cpu")``, ``float()``/``int()``/``bool()``/``index`` of a tensor), made from the
repository's code (not from TransformerLens, transformers or torch), is counted over one call with 2 batches and with 8. On a GPU each would stop the device; here, on the CPU,
a count that grows with the number of batches shows one made per batch. The counts must be equal.
"""

from __future__ import annotations

import collections
import contextlib
import pathlib
import traceback
from typing import Iterator

import pytest
import torch

import lens_bias

from .conftest import trained_tiny

ROOT = pathlib.Path(lens_bias.__file__).resolve().parents[1]
READS = ("cpu", "item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__")


@contextlib.contextmanager
def host_transfers() -> Iterator[collections.Counter]:
    """Count, by calling line, the host transfers made from the repository's files while the context is open."""
    sites: collections.Counter = collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in (*READS, "to")}

    def counted(name, original):
        def method(self, *args, **kwargs):
            if name == "to":
                target = kwargs.get("device", args[0] if args and isinstance(args[0], (str, torch.device)) else None)
                if target is None or torch.device(target).type != "cpu":
                    return original(self, *args, **kwargs)
            caller = traceback.extract_stack(limit=2)[0]  # the line that called the method
            if caller.filename.startswith(str(ROOT)) and "site-packages" not in caller.filename:  # ours, not TL's, transformers' or torch's
                sites[f"{name} at {pathlib.Path(caller.filename).relative_to(ROOT)}:{caller.lineno}"] += 1
            return original(self, *args, **kwargs)

        return method

    for name, original in originals.items():
        setattr(torch.Tensor, name, counted(name, original))
    try:
        yield sites
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _per_batch(call) -> collections.Counter:
    """The transfers that a call with 8 batches makes beyond the same call with 2 (16 sequences)."""
    call(8)  # the once-per-model checks (readout, edits) are cached after the first call
    with host_transfers() as two:
        call(8)
    with host_transfers() as eight:
        call(2)
    assert sum(two.values()) > 0  # the counter sees lens_bias' own transfers (the results, once)
    return eight - two


MODEL = trained_tiny("llama", d_model=32, n_layers=2, n_heads=2, d_vocab=97, n_ctx=16)
TOKENS = lens_bias.random_tokens(16, 8, 97, seed=1)


def test_analyze_brings_its_values_to_the_host_once():
    extra = _per_batch(lambda batch_size: lens_bias.analyze(MODEL, inputs=TOKENS, batch_size=batch_size, progress=False))
    assert not extra, f"host transfers made per batch: {dict(extra)}"


def test_a_fingerprint_brings_its_features_to_the_host_once():
    extra = _per_batch(lambda batch_size: lens_bias.fingerprint(MODEL, inputs=TOKENS, batch_size=batch_size, progress=False))
    assert not extra, f"host transfers made per batch: {dict(extra)}"


def test_sink_attribution_brings_its_values_to_the_host_once_per_condition():
    extra = _per_batch(lambda batch_size: lens_bias.sink_attribution(MODEL, TOKENS, n_random=2, position=4, batch_size=batch_size, progress=False))
    assert not extra, f"host transfers made per batch: {dict(extra)}"


@pytest.mark.parametrize("call", ["tolist", "item", "float"])
def test_the_counter_sees_a_transfer_made_per_batch(call, monkeypatch):
    """The counter is not blind: a probe that reads its value on the host in every batch is caught."""
    from lens_bias.analyses.sinks import Sinks

    original = Sinks.probes

    def probes(self, adapter):
        out = dict(original(self, adapter))
        key, probe = next(iter(out.items()))
        read = {"tolist": lambda x: x.tolist(), "item": lambda x: x.sum().item(), "float": lambda x: float(x.sum())}[call]
        out[key] = type(probe)(probe.hook, probe.reduction, lambda x, fn=probe.fn: (read(x), fn(x))[1], probe.combine)
        return out

    monkeypatch.setattr(Sinks, "probes", probes)
    extra = _per_batch(lambda batch_size: lens_bias.analyze(MODEL, inputs=TOKENS, sections=["sinks"], batch_size=batch_size, progress=False))
    assert sum(extra.values()) == 6, extra  # 8 batches against 2: six more
