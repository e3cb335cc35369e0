"""Experiments: each drives several passes (training runs, interventions, fingerprints) over one or more models
and returns its tables; one module each, registered as an :class:`~lens_bias.experiments.base.Experiment` (every
module here is imported, so ``lens-bias NAME`` exists for each without an import line); an experiment's
measurements or scoring may sit in a module of their own beside it.

- :mod:`~lens_bias.experiments.persistence`: the SeedPrint persistence experiment (``lens-bias persistence``).
- :mod:`~lens_bias.experiments.sink_training`: where attention sinks come from and how to move them (``lens-bias sinks``); its measurements in
  :mod:`~lens_bias.experiments.sink_measures`.
- :mod:`~lens_bias.experiments.real_model`: the papers' real-model experiments on a pretrained model.
- :mod:`~lens_bias.experiments.descendants`: SeedPrint against a pretrained model's descendants; how the pairs are
  scored in :mod:`~lens_bias.experiments.descendant_scores`.

Every table renders as markdown through :func:`lens_bias.core.tables.markdown_table`.
"""

from lens_bias.core.registry import discover

discover(__name__)
