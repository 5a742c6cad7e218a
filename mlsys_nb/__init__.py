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

from .runtime.launcher import device, launch  # noqa: E402
from .runtime.notebook import check_parameters, passed  # noqa: E402

__all__ = ["__version__", "launch", "device", "Cluster", "load_ipython_extension", "check_parameters", "passed"]


def __getattr__(name):  # PEP 562: the live-rank cluster loads on first use
    if name == "Cluster":
        from .runtime.cluster import Cluster

        return Cluster
    raise AttributeError(f"module 'mlsys_nb' has no attribute {name!r}")


def load_ipython_extension(ipython):
    """``%load_ext mlsys_nb`` registers the ``%%ranks`` cell magic (see ``mlsys_nb.runtime.cluster``)."""
    from .runtime.cluster import register_ranks_magic as _load

    _load(ipython)
