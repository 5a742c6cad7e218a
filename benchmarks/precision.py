"""Number formats and mixed precision, measured on this CPU (the numbers notebook 22 shows, recorded).

    .venv/bin/python benchmarks/precision.py [--steps 40] [--out data/measured/precision.md]

- Rounding error of each format: random values spread over each format's normal range, cast (torch's real cast for
  fp32, bf16, fp16, fp8; the simulation ``mlsys_nb.precision.round_to_format`` for tf32 and fp4, labelled), largest and
  mean relative error against the bound 2^-(m+1).
- FP8 matmul error on activations with outliers (``activations_with_outliers``: a model of LLM activations) times a
  weight matrix, through ``torch._scaled_mm`` (emulated numerics): one scale per tensor (current, delayed) against
  DeepSeek-V3's 1×128 / 128×128 tiles, with and without outliers; the block formats (simulated) on the activations.
- ``torch.autocast`` bf16 against fp32 on the tiny transformer: the same initial weights and batches, the largest
  loss difference over ``--steps`` AdamW steps.
- fp16 gradient underflow: one backward of the tiny transformer in fp32; how many non-zero gradient entries become
  0 (and how many land among fp16's subnormals, or overflow to inf) when ``g · S`` is stored in fp16, for loss
  scales S = 1 .. 2^24.
- The memory calculator's precision recipes (``mlsys_nb.precision.measure_recipe``): bytes per parameter held at the
  optimizer step, measured, against ``mlsys_nb.memory.estimate``.
"""

from __future__ import annotations

import argparse
import copy

import torch

from mlsys_nb.config import tiny_config
from mlsys_nb.models import Transformer
from mlsys_nb.precision import (
    BLOCK_FORMATS,
    REAL_RECIPES,
    FORMATS,
    DelayedScaling,
    activations_with_outliers,
    block_quantize,
    bytes_mismatch,
    calculator_bytes,
    cast,
    format_info,
    fp8_scale_bytes,
    measure_optimizer_bytes,
    measure_recipe,
    model_state_bytes_per_param,
    round_to_format,
    relative_error,
    relative_matmul_error,
    tensor_matmul,
    tile_matmul,
)
from mlsys_nb.runtime.machine import summary as machine


def format_rows(n: int) -> list[str]:
    """Relative rounding error of ``n`` random values log-uniform over each format's normal range."""
    g = torch.Generator().manual_seed(0)
    rows = [f"Rounding error of {n} random values, log-uniform over each format's normal range", ""]
    rows += [
        "| format | cast | largest relative error | mean relative error | bound 2^-(m+1) |",
        "|---|---|---|---|---|",
    ]
    for f in FORMATS.values():
        lo, hi = torch.log2(torch.tensor(f.min_normal)), torch.log2(torch.tensor(f.max))
        x = torch.exp2(torch.empty(n, dtype=torch.float64).uniform_(float(lo), float(hi), generator=g))
        if f.name == "fp32":
            how, q = "torch (real)", x.float().double()
        else:
            x = x.float().double()  # fp32 inputs, as a cast from fp32 sees them
            how = "torch (real)" if f.torch_dtype else "simulated"
            q = cast(x.float(), f.name).double() if f.torch_dtype else round_to_format(x, f.name)
        err = relative_error(x, q)
        rows.append(f"| {f.name} | {how} | {float(err.max()):.3g} | {float(err.mean()):.3g} | {f.eps / 2:.3g} |")
    return rows


def fp8_rows(m: int, k: int, n: int) -> list[str]:
    """Matmul error of fp8 scaling recipes on activations with outliers, and block formats' storage error."""
    g = torch.Generator().manual_seed(6)
    w = torch.randn(k, n, generator=g) * 0.05
    history = [activations_with_outliers(m, k, 1e-3, 1e3, seed=10 + i) for i in range(4)]
    a = history[-1]
    plain = activations_with_outliers(m, k, 0.0, 1.0, seed=0)
    ds = DelayedScaling(history=16)
    for h in history[:-1]:
        ds.quantize(h)
    _, s_delayed = ds.quantize(a)
    amax_delayed = float(format_info("fp8_e4m3").max / s_delayed)
    exact, exact_plain = a.double() @ w.double(), plain.double() @ w.double()
    rows = [
        f"FP8 e4m3 matmul ({m}×{k} activations, 0.1 % of entries 1000× larger, times {k}×{n} weights), "
        "torch._scaled_mm on CPU (emulated numerics): relative Frobenius error of the product",
        "",
        "| scaling | with outliers | without outliers |",
        "|---|---|---|",
        f"| one scale per tensor, current | {relative_matmul_error(tensor_matmul(a, w), exact):.4f} "
        f"| {relative_matmul_error(tensor_matmul(plain, w), exact_plain):.4f} |",
        f"| one scale per tensor, delayed (amax history of 3) "
        f"| {relative_matmul_error(tensor_matmul(a, w, amax_a=amax_delayed), exact):.4f} | |",
        f"| 1×128 activation tiles, 128×128 weight blocks | {relative_matmul_error(tile_matmul(a, w), exact):.4f} "
        f"| {relative_matmul_error(tile_matmul(plain, w), exact_plain):.4f} |",
        "",
        "Block formats (simulated) storing the same activations: relative Frobenius error",
        "",
        "| format | elements | block | scale | with outliers | without outliers |",
        "|---|---|---|---|---|---|",
    ]
    for name, (elem, block, scale) in BLOCK_FORMATS.items():
        e1 = float((block_quantize(a, name) - a).norm() / a.norm())
        e2 = float((block_quantize(plain, name) - plain).norm() / plain.norm())
        rows.append(f"| {name} | {elem} | {block} | {scale} | {e1:.4f} | {e2:.4f} |")
    return rows


def _tiny():
    cfg = tiny_config(hidden=64, ffn_hidden=128, vocab_size=128, seq_len=32)
    torch.manual_seed(0)
    return cfg, Transformer(cfg)


def autocast_rows(steps: int) -> list[str]:
    """Largest |loss(bf16 autocast) − loss(fp32)| over ``steps`` AdamW steps from the same weights and batches."""
    cfg, base = _tiny()
    g = torch.Generator().manual_seed(5)
    seqs = (torch.randint(0, cfg.vocab_size, (steps, 8, 1), generator=g) + torch.arange(cfg.seq_len + 1)) % (
        cfg.vocab_size
    )
    curves = {}
    for label, on in (("fp32", False), ("autocast bf16", True)):
        model = copy.deepcopy(base)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        losses = []
        for x in seqs:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=on):
                loss = model(x[:, :-1], targets=x[:, 1:])
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
        curves[label] = losses
    gap = max(abs(p - q) for p, q in zip(curves["fp32"], curves["autocast bf16"]))
    return [
        f"torch.autocast bf16 against fp32: tiny transformer ({sum(p.numel() for p in base.parameters())} "
        f"parameters), AdamW lr 3e-3, {steps} steps of 8 sequences of {cfg.seq_len} tokens, same weights and batches",
        "",
        "| run | first loss | last loss |",
        "|---|---|---|",
        *(f"| {k} | {v[0]:.4f} | {v[-1]:.4f} |" for k, v in curves.items()),
        "",
        f"Largest loss difference over the run: {gap:.4f}",
    ]


def underflow_rows() -> list[str]:
    """fp16 storage of one fp32 gradient at loss scales 1 .. 2^24: entries flushed to 0, subnormal, inf."""
    cfg, model = _tiny()
    batch = torch.randint(0, cfg.vocab_size, (16, cfg.seq_len + 1), generator=torch.Generator().manual_seed(0))
    model(batch[:, :-1], targets=batch[:, 1:]).backward()
    g = torch.cat([p.grad.flatten() for p in model.parameters()])
    nz = g != 0
    f16 = format_info("fp16")
    rows = [
        f"fp16 gradient underflow: one fp32 backward of the tiny transformer ({int(nz.sum())} non-zero gradient "
        "entries), stored as fp16(g · S)",
        "",
        "| loss scale S | entries flushed to 0 | entries among fp16 subnormals | entries overflowing to inf |",
        "|---|---|---|---|",
    ]
    for k in (0, 4, 8, 12, 16, 20, 24):
        s = 2.0**k
        h = (g * s).half()
        zero = int((nz & (h == 0)).sum())
        sub = int((nz & (h != 0) & (h.float().abs() < f16.min_normal)).sum())
        inf = int(torch.isinf(h).sum())
        rows.append(f"| 2^{k} | {zero} | {sub} | {inf} |")
    return rows


def recipe_rows(steps: int) -> list[str]:
    """Bytes per parameter of each precision recipe: measured after a real torch.optim.AdamW step where the CPU
    builds the recipe (fp32, bf16-mixed; and two broken builds), a consistency check (RecipeAdam) where it cannot."""
    cfg, base = _tiny()
    shapes = [tuple(p.shape) for p in base.parameters()]
    kinds = ("params", "grads", "master", "optimizer")
    rows = [
        "Precision recipes built from torch's parts on the tiny transformer (mlsys_nb.precision.measure_optimizer_bytes): "
        "bytes per parameter torch allocated after one real optimizer step (distinct storages of the parameters, their "
        "gradients, the fp32 masters and optimizer.state; AdamW's 0-d step counters apart) against "
        "mlsys_nb.memory.bytes_per_param (calculator)",
        "",
        "| build | weights | gradients | fp32 master | optimizer states | measured total | calculator total | state dtypes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    builds = [(p, p, {}) for p in REAL_RECIPES] + [
        ("bf16-mixed, AdamW on the bf16 model (no master): broken", "bf16-mixed", dict(master=False)),
        ("fp32, SGD + momentum (one moment): broken", "fp32", dict(optimizer="sgd-momentum")),
    ]
    for label, p, kw in builds:
        m = measure_optimizer_bytes(cfg, p, **kw)
        n = m["n_params"]
        per = " | ".join(f"{m[k] / n:.5g}" for k in kinds)
        dt = ", ".join(f"{k} {v}" for k, v in m["state_dtypes"].items() if k != "step")
        flag = "" if not bytes_mismatch(m, p) else " (differs)"
        rows.append(
            f"| {label} | {per} | {m['total'] / n:.5g}{flag} | {calculator_bytes(n, p)['total'] / n:.5g} | {dt} |"
        )
    rows += [
        "",
        f"Outside the per-parameter count: AdamW's step counters, 4 B per parameter tensor ({m['n_tensors']} tensors); "
        "during the bf16-mixed step, fp32 copies of the gradients (4 B/param, freed after it).",
        "",
        f"Consistency check, not a measurement (mlsys_nb.precision.RecipeAdam, whose dtypes are read off the "
        f"calculator; these recipes do not run for real on a CPU), {steps} steps of 2 micro-batches: bytes per "
        "parameter held at the last optimizer step against mlsys_nb.memory.estimate",
        "",
        "| recipe | weights | gradients | fp32 master | Adam moments | held total | calculator total | first → last loss |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in ("bf16-nomaster", "fp8-te", "fp8-dsv3"):
        r = measure_recipe(cfg, p, steps=steps, micro_batches=2)
        pp, m = r["per_param"], model_state_bytes_per_param(cfg, p)
        rows.append(
            f"| {p} | {pp['params']:.5g} | {pp['grads']:.5g} | {pp['master']:.5g} | {pp['optimizer']:.5g} "
            f"| {pp['total']:.5f} | {m['total']:.5g} | {r['losses'][0]:.3f} → {r['losses'][-1]:.3f} |"
        )
    rows += [
        "",
        f"fp8-dsv3's excess is its fp32 scales, one per 128×128 block: {fp8_scale_bytes(shapes)} B for "
        f"{len(shapes)} weights. Not counted by the calculator's fp8-te: Transformer Engine's fp8 copy of each weight "
        "(1 B/param, 2 on Hopper); Megatron-Core's bf16 training holds 18 B/param (fp32 main gradients) "
        "(docs/references.md#transformer-engine-fp8-weights, #megatron-core-optimizer).",
    ]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40, help="training steps of the autocast comparison")
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="fewer values, smaller matmuls, fewer steps, no record")
    args = ap.parse_args()
    n, (m, k, nn), recipe_steps = 200_000, (512, 1024, 256), 5
    if args.quick:
        args.steps, args.out, n, (m, k, nn), recipe_steps = 2, None, 5_000, (128, 256, 128), 2
    torch.set_num_threads(1)
    parts = [format_rows(n), fp8_rows(m, k, nn), autocast_rows(args.steps), underflow_rows(), recipe_rows(recipe_steps)]
    text = "\n\n".join("\n".join(p) for p in parts) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(
                f"# Number formats and mixed precision, measured\n\nMachine: {machine()} (shared with other jobs).\n"
                f"Command: `.venv/bin/python benchmarks/precision.py --steps {args.steps} --out {args.out}`\n\n"
                "Emulated on the CPU: fp8 matmuls are real fp8 tensors through torch._scaled_mm without fp8 tensor "
                "cores; tf32, fp4 and the block formats are simulated (rounded to their grids). Errors are the "
                f"formats', not a GPU's.\n\n{text}"
            )


if __name__ == "__main__":
    main()
