"""Interventions: named, reusable, serialisable edits of a TransformerLens forward pass (``lens_bias.hooks``).

>>> from lens_bias.hooks import OddActivation, SelfOnlyAttention
>>> (OddActivation() + SelfOnlyAttention(layers=[0])).to_dict()["type"]
'Compose'
"""

from .activations import SetActivations
from .attention import SelfOnlyAttention, UniformAttention
from .base import Compose, Intervention, as_hooks, intervene, reads, replaces
from .mlp import ACTIVATION_FUNCTIONS, MeanCenterMLP, OddActivation, SwapActivation
from .sinks import AmplifyVariance, HeadwiseRMSNorm, MaskToSelf, ScaleNorm
from .sublayer import SubtractPositionEmbedding, ZeroSublayer
from .weights import RemoveWeight, RemoveWeights

__all__ = ["Intervention", "Compose", "intervene", "as_hooks", "reads", "replaces", "OddActivation", "MeanCenterMLP", "SwapActivation", "ACTIVATION_FUNCTIONS", "SelfOnlyAttention", "UniformAttention", "ZeroSublayer", "SubtractPositionEmbedding", "MaskToSelf", "AmplifyVariance", "ScaleNorm", "HeadwiseRMSNorm", "SetActivations", "RemoveWeight", "RemoveWeights"]
