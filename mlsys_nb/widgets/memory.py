"""Training-memory explorer: a model preset and a training configuration in, the per-GPU memory
breakdown out (``mlsys_nb.memory.estimate``), as a stacked bar against the GPU's capacity, a table
and a fits/OOM verdict. A toggle shows the Ultra-Scale Playbook widget's numbers for the same
inputs (its bugs included; it prints GiB as "GB"). Invalid combinations (tp not dividing the
heads, more stages than layers, ...) are shown as a message in place of the chart.

The figure sweeps one setting the learner picks (``sweep``: sequence length, micro-batch, TP, ZeRO
stage or recomputation) and draws one stacked bar per value side by side, each labelled with its
total and each component's value inside its segment, the components named as in the Numbers table,
the GPU's capacity as a line and every value that runs out of memory marked "OOM". A swept value
that is an invalid combination has no bar.

``MemoryWidget().widget`` is the ipywidgets container; ``state()``/``set_state()``, ``figure``,
``table()`` and ``error`` follow the dashboard protocol.
"""

from __future__ import annotations

import pandas as pd

from .. import hardware, memory
from ..config import OPTIMIZERS, PP_SCHEDULES, PRECISIONS, RECOMPUTE, TrainConfig
from ..plots import QUANTITY_COLORS, label, style
from .base import ControlPanel

POW2 = lambda lo, hi: [2**i for i in range(lo, hi + 1)]  # noqa: E731

DEFAULTS = {
    "model": "llama-3.1-8b",
    "micro_batch": 1,
    "seq_len": 4096,
    "precision": "bf16-mixed",
    "fp32_grad_accum": False,
    "optimizer": "adam",
    "recompute": "none",
    "flash_attention": True,
    "dp": 8,
    "zero": 1,
    "tp": 1,
    "sp": False,
    "pp": 1,
    "pp_schedule": "1f1b",
    "virtual_stages": 1,
    "n_microbatches": 8,
    "cp": 1,
    "ep": 1,
    "gpu": "H100-SXM",
    "unit": "GiB",
    "playbook": False,
    "sweep": "seq_len",
}
SWEEPS = {  # the sweep control's choices: setting -> its label
    "seq_len": "sequence length",
    "micro_batch": "micro-batch",
    "tp": "TP",
    "zero": "ZeRO stage",
    "recompute": "recomputation",
}
SWEEP_BARS = 6  # bars of a sweep over a long list of values (a window around the current value)
COMPONENTS = [  # (Breakdown field, label (the Numbers table's and the legend's), colour, short label)
    ("params", "parameters", QUANTITY_COLORS["params"], "params"),
    ("grads", "gradients", QUANTITY_COLORS["grads"], "grads"),
    ("optimizer", "optimizer states", QUANTITY_COLORS["optimizer"], "optimizer"),
    ("master", "fp32 master weights", QUANTITY_COLORS["master"], "master"),
    ("activations_layers", "activations (layers)", QUANTITY_COLORS["activations"], "act. layers"),
    (
        "activations_outside",
        "activations (embedding, head, loss)",
        QUANTITY_COLORS["activations_outside"],
        "act. outside",
    ),
    ("temporary", "temporary buffers", QUANTITY_COLORS["temporary"], "temporary"),
    ("overhead", "overhead", QUANTITY_COLORS["overhead"], "overhead"),
]
SEGMENT_LABEL_MIN = 0.06  # a segment shows its value when it is at least this fraction of the axis height
HEADROOM = 1.35  # the y axis runs to 1.35 x the tallest bar: room for the totals, OOM marks and the verdict
UNITS = {"GiB": memory.GiB, "GB": memory.GB}


def train_config(state: dict) -> TrainConfig:
    """The ``TrainConfig`` a widget state describes (raises ``ValueError`` for invalid input)."""
    keys = (
        "micro_batch",
        "seq_len",
        "precision",
        "fp32_grad_accum",
        "optimizer",
        "recompute",
        "flash_attention",
        "dp",
        "zero",
        "tp",
        "sp",
        "pp",
        "pp_schedule",
        "virtual_stages",
        "n_microbatches",
        "cp",
        "ep",
        "gpu",
    )
    kw = {k: state[k] for k in keys}
    kw["sp"] = bool(kw["sp"]) and kw["tp"] > 1
    if kw["pp_schedule"] != "interleaved-1f1b":
        kw["virtual_stages"] = 1
    return TrainConfig(**kw)


class MemoryWidget(ControlPanel):
    """Controls for every ``TrainConfig`` input, a model preset, the GPU, the unit (GiB/GB) and a
    Playbook-compatibility toggle. Shows a stacked bar per rank with the GPU memory line."""

    # the error messages' names in words (``base.in_words``)
    words = {"dp": "DP", "tp": "TP", "pp": "PP", "cp": "CP", "ep": "EP"}

    error_label = "Invalid combination"

    def __init__(self, **state):
        import ipywidgets as w

        s = DEFAULTS | state
        lay = w.Layout(width="320px")
        dd = lambda opts, v, d: w.Dropdown(options=opts, value=v, description=d, layout=lay)  # noqa: E731
        sel = lambda opts, v, d: w.SelectionSlider(options=opts, value=v, description=d, layout=lay)  # noqa: E731
        controls = {
            "model": dd(memory.presets(), s["model"], "model"),
            "micro_batch": sel(POW2(0, 8), s["micro_batch"], "micro-batch (seqs)"),
            "seq_len": sel(POW2(7, 17), s["seq_len"], "sequence (tokens)"),
            "precision": dd(list(PRECISIONS), s["precision"], "precision"),
            "fp32_grad_accum": w.Checkbox(
                value=s["fp32_grad_accum"], description="fp32 grad accumulation", indent=False, layout=lay
            ),
            "optimizer": dd(list(OPTIMIZERS), s["optimizer"], "optimizer"),
            "recompute": dd(list(RECOMPUTE), s["recompute"], "recompute"),
            "flash_attention": w.Checkbox(
                value=s["flash_attention"], description="FlashAttention", indent=False, layout=lay
            ),
            "dp": sel(POW2(0, 12), s["dp"], "DP"),
            "zero": dd([0, 1, 2, 3], s["zero"], "ZeRO stage"),
            "tp": sel(POW2(0, 6), s["tp"], "TP"),
            "sp": w.Checkbox(value=s["sp"], description="sequence parallel", indent=False, layout=lay),
            "pp": sel(POW2(0, 6), s["pp"], "PP"),
            "pp_schedule": dd(list(PP_SCHEDULES), s["pp_schedule"], "PP schedule"),
            "virtual_stages": w.IntSlider(
                value=s["virtual_stages"], min=1, max=8, description="virtual stages", layout=lay
            ),
            "n_microbatches": sel(POW2(0, 9), s["n_microbatches"], "micro-batches/step"),
            "cp": sel(POW2(0, 5), s["cp"], "CP"),
            "ep": sel(POW2(0, 8), s["ep"], "EP"),
            "gpu": dd(list(hardware.gpus()), s["gpu"], "GPU"),
            "unit": w.ToggleButtons(options=list(UNITS), value=s["unit"], description="unit"),
            "playbook": w.Checkbox(
                value=s["playbook"], description="Playbook-compatible numbers", indent=False, layout=lay
            ),
            "sweep": w.Dropdown(
                options=[(v, k) for k, v in SWEEPS.items()], value=s["sweep"], description="bars over", layout=lay
            ),
        }
        from matplotlib.figure import Figure

        with style():  # a fixed layout: constrained layout would re-measure every text on each redraw
            figure = Figure(figsize=(8.4, 4.0), layout="none")
            self._ax = figure.add_subplot()
        figure.subplots_adjust(left=0.09, right=0.64, top=0.9, bottom=0.13)
        self._build(controls, figure, columns=(8, 15), label_width="130px")

    @property
    def breakdown(self):
        """The ``memory.Breakdown`` shown (None while an error is shown)."""
        return self.result["breakdown"] if self.result else None

    # ---- the template: compute, rows, headline, draw -------------------------------------------
    def compute(self, state: dict) -> dict:
        """The breakdown for a state (no drawing): ``{"breakdown", "train", "state"}``."""
        train = train_config(state)
        model = memory.preset(state["model"])
        compat = "playbook" if state["playbook"] else None
        b = memory.estimate(model, train, compat=compat)
        sweep = state["sweep"]
        if sweep not in SWEEPS:
            raise ValueError(f"sweep={sweep!r}: choose one of {sorted(SWEEPS)}")
        bars = []  # (value, Breakdown or None for an invalid combination)
        for v in sweep_values(sweep, state[sweep], self.controls[sweep].options):
            try:
                bars.append(
                    (
                        v,
                        b
                        if v == state[sweep]
                        else memory.estimate(model, train_config(state | {sweep: v}), compat=compat),
                    )
                )
            except (ValueError, KeyError, TypeError):
                bars.append((v, None))
        fix = None if b.fits else first_fix(model, state, compat)
        return {"breakdown": b, "train": train, "state": state, "bars": bars, "fix": fix}

    def rows(self, r: dict) -> pd.DataFrame:
        b, unit = r["breakdown"], r["state"]["unit"]
        rows = [(lab, getattr(b, f)) for f, lab, _, _ in COMPONENTS] + [("total", b.total)]
        table = pd.DataFrame(rows, columns=["component", "bytes per rank"]).set_index("component")
        table[unit] = table["bytes per rank"] / UNITS[unit]
        return table

    def headline(self, r: dict) -> str:
        b, s = r["breakdown"], r["state"]
        unit, scale = s["unit"], UNITS[s["unit"]]
        verdict = "fits" if b.fits else "does NOT fit"
        fix = r["fix"]
        fix = f"; fix: {fix_words(fix[0])} ({fix[1].total / scale:,.1f} {unit})" if fix is not None else ""
        extra = ""
        if s["playbook"]:
            pb = b.detail["playbook"]
            extra = (
                f" &nbsp; <i>the Playbook widget prints <b>{pb['shown']}</b> (really GiB; it ignores "
                f"TP for model states, PP, GQA, FlashAttention and the FFN width in its parameter count)</i>"
            )
        return (
            f"{b.total / scale:,.2f} {unit} per rank on stage {b.stage} ({b.layers} layers, "
            f"{b.in_flight:g} micro-batches in flight): <b>{verdict}</b> on {s['gpu']} "
            f"({b.gpu_memory / scale:,.1f} {unit}){fix}; parameters: {b.n_params_total / 1e9:,.2f} B total, "
            f"{b.n_params_active / 1e9:,.2f} B active, {b.n_params_rank / 1e9:,.3f} B on this rank" + extra
        )

    def draw(self, r: dict) -> None:
        """One stacked bar per swept value, its total on top and each segment's value inside it (when the
        segment is tall enough to hold the text); the GPU line with its capacity; every value that does not
        fit marked OOM; the current value's tick in bold."""
        b, s, bars = r["breakdown"], r["state"], r["bars"]
        unit, scale = s["unit"], UNITS[s["unit"]]
        ax = self._ax
        ax.clear()
        cap = b.gpu_memory / scale
        xs = list(range(len(bars)))
        top = cap
        with style():
            bottoms = [0.0] * len(bars)
            handles = {}
            segments = []  # (x, bottom, height) of every drawn segment, for its value label
            for f, lab, col, _ in COMPONENTS:
                heights = [getattr(bd, f) / scale if bd is not None else 0.0 for _, bd in bars]
                if not any(h > 0 for h in heights):
                    continue
                handles[lab] = ax.bar(xs, heights, bottom=bottoms, width=0.62, color=col, label=lab)
                segments += [(x, lo, h) for x, lo, h in zip(xs, bottoms, heights) if h > 0]
                bottoms = [lo + h for lo, h in zip(bottoms, heights)]
            top = max([cap, *bottoms])
            for x, lo, h in segments:  # each segment's value, where the segment is tall enough to hold it
                if h >= SEGMENT_LABEL_MIN * top * HEADROOM:  # clear of the GPU line and its OOM cross
                    ys = (lo + f * h for f in (0.5, 0.35, 0.65, 0.2, 0.8))
                    y = max(ys, key=lambda y: min(abs(y - cap), 0.08 * top))
                    ax.text(x, y, f"{h:,.1f}", ha="center", va="center", fontsize=7, gid="segment")
            for x, (_v, bd), total in zip(xs, bars, bottoms):
                if bd is None:
                    ax.text(x, top * 0.02, "invalid", ha="center", va="bottom", fontsize=8, color="grey", rotation=90)
                    continue
                ax.text(x, total + top * 0.01, f"{total:,.1f}", ha="center", va="bottom", fontsize=8, gid="total")
                if not bd.fits:  # every value that runs out of memory
                    ax.plot([x], [cap], marker="X", color="#D55E00", ms=10, mec="black", zorder=5)
                    ax.text(
                        x,
                        total + top * 0.07,
                        "OOM",
                        ha="center",
                        va="bottom",
                        color="#D55E00",
                        fontsize=9,
                        fontweight="bold",
                        gid="oom",
                    )
            gpu_line = ax.axhline(cap, color="black", ls="--", lw=1.2)
            ax.set_xticks(xs)
            ax.set_xticklabels([str(v) for v, _ in bars])
            for tick, (v, _) in zip(ax.get_xticklabels(), bars):
                if v == s[s["sweep"]]:
                    tick.set_fontweight("bold")
            ax.set_xlim(-0.6, len(bars) - 0.4)
            ax.set_ylim(0, top * HEADROOM)
            ax.grid(axis="x", visible=False)
            ax.text(  # the verdict, and the one change that fixes an OOM, inside the figure
                0.01,
                0.98,
                verdict_text(b, r["fix"], s["gpu"], unit, scale),
                transform=ax.transAxes,
                ha="left",
                va="top",
                fontsize=8,
                color="#009E73" if b.fits else "#D55E00",
                gid="verdict",
            )
            where = "Playbook widget's numbers" if s["playbook"] else "per rank"
            label(
                ax,
                f"{SWEEPS[s['sweep']]} (setting; bold: yours)",
                f"memory ({unit})",
                f"Memory {where} over {SWEEPS[s['sweep']]}",
            )
            # the legend in stack order (top component first, as the bars read), outside the axes
            names = list(handles)[::-1]
            ax.legend(
                [handles[n] for n in names] + [gpu_line],
                names + [f"{s['gpu']} memory ({cap:,.1f} {unit})"],
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
                fontsize=8,
                frameon=False,
            )


def sweep_values(name: str, current, options) -> list:
    """The values a sweep over ``name`` draws: every option of a short list (ZeRO stage, recompute,
    TP), else ``SWEEP_BARS`` consecutive options around ``current``. ``options``: the control's."""
    opts = [o[1] if isinstance(o, tuple) else o for o in options]
    if len(opts) <= SWEEP_BARS + 1:
        return opts
    i = opts.index(current)
    lo = min(max(i - SWEEP_BARS // 2, 0), len(opts) - SWEEP_BARS)
    return opts[lo : lo + SWEEP_BARS]


# the single changes tried, in order, when a configuration runs out of memory: (setting, value)
FIXES = (
    ("zero", 1),
    ("zero", 2),
    ("zero", 3),
    ("recompute", "selective"),
    ("recompute", "full"),
    ("tp", 2),
    ("tp", 4),
    ("tp", 8),
    ("micro_batch", 0.5),  # half the micro-batch
    ("pp", 2),  # twice the pipeline stages
)


def fix_words(change: tuple) -> str:
    """``("zero", 3)`` -> ``"ZeRO-3"``, ``("tp", 4)`` -> ``"TP 4"``, ``("micro_batch", 2)`` -> ``"micro-batch 2"``."""
    name, value = change
    return {
        "zero": f"ZeRO-{value}",
        "recompute": f"{value} recomputation",
        "tp": f"TP {value}",
        "micro_batch": f"micro-batch {value}",
        "pp": f"PP {value}",
    }[name]


def first_fix(model, state: dict, compat=None):
    """The first single change of ``FIXES`` (only those that raise the setting: a higher ZeRO stage, more
    recomputation, more TP or PP, a smaller micro-batch) under which ``state`` fits: ``((setting, value),
    Breakdown)``, or None when no single change does."""
    order = {"none": 0, "selective": 1, "full": 2}
    for name, value in FIXES:
        cur = state[name]
        if name == "micro_batch":
            value = cur // 2
            if value < 1:
                continue
        elif name == "pp":
            value = cur * 2
        elif name == "recompute":
            if order[value] <= order[cur]:
                continue
        elif value <= cur or (name == "zero" and state["dp"] == 1):
            continue
        try:
            b = memory.estimate(model, train_config(state | {name: value}), compat=compat)
        except (ValueError, KeyError, TypeError):
            continue
        if b.fits:
            return (name, value), b
    return None


def verdict_text(b, fix, gpu: str, unit: str, scale: float) -> str:
    """The figure's verdict: fits with the room left, or does not fit and the one change that would."""
    if b.fits:
        return f"fits on {gpu}: {(b.gpu_memory - b.total) / scale:,.1f} {unit} free"
    over = f"does not fit on {gpu}: {(b.total - b.gpu_memory) / scale:,.1f} {unit} too much"
    if fix is None:
        return over + "\nno single change (ZeRO, recomputation, TP <= 8, half the micro-batch, 2x PP) fits"
    return over + f"\nfix: {fix_words(fix[0])} ({fix[1].total / scale:,.1f} {unit})"
