"""Shared matplotlib style and small helpers: readable defaults, units on every axis.

Every figure-making function in the package returns the ``Figure`` (and draws nothing global), so
notebooks, widgets and tests can all use it. Helpers here are generic; topic-specific plots live
next to the topic (e.g. a pipeline timeline in ``mlsys_nb.pipeline``) and use ``style()`` and
``new_figure()``.
"""

from __future__ import annotations

import matplotlib

STYLE = {
    "figure.figsize": (7.5, 4.2),
    "figure.dpi": 100,
    "savefig.dpi": 130,
    "savefig.bbox": "tight",
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 12,
    "axes.labelsize": 11,
    "legend.fontsize": 9,
    "legend.frameon": False,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "figure.constrained_layout.use": True,
}

# Colour-blind-safe palette (Okabe–Ito), in a fixed order so a rank or a schedule keeps its colour.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]


def style():
    """A context manager applying the package style: ``with plots.style(): ...``."""
    return matplotlib.rc_context(STYLE | {"axes.prop_cycle": matplotlib.cycler(color=PALETTE)})


def new_figure(nrows: int = 1, ncols: int = 1, **kw):
    """``(fig, axes)`` in the package style, without touching pyplot's global state."""
    from matplotlib.figure import Figure

    with style():
        fig = Figure(figsize=kw.pop("figsize", STYLE["figure.figsize"]), layout="constrained")
        axes = fig.subplots(nrows, ncols, **kw)
    return fig, axes


def label(ax, x: str, y: str, title: str | None = None) -> None:
    """Set axis labels (include the unit, e.g. ``"message size (bytes)"``) and an optional title."""
    if "(" not in x or "(" not in y:
        raise ValueError(f"axis labels need a unit in parentheses, got x={x!r}, y={y!r}")
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if title:
        ax.set_title(title)


def human_bytes(n: float, binary: bool = True) -> str:
    """``1536 -> '1.50 KiB'`` (binary) or ``'1.54 kB'`` (decimal). GB = 1e9 B, GiB = 2**30 B."""
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"] if binary else ["B", "kB", "MB", "GB", "TB", "PB"]
    base = 1024.0 if binary else 1000.0
    n = float(n)
    for u in units:
        if abs(n) < base or u == units[-1]:
            return f"{n:.0f} {u}" if u == "B" else f"{n:.2f} {u}"
        n /= base
    return f"{n:.2f} {units[-1]}"


def rank_bars(values, *, ylabel: str, title: str | None = None, ax=None):
    """One bar per rank (e.g. bytes or seconds per rank). Returns the Figure."""
    if ax is None:
        fig, ax = new_figure()
    else:
        fig = ax.figure
    with style():
        ranks = list(range(len(values)))
        ax.bar(ranks, values, color=[PALETTE[r % len(PALETTE)] for r in ranks])
        ax.set_xticks(ranks)
        label(ax, "rank (index)", ylabel, title)
    return fig


# How figures are rendered when displayed outside pyplot's inline backend (e.g. in Voilà). The
# package's figures have a layout engine or fixed margins, so the extra "tight" pass is not needed.
PNG_DISPLAY_KWARGS = {"bbox_inches": None}


def _enable_png_display() -> None:
    """Let ``display(fig)`` show a PNG in any IPython kernel (JupyterLab, Voilà, papermill), even
    when pyplot's inline backend was never activated: without this, a ``Figure`` made with
    ``new_figure`` shows as ``<Figure size ...>`` text in a Voilà page."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
        if shell is None:
            return
        from matplotlib_inline.backend_inline import select_figure_formats

        select_figure_formats(shell, {"png"}, **PNG_DISPLAY_KWARGS)
    except Exception:  # no IPython or no matplotlib_inline: plain Python, nothing to do
        pass


_enable_png_display()
