"""Prefill vs decode on the roofline (a model), and the bytes a real decode step reads (counted).

The roofline (Williams et al., 2009, CACM 52(4)): a step that does F FLOPs and moves B bytes takes
at least max(F / peak_flops, B / bandwidth). Its arithmetic intensity I = F / B (FLOP/byte) is
compared with the GPU's ridge point peak_flops / bandwidth: below it the step is memory-bound.

One forward step of a decoder over ``batch`` sequences, each with ``context`` cached tokens and
``new`` new tokens (prefill: new = prompt length, context = 0; decode: new = 1):

- FLOPs = 2 · N_matmul · batch · new                      (every weight multiplies every new token)
        + 4 · L · n_heads · head_dim · batch · (new·context + new·(new+1)/2)   (QKᵀ and PV, causal)
  where N_matmul = parameters excluding the embedding table and norms (the LM head counts, tied or
  not; MoE: the active experts).
- Bytes = N_matmul · weight_bytes                          (weights read once per step; MoE: all
                                                            experts, an upper bound at small batch)
        + batch · context · kv_bytes_per_token            (the cache read)
        + batch · new · kv_bytes_per_token                (the new K/V written)
  Activations are ignored (small next to weights and cache). Kaplan et al., 2020 (arXiv:2001.08361,
  Table 1) for 2N per token; Pope et al., 2022 (arXiv:2211.05102, §3) for decode being bound by
  reading weights and cache.

Decode at batch 1 reads every weight to produce ONE token: 2 FLOPs per parameter over 2 bytes
per parameter in bf16, I ≈ 1 FLOP/byte, far below an H100's ridge (~295 FLOP/byte in bf16), so
time per token ≈ weight bytes / HBM bandwidth. Prefill of hundreds of tokens reuses
each weight hundreds of times and is compute-bound. Batching decode raises I linearly in batch
until the KV-cache reads (which do not amortise across sequences) dominate.

``decode_bytes_read`` counts the bytes a real decode step of the package's Transformer reads from its
parameters and its KV cache, by tracing every operation of the step: the byte model above is checked
against it (a model that forgot the cache's bytes misses by the cache's share). It is labelled counted;
the rest is model. What is timed on this machine (``measure_throughput``: prefill and decode tokens/s;
``machine_roofline``: this machine's matmul FLOP/s and copy bandwidth, so the same model can be drawn
beside the measurement) lives in ``inference/measure.py``: a calculator imports no timer.
"""

from __future__ import annotations

from ..config import dtype_name
from ..config import as_model_config, check_int, dtype_bytes

from ..hardware import StepCost  # noqa: F401  (re-exported: the roofline's step, owned by hardware)
from .kv_cache import kv_bytes_per_token


def matmul_params(model, *, active: bool = True) -> int:
    """Weights of the matrix multiplies one token goes through: all parameters but the embedding
    table and the norms (the LM head counts, tied or not). ``active``: MoE counts the routed top-k
    experts only; ``active=False`` counts every expert (the bytes a large batch reads)."""
    from ..memory import norm_params, param_count

    cfg = as_model_config(model)
    pc = param_count(cfg)
    n = pc.active if active else pc.total
    return int(
        n - pc.embedding - (2 * cfg.n_layers + 1) * norm_params(cfg) + (pc.embedding if cfg.tied_embeddings else 0)
    )


def attention_flops(model, new: int, context: int) -> float:
    """QKᵀ and PV FLOPs of one sequence: query j (0-based) of ``new`` sees context + j + 1 keys."""
    cfg = as_model_config(model)
    keys = new * context + new * (new + 1) // 2
    if cfg.kv_lora_rank:  # MLA scores use head_dim + rope_head_dim; values head_dim
        per_key = 2 * cfg.n_heads * (2 * cfg.head_dim + cfg.rope_head_dim)
    else:
        per_key = 4 * cfg.n_heads * cfg.head_dim
    return float(cfg.n_layers * per_key * keys)


def _peak(gpu, dtype):
    from .. import hardware

    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    return g.peak(dtype_name(dtype)), g.hbm_bandwidth_bytes_per_s


def step_cost(
    model,
    gpu,
    *,
    batch: int = 1,
    new_tokens_per_seq: int = 1,
    context: int = 0,
    dtype="bf16",
    kv_dtype=None,
    phase: str | None = None,
) -> StepCost:
    """The modelled cost of one forward step (see the module docstring). ``gpu``: a name in
    data/hardware.yaml or a ``hardware.GPU``; ``dtype``: weights and compute; ``kv_dtype``: the
    cache (default ``dtype``)."""
    for name, v, lo in (("batch", batch, 1), ("new_tokens_per_seq", new_tokens_per_seq, 1), ("context", context, 0)):
        check_int(name, v, lo)
    peak, bw = _peak(gpu, dtype)
    kv_tok = kv_bytes_per_token(model, kv_dtype or dtype)
    flops = 2.0 * matmul_params(model) * batch * new_tokens_per_seq + batch * attention_flops(
        model, new_tokens_per_seq, context
    )
    nbytes = matmul_params(model, active=False) * dtype_bytes(dtype) + batch * (context + new_tokens_per_seq) * kv_tok
    phase = phase or ("decode" if new_tokens_per_seq == 1 and context > 0 else "prefill")
    return StepCost(phase, batch, new_tokens_per_seq, context, flops, nbytes, peak, bw)


def prefill_cost(model, gpu, prompt_len: int, *, batch: int = 1, dtype="bf16", kv_dtype=None) -> StepCost:
    return step_cost(
        model,
        gpu,
        batch=batch,
        new_tokens_per_seq=prompt_len,
        context=0,
        dtype=dtype,
        kv_dtype=kv_dtype,
        phase="prefill",
    )


def decode_cost(model, gpu, context: int, *, batch: int = 1, dtype="bf16", kv_dtype=None) -> StepCost:
    return step_cost(
        model, gpu, batch=batch, new_tokens_per_seq=1, context=context, dtype=dtype, kv_dtype=kv_dtype, phase="decode"
    )


# ---- counted on a real step ------------------------------------------------------------------------
def _read_counter(tracked: dict):
    """A TorchDispatchMode marking, in ``tracked`` ({storage data_ptr: bool mask over its elements}), every
    element an operation reads: views (no data moved) and arguments an operation writes are left out; an
    embedding lookup reads only the rows it gathers."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    def mark(t, rows=None):
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        ptr = t.untyped_storage().data_ptr()
        if ptr not in tracked:
            return
        mask = tracked[ptr]
        idx = torch.arange(mask.numel()).as_strided(t.shape, t.stride(), t.storage_offset())
        mask[(idx if rows is None else idx[rows]).reshape(-1)] = True

    class ReadCounter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not func.is_view:
                if func is torch.ops.aten.embedding.default:
                    mark(args[0], rows=args[1])
                else:
                    params = func._schema.arguments
                    named = {a.name: v for a, v in zip(params, args)} | kwargs
                    for a in params:
                        if a.name in named and not (a.alias_info is not None and a.alias_info.is_write):
                            for t in tree_flatten(named[a.name])[0]:
                                mark(t)
            return func(*args, **kwargs)

    return ReadCounter()


def decode_bytes_read(model, batch: int, context: int, *, seed: int = 0) -> dict:
    """Bytes one real decode step of ``model`` (the package's ``Transformer``) reads, counted on the step
    itself: ``batch`` sequences with ``context`` tokens cached (a prefill of random tokens first) each decode
    one token, and every aten operation of that step is traced (``TorchDispatchMode``). A byte counts once
    however often it is read (the cache's K/V are expanded for GQA, a weight is transposed: the same bytes).

    Returns ``{"weights": B, "matmul_weights": B, "kv": B, "total": B}`` in bytes: the parameters' elements
    read (the embedding table only at the rows looked up; norms included), those of the weights the matmuls
    use (what ``step_cost`` counts as ``matmul_params``), and the KV cache's (its K and V of ``context + 1``
    positions per sequence: the cached ones and the one just written, read back). ``total`` = weights + kv."""
    import torch

    from .kv_cache import KVCache

    cfg = model.cfg
    check_int("batch", batch, 1)
    check_int(f"context (cfg.seq_len={cfg.seq_len})", context, 1, cfg.seq_len - 1)
    cache = KVCache(model, batch, context + 1)
    g = torch.Generator().manual_seed(seed)
    params = dict(model.named_parameters())
    tracked = {}
    for t in [*params.values(), cache.k, cache.v]:
        n = t.untyped_storage().nbytes() // t.element_size()
        tracked.setdefault(t.untyped_storage().data_ptr(), torch.zeros(n, dtype=torch.bool))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(torch.randint(0, cfg.vocab_size, (batch, context), generator=g), cache=cache)
            token = torch.randint(0, cfg.vocab_size, (batch, 1), generator=g)
            with _read_counter(tracked):
                model(token, cache=cache)
    finally:
        model.train(was_training)

    def read(t) -> int:
        return int(tracked[t.untyped_storage().data_ptr()].sum()) * t.element_size()

    weights = sum(read(p) for p in {p.untyped_storage().data_ptr(): p for p in params.values()}.values())
    matmul = sum(read(p) for name, p in params.items() if p.dim() == 2 and "embed" not in name)
    if cfg.tied_embeddings:  # the head is the embedding table: the matmul reads all of it
        matmul = sum(read(p) for name, p in params.items() if p.dim() == 2)
    kv = read(cache.k) + read(cache.v)
    return {"weights": weights, "matmul_weights": matmul, "kv": kv, "total": weights + kv}
