"""Timeline (Gantt) charts for pipeline schedules: one row per rank, one box per op.

``plot_timeline(x)`` takes a ``SimResult``, a ``RealRun`` or a timeline DataFrame. ``color_by="kind"``
colours F / B / W (input-gradient-only B hatched lighter); ``color_by="microbatch"`` gives each
micro-batch its colour and shades F (full), B (lighter), W (lightest). Small charts label each
box with its micro-batch.
"""

from __future__ import annotations

from functools import lru_cache

import matplotlib.colors as mcolors

from ..plots import PALETTE, label, new_figure, style

KIND_COLORS = {"F": PALETTE[0], "B": PALETTE[1], "W": PALETTE[2]}
SHADE = {"F": 0.0, "B": 0.45, "W": 0.7}  # how much white is mixed in when colouring by micro-batch
MAX_LABELS = 400


def _frame(x):
    return x.timeline if hasattr(x, "timeline") else x


def _mix(color, white):
    r, g, b = mcolors.to_rgb(color)
    return (r + (1 - r) * white, g + (1 - g) * white, b + (1 - b) * white)


@lru_cache(maxsize=1024)
def _glyphs(text: str, size: float):
    """``text`` as a path in points, centred on (0, 0) (cached: the same digits recur)."""
    from matplotlib.path import Path
    from matplotlib.textpath import TextPath

    tp = TextPath((0, 0), text, size=size)
    ext = tp.get_extents()
    return Path(tp.vertices - [(ext.x0 + ext.x1) / 2, (ext.y0 + ext.y1) / 2], tp.codes)


def _box_labels(ax, tl, st, en, ranks, faces):
    """Each box's micro-batch number, where it fits inside the box, as ONE collection of glyph
    paths: one ``Text`` per box made label drawing most of a redraw."""
    import numpy as np
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import IdentityTransform

    if not len(tl):
        return
    x0, x1 = ax.get_xlim()
    pos = ax.get_position()
    width_pt = pos.width * ax.figure.get_figwidth() * 72  # axes width in points
    size = 6.0 if len(tl) > 150 else 7.0
    text = tl.microbatch.astype(str).to_numpy()
    need = np.fromiter(map(len, text), float, len(text)) * 0.62 * size + 2  # digit advance ~0.62 em, plus a margin
    fits = (en - st) / (x1 - x0) * width_pt >= need
    if not fits.any():
        return
    paths = [_glyphs(t, size) for t in text[fits]]
    rgb = np.asarray(faces, float)[fits, :3]
    ink = np.where((rgb @ [0.299, 0.587, 0.114] < 0.45)[:, None], 1.0, 0.0).repeat(3, 1)  # white on dark
    offsets = np.stack([(st[fits] + en[fits]) / 2, ranks[fits]], 1)
    # sizes=1 makes one path unit one point (Collection scales by sqrt(size) * dpi / 72)
    ax.add_collection(
        PathCollection(
            paths,
            sizes=[1.0],
            offsets=offsets,
            offset_transform=ax.transData,
            transform=IdentityTransform(),
            facecolors=ink,
            linewidths=0,
        ),
        autolim=False,
    )


def plot_timeline(
    x,
    ax=None,
    *,
    color_by: str = "kind",
    title: str | None = None,
    unit: str = "time units",
    scale: float = 1.0,
    p: int | None = None,
):
    """Draw the timeline on ``ax`` (or a new figure) and return the Figure. ``scale`` multiplies
    times (e.g. 1e3 with ``unit="ms"`` for a real run in seconds)."""
    if color_by not in ("kind", "microbatch"):
        raise ValueError(f"color_by must be 'kind' or 'microbatch', got {color_by!r}")
    tl = _frame(x)
    if ax is None:
        fig, ax = new_figure(figsize=(9, 3.2))
    fig = ax.figure
    p = p or (int(tl["rank"].max()) + 1 if len(tl) else 1)
    m = int(tl.microbatch.max()) + 1 if len(tl) else 1
    cmap = mcolors.ListedColormap(PALETTE[:7]) if m <= 7 else __import__("matplotlib").colormaps["turbo"]
    with style():
        import numpy as np
        from matplotlib.collections import PolyCollection

        ranks, st, en = tl["rank"].to_numpy(float), tl.start.to_numpy(float) * scale, tl.end.to_numpy(float) * scale
        verts = np.stack(
            [
                np.stack([st, ranks - 0.4], 1),
                np.stack([st, ranks + 0.4], 1),
                np.stack([en, ranks + 0.4], 1),
                np.stack([en, ranks - 0.4], 1),
            ],
            1,
        )
        if color_by == "kind":
            table = {
                (k, f): mcolors.to_rgb(KIND_COLORS[k] if (k != "B" or f) else _mix(KIND_COLORS["B"], 0.35))
                for k in KIND_COLORS
                for f in (True, False)
            }
            faces = [table[(k, bool(f))] for k, f in zip(tl.kind, tl.full)]
        else:
            base = [cmap(j / max(m - 1, 1)) if m > 7 else cmap(j) for j in range(m)]
            shades = {(j, k): _mix(base[j], SHADE[k]) for j in range(m) for k in SHADE}
            faces = [shades[(j, k)] for j, k in zip(tl.microbatch, tl.kind)]
        many = len(tl) > 600
        ax.add_collection(
            PolyCollection(
                verts, facecolors=faces, edgecolors="white", linewidths=0.0 if many else 0.4, antialiased=not many
            )
        )
        if len(tl):
            ax.set_xlim(0, float(en.max()) * 1.01 if en.max() > 0 else 1)
        if len(tl) <= MAX_LABELS:
            _box_labels(ax, tl, st, en, ranks, faces)
        ax.set_yticks(range(p) if p <= 16 else range(0, p, max(1, p // 8)))
        ax.set_ylim(p - 0.5, -0.5)
        ax.grid(axis="y", visible=False)
        label(ax, f"time ({unit})", "rank (index)", title)
        if color_by == "kind":
            from matplotlib.patches import Patch

            handles = [
                Patch(color=KIND_COLORS["F"], label="F forward"),
                Patch(color=KIND_COLORS["B"], label="B backward"),
                Patch(color=_mix(KIND_COLORS["B"], 0.35), label="B input-grad only"),
                Patch(color=KIND_COLORS["W"], label="W weight-grad"),
            ]
            kinds = set(tl.kind)
            split = bool(len(tl)) and not tl[tl.kind == "B"].full.all()
            handles = [
                h for h in handles if h.get_label()[0] in kinds and (h.get_label() != "B input-grad only" or split)
            ]
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return fig


def plot_sim_vs_real(sim, real, *, color_by: str = "kind", sim_unit: str = "time units", sim_scale: float = 1.0):
    """Two stacked timelines: the simulation above the real run (ms). Simulate with measured
    costs in seconds and pass ``sim_unit="ms", sim_scale=1e3`` to share the unit."""
    fig, (a1, a2) = new_figure(2, 1, figsize=(9, 5.4))
    plot_timeline(sim, a1, color_by=color_by, unit=sim_unit, scale=sim_scale, title=f"{sim.schedule.name}: simulated")
    plot_timeline(
        real,
        a2,
        color_by=color_by,
        unit="ms",
        scale=1e3,
        title=f"{real.schedule.name}: measured on {real.schedule.p} ranks",
    )
    return fig
