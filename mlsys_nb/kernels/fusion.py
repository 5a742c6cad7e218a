"""Fusion: the same elementwise chain as separate kernels (eager PyTorch) and as one (``torch.compile``).

The chain ``y = gelu(x + b) · 0.5 + x`` does ~10 FLOPs per element and is memory-bound on any machine.
Eager PyTorch runs it as four kernels, each reading its inputs from memory and writing its output back:
``x + b`` (read n, write n), ``gelu`` (read n, write n), ``· 0.5`` (read n, write n), ``+ x`` (read 2n,
write n): 9n element moves (``b`` is one row, ignored). One fused kernel reads ``x`` once and writes
``y`` once: 2n. The bytes model predicts a speed-up of ``unfused_bytes / fused_bytes`` = 4.5 when both
run at the same bandwidth (they do not quite: caches catch some of the eager re-reads, and the fused
kernel computes GELU's erf on the way). ``torch.compile`` (TorchInductor) generates the fused C++ (on a
GPU: Triton) kernel; set ``TORCH_LOGS=output_code`` to read it.

Inductor's on-disk cache does not key on ``ATEN_CPU_CAPABILITY``: code compiled for AVX-512 and reused under
AVX2 gave wrong numbers (notebook 21, max abs diff 7.86). ``keep_inductor_cache_apart()`` (called by
``compare_fusion`` before it compiles) gives a process that asks for other kernels its own cache directory,
the one ``runtime.machine.capability_env`` names, unless ``TORCHINDUCTOR_CACHE_DIR`` is already set.
"""

from __future__ import annotations

import os

import torch

from ..config import check_int
from ..runtime.timing import Timer, median

__all__ = ["chain", "chain_bytes", "unary_chain_bytes", "compare_fusion", "keep_inductor_cache_apart"]

# (elements read, elements written) per element of x, for each eager kernel of ``chain``
EAGER_KERNELS = {"x + b": (1, 1), "gelu": (1, 1), "* 0.5": (1, 1), "+ x": (2, 1)}


def chain(x: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``gelu(x + b) * 0.5 + x``: bias, GELU, scale, residual (``b`` broadcast over the rows of ``x``)."""
    return torch.nn.functional.gelu(x + b) * 0.5 + x


def chain_bytes(numel: int, *, fused: bool, elem_bytes: int = 4) -> int:
    """Bytes moved by ``chain`` over ``numel`` elements (model): eager, each kernel reads its inputs and
    writes its output (``EAGER_KERNELS``: 9 per element); fused, read ``x`` and write ``y`` (2)."""
    numel = check_int("numel", numel, 1)
    per = sum(r + w for r, w in EAGER_KERNELS.values()) if fused is False else 2
    return numel * per * elem_bytes


def unary_chain_bytes(numel: int, n_ops: int, *, fused: bool, elem_bytes: float = 4) -> float:
    """Bytes moved by ``n_ops`` unary elementwise ops in a row over ``numel`` elements (model): eager, each
    op reads its input and writes its output (``2·n_ops`` per element); fused, one read and one write (2)."""
    numel, n_ops = check_int("numel", numel, 1), check_int("n_ops", n_ops, 1)
    return float(numel * (2 * n_ops if not fused else 2) * elem_bytes)


def keep_inductor_cache_apart(env=None) -> str | None:
    """Where ``ATEN_CPU_CAPABILITY`` is set and ``TORCHINDUCTOR_CACHE_DIR`` is not, set the latter (in ``env``,
    default ``os.environ``) to that capability's own directory (``capability_env``'s); return the directory in
    use, None for inductor's default (the native kernels). Call it before the process first compiles: inductor
    writes its default into ``TORCHINDUCTOR_CACHE_DIR`` when it first looks."""
    from ..runtime.machine import CPU_CAPABILITIES, capability_env

    env = os.environ if env is None else env
    cap = (env.get("ATEN_CPU_CAPABILITY") or "").strip().lower()
    if env.get("TORCHINDUCTOR_CACHE_DIR") or not cap:
        return env.get("TORCHINDUCTOR_CACHE_DIR")
    if cap in CPU_CAPABILITIES:
        path = capability_env(cap, dict(env))["TORCHINDUCTOR_CACHE_DIR"]
    else:  # another architecture's name (sve256, ...): the same scheme
        import tempfile

        path = os.path.join(tempfile.gettempdir(), f"mlsys_nb-{env.get('USER', 'user')}-capability-{cap}", "inductor")
    env["TORCHINDUCTOR_CACHE_DIR"] = path
    return path


def compare_fusion(rows: int = 2048, cols: int = 2048, *, reps: int = 7, compiled=None) -> dict:
    """Time ``chain`` eager and compiled (interleaved rounds, medians) on a ``rows × cols`` fp32 input.
    ``compiled``: a ready ``torch.compile(chain)`` (compiled here when None; its first call, the compile,
    is timed separately). Returns seconds, the measured speed-up, the bytes-model speed-up and the
    largest difference between the two outputs."""
    rows, cols, reps = check_int("rows", rows, 1), check_int("cols", cols, 1), check_int("reps", reps, 1)
    g = torch.Generator().manual_seed(0)
    x, b = torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g)
    if compiled is None:
        keep_inductor_cache_apart()
    fused = compiled if compiled is not None else torch.compile(chain)
    with torch.no_grad(), Timer() as first:
        y_fused = fused(x, b)
    timers = {"eager": Timer(), "compiled": Timer()}
    fns = {"eager": chain, "compiled": fused}
    with torch.no_grad():
        chain(x, b)
        for r in range(reps):
            for name in ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager"):
                with timers[name]:
                    fns[name](x, b)
    eager_s, comp_s = median(timers["eager"].samples), median(timers["compiled"].samples)
    return {
        "first_call_s": first.seconds,
        "eager_s": eager_s,
        "compiled_s": comp_s,
        "speedup_measured": eager_s / comp_s,
        "speedup_model": chain_bytes(x.numel(), fused=False) / chain_bytes(x.numel(), fused=True),
        "max_abs_diff": (y_fused - chain(x, b)).abs().max().item(),
    }
