"""What an extension of lens_bias is written with: a report section, an intervention, a reading of your own.

The package's root holds what a user calls (``analyze``, ``compare``, ``intervene``, …); the names here are for
whoever adds to it. A new section is one file with an :class:`Analysis` subclass and its :class:`Result` (it
registers itself in ``SECTIONS``); a part of the report with passes of its own subclasses :class:`ExtraPass` (it
registers itself in ``PASSES``) and reads ``analyze``'s :class:`RunPlan`; a new intervention subclasses :class:`Intervention` (it registers itself in
``INTERVENTIONS``); a reading of your own hands :class:`Probe` s to :meth:`ModelAdapter.collect` or to
:func:`measure`. The walk-throughs are in the contributing guide ("Add an analysis", "Add a section with passes of its own").

>>> from lens_bias.extend import SECTIONS, ModelAdapter
>>> "sinks" in SECTIONS
True
"""

from lens_bias.analyses.base import SECTIONS, Analysis, Result, Results, measure, run_analyses
from lens_bias.analyses.plan import PASSES, ExtraPass, RunPlan
from lens_bias.core.adapter import ModelAdapter
from lens_bias.core.figures import new_figure
from lens_bias.core.inputs import InputSpec
from lens_bias.core.model_facts import ModelInfo
from lens_bias.core.probes import Probe
from lens_bias.hooks.base import INTERVENTIONS, Intervention

__all__ = ["Analysis", "Result", "Results", "SECTIONS", "ExtraPass", "RunPlan", "PASSES", "measure", "run_analyses", "ModelAdapter", "ModelInfo", "Probe", "InputSpec", "new_figure",
           "Intervention", "INTERVENTIONS"]
