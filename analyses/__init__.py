"""One module per measurement; each defines an ``Analysis`` (probes + finalize) and its result dataclass."""

from .contraction import Contraction, ContractionResult
from .token_preference import TokenPreference, TokenPreferenceResult

__all__ = ["Contraction", "ContractionResult", "TokenPreference", "TokenPreferenceResult"]
