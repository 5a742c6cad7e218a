"""The kit's quantization and LoRA against the libraries a user would otherwise run, in one process.

    .venv/bin/python benchmarks/quant.py [--size 4096] [--repeats 7] [--out data/measured/quant.md]

- NF4 (blocks of 64): ``mlsys_nb.quant.quantize(w, "nf4")`` + ``.dequantize()`` against bitsandbytes'
  ``quantize_4bit`` + ``dequantize_4bit`` (the baseline) on a size × size fp32 matrix: equal bit for bit?
  seconds per round trip, interleaved.
- LoRA: a forward and backward through ``LoRALinear`` against ``peft``'s LoRA (the baseline) on the same weights
  (a size × size layer, r = 16, batch 8): outputs equal? seconds, interleaved.
- Decode-like matmuls: ``quant.time_decode_matmuls`` (fp32 ``F.linear``, bf16 ``F.linear``, int8 weights through
  ``torch._weight_int8pack_mm`` with bf16 activations), batch 1 and 8, interleaved; tokens/s and the ratio to fp32.
- GPTQ and AWQ against round to nearest (int4, g128) on a layer with correlated inputs: output MSE.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from mlsys_nb.quant import LoRALinear, awq, gptq, quantize, rtn, time_decode_matmuls
from mlsys_nb.runtime.machine import summary as machine
from mlsys_nb.runtime.timing import median


def interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds of each function, all run once per repeat after one warm-up call each."""
    times = {k: [] for k in fns}
    for f in fns.values():
        f()
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: median(v) for k, v in times.items()}


def nf4_rows(n: int, repeats: int) -> list[str]:
    import bitsandbytes.functional as bnbf

    w = torch.randn(n, n, generator=torch.Generator().manual_seed(0)) * 0.02
    packed, state = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
    equal = torch.equal(quantize(w, "nf4").dequantize(), bnbf.dequantize_4bit(packed, state))

    def bnb_round_trip():
        p, s = bnbf.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
        return bnbf.dequantize_4bit(p, s)

    t = interleaved(
        {"bitsandbytes (baseline)": bnb_round_trip, "mlsys_nb": lambda: quantize(w, "nf4").dequantize()}, repeats
    )
    base = t["bitsandbytes (baseline)"]
    rows = [f"NF4 round trip of a {n}×{n} fp32 matrix, blocks of 64; equal bit for bit: {equal}", ""]
    rows += ["| implementation | median (ms) | ratio to baseline |", "|---|---|---|"]
    rows += [f"| {k} | {v * 1e3:.1f} | {v / base:.2f} |" for k, v in t.items()]
    return rows


def lora_rows(n: int, repeats: int) -> list[str]:
    import peft

    torch.manual_seed(0)
    ref = peft.get_peft_model(
        nn.Sequential(nn.Linear(n, n)), peft.LoraConfig(r=16, lora_alpha=32, target_modules=["0"])
    )
    layer = ref.base_model.model[0]
    mine = LoRALinear(nn.Linear(n, n), 16, 32)
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(0, 0.02)
        mine.base.load_state_dict(layer.base_layer.state_dict())
        mine.lora_A.weight.copy_(layer.lora_A["default"].weight)
        mine.lora_B.weight.copy_(layer.lora_B["default"].weight)
    x = torch.randn(8, n)
    equal = torch.allclose(mine(x), ref(x), atol=1e-5)

    def step(m):
        m.zero_grad()
        m(x).square().sum().backward()

    t = interleaved({"peft (baseline)": lambda: step(ref), "mlsys_nb LoRALinear": lambda: step(mine)}, repeats)
    base = t["peft (baseline)"]
    rows = [f"LoRA forward + backward, {n}×{n} layer, r = 16, batch 8; outputs equal to peft's: {equal}", ""]
    rows += ["| implementation | median (ms) | ratio to baseline |", "|---|---|---|"]
    rows += [f"| {k} | {v * 1e3:.2f} | {v / base:.2f} |" for k, v in t.items()]
    return rows


def decode_rows(n: int, repeats: int) -> list[str]:
    times = time_decode_matmuls(n, n, batches=(1, 8), reps=repeats)
    rows = [f"Decode-like matmuls, {n}×{n} weights (one thread: torch.set_num_threads(1))", ""]
    rows += ["| batch | variant | median (ms) | tokens/s | speed-up vs fp32 |", "|---|---|---|---|---|"]
    for b, t in times.items():
        rows += [f"| {b} | {k} | {v * 1e3:.2f} | {b / v:,.0f} | {t['fp32'] / v:.2f} |" for k, v in t.items()]
    return rows


def rounding_rows() -> list[str]:
    g = torch.Generator().manual_seed(0)
    mix = torch.randn(512, 512, generator=g) / 512**0.5
    x = (torch.randn(2048, 512, generator=g) @ mix) * torch.exp(torch.randn(512, generator=g))
    w = torch.randn(256, 512, generator=g) * 0.05
    ref = x @ w.T
    err = {
        k: float((x @ q.dequantize().T - ref).pow(2).mean())
        for k, q in (("RTN", rtn(w)), ("GPTQ", gptq(w, x)), ("AWQ", awq(w, x)))
    }
    rows = ["Int4 g128 on a 512 → 256 layer with correlated, unevenly scaled inputs (2048 calibration rows)", ""]
    rows += ["| method | output MSE | ratio to RTN |", "|---|---|---|"]
    rows += [f"| {k} | {v:.3e} | {v / err['RTN']:.2f} |" for k, v in err.items()]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="size 256, 2 repeats, no record")
    args = ap.parse_args()
    if args.quick:
        args.size, args.repeats, args.out = 256, 2, None
    torch.set_num_threads(1)
    parts = [
        nf4_rows(args.size, args.repeats),
        lora_rows(args.size, args.repeats),
        decode_rows(args.size, args.repeats),
    ]
    parts.append(rounding_rows())
    text = "\n\n".join("\n".join(p) for p in parts) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(
                f"# Quantization and LoRA against bitsandbytes and peft\n\nMachine: {machine()} (shared with other "
                f"jobs: noisy).\nCommand: `.venv/bin/python benchmarks/quant.py --size {args.size} --repeats "
                f"{args.repeats} --out {args.out}`\n\n{text}"
            )


if __name__ == "__main__":
    main()
