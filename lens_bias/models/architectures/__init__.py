"""Random-init architecture families, one file each; every module here is imported, and each
:class:`~lens_bias.models.architectures.base.Architecture` subclass with a ``name`` registers itself in
:data:`lens_bias.models.spec.ARCHITECTURES`."""

from lens_bias.core.registry import discover

discover(__name__)
