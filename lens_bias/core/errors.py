"""The package's exceptions: every refusal of bad input is a :class:`LensBiasError`, and nothing else is.

A ``ValueError`` or ``TypeError`` that is not a ``LensBiasError`` comes from lens_bias's own code (or a library under
it), so it is a bug: the command line shows its traceback instead of a tidy one-line refusal.
"""

__all__ = ["LensBiasError", "WrongType", "MissingExtra", "NonFinite"]


class LensBiasError(ValueError):
    """Bad input to lens_bias: the message says what was wrong and what to do instead.

    Subclasses ``ValueError`` so callers that already catch ``ValueError`` keep working.
    """


class WrongType(LensBiasError, TypeError):
    """An argument of the wrong kind (a model that is not a TransformerLens model, a list where an intervention
    goes); also a ``TypeError``, so callers that catch one keep working."""


class MissingExtra(LensBiasError):
    """An optional dependency is not installed (matplotlib for figures); the message names the install line.
    Callers that can do without it (a page without figures) catch this, and only this."""


class NonFinite(LensBiasError):
    """A forward pass produced a NaN or an inf from finite inputs (float16 overflowing, broken weights); the message
    names the first hook where it appeared. Callers that measure whether a dtype overflows catch this, and only this."""
