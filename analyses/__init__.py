"""Measurements, one module each: report sections (an ``Analysis`` and its result dataclass) and the measurements
that run passes of their own (massive activations, super weights, perplexity, ablations).

Every module here is imported when the package is, so defining an ``Analysis`` subclass in a new file registers
it as a report section (``lens_bias.analyses.base.SECTIONS``) with no import line anywhere.
"""

from lens_bias.core.registry import discover

discover(__name__)
