"""Families of the topic ``kernels``: arithmetic intensity and bound of an op on a GPU, an op's roofline time,
fusion's saved bytes and speed-up, FlashAttention's block sizes and HBM traffic, the score matrix it never
stores, the online-softmax merge, FlashDecoding's split count (flash-attn's heuristic).

Answer keys: ``mlsys_nb.kernels`` (``hierarchy.op_flops_bytes``, ``hierarchy.op_cost``,
``fusion.unary_chain_bytes``, ``paper_block_sizes``, ``flash_io_bytes``, ``score_matrix_bytes``,
``merge_partials``, ``decode_splits``, ``fill_splits``) and ``hardware.gpu``, the functions notebook 21 runs.
"""

from __future__ import annotations

import math

from ... import hardware
from ..core import family
from ._util import fusion, hierarchy, kernels, numeric_family, pick, picks, ratio_family


NB = "notebooks/21_inside_one_gpu.ipynb"
SEC_ROOF = f"{NB}, §2 Arithmetic intensity and the roofline"
SEC_FUSION = f"{NB}, §3 Fusion"
SEC_FLASH = f"{NB}, §4 FlashAttention from scratch"
SEC_DECODE = f"{NB}, §6 FlashDecoding and what FlashAttention-2 and -3 change"
REF_ROOF = "docs/references.md#roofline (Williams et al. 2009)"
REF_FA = "docs/references.md#flashattention (Dao et al. 2022, arXiv:2205.14135, Alg. 1, Thm. 2)"
REF_DECODE = "docs/references.md#flash-decoding (Dao, Haziza, Massa, Sizov 2023)"
GPUS = ["H100-SXM", "A100-80GB-SXM", "H200-SXM"]
BYTES = {"fp32": 4, "bf16": 2}


OP_WORDS = {  # how the op_intensity question words each op over an n×n tensor
    "add": "an elementwise add of two {n}×{n} tensors (1 FLOP per output element)",
    "softmax": "a row softmax of a {n}×{n} tensor (count 5 FLOPs per element)",
    "layernorm": "a layer norm over the rows of a {n}×{n} tensor (count 8 FLOPs per element)",
    "matmul": "a {n}×{n} by {n}×{n} matmul (2n³ FLOPs)",
}


def _intensity_case(rng) -> dict:
    name, n = pick(rng, ["add", "softmax", "layernorm", "matmul"]), pick(rng, [256, 1024, 4096, 8192])
    dtype = pick(rng, list(BYTES))
    return {"name": name, "n": n, "dtype": dtype, "bytes": BYTES[dtype]}


numeric_family(
    family("kernels.op_intensity", section=SEC_ROOF, reference=REF_ROOF),
    draw=_intensity_case,
    calc=lambda p: hierarchy.op_flops_bytes(p["name"], p["n"], elem_bytes=p["bytes"]),
    key=lambda fb: fb[0] / fb[1],
    params=("name", "n", "bytes"),
    unit="ratio",
    fields=lambda p, result: {"op": OP_WORDS[p["name"]].format(n=p["n"]), "ratio": result[0] / result[1]},
    text=(
        "In {dtype}, what is the arithmetic intensity (FLOP per byte) of {op}, if every input is read once "
        "and every output written once?"
    ),
    hints=["Intensity = FLOPs / bytes moved.", "Count the elements read and written, times the bytes each."],
    solution=[
        "FLOPs {result[0]:.4g}, bytes {result[1]:.4g} (kernels.hierarchy.op_flops_bytes).",
        "Intensity {ratio:.4g} FLOP/byte.",
    ],
    diagnostics=lambda p, fb: [(p["bytes"], "divide by the bytes per element too")],
)


@family("kernels.op_bound", kind="choice", section=SEC_ROOF, reference=REF_ROOF)
def _op_bound(rng):
    name = pick(rng, ["add", "softmax", "layernorm", "matmul", "matmul"])
    n = pick(rng, [64, 128, 512, 4096])
    gpu = pick(rng, GPUS)
    c = hierarchy.op_cost(name, n, gpu, dtype="bf16")
    g = hardware.gpu(gpu)
    return dict(
        text=f"On an {gpu} ({g.peak('bf16') / 1e12:.1f} TFLOP/s bf16 dense, {g.hbm_bandwidth_bytes_per_s / 1e12:.3g} "
        f"TB/s HBM), is a bf16 {name} over {n}×{n} tensors (inputs read once, outputs written once; softmax 5, "
        "layer norm 8 FLOPs per element) compute-bound or memory-bound?",
        params={"name": name, "n": n, "peak": g.peak("bf16"), "bw": g.hbm_bandwidth_bytes_per_s},
        answer=c.bound,
        choices=["compute", "memory"],
        hints=["Compare the intensity FLOPs/bytes with the ridge point peak/bandwidth."],
        solution=[
            f"Intensity {c.intensity_flop_per_byte:.4g} FLOP/byte, ridge {c.ridge_flop_per_byte:.4g}.",
            f"So {c.bound}-bound (kernels.hierarchy.op_cost, on inference.roofline.StepCost).",
        ],
    )


def _op_case(rng) -> dict:
    name, n, gpu = pick(rng, ["add", "softmax", "matmul"]), pick(rng, [1024, 4096, 8192]), pick(rng, GPUS)
    g = hardware.gpu(gpu)
    return {"name": name, "n": n, "gpu": gpu, "peak": g.peak("bf16"), "bw": g.hbm_bandwidth_bytes_per_s}


numeric_family(
    family("kernels.op_roofline_time", difficulty=2, section=SEC_ROOF, reference=REF_ROOF),
    draw=_op_case,
    calc=lambda p: hierarchy.op_cost(p["name"], p["n"], p["gpu"], dtype="bf16"),
    key=lambda c: c.time_s,
    params=("name", "n", "peak", "bw"),
    unit="seconds",
    text=(
        "What is the roofline lower bound on the time of a bf16 {name} over {n}×{n} tensors on an {gpu} "
        "(inputs read once, outputs written once; softmax 5 FLOPs per element; matmul 2n³), in seconds?"
    ),
    hints=["time >= max(FLOPs / peak, bytes / bandwidth)."],
    solution=[
        "Compute {result.compute_time_s:.4g} s, memory {result.memory_time_s:.4g} s.",
        "The larger: {result.time_s:.4g} s (inference.roofline.StepCost.time_s).",
    ],
)


ratio_family(
    family("kernels.fusion_speedup", section=SEC_FUSION, reference=REF_ROOF),
    draw=lambda rng: picks(rng, k=[2, 3, 4, 5, 6], numel=[2**24, 2**26, 2**28]),
    calc=lambda p, fused: fusion.unary_chain_bytes(p["numel"], p["k"], fused=fused, elem_bytes=2),
    over=dict(fused=False),
    under=dict(fused=True),
    text=(
        "A chain of {k} unary elementwise ops runs over {numel} bf16 elements, memory-bound. Eager, each op "
        "is its own kernel; fused, one kernel. By what factor does fusion cut the time, by the bytes model?"
    ),
    hints=["Eager: each op reads its input and writes its output.", "Fused: read once, write once."],
    solution=[
        "Eager {over:.4g} bytes, fused {under:.4g} bytes (kernels.fusion.unary_chain_bytes).",
        "Speed-up {ratio:.4g}x when both run at the same bandwidth.",
    ],
    diagnostics=[(2.0, "each eager op reads AND writes")],
)

numeric_family(
    family("kernels.flash_block_sizes", section=SEC_FLASH, reference=REF_FA),
    draw=lambda rng: picks(rng, m=[16384, 24576, 32768, 49152], d=[64, 128, 256]),
    calc=lambda p: kernels.paper_block_sizes(p["m"], p["d"]),
    key=lambda brc: float(brc[1]),
    unit="count",
    tolerance=0.0,
    text=(
        "FlashAttention's Algorithm 1 with an on-chip SRAM of M = {m} elements and head dimension d = {d}: "
        "what is the key block size B_c?"
    ),
    hints=["Four blocks of B × d (Q, K, V, O) must fit in M."],
    solution=["B_c = ceil(M / 4d) = {result[1]}; B_r = min(B_c, d) = {result[0]} (kernels.paper_block_sizes)."],
)

numeric_family(
    family("kernels.flash_hbm_bytes", difficulty=3, section=SEC_FLASH, reference=REF_FA),
    draw=lambda rng: picks(rng, s=[1024, 2048, 4096, 8192], d=[64, 128], m=[16384, 32768], bytes=2),
    calc=lambda p: kernels.flash_io_bytes(p["s"], p["d"], p["m"], elem_bytes=2),
    unit="bytes",
    text=(
        "FlashAttention's Algorithm 1 runs one head of s = {s} tokens, d = {d}, in bf16, with SRAM M = {m} "
        "elements (B_c = ceil(M/4d), B_r = min(B_c, d)). Count the HBM bytes: O and the row statistic lse "
        "initialised once (one number per row); K, V read once; for each key block, every query block's Q_i, "
        "O_i, lse_i read and O_i, lse_i written. How many bytes in total?"
    ),
    hints=["T_c = ceil(s / B_c) passes over the queries.", "Each pass: s·(2d+1) read, s·(d+1) written."],
    solution=[
        "{result:.4g} bytes (kernels.flash_io_bytes, pinned by the instrumented count).",
        "≈ 12·s²·d²/M elements: Θ(s²d²/M).",
    ],
)

numeric_family(
    family("kernels.score_matrix_memory", section=SEC_FLASH, reference=REF_FA),
    draw=lambda rng: picks(rng, b=[1, 4, 8], h=[16, 32, 64], s=[2048, 8192, 32768]),
    calc=lambda p: kernels.score_matrix_bytes(p["b"], p["h"], p["s"], p["s"], elem_bytes=2),
    unit="bytes",
    text=(
        "Standard attention over batch {b}, {h} heads and s = {s} tokens in bf16 materialises the score "
        "matrix. How many bytes does one copy of it take (FlashAttention keeps only one log-sum-exp per row)?"
    ),
    hints=["One score per (batch, head, query, key)."],
    solution=["b·h·s²·2 = {result:.4g} bytes (kernels.score_matrix_bytes)."],
    diagnostics=[(0.5, "bf16 is 2 bytes per element")],
)


def _merged(p) -> float:
    """The merged output of the two partials (``kernels.merge_partials``, float64, one query, head dim 1)."""
    import torch

    def t(*x):
        return torch.tensor(x, dtype=torch.float64)

    out, _ = kernels.merge_partials(t([p["oa"]]), t(p["la"]), t([p["ob"]]), t(p["lb"]))
    return float(out)


numeric_family(
    family("kernels.online_softmax_merge", difficulty=2, section=SEC_FLASH, reference=REF_FA),
    draw=lambda rng: picks(
        rng, la=[0.5, 1.0, 2.0, 3.0], lb=[-1.0, 0.0, 1.5, 4.0], oa=[1.0, 2.0, -1.0], ob=[3.0, 0.5, -2.0]
    ),
    calc=_merged,
    unit="ratio",
    fields=lambda p, result: {"lse": math.log(math.exp(p["la"]) + math.exp(p["lb"]))},
    text=(
        "Two attention partials of one query over disjoint keys: output {oa} with log-sum-exp {la}, and "
        "output {ob} with log-sum-exp {lb} (each output normalised over its own keys, head dim 1). What is "
        "the output over all the keys?"
    ),
    hints=["Weight each partial by its share of the total exp-sum: e^lse_a / (e^lse_a + e^lse_b)."],
    solution=[
        "lse = log(e^{la} + e^{lb}) = {lse:.4g}.",
        "out = e^(lse_a − lse)·{oa} + e^(lse_b − lse)·{ob} = {result:.4g} (kernels.merge_partials).",
    ],
)


def _fill_note(work: int, sms: int, fill: int, n: int) -> str:
    if fill == n:
        return "the same here."
    waves = work * fill / sms
    if fill > n:
        return "flash-attn takes fewer: their waves are efficient enough, and each split adds a partial to merge."
    return f"its last wave is only {waves / math.ceil(waves):.0%} full, so flash-attn takes more splits."


def _splits_case(rng) -> dict:
    b, h, gpu = pick(rng, [1, 2, 4]), pick(rng, [8, 16, 32]), pick(rng, ["H100-SXM", "A100-80GB-SXM"])
    return {"b": b, "h": h, "gpu": gpu, "sms": hardware.gpu(gpu).sms}


def _waves(p, n) -> float:
    """Waves of thread blocks for ``n`` splits: batch·heads·splits / SMs."""
    return p["b"] * p["h"] * n / p["sms"]


def _splits_solution(p, n) -> list[str]:
    work, sms, fill = p["b"] * p["h"], p["sms"], kernels.fill_splits(p["b"], p["h"], p["sms"])
    return [
        f"batch·heads = {work} {'>=' if work >= 0.8 * sms else '<'} 0.8·{sms} = {0.8 * sms:.1f}.",
        f"{n} split(s): n_waves = {_waves(p, n):.3g}, wave efficiency {_waves(p, n) / math.ceil(_waves(p, n)):.2f} "
        f"(kernels.decode_splits, flash-attn's num_splits_heuristic).",
        f"For comparison, the fewest splits that give every SM a block: ceil({sms}/{work}) = {fill} "
        f"(kernels.fill_splits); {_fill_note(work, sms, fill, n)}",
    ]


def _splits_diagnostics(p, n) -> list:
    fill = kernels.fill_splits(p["b"], p["h"], p["sms"])
    hint = "that is the fewest splits that give every SM a block; flash-attn takes the fewest within 85 % of the best"
    return [(fill / n, hint + " wave efficiency")] if fill != n else []


numeric_family(
    family("kernels.decode_splits", difficulty=2, section=SEC_DECODE, reference=REF_DECODE),
    draw=_splits_case,
    calc=lambda p: kernels.decode_splits(p["b"], p["h"], p["sms"]),
    key=float,
    params=("b", "h", "sms"),
    unit="count",
    tolerance=0.0,
    text=lambda p: (
        f"A decode step (one query per sequence, a long KV cache) runs batch {p['b']} with {p['h']} attention heads "
        f"on an {p['gpu']} ({p['sms']} SMs), one thread block per (sequence, head, KV split). flash-attn's "
        "FlashDecoding keeps 1 split when batch·heads >= 0.8·SMs; otherwise, over 1 to 128 splits, it takes the "
        "fewest whose wave efficiency n_waves / ceil(n_waves) (n_waves = batch·heads·splits / SMs) is at least 85 % "
        "of the best. How many KV splits does it take?"
    ),
    hints=lambda p: [
        f"Work items without splitting: {p['b']}·{p['h']} = {p['b'] * p['h']}; compare with 0.8·{p['sms']}.",
        "Tabulate the wave efficiency for small split counts; a count that makes the waves whole scores 1.",
    ],
    solution=_splits_solution,
    diagnostics=_splits_diagnostics,
)
