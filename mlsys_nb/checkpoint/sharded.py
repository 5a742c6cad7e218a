"""Sharded checkpoints of an FSDP2 model on real ranks, and everything a resume needs.

The training job here is small on purpose (a 3-layer MLP on a fixed synthetic data set) but has every
piece of state a real one has: parameters and AdamW moments sharded by FSDP2 (``fully_shard``), an LR
schedule, a shuffling sampler with an epoch and a position, and three random number generators (torch,
numpy, python) that draw the input noise, the target jitter and a loss weight. Each global batch is drawn
whole on every rank from generators seeded alike, and rank r trains on its slice of it, so the same
global batch gives the same gradients on any number of ranks (up to the order of the reduction).

A checkpoint (``save``) is a directory ``step_NNNNNN`` under a root:

- the model and optimizer through ``torch.distributed.checkpoint`` (DCP): each rank writes its shards,
  and DCP's ``.metadata`` says which piece of which tensor is where, so a checkpoint written by 4 ranks
  loads on 2 ranks or into one plain process (resharding);
- ``extra_rank{r}.pt`` per rank: the three RNG states, the sampler, the scheduler and the step;
- ``MANIFEST.json``, written last: the SHA-256 of every file. ``load`` refuses a checkpoint whose files
  do not match (``CorruptCheckpointError``).

Writes are atomic: everything goes to ``step_NNNNNN.tmp``, every file is fsync'ed, then one ``rename``
makes the directory appear whole; a crash mid-save leaves only a ``.tmp`` that ``latest`` ignores. The
newest ``keep`` checkpoints are kept, older ones deleted.

``save_shards`` / ``load_shards_full`` are the same idea from scratch (each rank writes its local shards
with ``torch.save``, rank 0 an ``index.json`` saying where every row of every tensor lives), readable in
one sitting and tested equal to DCP's result.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import signal
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..config import ArgumentError, check_choice, check_int, check_number

__all__ = [
    "Spec",
    "ShuffledSampler",
    "CorruptCheckpointError",
    "STATE_PARTS",
    "make_model",
    "make_data",
    "Trainer",
    "save",
    "load",
    "latest",
    "checkpoints",
    "verify_checkpoint",
    "save_shards",
    "load_shards_full",
    "dcp_full",
    "train_job",
    "resume_variants",
    "directory_bytes",
    "full_state_bytes",
    "resume_in_process",
    "async_stall_job",
    "async_stall_ratio",
]

MANIFEST = "MANIFEST.json"
STATE_PARTS = ("optimizer", "scheduler", "sampler", "step", "torch_rng", "numpy_rng", "python_rng")


class CorruptCheckpointError(RuntimeError):
    """A checkpoint's files do not match its manifest (or the manifest is missing)."""


@dataclass(frozen=True)
class Spec:
    """The toy job: widths, data set size, global batch, AdamW's learning rate, seed."""

    d_in: int = 8
    hidden: int = 32
    d_out: int = 4
    n_samples: int = 48
    global_batch: int = 12
    lr: float = 0.02
    seed: int = 0

    def __post_init__(self):
        for name in ("d_in", "hidden", "d_out", "n_samples", "global_batch"):
            check_int(name, getattr(self, name), 1)
        check_number("lr", self.lr, 0.0, 1.0, lo_open=True)
        check_int("seed", self.seed, 0)
        if self.n_samples % self.global_batch:
            raise ArgumentError(
                f"n_samples must be a multiple of global_batch={self.global_batch}, got {self.n_samples}"
            )


def make_model(spec: Spec) -> nn.Module:
    """The same initial weights on every rank and every run (seeded from ``spec.seed``)."""
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(spec.seed)
        return nn.Sequential(
            nn.Linear(spec.d_in, spec.hidden),
            nn.Tanh(),
            nn.Linear(spec.hidden, spec.hidden),
            nn.Tanh(),
            nn.Linear(spec.hidden, spec.d_out),
        )


def make_data(spec: Spec) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed regression data set ``(x, y)`` from its own generator (``seed + 1``)."""
    g = torch.Generator().manual_seed(spec.seed + 1)
    x = torch.randn(spec.n_samples, spec.d_in, generator=g)
    w = torch.randn(spec.d_in, spec.d_out, generator=g)
    return x, torch.sin(x @ w)


class ShuffledSampler:
    """A new permutation of ``n`` samples each epoch (``Generator(seed + epoch)``), served ``batch`` at a
    time; ``state_dict`` is ``{epoch, position}``: enough to serve the same next batch after a restart."""

    def __init__(self, n: int, batch: int, seed: int = 0):
        self.n, self.batch, self.seed = check_int("n", n, 1), check_int("batch", batch, 1, n), seed
        self.epoch, self.position = 0, 0

    def next_batch(self) -> torch.Tensor:
        perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        idx = perm[self.position : self.position + self.batch]
        self.position += self.batch
        if self.position + self.batch > self.n:
            self.epoch, self.position = self.epoch + 1, 0
        return idx

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def _lr_lambda(step: int) -> float:
    return 1.0 / (1.0 + 0.25 * step)  # a decaying schedule: restarting it at 0 changes every later step


class Trainer:
    """Model (FSDP2-sharded when a process group is up, plain otherwise), AdamW, LR schedule, sampler.

    ``step()`` trains on one global batch: every rank draws the whole batch's noise from the seeded
    torch / numpy / python generators and uses its slice ``rank·b : (rank+1)·b`` (``b = batch / world``)."""

    def __init__(self, spec: Spec, *, shard: bool | None = None):
        self.spec = spec
        self.distributed = dist.is_available() and dist.is_initialized() if shard is None else shard
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        if spec.global_batch % self.world:
            raise ArgumentError(
                f"global_batch must be a multiple of the world size {self.world}, got {spec.global_batch}"
            )
        self.model = make_model(spec)
        if self.distributed:
            from torch.distributed.fsdp import fully_shard

            # one FSDP group for the whole toy model: every parameter is still split by rows (Shard(0)), so the
            # checkpoint is the same, but a step runs one all-gather and one reduce-scatter instead of one per
            # layer and pass. Each collective must find every rank scheduled: on 2 busy cores the per-layer
            # groups (9 collectives a step) made a step 2-3x slower
            fully_shard(self.model)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=spec.lr, weight_decay=0.01)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, _lr_lambda)
        self.sampler = ShuffledSampler(spec.n_samples, spec.global_batch, spec.seed)
        self.x, self.y = make_data(spec)
        self.step_count = 0
        torch.manual_seed(spec.seed + 2)
        np.random.seed(spec.seed + 3)
        random.seed(spec.seed + 4)

    def step(self) -> float:
        idx = self.sampler.next_batch()
        x, y = self.x[idx], self.y[idx]
        noise = 0.1 * torch.randn(x.shape)  # torch's RNG
        jitter = torch.from_numpy(0.05 * np.random.standard_normal(tuple(y.shape)).astype(np.float32))  # numpy's
        weight = random.uniform(0.5, 1.5)  # python's
        b = len(idx) // self.world
        sl = slice(self.rank * b, (self.rank + 1) * b)
        loss = weight * ((self.model(x[sl] + noise[sl]) - (y[sl] + jitter[sl])) ** 2).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()
        self.step_count += 1
        return float(loss.detach())

    def extra_state(self) -> dict:
        """What DCP does not hold: RNG states, sampler, scheduler, step (this rank's)."""
        return {
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
            "sampler": self.sampler.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step_count,
        }

    def load_extra_state(self, state: dict, drop=()) -> None:
        if "torch_rng" not in drop:
            torch.set_rng_state(state["torch_rng"])
        if "numpy_rng" not in drop:
            np.random.set_state(state["numpy_rng"])
        if "python_rng" not in drop:
            random.setstate(state["python_rng"])
        if "sampler" not in drop:
            self.sampler.load_state_dict(state["sampler"])
        if "scheduler" not in drop:
            self.scheduler.load_state_dict(state["scheduler"])
        if "step" not in drop:
            self.step_count = int(state["step"])

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """{name: full tensor} (a collective when sharded: every rank must call it)."""
        out = {}
        for name, p in self.model.named_parameters():
            t = p.full_tensor() if hasattr(p, "full_tensor") else p
            out[name] = t.detach().clone()
        return out


# ---- files: atomic writes, checksums, the newest k ------------------------------------------
def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def checkpoints(root) -> list[Path]:
    """Complete checkpoints under ``root`` (a manifest present), oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.glob("step_[0-9]*") if p.is_dir() and (p / MANIFEST).exists())


def latest(root) -> Path | None:
    """The newest complete checkpoint under ``root`` (``.tmp`` directories of a crashed save are ignored)."""
    found = checkpoints(root)
    return found[-1] if found else None


def verify_checkpoint(path) -> dict:
    """Check every file against the manifest; return the manifest or raise ``CorruptCheckpointError``."""
    path = Path(path)
    if not (path / MANIFEST).exists():
        raise CorruptCheckpointError(f"{path}: no {MANIFEST} (the save did not finish)")
    manifest = json.loads((path / MANIFEST).read_text())
    for name, digest in manifest["files"].items():
        f = path / name
        if not f.exists():
            raise CorruptCheckpointError(f"{path}: {name} is missing")
        if _sha256(f) != digest:
            raise CorruptCheckpointError(f"{path}: {name} does not match its SHA-256 in {MANIFEST}")
    return manifest


def _finish(tmp: Path, final: Path, step: int, world: int, keep: int) -> None:
    """Rank 0, after every rank wrote: fsync all files, write the manifest, rename, drop old ones."""
    files = {}
    for f in sorted(tmp.iterdir()):
        _fsync_path(f)
        files[f.name] = _sha256(f)
    part = tmp / (MANIFEST + ".part")
    part.write_text(json.dumps({"step": step, "world_size": world, "files": files}, indent=1))
    _fsync_path(part)
    os.replace(part, tmp / MANIFEST)
    _fsync_path(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)  # the atomic moment: the checkpoint appears whole or not at all
    _fsync_path(final.parent)
    for old in checkpoints(final.parent)[:-keep]:
        shutil.rmtree(old)


def save(trainer: Trainer, root, *, keep: int = 2) -> Path:
    """Save a checkpoint of ``trainer`` under ``root`` (every rank calls it); return its directory."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    check_int("keep", keep, 1)
    root = Path(root)
    final = _step_dir(root, trainer.step_count)
    tmp = final.with_name(final.name + ".tmp")
    if trainer.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    if trainer.distributed:
        dist.barrier()
    msd, osd = get_state_dict(trainer.model, trainer.optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp), no_dist=not trainer.distributed)
    extra = tmp / f"extra_rank{trainer.rank}.pt"
    torch.save(trainer.extra_state(), extra)
    _fsync_path(extra)
    if trainer.distributed:
        dist.barrier()
    if trainer.rank == 0:
        _finish(tmp, final, trainer.step_count, trainer.world, keep)
    if trainer.distributed:
        dist.barrier()
    return final


def load(trainer: Trainer, path, *, drop=()) -> dict:
    """Load the checkpoint at ``path`` into ``trainer`` on any number of ranks (or one plain process).

    ``drop``: parts of ``STATE_PARTS`` to leave as they are (to show that each one matters). The extra
    state of rank r comes from ``extra_rank{r}.pt``, or rank 0's when the checkpoint had fewer ranks
    (in this job every rank's generators are alike). Raises ``CorruptCheckpointError`` first if a file
    does not match the manifest."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_model_state_dict, set_state_dict

    for part in drop:
        check_choice("drop", part, STATE_PARTS)
    manifest = verify_checkpoint(path)
    msd, osd = get_state_dict(trainer.model, trainer.optimizer)
    state = {"model": msd, "optim": osd}
    with warnings.catch_warnings():  # DCP warns that one process without a group loads alone: intended here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), no_dist=not trainer.distributed)
    if "optimizer" in drop:
        set_model_state_dict(trainer.model, state["model"])
        trainer.optimizer.state.clear()  # fresh AdamW moments, as if the optimizer were not saved
    else:
        set_state_dict(
            trainer.model, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    r = trainer.rank if trainer.rank < manifest["world_size"] else 0
    extra = torch.load(Path(path) / f"extra_rank{r}.pt", weights_only=False)
    trainer.load_extra_state(extra, drop)
    return manifest


def directory_bytes(path) -> int:
    """Bytes of every file under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# ---- the same idea from scratch: each rank writes its rows, rank 0 the index ---------------------
def _local_rows(t) -> tuple[torch.Tensor, int, int]:
    """(local tensor, first row, global rows) of an FSDP2 parameter or state sharded on dim 0."""
    if not hasattr(t, "to_local"):
        return t.detach(), 0, t.shape[0] if t.dim() else 0
    local, world, rank = t.to_local(), dist.get_world_size(), dist.get_rank()
    rows = t.shape[0]
    chunk = math.ceil(rows / world)  # torch.chunk's split, the one Shard(0) uses
    first = min(rank * chunk, rows)
    if local.shape[0] != max(0, min(chunk, rows - first)):
        raise RuntimeError(f"unexpected shard of {tuple(t.shape)} on rank {rank}: {tuple(local.shape)}")
    return local.detach(), first, rows


def _named_tensors(trainer: Trainer) -> dict:
    """model/<name> and optim/<name>/<exp_avg|exp_avg_sq> for every parameter."""
    out = {}
    for name, p in trainer.model.named_parameters():
        out[f"model/{name}"] = p
        for key in ("exp_avg", "exp_avg_sq"):
            if key in trainer.optimizer.state.get(p, {}):
                out[f"optim/{name}/{key}"] = trainer.optimizer.state[p][key]
    return out


def save_shards(trainer: Trainer, path) -> Path:
    """Each rank writes ``shard_rank{r}.pt`` with its rows of every tensor; rank 0 writes ``index.json``
    (for each tensor: global shape and, per rank, the file and the first row of its piece)."""
    path = Path(path)
    if trainer.rank == 0:
        path.mkdir(parents=True, exist_ok=True)
    if trainer.distributed:
        dist.barrier()
    mine, index = {}, {}
    for key, t in _named_tensors(trainer).items():
        local, first, rows = _local_rows(t)
        mine[key] = local.clone()
        index[key] = {"shape": list(t.shape), "first_row": first, "rows": local.shape[0] if t.dim() else 0}
    torch.save(mine, path / f"shard_rank{trainer.rank}.pt")
    gathered = [None] * trainer.world
    if trainer.distributed:
        dist.all_gather_object(gathered, index)
    else:
        gathered = [index]
    if trainer.rank == 0:
        table = {
            key: {
                "shape": gathered[0][key]["shape"],
                "pieces": [
                    {"file": f"shard_rank{r}.pt", "first_row": g[key]["first_row"], "rows": g[key]["rows"]}
                    for r, g in enumerate(gathered)
                ],
            }
            for key in gathered[0]
        }
        (path / "index.json").write_text(json.dumps(table, indent=1))
    if trainer.distributed:
        dist.barrier()
    return path


def load_shards_full(path) -> dict[str, torch.Tensor]:
    """Read a ``save_shards`` directory back into full tensors, in one process (no ranks needed)."""
    path = Path(path)
    table = json.loads((path / "index.json").read_text())
    files = {}
    out = {}
    for key, entry in table.items():
        full = torch.empty(entry["shape"])
        for piece in entry["pieces"]:
            if piece["file"] not in files:
                files[piece["file"]] = torch.load(path / piece["file"], weights_only=True)
            local = files[piece["file"]][key]
            if piece["rows"]:
                full[piece["first_row"] : piece["first_row"] + piece["rows"]] = local
        out[key] = full
    return out


def dcp_full(path) -> dict[str, torch.Tensor]:
    """DCP's checkpoint at ``path`` as full tensors keyed like ``load_shards_full`` (one process)."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as d:
        dcp_to_torch_save(str(path), os.path.join(d, "full.pt"))
        sd = torch.load(os.path.join(d, "full.pt"), weights_only=False)
    out = {f"model/{k}": v for k, v in sd["model"].items()}
    for name, states in sd["optim"]["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"optim/{name}/{key}"] = states[key]
    return out


def full_state_bytes(trainer: Trainer) -> dict:
    """The rank-0 alternative to a sharded save, measured: ``get_state_dict`` with ``full_state_dict=True``
    and ``cpu_offload=True`` gathers every tensor onto rank 0 (the others get nothing). Returns tensor bytes
    per rank for the gathered model + optimizer (``full``) and for this rank's own shards (``local``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    def nbytes(tree) -> int:
        if isinstance(tree, torch.Tensor):
            t = tree.to_local() if hasattr(tree, "to_local") else tree
            return t.numel() * t.element_size()
        if isinstance(tree, dict):
            return sum(nbytes(v) for v in tree.values())
        if isinstance(tree, (list, tuple)):
            return sum(nbytes(v) for v in tree)
        return 0

    local = nbytes(get_state_dict(trainer.model, trainer.optimizer))
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = nbytes(get_state_dict(trainer.model, trainer.optimizer, options=opts))
    per_rank = [None] * trainer.world
    if trainer.distributed:
        dist.all_gather_object(per_rank, {"local": local, "full": full})
    else:
        per_rank = [{"local": local, "full": full}]
    return {"per_rank": per_rank}


# ---- jobs for mlsys_nb.launch ----------------------------------------------------------------
def train_job(
    spec: Spec,
    root,
    steps: int,
    *,
    save_every: int = 0,
    resume=None,
    keep: int = 2,
    die_at: int | None = None,
    die_rank: int = 1,
    scratch_at: int | None = None,
) -> dict | None:
    """Train ``steps`` steps (counting from the checkpoint's step when ``resume``), saving every
    ``save_every`` steps under ``root``; ``resume``: a checkpoint directory to start from, or ``"latest"``
    (the newest under ``root``); with ``die_at``, rank ``die_rank`` SIGKILLs itself right after
    reaching that step (a real crash: no exception, no goodbye). ``scratch_at``: also write
    ``save_shards`` there after the save at that step. Rank 0 returns the full parameters, the losses
    and the checkpoint directories; other ranks return None."""
    trainer = Trainer(spec)
    resumed_from = None
    if resume is not None:
        path = latest(root) if resume == "latest" else Path(resume)
        if path is None:
            raise FileNotFoundError(f"no complete checkpoint under {root}")
        load(trainer, path)
        resumed_from = trainer.step_count
    losses, saved, gathered = [], [], None
    while trainer.step_count < steps:
        losses.append(trainer.step())
        if save_every and trainer.step_count % save_every == 0:
            saved.append(str(save(trainer, root, keep=keep)))
            if scratch_at == trainer.step_count:
                save_shards(trainer, Path(root) / f"scratch_{trainer.step_count:06d}")
                gathered = full_state_bytes(trainer)
        if die_at == trainer.step_count and trainer.rank == die_rank:
            os.kill(os.getpid(), signal.SIGKILL)
    params = trainer.full_parameters()
    if trainer.rank:
        return None
    return {
        "params": params,
        "losses": losses,
        "saved": saved,
        "resumed_from": resumed_from,
        "world": trainer.world,
        "gathered": gathered,
    }


def resume_variants(spec: Spec, path, steps: int, variants: list) -> list | None:
    """For each ``drop`` tuple in ``variants``: a fresh trainer loads ``path`` without those parts and
    trains to ``steps``. Rank 0 returns the full parameters of each variant (in order)."""
    out = []
    for drop in variants:
        trainer = Trainer(spec)
        load(trainer, path, drop=tuple(drop))
        while trainer.step_count < steps:
            trainer.step()
        out.append(trainer.full_parameters())
    return out if not (dist.is_initialized() and dist.get_rank()) else None


def resume_in_process(spec: Spec, path, steps: int) -> dict:
    """Load ``path`` into a plain (unsharded) model in this process and train to ``steps``."""
    trainer = Trainer(spec, shard=False)
    load(trainer, path)
    while trainer.step_count < steps:
        trainer.step()
    return {"params": trainer.full_parameters(), "world": 1}


def _blocking_async_save(state_dict, *, checkpoint_id, process_group=None):
    """The key idea of an asynchronous save broken, for the tests: write synchronously (``dcp.save``), then
    hand back a future that is already done. It passes a check that reads only the snapshot."""
    from concurrent.futures import Future

    import torch.distributed.checkpoint as dcp

    done = Future()
    done.set_result(dcp.save(state_dict, checkpoint_id=checkpoint_id, process_group=process_group))
    return done


def async_stall_job(
    spec: Spec, root, repeats: int = 5, steps_between: int = 1, *, blocking: bool = False
) -> dict | None:
    """Synchronous ``dcp.save`` against ``dcp.async_save`` of the same state, interleaved ``repeats`` times
    on one job (after one untimed warm-up of each: the first calls build DCP's planner caches and the
    writer's thread pool).

    The stall is the seconds the training loop waits in the save call (``time.perf_counter``, from a barrier
    so every rank starts together): the whole write for ``dcp.save``; for ``dcp.async_save`` only the copy of
    the state into a staging buffer, the write then runs on a thread (over its own gloo group, so its
    collectives never interleave with training's) while ``steps_between`` more steps run. The order of the
    two saves alternates from one repeat to the next, so a drift in the machine's load hits both alike.
    Right after each async save returns, a step changes the parameters before the write has finished: the
    checkpoint must still hold the values of the moment of the save (rank 0 returns them as ``at_save``,
    with the last async checkpoint's directory: the one checkpoint kept, so the only snapshot gathered).
    Every step and every gather is a round of collectives that must find all ranks scheduled: on a loaded
    machine each costs time slices, so the job takes one step between saves (default) and gathers one
    snapshot. ``blocking=True`` replaces ``dcp.async_save`` with a synchronous save that returns a done future
    (``_blocking_async_save``): the broken idea the tests run."""
    import time

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    check_int("repeats", repeats, 1)
    check_int("steps_between", steps_between, 1)
    async_save = _blocking_async_save if blocking else dcp.async_save
    trainer = Trainer(spec)
    group = dist.new_group(backend="gloo")  # the background writer's own group
    trainer.step()
    sync_s, async_s, at_save, last = [], [], None, None

    def sync_once(path) -> float:
        msd, osd = get_state_dict(trainer.model, trainer.optimizer)
        dist.barrier()
        t0 = time.perf_counter()
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(path))
        stalled = time.perf_counter() - t0
        for _ in range(steps_between):
            trainer.step()
        return stalled

    def async_once(path, keep: bool) -> tuple[float, dict | None]:
        msd, osd = get_state_dict(trainer.model, trainer.optimizer)
        snapshot = trainer.full_parameters() if keep else None  # an all-gather: only for the kept checkpoint
        dist.barrier()
        t0 = time.perf_counter()
        future = async_save({"model": msd, "optim": osd}, checkpoint_id=str(path), process_group=group)
        stalled = time.perf_counter() - t0
        for _ in range(steps_between):
            trainer.step()  # overlaps the write; changes the parameters in place
        future.result(timeout=60)
        dist.barrier()
        return stalled, snapshot

    def drop(path) -> None:  # only the last async checkpoint is kept (it is checked against its snapshot)
        dist.barrier()
        if trainer.rank == 0 and path is not None:
            shutil.rmtree(path, ignore_errors=True)

    root = Path(root)
    sync_once(root / "warmup_sync")
    drop(root / "warmup_sync")
    async_once(root / "warmup_async", keep=False)
    drop(root / "warmup_async")
    for i in range(repeats):
        for kind in ("sync", "async") if i % 2 == 0 else ("async", "sync"):
            if kind == "sync":
                sync_s.append(sync_once(root / f"sync_{i}"))
                drop(root / f"sync_{i}")
            else:
                previous, last = last, root / f"async_{i}"
                stalled, snapshot = async_once(last, keep=i == repeats - 1)
                at_save = snapshot if snapshot is not None else at_save
                async_s.append(stalled)
                drop(previous)
    if trainer.rank:
        return None
    return {"sync_stall_s": sync_s, "async_stall_s": async_s, "at_save": at_save, "path": str(last)}


def async_stall_ratio(stall: dict) -> float:
    """The shortest stall of the asynchronous saves over the shortest stall of the synchronous ones, from
    ``async_stall_job``'s result: well below 1 when the write runs behind training; about 1 when the "async"
    save blocks for the write (``blocking=True``). The shortest of several is what a save costs when nothing
    else interrupts it: on a busy machine the scheduler adds whole time slices (~4 ms each) to some calls, which
    can lift a median of the short async stalls to half the synchronous one; it cannot lower a minimum."""
    return min(stall["async_stall_s"]) / min(stall["sync_stall_s"])
