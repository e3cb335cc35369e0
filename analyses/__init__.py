"""One module per measurement; each defines an ``Analysis`` (probes + finalize) and its result dataclass.

Importing a module defines its ``Analysis`` subclass, which registers it as a report section; importing every
module here makes ``lens_bias.SECTIONS`` complete.
"""

from .contraction import Contraction, ContractionResult
from .decomposition import Decomposition, DecompositionResult
from .fingerprint import FingerprintSection, FingerprintSummary
from .massive import MassiveActivationsResult, massive_ablation, massive_activations
from .positional_variance import PositionalVariance, PositionalVarianceResult
from .sinks import Sinks, SinksResult, sink_rate
from .super_neurons import SuperNeurons, SuperNeuronsResult
from .super_weights import SuperWeightsResult, super_weight_table, super_weights
from .token_preference import TokenPreference, TokenPreferenceResult

__all__ = ["Contraction", "ContractionResult", "TokenPreference", "TokenPreferenceResult", "Decomposition", "DecompositionResult", "FingerprintSection", "FingerprintSummary", "PositionalVariance", "PositionalVarianceResult", "Sinks", "SinksResult", "sink_rate", "SuperNeurons", "SuperNeuronsResult", "massive_activations", "massive_ablation", "MassiveActivationsResult", "super_weights", "super_weight_table", "SuperWeightsResult"]
