"""The report: ``analyze(model)`` and its :class:`BiasReport` (:mod:`~lens_bias.report.bias_report`), and the page it
renders to with circuitsvis views (:mod:`~lens_bias.report.viz`)."""

from lens_bias.report import viz
from lens_bias.report.bias_report import AnalyzeSettings, BiasReport, analyze, plan_run

__all__ = ["AnalyzeSettings", "BiasReport", "analyze", "plan_run", "viz"]
