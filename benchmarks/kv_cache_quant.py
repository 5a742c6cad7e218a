"""KV-cache quantization in the engine: blocks that fit a fixed budget and greedy agreement with the fp32 pool.

For each ``kv_cache_dtype`` (fp32, bf16, int8, fp8 e4m3) the engine sizes its pool from the same
``kv_cache_memory``. int8/fp8 follow KIVI: K per channel (one fp32 scale per block, KV head and channel),
V per token (one fp32 scale per token and KV head), and the K of blocks not yet full kept in an fp32
residual of ``2 · max_num_seqs`` blocks taken from the same budget (``kv_cache.kv_block_bytes``,
``kv_cache.kv_residual_bytes``), so they fit fewer than 4× fp32's blocks; the table gives block sizes 4
and 16. Then 32 seeded random prompts are decoded greedily (temperature 0) with each pool and compared
with the fp32 pool's tokens: prompts whose output is identical, agreement of the first generated token
(one prefill forward: the quantization error of the prompt's K/V only), tokens equal position by
position, and the mean first divergence; and the int8 pool with n-gram speculation against the int8
pool without. The model is the ``tiny`` preset with random weights multiplied by ``--scale`` (so its
outputs are not one repeated token); a random-weight model amplifies small errors (even the bf16 pool
diverges on some prompts), so agreement here is a lower bound on a trained model's.

    .venv/bin/python benchmarks/kv_cache_quant.py [--quick] [--out data/measured/kv_cache_quant.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlsys_nb.runtime.machine import summary as machine  # noqa: E402

DTYPES = ("fp32", "bf16", "int8", "fp8")


def scaled_tiny(scale: float, seed: int = 0, vocab: int = 300, seq_len: int | None = None):
    """The ``tiny`` preset with random weights times ``scale`` (as tests/test_engine_config.py's fixture);
    ``seq_len`` overrides its context (a long one lifts the engine's cap of max_num_seqs full contexts)."""
    import torch

    from mlsys_nb.config import load_model_preset
    from mlsys_nb.models import Transformer

    torch.manual_seed(seed)
    cfg = load_model_preset("tiny").replace(vocab_size=vocab)
    m = Transformer(cfg.replace(seq_len=seq_len) if seq_len else cfg).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(scale)
    return m


def random_prompts(n: int, vocab: int = 300, seed: int = 1, lo: int = 4, hi: int = 40) -> list[list[int]]:
    """``n`` prompts of ``lo..hi-1`` uniform random token ids (seeded)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


def greedy(model, prompts, dtype: str, max_tokens: int, memory: int, block_size: int = 4, **opts):
    """(token ids per prompt, blocks in the pool, pool bytes, residual bytes) of the engine with
    ``kv_cache_dtype=dtype`` (``max_num_seqs`` = the number of prompts)."""
    from mlsys_nb.inference import LLM, SamplingParams

    llm = LLM(
        model, kv_cache_dtype=dtype, block_size=block_size, kv_cache_memory=memory, max_num_seqs=len(prompts), **opts
    )
    sp = SamplingParams(temperature=0, max_tokens=max_tokens or 1, ignore_eos=True)
    outs = llm.generate(prompts, sp, use_tqdm=False) if max_tokens else []
    kv = llm.engine.kv
    return [o.outputs[0].token_ids for o in outs], kv.manager.num_blocks, kv.nbytes, kv.k_res.nbytes


def compare(ref, got) -> dict:
    """Agreement of ``got`` with ``ref`` (lists of token-id lists of equal lengths)."""
    n_tok = sum(len(a) for a in ref)
    first = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(ref, got)]
    return {
        "identical": sum(a == b for a, b in zip(ref, got)),
        "first_token": sum(a[0] == b[0] for a, b in zip(ref, got)),
        "tokens": sum(x == y for a, b in zip(ref, got) for x, y in zip(a, b)) / n_tok,
        "first_divergence": sum(first) / len(first),
    }


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="8 prompts, 4 tokens, no record")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--scales", default="5,3", help="weight multipliers of the random model, comma-separated")
    ap.add_argument("--memory", type=int, default=2**20, help="kv_cache_memory in bytes")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.max_tokens, args.scales, args.out = 8, 4, "5", None
    import torch

    torch.set_num_threads(1)
    prompts = random_prompts(args.prompts)
    lines = []
    n_p = len(prompts)
    for scale in [float(s) for s in args.scales.split(",")]:
        model = scaled_tiny(scale)
        res = {dt: greedy(model, prompts, dt, args.max_tokens, args.memory) for dt in DTYPES}
        res["int8 + n-gram speculation"] = greedy(
            model, prompts, "int8", args.max_tokens, args.memory, speculative_model="ngram", num_speculative_tokens=4
        )
        for dt in list(res)[1:]:
            c = compare(res["int8" if "speculation" in dt else "fp32"][0], res[dt][0])
            against = "int8" if "speculation" in dt else "fp32"
            lines.append(
                f"| {scale:g} | {dt} | {against} | {c['identical']}/{n_p} | {c['first_token']}/{n_p} "
                f"| {c['tokens']:.3f} | {c['first_divergence']:.1f} |"
            )
    model = scaled_tiny(1, seq_len=4096)  # the blocks of the budget, not capped by max_num_seqs full contexts
    cfg = model.cfg
    d = cfg.head_dim
    table = [
        "| block_size | kv_cache_dtype | blocks in the budget | pool bytes (residual included) | residual bytes "
        "| blocks / fp32's | model: bytes per (token, head), K + V |",
        "|---|---|---|---|---|---|---|",
    ]
    share = {}
    for bs in (4, 16):
        blocks = {dt: greedy(model, prompts, dt, 0, args.memory, block_size=bs)[1:] for dt in DTYPES}
        share[bs] = blocks["int8"][2] / args.memory
        per = {"fp32": f"{8 * d}", "bf16": f"{4 * d}"}
        per["int8"] = per["fp8"] = f"{d} + 4·{d}/{bs} + {d} + 4 = {2 * d + 4 + 4 * d / bs:g}"
        for dt in DTYPES:
            n, b, r = blocks[dt]
            table.append(f"| {bs} | {dt} | {n} | {b} | {r} | {n / blocks['fp32'][0]:.3f} | {per[dt]} |")
    agree = [
        "| weight scale | kv_cache_dtype | against | identical outputs | first token equal | tokens equal "
        "| mean first divergence |",
        "|---|---|---|---|---|---|---|",
        *lines,
    ]
    print("\n".join(table + [""] + agree))
    if args.out:
        Path(args.out).write_text(
            "\n".join(
                [
                    "# KV-cache quantization in the engine, measured",
                    "",
                    f"Machine: {machine()}.",
                    "",
                    f"Model: the `tiny` preset (n_layers={cfg.n_layers}, n_kv_heads={cfg.n_kv_heads}, head_dim={d}, "
                    f"vocab 300) with seeded random weights times the weight scale; kv_cache_memory={args.memory} "
                    f"bytes, max_num_seqs={n_p}. int8/fp8 (e4m3) follow KIVI (Liu et al. 2024, arXiv:2402.02750): "
                    "K per channel, one fp32 scale per block, KV head and channel (the group is the block), V per "
                    "token, one fp32 scale per token and KV head, and the K of a block kept exact in an fp32 "
                    f"residual until the block is full and computed: 2·max_num_seqs = {2 * n_p} residual blocks, "
                    "taken from the same budget (see `mlsys_nb/inference/paged.py`). A per-channel scale costs "
                    "4·head_dim bytes per block and head, so small blocks pay more for it: at block_size 4 it "
                    f"doubles K's bytes. In this small budget the residual takes {share[4]:.0%} (block_size 4) and "
                    f"{share[16]:.0%} (block_size 16) of the memory, which is why int8 holds well under its "
                    "bytes-per-token ratio of fp32's blocks; a server's budget is gigabytes for the same "
                    "2·max_num_seqs residual blocks.",
                    "",
                    *table,
                    "",
                    f"Greedy decoding of {n_p} seeded random prompts (4-39 tokens), {args.max_tokens} new tokens "
                    "each, block_size=4, compared with the fp32 pool's output (the speculative row: with the int8 "
                    "pool's output without speculation):",
                    "",
                    *agree,
                    "",
                    "The previous record (commit 65245fb: K per token like V, no residual, same prompts and seeds) "
                    "measured 25/32 identical outputs for int8 and 4/32 for fp8 at weight scale 3, 16/32 and 0/32 at "
                    "weight scale 5. A random-weight model is chaotic: one flipped argmax changes every later token, "
                    "and even the bf16 pool (8 significant bits, more than fp8's 4) diverges on some prompts, so "
                    "these rows bound what a trained model would lose from below; fp8's 3 mantissa bits cost far "
                    "more here than int8's absmax grid. With speculation the blocks a verify chunk fills are read "
                    "exact within that chunk (they are quantized after the rollback), so its output may differ from "
                    "plain decoding's by the quantization error.",
                    "",
                    "Regenerate with `.venv/bin/python benchmarks/kv_cache_quant.py --out data/measured/kv_cache_quant.md`.",
                    "",
                ]
            )
        )


if __name__ == "__main__":
    main()
