"""lens_bias: what randomly initialised transformers are born with, on TransformerLens.

>>> import lens_bias
>>> model = lens_bias.models.random_init("gpt2", d_model=64, n_layers=2, n_heads=4, d_vocab=100, n_ctx=32)
>>> report = lens_bias.analyze(model, n_sequences=8, seq_len=8, progress=False)
>>> report.token_preference.d_vocab
100
"""

import logging

from . import models, seedprint
from .adapter import ModelAdapter, ModelInfo, Probe
from .analysis import Analysis, Result, run_analyses
from .errors import LensBiasError
from .inputs import InputSpec, RandomEmbeddings, random_embeddings, random_tokens
from .models import ModelSpec, from_hf, pretrained, random_init
from .report import SECTIONS, BiasReport, analyze
from .experiments import ablate
from .analyses.massive import massive_ablation, massive_activations
from .analyses.super_weights import super_weight_table, super_weights
from .perplexity import PerplexityTable, perplexity
from .hooks import intervene
from .seedprint import Fingerprint, SeedPrintResult, compare, fingerprint

__version__ = "0.1.0"
__all__ = ["analyze", "ablate", "pretrained", "from_hf", "perplexity", "PerplexityTable", "super_weights", "super_weight_table", "massive_activations", "massive_ablation", "intervene", "compare", "fingerprint", "Fingerprint", "SeedPrintResult", "seedprint", "BiasReport", "SECTIONS", "models", "random_init", "ModelSpec", "ModelAdapter", "ModelInfo", "Probe", "Analysis", "Result", "run_analyses", "random_tokens", "random_embeddings", "RandomEmbeddings", "InputSpec", "LensBiasError"]

logging.getLogger(__name__).addHandler(logging.NullHandler())
