"""Inference explorer: a model, a GPU, a context length, a decode batch and the cache dtype in; the
KV-cache bytes, how many sequences fit next to the weights, and prefill vs decode on the roofline
out (``mlsys_nb.inference``: ``kv_cache_bytes``, ``max_concurrent_sequences``, ``prefill_cost``,
``decode_cost``, ``min_tp_that_fits``; ``kv_cache.kv_block_bytes`` for what the engine's paged pool holds per
sequence, in its default 16-token blocks, fp8's per-block scales included). The widget computes nothing itself.

A layout that cannot run is said so, with no throughput: weights larger than the usable memory per
GPU give "does not fit: weights X GB > Y GB usable; needs TP >= k", and a decode batch whose KV cache
does not fit beside the weights gives "batch does not fit" (no decode numbers). Beside the roofline:
sequences that fit vs context, and decode tokens/s and time per token vs batch.

``InferenceWidget().widget`` is the ipywidgets container; ``state()``/``set_state()``, ``figure``,
``table()`` and ``error`` follow the dashboard protocol. Invalid input (a batch of 0, a context
longer than the model's, tp of 0) is shown as a message in place of the chart.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .. import hardware, memory
from ..config import TrainConfig, check_int, load_model_preset, model_presets

from ..inference import kv_cache_bytes, max_concurrent_sequences, weight_bytes
from ..inference.config import EngineConfig
from ..inference.kv_cache import GPU_MEMORY_UTILIZATION, TP_CHOICES, kv_block_bytes, min_tp_that_fits
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
PAGED_BLOCK_SIZE = EngineConfig.block_size  # tokens per block of the engine's paged pool (its default)
BATCHES = tuple(int(x) for x in np.unique(np.logspace(0, 10, 21, base=2).astype(int)))  # decode sweep, 1..1024


class InferenceWidget(ControlPanel):
    """Controls: model preset, GPU, context (tokens per sequence), decode batch (sequences), KV-cache
    dtype, weight dtype, tensor-parallel degree."""

    words = {"tp": "TP degree", "batch": "decode batch"}  # the error messages' names in words (``base.in_words``)

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
            figure = Figure(figsize=(11.5, 3.6), layout="none")
            self._ax, self._ax_fit, self._ax_dec = figure.subplots(1, 3, gridspec_kw={"width_ratios": [1.3, 1, 1]})
        figure.subplots_adjust(left=0.06, right=0.95, top=0.9, bottom=0.15, wspace=0.32)
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
        memory.check(cfg, TrainConfig(tp=tp))  # TP splits the heads: as the memory model refuses it (TP 3, 64 heads)
        gpu = hardware.gpu(s["gpu"])
        peak_dtype = s["weight_dtype"] if s["weight_dtype"] in gpu.peak_flops else "fp32"
        if peak_dtype not in gpu.peak_flops:
            raise ValueError(f"{s['gpu']} has no {s['weight_dtype']} peak: choose one of {sorted(gpu.peak_flops)}")
        pre = prefill_cost(cfg, gpu, ctx, dtype=peak_dtype, kv_dtype=s["dtype"])
        dec = decode_cost(cfg, gpu, ctx, batch=b, dtype=peak_dtype, kv_dtype=s["dtype"])
        kv = {"dtype": s["dtype"], "weight_dtype": s["weight_dtype"]}
        weights = weight_bytes(cfg, s["weight_dtype"])
        usable = GPU_MEMORY_UTILIZATION * gpu.memory_bytes
        contexts = [c for c in (2**i for i in range(7, 21)) if c <= cfg.seq_len]
        if contexts[-1] != cfg.seq_len:
            contexts.append(cfg.seq_len)
        max_seqs = max_concurrent_sequences(cfg, gpu, ctx, tp=tp, gpu_memory_utilization=GPU_MEMORY_UTILIZATION, **kv)
        return {
            "cfg": cfg,
            "gpu": gpu,
            "prefill": pre,
            "decode": dec,
            "kv_per_seq": kv_cache_bytes(cfg, ctx, s["dtype"]),
            "kv_batch": kv_cache_bytes(cfg, ctx * b, s["dtype"]),
            "kv_paged_per_seq": math.ceil(ctx / PAGED_BLOCK_SIZE) * kv_block_bytes(cfg, PAGED_BLOCK_SIZE, s["dtype"]),
            "weights": weights,
            "usable": usable,
            "weights_fit": weights / tp < usable,
            "max_seqs": max_seqs,
            "batch_fits": max_seqs >= b,
            "min_tp": min_tp_that_fits(cfg, gpu, ctx, batch=1, gpu_memory_utilization=GPU_MEMORY_UTILIZATION, **kv),
            "min_tp_batch": min_tp_that_fits(
                cfg, gpu, ctx, batch=b, gpu_memory_utilization=GPU_MEMORY_UTILIZATION, **kv
            ),
            "contexts": contexts,
            "seqs_vs_context": [
                max_concurrent_sequences(cfg, gpu, c, tp=tp, gpu_memory_utilization=GPU_MEMORY_UTILIZATION, **kv)
                for c in contexts
            ],
            "decode_curve": [
                decode_cost(cfg, gpu, ctx, batch=x, dtype=peak_dtype, kv_dtype=s["dtype"]) for x in BATCHES
            ],
            "state": s,
        }

    def rows(self, r: dict) -> pd.DataFrame:
        pre, dec = r["prefill"], r["decode"]
        rows = [
            ("KV cache per sequence", r["kv_per_seq"], "bytes"),
            ("KV cache for the batch", r["kv_batch"], "bytes"),
            (
                f"paged KV pool per sequence ({PAGED_BLOCK_SIZE}-token blocks, scales included)",
                r["kv_paged_per_seq"],
                "bytes",
            ),
            ("weights", r["weights"], "bytes"),
            ("weights per GPU", r["weights"] / r["state"]["tp"], "bytes"),
            ("usable memory per GPU", r["usable"], "bytes"),
            ("sequences that fit (per GPU, after weights)", r["max_seqs"], "sequences"),
            ("smallest TP that fits one sequence", r["min_tp"] or np.nan, "GPUs"),
            ("smallest TP that fits the batch", r["min_tp_batch"] or np.nan, "GPUs"),
            ("ridge point", dec.ridge_flop_per_byte, "FLOP/byte"),
        ]
        if r["max_seqs"] >= 1:  # a layout that cannot hold one sequence has no prefill
            rows += [
                ("prefill time (one prompt of `context` tokens)", pre.time_s, "s"),
                ("prefill intensity", pre.intensity_flop_per_byte, "FLOP/byte"),
            ]
        if r["batch_fits"]:  # no decode numbers for a batch that cannot run
            rows += [
                ("decode step time (batch, at `context`)", dec.time_s, "s"),
                ("decode time per token", dec.time_per_token_s, "s"),
                ("decode throughput", dec.tokens_per_s, "tokens/s"),
                ("decode intensity", dec.intensity_flop_per_byte, "FLOP/byte"),
            ]
        return pd.DataFrame(rows, columns=["quantity", "value", "unit"]).set_index("quantity")

    def headline(self, r: dict) -> str:
        s, pre, dec = r["state"], r["prefill"], r["decode"]
        gb = lambda x: f"{x / 1e9:.3g} GB"  # noqa: E731
        where = f"{s['model']} on {s['gpu']} (TP {s['tp']})"
        if not r["weights_fit"]:
            need = f"needs TP ≥ {r['min_tp']}" if r["min_tp"] else f"does not fit even at TP {TP_CHOICES[-1]}"
            return (
                f"{where}: <b class='mlsys-verdict' style='color:#D55E00'>does not fit: weights "
                f"{gb(r['weights'] / s['tp'])} > {gb(r['usable'])} usable; {need}</b> "
                f"({s['weight_dtype']} weights, {GPU_MEMORY_UTILIZATION:.0%} of {gb(r['gpu'].memory_bytes)} "
                "per GPU). No throughput: this layout cannot run."
            )
        kv = (
            f"KV cache {gb(r['kv_per_seq'])} per {s['context']}-token sequence ({s['dtype']}), weights "
            f"{gb(r['weights'] / s['tp'])} per GPU; <b>{r['max_seqs']} sequences fit</b> "
            f"({GPU_MEMORY_UTILIZATION:.0%} of memory)"
        )
        if not r["batch_fits"]:
            need = f"TP ≥ {r['min_tp_batch']}" if r["min_tp_batch"] else "a smaller batch or context"
            return (
                f"{where}: {kv}. <b class='mlsys-verdict' style='color:#D55E00'>batch {s['batch']} does not fit: "
                f"only {r['max_seqs']} sequences fit; needs {need}</b>. No decode throughput for this batch."
            )
        tp_note = (
            " (the whole model on one GPU's roof: TP's split and communication are not modelled)" if s["tp"] > 1 else ""
        )
        return (
            f"{where}: {kv}. Prefill: {pre.time_s * 1e3:.3g} ms, {pre.bound}-bound. "
            f"Decode at batch {s['batch']}: {dec.time_s * 1e3:.3g} ms per step, "
            f"{dec.tokens_per_s:,.0f} tokens/s, {dec.bound}-bound. <i>Roofline model, 100% of peak{tp_note}.</i>"
        )

    def _setup(self):
        """Artists, log axes with plain-text tick labels (mathtext labels dominate a redraw)."""
        from matplotlib.ticker import FuncFormatter, LogLocator

        ax, fit, dec_ax = self._ax, self._ax_fit, self._ax_dec
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
            # sequences that fit vs context
            seqs = fit.plot([], [], "-o", color=PALETTE[2], ms=3, label="sequences that fit")[0]
            batch_line = fit.axhline(1, color=PALETTE[1], ls="--", lw=1, label="your batch")
            ctx_line = fit.axvline(1, color="grey", ls=":", lw=1, label="your context")
            fit.set_xscale("log", base=2)
            fit.set_yscale("symlog", linthresh=1)
            fit.yaxis.set_major_formatter(FuncFormatter(lambda y, _p=None: "0" if y == 0 else pow10_label(y)))
            label(fit, "context (tokens)", "sequences that fit per GPU (model)")
            fit.legend(fontsize=8, loc="upper right")
            fit_title = fit.set_title("", fontsize=10)
            # decode tokens/s and time per token vs batch
            tps = dec_ax.plot([], [], "-", color=PALETTE[0], lw=1.5, label="tokens/s")[0]
            tps_you = dec_ax.plot([], [], "s", color=PALETTE[1], ms=7, label="your batch")[0]
            dec_ax.set_xscale("log", base=2)
            dec_ax.set_yscale("log")
            for axis in (fit.xaxis, dec_ax.xaxis):  # plain integers: mathtext labels dominate a redraw
                axis.set_major_formatter(FuncFormatter(lambda x, _p=None: f"{x:.0f}"))
                axis.set_major_locator(LogLocator(base=4.0))
            dec_ax.yaxis.set_major_formatter(FuncFormatter(pow10_label))
            label(dec_ax, "decode batch (sequences)", "decode throughput (tokens/s, model)")
            lat_ax = dec_ax.twinx()
            lat = lat_ax.plot([], [], "--", color=PALETTE[3], lw=1.2, label="time per step")[0]
            lat_ax.set_yscale("log")
            lat_ax.yaxis.set_major_formatter(FuncFormatter(pow10_label))
            lat_ax.set_ylabel("decode step time (ms, model)", color=PALETTE[3])
            lat_ax.grid(False)
            no_fit = dec_ax.axvspan(1, 1, color=PALETTE[3], alpha=0.12, lw=0, label="batch does not fit")
            dec_ax.legend(
                [tps, lat, tps_you, no_fit],
                ["tokens/s", "time per step", "your batch", "does not fit"],
                fontsize=7,
                loc="upper left",
            )
            dec_title = dec_ax.set_title("", fontsize=10)
            verdict = dec_ax.text(
                0.5,
                0.5,
                "",
                transform=dec_ax.transAxes,
                ha="center",
                va="center",
                color=PALETTE[3],
                fontsize=10,
                wrap=True,
            )
        self._lat_ax = lat_ax
        self._artists = {
            "roof": roof,
            "curve": curve,
            "dec": dec,
            "pre": pre,
            "title": title,
            "seqs": seqs,
            "batch_line": batch_line,
            "ctx_line": ctx_line,
            "fit_title": fit_title,
            "tps": tps,
            "tps_you": tps_you,
            "lat": lat,
            "no_fit": no_fit,
            "dec_title": dec_title,
            "verdict": verdict,
        }

    def draw(self, r: dict) -> None:
        if self._artists is None:
            self._setup()
        a, gpu, pre, dec, s = self._artists, r["gpu"], r["prefill"], r["decode"], r["state"]
        runs, batch_runs = r["weights_fit"] and r["max_seqs"] >= 1, r["batch_fits"]
        xs = np.array([0.1, pre.ridge_flop_per_byte, 1e5])
        a["roof"].set_data(xs, np.minimum(pre.peak_flops, xs * pre.bandwidth_bytes_per_s))
        curve = r["decode_curve"]
        a["curve"].set_data([c.intensity_flop_per_byte for c in curve], [c.flops / c.time_s for c in curve])
        # a layout that cannot run has no operating point
        a["dec"].set_data(*(([dec.intensity_flop_per_byte], [dec.flops / dec.time_s]) if batch_runs else ([], [])))
        a["pre"].set_data(*(([pre.intensity_flop_per_byte], [pre.flops / pre.time_s]) if runs else ([], [])))
        a["title"].set_text(f"{gpu.name} roofline: decode batch {dec.batch}, prefill {pre.tokens} tokens")
        self._ax.set_ylim(pre.peak_flops * 1e-5, pre.peak_flops * 3)
        # sequences that fit vs context
        ctxs, seqs = r["contexts"], r["seqs_vs_context"]
        a["seqs"].set_data(ctxs, seqs)
        a["batch_line"].set_ydata([s["batch"], s["batch"]])
        a["ctx_line"].set_xdata([s["context"], s["context"]])
        self._ax_fit.set_xlim(ctxs[0] / 1.5, ctxs[-1] * 1.5)
        self._ax_fit.set_ylim(0, max(max(seqs), s["batch"], 1) * 3)
        a["fit_title"].set_text(
            f"TP {s['tp']}: {r['max_seqs']} sequences fit at {s['context']} tokens"
            if r["weights_fit"]
            else f"weights do not fit at TP {s['tp']}"
        )
        # decode throughput and step time vs batch, the batches that do not fit shaded
        bs = [c.batch for c in curve]
        a["tps"].set_data(bs, [c.tokens_per_s for c in curve])
        a["lat"].set_data(bs, [c.time_s * 1e3 for c in curve])
        a["tps_you"].set_data(*(([dec.batch], [dec.tokens_per_s]) if batch_runs else ([], [])))
        lo = max(r["max_seqs"], 0) + 0.5 if r["weights_fit"] else 0.5
        a["no_fit"].set_x(lo)
        a["no_fit"].set_width(2048 - lo)
        self._ax_dec.set_xlim(0.7, 1500)
        tps_all = [c.tokens_per_s for c in curve] + [dec.tokens_per_s]
        self._ax_dec.set_ylim(min(tps_all) / 2, max(tps_all) * 4)
        lat_all = [c.time_s * 1e3 for c in curve] + [dec.time_s * 1e3]
        self._lat_ax.set_ylim(min(lat_all) / 2, max(lat_all) * 4)
        a["dec_title"].set_text(f"decode at {s['context']} tokens of context")
        a["verdict"].set_text(
            "" if r["weights_fit"] else f"does not fit\nneeds TP ≥ {r['min_tp']}" if r["min_tp"] else "does not fit"
        )
