"""Timeline (Gantt) charts for pipeline schedules: one row per rank, one box per op.

``plot_timeline(x)`` takes a ``SimResult``, a ``RealRun`` or a timeline DataFrame. Colours come from
``plots.QUANTITY_COLORS``, as in the dashboard: the ops are compute, in shades of the compute colour
(``color_by="kind"``: forward mid, backward dark, input-gradient-only backward lighter, weight-gradient pale), and
the time a rank runs no op is drawn as explicit blocks in the bubble's grey (``idle_blocks``); an interleaved
schedule's later chunks are hatched (``draw_idle_and_chunks``). ``color_by="microbatch"`` gives each micro-batch
its colour and shades F (full), B (lighter), W (lightest). Boxes stay apart at 32 and more micro-batches: thin
white edges while a box is wider than ``EDGE_MIN_PT`` points, else every other micro-batch lighter. Small charts
label each box with its micro-batch.
"""

from __future__ import annotations

from functools import lru_cache

import matplotlib.colors as mcolors

import numpy as np

from ..plots import PALETTE, QUANTITY_COLORS, label, new_figure, style

KIND_COLORS = {  # every op is compute: shades of the compute colour (plots.QUANTITY_COLORS)
    "F": QUANTITY_COLORS["forward"],
    "B": QUANTITY_COLORS["backward"],
    "W": QUANTITY_COLORS["weight_grad"],
}
B_INPUT_ONLY = QUANTITY_COLORS["backward_input"]  # a split backward's input-gradient half (zero-bubble schedules)
SHADE = {"F": 0.0, "B": 0.45, "W": 0.7}  # how much white is mixed in when colouring by micro-batch
MAX_LABELS = 400
EDGE_MIN_PT = 3.0  # narrower boxes get no white edge (it would eat them): every other micro-batch is lighter instead
ODD_LIGHTER = 0.22  # how much white is mixed into an odd micro-batch's box when boxes have no edges


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


def _width_pt(ax, st, en):
    """Each box's width in points, at the axes' current x range and size."""
    x0, x1 = ax.get_xlim()
    width_pt = ax.get_position().width * ax.figure.get_figwidth() * 72  # axes width in points
    return (en - st) / (x1 - x0) * width_pt


def _box_labels(ax, tl, st, en, ranks, faces):
    """Each box's micro-batch number, where it fits inside the box, as ONE collection of glyph
    paths: one ``Text`` per box made label drawing most of a redraw."""
    from matplotlib.collections import PathCollection
    from matplotlib.transforms import IdentityTransform

    if not len(tl):
        return
    size = 6.0 if len(tl) > 150 else 7.0
    text = tl.microbatch.astype(str).to_numpy()
    need = np.fromiter(map(len, text), float, len(text)) * 0.62 * size + 2  # digit advance ~0.62 em, plus a margin
    fits = _width_pt(ax, st, en) >= need
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


def _faces(tl, color_by: str, m: int) -> np.ndarray:
    """Each op's RGB face colour (an (n, 3) array): by kind (compute shades) or by micro-batch."""
    if color_by == "kind":
        table = {
            (k, f): mcolors.to_rgb(KIND_COLORS[k] if (k != "B" or f) else B_INPUT_ONLY)
            for k in KIND_COLORS
            for f in (True, False)
        }
        return np.array([table[(k, bool(f))] for k, f in zip(tl.kind, tl.full)], float).reshape(-1, 3)
    import matplotlib

    cmap = mcolors.ListedColormap(PALETTE[:7]) if m <= 7 else matplotlib.colormaps["turbo"]
    base = [cmap(j / max(m - 1, 1)) if m > 7 else cmap(j) for j in range(m)]
    shades = {(j, k): _mix(base[j], SHADE[k]) for j in range(m) for k in SHADE}
    return np.array([shades[(j, k)] for j, k in zip(tl.microbatch, tl.kind)], float).reshape(-1, 3)


def idle_blocks(timeline, makespan: float) -> list[tuple[int, float, float]]:
    """``(rank, start, end)`` of every stretch in [0, ``makespan``] where a rank runs no op (the bubble, in the
    timeline's time units): per rank, the gaps of the union of its ops' intervals."""
    out = []
    for rank, ops in timeline.groupby("rank"):
        t = 0.0
        for start, end in sorted(zip(ops.start, ops.end)):
            if start > t + 1e-12:
                out.append((int(rank), t, float(start)))
            t = max(t, float(end))
        if makespan > t + 1e-12:
            out.append((int(rank), t, float(makespan)))
    return out


def _boxes(rows) -> np.ndarray:
    """(rank, start, end) rows as the rectangles of a ``PolyCollection`` (a rank's row is 0.8 high)."""
    r = np.asarray(rows, float).reshape(-1, 3)
    y, st, en = r[:, 0], r[:, 1], r[:, 2]
    corners = [(st, y - 0.4), (st, y + 0.4), (en, y + 0.4), (en, y - 0.4)]
    return np.stack([np.stack(c, 1) for c in corners], 1)


def draw_idle_and_chunks(ax, timeline, makespan: float, scale: float = 1.0) -> None:
    """Draw the idle time as explicit blocks in the bubble's grey (``plots.QUANTITY_COLORS["bubble"]``, gid
    ``"idle"``) and hatch the ops of every odd chunk of an interleaved schedule (gid ``"chunks"``), over
    ``plot_timeline``'s boxes (which calls it). Times are multiplied by ``scale``. Drawn once per axes: a second
    call finds the gids and adds nothing."""
    from matplotlib.collections import PolyCollection

    drawn = {c.get_gid() for c in ax.collections}
    idle = idle_blocks(timeline, makespan)
    if idle and "idle" not in drawn:
        rows = np.asarray(idle, float) * [1.0, scale, scale]
        ax.add_collection(
            PolyCollection(_boxes(rows), facecolors=QUANTITY_COLORS["bubble"], alpha=0.45, edgecolors="none"),
            autolim=False,
        ).set_gid("idle")
    odd = timeline[timeline.chunk % 2 == 1] if "chunk" in timeline else timeline.iloc[:0]
    if len(odd) and "chunks" not in drawn:
        hatch = PolyCollection(
            _boxes(np.stack([odd["rank"], odd.start * scale, odd.end * scale], 1)),
            facecolors="none",
            edgecolors=(0.0, 0.0, 0.0, 0.35),
            linewidths=0,
            hatch="///",
        )
        hatch.set_gid("chunks")
        ax.add_collection(hatch, autolim=False)


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
    """Draw the timeline on ``ax`` (or a new figure) and return the Figure: the ops in compute shades (or by
    micro-batch), the idle time as grey blocks and an interleaved schedule's later chunks hatched
    (``draw_idle_and_chunks``). ``scale`` multiplies times (e.g. 1e3 with ``unit="ms"`` for a real run in
    seconds)."""
    if color_by not in ("kind", "microbatch"):
        raise ValueError(f"color_by must be 'kind' or 'microbatch', got {color_by!r}")
    tl = _frame(x)
    if ax is None:
        fig, ax = new_figure(figsize=(9, 3.2))
    fig = ax.figure
    p = p or (int(tl["rank"].max()) + 1 if len(tl) else 1)
    m = int(tl.microbatch.max()) + 1 if len(tl) else 1
    with style():
        from matplotlib.collections import PolyCollection
        from matplotlib.patches import Patch

        ranks, st, en = tl["rank"].to_numpy(float), tl.start.to_numpy(float) * scale, tl.end.to_numpy(float) * scale
        if len(tl):
            ax.set_xlim(0, float(en.max()) * 1.01 if en.max() > 0 else 1)
        faces = _faces(tl, color_by, m)
        edged = bool(len(tl)) and float(np.median(_width_pt(ax, st, en))) >= EDGE_MIN_PT
        if not edged and len(tl):  # boxes too narrow for edges: every other micro-batch lighter keeps them apart
            odd = (tl.microbatch.to_numpy() % 2 == 1)[:, None]
            faces = np.where(odd, faces + (1 - faces) * ODD_LIGHTER, faces)
        many = len(tl) > 600
        ax.add_collection(
            PolyCollection(
                _boxes(np.stack([ranks, st, en], 1)),
                facecolors=faces,
                edgecolors="white",
                linewidths=0.4 if edged else 0.0,
                antialiased=not many,
            )
        )
        makespan = float(getattr(x, "makespan", None) or (tl.end.max() if len(tl) else 0.0))
        draw_idle_and_chunks(ax, tl, makespan, scale)
        if len(tl) <= MAX_LABELS:
            _box_labels(ax, tl, st, en, ranks, faces)
        ax.set_yticks(range(p) if p <= 16 else range(0, p, max(1, p // 8)))
        ax.set_ylim(p - 0.5, -0.5)
        ax.grid(axis="y", visible=False)
        label(ax, f"time ({unit})", "rank (index)", title)
        handles = []
        if color_by == "kind":
            b = tl[tl.kind == "B"]
            kinds = set(tl.kind) - ({"B"} if len(b) and not b.full.any() else set())  # only split backwards
            split = bool(len(b)) and not b.full.all()
            handles = [
                Patch(color=c, label=name)
                for k, c, name in (
                    ("F", KIND_COLORS["F"], "F forward"),
                    ("B", KIND_COLORS["B"], "B backward"),
                    ("B'", B_INPUT_ONLY, "B input-grad only"),
                    ("W", KIND_COLORS["W"], "W weight-grad"),
                )
                if (k in kinds) or (k == "B'" and split)
            ]
        gids = {c.get_gid() for c in ax.collections}
        if "idle" in gids:
            handles.append(Patch(color=QUANTITY_COLORS["bubble"], alpha=0.45, label="idle (bubble)"))
        if "chunks" in gids:
            handles.append(Patch(facecolor="white", edgecolor=(0.0, 0.0, 0.0, 0.35), hatch="///", label="later chunks"))
        if handles:
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
