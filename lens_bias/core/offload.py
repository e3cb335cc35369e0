"""Models bigger than memory: Hugging Face's big-model inference (accelerate's ``device_map``, ``max_memory``,
``offload_folder``) under a TransformerLens 4 bridge.

A model loaded that way keeps the layers that do not fit on disk (or in CPU memory, off the GPU); their parameters
sit on the ``meta`` device, and accelerate's hooks bring each layer's weights in for its own forward and drop them
after. Passes through hook points need nothing more: every probe and every hook-based intervention sees the same
activations as on the model in memory. Reading a weight (the super-weight and super-neuron sections,
``RemoveWeight``) goes through :func:`read_weight`, which brings in that one module's
weights for the read.

On glibc, memory freed after a layer's forward stays in the heap once its blocks have raised malloc's dynamic
mmap threshold, so the resident memory of an offloaded pass grows towards the whole model's size (measured on
SmolLM2: 670–720 MiB of anonymous memory at the peak, against 220 MiB with a fixed threshold).
:func:`lens_bias.core.memory.return_freed_memory` fixes the threshold for the process when a model is loaded offloaded.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import Tensor

__all__ = ["is_dispatched", "is_offloaded", "execution_device", "read_weight"]


def is_dispatched(model: Any) -> bool:
    """Whether ``model`` (a bridge, or the Hugging Face model itself) was loaded with an accelerate device map."""
    return getattr(getattr(model, "original_model", model), "hf_device_map", None) is not None


def is_offloaded(module: Any) -> bool:
    """Whether any parameter of ``module`` lives off memory (on the ``meta`` device, loaded by accelerate per pass)."""
    return any(p.device.type == "meta" for p in module.parameters())


def execution_device(model: Any) -> torch.device:
    """Where a pass of ``model`` runs: the device of its first parameter held in memory (CPU when none is)."""
    for p in model.parameters():
        if p.device.type != "meta":
            return p.device
    return torch.device("cpu")


@contextlib.contextmanager
def _loaded(module: Any) -> Iterator[None]:
    """``module``'s offloaded weights in memory for the duration (accelerate hooks each leaf module it offloads)."""
    from accelerate.utils import align_module_device, has_offloaded_params  # there whenever a model is offloaded

    with contextlib.ExitStack() as stack:
        for sub in module.modules():
            if has_offloaded_params(sub):
                stack.enter_context(align_module_device(sub, torch.device("cpu")))
        yield


def read_weight(component: Any, name: str) -> Tensor:
    """``component.<name>`` (a TransformerLens weight such as ``W_out``), detached, also where it is offloaded.

    Args:
        component: a bridge or HookedTransformer submodule, e.g. ``model.blocks[11].mlp``.
        name: the weight's TransformerLens name.

    Returns:
        The weight; a copy in CPU memory when the module is offloaded.
    """
    module = getattr(component, "original_component", component)
    if not isinstance(module, torch.nn.Module) or not is_offloaded(module):
        return getattr(component, name).detach()
    with _loaded(module):
        return getattr(component, name).detach().clone()

