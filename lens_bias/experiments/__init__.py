"""Experiments: each drives several passes (training runs, interventions, fingerprints) over one or more models and
returns its tables; one module each.

- :mod:`~lens_bias.experiments.ablation`: :func:`ablate`, the MLP × attention factorial and the activation sweep.
- :mod:`~lens_bias.experiments.persistence`: the SeedPrint persistence experiment (``lens-bias persistence``).
- :mod:`~lens_bias.experiments.sinks`: where attention sinks come from and how to move them (``lens-bias sinks``).
- :mod:`~lens_bias.experiments.real_model`: the papers' real-model experiments on a pretrained model.

Every table renders as markdown through :func:`~lens_bias.experiments.tables.markdown_table`.
"""

from .ablation import CONDITIONS, AblationResult, ablate
from .persistence import PersistenceConfig, PersistenceResult, run_persistence
from .real_model import RealModelConfig, RealModelResult
from .sinks import SINK_MODEL_PATH, SinkConfig, SinkExperimentResult, run_sink_experiment, sink_model
from .tables import markdown_table

__all__ = [
    "ablate", "AblationResult", "CONDITIONS", "PersistenceConfig", "PersistenceResult", "run_persistence", "RealModelConfig",
    "RealModelResult", "SinkConfig", "SinkExperimentResult", "run_sink_experiment", "sink_model", "SINK_MODEL_PATH", "markdown_table",
]
