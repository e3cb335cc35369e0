"""An empty model of another model's architecture with its shape changed: what the transforms that change a shape
(:mod:`~lens_bias.models.width`, :mod:`~lens_bias.models.depth`, :mod:`~lens_bias.models.upcycle`) build before they copy weights in.

A TL 4 bridge is rebuilt from its Hugging Face model's config, a TL 3 ``HookedTransformer`` from its own config; the
new model's weights are left to the caller, so its random draw is kept off the global generator.

>>> import lens_bias
>>> model = lens_bias.random_init("llama", d_model=64, n_layers=2, n_heads=4, d_vocab=500, n_ctx=16)
>>> reshaped(model, {"num_hidden_layers": 3}, {"n_layers": 3}, "-depth3").cfg.n_layers
3
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Mapping, Union

import torch

from lens_bias.core import tl
from lens_bias.core.errors import LensBiasError
from lens_bias.models.huggingface import from_hf

__all__ = ["reshaped"]


def reshaped(model: Any, hf: Union[Mapping[str, Any], Callable[[Any], Any]], hooked: Mapping[str, Any], suffix: str) -> Any:
    """A model of ``model``'s architecture and dtype, on its device, with its config changed (weights undefined).

    Args:
        model: a TL 4 bridge of a Hugging Face model, or a TL 3 ``HookedTransformer``.
        hf: the Hugging Face config fields to set, or a function of a copy of the config that edits it in place or
            returns another (of another architecture: its causal LM is built).
        hooked: the ``HookedTransformerConfig`` fields to set.
        suffix: appended to the model name.

    Returns:
        The new model, in eval mode, sharing ``model``'s tokenizer.
    """
    tokenizer = getattr(model, "tokenizer", None)
    original = getattr(model, "original_model", None)
    if original is not None:
        from transformers import AutoModelForCausalLM  # a bridge's path only; lens_bias imports without it loaded

        config = copy.deepcopy(original.config)
        if callable(hf):
            config = hf(config) or config
        else:
            for key, value in hf.items():
                setattr(config, key, value)
        # the same class for the same config; a config of another architecture (a dense model's as a mixture of experts) its own
        build = type(original) if type(config) is type(original.config) else AutoModelForCausalLM.from_config
        with torch.random.fork_rng(devices=[]):  # the weights are overwritten: leave the global RNG as it was
            new = build(config).to(dtype=next(original.parameters()).dtype).eval()
        return from_hf(new, tokenizer, backend="bridge", model_name=f"{model.cfg.model_name}{suffix}")
    HookedTransformer, HookedTransformerConfig = tl.hooked_classes()
    if not isinstance(model, HookedTransformer):
        raise LensBiasError("this transform takes a TransformerLens model (a bridge of a Hugging Face model, or a HookedTransformer), "
                            f"got {type(model).__name__}")
    fields = {k: v for k, v in model.cfg.to_dict().items() if k in HookedTransformerConfig.__dataclass_fields__}
    fields.update(hooked, init_weights=False, model_name=f"{model.cfg.model_name}{suffix}")
    new = HookedTransformer(HookedTransformerConfig(**fields), tokenizer=tokenizer, move_to_device=False)
    return torch.nn.Module.to(new, next(model.parameters()).device).eval()  # HookedTransformer.to prints as it moves
