"""lens_bias checkpoints: a state_dict with the :class:`~lens_bias.models.spec.ModelSpec` it was built from.

A checkpoint loads on the TransformerLens it was not written on: its architecture converts the weights between a
TL 4 bridge's layout and a TL 3 ``HookedTransformer``'s (llama and qwen2; gpt2 checkpoints stay on their TL line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

import torch

from lens_bias.core.errors import LensBiasError
from lens_bias.core.files import atomic_save, load_torch_file
from lens_bias.models.init import REGIME, mark, random_init
from lens_bias.models.spec import ModelSpec

__all__ = ["save_checkpoint", "load_checkpoint"]

_FORMAT = "lens_bias.checkpoint/1"


def save_checkpoint(model: Any, path: Union[str, Path], **extra: Any) -> None:
    """A plain state_dict file with the lens_bias spec it was built from, loadable by :func:`load_checkpoint`."""
    spec = getattr(model, "lens_bias_spec", None)
    if spec is None:
        raise LensBiasError("save_checkpoint needs a model built by lens_bias.random_init (it records model.lens_bias_spec)")
    # Written under a temporary name and renamed: an interrupted save never leaves a partial checkpoint.
    regime = getattr(model, REGIME, "trained")
    atomic_save({"format": _FORMAT, "spec": spec.to_dict(), "regime": regime, "state_dict": model.state_dict(), **extra}, path)


def load_checkpoint(path: Union[str, Path], *, device: Union[str, torch.device, None] = None) -> Any:
    """Rebuild the architecture from the checkpoint's spec and load its weights.

    A llama / qwen2 checkpoint saved from a TL 4 bridge (Hugging Face weight layout) loads into the TL 3
    ``HookedTransformer`` that ``random_init`` builds there, and the other way round: the weights are converted.
    The model records the regime it was saved in (``"trained"`` unless it was saved untrained).
    """
    fix = "write one with `lens-bias train` or lens_bias.models.checkpoints.save_checkpoint"
    saved = load_torch_file(path, "checkpoint", fix)
    if saved.get("format") != _FORMAT or not isinstance(saved.get("state_dict"), dict) or not isinstance(saved.get("spec"), dict):
        raise LensBiasError(f"{path} is not a lens_bias checkpoint file; {fix}")
    spec = ModelSpec.from_dict(saved["spec"])
    model = random_init(spec, device=device)
    state = saved["state_dict"]
    target = model.state_dict()
    if "embed.weight" in state and "embed.W_E" in target:
        state = spec.architecture.bridge_to_hooked(state, spec, target)
    elif "embed.W_E" in state and "embed.weight" in target:
        state = spec.architecture.hooked_to_bridge(state, spec)
    model.load_state_dict(state)
    return mark(model, regime=saved.get("regime", "trained"), spec=spec, source=str(path))
