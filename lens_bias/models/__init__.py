"""Where models come from: random inits (one :class:`~lens_bias.models.architectures.base.Architecture` per family),
pretrained checkpoints (the shipped SmolLM2, GGUF files, Hugging Face folders and models), lens_bias checkpoints,
one loader for any MODEL string (:func:`load_model`), and model transforms (:mod:`lens_bias.models.transforms`).

>>> import lens_bias
>>> lens_bias.models.ARCHITECTURES.names()
['gpt2', 'llama', 'qwen2']
"""

from lens_bias.models import architectures  # noqa: F401 - defines, and so registers, every family
from lens_bias.models.checkpoints import load_checkpoint, save_checkpoint
from lens_bias.models.huggingface import from_hf, load_hf, pretrained
from lens_bias.models.init import random_init, redraw
from lens_bias.models.shipped import SHIPPED, shipped_gguf
from lens_bias.models.sources import SOURCES, Source, load_model
from lens_bias.models.spec import ARCHITECTURES, ModelSpec, parse_model_spec

__all__ = [
    "ModelSpec", "random_init", "redraw", "parse_model_spec", "load_model", "pretrained", "from_hf", "load_hf", "shipped_gguf",
    "save_checkpoint", "load_checkpoint", "ARCHITECTURES", "SOURCES", "Source", "SHIPPED",
]
