"""Every `>>>` example in the package's docstrings runs as written."""

import doctest
import importlib
import pkgutil

import pytest

import lens_bias
import lens_bias.analyses
import lens_bias.experiments
import lens_bias.hooks
import lens_bias.seedprint

MODULES = sorted(
    {
        info.name
        for package in (lens_bias, lens_bias.analyses, lens_bias.experiments, lens_bias.hooks, lens_bias.seedprint)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")  # sub-packages' modules too
        if info.name != "lens_bias.__main__"
    }
    | {"lens_bias"}
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
