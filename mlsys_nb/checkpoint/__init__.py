"""Checkpoints, failures and offload: training that survives (notebook 24).

- ``interval``: Young's optimal checkpoint interval ``sqrt(2·C·MTBF)``, the first-order share of time
  lost, the exact renewal formula and a seeded simulation of a long run with random failures (tested
  against each other: ``optimal_interval``, ``daly_interval``, ``expected_lost_fraction``,
  ``exact_lost_fraction``, ``simulate_lost_fraction``), a numeric search for the interval minimising either loss
  (``best_interval``); Llama 3's published interruption counts (``llama3_interruptions``).
- ``sharded``: sharded checkpoints of an FSDP2 job with ``torch.distributed.checkpoint`` on real gloo
  ranks: atomic writes, SHA-256 manifest, the newest k kept; every RNG, the sampler, the LR schedule and
  the step saved; resharding to fewer ranks or one process; a from-scratch sharded save tested equal to DCP's.
  Toy job ``Spec``, ``train_job``; ``latest``, ``verify_checkpoint`` (``CorruptCheckpointError``), ``directory_bytes``;
  ``STATE_PARTS`` and ``resume_variants`` (a resume without each part), ``resume_in_process``; ``load_shards_full``
  and ``dcp_full`` (full tensors in one process); ``async_stall_job`` and ``async_stall_ratio``.
- ``elastic``: the job under ``torchrun --max-restarts`` (``python -m mlsys_nb.checkpoint.elastic``): a rank
  SIGKILLed, the agent restarts the group, each attempt joins through its own ``PrefixStore``, the resume is bitwise.
- ``asyncsave``: ``ThreadedSaver``, an asynchronous save from scratch (copy to host memory, write on a thread).
- ``offload``: a from-scratch ZeRO-Offload optimizer (``OffloadAdamW``: AdamW on the host, parameters copied
  back), tested equal to the on-device step, with the bytes it moves counted (``offload_bytes_per_step``); when
  offload hides under compute (a model: ``offload_time``, ``offload_break_even_tokens``).
"""

import importlib

from . import interval, offload
from .interval import *  # noqa: F403 (its __all__: the interval formulas and the simulation)
from .offload import *  # noqa: F403 (its __all__: OffloadAdamW and its bytes and time)

# torch.distributed's checkpoint and FSDP load on first use (the quiz needs only formulas): name -> its module
_LAZY = dict.fromkeys(
    "Spec Trainer ShuffledSampler CorruptCheckpointError STATE_PARTS save load latest checkpoints verify_checkpoint"
    " save_shards load_shards_full dcp_full directory_bytes train_job resume_variants resume_in_process"
    " async_stall_job async_stall_ratio".split(),
    "sharded",
) | {"ThreadedSaver": "asyncsave"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'mlsys_nb.checkpoint' has no attribute {name!r}")


__all__ = [*interval.__all__, *_LAZY, *offload.__all__]
