"""Planner explorer: a model, a cluster and a batch in; the best parallel layouts
(``mlsys_nb.planner.search``) out, with the chosen layout's step-time and memory breakdown
(``mlsys_nb.planner.evaluate``) as two stacked bars. Everything shown is a model, not a measurement.

``PlannerWidget().widget`` is the ipywidgets container; ``state()``/``set_state()``, ``figure``,
``table()`` and ``error`` follow the dashboard protocol. Invalid input (a batch that is not whole
sequences, 0 GPUs, a model that fits nowhere) is shown as a message in place of the chart.
"""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from .. import hardware, memory, planner
from ..config import check_int

from ..plots import quantity_color, style
from .base import ControlPanel

DEFAULTS = {
    "model": "llama-3-70b",
    "gpu": "H100-SXM",
    "gpus": 256,
    "gpus_per_node": 8,
    "seq_len": 4096,
    "sequences": 1024,
    "show": 0,
}
SEQ_LENS = (1024, 2048, 4096, 8192, 16384, 32768, 131072)
TOP = 10
TIME_PARTS = (
    "compute",
    "recompute",
    "non-matmul",
    "fixed per layer",
    "TP comm",
    "CP comm",
    "EP comm",
    "PP comm",
    "bubble",
    "DP comm",
)
# the layouts table: column -> (heading, format); numbers right-aligned in fixed decimals
TABLE_COLUMNS = {
    "dp": ("DP", "{:d}"),
    "tp": ("TP", "{:d}"),
    "pp": ("PP", "{:d}"),
    "cp": ("CP", "{:d}"),
    "ep": ("EP", "{:d}"),
    "zero": ("ZeRO", "{:d}"),
    "recompute": ("recompute", "{}"),
    "layers_recomputed": ("recomputed layers / stage", "{}"),  # Megatron-LM's --recompute-num-layers
    "micro_batch": ("micro-batch", "{:d}"),
    "schedule": ("schedule", "{}"),
    "v": ("v", "{:d}"),
    "step_s": ("step (s)", "{:.3f}"),
    "mfu": ("MFU (%, model)", "{:.1f}"),
    "memory_GB": ("memory (GB)", "{:.1f}"),
    "bottleneck": ("bottleneck", "{}"),
}
# every column in view: headings wrap (a long one takes two lines, not the table's width), numbers stay on
# one line, and a page narrower than the table scrolls it sideways instead of cutting its last column
TABLE_STYLE = (
    "<style>.mlsys-planner-layouts td,.mlsys-planner-layouts th{padding:1px 6px;text-align:right;"
    "font-variant-numeric:tabular-nums;white-space:nowrap}.mlsys-planner-layouts td.text{text-align:left}"
    ".mlsys-planner-layouts tr:first-child th{white-space:normal;max-width:7em;vertical-align:bottom}"
    ".mlsys-planner-scroll{overflow-x:auto;max-width:100%}</style>"
)
MEM_PARTS = (
    ("parameters", "params"),
    ("gradients", "grads"),
    ("optimizer", "optimizer"),
    ("master", "master"),
    ("activations", "activations"),
    ("temporary", "temporary"),
    ("overhead", "overhead"),
)


@lru_cache(maxsize=64)
def best_layouts(model: str, **kw):
    """``planner.search(model, **kw, top=TOP)`` (``kw``: gpus, gpu, global_batch_tokens, seq_len, gpus_per_node):
    the ``TOP`` best layouts as a DataFrame (modelled step time in s, memory in bytes), remembered for the
    process, so that every planner tab and dashboard asking for the same model, cluster and batch shares one
    search (0.6-1.9 s each, measured here). The DataFrame is only read (``table()`` hands out copies)."""
    return planner.search(model, **kw, top=TOP)


class PlannerWidget(ControlPanel):
    """Controls: model preset, GPU, number of GPUs, GPUs per node, sequence length, sequences per
    step (the global batch is sequences x seq_len tokens) and which of the best layouts to break down."""

    # the error messages' names in words (``base.in_words``)
    words = {"gpus": "GPUs", "gpu": "GPU", "sequences": "sequences per step"}

    error_label = "No layout"

    def __init__(self, **state):
        import ipywidgets as w
        from matplotlib.figure import Figure

        s = DEFAULTS | state
        lay = w.Layout(width="320px")
        controls = {
            "model": w.Dropdown(options=memory.presets(), value=s["model"], description="model", layout=lay),
            "gpu": w.Dropdown(options=list(hardware.gpus()), value=s["gpu"], description="GPU", layout=lay),
            "gpus": w.IntText(value=s["gpus"], description="GPUs", layout=lay),
            "gpus_per_node": w.IntText(value=s["gpus_per_node"], description="GPUs per node", layout=lay),
            "seq_len": w.Dropdown(options=SEQ_LENS, value=s["seq_len"], description="seq_len (tokens)", layout=lay),
            "sequences": w.IntText(value=s["sequences"], description="sequences / step", layout=lay),
            "show": w.IntSlider(value=s["show"], min=0, max=TOP - 1, description="break down #", layout=lay),
        }
        with style():
            figure = Figure(figsize=(9.0, 2.6), layout="none")
            self._ax_t, self._ax_m = figure.subplots(1, 2)
        figure.subplots_adjust(left=0.03, right=0.99, top=0.86, bottom=0.38, wspace=0.08)
        self._build(controls, figure, columns=(4,), label_width="120px")

    # ---- the template: compute, rows, headline, draw, details --------------------------------
    def compute(self, state: dict) -> dict:
        """The best layouts (``"layouts"``, a DataFrame) and the chosen one's plan (``"plan"``);
        raises ValueError/KeyError/TypeError on bad input."""
        s = state
        seq = s["seq_len"]
        kw = dict(
            gpus=s["gpus"],
            gpu=s["gpu"],
            global_batch_tokens=s["sequences"] * seq,
            seq_len=seq,
            gpus_per_node=s["gpus_per_node"],
        )
        check_int("sequences", s["sequences"], 1)
        if hardware.gpu(s["gpu"]).nvlink is None:  # the planner's node is NVLink-connected; the widget has no link
            with_nvlink = [g for g in hardware.gpus() if hardware.gpu(g).nvlink is not None]
            raise ValueError(
                f"{s['gpu']} has no NVLink: the planner models the GPUs of a node joined by NVLink; choose one of "
                f"{', '.join(with_nvlink)}"
            )

        df = best_layouts(s["model"], **kw)
        row = df.iloc[min(s["show"], len(df) - 1)]
        fields = planner.Layout.__dataclass_fields__  # every column that defines the layout (recompute_layers too)
        plan = planner.evaluate(s["model"], planner.Layout(**{f: row[f] for f in fields}), **kw)
        upper = planner.evaluate(s["model"], plan.layout, **kw, calibration=None)  # datasheet peaks
        return {"layouts": df, "plan": plan, "upper": upper, "shown": min(s["show"], len(df) - 1)}

    def rows(self, r: dict) -> pd.DataFrame:
        return r["layouts"]

    def headline(self, r: dict) -> str:
        plan = r["plan"]
        lay = plan.layout
        return (
            f"<b>#{r['shown']}</b>: dp {lay.dp} &times; tp {lay.tp} &times; pp {lay.pp} &times; "
            f"cp {lay.cp} (ep {lay.ep}), ZeRO-{lay.zero}, {lay.recompute} recompute, micro-batch {lay.micro_batch}, "
            f"{lay.schedule}{f' v={lay.v}' if lay.v > 1 else ''}: modelled step <b>{plan.step_s:.2f} s</b>, "
            f"MFU <b>{plan.mfu:.0%}</b> (calibrated model: efficiencies fitted on published runs; "
            f"uncalibrated upper bound {r['upper'].mfu:.0%}; not measured), {plan.memory_bytes / 1e9:.1f} GB of "
            f"{plan.gpu_memory_bytes / 1e9:.0f} GB. Bottleneck: {plan.bottleneck}."
        )

    def details(self, r: dict) -> str:
        """The best layouts as an aligned table (``TABLE_COLUMNS``: memory in GB, MFU in % of the
        calibrated model, recomputed layers per stage with full recomputation: "all" or how many, "-" without;
        numbers right-aligned in fixed decimals, text left-aligned)."""
        import html

        lay = r["layouts"]
        recomputed = [
            ("all" if k == 0 else str(k)) if rc == "full" else "-" for rc, k in zip(lay.recompute, lay.recompute_layers)
        ]
        df = lay.assign(memory_GB=lay.memory_bytes / 1e9, mfu=100 * lay.mfu, layers_recomputed=recomputed)
        head = "".join(f"<th>{html.escape(h)}</th>" for h, _ in TABLE_COLUMNS.values())
        body = []
        for i, row in df.iterrows():
            cells = []
            for col, (_, fmt) in TABLE_COLUMNS.items():
                v = row[col]
                text = isinstance(v, str)
                shown = html.escape(fmt.format(v if text else getattr(v, "item", lambda v=v: v)()))
                cells.append(f"<td{' class=text' if text else ''}>{shown}</td>")
            body.append(f"<tr><th>{i}</th>{''.join(cells)}</tr>")
        return (
            f"{TABLE_STYLE}<div class='mlsys-planner-scroll'><small><table class='mlsys-planner-layouts'><tr><th>#</th>"
            f"{head}</tr>{''.join(body)}</table></small></div>"
        )

    def draw(self, r: dict) -> None:
        plan = r["plan"]
        ax_t, ax_m = self._ax_t, self._ax_m
        for ax in (ax_t, ax_m):
            ax.clear()
        with style():
            left = 0.0
            for k in TIME_PARTS:
                v = plan.time.get(k, 0.0)
                if v > 0:
                    ax_t.barh(0, v, left=left, color=quantity_color(k), label=k)
                    left += v
            ax_t.set_title(f"modelled step time (s): {plan.step_s:.2f} s, MFU {plan.mfu:.0%}", fontsize=10)
            b = plan.memory
            left = 0.0
            for name, attr in MEM_PARTS:
                v = getattr(b, attr) / 1e9
                if v > 0:
                    ax_m.barh(0, v, left=left, color=quantity_color(attr), label=name)
                    left += v
            ax_m.axvline(plan.gpu_memory_bytes / 1e9, color="black", ls="--", lw=1)
            ax_m.set_title(
                f"memory, heaviest stage (GB): {plan.memory_bytes / 1e9:.1f} of {plan.gpu_memory_bytes / 1e9:.0f} GB "
                "(dashed), fits",
                fontsize=10,
            )
            for ax in (ax_t, ax_m):
                ax.set_yticks([])
                ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=4, fontsize=7, frameon=False)
