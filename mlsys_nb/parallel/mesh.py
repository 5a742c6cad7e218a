"""A device mesh for combined parallelism: which ranks talk to which, and training that uses it.

A job with ``world = pp x dp x cp x tp`` ranks numbers them row-major over the dimensions in
``DIM_ORDER`` = (pp, dp, cp, tp): tp varies fastest (a TP group is consecutive ranks, i.e. one
node's NVLink domain), pp slowest (Megatron-LM's order; ``mlsys_nb.planner`` assumes the same).
A rank's *coordinates* are its index along each dimension; the ranks that differ only in one
dimension form that dimension's process group. Expert parallelism is carved out of dp: the EP
group of a rank is ``ep`` consecutive dp coordinates (``coordinates(..., ep=)`` shows it).

- ``coordinates(**dims)`` / ``grid(**dims)``: the rank <-> coordinates map as a list or a printable
  grid, pure Python (no ranks needed). ``check_dims(world_size, **dims)`` validates before launch.
- ``build_mesh(dp=, tp=, pp=, cp=)`` inside a rank: a frozen ``Mesh`` built with
  ``torch.distributed.device_mesh.init_device_mesh`` (works with gloo on CPU), holding this rank's
  coordinates and one process group per dimension. Pass it explicitly (there is no global mesh).
- ``train_worker(cases, steps, lr)`` (run under ``mlsys_nb.launch``) trains with the kit's own
  pieces on such a mesh and compares the parameters with single-process training after ``steps``
  SGD steps: pp = 1 uses ``TPTransformer`` (TP + sequence parallelism) wrapped in the kit's
  bucketed ``DataParallel`` over the dp group; pp > 1 runs the pipeline executor
  (``mlsys_nb.pipeline.executor.run_step``, 1F1B) over the pp group on transformer blocks that are
  tensor-parallel over the tp group, then averages gradients over the dp group
  (``allreduce_gradients``); PyTorch's FSDP2 + tensor parallel (``"impl": "torch"``) runs beside
  them. The three differ only in how they build the model and step it: one training loop runs
  them all. ``train(cases, world_size)`` checks the cases (``check_cases``) and launches it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import check_choice, check_divides, check_int

DIM_ORDER = ("pp", "dp", "cp", "tp")  # outermost (slowest) to innermost (fastest)


def _dims(**dims) -> dict:
    for name in sorted(dims):
        check_choice("mesh dimension", name, DIM_ORDER + ("ep",))  # ep lives inside dp
    out = {name: check_int(name, dims.get(name, 1), 1) for name in DIM_ORDER}
    check_divides("ep", dims.get("ep", 1), out["dp"], "dp")  # experts are sharded over dp ranks
    return out


def check_dims(world_size: int, **dims) -> dict:
    """The degrees (all of ``DIM_ORDER``) if their product is ``world_size``; else ValueError."""
    d = _dims(**dims)
    if math.prod(d.values()) != world_size:
        shown = " x ".join(f"{k}={v}" for k, v in d.items())
        raise ValueError(
            f"{shown} = {math.prod(d.values())} ranks, but world_size={world_size}: "
            "the degrees must multiply to the world size"
        )
    return d


def coordinates(**dims) -> list[dict]:
    """``[{dim: index, ...} for rank in range(world)]``, row-major over ``DIM_ORDER`` (tp fastest).
    With ``ep > 1`` each entry also has ``ep`` (index inside its expert group = dp mod ep)."""
    ep = dims.get("ep", 1)
    d = _dims(**dims)
    out = []
    for idx in itertools.product(*(range(d[k]) for k in DIM_ORDER)):
        c = dict(zip(DIM_ORDER, idx))
        if ep > 1:
            c["ep"] = c["dp"] % ep
        out.append(c)
    return out


def group_ranks(dim: str, **dims) -> list[list[int]]:
    """The process groups of dimension ``dim``: lists of ranks that differ only in ``dim``."""
    coords = coordinates(**dims)
    check_choice("dim", dim, tuple(coords[0]))
    groups: dict[tuple, list[int]] = {}
    for r, c in enumerate(coords):
        if dim == "ep":  # ep consecutive dp indices, same everything else
            key = tuple(c[k] for k in DIM_ORDER if k != "dp") + (c["dp"] // dims.get("ep", 1),)
        else:
            key = tuple(v for k, v in c.items() if k not in (dim, "ep"))
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def grid(**dims) -> str:
    """The rank of every coordinate as text: one block per (pp, cp) pair, dp rows x tp columns."""
    d = _dims(**dims)
    coords = coordinates(**d)
    lines = [" x ".join(f"{k}={d[k]}" for k in DIM_ORDER) + f"  ({len(coords)} ranks; tp fastest)"]
    for pp, cp in itertools.product(range(d["pp"]), range(d["cp"])):
        title = f"pp={pp}" + (f", cp={cp}" if d["cp"] > 1 else "")
        lines.append(f"{title}:{'':4}" + "".join(f"tp={t:<4}" for t in range(d["tp"])))
        for dp in range(d["dp"]):
            ranks = [r for r, c in enumerate(coords) if (c["pp"], c["cp"], c["dp"]) == (pp, cp, dp)]
            lines.append(f"  dp={dp:<{len(title) + 1}}" + "".join(f"{r:<7}" for r in ranks))
    return "\n".join(lines)


@dataclass(frozen=True)
class Mesh:
    """This rank's place in a pp x dp x cp x tp mesh (build it with ``build_mesh`` inside a rank).

    ``sizes``/``coords``: (name, value) pairs in ``DIM_ORDER``; ``group(name)``: the process group
    of dimension ``name`` containing this rank; ``device_mesh``: PyTorch's ``DeviceMesh``."""

    rank: int
    sizes: tuple
    coords: tuple
    device_mesh: object = field(compare=False, repr=False, default=None)
    groups: dict = field(compare=False, repr=False, default_factory=dict)

    def size(self, name: str) -> int:
        return dict(self.sizes)[name]

    def coord(self, name: str) -> int:
        return dict(self.coords)[name]

    def group(self, name: str):
        if name not in self.groups:
            raise KeyError(f"no {name!r} group: dimensions are {[k for k, _ in self.sizes]}")
        return self.groups[name]

    def grid(self) -> str:
        return grid(**dict(self.sizes))


def build_mesh(*, dp: int = 1, tp: int = 1, pp: int = 1, cp: int = 1, device_type: str | None = None) -> Mesh:
    """Inside a rank (default process group initialised): the mesh over all ranks, via
    ``init_device_mesh`` with ``mesh_dim_names=DIM_ORDER`` (size-1 dimensions included)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    d = check_dims(world, dp=dp, tp=tp, pp=pp, cp=cp)
    if device_type is None:
        device_type = "cuda" if dist.get_backend() == "nccl" else "cpu"
    dm = init_device_mesh(device_type, tuple(d[k] for k in DIM_ORDER), mesh_dim_names=DIM_ORDER)
    rank = dist.get_rank()
    coords = coordinates(**d)[rank]
    local = dm.get_coordinate()
    if tuple(local) != tuple(coords[k] for k in DIM_ORDER):  # our numbering is PyTorch's
        raise RuntimeError(f"rank {rank}: DeviceMesh coordinates {local} differ from {coords}")
    groups = {k: dm.get_group(k) for k in DIM_ORDER}
    return Mesh(
        rank=rank,
        sizes=tuple(d.items()),
        coords=tuple((k, coords[k]) for k in DIM_ORDER),
        device_mesh=dm,
        groups=groups,
    )


# ---- training on a mesh, compared with single-process training -------------------------------
@dataclass
class _Setup:
    """One way of training on the mesh, in the terms of the one training loop (``_train_loop``).

    ``step(x, y)``: forward, backward and data-parallel gradient sync of this replica's rows;
    returns its loss (float). ``ref_loss(x_all, y_all)``: the single-process reference's loss on
    the whole global batch (a tensor to backpropagate). ``batch(generator)``: one global batch
    ``(x_all, y_all)`` of ``rows`` rows per dp replica. ``max_err()``: (largest |parameter -
    reference slice|, tensors compared) after training."""

    params: list
    ref: object
    step: Callable
    ref_loss: Callable
    batch: Callable
    rows: int
    max_err: Callable
    seed_offset: int = 1


def _train_loop(run: _Setup, mesh: Mesh, steps: int, lr: float, seed: int) -> dict:
    """``steps`` SGD steps of this rank's model (on its dp replica's rows of each global batch) and,
    beside it, of the single-process reference on the whole batch; then compare them."""
    import torch

    init = [p.detach().clone() for p in run.ref.parameters()]
    opt = torch.optim.SGD(run.params, lr=lr)
    ref_opt = torch.optim.SGD(run.ref.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed + run.seed_offset)
    d = mesh.coord("dp")
    losses = []
    for _ in range(steps):
        x_all, y_all = run.batch(g)
        mine = slice(d * run.rows, (d + 1) * run.rows)
        loss = run.step(x_all[mine], y_all[mine])
        opt.step()
        opt.zero_grad(set_to_none=True)
        ref_loss = run.ref_loss(x_all, y_all)  # single process, whole batch
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        losses.append((loss, ref_loss.item()))
    err, n = run.max_err()
    moved = max((p.detach() - q).abs().max().item() for p, q in zip(run.ref.parameters(), init))
    return {"max_err": err, "n_tensors": n, "moved": moved, "losses": losses}


def mesh_tiny_config(hidden=32, n_layers=4, n_heads=8, vocab=64, seq_len=16):
    """``config.tiny_config`` at the mesh runs' sizes: 4 layers, 8 heads, 4 KV heads, the default SwiGLU width."""
    from ..config import tiny_config

    return tiny_config(
        n_layers=n_layers,
        hidden=hidden,
        n_heads=n_heads,
        n_kv_heads=n_heads // 2,
        ffn_hidden=None,
        vocab_size=vocab,
        seq_len=seq_len,
    )


def _token_setup(model, ref, step, max_err, cfg, mesh: Mesh, rows: int, seq: int) -> _Setup:
    """The ``_Setup`` of a language model on random tokens: ``model``'s parameters trained by ``step``, the
    single-process ``ref`` (a ``Transformer``: called with targets it returns its loss) the reference and its loss;
    ``batch(generator)``: random tokens [rows·dp, seq + 1] split into inputs and next-token targets."""
    import torch

    def batch(g):
        tokens = torch.randint(0, cfg.vocab_size, (rows * mesh.size("dp"), seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    params = list(model.parameters())
    return _Setup(params, ref, step, ref_loss=ref, batch=batch, rows=rows, max_err=max_err)


def _tp_dp(mesh: Mesh, seed: int, batch: int = 4, seq: int = 16) -> _Setup:
    """pp = 1: TPTransformer (TP + SP over the tp group) inside DataParallel over the dp group."""
    import torch

    from ..models import Transformer
    from .ddp import DataParallel
    from .tensor import TPTransformer, compare_with_full, load_full_state_dict, sync_sequence_parallel_grads

    cfg = mesh_tiny_config(seq_len=seq)
    torch.manual_seed(seed)
    ref = Transformer(cfg, attn_impl="matmul")
    tp_g, dp_g = mesh.group("tp"), mesh.group("dp")
    model = TPTransformer(cfg, sequence_parallel=mesh.size("tp") > 1, attn_impl="matmul", group=tp_g)
    load_full_state_dict(model, ref.state_dict(), group=tp_g)
    ddp = DataParallel(model, group=dp_g)

    def step(x, y):
        loss = ddp(x, y)
        loss.backward()
        sync_sequence_parallel_grads(model, group=tp_g)
        return loss.item()

    def max_err():
        errs = compare_with_full(model, {n: p.detach() for n, p in ref.named_parameters()}, grads=False, group=tp_g)
        return max(errs.values()), len(errs)

    return _token_setup(model, ref, step, max_err, cfg, mesh, batch, seq)


def _torch_fsdp_tp(mesh: Mesh, seed: int, batch: int = 4, seq: int = 16) -> _Setup:
    """PyTorch's own composition on the same 2D mesh: ``parallelize_module`` (ColwiseParallel q/k/v,
    gate/up; RowwiseParallel o/down) over the tp dimension, then FSDP2 ``fully_shard`` over dp."""
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from ..models import Transformer

    cfg = mesh_tiny_config(seq_len=seq)
    torch.manual_seed(seed)
    ref = Transformer(cfg, attn_impl="matmul")
    torch.manual_seed(seed)
    model = Transformer(cfg, attn_impl="matmul")
    dm = mesh.device_mesh
    plan = {
        "attn.q_proj": ColwiseParallel(),
        "attn.k_proj": ColwiseParallel(),
        "attn.v_proj": ColwiseParallel(),
        "attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    for blk in model.blocks:
        parallelize_module(blk, dm["tp"], plan)
        fully_shard(blk, mesh=dm["dp"])
    fully_shard(model, mesh=dm["dp"])

    def step(x, y):
        loss = model(x, y)
        loss.backward()
        return loss.item()

    def max_err():
        ref_params = dict(ref.named_parameters())
        err = 0.0
        for n, p in model.named_parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            err = max(err, (full.detach() - ref_params[n].detach()).abs().max().item())
        return err, len(ref_params)

    return _token_setup(model, ref, step, max_err, cfg, mesh, batch, seq)


def _tp_stage_block(cfg, full_block, tp_group):
    """A pipeline block that is tensor-parallel over ``tp_group``, loaded from a full block."""
    import torch
    from torch import nn

    from ..models.transformer import rope_tables
    from .tensor import TPBlock, load_full_state_dict

    class TPStageBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = TPBlock(cfg, sequence_parallel=False, attn_impl="matmul", group=tp_group)
            cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, x):
            return self.block(x, self.cos, self.sin)

    mod = TPStageBlock()
    with torch.no_grad():
        load_full_state_dict(mod.block, full_block.block.state_dict(), group=tp_group)
    return mod


def _pipeline_tp(mesh: Mesh, seed: int, m: int = 4) -> _Setup:
    """pp > 1: the pipeline executor (1F1B) over the pp group, blocks tensor-parallel over the tp
    group, gradients averaged over the dp group; loss = mean over every micro-batch of every replica."""
    import torch
    from torch import nn

    from ..pipeline import schedule
    from ..pipeline.executor import ModelSpec, build_blocks, layers_of, run_step, stage_modules
    from .ddp import allreduce_gradients
    from .tensor import compare_with_full

    pp, dp, tp = mesh.size("pp"), mesh.size("dp"), mesh.size("tp")
    spec = ModelSpec(
        hidden=32, n_layers=2 * pp, microbatch_size=2, seed=seed, block="transformer", seq_len=8, n_heads=4
    )
    sched = schedule("1f1b", pp, m)
    ref = build_blocks(spec)  # single-process reference, same seed
    full = build_blocks(spec)
    tp_g = mesh.group("tp")
    if tp > 1:
        full = nn.ModuleList(_tp_stage_block(spec.transformer_config(), b, tp_g) for b in full)
    mods = stage_modules(sched, spec, mesh.coord("pp"), full)

    def step(x, y):
        res = run_step(sched, spec, group=mesh.group("pp"), mods=mods, batch=(x, y))
        allreduce_gradients(nn.ModuleList(mods.values()), group=mesh.group("dp"))
        return res["loss"]

    def ref_loss(x_all, y_all):
        total = 0.0
        for j in range(dp * m):
            h = x_all[j]
            for blk in ref:
                h = blk(h)
            total = total + torch.nn.functional.mse_loss(h, y_all[j]) / (dp * m)
        return total

    def batch(g):
        return torch.randn((dp * m, *spec.shape), generator=g), torch.randn((dp * m, *spec.shape), generator=g)

    def max_err():
        err, n = 0.0, 0
        for (_path, s), mod in mods.items():
            for i, blk in zip(layers_of(sched, spec, s), mod):
                if tp > 1:
                    full_params = {k: p.detach() for k, p in ref[i].block.named_parameters()}
                    e = compare_with_full(blk.block, full_params, grads=False, group=tp_g)
                    err, n = max(err, *e.values()), n + len(e)
                else:
                    for (_, p), (_, q) in zip(blk.named_parameters(), ref[i].named_parameters()):
                        err, n = max(err, (p.detach() - q.detach()).abs().max().item()), n + 1
        return err, n

    return _Setup(
        params=[p for mod in mods.values() for p in mod.parameters()],
        ref=ref,
        step=step,
        ref_loss=ref_loss,
        batch=batch,
        rows=m,
        max_err=max_err,
        seed_offset=7,
    )


IMPLS = ("kit", "torch")


def train_worker(cases: list[dict], steps: int = 3, lr: float = 0.1, seed: int = 0) -> list[dict]:
    """Run under ``mlsys_nb.launch``: for each case (degrees, e.g. ``{"dp": 2, "tp": 2}``, and
    optionally ``"impl": "torch"`` for PyTorch's FSDP2 + tensor parallel) build the mesh, train
    ``steps`` SGD steps and compare with single-process training. Returns, per case, this rank's
    coordinates, ``max_err`` (largest parameter difference), ``moved`` (largest change of a
    reference parameter over the run: the difference must be far below it) and ``losses`` (this
    replica's, the single process's)."""
    import torch.distributed as dist

    out = []
    for case in cases:
        impl = case.get("impl", "kit")
        mesh = build_mesh(**{k: v for k, v in case.items() if k != "impl"})
        if impl == "torch":
            setup = _torch_fsdp_tp
        else:
            setup = _pipeline_tp if mesh.size("pp") > 1 else _tp_dp
        res = _train_loop(setup(mesh, seed), mesh, steps, lr, seed)
        groups = {k: dist.get_process_group_ranks(mesh.group(k)) for k in DIM_ORDER}
        out.append(
            {
                "dims": dict(mesh.sizes),
                "rank": mesh.rank,
                "coords": dict(mesh.coords),
                "groups": groups,
                "impl": impl,
                **res,
            }
        )
    return out


def check_cases(cases: list[dict], world_size: int, steps: int = 1) -> None:
    """Raise ``ValueError`` naming the parameter if ``train_worker`` cannot run ``cases`` on
    ``world_size`` ranks for ``steps`` steps (call it before launching any rank)."""
    check_int("steps", steps, 1)
    for case in cases:
        check_choice("impl", case.get("impl", "kit"), IMPLS)  # torch: FSDP2 + tensor parallel, pp = 1
        d = check_dims(world_size, **{k: v for k, v in case.items() if k != "impl"})
        if case.get("impl") == "torch" and d["pp"] > 1:
            raise ValueError("impl='torch' composes FSDP2 with tensor parallelism: pp must be 1")
        if d["cp"] > 1:
            raise ValueError("cp > 1: context parallelism is not part of these training runs (cp=1)")
        # tp splits the KV heads: these small models have 4, their pipeline blocks 2
        kv_heads = 2 if d["pp"] > 1 else 4
        check_int(f"tp (with pp={d['pp']}: {kv_heads} KV heads to split)", d["tp"], 1, kv_heads)


def train(
    cases: list[dict],
    world_size: int,
    *,
    steps: int = 3,
    lr: float = 0.1,
    seed: int = 0,
    timeout: float = 180.0,
    output: str = "quiet",
    backend: str = "gloo",
) -> list[list[dict]]:
    """Launch ``train_worker`` on ``world_size`` ranks (CPU; ``backend`` "gloo", or "auto" which
    means gloo here: the runs are on CPU); check every case's degrees before any rank starts
    (``check_cases``). Returns ``results[rank][case]`` (see ``train_worker``)."""
    check_choice("backend", backend, ("gloo", "auto"))  # these runs use CPU tensors
    check_cases(cases, world_size, steps)
    from .. import launch

    return launch(
        train_worker,
        world_size=world_size,
        kwargs={"cases": cases, "steps": steps, "lr": lr, "seed": seed},
        backend="gloo",
        timeout=timeout,
        output=output,
    )
