"""Accelerators and links from ``data/hardware.yaml``: datasheet values with sources (memory, HBM
bandwidth, dense peaks, link bandwidths), except each link's ``latency_s``, an assumed default
(``latency_source`` says so): an order of magnitude for the α-β model, not a datasheet or measured
value. Fit α on a real system instead (``mlsys_nb.comm.pingpong``, notebook 04)."""

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
        n: GPU(name=n, **{k: (float(v) if k == "memory_bytes" else v) for k, v in s.items()})
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
