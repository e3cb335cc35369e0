"""lens_bias: what randomly initialised transformers are born with, on TransformerLens.

The user's verbs are here; what an extension is written with is in ``lens_bias.extend``, and everything else lives in
the layers below (``lens_bias.core``, ``lens_bias.models``, ``lens_bias.hooks``, ``lens_bias.seedprint``,
``lens_bias.analyses``, ``lens_bias.training``, ``lens_bias.report``, ``lens_bias.experiments``), whose imports run
one way.

>>> import lens_bias
>>> model = lens_bias.models.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=32)
>>> report = lens_bias.analyze(model, n_sequences=8, seq_len=8, progress=False)
>>> report.token_preference.d_vocab
100
"""

import logging
import warnings
from typing import Any

from lens_bias import experiments, extend, hooks, models, seedprint
from lens_bias.analyses.ablation import ablate
from lens_bias.analyses.massive import massive_ablation, massive_activations
from lens_bias.analyses.massive_writes import massive_writes
from lens_bias.analyses.perplexity import PerplexityTable, perplexity
from lens_bias.analyses.sink_attribution import sink_attribution
from lens_bias.analyses.super_experts import super_experts
from lens_bias.analyses.super_weights import super_weight_table, super_weights
from lens_bias.core.errors import LensBiasError
from lens_bias.core.inputs import (
    RandomEmbeddings,
    RandomTokens,
    random_embeddings,
    random_tokens,
    text_tokens,
)
from lens_bias.hooks.base import intervene
from lens_bias.models import ModelSpec, from_hf, pretrained, random_init
from lens_bias.report import BiasReport, analyze, viz
from lens_bias.seedprint import Fingerprint, SeedPrintResult, compare, fingerprint
from lens_bias.training import train

__version__ = "0.1.0"
__all__ = [
    "analyze", "ablate", "random_init", "pretrained", "from_hf", "random_tokens", "random_embeddings", "text_tokens", "intervene",
    "fingerprint", "compare", "train", "perplexity", "sink_attribution", "super_weights", "super_weight_table", "super_experts", "massive_activations", "massive_ablation", "massive_writes",
    "viz", "models", "hooks", "seedprint", "experiments", "extend", "BiasReport", "Fingerprint", "SeedPrintResult", "PerplexityTable",
    "ModelSpec", "RandomTokens", "RandomEmbeddings", "LensBiasError",
]

# Extension plumbing that the root held before lens_bias.extend: still found here, with a DeprecationWarning.
_MOVED = ("ModelAdapter", "ModelInfo", "Probe", "Analysis", "Result", "run_analyses", "SECTIONS", "InputSpec")


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        warnings.warn(f"lens_bias.{name} is deprecated: use lens_bias.extend.{name} (the root holds what a user calls)", DeprecationWarning,
                      stacklevel=2)
        return getattr(extend, name)
    raise AttributeError(f"module 'lens_bias' has no attribute {name!r}")

logging.getLogger(__name__).addHandler(logging.NullHandler())
