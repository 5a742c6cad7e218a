"""RLHF sizing: a model, a GPU type, a GPU count and the rollout settings in; per-GPU memory and the
modelled step of a co-located and a split (disaggregated) PPO-RLHF layout out, side by side
(``mlsys_nb.rl.sizing.layout_cost``, which builds on ``rl.sizing.rlhf_estimate``, the inference roofline
and the links of ``data/hardware.yaml``). Models, not measurements. The widget computes nothing itself.

``RLHFSizingWidget().widget`` is the ipywidgets container; ``state()``/``set_state()``, ``figure``,
``table()`` and ``error`` follow the dashboard protocol. Invalid input (0 GPUs, a rollout TP that does
not divide the rollout GPUs, an MFU above 1) is shown as a message in place of the chart.
"""

from __future__ import annotations

import pandas as pd

from .. import hardware
from ..config import check_int, model_presets

from ..plots import QUANTITY_COLORS, style
from .base import ControlPanel

DEFAULTS = {
    "model": "llama-2-7b",
    "gpu": "H100-SXM",
    "n_gpus": 16,
    "rollout_batch": 256,
    "prompt_len": 512,
    "response_len": 512,
    "rollout_tp": 1,
    "mfu": 0.4,
    "sync_link": "infiniband-ndr",
}
PLACEMENTS = ("colocated", "split")
PHASES = ("gen", "sync", "train")
PHASE_COLORS = {  # generation, training (compute), weight sync (communication): plots.QUANTITY_COLORS
    "gen": QUANTITY_COLORS["generation"],
    "train": QUANTITY_COLORS["compute"],
    "sync": QUANTITY_COLORS["communication"],
    "gen ‖ train": "#8FB8D6",  # generation and training overlapped (one step off-policy)
}


class RLHFSizingWidget(ControlPanel):
    """Controls: actor model preset, GPU, GPUs in total, rollout batch (sequences per step), prompt and
    response lengths (tokens), rollout tensor-parallel degree, training MFU, the link between the
    trainer and rollout GPUs of a split layout."""

    words = {"mfu": "training MFU", "n_gpus": "GPUs"}  # the error messages' names in words (``base.in_words``)

    errors = (*ControlPanel.errors, ZeroDivisionError)

    def __init__(self, **state):
        import ipywidgets as w
        from matplotlib.figure import Figure

        s = DEFAULTS | state
        lay = w.Layout(width="320px")
        links = [n for n in hardware.links() if n not in ("nvlink4",)] or list(hardware.links())
        controls = {
            "model": w.Dropdown(options=list(model_presets()), value=s["model"], description="actor", layout=lay),
            "gpu": w.Dropdown(options=list(hardware.gpus()), value=s["gpu"], description="GPU", layout=lay),
            "n_gpus": w.IntText(value=s["n_gpus"], description="GPUs", layout=lay),
            "rollout_batch": w.IntText(value=s["rollout_batch"], description="rollout batch", layout=lay),
            "prompt_len": w.IntText(value=s["prompt_len"], description="prompt tokens", layout=lay),
            "response_len": w.IntText(value=s["response_len"], description="response tokens", layout=lay),
            "rollout_tp": w.IntText(value=s["rollout_tp"], description="rollout TP", layout=lay),
            "mfu": w.FloatText(value=s["mfu"], description="training MFU", layout=lay),
            "sync_link": w.Dropdown(
                options=sorted(set(links) | {s["sync_link"]}),
                value=s["sync_link"],
                description="split link",
                layout=lay,
            ),
        }
        with style():
            figure = Figure(figsize=(8.5, 3.4), layout="none")
            self._axes = figure.subplots(1, 2)
        figure.subplots_adjust(left=0.08, right=0.98, top=0.88, bottom=0.16, wspace=0.35)
        self._build(controls, figure, columns=(5,), label_width="110px")

    # ---- the template: compute, rows, headline, draw -------------------------------------------
    def compute(self, state: dict) -> dict:
        """Both layouts for a state (no drawing): ``{"layouts": {"colocated": LayoutCost, "split":
        LayoutCost}, "gpu_memory_bytes": bytes}``; raises ``ValueError``/``KeyError``/``TypeError`` on
        bad input (the calculator's messages)."""
        from ..rl.sizing import layout_cost

        s = state
        for name in ("n_gpus", "rollout_batch", "rollout_tp"):
            check_int(name, s[name], 1)
        for name in ("prompt_len", "response_len"):
            check_int(name, s[name], 0)
        check_int("prompt_len + response_len (tokens)", s["prompt_len"] + s["response_len"], 1)
        kw = {k: s[k] for k in ("gpu", "n_gpus", "rollout_batch", "prompt_len", "response_len", "rollout_tp", "mfu")}
        costs = {p: layout_cost(s["model"], placement=p, sync_link=s["sync_link"], **kw) for p in PLACEMENTS}
        return {"layouts": costs, "gpu_memory_bytes": hardware.gpu(s["gpu"]).memory_bytes}

    def rows(self, r: dict) -> pd.DataFrame:
        """One row per layout; a layout that runs out of memory has no step time (NaN): it does not run."""
        rows = []
        nan = float("nan")
        for p, c in r["layouts"].items():
            times = (c.gen_s, c.sync_s, c.train_s, c.step_sync_s, c.step_async_s) if c.fits else (nan,) * 5
            rows.append(
                {"layout": p, "GB per GPU (heaviest)": c.per_gpu_bytes / 1e9, "fits": c.fits}
                | dict(zip(("gen s", "sync s", "train s", "step (sync) s", "step (async) s"), times))
            )
        return pd.DataFrame(rows).set_index("layout")

    def headline(self, r: dict) -> str:
        cap = r["gpu_memory_bytes"]
        parts = []
        for p, c in r["layouts"].items():
            head = f"<b>{p}</b>: {c.per_gpu_bytes / 1e9:.3g} GB per GPU of {cap / 1e9:.3g} GB, "
            if not c.fits:
                heavy = max(c.memory.roles, key=lambda role: sum(c.memory.roles[role][1].values()))
                where = "every GPU holds all the models" if heavy == "all" else f"on the {heavy} GPUs"
                parts.append(f"{head}<b style='color:#D55E00'>out of memory</b> ({where}): no step time")
                continue
            parts.append(
                f"{head}fits; step {c.step_sync_s:.3g} s synchronous, {c.step_async_s:.3g} s one step off-policy "
                f"(weight sync {c.sync_s:.3g} s)"
            )
        return "<br>".join(parts) + "<br><i>Models: roofline generation, training at the MFU set, α-β sync.</i>"

    def draw(self, r: dict) -> None:
        costs, cap = r["layouts"], r["gpu_memory_bytes"]
        mem_ax, time_ax = self._axes
        with style():
            for ax in self._axes:
                ax.clear()
            names = list(costs)
            mem_ax.bar(
                names, [costs[p].per_gpu_bytes / 1e9 for p in names], color="#4D4D4D"
            )  # a total, no one quantity
            mem_ax.axhline(cap / 1e9, color="black", lw=1, ls="--", label="GPU memory")
            mem_ax.set_ylabel("GB per GPU, heaviest role (GB)")
            mem_ax.legend(fontsize=8, loc="upper right")
            mem_ax.set_title("memory per GPU (model)", fontsize=10)
            bars = [(f"{p}\nsync", costs[p], False) for p in names] + [("split\nasync", costs["split"], True)]
            seen = set()
            for i, (_, c, overlap) in enumerate(bars):
                if not c.fits:  # it does not run: no step time to draw
                    time_ax.text(i, 0, "out of\nmemory", ha="center", va="bottom", color="#D55E00", fontsize=8)
                    continue
                segs = (
                    [("gen ‖ train", max(c.gen_s, c.train_s))] if overlap else [("gen", c.gen_s), ("train", c.train_s)]
                )
                bottom = 0.0
                for seg, v in [*segs, ("sync", c.sync_s)]:
                    time_ax.bar(i, v, bottom=bottom, color=PHASE_COLORS[seg], label=None if seg in seen else seg)
                    seen.add(seg)
                    bottom += v
            time_ax.set_xticks(range(len(bars)), [b[0] for b in bars])
            time_ax.set_ylabel("RLHF step, model (s)")
            if seen:
                time_ax.legend(fontsize=8, loc="upper right")
            time_ax.set_title("PPO step time (model)", fontsize=10)
