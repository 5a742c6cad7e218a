"""Prefill and decode measured on this machine, beside ``inference.roofline``'s model of them.

- ``machine_roofline(n, copy_mib, reps)``: this machine's fp32 matmul FLOP/s and memory-copy bandwidth, as a
  ``hardware.GPU`` named "this-cpu", so ``roofline.step_cost`` can model the same machine it measures.
- ``measure_throughput(model, batch_sizes, ...)``: prefill and decode tokens/s of the package's Transformer
  with its KV cache, per batch size (interleaved repetitions, medians).

Seconds come from ``runtime.timing`` (the kit's one timer); notebook 13 draws them beside ``prefill_cost`` and
``decode_cost`` on the machine ``machine_roofline`` measured.
"""

from __future__ import annotations

from ..runtime.timing import Timer, median, repeat

__all__ = ["machine_roofline", "measure_throughput"]


def machine_roofline(*, n: int = 1024, copy_mib: int = 256, reps: int = 5):
    """This machine's measured fp32 matmul FLOP/s and memory-copy bandwidth, as a ``hardware.GPU``
    (name "this-cpu") so ``step_cost`` can model it: the matmul's fastest of ``reps``
    (``models.measure.measure_matmul_peak``), the copy's median of ``reps``."""
    import torch

    from ..hardware import GPU
    from ..models.measure import measure_matmul_peak

    flops = measure_matmul_peak(n, repeats=reps)
    src = torch.ones(copy_mib * 2**20 // 4)
    dst = torch.empty_like(src)
    bw = 2 * src.nbytes / median(repeat(lambda: dst.copy_(src), reps, warmup=1))  # read + write
    return GPU(
        "this-cpu",
        memory_bytes=0.0,
        hbm_bandwidth_bytes_per_s=bw,
        peak_flops={"fp32": flops},
        source=f"measured: {n}x{n} fp32 matmul, {copy_mib} MiB copy, median of {reps}",
    )


def measure_throughput(
    model,
    batch_sizes=(1, 2, 4, 8),
    *,
    prompt_len: int = 64,
    decode_steps: int = 16,
    reps: int = 3,
    progress: bool = True,
) -> list[dict]:
    """Measured prefill and decode tokens/s of ``model`` on this machine, per batch size.

    Prefill: one forward of ``batch × prompt_len`` tokens into an empty cache. Decode: ``decode_steps``
    single-token steps after that prompt. Median over ``reps`` repetitions; ``torch.no_grad``. The
    repetitions are interleaved (every batch size once per round, the order reversed every other
    round), so a change of load on a shared machine hits every batch size alike."""
    import torch
    from tqdm.auto import tqdm

    from .kv_cache import KVCache

    cfg = model.cfg
    if prompt_len + decode_steps > cfg.seq_len:
        raise ValueError(f"prompt_len + decode_steps = {prompt_len + decode_steps} exceeds cfg.seq_len={cfg.seq_len}")
    g = torch.Generator().manual_seed(0)
    model.eval()
    batch_sizes = list(batch_sizes)
    xs = {b: torch.randint(0, cfg.vocab_size, (b, prompt_len), generator=g) for b in batch_sizes}
    pre = {b: Timer() for b in batch_sizes}
    dec = {b: Timer() for b in batch_sizes}
    with torch.no_grad():
        for r in tqdm(range(reps), desc="rounds", disable=not progress, leave=False):
            for b in batch_sizes if r % 2 == 0 else batch_sizes[::-1]:
                cache = KVCache(model, b, prompt_len + decode_steps)
                with pre[b]:
                    logits = model(xs[b], cache=cache)
                tok = logits[:, -1:].argmax(-1)
                with dec[b]:
                    for _ in range(decode_steps):
                        tok = model(tok, cache=cache)[:, -1:].argmax(-1)
    rows = []
    for b in batch_sizes:
        rows.append(
            {
                "batch": b,
                "prefill_tokens_per_s": b * prompt_len / median(pre[b].samples),
                "decode_tokens_per_s": b * decode_steps / median(dec[b].samples),
                "decode_step_s": median(dec[b].samples) / decode_steps,
                "prompt_len": prompt_len,
                "decode_steps": decode_steps,
            }
        )
    return rows
