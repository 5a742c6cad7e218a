"""Reading an answer: ``"3.2 GB"``, ``"3.2GiB"``, ``"3.2e9"``, ``"3,200 MB"``, ``"12 ms"``, ``"45%"``.

``parse(text, unit)`` returns the number in the question's ``unit`` (one of ``UNITS``). A response
without a unit is read in the question's unit; a unit of another dimension (``"12 ms"`` for a
question in bytes) raises ``UnitError`` with a message, it is never converted silently.

Everything a key prints reads back: ``fmt``'s ``"28 GB (2.8e+10 B = 26.08 GiB)"`` (the part before
the parenthesis is read), ``"0.35 (35%)"``, ``"10 count"``. In a count question a bare ``B`` is
ambiguous: ``"7 B"`` parameters is 7 billion, but the bytes-per-parameter key prints ``"10 B"``
(ten bytes); ``readings`` returns both, and ``Question.check`` accepts either.
"""

from __future__ import annotations

import math
import re

from ..config import check_choice

# unit name (lower case) -> (dimension, factor to the dimension's base unit)
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18}
_BIN = {"ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50}

UNIT_TABLE: dict[str, tuple[str, float]] = {}
for _p, _f in _SCALE.items():
    UNIT_TABLE[f"{_p}b"] = ("bytes", _f)
    UNIT_TABLE[f"{_p}flop"] = UNIT_TABLE[f"{_p}flops"] = ("flops", _f)
    UNIT_TABLE[f"{_p}flop/s"] = ("flop/s", _f)
    UNIT_TABLE[f"{_p}b/s"] = ("bytes/s", _f)
for _p, _f in _BIN.items():
    UNIT_TABLE[f"{_p}b"] = ("bytes", _f)
    UNIT_TABLE[f"{_p}b/s"] = ("bytes/s", _f)
UNIT_TABLE.update(
    {
        "bytes": ("bytes", 1.0),
        "byte": ("bytes", 1.0),
        "s": ("seconds", 1.0),
        "sec": ("seconds", 1.0),
        "seconds": ("seconds", 1.0),
        "second": ("seconds", 1.0),
        "ms": ("seconds", 1e-3),
        "us": ("seconds", 1e-6),
        "µs": ("seconds", 1e-6),
        "ns": ("seconds", 1e-9),
        "min": ("seconds", 60.0),
        "h": ("seconds", 3600.0),
        "hours": ("seconds", 3600.0),
        "d": ("seconds", 86400.0),
        "day": ("seconds", 86400.0),
        "days": ("seconds", 86400.0),
        "%": ("ratio", 0.01),
        "x": ("ratio", 1.0),
        "×": ("ratio", 1.0),
        "$": ("usd", 1.0),
        "usd": ("usd", 1.0),
        "tokens": ("count", 1.0),
        "params": ("count", 1.0),
        "gpus": ("count", 1.0),
        "seqs": ("count", 1.0),
        "tokens/s": ("count/s", 1.0),
    }
)
_COUNT_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}  # "7B params", "1.4T tokens"

# the units a question can be asked in: name -> (dimension, factor to base)
UNITS = {
    "bytes": ("bytes", 1.0),
    "seconds": ("seconds", 1.0),
    "days": ("seconds", 86400.0),
    "FLOPs": ("flops", 1.0),
    "FLOP/s": ("flop/s", 1.0),
    "bytes/s": ("bytes/s", 1.0),
    "fraction": ("ratio", 1.0),
    "ratio": ("ratio", 1.0),
    "count": ("count", 1.0),
    "tokens": ("count", 1.0),
    "params": ("count", 1.0),
    "GPU-hours": ("gpu-hours", 1.0),
    "USD": ("usd", 1.0),
    "tokens/s": ("count/s", 1.0),
    "F units": ("count", 1.0),
    "micro-batches": ("count", 1.0),
    "nats/token": ("count", 1.0),
}

_NUM = re.compile(r"^\s*([+-]?(?:\d[\d,_]*\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*(.*?)\s*$", re.IGNORECASE)


_PAREN = re.compile(r"\s+\([^()]*\)\s*$")  # a trailing " (...)" after a value


class UnitError(ValueError):
    """The response's unit does not measure what the question asks (or cannot be read)."""


def parse(text, unit: str) -> float:
    """The number ``text`` means, expressed in ``unit`` (a key of ``UNITS``)."""
    return readings(text, unit)[0]


def readings(text, unit: str) -> list[float]:
    """Every number ``text`` can mean in ``unit``, the usual reading first: one, except a count
    written with a bare ``B`` (``"10 B"``: 10 billion, or 10 counted bytes as a key prints them)."""
    check_choice("unit", unit, UNITS)
    dim, base = UNITS[unit]
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return [float(text)]
    s = str(text).strip().replace("\u2009", " ").replace("\u00a0", " ")
    s = _PAREN.sub("", s)  # a key's "28 GB (2.8e+10 B = 26.08 GiB)": the part before the parenthesis
    if s.startswith("$"):
        s = s[1:] + " $"
    m = _NUM.match(s)
    if not m:
        raise UnitError(f"could not read a number in {text!r}: write e.g. 3.2e9, 3,200 MB, 12 ms or 45%")
    value = float(m.group(1).replace(",", "").replace("_", ""))
    suffix = m.group(2).strip()
    if not suffix:
        return [value]
    key = suffix.lower().replace(" ", "")
    if key == unit.lower().replace(" ", ""):  # the question's own unit name ("62 count", "3 micro-batches")
        return [value]
    if dim == "count" and key == "b":  # "7 B" parameters, or a key's "10 B" (bytes per parameter)
        return [value * 1e9 / base, value / base]
    if dim == "count" and key[:1] in _COUNT_SUFFIX and key[1:] in ("", "tokens", "params"):
        rdim, f = dim, _COUNT_SUFFIX[key[:1]]  # "7B" parameters, "1.4T tokens"
    elif key in UNIT_TABLE:
        rdim, f = UNIT_TABLE[key]
    elif dim == "gpu-hours" and key in ("gpu-hours", "gpuh", "gpu·h", "h", "hours"):
        rdim, f = dim, 1.0
    else:
        raise UnitError(f"unknown unit {suffix!r} in {text!r}: this question is in {unit}")
    if dim == "gpu-hours" and rdim == "seconds":
        rdim, f = dim, f / 3600.0
    if rdim == "count" and dim in ("ratio",):
        rdim = "ratio"
    if rdim != dim:
        raise UnitError(
            f"{text!r} is in {suffix!r} ({rdim}), but this question asks for {unit} ({dim}): "
            f"not converted, answer in {unit}"
        )
    return [value * f / base]


def fmt(value: float, unit: str) -> str:
    """A readable rendering of ``value`` (in ``unit``): bytes in GB/MB (decimal) with GiB beside,
    seconds in s/ms/us, fractions as percentages."""
    if isinstance(value, str):
        return value
    v = float(value)
    if unit == "bytes":
        for name, f in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
            if abs(v) >= f:
                gi = f" = {v / 2**30:.4g} GiB" if name in ("TB", "GB") else ""
                return f"{v / f:.4g} {name} ({v:.4g} B{gi})"
        return f"{v:.4g} B"
    if unit == "seconds":
        for name, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
            if abs(v) >= f:
                return f"{v / f:.4g} {name}"
        return f"{v * 1e9:.4g} ns"
    if unit == "fraction":
        return f"{v:.4g} ({100 * v:.3g}%)"
    if unit in ("FLOPs", "FLOP/s", "bytes/s", "tokens", "params", "count") and abs(v) >= 1e4:
        return f"{v:.4g} {unit}"
    if abs(v) >= 1e4 or (v != 0 and abs(v) < 1e-3):
        return f"{v:.4g} {unit}"
    return f"{v:.4g} {unit}" if not math.isnan(v) else "nan"


# what a learner may write, by the dimension of the question's unit (a worksheet's header lists them)
_ACCEPTED = {
    "bytes": "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024); 3.2e9 is in bytes",
    "seconds": "ns, us, ms, s, min, h, days",
    "flops": "FLOPs, with k/M/G/T/P/E prefixes (3e21 FLOPs = 3,000 EFLOPs)",
    "flop/s": "FLOP/s, with k/M/G/T/P prefixes (989 TFLOP/s)",
    "bytes/s": "B/s, MB/s, GB/s, TB/s (450 GB/s), GiB/s",
    "ratio": "a number (0.45), a percentage (45%) or a factor (1.5x)",
    "count": "a number, with k/M/B/T for thousand/million/billion/trillion (7B, 1.4T)",
    "gpu-hours": "GPU-hours (a number, or h)",
    "usd": "dollars ($1,000 or 1000)",
    "count/s": "tokens/s (a number)",
}


def accepted(unit: str) -> str:
    """What an answer in ``unit`` may be written in, in words (e.g. for bytes: ``"B, KB, MB, ..."``)."""
    check_choice("unit", unit, UNITS)
    return _ACCEPTED[UNITS[unit][0]]
