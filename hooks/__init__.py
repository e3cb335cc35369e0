"""Interventions: named, reusable edits of a TransformerLens forward pass (``lens_bias.hooks``)."""

__all__: list[str] = []
