"""What an extension of lens_bias is written with: a report section, an intervention, a reading of your own.

The package's root holds what a user calls (``analyze``, ``compare``, ``intervene``, …); the names here are for
whoever adds to it. A new section is one file with an :class:`Analysis` subclass and its :class:`Result` (it
registers itself in ``SECTIONS``); a new intervention subclasses :class:`Intervention` (it registers itself in
``INTERVENTIONS``); a reading of your own hands :class:`Probe` s to :meth:`ModelAdapter.collect` or to
:func:`measure`. The walk-through is in the contributing guide ("Add an analysis").

>>> from lens_bias.extend import SECTIONS, ModelAdapter
>>> "sinks" in SECTIONS
True
"""

from lens_bias.analyses.base import SECTIONS, Analysis, Result, measure, run_analyses
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.figures import new_figure
from lens_bias.core.inputs import InputSpec
from lens_bias.core.model_facts import ModelInfo
from lens_bias.core.probes import Probe
from lens_bias.hooks.base import INTERVENTIONS, Intervention

__all__ = ["Analysis", "Result", "SECTIONS", "measure", "run_analyses", "ModelAdapter", "ModelInfo", "Probe", "InputSpec", "new_figure",
           "Intervention", "INTERVENTIONS"]
