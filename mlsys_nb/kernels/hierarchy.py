"""The memory hierarchy measured on this machine, and real ops on the roofline (Williams et al. 2009).

- ``read_caches()``: this CPU's data caches, read ONE way per system: Linux's sysfs
  (``/sys/devices/system/cpu/cpu*/cache/index*/``: level, type, size and which CPUs share each instance),
  macOS's ``sysctl hw.perflevel0.* / hw.perflevel1.*`` (per core kind, Apple silicon) or ``hw.l1dcachesize
  hw.l2cachesize hw.l3cachesize``, else ``source="unknown"``. A ``Caches``: the distinct sizes of each
  level's instances (a hybrid CPU's performance and efficiency cores have L2s of different sizes).
- ``stream_bandwidth(sizes)``: bytes/s of a streaming read whose working set is each size: one torch
  op per size, ``x.expand(R, n).sum(1)``, which reads the same ``n`` floats ``R`` times (a Python loop
  over a small buffer would time the interpreter instead). Rounds interleave the sizes; lower quartiles.
  ``sweep_sizes(caches)`` picks sizes from 4 KiB to beyond twice the largest cache; ``cache_vs_dram(bw,
  caches)`` the best bandwidth of working sets that fit the smallest L2 against those twice the largest cache.
- ``vector_kernels()``: whether PyTorch's CPU kernels here are vectorised (``ATEN_CPU_CAPABILITY``):
  without SIMD a streaming sum is bound by its scalar adds (~19 GB/s from L2 and from DRAM alike on this
  project's machine), so the hierarchy only shows where the kernels are vector ones.
- ``OPS`` and ``op_cost(name, size, gpu)``: FLOPs and bytes of an elementwise add, a softmax, a layer
  norm and a square matmul (fp32, a model: each input read once, each output written once), placed on
  the roofline of ``hardware.StepCost`` (the one owner of ``max(F/peak, B/bandwidth)``).
- ``measure_op(name, size)``: the op's seconds here (median), for its achieved FLOP/s beside the model.
"""

from __future__ import annotations

import platform
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..runtime.machine import vector_kernels  # re-exported: notebook 21 reads it here

from ..config import check_choice, check_int
from ..hardware import StepCost
from ..runtime.timing import Timer, lower_quartile, median

__all__ = [
    "OPS",
    "Caches",
    "read_caches",
    "parse_size",
    "sweep_sizes",
    "cache_vs_dram",
    "vector_kernels",
    "stream_bandwidth",
    "op_flops_bytes",
    "op_cost",
    "measure_op",
]

LEVELS = ("L1d", "L2", "L3")
# Used only when the sizes are unknown (say so when printing): every x86 or Arm core of the last decade has at
# least 256 KiB of L2 (or of L1 + L2 per core), and 128 MiB is beyond any desktop or server CPU's L3 slice.
ASSUMED_IN_CACHE = 256 * 2**10
ASSUMED_BEYOND = 128 * 2**20

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """A cache size as sysfs or an older tool prints it -> bytes: ``"48K"``, ``"1024K"``, ``"32768K"``,
    ``"1M"``, ``"1 MiB"``, ``"512 KB"`` (binary units, as caches are), or plain bytes ``"65536"``."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"size={text!r}: expected a number with an optional K/M/G (KiB/MiB/GiB) unit")
    mult = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]
    return int(float(m.group(1)) * mult)


@dataclass(frozen=True)
class Caches:
    """This CPU's data caches: ``sizes[level]`` the distinct sizes in bytes of that level's instances
    (ascending; one entry on most CPUs, two on a hybrid one), for levels ``L1d``, ``L2``, ``L3`` that were
    found. ``source``: ``"sysfs"``, ``"sysctl"`` or ``"unknown"``; ``note`` says what was read or why not."""

    source: str
    sizes: dict = field(default_factory=dict)
    note: str = ""

    @property
    def known(self) -> bool:
        return bool(self.sizes)

    def smallest(self, level: str) -> int | None:
        return min(self.sizes[level]) if level in self.sizes else None

    def largest(self, level: str) -> int | None:
        return max(self.sizes[level]) if level in self.sizes else None

    def describe(self) -> str:
        if not self.known:
            return f"cache sizes unknown ({self.note})"

        def kib(b):
            return f"{b / 2**20:g} MiB" if b >= 2**20 else f"{b / 2**10:g} KiB"

        parts = [f"{lvl} " + " and ".join(kib(s) for s in self.sizes[lvl]) for lvl in LEVELS if lvl in self.sizes]
        return ", ".join(parts) + f" (from {self.source}" + (f": {self.note})" if self.note else ")")


def _from_sysfs(root: Path) -> Caches | None:
    """Every CPU's cache instances under ``root`` (``cpu<N>/cache/index<M>/``), each instance counted once
    (keyed by level, type and the CPUs that share it). None when no cache directory exists."""
    instances = {}
    dirs = sorted(root.glob("cpu[0-9]*/cache/index[0-9]*"))
    if not dirs:
        return None
    for idx in dirs:
        try:
            level = (idx / "level").read_text().strip()
            kind = (idx / "type").read_text().strip()
            size = parse_size((idx / "size").read_text())
        except (OSError, ValueError):
            continue  # an offline CPU or a field this kernel does not export
        if kind == "Instruction" or size <= 0:
            continue
        try:
            shared = (idx / "shared_cpu_list").read_text().strip()
        except OSError:
            shared = idx.parent.parent.name  # unknown sharing: one instance per CPU
        name = f"L{level}" + ("d" if kind == "Data" else "")
        instances[(name, kind, shared)] = size
    sizes = {}
    for (name, _, _), size in instances.items():
        sizes.setdefault(name, set()).add(size)
    sizes = {lvl: tuple(sorted(sizes[lvl])) for lvl in LEVELS if lvl in sizes}
    if not sizes:
        return Caches("unknown", {}, f"no readable data cache under {root}")
    n_cpus = len({d.parent.parent.name for d in dirs})
    return Caches("sysfs", sizes, f"{len(instances)} instances over {n_cpus} CPUs")


SYSCTL_KEYS = (
    "hw.perflevel0.l1dcachesize",
    "hw.perflevel0.l2cachesize",
    "hw.perflevel0.l3cachesize",
    "hw.perflevel1.l1dcachesize",
    "hw.perflevel1.l2cachesize",
    "hw.perflevel1.l3cachesize",
    "hw.l1dcachesize",
    "hw.l2cachesize",
    "hw.l3cachesize",
)


def _run_sysctl(keys) -> str:
    p = subprocess.run(["sysctl", *keys], capture_output=True, text=True, timeout=10)
    return p.stdout  # unknown keys go to stderr (and a non-zero status) while the known ones print


def _from_sysctl(text: str) -> Caches:
    """macOS's ``sysctl`` lines ``hw.l2cachesize: 4194304``: per core kind (``hw.perflevel<N>.*``, Apple
    silicon's performance and efficiency cores) where present, else the ``hw.*`` totals; 0 means none."""
    values = {}
    for line in text.splitlines():
        key, sep, val = line.partition(":")
        if not sep:
            key, sep, val = line.partition("=")  # BSD's "hw.l2cachesize = 4194304" with -e or older tools
        try:
            values[key.strip()] = int(val.strip())
        except ValueError:
            continue
    names = {"l1dcachesize": "L1d", "l2cachesize": "L2", "l3cachesize": "L3"}
    per_level = any(k.startswith("hw.perflevel") for k in values)
    sizes = {}
    for key, v in values.items():
        parts = key.split(".")
        if v <= 0 or parts[-1] not in names or (per_level != key.startswith("hw.perflevel")):
            continue
        sizes.setdefault(names[parts[-1]], set()).add(v)
    sizes = {lvl: tuple(sorted(sizes[lvl])) for lvl in LEVELS if lvl in sizes}
    if not sizes:
        return Caches("unknown", {}, "sysctl printed no cache size")
    return Caches("sysctl", sizes, "per core kind (hw.perflevel*)" if per_level else "hw.*cachesize")


def read_caches(*, sysfs_root="/sys/devices/system/cpu", system: str | None = None, run_sysctl=None) -> Caches:
    """This CPU's data caches, read one way: sysfs where its cache directories exist (Linux), ``sysctl`` on
    macOS (``system == "Darwin"``), else ``Caches("unknown")`` with the reason. ``system`` defaults to
    ``platform.system()``; ``run_sysctl(keys) -> stdout`` to ``sysctl`` itself (tests pass fakes of both).
    Never runs ``lscpu`` (absent on macOS, and it reads the same sysfs files)."""
    system = platform.system() if system is None else system
    found = _from_sysfs(Path(sysfs_root))
    if found is not None:
        return found
    if system == "Darwin":
        try:
            text = (run_sysctl or _run_sysctl)(SYSCTL_KEYS)
        except (OSError, subprocess.SubprocessError) as e:
            return Caches("unknown", {}, f"sysctl failed: {e}")
        return _from_sysctl(text)
    return Caches("unknown", {}, f"no {sysfs_root}/cpu*/cache directory and not macOS ({system or 'unknown OS'})")


def sweep_sizes(caches: Caches, *, smallest: int = 2**12, cap: int = 2**30) -> list[int]:
    """Powers of two from ``smallest`` up to the first one at least twice the largest cache and at least
    128 MiB (at most ``cap``): ``cache_vs_dram`` needs working sets twice beyond the last level."""
    need = max([ASSUMED_BEYOND] + [2 * caches.largest(lvl) for lvl in caches.sizes])
    sizes, s = [], check_int("smallest", smallest, 64)
    while s <= cap:
        sizes.append(s)
        if s >= need:
            break
        s *= 2
    return sizes


def cache_vs_dram(bw: dict, caches: Caches) -> dict:
    """Split a measured curve (``{working set bytes: bytes/s}``) at the caches: ``in_cache`` the best of the
    working sets that fit the *smallest* L2 (or L1d; every core's), ``dram`` the best of those at least twice
    the *largest* cache of any level (beyond every core's). Unknown sizes use ``ASSUMED_IN_CACHE`` and
    ``ASSUMED_BEYOND``; ``assumed`` says so. Raises ``ValueError`` when a side has no measured size."""
    edge = caches.smallest("L2") or caches.smallest("L1d")
    last = max((caches.largest(lvl) for lvl in caches.sizes), default=None)
    assumed = edge is None or last is None
    edge = edge or ASSUMED_IN_CACHE
    beyond = 2 * last if last else ASSUMED_BEYOND
    inside = [b for s, b in bw.items() if s <= edge]
    outside = [b for s, b in bw.items() if s >= beyond]
    if not inside or not outside:
        raise ValueError(
            f"sizes={sorted(bw)}: need working sets <= {edge} B and >= {beyond} B (use sweep_sizes(caches))"
        )
    return {"in_cache": max(inside), "dram": max(outside), "edge": edge, "beyond": beyond, "assumed": assumed}


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
