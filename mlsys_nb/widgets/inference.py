"""Inference explorer: a model, a GPU, a context length, a decode batch and the cache dtype in; the
KV-cache bytes, how many sequences fit next to the weights, and prefill vs decode on the roofline
out (``mlsys_nb.inference``: ``kv_cache_bytes``, ``max_concurrent_sequences``, ``prefill_cost``,
``decode_cost``). The widget computes nothing itself.

``InferenceWidget().widget`` is the ipywidgets container; ``state()``/``set_state()``, ``figure``,
``table()`` and ``error`` follow the dashboard protocol. Invalid input (a batch of 0, a context
longer than the model's, tp of 0) is shown as a message in place of the chart.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import hardware
from ..config import check_int, load_model_preset, model_presets

from ..inference import kv_cache_bytes, max_concurrent_sequences, weight_bytes
from ..inference.roofline import decode_cost, prefill_cost
from ..plots import PALETTE, label, style
from .base import ControlPanel, pow10_label

DEFAULTS = {
    "model": "llama-3-8b",
    "gpu": "H100-SXM",
    "context": 8192,
    "batch": 16,
    "dtype": "bf16",
    "weight_dtype": "bf16",
    "tp": 1,
}
KV_DTYPES = ("bf16", "fp16", "fp8", "fp32")


class InferenceWidget(ControlPanel):
    """Controls: model preset, GPU, context (tokens per sequence), decode batch (sequences), KV-cache
    dtype, weight dtype, tensor-parallel degree."""

    def __init__(self, **state):
        import ipywidgets as w
        from matplotlib.figure import Figure

        s = DEFAULTS | state
        lay = w.Layout(width="320px")
        controls = {
            "model": w.Dropdown(options=list(model_presets()), value=s["model"], description="model", layout=lay),
            "gpu": w.Dropdown(options=list(hardware.gpus()), value=s["gpu"], description="GPU", layout=lay),
            "context": w.IntText(value=s["context"], description="context (tokens)", layout=lay),
            "batch": w.IntText(value=s["batch"], description="decode batch", layout=lay),
            "dtype": w.Dropdown(options=KV_DTYPES, value=s["dtype"], description="KV dtype", layout=lay),
            "weight_dtype": w.Dropdown(
                options=KV_DTYPES, value=s["weight_dtype"], description="weight dtype", layout=lay
            ),
            "tp": w.IntText(value=s["tp"], description="TP degree", layout=lay),
        }
        with style():
            figure = Figure(figsize=(7.5, 3.6), layout="none")
            self._ax = figure.subplots()
        figure.subplots_adjust(left=0.1, right=0.98, top=0.9, bottom=0.15)
        self._artists = None
        self._build(controls, figure, columns=(4,), label_width="110px")

    # ---- the template: compute, rows, headline, draw -------------------------------------------
    def compute(self, state: dict) -> dict:
        """All numbers for a state (no drawing); raises ``ValueError``/``KeyError`` on bad input."""
        s = state
        cfg = load_model_preset(s["model"])
        ctx, b, tp = s["context"], s["batch"], s["tp"]
        check_int(f"context (for {s['model']})", ctx, 1, cfg.seq_len)
        check_int("batch", b, 1)
        check_int("tp", tp, 1)
        gpu = hardware.gpu(s["gpu"])
        peak_dtype = s["weight_dtype"] if s["weight_dtype"] in gpu.peak_flops else "fp32"
        if peak_dtype not in gpu.peak_flops:
            raise ValueError(f"{s['gpu']} has no {s['weight_dtype']} peak: choose one of {sorted(gpu.peak_flops)}")
        pre = prefill_cost(cfg, gpu, ctx, dtype=peak_dtype, kv_dtype=s["dtype"])
        dec = decode_cost(cfg, gpu, ctx, batch=b, dtype=peak_dtype, kv_dtype=s["dtype"])
        return {
            "cfg": cfg,
            "gpu": gpu,
            "prefill": pre,
            "decode": dec,
            "kv_per_seq": kv_cache_bytes(cfg, ctx, s["dtype"]),
            "kv_batch": kv_cache_bytes(cfg, ctx * b, s["dtype"]),
            "weights": weight_bytes(cfg, s["weight_dtype"]),
            "max_seqs": max_concurrent_sequences(
                cfg, gpu, ctx, dtype=s["dtype"], weight_dtype=s["weight_dtype"], tp=tp
            ),
            "decode_curve": [
                decode_cost(cfg, gpu, ctx, batch=int(x), dtype=peak_dtype, kv_dtype=s["dtype"])
                for x in np.unique(np.logspace(0, 10, 21, base=2).astype(int))
            ],
            "state": s,
        }

    def rows(self, r: dict) -> pd.DataFrame:
        pre, dec = r["prefill"], r["decode"]
        rows = [
            ("KV cache per sequence", r["kv_per_seq"], "bytes"),
            ("KV cache for the batch", r["kv_batch"], "bytes"),
            ("weights", r["weights"], "bytes"),
            ("sequences that fit (per GPU, after weights)", r["max_seqs"], "sequences"),
            ("prefill time (one prompt of `context` tokens)", pre.time_s, "s"),
            ("prefill intensity", pre.intensity_flop_per_byte, "FLOP/byte"),
            ("decode step time (batch, at `context`)", dec.time_s, "s"),
            ("decode time per token", dec.time_per_token_s, "s"),
            ("decode intensity", dec.intensity_flop_per_byte, "FLOP/byte"),
            ("ridge point", dec.ridge_flop_per_byte, "FLOP/byte"),
        ]
        return pd.DataFrame(rows, columns=["quantity", "value", "unit"]).set_index("quantity")

    def headline(self, r: dict) -> str:
        s, pre, dec = r["state"], r["prefill"], r["decode"]
        fits = "" if r["max_seqs"] >= s["batch"] else " <b style='color:#D55E00'>(the batch does not fit)</b>"
        return (
            f"{s['model']} on {s['gpu']}: KV cache {r['kv_per_seq'] / 1e9:.3g} GB per {s['context']}-token sequence "
            f"({s['dtype']}), weights {r['weights'] / 1e9:.3g} GB; <b>{r['max_seqs']} sequences fit</b> "
            f"(tp={s['tp']}, 90% memory){fits}. Prefill: {pre.time_s * 1e3:.3g} ms, {pre.bound}-bound. "
            f"Decode at batch {s['batch']}: {dec.time_s * 1e3:.3g} ms per step, "
            f"{dec.tokens_per_s:,.0f} tokens/s, {dec.bound}-bound. <i>Roofline model, 100% of peak.</i>"
        )

    def _setup(self):
        """Artists, log axes with plain-text tick labels (mathtext labels dominate a redraw)."""
        from matplotlib.ticker import FuncFormatter, LogLocator

        ax = self._ax
        with style():
            roof = ax.plot([], [], color="black", lw=1.5, label="roof")[0]
            curve = ax.plot([], [], "-", color=PALETTE[1], lw=1, label="decode, batch 1..1024")[0]
            dec = ax.plot([], [], "s", color=PALETTE[1], ms=8, label="decode, your batch")[0]
            pre = ax.plot([], [], "o", color=PALETTE[0], ms=8, label="prefill, one prompt")[0]
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlim(0.1, 1e5)
            label(ax, "arithmetic intensity (FLOP/byte)", "attained FLOP/s (model)")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_formatter(FuncFormatter(pow10_label))
                axis.set_major_locator(LogLocator(base=100.0))
            ax.minorticks_off()
            ax.legend(fontsize=8, loc="lower right")
            title = ax.set_title("", fontsize=10)
        self._artists = {"roof": roof, "curve": curve, "dec": dec, "pre": pre, "title": title}

    def draw(self, r: dict) -> None:
        if self._artists is None:
            self._setup()
        a, gpu, pre, dec = self._artists, r["gpu"], r["prefill"], r["decode"]
        xs = np.array([0.1, pre.ridge_flop_per_byte, 1e5])
        a["roof"].set_data(xs, np.minimum(pre.peak_flops, xs * pre.bandwidth_bytes_per_s))
        curve = r["decode_curve"]
        a["curve"].set_data([c.intensity_flop_per_byte for c in curve], [c.flops / c.time_s for c in curve])
        a["dec"].set_data([dec.intensity_flop_per_byte], [dec.flops / dec.time_s])
        a["pre"].set_data([pre.intensity_flop_per_byte], [pre.flops / pre.time_s])
        a["title"].set_text(f"{gpu.name} roofline: decode batch {dec.batch}, prefill {pre.tokens} tokens")
        self._ax.set_ylim(pre.peak_flops * 1e-5, pre.peak_flops * 3)
