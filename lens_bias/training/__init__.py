"""Training small models: packed token data (:mod:`~lens_bias.training.data`) and a deterministic AdamW trainer
(:mod:`~lens_bias.training.trainer`)."""

from lens_bias.training.data import TokenData
from lens_bias.training.trainer import (
    TrainingRun,
    TrainSettings,
    batch_order,
    evaluate,
    fine_tune,
    train,
)

__all__ = ["TokenData", "TrainingRun", "TrainSettings", "train", "fine_tune", "evaluate", "batch_order"]
