"""Shared matplotlib style and small helpers: readable defaults, units on every axis.

Every figure-making function in the package returns the ``Figure`` (and draws nothing global), so
notebooks, widgets and tests can all use it. Helpers here are generic; topic-specific plots live
next to the topic (e.g. a pipeline timeline in ``mlsys_nb.pipeline``) and use ``style()`` and
``new_figure()``.

The house style: constrained layout (no suptitle drawn over panel titles), human axis labels with
the unit in parentheses (``label``), integer ticks on axes that count things (``count_axis``), the
colour-blind-safe Okabe-Ito palette (``PALETTE``), legends placed where they cover no data
(``legend.loc: best``, or outside the axes), annotations inside the axes. ``figure_problems(fig)``
checks a drawn figure for the visible breaches: overlapping or clipped titles, annotations outside
their axes, fractional tick labels on a count axis.
"""

from __future__ import annotations

import re

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
    "legend.loc": "best",
}

# Colour-blind-safe palette (Okabe–Ito), in a fixed order so a rank or a schedule keeps its colour.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"]

# One colour per quantity, the same in every dashboard tab and figure (widgets take them from here,
# by name or through ``quantity_color``): memory in blue/orange/green/vermillion, time in sky blue
# (compute), reddish purple (communication, a shade per parallelism) and grey (the pipeline bubble).
QUANTITY_COLORS = {
    "params": PALETTE[0],  # parameters
    "grads": PALETTE[1],  # gradients
    "optimizer": PALETTE[2],  # optimizer states
    "master": "#7CC6A9",  # fp32 master weights (the optimizer's copy: a light green)
    "activations": PALETTE[3],
    "activations_outside": "#F2A37A",  # embedding, head and loss activations (a light vermillion)
    "temporary": PALETTE[6],  # temporary buffers
    "overhead": "#CCCCCC",  # CUDA context, allocator
    "compute": PALETTE[5],
    "recompute": "#A8D8F2",  # recomputed forward (a light compute)
    "non_matmul": "#2C8DC4",  # norms, activations functions, softmax (a darker compute)
    "fixed_per_layer": "#D3ECFA",  # per-layer fixed costs (kernel launches; the lightest compute)
    "generation": "#1F5F8B",  # RLHF rollout generation (decode-bound compute, a dark blue)
    # a pipeline schedule's ops, all compute: forward at the compute colour, backward darker, a split backward's
    # input-gradient half between them, the weight-gradient half pale (pipeline.plots.plot_timeline)
    "forward": PALETTE[5],
    "backward": "#1B5E8C",
    "backward_input": "#2F6FA6",
    "weight_grad": "#BFE3F7",
    "communication": PALETTE[4],
    "tp_comm": PALETTE[4],
    "dp_comm": "#8C4A72",
    "pp_comm": "#E3B1CD",
    "cp_comm": "#A85E8C",
    "ep_comm": "#F0D2E3",
    "bubble": "#999999",  # idle time of a pipeline
}
_QUANTITY_WORDS = (  # words in a label -> the quantity (first match wins)
    ("bubble", "bubble"),
    ("idle", "bubble"),
    ("recompute", "recompute"),
    ("tp comm", "tp_comm"),
    ("dp comm", "dp_comm"),
    ("pp comm", "pp_comm"),
    ("cp comm", "cp_comm"),
    ("ep comm", "ep_comm"),
    ("sync", "communication"),
    ("comm", "communication"),
    ("master", "master"),
    ("param", "params"),
    ("grad", "grads"),
    ("optimizer", "optimizer"),
    ("outside", "activations_outside"),
    ("activation", "activations"),
    ("temporary", "temporary"),
    ("overhead", "overhead"),
    ("gen", "generation"),
    ("compute", "compute"),
    ("train", "compute"),
    ("non-matmul", "non_matmul"),
    ("fixed per layer", "fixed_per_layer"),
)


def quantity_color(name: str) -> str:
    """The colour of the quantity a label names (``QUANTITY_COLORS``): ``"TP comm"`` -> the TP shade of
    communication, ``"optimizer states"`` -> optimizer green, ``"bubble"`` -> grey. Raises ``KeyError``
    for a label that names none of them."""
    low = name.lower().replace("_", " ")
    if low.replace(" ", "_") in QUANTITY_COLORS:
        return QUANTITY_COLORS[low.replace(" ", "_")]
    for words, quantity in _QUANTITY_WORDS:
        if words in low:
            return QUANTITY_COLORS[quantity]
    raise KeyError(f"no colour for {name!r}: name one of {sorted(QUANTITY_COLORS)}")


def style():
    """A context manager applying the package style: ``with plots.style(): ...``."""
    return matplotlib.rc_context(STYLE | {"axes.prop_cycle": matplotlib.cycler(color=PALETTE)})


def use_house_style() -> None:
    """Apply the house style to pyplot for the rest of the session (a notebook's first cell calls it), so
    an inline ``plt.subplots`` figure gets constrained layout, the palette and the fonts of ``new_figure``."""
    matplotlib.rcParams.update(STYLE | {"axes.prop_cycle": matplotlib.cycler(color=PALETTE)})


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
    for axis in (ax.xaxis, ax.yaxis):  # a count ('questions (count)', 'rank (index)'): integer ticks
        if is_count_axis(axis):
            count_axis(axis)
    if title:
        ax.set_title(title)


# the units (in an axis label's parentheses) of axes that count things: their ticks must be integers
COUNT_UNITS = ("count", "index", "rank", "ranks", "GPUs", "questions", "steps", "micro-batches", "sequences")


def count_axis(axis):
    """Mark ``axis`` (``ax.xaxis`` or ``ax.yaxis``) as counting things: integer ticks only (a
    linear axis with matplotlib's automatic ticks gets integer ones; ticks set by hand are kept;
    ``figure_problems`` checks the labels). Returns the axis."""
    from matplotlib.ticker import AutoLocator, MaxNLocator

    if axis.get_scale() == "linear" and type(axis.get_major_locator()) is AutoLocator:  # keep chosen ticks
        axis.set_major_locator(MaxNLocator(integer=True))
    axis.mlsys_count = True
    return axis


def is_count_axis(axis) -> bool:
    """True for an axis marked by ``count_axis`` or whose label's unit is one of ``COUNT_UNITS``."""
    if getattr(axis, "mlsys_count", False):
        return True
    unit = re.search(r"\(([^()]*)\)\s*$", axis.get_label_text())
    return bool(unit) and unit.group(1).strip() in COUNT_UNITS


_FRACTION = re.compile(r"\d[.,]\d*[1-9]")  # '2.5', '0.25'; not '2', '2.0', '1,000'
_SNAKE = re.compile(r"[A-Za-z]+_[A-Za-z]")  # 'true_reward', 'step_s'; mathtext ('$x_i$') is skipped


def _renderer(fig):
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure(): give it an Agg canvas
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()  # runs the layout engine, places every text
    return fig.canvas.get_renderer()


def figure_problems(fig, tol_px: float = 1.0) -> list[str]:
    """What breaks the house style in ``fig``, drawn as it will be shown (an empty list when none):

    - two titles (the suptitle, the axes' titles) whose boxes overlap, or a title cut by the figure's edge;
    - an annotation (``ax.texts``) outside its axes;
    - a tick label with a fraction (e.g. '2.5') on a count axis (``is_count_axis``);
    - an axis label that reads like a variable name ('true_reward' for 'true reward').

    Boxes are matplotlib's text window extents in pixels; ``tol_px`` is the overlap tolerated."""
    r = _renderer(fig)
    fb = fig.bbox
    titles = [fig._suptitle] if getattr(fig, "_suptitle", None) is not None else []
    for ax in fig.axes:
        titles += [ax.title, ax._left_title, ax._right_title]
    titles = [t for t in titles if t.get_visible() and t.get_text().strip()]
    boxes = [t.get_window_extent(r) for t in titles]
    out = []
    for i, (a, ba) in enumerate(zip(titles, boxes)):
        if ba.x0 < fb.x0 - tol_px or ba.x1 > fb.x1 + tol_px or ba.y0 < fb.y0 - tol_px or ba.y1 > fb.y1 + tol_px:
            out.append(f"title {a.get_text()!r} is cut by the figure's edge")
        for b, bb in zip(titles[i + 1 :], boxes[i + 1 :]):
            w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
            h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
            if w > tol_px and h > tol_px:
                out.append(f"titles {a.get_text()!r} and {b.get_text()!r} overlap")
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        ab = ax.get_window_extent(r)
        for t in ax.texts:
            if not t.get_visible() or not t.get_text().strip():
                continue
            tb = t.get_window_extent(r)
            if tb.x0 < ab.x0 - tol_px or tb.x1 > ab.x1 + tol_px or tb.y0 < ab.y0 - tol_px or tb.y1 > ab.y1 + tol_px:
                out.append(f"annotation {t.get_text()!r} lies outside its axes")
        for text in (ax.get_xlabel(), ax.get_ylabel()):  # titles may name an API ('all_reduce')
            if "$" not in text and _SNAKE.search(text):
                out.append(f"label {text!r} reads like a variable name: write it in words")
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            if not is_count_axis(axis):
                continue
            lo, hi = sorted(axis.get_view_interval())
            for tick, text in zip(axis.get_majorticklocs(), axis.get_majorticklabels()):
                s = text.get_text()
                if lo <= tick <= hi and text.get_visible() and _FRACTION.search(s):
                    out.append(f"count axis {name} ({axis.get_label_text()!r}) has a fractional tick label {s!r}")
    return out


def _laid_out(fig) -> bool:
    """A layout engine, or margins set by hand (``subplots_adjust``: the widgets' fixed layouts)."""
    if fig.get_layout_engine() is not None:
        return True
    sp = fig.subplotpars
    return any(
        getattr(sp, k) != matplotlib.rcParams[f"figure.subplot.{k}"]
        for k in ("left", "right", "bottom", "top", "wspace", "hspace")
    )


class FigureStyleError(ValueError):
    """A figure about to be rendered breaks the house style (``figure_problems`` lists how)."""


def check_figures_when_rendered():
    """Make every figure rendering (``display``, pyplot's inline flush, ``savefig``) raise
    ``FigureStyleError`` when ``figure_problems`` finds a breach or the figure has neither a layout
    engine nor margins set by hand (it was not drawn in the house style); returns a function that undoes it.

    The test suite installs it in every notebook kernel (``tests/kernel_startup.py``, through
    ``PYTHONSTARTUP``), so an inline ``plt.subplots`` figure in a notebook is held to the same style as
    the package's figure functions: IPython shows the error as the cell's error output, which fails
    the notebook's run under nbval and papermill."""
    from matplotlib.backend_bases import FigureCanvasBase

    original = FigureCanvasBase.print_figure
    if getattr(original, "_checks_house_style", False):
        return lambda: None

    def print_figure(self, *args, **kwargs):
        problems = figure_problems(self.figure)
        if not _laid_out(self.figure):
            problems.append("no layout: draw it with plots.new_figure, or call plots.use_house_style() first")
        if problems:
            title = next((a.get_title() for a in self.figure.axes if a.get_title()), "untitled")
            raise FigureStyleError(f"figure {title!r} breaks the house style (mlsys_nb.plots): " + "; ".join(problems))
        return original(self, *args, **kwargs)

    print_figure._checks_house_style = True
    FigureCanvasBase.print_figure = print_figure

    def undo():
        FigureCanvasBase.print_figure = original

    return undo


PERCENT_COLUMNS = ("mfu", "hfu", "share", "bubble_fraction", "heldout_error", "error")


def table(df, *, percent=PERCENT_COLUMNS, digits: int = 3):
    """``df`` as a formatted table for a notebook (a pandas ``Styler``; ``display`` it): columns
    whose name ends in ``bytes`` in GB with one decimal, columns named in ``percent`` (fractions,
    e.g. MFU 0.41) as percentages with one decimal, other floats to ``digits`` significant digits,
    integers with thousands separators; numbers right-aligned. A Series (one record) is shown as
    one column, each value formatted by its index name. The data is not changed."""
    import numbers

    import pandas as pd

    from .config import check_int

    check_int("digits", digits, 1, 12)

    def fmt_for(col):
        name = str(col).lower()
        if name.endswith("bytes"):
            return lambda v: f"{v / 1e9:,.1f} GB" if isinstance(v, numbers.Real) and v == v else str(v)
        if name in percent:
            return lambda v: f"{100 * v:.1f} %" if isinstance(v, numbers.Real) and v == v else str(v)
        return lambda v: (
            f"{v:,d}"
            if isinstance(v, numbers.Integral) and not isinstance(v, bool)
            else f"{v:.{digits}g}"
            if isinstance(v, numbers.Real) and not isinstance(v, bool)
            else str(v)
        )

    if isinstance(df, pd.Series):  # one record (e.g. a row of a search): each value by its own name
        df = pd.DataFrame(
            {df.name if df.name is not None else "value": [fmt_for(k)(v) for k, v in df.items()]}, index=df.index
        )
    styler = df.style.format({c: fmt_for(c) for c in df.columns})
    return styler.set_table_styles(
        [{"selector": "td", "props": "text-align: right; font-variant-numeric: tabular-nums"}]
    )


def human_number(x: float, sci_from: float = 1e12) -> str:
    """A number as a reader takes it in: ``1e23 -> '1e23'``, ``8.39e23 -> '8.39e23'`` (from ``sci_from`` on,
    never ``'100,000,000,000,000,008,388,608'``), ``1234567.4 -> '1,234,567'``, ``0.1234 -> '0.1234'``;
    ``human_number(14.6e9, sci_from=1e5) -> '1.46e10'``."""
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        return str(x)
    if abs(x) >= sci_from or (x != 0 and abs(x) < 1e-4):
        mant, exp = f"{x:.3g}".split("e") if "e" in f"{x:.3g}" else (f"{x:.3g}", "0")
        return f"{mant}e{int(exp)}"
    if abs(x) >= 1e5:
        return f"{x:,.0f}"
    return f"{x:,.4g}"


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
