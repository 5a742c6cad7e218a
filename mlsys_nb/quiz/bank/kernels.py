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
from ._util import fusion, hierarchy, kernels, pick


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


@family("kernels.op_intensity", "kernels", section=SEC_ROOF, reference=REF_ROOF)
def _op_intensity(rng):
    name = pick(rng, ["add", "softmax", "layernorm", "matmul"])
    n = pick(rng, [256, 1024, 4096, 8192])
    dtype = pick(rng, list(BYTES))
    flops, nbytes = hierarchy.op_flops_bytes(name, n, elem_bytes=BYTES[dtype])
    what = {
        "add": f"an elementwise add of two {n}×{n} tensors (1 FLOP per output element)",
        "softmax": f"a row softmax of a {n}×{n} tensor (count 5 FLOPs per element)",
        "layernorm": f"a layer norm over the rows of a {n}×{n} tensor (count 8 FLOPs per element)",
        "matmul": f"a {n}×{n} by {n}×{n} matmul (2n³ FLOPs)",
    }[name]
    return dict(
        text=f"In {dtype}, what is the arithmetic intensity (FLOP per byte) of {what}, if every input is read "
        "once and every output written once?",
        params={"name": name, "n": n, "bytes": BYTES[dtype]},
        answer=flops / nbytes,
        unit="ratio",
        hints=["Intensity = FLOPs / bytes moved.", "Count the elements read and written, times the bytes each."],
        solution=[
            f"FLOPs {flops:.4g}, bytes {nbytes:.4g} (kernels.hierarchy.op_flops_bytes).",
            f"Intensity {flops / nbytes:.4g} FLOP/byte.",
        ],
        diagnostics=[(BYTES[dtype], "divide by the bytes per element too")],
    )


@family("kernels.op_bound", "kernels", kind="choice", section=SEC_ROOF, reference=REF_ROOF)
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


@family("kernels.op_roofline_time", "kernels", difficulty=2, section=SEC_ROOF, reference=REF_ROOF)
def _op_time(rng):
    name = pick(rng, ["add", "softmax", "matmul"])
    n = pick(rng, [1024, 4096, 8192])
    gpu = pick(rng, GPUS)
    c = hierarchy.op_cost(name, n, gpu, dtype="bf16")
    return dict(
        text=f"What is the roofline lower bound on the time of a bf16 {name} over {n}×{n} tensors on an {gpu} "
        "(inputs read once, outputs written once; softmax 5 FLOPs per element; matmul 2n³), in seconds?",
        params={"name": name, "n": n, "peak": c.peak_flops, "bw": c.bandwidth_bytes_per_s},
        answer=c.time_s,
        unit="seconds",
        hints=["time >= max(FLOPs / peak, bytes / bandwidth)."],
        solution=[
            f"Compute {c.compute_time_s:.4g} s, memory {c.memory_time_s:.4g} s.",
            f"The larger: {c.time_s:.4g} s (inference.roofline.StepCost.time_s).",
        ],
    )


@family("kernels.fusion_speedup", "kernels", section=SEC_FUSION, reference=REF_ROOF)
def _fusion_speedup(rng):
    k = pick(rng, [2, 3, 4, 5, 6])
    numel = pick(rng, [2**24, 2**26, 2**28])
    eager = fusion.unary_chain_bytes(numel, k, fused=False, elem_bytes=2)
    fused = fusion.unary_chain_bytes(numel, k, fused=True, elem_bytes=2)
    return dict(
        text=f"A chain of {k} unary elementwise ops runs over {numel} bf16 elements, memory-bound. Eager, each op "
        "is its own kernel; fused, one kernel. By what factor does fusion cut the time, by the bytes model?",
        params={"k": k, "numel": numel},
        answer=eager / fused,
        unit="ratio",
        hints=["Eager: each op reads its input and writes its output.", "Fused: read once, write once."],
        solution=[
            f"Eager {eager:.4g} bytes, fused {fused:.4g} bytes (kernels.fusion.unary_chain_bytes).",
            f"Speed-up {eager / fused:.4g}x when both run at the same bandwidth.",
        ],
        diagnostics=[(2.0, "each eager op reads AND writes")],
    )


@family("kernels.flash_block_sizes", "kernels", section=SEC_FLASH, reference=REF_FA)
def _block_sizes(rng):
    m = pick(rng, [16384, 24576, 32768, 49152])
    d = pick(rng, [64, 128, 256])
    br, bc = kernels.paper_block_sizes(m, d)
    return dict(
        text=f"FlashAttention's Algorithm 1 with an on-chip SRAM of M = {m} elements and head dimension d = {d}: "
        "what is the key block size B_c?",
        params={"m": m, "d": d},
        answer=float(bc),
        unit="count",
        tolerance=0.0,
        hints=["Four blocks of B × d (Q, K, V, O) must fit in M."],
        solution=[f"B_c = ceil(M / 4d) = {bc}; B_r = min(B_c, d) = {br} (kernels.paper_block_sizes)."],
    )


@family("kernels.flash_hbm_bytes", "kernels", difficulty=3, section=SEC_FLASH, reference=REF_FA)
def _hbm_bytes(rng):
    s = pick(rng, [1024, 2048, 4096, 8192])
    d = pick(rng, [64, 128])
    m = pick(rng, [16384, 32768])
    nbytes = kernels.flash_io_bytes(s, d, m, elem_bytes=2)
    return dict(
        text=f"FlashAttention's Algorithm 1 runs one head of s = {s} tokens, d = {d}, in bf16, with SRAM M = {m} "
        "elements (B_c = ceil(M/4d), B_r = min(B_c, d)). Count the HBM bytes: O and the row statistic lse "
        "initialised once (one number per row); K, V read once; for each key block, every query block's Q_i, "
        "O_i, lse_i read and O_i, lse_i written. How many bytes in total?",
        params={"s": s, "d": d, "m": m, "bytes": 2},
        answer=nbytes,
        unit="bytes",
        hints=["T_c = ceil(s / B_c) passes over the queries.", "Each pass: s·(2d+1) read, s·(d+1) written."],
        solution=[
            f"{nbytes:.4g} bytes (kernels.flash_io_bytes, pinned by the instrumented count).",
            "≈ 12·s²·d²/M elements: Θ(s²d²/M).",
        ],
    )


@family("kernels.score_matrix_memory", "kernels", section=SEC_FLASH, reference=REF_FA)
def _score_memory(rng):
    b = pick(rng, [1, 4, 8])
    h = pick(rng, [16, 32, 64])
    s = pick(rng, [2048, 8192, 32768])
    nbytes = kernels.score_matrix_bytes(b, h, s, s, elem_bytes=2)
    return dict(
        text=f"Standard attention over batch {b}, {h} heads and s = {s} tokens in bf16 materialises the score "
        "matrix. How many bytes does one copy of it take (FlashAttention keeps only one log-sum-exp per row)?",
        params={"b": b, "h": h, "s": s},
        answer=nbytes,
        unit="bytes",
        hints=["One score per (batch, head, query, key)."],
        solution=[f"b·h·s²·2 = {nbytes:.4g} bytes (kernels.score_matrix_bytes)."],
        diagnostics=[(0.5, "bf16 is 2 bytes per element")],
    )


@family("kernels.online_softmax_merge", "kernels", difficulty=2, section=SEC_FLASH, reference=REF_FA)
def _merge(rng):
    import torch

    la, lb = pick(rng, [0.5, 1.0, 2.0, 3.0]), pick(rng, [-1.0, 0.0, 1.5, 4.0])
    oa, ob = pick(rng, [1.0, 2.0, -1.0]), pick(rng, [3.0, 0.5, -2.0])
    out, _ = kernels.merge_partials(
        torch.tensor([[oa]], dtype=torch.float64),
        torch.tensor([la], dtype=torch.float64),
        torch.tensor([[ob]], dtype=torch.float64),
        torch.tensor([lb], dtype=torch.float64),
    )
    return dict(
        text=f"Two attention partials of one query over disjoint keys: output {oa} with log-sum-exp {la}, and "
        f"output {ob} with log-sum-exp {lb} (each output normalised over its own keys, head dim 1). What is the "
        "output over all the keys?",
        params={"la": la, "lb": lb, "oa": oa, "ob": ob},
        answer=float(out),
        unit="ratio",
        hints=["Weight each partial by its share of the total exp-sum: e^lse_a / (e^lse_a + e^lse_b)."],
        solution=[
            f"lse = log(e^{la} + e^{lb}) = {math.log(math.exp(la) + math.exp(lb)):.4g}.",
            f"out = e^(lse_a − lse)·{oa} + e^(lse_b − lse)·{ob} = {float(out):.4g} (kernels.merge_partials).",
        ],
    )


def _fill_note(work: int, sms: int, fill: int, n: int) -> str:
    if fill == n:
        return "the same here."
    waves = work * fill / sms
    if fill > n:
        return "flash-attn takes fewer: their waves are efficient enough, and each split adds a partial to merge."
    return f"its last wave is only {waves / math.ceil(waves):.0%} full, so flash-attn takes more splits."


@family("kernels.decode_splits", "kernels", difficulty=2, section=SEC_DECODE, reference=REF_DECODE)
def _splits(rng):
    b = pick(rng, [1, 2, 4])
    h = pick(rng, [8, 16, 32])
    gpu = pick(rng, ["H100-SXM", "A100-80GB-SXM"])
    sms = hardware.gpu(gpu).sms
    n = kernels.decode_splits(b, h, sms)
    fill = kernels.fill_splits(b, h, sms)
    work = b * h
    waves = work * n / sms
    return dict(
        text=f"A decode step (one query per sequence, a long KV cache) runs batch {b} with {h} attention heads "
        f"on an {gpu} ({sms} SMs), one thread block per (sequence, head, KV split). flash-attn's FlashDecoding "
        "keeps 1 split when batch·heads >= 0.8·SMs; otherwise, over 1 to 128 splits, it takes the fewest whose "
        "wave efficiency n_waves / ceil(n_waves) (n_waves = batch·heads·splits / SMs) is at least 85 % of the "
        "best. How many KV splits does it take?",
        params={"b": b, "h": h, "sms": sms},
        answer=float(n),
        unit="count",
        tolerance=0.0,
        hints=[
            f"Work items without splitting: {b}·{h} = {work}; compare with 0.8·{sms}.",
            "Tabulate the wave efficiency for small split counts; a count that makes the waves whole scores 1.",
        ],
        solution=[
            f"batch·heads = {work} {'>=' if work >= 0.8 * sms else '<'} 0.8·{sms} = {0.8 * sms:.1f}.",
            f"{n} split(s): n_waves = {waves:.3g}, wave efficiency {waves / math.ceil(waves):.2f} "
            f"(kernels.decode_splits, flash-attn's num_splits_heuristic).",
            f"For comparison, the fewest splits that give every SM a block: ceil({sms}/{work}) = {fill} "
            f"(kernels.fill_splits); {_fill_note(work, sms, fill, n)}",
        ],
        diagnostics=[
            (
                fill / n,
                "that is the fewest splits that give every SM a block; flash-attn takes the fewest "
                "within 85 % of the best wave efficiency",
            )
        ]
        if fill != n
        else [],
    )
