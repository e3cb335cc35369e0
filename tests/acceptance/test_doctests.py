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
from lens_bias.core import tl

MODULES = sorted(
    {
        info.name
        for package in (lens_bias, lens_bias.analyses, lens_bias.experiments, lens_bias.hooks, lens_bias.seedprint)
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")  # sub-packages' modules too
        if info.name != "lens_bias.__main__"
    }
    | {"lens_bias"}
)


# Modules whose examples build a Hugging Face mixture of experts, which only a TL 4 bridge wraps.
NEEDS_TL4 = {"lens_bias.core.experts", "lens_bias.analyses.super_experts"}


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    if name in NEEDS_TL4 and tl.tl_major() < 4:
        pytest.skip("the example bridges a Hugging Face mixture of experts (TransformerLens 4)")
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
