"""The memory hierarchy measured on this machine, and real ops on the roofline (Williams et al. 2009).

- ``cache_sizes()``: this CPU's data caches in bytes, from ``/sys/devices/system/cpu/cpu0/cache``
  (what ``lscpu`` reports), e.g. ``{"L1d": 32768, "L2": 524288, "L3": 33554432}``.
- ``stream_bandwidth(sizes)``: bytes/s of a streaming read whose working set is each size: one torch
  op per size, ``x.expand(R, n).sum(1)``, which reads the same ``n`` floats ``R`` times (a Python loop
  over a small buffer would time the interpreter instead). Rounds interleave the sizes; lower quartiles.
- ``OPS`` and ``op_cost(name, size, gpu)``: FLOPs and bytes of an elementwise add, a softmax, a layer
  norm and a square matmul (fp32, a model: each input read once, each output written once), placed on
  the roofline of ``inference.roofline.StepCost`` (the one owner of ``max(F/peak, B/bandwidth)``).
- ``measure_op(name, size)``: the op's seconds here (median), for its achieved FLOP/s beside the model.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import check_choice, check_int
from ..inference.roofline import StepCost
from ..runtime.timing import Timer, lower_quartile, median

__all__ = ["OPS", "cache_sizes", "stream_bandwidth", "op_flops_bytes", "op_cost", "measure_op"]


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def cache_sizes(root="/sys/devices/system/cpu/cpu0/cache") -> dict[str, int]:
    """Data and unified caches of CPU 0 in bytes by level (``L1d``, ``L2``, ``L3``); ``{}`` where sysfs lacks them."""
    out = {}
    for idx in sorted(Path(root).glob("index*")):
        try:
            level, kind = (idx / "level").read_text().strip(), (idx / "type").read_text().strip()
            size = _parse_size((idx / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        out[f"L{level}" + ("d" if kind == "Data" else "")] = size
    return out


def stream_bandwidth(sizes_bytes, *, read_bytes: int = 2**27, reps: int = 5) -> dict[int, float]:
    """Read bandwidth (bytes/s) per working-set size (bytes): ``x.expand(R, n).sum(1)`` over ``n`` fp32
    values repeated ``R = read_bytes // size`` times (at least 1; the ``R`` sums written are ``1/n`` of the
    bytes read). Lower quartile of ``reps`` interleaved rounds (a busy machine only ever adds time). Run it
    with ``torch.set_num_threads(1)`` to measure one core's view of the hierarchy (more threads on a busy
    machine measure the scheduler)."""
    sizes = [check_int("size", s, 64) for s in sizes_bytes]
    read_bytes, reps = check_int("read_bytes", read_bytes, 1024), check_int("reps", reps, 1)
    bufs = {s: torch.ones(s // 4) for s in sizes}
    rows = {s: max(1, read_bytes // s) for s in sizes}
    timers = {s: Timer() for s in sizes}
    for s in sizes:
        bufs[s].expand(rows[s], -1).sum(1)  # warm up: page in, fill caches
    for r in range(reps):
        for s in sizes if r % 2 == 0 else sizes[::-1]:
            with timers[s]:
                bufs[s].expand(rows[s], -1).sum(1)
    return {s: rows[s] * (s // 4) * 4 / lower_quartile(timers[s].samples) for s in sizes}


OPS = ("add", "softmax", "layernorm", "matmul")


def op_flops_bytes(name: str, size: int, *, elem_bytes: int = 4) -> tuple[float, float]:
    """(FLOPs, bytes) of one op on ``size`` (rows = cols = ``size`` for the 2-d ops, ``size²`` elements for
    add) when every input is read once and every output written once (a model of a fused kernel):
    add 1 FLOP/element over 3 elements; softmax ~5 FLOPs (max, subtract, exp, sum, divide) over 2;
    layer norm ~8 over 2; matmul ``2n³`` over ``3n²`` elements."""
    name = check_choice("name", name, OPS)
    n = check_int("size", size, 1)
    e = n * n
    flops, elems = {"add": (e, 3 * e), "softmax": (5 * e, 2 * e), "layernorm": (8 * e, 2 * e)}.get(
        name, (2 * n**3, 3 * e)
    )
    return float(flops), float(elems * elem_bytes)


def op_cost(name: str, size: int, gpu, *, dtype="fp32") -> StepCost:
    """``op_flops_bytes`` placed on ``gpu``'s roofline (a ``hardware.GPU`` or a name in data/hardware.yaml):
    ``.intensity_flop_per_byte``, ``.ridge_flop_per_byte``, ``.bound``, ``.time_s`` (model)."""
    from .. import hardware
    from ..config import dtype_bytes

    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    flops, nbytes = op_flops_bytes(name, size, elem_bytes=dtype_bytes(dtype))
    return StepCost(name, 1, 1, 0, flops, nbytes, g.peak(dtype), g.hbm_bandwidth_bytes_per_s)


def _op_fn(name: str, n: int):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    ln = torch.nn.LayerNorm(n, elementwise_affine=False)
    return {
        "add": lambda: a + b,
        "softmax": lambda: torch.softmax(a, dim=-1),
        "layernorm": lambda: ln(a),
        "matmul": lambda: a @ b,
    }[name]


def measure_op(names, size: int, *, reps: int = 5) -> dict[str, float]:
    """Seconds per call of each op in ``names`` at ``size`` (fp32, this CPU): median of ``reps`` interleaved rounds."""
    names = [check_choice("name", nm, OPS) for nm in names]
    size, reps = check_int("size", size, 1), check_int("reps", reps, 1)
    fns = {nm: _op_fn(nm, size) for nm in names}
    timers = {nm: Timer() for nm in names}
    with torch.no_grad():
        for fn in fns.values():
            fn()
        for r in range(reps):
            for nm in names if r % 2 == 0 else names[::-1]:
                with timers[nm]:
                    fns[nm]()
    return {nm: median(timers[nm].samples) for nm in names}
