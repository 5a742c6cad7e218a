"""Measure training memory of the real small transformer (CPU or GPU), to validate
``mlsys_nb.memory.estimate``.

- ``saved_activation_bytes(model, tokens, targets)``: bytes of the unique storages autograd saves
  for backward during one forward (``torch.autograd.graph.saved_tensors_hooks``; parameters and
  buffers excluded), attributed to the layer that first saved them.
- ``measure_activations(model_cfg, train_cfg)``: the same for a fresh ``Transformer`` built with
  the training config's recompute mode, attention path (``flash_attention`` -> SDPA, else explicit
  matmuls) and dtype (fp32, or bf16 for the 16-bit precisions).
- ``measure_model_states(model_cfg, precision)``: bytes of parameters, gradients, optimizer states
  and fp32 master weights after one real optimizer step, summed over the real tensors.
- ``measured_state_bytes(model, optimizer)``: the same bytes for a model and optimizer a rank holds
  right now (DDP, ZeRO, FSDP2), used by ``mlsys_nb.parallel.harness``.
- ``measure_step(model, tokens)``: seconds of a training step (median of repeats, ``runtime.timing``) and
  tokens/s; ``measure_matmul_peak(n)``: this CPU's fastest ``n x n`` fp32 matmul rate, the "peak" an MFU
  on a CPU divides by (``flops.mfu`` takes both; notebook 11).
- ``default_units(module)``: ZeRO's units of a model (embedding, each block, final norm, LM head; ``parallel.zero``
  re-exports it); ``unit_layout(model_cfg)``: their elements and every parameter's shape, on the meta device,
  for ``memory.sharded_elements`` (the calculator pads exactly as the implementations do).

These read tensors, not the allocator: they count the distinct storages that autograd saves or that the
model and optimizer hold, and attribute them to a layer or a state (what the memory model's terms name). The
profiler's allocation events (``runtime.profiling.memory_timeline``, the kit's one reader of them) measure
something else: every allocation and free over time, temporaries inside an op included, owner unknown; notebook
05b reads a step's peak from them.

CPU caveats (measured here, see ``tests/test_memory.py``): dropout masks are saved in the activation dtype (not as
1-byte masks); SDPA with dropout > 0 falls back to a math path that upcasts bf16 to fp32, so measure
dropout runs with ``flash_attention=False``; compare with ``estimate`` under
``kernels="eager", device="cpu"`` (``cpu_setting``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import torch

from ..config import ModelConfig, TrainConfig, check_choice
from ..runtime.timing import median, repeat

from .transformer import Transformer

__all__ = [
    "SavedBytes",
    "saved_activation_bytes",
    "measure_activations",
    "measure_model_states",
    "measured_state_bytes",
    "cpu_setting",
    "precision_dtype",
    "unique_bytes",
    "measure_step",
    "measure_matmul_peak",
    "default_units",
    "unit_layout",
]


def precision_dtype(precision: str) -> torch.dtype:
    """Activation/parameter dtype of the small model for a ``TrainConfig.precision``."""
    return torch.float32 if precision in ("fp32", "fp8-te") else torch.bfloat16


def cpu_setting(train: TrainConfig) -> TrainConfig:
    """The training config that describes this package's Transformer as run here on CPU."""
    return train.replace(kernels="eager", device="cpu")


@dataclass
class SavedBytes:
    """Saved-for-backward bytes (unique storages): ``total``, ``per_layer`` (list, by block),
    ``outside`` (embedding, final norm, head, loss) and the ``records`` (label, shape, dtype, bytes)."""

    total: int
    per_layer: list
    outside: int
    records: list = field(repr=False, default_factory=list)


def saved_activation_bytes(model: Transformer, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> SavedBytes:
    """Run one forward of ``model`` on ``tokens`` (loss if ``targets``) and count the storages
    saved for backward. Returns the output's graph alive only inside; nothing is backpropagated."""
    skip = {p.untyped_storage().data_ptr() for p in model.parameters()}
    skip |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    seen: dict[int, int] = {}
    records = []
    where = ["outside"]

    def pack(t):
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in skip and ptr not in seen:
            seen[ptr] = st.nbytes()
            records.append([where[0], tuple(t.shape), str(t.dtype).replace("torch.", ""), st.nbytes(), ptr])
        # a detached alias (same storage): returning ``t`` itself makes a reference cycle through the autograd
        # graph that nothing collects when no backward runs (the whole forward's activations stayed alive, seen
        # as a doubled peak by the GPU pack); nothing is backpropagated through this graph
        return t.detach()

    block_inputs: dict[int, tuple] = {}  # a full-recompute checkpoint saves its block's input late

    def enter(i, args):
        where[0] = f"layer {i}"
        st = args[0].untyped_storage()  # kept alive below so its address cannot be reused
        block_inputs[st.data_ptr()] = (f"layer {i}", st)

    handles = [
        blk.register_forward_pre_hook(lambda mod, args, i=i: enter(i, args)) for i, blk in enumerate(model.blocks)
    ]
    handles.append(model.norm.register_forward_pre_hook(lambda mod, args: where.__setitem__(0, "outside")))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(tokens, targets)
        del out
    finally:
        for hd in handles:
            hd.remove()
    for r in records:  # a full-recompute checkpoint packs its input before the block is entered
        r[0] = block_inputs.get(r.pop(), (r[0],))[0]
    records = [tuple(r) for r in records]
    per_layer = [sum(r[3] for r in records if r[0] == f"layer {i}") for i in range(len(model.blocks))]
    outside = sum(r[3] for r in records if r[0] == "outside")
    return SavedBytes(total=sum(seen.values()), per_layer=per_layer, outside=outside, records=records)


def measure_activations(
    model_cfg: ModelConfig, train: TrainConfig, *, seed: int = 0, device: str | torch.device = "cpu"
) -> SavedBytes:
    """Saved-for-backward bytes of a fresh ``Transformer(model_cfg)`` for one micro-batch of
    ``train`` (recompute mode, attention path, dtype), with random tokens and targets."""
    if train.tp * train.pp * train.cp * train.ep != 1:
        raise ValueError("measure_activations runs one unsharded model: use tp = pp = cp = ep = 1")
    torch.manual_seed(seed)
    impl = "sdpa" if train.flash_attention else "matmul"
    with torch.device(device):
        model = Transformer(model_cfg, recompute=train.recompute, attn_impl=impl).to(precision_dtype(train.precision))
    model.train()
    g = torch.Generator().manual_seed(seed)
    shape = (train.micro_batch, train.seq_len)
    tokens = torch.randint(0, model_cfg.vocab_size, shape, generator=g).to(device)
    targets = torch.randint(0, model_cfg.vocab_size, shape, generator=g).to(device)
    return saved_activation_bytes(model, tokens, targets)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor (FSDP2): this rank's shard


def unique_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once; freed
    storages count 0; DTensors count their local shard)."""
    seen = {}
    for t in tensors:
        st = _local(t).untyped_storage()
        if st.nbytes():
            seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def measured_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer, extra_params=()) -> dict[str, int]:
    """Bytes this rank holds right now for parameters, gradients and optimizer states (measured).

    The measurement that ``mlsys_nb.memory.model_state_bytes`` (the formula) is tested against.
    Measured from the tensors themselves, whatever produced them (DDP, ZeRO, FSDP2): unique
    storages, DTensors by their local shard. ``extra_params``: tensors outside
    ``model.parameters()`` (e.g. ZeRO's shards). Optimizer state counts every tensor in
    ``optimizer.state`` except 0-d step counters (4 B each, not in the formulas), which are
    returned separately as ``step_counters``."""
    params = list(model.parameters()) + list(extra_params)
    grads = [p.grad for p in params if p.grad is not None]
    states = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return dict(
        params=unique_bytes(params),
        grads=unique_bytes(grads),
        optimizer=unique_bytes([v for v in states if v.dim() > 0]),
        step_counters=sum(_local(v).numel() * v.element_size() for v in states if v.dim() == 0),
    )


def measure_model_states(
    model_cfg: ModelConfig,
    precision: str = "bf16-mixed",
    optimizer: str = "adam",
    *,
    seed: int = 0,
    micro_batch: int = 2,
    seq_len: int = 16,
) -> dict:
    """Bytes of params, grads, optimizer states and fp32 master weights after one real training
    step of ``Transformer(model_cfg)``. Mixed precision is done by hand as in Micikevicius et al.:
    bf16 model and gradients, an fp32 master copy that the fp32 optimizer updates, copied back.
    Optimizer step counters (one scalar per tensor) are reported separately as ``step_counters``.
    The other keys are what stays after the step (persistent); ``held_at_step`` counts every state
    tensor alive at ``opt.step()`` (persistent + the transient fp32 gradient copies
    ``master_grads_at_step`` + step counters). The optimizer's own scratch tensors inside ``step``
    are not counted (no allocator statistics on CPU)."""
    opts = {
        "adam": torch.optim.Adam,
        "adamw": torch.optim.AdamW,
        "sgd-momentum": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9),
        "sgd": lambda p, lr: torch.optim.SGD(p, lr=lr),
    }
    check_choice("optimizer", optimizer, opts)
    mixed = {"fp32": False, "bf16-mixed": True}.get(precision)
    if mixed is None:
        raise ValueError(f"precision={precision!r}: measurable here: 'fp32', 'bf16-mixed'")
    torch.manual_seed(seed)
    model = Transformer(model_cfg).to(torch.bfloat16 if mixed else torch.float32).train()
    params = list(model.parameters())  # unique (a tied head counts once)
    master = [p.detach().float().clone().requires_grad_(True) for p in params] if mixed else params
    opt = opts[optimizer](master, lr=1e-3)
    x = torch.randint(0, model_cfg.vocab_size, (micro_batch, seq_len))
    model(x, x).backward()
    if mixed:
        for p, mp in zip(params, master):
            mp.grad = p.grad.float()  # transient fp32 copy for the update, freed below
    opt.step()
    # what is held at the optimizer step (before the transient fp32 gradient copies are freed)
    at_step = [
        *params,
        *(p.grad for p in params if p.grad is not None),
        *(master if mixed else ()),
        *(mp.grad for mp in master if mixed and mp.grad is not None),
        *(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)),
    ]
    at_step_bytes = unique_bytes(at_step)
    master_grads = unique_bytes(mp.grad for mp in master if mp.grad is not None) if mixed else 0
    if mixed:
        with torch.no_grad():
            for p, mp in zip(params, master):
                p.copy_(mp)
                mp.grad = None
    states = [v for st in opt.state.values() for k, v in st.items() if torch.is_tensor(v) and k != "step"]
    steps = [v for st in opt.state.values() for k, v in st.items() if torch.is_tensor(v) and k == "step"]
    return {
        "params": unique_bytes(params),
        "grads": unique_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": unique_bytes(states),
        "master": unique_bytes(master) if mixed else 0,
        "step_counters": unique_bytes(steps),
        "n_params": sum(p.numel() for p in params),
        "master_grads_at_step": master_grads,  # transient fp32 gradient copies (mixed precision)
        "held_at_step": at_step_bytes,  # every state tensor alive at opt.step(), step counters included
    }


# ---- time: a training step of a model, and the matmul rate an MFU divides by -------------------------------
def measure_step(model, tokens, *, repeats: int = 5, warmup: int = 1, optimizer=None) -> dict:
    """Time ``repeats`` training steps (forward, backward, optional optimizer step) of ``model`` on
    ``tokens`` [batch, seq] (the loss is next-token cross-entropy on the same tokens).
    Returns ``{"step_s": median seconds, "steps_s": [...], "tokens_per_s": ...}``."""

    def one_step():
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        if optimizer is not None:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)

    times = repeat(one_step, repeats, warmup)
    step = median(times)
    n_tok = tokens[:, :-1].numel()
    return {"step_s": step, "steps_s": times, "tokens_per_s": n_tok / step, "tokens_per_step": n_tok}


def measure_matmul_peak(n: int = 512, repeats: int = 10) -> float:
    """Achieved FLOP/s of an ``n x n`` fp32 matmul on this CPU (its fastest of ``repeats``): a
    practical stand-in for "peak" when computing an MFU on a CPU, which has no datasheet number here.
    The fastest repeat, not the median: a peak is the best the machine does, and on a shared machine a
    median taken while a neighbour runs would understate it (an MFU above 1 once came out of that)."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2.0 * n**3 / min(repeat(lambda: a @ b, repeats, warmup=1))


# ---- ZeRO's units of a model, and the layout the memory model pads like the implementations ------------------
def default_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Units in forward order (``parallel.zero.ZeRO`` flattens and shards each one): for ``Transformer`` the
    embedding, each block, the final norm and the LM head; otherwise the top-level children with module lists
    expanded."""
    units = []
    for child in model.children():
        units.extend(child if isinstance(child, torch.nn.ModuleList) else [child])
    return [u for u in units if any(True for _ in u.parameters())]


@lru_cache(maxsize=64)
def unit_layout(model: ModelConfig) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(elements per ZeRO unit, shape of every parameter) of ``Transformer(model)``, built on the meta device
    (no memory); units as ``default_units`` cuts them, a tied weight counted in its first unit only.
    ``memory.sharded_elements`` pads these like ``parallel.zero`` and FSDP2 do."""
    with torch.device("meta"):
        module = Transformer(model)
    seen, units = set(), []
    for unit in default_units(module):
        fresh = [p for p in unit.parameters() if id(p) not in seen]
        seen.update(id(p) for p in fresh)
        units.append(sum(p.numel() for p in fresh))
    return tuple(units), tuple(tuple(p.shape) for p in module.parameters())
