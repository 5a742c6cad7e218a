"""The same job under torchrun's elastic agent, which restarts every worker when one dies.

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 -m mlsys_nb.checkpoint.elastic ROOT --steps 6 --die-at 5

On the first attempt rank 1 SIGKILLs itself after step ``--die-at``; the agent sees the dead worker, stops
the others and starts all of them again with ``TORCHELASTIC_RESTART_COUNT`` one higher; every worker then
resumes from the newest complete checkpoint under ROOT. Rank 0 writes ``ROOT/final.pt`` (the full parameters,
the attempt and the step it resumed from).

The store: under torchrun the workers reach a TCPStore that outlives a restart, so keys written by the
dead attempt are still there when the new one rendezvouses. Each attempt therefore joins through its own
``PrefixStore(f"attempt{TORCHELASTIC_RESTART_COUNT}", store)``, and the attempts never read each other's keys.
"""

from __future__ import annotations

import argparse
import os
import signal
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .sharded import Spec, Trainer, latest, load, save


def join(timeout_s: float = 60.0) -> int:
    """Join the default process group for this restart attempt; return the attempt number."""
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world,
        is_master=rank == 0 and not agent_store,
        timeout=timedelta(seconds=timeout_s),
    )
    dist.init_process_group(
        "gloo",
        store=dist.PrefixStore(f"attempt{attempt}", store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    return attempt


def _main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlsys_nb.checkpoint.elastic", description=__doc__.split("\n")[0])
    parser.add_argument("root", help="checkpoint directory")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--die-at", type=int, default=5, help="step after which rank 1 dies on the first attempt")
    parser.add_argument("--seed", type=int, default=0)
    a = parser.parse_args(argv)
    torch.set_num_threads(1)
    attempt = join()
    trainer = Trainer(Spec(seed=a.seed))
    path = latest(a.root)
    resumed_from = None
    if path is not None:
        load(trainer, path)
        resumed_from = trainer.step_count
    while trainer.step_count < a.steps:
        trainer.step()
        if trainer.step_count % 2 == 0:
            save(trainer, a.root, keep=2)
        if attempt == 0 and trainer.step_count == a.die_at and trainer.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
    params = trainer.full_parameters()
    if trainer.rank == 0:
        out = {"params": params, "attempt": attempt, "resumed_from": resumed_from}
        torch.save(out, Path(a.root) / "final.pt")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
