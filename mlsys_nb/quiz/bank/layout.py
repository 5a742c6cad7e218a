"""Families of the topic ``layout``: choosing a parallel layout (the smallest ZeRO stage, TP inside
a node, the planner's fastest layout and its modelled MFU).

Answer keys: ``memory.model_state_bytes``, ``comm.collective_time``, ``mlsys_nb.planner.evaluate``.
"""

from __future__ import annotations

from ... import comm, hardware, memory
from ..core import family
from ._util import gb, gbps, pick, ratio_family
from .memory import N_PARAMS, REF_MEM, SEC_MEM

SEC_STAGES = SEC_MEM + ", §1 Model states, §5 How each parallelism divides each term"
SEC_TP_NODE = "notebooks/07_tensor_parallelism.ipynb, §7 What TP costs at scale, and why it stays inside a node"
REF_TP_NODE = "docs/references.md#megatron-ptdp (Narayanan et al. 2021, arXiv:2104.04473, §3)"


@family("layout.smallest_zero_stage", kind="choice", difficulty=2, section=SEC_STAGES, reference=REF_MEM)
def _zstage(rng):
    n = pick(rng, N_PARAMS[3:])
    dp = pick(rng, [8, 16, 64, 256])
    g = pick(rng, ["H100-SXM", "A100-80GB-SXM", "A100-40GB-SXM"])
    cap = hardware.gpu(g).memory_bytes * 0.5  # half the GPU left for activations
    stages = [z for z in range(4) if memory.model_state_bytes(n, dp=dp, zero=z).total <= cap]
    ans = f"ZeRO-{stages[0]}" if stages else "none fits"
    return dict(
        text=f"{n:.3g} parameters, bf16-mixed Adam, dp = {dp} on {g}. Keeping model states under half of "
        f"the GPU ({gb(cap)}), what is the smallest ZeRO stage that does it?",
        params={"n_params": n, "dp": dp, "gpu": g},
        answer=ans,
        choices=["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3", "none fits"],
        hints=["16 B/param unsharded; stage 1 shards 12 of them, 2 also the grads, 3 everything."],
        solution=[f"ZeRO-{z}: {gb(memory.model_state_bytes(n, dp=dp, zero=z).total)}" for z in range(4)]
        + [f"Smallest under {gb(cap)}: {ans} (memory.model_state_bytes)."],
    )


def _tp_node_case(rng):
    b, s, h = 1, 4096, pick(rng, [5120, 8192])
    return {"bytes": b * s * h * 2, "tp": 8, "beta_inter": pick(rng, [25e9, 50e9])}


NVLINK = hardware.link("nvlink4")
NETWORK_ALPHA = 10e-6  # an assumed default between nodes, not a datasheet value


ratio_family(
    family("layout.tp_within_node", section=SEC_TP_NODE, reference=REF_TP_NODE),
    draw=_tp_node_case,
    calc=lambda p, alpha, beta: comm.collective_time("all_reduce", p["bytes"], p["tp"], alpha, beta),
    over=lambda p: dict(alpha=NETWORK_ALPHA, beta=p["beta_inter"]),
    under=dict(alpha=NVLINK.latency_s, beta=NVLINK.per_direction_bytes_per_s),
    fields=lambda p, over, under, ratio: {
        "mb": p["bytes"] / 1e6,
        "beta_gbps": gbps(p["beta_inter"]),
        "nvlink_beta": gbps(NVLINK.per_direction_bytes_per_s),
        "nvlink_alpha_us": NVLINK.latency_s * 1e6,
        "under_us": under * 1e6,
        "over_us": over * 1e6,
    },
    text=(
        "One TP all-reduce of {mb:.4g} MB over tp = 8: how many times slower across nodes (β = {beta_gbps}, α "
        "= 10 us) than inside an NVLink4 node (β = {nvlink_beta} from the datasheet, α = {nvlink_alpha_us:g} "
        "us)? (Both α are assumed defaults, not datasheet values.)"
    ),
    hints=["Both are ring all-reduces: compare α-β times.", "Bandwidth dominates at this size."],
    solution=[
        "NVLink: {under_us:.4g} us; network: {over_us:.4g} us (comm.collective_time).",
        "Ratio {ratio:.3g}: keep TP inside a node, put PP/DP across nodes.",
    ],
)


SEC12 = "notebooks/12_putting_parallelism_together.ipynb, §3 Searching the layout space: a planner"
REF_PLAN = "docs/references.md#megatron-ptdp (Narayanan et al. 2021, arXiv:2104.04473), #llama3"
LAYOUTS = {  # the candidates of layout.fastest_layout
    "dp only, ZeRO-3": dict(tp=1, zero=3),
    "tp=2, ZeRO-1": dict(tp=2, zero=1),
    "tp=8, ZeRO-1": dict(tp=8, zero=1),
    "tp=4 x pp=2 (1F1B), ZeRO-1": dict(tp=4, pp=2, schedule="1f1b", zero=1),
}


def _plan_case(rng):
    return (
        pick(rng, ["llama-3-8b", "llama-2-13b", "llama-3.2-3b"]),
        pick(rng, [32, 64, 128]),
        pick(rng, ["H100-SXM", "A100-80GB-SXM"]),
        pick(rng, [2, 4, 8]) * 2**20,
    )


def _evaluate(model, lay, gpus, gpu, tokens):
    from ... import planner

    try:
        # the uncalibrated model (datasheet peaks), as when the questions were pinned (tests/quiz_golden.py)
        return planner.evaluate(
            model, gpus=gpus, gpu=gpu, global_batch_tokens=tokens, seq_len=4096, calibration=None, **lay
        )
    except ValueError:
        return None


@family("layout.fastest_layout", kind="choice", difficulty=3, section=SEC12, reference=REF_PLAN)
def _fastest(rng):
    model, gpus, gpu, tokens = _plan_case(rng)
    plans = {k: _evaluate(model, v, gpus, gpu, tokens) for k, v in LAYOUTS.items()}
    ok = {k: p for k, p in plans.items() if p is not None and p.fits}
    ans = min(ok, key=lambda k: ok[k].step_s) if ok else "none fits"
    return dict(
        text=f"Training {model} on {gpus} × {gpu} (8 per node, InfiniBand between nodes), global batch "
        f"{tokens / 2**20:g}M tokens of 4096: which layout has the shortest modelled step among those "
        f"that fit (the kit's planner: α-β communication, 80 % of DP traffic overlapped, 100 % of peak)?",
        params={"model": model, "gpus": gpus, "gpu": gpu, "global_batch_tokens": tokens},
        answer=ans,
        choices=[*LAYOUTS, "none fits"],
        hints=[
            "TP traffic is per layer and per micro-batch; DP traffic once per step (and mostly hidden).",
            "ZeRO-3 adds parameter all-gathers every micro-batch.",
        ],
        solution=[
            f"{k}: "
            + (
                f"step {p.step_s:.3g} s, {gb(p.memory_bytes)}, fits={p.fits}; {p.bottleneck}"
                if p is not None
                else "not allowed"
            )
            for k, p in plans.items()
        ]
        + [f"Fastest that fits: {ans} (planner.evaluate)."],
    )


@family("layout.modelled_mfu", difficulty=3, section=SEC12, reference=REF_PLAN)
def _plan_mfu(rng):
    for _ in range(50):
        model, gpus, gpu, tokens = _plan_case(rng)
        name = pick(rng, list(LAYOUTS))
        p = _evaluate(model, LAYOUTS[name], gpus, gpu, tokens)
        if p is not None:
            break
    return dict(
        text=f"The planner's modelled step for {model} on {gpus} × {gpu} with '{name}', global batch "
        f"{tokens / 2**20:g}M tokens of 4096, takes {p.step_s:.4g} s. What MFU is that (model FLOPs "
        f"per step / (GPUs × bf16 peak × step time))?",
        params={
            "model": model,
            "gpus": gpus,
            "gpu": gpu,
            "layout": name,
            "global_batch_tokens": tokens,
            "step_s": p.step_s,
        },
        answer=p.mfu,
        unit="fraction",
        hints=[
            "Model FLOPs per step = exact FLOPs per token × tokens per step.",
            "Divide by GPUs × peak × step seconds.",
        ],
        solution=[
            "Time by component: " + ", ".join(f"{k} {v:.3g} s" for k, v in p.time.items()),
            f"MFU = {p.mfu:.4g} (planner.evaluate(...).mfu).",
        ],
    )
