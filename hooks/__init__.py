"""Interventions: named, reusable, serialisable edits of a TransformerLens forward pass (``lens_bias.hooks``).

Every module here is imported, and the names it lists in ``__all__`` are importable from ``lens_bias.hooks``; an
``Intervention`` subclass registers itself when its class is defined, so a new intervention is one file.

>>> from lens_bias.hooks import OddActivation, SelfOnlyAttention
>>> (OddActivation() + SelfOnlyAttention(layers=[0])).to_dict()["type"]
'Compose'
"""

from lens_bias.core.registry import discover

discover(__name__, globals())
