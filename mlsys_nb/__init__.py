"""mlsys_nb: run, measure and prove how large-scale ML systems work, from a notebook.

Top-level names:
- ``mlsys_nb.launch(fn, world_size=4, ...)``: run ``fn`` on fresh ``torch.distributed`` ranks.
- ``mlsys_nb.device()``: inside a rank, the ``torch.device`` this rank should use.
- ``mlsys_nb.Cluster``: live ranks kept across cells; ``%load_ext mlsys_nb`` adds ``%%ranks``.
- ``mlsys_nb.check_parameters(globals(), world_size=range(2, 9), ...)``: a notebook's one parameter check (it
  starts the rank factory when ``world_size`` is among them); ``mlsys_nb.passed(label)``: a check's pass line,
  recorded (``mlsys_nb.runtime.notebook``).
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__", "launch", "device", "Cluster", "load_ipython_extension", "check_parameters", "passed"]

# PEP 562: each top-level name loads its module on first use, so ``import mlsys_nb.memory`` (a calculator) loads
# neither the runtime nor torch
_LAZY = {
    "launch": "runtime.launcher",
    "device": "runtime.launcher",
    "Cluster": "runtime.cluster",
    "check_parameters": "runtime.notebook",
    "passed": "runtime.notebook",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'mlsys_nb' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))


def load_ipython_extension(ipython):
    """``%load_ext mlsys_nb`` registers the ``%%ranks`` cell magic (see ``mlsys_nb.runtime.cluster``)."""
    from .runtime.cluster import register_ranks_magic as _load

    _load(ipython)
