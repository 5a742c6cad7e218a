"""Pipeline schedule explorer: pick a schedule, p, m, v and op costs; see the simulated timeline.

``PipelineWidget().widget`` is the ipywidgets container. Everything shown comes from
``mlsys_nb.pipeline.simulate`` and ``mlsys_nb.pipeline.compare`` (a simulation; notebook 08
checks it against closed forms and real ranks). Invalid combinations (e.g. dualpipe with odd p,
interleaving with m not a multiple of p, v ≠ 1 for a one-chunk schedule) are shown as a message
with the nearest valid values (``nearest_valid``) beside the last valid chart, dimmed.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pandas as pd
from matplotlib import rc_context
from matplotlib.collections import PolyCollection

from ..pipeline import SCHEDULES, ScheduleError, check_args
from ..pipeline.compare import cached_schedule, cached_simulation, compare_schedules
from ..pipeline.plots import idle_blocks, plot_timeline  # noqa: F401  (idle_blocks: re-exported)
from ..plots import QUANTITY_COLORS, label, style
from .base import ControlPanel

DEFAULTS = {"schedule": "1f1b", "p": 4, "m": 8, "v": 1, "F": 1.0, "B": 1.0, "W": 1.0, "comm": 0.0, "color_by": "kind"}


LIMITS = {"m": (1, 128), "v": (1, 8), "p": (1, 32)}  # the sliders' ranges


def nearest_valid(schedule: str, p: int, m: int, v: int, limits: dict = LIMITS) -> dict[str, list[int]]:
    """For each of m, v, p (in that order) the nearest values within ``limits`` (name -> (lo, hi))
    below and above the given one that make a valid combination with the other two unchanged
    (``pipeline.check_args``); a name with no valid value is left out. E.g. interleaved-1f1b,
    p = 4, m = 6, v = 2 -> {"m": [4, 8], "p": [3, 6]}."""
    now = {"p": p, "m": m, "v": v}
    out = {}
    for name in ("m", "v", "p"):
        lo, hi = limits[name]
        found = []
        for side in (range(now[name] - 1, lo - 1, -1), range(now[name] + 1, hi + 1)):
            for x in side:
                try:
                    check_args(schedule, **(now | {name: x}))
                except ScheduleError:
                    continue
                found.append(x)
                break
        if found:
            out[name] = sorted(found)
    return out


def suggestion(near: dict[str, list[int]]) -> str:
    """``nearest_valid``'s answer in words: 'try m = 4 or 8, or p = 3 or 6'."""
    return "try " + ", or ".join(f"{k} = {' or '.join(map(str, xs))}" for k, xs in near.items()) if near else ""


@lru_cache(maxsize=32)
def _compare_html(*args) -> str:
    return compare_schedules(*args).to_html(index=False, float_format=lambda x: f"{x:.3f}", na_rep="")


class PipelineWidget(ControlPanel):
    """Controls: schedule, p, m, v, F/B/W costs, comm latency. Shows a Gantt chart per rank, peak
    activations per rank, makespan and both bubble conventions, and a table of all schedules."""

    png_dpi = 80  # a wide Gantt chart: 800 px across is enough
    error_label = "Invalid combination"
    keep_stale_figure = True  # an invalid combination dims the last valid chart beside its message

    def __init__(self, **state):
        import ipywidgets as w

        s = DEFAULTS | state
        lay = w.Layout(width="330px")
        controls = {
            "schedule": w.Dropdown(options=list(SCHEDULES), value=s["schedule"], description="schedule", layout=lay),
            "p": w.IntSlider(value=s["p"], min=1, max=32, description="stages p", layout=lay),
            "m": w.IntSlider(value=s["m"], min=1, max=128, description="micro-batches m", layout=lay),
            "v": w.IntSlider(value=s["v"], min=1, max=8, description="chunks v", layout=lay),
            "F": w.FloatSlider(value=s["F"], min=0.1, max=4, step=0.1, description="F cost", layout=lay),
            "B": w.FloatSlider(value=s["B"], min=0.1, max=4, step=0.1, description="B cost (input grad)", layout=lay),
            "W": w.FloatSlider(value=s["W"], min=0.0, max=4, step=0.1, description="W cost (weight grad)", layout=lay),
            "comm": w.FloatSlider(value=s["comm"], min=0.0, max=2, step=0.05, description="comm latency", layout=lay),
            "color_by": w.ToggleButtons(options=["kind", "microbatch"], value=s["color_by"], description="colour by"),
        }
        note = w.HTML(
            "<small>Simulation. Costs are per micro-batch over L/p layers; a schedule that "
            "does not split the backward runs B+W as one op; chunks cost their share.</small>"
        )
        from matplotlib.figure import Figure

        with style():  # fixed margins, no layout engine: a slider move must redraw fast
            figure = Figure(figsize=(10, 3.4), layout="none")
            self._ax, self._ax_mem = figure.subplots(1, 2, width_ratios=[4, 1])
            figure.subplots_adjust(left=0.09, right=0.98, bottom=0.16, top=0.9, wspace=0.6)
        # fixed axis-label positions (axes fractions measured from the automatic ones for 1- and
        # 2-digit ranks): the automatic placement measures every tick label again on each redraw
        for axis, xy in (
            (self._ax.xaxis, (0.5, -0.11)),
            (self._ax.yaxis, (-0.057, 0.5)),
            (self._ax_mem.xaxis, (0.5, -0.11)),
            (self._ax_mem.yaxis, (-0.076, 0.5)),
        ):
            axis.set_label_coords(*xy)
        self._build(controls, figure, columns=(5,), label_width="140px", beside=[note])
        self.controls["schedule"].observe(self._on_schedule, names="value")

    def _on_schedule(self, change):
        """Picking a schedule moves v to that schedule's own chunk count (1, or 2)."""
        if not self._hold:
            natural = check_args(change["new"], 1 if change["new"] != "dualpipe" else 2, 64)
            self.set_state({"v": natural})  # one redraw, with the new v

    def _on_change(self, change):
        if not self._hold and change["owner"] is not self.controls["schedule"]:
            self._redraw()

    # ---- the template: compute, rows, headline, draw, details --------------------------------
    def compute(self, state: dict) -> dict:
        """The schedule and its simulation (cached); raises ``ScheduleError`` on an invalid combination."""
        s = state
        try:
            check_args(s["schedule"], s["p"], s["m"], s["v"])
        except ScheduleError as e:
            hint = suggestion(nearest_valid(s["schedule"], s["p"], s["m"], s["v"]))
            raise ScheduleError(f"{e}: {hint}" if hint else str(e)) from None
        sched = cached_schedule(s["schedule"], s["p"], s["m"], s["v"])
        res = cached_simulation(s["schedule"], s["p"], s["m"], s["v"], s["F"], s["B"], s["W"], s["comm"])
        args = (s["p"], s["m"], s["v"], s["F"], s["B"], s["W"], s["comm"])
        return {"schedule": sched, "simulation": res, "compare_args": args, "color_by": s["color_by"]}

    def rows(self, r: dict) -> pd.DataFrame:
        """Every schedule at these p, m, v and costs (``pipeline.compare.compare_schedules``)."""
        return compare_schedules(*r["compare_args"])

    def headline(self, r: dict) -> str:
        res = r["simulation"]
        return (
            f"makespan <b>{res.makespan:.2f}</b> &nbsp; bubble fraction (idle/total) "
            f"<b>{res.bubble_fraction:.3f}</b> &nbsp; bubble ratio (idle/busy) "
            f"<b>{res.bubble_ratio:.3f}</b> &nbsp; peak activations rank 0 "
            f"<b>{res.peak_activations[0]:.2f}</b>, max <b>{max(res.peak_activations):.2f}</b>"
        )

    def details(self, r: dict) -> str:
        """The comparison table, rendered (cached)."""
        return _compare_html(*r["compare_args"])

    def draw(self, r: dict) -> None:
        sched, res = r["schedule"], r["simulation"]
        for ax in (self._ax, self._ax_mem):  # drop the drawn data but keep the axes and their ticks:
            for art in [*ax.collections, *ax.patches, *ax.texts]:  # ax.clear() would rebuild every
                art.remove()  # tick, the slowest part of a redraw
            if ax.get_legend() is not None:
                ax.get_legend().remove()
        shaded = " · hatched: later chunks" if sched.v > 1 else ""
        with rc_context({"axes.titley": 1.0}):  # a fixed title height: no tick-label measuring
            plot_timeline(
                res,
                self._ax,
                color_by=r["color_by"],
                title=f"{sched.name}, p={sched.p}, m={sched.m}, v={sched.v} (simulated) · grey: idle{shaded}",
            )
        with style():
            peak = np.asarray(res.peak_activations, float)  # one bar per rank, as ONE collection
            y = np.arange(sched.p, dtype=float)
            z = np.zeros_like(y)
            self._ax_mem.add_collection(
                PolyCollection(
                    np.stack(
                        [
                            np.stack([z, y - 0.4], 1),
                            np.stack([z, y + 0.4], 1),
                            np.stack([peak, y + 0.4], 1),
                            np.stack([peak, y - 0.4], 1),
                        ],
                        1,
                    ),
                    facecolors=QUANTITY_COLORS["activations"],
                    edgecolors="none",
                ),
                autolim=False,
            )
            self._ax_mem.set_ylim(sched.p - 0.5, -0.5)
            self._ax_mem.set_yticks(range(sched.p))  # same rows as the chart, labels off (not empty
            self._ax_mem.tick_params(labelleft=False)  # texts: each one is laid out on every redraw)
            self._ax_mem.set_xlim(0, max(res.peak_activations) * 1.1)
            label(self._ax_mem, "peak activ. (mb × L/p)", "rank (same rows)")
