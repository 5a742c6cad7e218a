"""Scaling-law explorer: a published loss law (Chinchilla, Epoch AI's refit, Kaplan, or a fit you
pass in), a compute budget (log slider) and an optional inference demand in; iso-FLOP curves with
the optimum marked, N* and D* against compute with famous training runs, and the time and cost of
the compute-optimal run on a chosen cluster out (``mlsys_nb.scaling``, ``mlsys_nb.flops``).

``ScalingWidget().widget`` is the ipywidgets container; ``state()``/``set_state()``, ``figure``,
``table()`` and ``error`` follow the dashboard protocol. Invalid input (MFU outside (0, 1], a
cluster of 0 GPUs, a negative price) is shown as a message in place of the chart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import flops, hardware, scaling
from ..config import check_number
from ..plots import PALETTE, human_number, label, style
from .base import ControlPanel, pow10_label

DEFAULTS = {
    "law": "chinchilla",
    "compute": 1e23,
    "inference": False,
    "inference_tokens": 1e13,
    "gpu": "H100-SXM",
    "n_gpus": 1024,
    "mfu": 0.4,
    "price_per_gpu_hour": 2.0,
}
C_RANGE = (1e18, 1e27)
DECADES = (-2, -1, 0, 1, 2)  # iso-FLOP curves at C x 10^k


def sci(x: float) -> str:
    """A large count in the headline as a power of ten with 3 digits: 1.46e10 (``plots.human_number``)."""
    return human_number(x, sci_from=1e5)


def _dtype(gpu: str) -> str:
    peaks = hardware.gpu(gpu).peak_flops
    return next(d for d in ("bf16", "fp16", "fp32") if d in peaks)


class ScalingWidget(ControlPanel):
    """Controls: law, compute budget (FLOPs, log slider), inference demand (tokens served), GPU,
    cluster size, MFU and a price per GPU-hour (your assumption, USD)."""

    words = {"mfu": "MFU", "n_gpus": "GPUs"}  # the error messages' names in words (``base.in_words``)

    def __init__(self, laws: dict | None = None, **state):
        import ipywidgets as w
        from matplotlib.figure import Figure

        self.laws = {n: scaling.law(n) for n in scaling.law_names()} | dict(laws or {})
        s = DEFAULTS | state
        lay = w.Layout(width="340px")
        controls = {
            "law": w.Dropdown(options=list(self.laws), value=s["law"], description="law", layout=lay),
            "compute": w.FloatLogSlider(
                value=s["compute"],
                base=10,
                min=np.log10(C_RANGE[0]),
                max=np.log10(C_RANGE[1]),
                step=0.05,
                description="compute (FLOPs)",
                readout_format=".2e",
                layout=lay,
            ),
            "inference": w.Checkbox(value=s["inference"], description="add inference demand"),
            "inference_tokens": w.FloatLogSlider(
                value=s["inference_tokens"],
                base=10,
                min=9,
                max=16,
                step=0.1,
                description="tokens served",
                readout_format=".1e",
                layout=lay,
            ),
            "gpu": w.Dropdown(options=list(hardware.gpus()), value=s["gpu"], description="GPU", layout=lay),
            "n_gpus": w.IntText(value=s["n_gpus"], description="GPUs", layout=lay),
            "mfu": w.FloatText(value=s["mfu"], description="MFU (0-1]", layout=lay),
            "price_per_gpu_hour": w.FloatText(value=s["price_per_gpu_hour"], description="USD / GPU-hour", layout=lay),
        }
        # the legend lives in HTML: matplotlib legends cost ~1/3 of a redraw
        sw = lambda col, txt: f"<span style='color:{col}'>&#9632;</span>&nbsp;{txt}"  # noqa: E731
        names = ("C/100", "C/10", "C (bold)", "10 C", "100 C")
        self.legend = w.HTML(
            "<small>left, iso-FLOP curves at "
            + ", ".join(sw(PALETTE[i], n) for i, n in enumerate(names))
            + "; &#9679; optimum, <span style='color:"
            + PALETTE[3]
            + "'>&#9670;</span> inference-aware. "
            "Right: "
            + sw(PALETTE[0], "N* (params)")
            + ", "
            + sw(PALETTE[1], "D* (tokens)")
            + ", &#9650;/&#9660; famous runs' N and D at their 6ND (data/scaling_laws.yaml), dashed: your C.</small>"
        )
        with style():
            figure = Figure(figsize=(9.0, 3.8), layout="none")
            self._ax_iso, self._ax_opt = figure.subplots(1, 2)
        figure.subplots_adjust(left=0.07, right=0.99, top=0.91, bottom=0.14, wspace=0.25)
        self._artists = None
        self._build(controls, figure, columns=(4,), label_width="120px", below=[self.legend])

    # ---- the template: compute, rows, headline, draw ---------------------------------------------
    def compute(self, state: dict) -> dict:
        """All numbers for a state (no drawing); raises ``ValueError``/``KeyError`` on bad input."""
        s = state
        if s["law"] not in self.laws:
            raise KeyError(f"law={s['law']!r}: choose one of {sorted(self.laws)}")
        law = self.laws[s["law"]]
        C = check_number("compute", float(s["compute"]), C_RANGE[0], C_RANGE[1], unit="FLOPs")

        n, d = law.compute_optimal(C)
        est = flops.training_time(
            n,
            d,
            gpu=s["gpu"],
            n_gpus=s["n_gpus"],
            mfu=s["mfu"],
            dtype=_dtype(s["gpu"]),
            price_per_gpu_hour=s["price_per_gpu_hour"],
        )
        out = {
            "law": law,
            "C": C,
            "N": n,
            "D": d,
            "loss": law.loss(n, d),
            "estimate": est,
            "twenty": scaling.twenty_tokens_per_param(C),
            "inference": None,
            "state": s,
        }
        if s["inference"]:
            out["inference"] = law.inference_optimal(C, s["inference_tokens"])
        return out

    def rows(self, r: dict) -> pd.DataFrame:
        est = r["estimate"]
        rows = [
            ("compute budget C", r["C"], "FLOPs"),
            ("N* (compute-optimal parameters)", r["N"], "params"),
            ("D* (compute-optimal tokens)", r["D"], "tokens"),
            ("D*/N*", r["D"] / r["N"], "tokens/param"),
            ("L* (loss at the optimum)", r["loss"], "nats/token"),
            ("N at 20 tokens/param", r["twenty"][0], "params"),
            ("wall-clock", est.days, "days"),
            ("GPU-hours", est.gpu_hours, "GPU·h"),
            ("cost", est.cost_usd, "USD"),
        ]
        inf = r["inference"]
        if inf is not None:
            rows += [
                ("inference-aware N", inf["N"], "params"),
                ("inference-aware D", inf["D"], "tokens"),
                ("lifetime compute, inference-aware", inf["total_flops"], "FLOPs"),
                ("lifetime compute, Chinchilla-optimal", inf["chinchilla_total_flops"], "FLOPs"),
            ]
        return pd.DataFrame(rows, columns=["quantity", "value", "unit"]).set_index("quantity")

    def headline(self, r: dict) -> str:
        s, est, inf = r["state"], r["estimate"], r["inference"]
        return (
            f"{r['law'].label}: C = {sci(r['C'])} FLOPs &rarr; N* = {sci(r['N'])} params, "
            f"D* = {sci(r['D'])} tokens "
            f"({r['D'] / r['N']:.1f} tokens/param), L* = {r['loss']:.3f} nats/token. "
            f"On {s['n_gpus']} &times; {s['gpu']} at MFU {s['mfu']:.2f}: <b>{est.days:,.1f} days</b>, "
            f"{est.gpu_hours:,.0f} GPU-hours, ${est.cost_usd:,.0f} at ${s['price_per_gpu_hour']:.2f}/GPU-hour."
            + (
                f" With {sci(s['inference_tokens'])} tokens served: N = {sci(inf['N'])}, "
                f"D = {sci(inf['D'])} "
                f"saves {(1 - inf['total_flops'] / inf['chinchilla_total_flops']) * 100:.0f}% of lifetime compute."
                if inf is not None
                else ""
            )
            + (
                " <i>Kaplan's N* is its published allocation (N ∝ C^0.73, Table 6), not the minimum of its "
                "own L(N, D) under C = 6ND; its loss is on WebText2 and not comparable with the others.</i>"
                if isinstance(r["law"], scaling.KaplanLaw)
                else ""
            )
        )

    # ---- drawing (artists created once, then updated in place) -----------------------------------
    def _setup(self):
        ax1, ax2 = self._ax_iso, self._ax_opt
        with style():
            names = {-2: "C/100", -1: "C/10", 0: "C", 1: "10 C", 2: "100 C"}
            iso = [
                ax1.plot([], [], color=PALETTE[i], lw=2.2 if k == 0 else 1.2, label=names[k])[0]
                for i, k in enumerate(DECADES)
            ]
            opt = ax1.plot([], [], "o", color="black", ms=5, label="optimum")[0]
            inf = ax1.plot([], [], "D", color=PALETTE[3], ms=7, label="inference-aware")[0]
            ax1.set_xscale("log")
            label(ax1, "parameters N (count)", "loss (nats/token)")
            ax1.set_title("Loss at a fixed compute budget (iso-FLOP curves)", fontsize=10)
            cs = np.logspace(np.log10(C_RANGE[0]), np.log10(C_RANGE[1]), 60)
            n_line = ax2.plot([], [], color=PALETTE[0], label="N*")[0]
            d_line = ax2.plot([], [], color=PALETTE[1], label="D*")[0]
            vline = ax2.axvline(1e23, color="grey", ls="--", lw=1)
            runs = scaling.training_runs()
            ax2.scatter(runs["C = 6ND (FLOPs)"], runs["params"], marker="^", color=PALETTE[0], s=22, label="runs: N")
            ax2.scatter(runs["C = 6ND (FLOPs)"], runs["tokens"], marker="v", color=PALETTE[1], s=22, label="runs: D")
            ax2.set_xscale("log")
            ax2.set_yscale("log")
            ax2.set_xlim(C_RANGE)
            ax2.set_ylim(1e7, 1e15)
            label(ax2, "compute C (FLOPs)", "N* (params), D* (tokens)")
            ax2.set_title("Compute-optimal model and data size", fontsize=10)
            from matplotlib.ticker import FuncFormatter, LogLocator

            for axis in (ax1.xaxis, ax2.xaxis, ax2.yaxis):
                axis.set_major_formatter(FuncFormatter(pow10_label))
            for ax in (ax1, ax2):  # few ticks, no minor ticks: tick text dominates a redraw
                ax.minorticks_off()
            ax1.xaxis.set_major_locator(LogLocator(numticks=5))  # every 2nd decade, like the right
            ax2.xaxis.set_major_locator(LogLocator(base=100.0))
            ax2.yaxis.set_major_locator(LogLocator(base=100.0))
            # fixed axis-label positions (axes fractions measured from the automatic ones; the loss
            # label clears 5-character tick labels such as 2.025): the
            # automatic placement measures every tick label again on each redraw
            for axis, xy in (
                (ax1.xaxis, (0.5, -0.095)),
                (ax1.yaxis, (-0.12, 0.5)),
                (ax2.xaxis, (0.5, -0.095)),
                (ax2.yaxis, (-0.113, 0.5)),
            ):
                axis.set_label_coords(*xy)
        self._artists = {"iso": iso, "opt": opt, "inf": inf, "n": n_line, "d": d_line, "v": vline, "cs": cs}

    def draw(self, r: dict) -> None:
        if self._artists is None:
            self._setup()
        a, law, C = self._artists, r["law"], r["C"]
        n_opt = r["N"]
        ns = n_opt * np.logspace(-2, 2, 80)
        lo, hi = np.inf, -np.inf
        xs, ys = [], []
        for line, k in zip(a["iso"], DECADES):
            c = C * 10.0**k
            nk = law.compute_optimal(c)[0] * np.logspace(-1.5, 1.5, 60)
            lk = law.iso_flop(c, nk)
            line.set_data(nk, lk)
            xs.append(law.compute_optimal(c)[0])
            ys.append(law.optimal_loss(c))
            lo, hi = min(lo, np.nanmin(lk)), max(hi, np.nanmax(lk))
        a["opt"].set_data(xs, ys)
        inf = r["inference"]
        a["inf"].set_data(([inf["N"]], [inf["loss"]]) if inf else ([], []))
        ax1 = self._ax_iso
        ax1.set_xlim(ns[0] / 10, ns[-1] * 10)
        ax1.minorticks_off()
        ax1.set_ylim(lo - 0.02 * (hi - lo), lo + 0.6 * (hi - lo))
        n_star, d_star = law.compute_optimal(a["cs"])
        a["n"].set_data(a["cs"], n_star)
        a["d"].set_data(a["cs"], d_star)
        a["v"].set_xdata([C, C])
