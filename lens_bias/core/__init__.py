"""The plumbing every layer above builds on: the one adapter for TL 4 bridges and TL 3 models
(:mod:`~lens_bias.core.adapter`), inputs and corpora, the memory guard, statistics, files and serialisation,
figure helpers, registries, and the package's one exception (:class:`~lens_bias.core.errors.LensBiasError`).
Nothing here imports from the rest of lens_bias."""
