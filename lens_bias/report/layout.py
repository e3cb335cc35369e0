"""How a report reads for a model in one regime: the one place the trained-or-init choice is made.

A random init's report opens with what it was born with (token preference, contraction, ...) and its headline
numbers; a trained model's with the anatomy of its sink, then what removes the sink and its strongest sink heads,
and only the numbers that mean something for a trained model. The page, the text summary, the headline table and
``analyze``'s section order all read a :class:`Layout`.

>>> Layout("trained").kind, Layout("init").first
('a trained model', ())
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from lens_bias.analyses.base import SECTIONS, Result
from lens_bias.core.errors import LensBiasError
from lens_bias.core.model_facts import REGIMES

__all__ = ["Layout"]

# A trained model's page follows its anatomy with what removes the sink and what the sink heads look like.
_TRAINED_FIRST = ("sink_attribution", "sink_heads")


@dataclass(frozen=True)
class Layout:
    """What a report of a model in ``regime`` ("init" or "trained") shows first, and which numbers it heads with."""

    regime: str

    def __post_init__(self) -> None:
        if self.regime not in REGIMES:
            raise LensBiasError(f"regime must be one of {REGIMES}, got {self.regime!r}")

    @property
    def trained(self) -> bool:
        return self.regime == "trained"

    @property
    def kind(self) -> str:
        """The model in words, as the text summary names it."""
        return "a trained model" if self.trained else "a random init"

    @property
    def short(self) -> str:
        return "trained" if self.trained else "random init"

    @property
    def shows_anatomy(self) -> bool:
        """Whether the report opens with the anatomy of the sink (a random init has no sink to dissect)."""
        return self.trained

    @property
    def first(self) -> tuple[str, ...]:
        """The extra sections that come right after the anatomy, in this order."""
        return _TRAINED_FIRST if self.trained else ()

    @property
    def headline_heading(self) -> str:
        """The heading of the headline table: a random init's opens the page, a trained model's follows its sink."""
        return "Other numbers" if self.trained else "Headline numbers"

    def section_order(self, names: Sequence[str]) -> list[str]:
        """``SECTIONS`` names in report order (``Analysis.order``, or ``trained_order`` for a trained model)."""
        return sorted(names, key=lambda name: SECTIONS[name].place(self.regime))

    def page_order(self, names: Sequence[str]) -> list[str]:
        """The computed sections in page order: :attr:`first`, then the rest as computed."""
        first = [name for name in self.first if name in names]
        return first + [name for name in names if name not in first]

    def headline_keys(self, result: Result) -> tuple[str, ...] | None:
        """The headline numbers of ``result`` that mean something in this regime (None: all of them)."""
        return result.trained_headline if self.trained else result.init_headline
