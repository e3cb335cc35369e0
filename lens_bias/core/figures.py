"""matplotlib figures without pyplot: what every result's ``plot()`` draws on.

Figures need matplotlib (``pip install "lens-bias[plot]"``); every figure is a ``matplotlib.figure.Figure`` made
without pyplot, so no display backend is touched.
"""

from __future__ import annotations

import base64
import io
from typing import Any

from lens_bias.core.errors import MissingExtra

__all__ = ["new_figure", "figure_png", "integer_ticks", "layer_axis"]


def new_figure(width: float = 6.0, height: float = 4.0) -> Any:
    """An empty ``matplotlib.figure.Figure`` with a constrained layout; :class:`~lens_bias.core.errors.MissingExtra`
    without matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError as err:
        raise MissingExtra('plots need matplotlib: pip install "lens-bias[plot]"') from err
    return Figure(figsize=(width, height), layout="constrained")


def figure_png(fig: Any, alt: str = "figure") -> str:
    """A figure as a base64 PNG ``<img>`` tag, for HTML pages: 256 colours (Pillow, which matplotlib brings), which
    keeps a heatmap readable at a third of the bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    small = io.BytesIO()
    Image.open(buffer).convert("RGB").quantize(colors=256).save(small, format="png", optimize=True)
    return f'<img alt="{alt}" src="data:image/png;base64,{base64.b64encode(small.getvalue()).decode()}">'


def integer_ticks(ax: Any, n_rows: int, n_cols: int, most: int = 16) -> None:
    """Integer ticks on a heatmap's cells (every k-th where there are many), not matplotlib's fractional ones."""
    ax.set_xticks(range(0, n_cols, -(-n_cols // most)))
    ax.set_yticks(range(0, n_rows, -(-n_rows // most)))


def layer_axis(axis: Any) -> None:
    """Whole-number ticks on an axis of layers (matplotlib would put 0.5 between the two layers of a small model)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))
