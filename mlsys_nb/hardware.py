"""Accelerators and links from ``data/hardware.yaml``: datasheet values with sources (memory, HBM
bandwidth, dense peaks, link bandwidths), except each link's ``latency_s``, an assumed default
(``latency_source`` says so): an order of magnitude for the α-β model, not a datasheet or measured
value. Fit α on a real system instead (``mlsys_nb.comm.pingpong``, notebook 04).

Memory has two totals: ``memory_bytes`` (nvidia-smi's, or the datasheet's) and, where a GPU of that kind was
measured, ``visible_memory_bytes`` (what CUDA lets PyTorch see, ``total_memory``; an H100 80GB HBM3's is
0.59 % below nvidia-smi's). ``GPU.fit_memory_bytes`` is the visible one where known; ``GPU.fits(nbytes)`` and
``GPU.fit_verdict(nbytes)`` judge against it and say which total they used."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

from .config import dtype_name, load_yaml


@dataclass(frozen=True)
class GPU:
    name: str
    memory_bytes: float  # total the device reports (bytes), or the datasheet figure: see memory_source
    hbm_bandwidth_bytes_per_s: float
    peak_flops: dict = field(default_factory=dict)  # dtype -> dense FLOP/s
    nvlink: str | None = None
    source: str = ""
    memory_source: str = ""  # "reported: ..." (device total) or "datasheet: ..." (decimal GB)
    # inside the chip (notebook 21), where the architecture whitepaper gives them; None elsewhere
    sms: int | None = None  # streaming multiprocessors
    shared_memory_per_sm_bytes: float | None = None  # the most shared memory (SRAM) one SM can give its blocks
    l2_bytes: float | None = None
    chip_source: str = ""
    # what CUDA lets PyTorch see (torch.cuda.get_device_properties().total_memory), where measured; else None
    visible_memory_bytes: float | None = None
    visible_memory_source: str = ""

    @property
    def fit_memory_bytes(self) -> float:
        """The total a fit verdict should use: the CUDA-visible total where measured, else ``memory_bytes``."""
        return float(self.visible_memory_bytes) if self.visible_memory_bytes else float(self.memory_bytes)

    @property
    def fit_memory_label(self) -> str:
        """Which total ``fit_memory_bytes`` is: "CUDA-visible total (measured)", "nvidia-smi total (reported)"
        or "datasheet total"."""
        if self.visible_memory_bytes:
            return "CUDA-visible total (measured)"
        kind = self.memory_source.split(":")[0]
        return "nvidia-smi total (reported)" if kind == "reported" else "datasheet total"

    def fits(self, nbytes: float) -> bool:
        """``nbytes`` fit in ``fit_memory_bytes`` (the CUDA-visible total where measured)."""
        return float(nbytes) <= self.fit_memory_bytes

    def fit_verdict(self, nbytes: float) -> str:
        """``"fits"``/``"does not fit"`` with both numbers and the total used, e.g. ``"does not fit: 85.30 GB >
        85.02 GB (H100-SXM, CUDA-visible total (measured))"``."""
        ok = self.fits(nbytes)
        return (
            f"{'fits' if ok else 'does not fit'}: {float(nbytes) / 1e9:.2f} GB {'<=' if ok else '>'} "
            f"{self.fit_memory_bytes / 1e9:.2f} GB ({self.name}, {self.fit_memory_label})"
        )

    def peak(self, dtype="bf16") -> float:
        """Dense peak throughput in FLOP/s for ``dtype`` (a name of ``mlsys_nb.config.DTYPE_BYTES``
        or a ``torch.dtype``); the error lists what the datasheet has."""
        dtype = dtype_name(dtype)
        if dtype not in self.peak_flops:
            raise KeyError(f"{self.name} has no {dtype!r} peak: choose one of {sorted(self.peak_flops)}")
        return float(self.peak_flops[dtype])


@dataclass(frozen=True)
class Link:
    """A link: bandwidths in bytes/s (datasheet, ``source``) and ``latency_s``, the one-message
    latency α in seconds: an ASSUMED DEFAULT (``latency_source``), not a datasheet value."""

    name: str
    per_direction_bytes_per_s: float
    bidirectional_bytes_per_s: float
    latency_s: float
    source: str = ""
    latency_source: str = ""  # where latency_s comes from: "assumed default ..." or a citation


@lru_cache(maxsize=1)
def _raw() -> dict:
    return load_yaml("hardware.yaml")


def gpus() -> dict[str, GPU]:
    return {
        n: GPU(name=n, **{k: (float(v) if k in ("memory_bytes", "visible_memory_bytes") else v) for k, v in s.items()})
        for n, s in _raw()["gpus"].items()
    }


def links() -> dict[str, Link]:
    return {n: Link(name=n, **s) for n, s in _raw()["links"].items()}


def gpu(name: str) -> GPU:
    table = gpus()
    if name not in table:
        raise KeyError(f"unknown GPU {name!r}: choose one of {sorted(table)}")
    return table[name]


def link(name: str) -> Link:
    table = links()
    if name not in table:
        raise KeyError(f"unknown link {name!r}: choose one of {sorted(table)}")
    return table[name]


# ---- the roofline of a step (Williams et al., 2009): the slower of compute and memory ----------------------
@dataclass(frozen=True)
class StepCost:
    """A modelled step on a GPU's roofline (units in names): ``flops`` and ``bytes`` against the GPU's
    ``peak_flops`` and ``bandwidth_bytes_per_s``; time = max(F / peak, B / bandwidth), the one owner of that
    formula (``inference.roofline``'s prefill and decode, ``kernels.hierarchy.op_cost``). ``tokens`` = new
    tokens over the batch."""

    phase: str
    batch: int
    new_tokens_per_seq: int
    context: int
    flops: float
    bytes: float
    peak_flops: float
    bandwidth_bytes_per_s: float

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens_per_seq

    @property
    def intensity_flop_per_byte(self) -> float:
        return self.flops / self.bytes

    @property
    def ridge_flop_per_byte(self) -> float:
        return self.peak_flops / self.bandwidth_bytes_per_s

    @property
    def bound(self) -> str:
        return "compute" if self.intensity_flop_per_byte >= self.ridge_flop_per_byte else "memory"

    @property
    def compute_time_s(self) -> float:
        return self.flops / self.peak_flops

    @property
    def memory_time_s(self) -> float:
        return self.bytes / self.bandwidth_bytes_per_s

    @property
    def time_s(self) -> float:
        """Roofline time: the slower of compute and memory (no overlap loss, 100% of peak)."""
        return max(self.compute_time_s, self.memory_time_s)

    @property
    def time_per_token_s(self) -> float:
        return self.time_s / self.tokens

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.time_s
