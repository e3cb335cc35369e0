"""The package's one exception class."""

__all__ = ["LensBiasError"]


class LensBiasError(ValueError):
    """Bad input to lens_bias: the message says what was wrong and what to do instead.

    Subclasses ``ValueError`` so callers that already catch ``ValueError`` keep working.
    """
