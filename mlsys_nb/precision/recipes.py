"""The memory calculator's precision recipes, built two ways: for real with torch's optimizer where the CPU can run
the recipe, and emulated (``RecipeAdam``) where it cannot.

**Measured** (``measure_optimizer_bytes``): ``fp32`` (an fp32 model and ``torch.optim.AdamW``) and ``bf16-mixed``
(Micikevicius et al. 2018: a bf16 model, an fp32 master copy that ``torch.optim.AdamW`` updates from fp32 copies of
the bf16 gradients, copied back) run one real optimizer step; the bytes are counted from the distinct storages of
the parameters, their gradients, the master copies and every tensor in ``optimizer.state`` (what torch allocated),
and compared kind by kind with ``mlsys_nb.memory.bytes_per_param`` (``calculator_bytes``). The same builder with a
piece left out (``master=False``: AdamW on the bf16 model, whose moments then follow the weights' dtype;
``optimizer="sgd-momentum"``: one moment instead of Adam's two) fails that comparison.

**Consistency check, not a measurement** (``RecipeAdam``, ``measure_recipe``): ``bf16-nomaster`` (bf16 weights
beside fp32 moments: ``torch.optim.AdamW`` keeps its moments in the weights' dtype, so it cannot build it),
``fp8-te`` (Transformer Engine's fp8 GEMMs) and ``fp8-dsv3`` (fp8 weights in 128×128 blocks) cannot run for real
on a CPU. ``RecipeAdam`` holds, for each parameter, tensors of the dtypes that ``mlsys_nb.memory``'s bytes per
parameter imply (``recipe_storage``: 4 B fp32, 2 B bf16, 1 B e4m3; dsv3's 6 B of gradient = bf16 + an fp32
accumulator), trains with them, and its held bytes equal the calculator's by construction. What it shows: each
recipe trains with exactly that storage, and fp8-dsv3's 128×128 block scales are the one byte count the
calculator's 1 B/param leaves out. (Transformer Engine also holds an fp8 copy of each weight beside the
high-precision one by default, which the calculator's fp8-te 16 B/param leaves out: see notebook 22 §5.)

DeepSeek-V3 (arXiv:2412.19437 §3.3) stores fp8 weights with 128×128 block scales, an fp32 master and fp32 gradient
accumulation, and bf16 Adam moments. The calculator counts 1 B/param of fp8 weights for every parameter;
DeepSeek-V3 itself keeps the embedding, the output head and the norms in higher precision (a small share at 671B
parameters, most of a tiny model): this module follows the calculator. Transformer Engine (fp8-te) is emulated
with fp32 weights cast to e4m3 with one current scale per tensor for each matmul, read back through a
straight-through estimator, so the gradient reaches the fp32 weight.

``RecipeAdam``'s update is AdamW (Loshchilov & Hutter, arXiv:1711.05101) computed in fp32 from the recipe's stored
tensors and written back in the stored dtypes (rounding there is what the recipe costs). The forward pass runs the
module through ``torch.func.functional_call`` on weights in the compute dtype (fp32, or bf16 for the 16-bit and
dsv3 recipes; dsv3's bf16 copy of its fp8 weights is a transient of this emulation, dropped after backward: real
fp8 GEMMs read the codes). ``held_bytes`` sums the distinct storages the recipe holds.
"""

from __future__ import annotations

import math

from ..config import PRECISIONS, ArgumentError, check_choice, check_int, check_number
from .fp8 import amax_scale, quantize_tensor

_DTYPE_OF = {4: "float32", 2: "bfloat16", 1: "float8_e4m3fn"}
REAL_RECIPES = ("fp32", "bf16-mixed")  # the recipes torch.optim.AdamW builds on a CPU (measure_optimizer_bytes)


def recipe_storage(precision: str) -> dict:
    """What ``precision``'s recipe stores per parameter, read off ``mlsys_nb.memory.bytes_per_param`` (Adam): the
    weight dtype (4 B fp32, 2 B bf16, 1 B e4m3), the gradient dtype (6 B = bf16 + an fp32 accumulator), whether
    there is an fp32 master copy, the dtype of each of Adam's two moments. No second table to keep in step."""
    from ..memory import bytes_per_param

    check_choice("precision", precision, PRECISIONS)
    b = bytes_per_param(precision, "adam", False, None)
    grad, accum = (b["grad"] - 4, True) if b["grad"] == 6 else (b["grad"], False)
    state = b["optimizer"] / 2
    if b["param"] not in _DTYPE_OF or grad not in (2, 4) or state not in (2, 4) or b["master"] not in (0, 4):
        raise ArgumentError(f"precision={precision!r}: no storage for the calculator's bytes per parameter {b}")
    return dict(
        weight=_DTYPE_OF[b["param"]],
        grad=_DTYPE_OF[grad],
        master=b["master"] == 4,
        moments=_DTYPE_OF[int(state)],
        accum=accum,
    )


RECIPES = {p: recipe_storage(p) for p in PRECISIONS}  # derived from mlsys_nb.memory, one per TrainConfig.precision
FP8_BLOCK = 128  # DeepSeek-V3's weight block side


class Fp8Blocks:
    """A weight stored as float8_e4m3fn codes with one fp32 scale per ``block``×``block`` tile (edge tiles smaller;
    a 1-D weight is one row). ``codes · scale⁻¹`` is the weight; ``scales`` has shape (⌈rows/block⌉, ⌈cols/block⌉)."""

    def __init__(self, w, block: int = FP8_BLOCK):
        import torch

        self.shape = tuple(w.shape)
        self.block = check_int("block", block, 1)
        w2 = w.detach().float().reshape(1, -1) if w.dim() == 1 else w.detach().float()
        r, c = w2.shape
        rb, cb = math.ceil(r / block), math.ceil(c / block)
        padded = torch.zeros(rb * block, cb * block)
        padded[:r, :c] = w2.abs()
        self.scales = amax_scale(padded.reshape(rb, block, cb, block).amax(dim=(1, 3)))  # fp32, one per block
        self.codes = (w2 * self._expand(self.scales, r, c)).to(torch.float8_e4m3fn)

    def _expand(self, s, r, c):
        return s.repeat_interleave(self.block, 0)[:r].repeat_interleave(self.block, 1)[:, :c]

    def dequantize(self, dtype):
        """The weight the codes and scales stand for, in ``dtype``, with the original shape."""
        r, c = self.codes.shape
        return (self.codes.float() / self._expand(self.scales, r, c)).reshape(self.shape).to(dtype)

    def tensors(self):
        return [self.codes, self.scales]


def fp8_scale_bytes(shapes, block: int = FP8_BLOCK) -> int:
    """Bytes of fp8-dsv3's fp32 block scales for weights of these ``shapes``: 4 per started ``block``×``block``
    tile (a 1-D weight of n elements: ⌈n/block⌉ tiles). The one overhead the calculator's 1 B/param leaves out."""
    total = 0
    for s in shapes:
        r, c = (1, s[0]) if len(s) == 1 else s
        total += 4 * math.ceil(r / block) * math.ceil(c / block)
    return total


def _fake_fp8(w):
    """``w`` cast to e4m3 with one current per-tensor scale and read back, with a straight-through gradient."""
    q, s = quantize_tensor(w.detach())
    return w + (q.float() / s - w).detach()


class RecipeAdam:
    """AdamW with a precision recipe's storage (see the module docstring). Takes over ``model``'s weights: the
    module itself is moved to the meta device (it holds nothing), the recipe holds every tensor.

    ``loss(tokens, targets)`` runs forward and backward (gradients accumulate over calls, as micro-batches do);
    ``step()`` updates and clears the gradients; ``held_bytes()`` measures the bytes held, by kind.
    ``master``: override the recipe's fp32 master copy (``False`` on a recipe that has one builds the broken
    variant that forgets it: the update is rounded into the stored weights). ``lr`` (per step), ``betas``,
    ``eps``, ``weight_decay``: AdamW's."""

    def __init__(
        self,
        model,
        precision: str,
        *,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        master: bool | None = None,
    ):
        import torch

        self.precision = check_choice("precision", precision, RECIPES)
        r = dict(RECIPES[precision])
        if master is not None:
            r["master"] = bool(master)
        self.recipe = r
        self.lr = check_number("lr", lr, 0.0)
        self.betas = (check_number("betas[0]", betas[0], 0.0, 1.0), check_number("betas[1]", betas[1], 0.0, 1.0))
        self.eps = check_number("eps", eps, 0.0)
        self.weight_decay = check_number("weight_decay", weight_decay, 0.0)
        self.module = model
        params = dict(model.named_parameters())  # unique names: a tied head appears once
        self.compute_dtype = torch.float32 if r["weight"] == "float32" else torch.bfloat16
        self.buffers = {n: b.to(self.compute_dtype) for n, b in model.named_buffers()}
        wd = getattr(torch, r["weight"])
        md = getattr(torch, r["moments"])
        self.weights, self.master, self.m, self.v, self.accum = {}, {}, {}, {}, {}
        self.grads = {}
        for n, p in params.items():
            p32 = p.detach().float()
            self.weights[n] = Fp8Blocks(p32) if r["weight"] == "float8_e4m3fn" else p32.to(wd).clone()
            if r["master"]:
                self.master[n] = p32.clone()
            self.m[n] = torch.zeros(p.shape, dtype=md)
            self.v[n] = torch.zeros(p.shape, dtype=md)
            if r["accum"]:
                self.accum[n] = torch.zeros(p.shape, dtype=torch.float32)
        self.shapes = {n: tuple(p.shape) for n, p in params.items()}
        model.to("meta")  # the recipe holds the weights now
        self.t = 0

    # ---- forward and backward ------------------------------------------------------------------
    def _leaves(self):
        """Tensors the forward reads, as leaves that collect gradients (in the compute dtype)."""
        if self.recipe["weight"] == "float8_e4m3fn":
            return {n: w.dequantize(self.compute_dtype).requires_grad_(True) for n, w in self.weights.items()}
        return {n: w.requires_grad_(True) for n, w in self.weights.items()}

    def loss(self, tokens, targets):
        """Forward and backward of one micro-batch (mean cross-entropy); returns the loss as a float."""
        import torch
        from torch.func import functional_call

        leaves = self._leaves()
        args = {n: (_fake_fp8(w) if self.precision == "fp8-te" else w) for n, w in leaves.items()}
        loss = functional_call(self.module, {**args, **self.buffers}, (tokens,), {"targets": targets})
        loss.backward()
        with torch.no_grad():
            for n, leaf in leaves.items():
                g = leaf.grad
                leaf.grad = None
                if self.recipe["accum"]:
                    self.accum[n] += g.float()  # fp32 accumulation across micro-batches
                if n in self.grads:
                    self.grads[n] += g
                else:
                    self.grads[n] = g.to(getattr(torch, self.recipe["grad"]))
                if self.recipe["weight"] != "float8_e4m3fn":
                    leaf.requires_grad_(False)
        return float(loss.detach())

    # ---- the update -------------------------------------------------------------------------------
    def step(self):
        """One AdamW step from the held gradients (fp32 arithmetic), written back in the recipe's dtypes."""
        import torch

        if not self.grads:
            raise ArgumentError("step() needs gradients: call loss(tokens, targets) first")
        self.t += 1
        b1, b2 = self.betas
        with torch.no_grad():
            for n in self.weights:
                g = (self.accum[n] if self.recipe["accum"] else self.grads[n]).float()
                m = self.m[n].float().mul_(b1).add_(g, alpha=1 - b1)
                v = self.v[n].float().mul_(b2).addcmul_(g, g, value=1 - b2)
                self.m[n].copy_(m)
                self.v[n].copy_(v)
                upd = (m / (1 - b1**self.t)) / ((v / (1 - b2**self.t)).sqrt() + self.eps)
                w = self.master[n] if n in self.master else self._read(n)
                w = w.mul(1 - self.lr * self.weight_decay).sub_(upd, alpha=self.lr)
                if n in self.master:
                    self.master[n].copy_(w)
                self._write(n, w)
                if self.recipe["accum"]:
                    self.accum[n].zero_()
        self.grads = {}

    def _read(self, n):
        """The stored weight ``n`` in fp32 (what a recipe without a master copy updates)."""
        import torch

        w = self.weights[n]
        return w.dequantize(torch.float32) if isinstance(w, Fp8Blocks) else w.detach().float()

    def _write(self, n, w32):
        w = self.weights[n]
        if isinstance(w, Fp8Blocks):
            self.weights[n] = Fp8Blocks(w32.reshape(w.shape), w.block)
        else:
            w.data.copy_(w32)  # rounds to the stored dtype

    # ---- what it holds ------------------------------------------------------------------------------
    def held_bytes(self) -> dict:
        """Bytes the recipe holds now, measured as the distinct storages of its tensors (``untyped_storage``),
        by kind: ``params`` (weights; fp8 codes plus their block scales), ``scales`` (of which the scales),
        ``grads`` (gradients and the fp32 accumulator), ``master``, ``optimizer`` (Adam's m and v), ``total``."""
        from ..models.measure import unique_bytes

        weights = [t for w in self.weights.values() for t in (w.tensors() if isinstance(w, Fp8Blocks) else [w])]
        out = dict(
            params=unique_bytes(weights),
            scales=unique_bytes(w.scales for w in self.weights.values() if isinstance(w, Fp8Blocks)),
            grads=unique_bytes([*self.grads.values(), *self.accum.values()]),
            master=unique_bytes(self.master.values()),
            optimizer=unique_bytes([*self.m.values(), *self.v.values()]),
        )
        out["total"] = out["params"] + out["grads"] + out["master"] + out["optimizer"]
        return out

    def n_params(self) -> int:
        """Parameters the recipe trains (a tied weight once)."""
        return sum(math.prod(s) for s in self.shapes.values())


def build_recipe(model, precision: str, **kw) -> RecipeAdam:
    """``RecipeAdam(model, precision, **kw)``: the recipe's storage and optimizer for ``model``."""
    return RecipeAdam(model, precision, **kw)


def model_state_bytes_per_param(model_cfg, precision: str) -> dict:
    """The calculator's bytes per parameter for ``precision`` with Adam on one rank (``mlsys_nb.memory.estimate``'s
    params, grads, optimizer and master terms divided by the parameter count): the model a measurement is tested
    against."""
    from ..config import TrainConfig
    from ..memory import estimate

    b = estimate(model_cfg, TrainConfig(precision=precision, micro_batch=1, seq_len=model_cfg.seq_len))
    n = b.n_params_total
    out = dict(params=b.params / n, grads=b.grads / n, optimizer=b.optimizer / n, master=b.master / n)
    out["total"] = sum(out.values())
    return out


def measure_recipe(model_cfg, precision: str, *, steps: int = 3, micro_batches: int = 2, batch: int = 4, seed=0, **kw):
    """Train ``Transformer(model_cfg)`` for ``steps`` steps of ``micro_batches`` micro-batches (``batch`` sequences
    of a learnable pattern: each token is the previous plus one) with ``precision``'s recipe, and measure the bytes
    held at the last optimizer step (after backward, before the update). Returns ``dict(held=..., per_param=...,
    losses=[...], n_params=...)``: ``held`` in bytes, ``per_param`` the same divided by the parameter count,
    ``losses`` the first micro-batch's loss before each step. ``kw`` goes to ``RecipeAdam`` (default lr 3e-3)."""
    import torch

    from ..models import Transformer

    check_int("steps", steps, 1, 1000)
    check_int("micro_batches", micro_batches, 1, 64)
    check_int("batch", batch, 1, 1024)
    torch.manual_seed(int(seed))
    opt = RecipeAdam(Transformer(model_cfg), precision, **{"lr": 3e-3, **kw})
    g = torch.Generator().manual_seed(int(seed))
    s = model_cfg.seq_len
    losses, held = [], None
    for _ in range(steps):
        for k in range(micro_batches):
            x = (torch.randint(0, model_cfg.vocab_size, (batch, 1), generator=g) + torch.arange(s + 1)) % (
                model_cfg.vocab_size
            )
            loss = opt.loss(x[:, :-1], x[:, 1:])
            if k == 0:
                losses.append(loss)
        held = opt.held_bytes()
        opt.step()
    n = opt.n_params()
    return dict(held=held, per_param={k: v / n for k, v in held.items()}, losses=losses, n_params=n)


# ---- measured: the recipes torch's optimizer really builds ------------------------------------------------------
_REAL_OPTIMIZERS = ("adamw", "sgd-momentum")


def measure_optimizer_bytes(
    model_cfg, precision: str, *, master: bool | None = None, optimizer: str = "adamw", seed=0, batch: int = 4
) -> dict:
    """One real optimizer step of ``Transformer(model_cfg)`` with ``precision``'s recipe built from torch's parts,
    and the bytes it then holds, counted from the distinct storages (``untyped_storage``) of what torch allocated.

    ``fp32``: an fp32 model and ``torch.optim.AdamW`` on its parameters. ``bf16-mixed``: the model in bf16, an fp32
    master copy of every parameter that ``torch.optim.AdamW`` updates from an fp32 copy of the bf16 gradient
    (transient: freed after the step), then copied back into the bf16 weights (Micikevicius et al. 2018). Only these
    two run for real here (``REAL_RECIPES``); the others are consistency checks (``measure_recipe``).

    Broken variants, for the checks that must fail: ``master=False`` on bf16-mixed runs AdamW on the bf16 model
    itself (no master; torch's moments then follow the weights' dtype); ``optimizer="sgd-momentum"`` keeps one
    moment instead of Adam's two.

    Returns ``params``, ``grads``, ``master``, ``optimizer`` (every tensor in ``optimizer.state`` with a dimension:
    AdamW's ``exp_avg`` and ``exp_avg_sq``), ``total`` (their sum, bytes), ``step_counters`` (AdamW's 0-d ``step``
    tensors, 4 B per parameter tensor, outside the per-parameter model), ``master_grads_at_step`` (the transient
    fp32 gradients alive during the step), ``state_dtypes`` ({state name: dtype name}), ``n_params``,
    ``n_tensors``, ``moved`` (the fraction of parameters the step changed) and ``loss``."""
    import torch

    from ..models import Transformer
    from ..models.measure import unique_bytes

    check_choice("precision", precision, REAL_RECIPES)
    check_choice("optimizer", optimizer, _REAL_OPTIMIZERS)
    check_int("batch", batch, 1, 1024)
    mixed = precision == "bf16-mixed"
    keep_master = mixed if master is None else bool(master) and mixed
    torch.manual_seed(int(seed))
    model = Transformer(model_cfg).to(torch.bfloat16 if mixed else torch.float32).train()
    params = list(model.parameters())  # unique: a tied weight once
    before = [p.detach().clone() for p in params]
    updated = [p.detach().float().clone().requires_grad_(True) for p in params] if keep_master else params
    if optimizer == "adamw":
        opt = torch.optim.AdamW(updated, lr=1e-3)
    else:
        opt = torch.optim.SGD(updated, lr=1e-3, momentum=0.9)
    g = torch.Generator().manual_seed(int(seed))
    x = (torch.randint(0, model_cfg.vocab_size, (batch, 1), generator=g) + torch.arange(model_cfg.seq_len + 1)) % (
        model_cfg.vocab_size
    )
    loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    if keep_master:
        for p, mp in zip(params, updated):
            mp.grad = p.grad.float()  # the fp32 gradient the update reads
    opt.step()
    master_grads = unique_bytes(mp.grad for mp in updated) if keep_master else 0
    if keep_master:
        with torch.no_grad():
            for p, mp in zip(params, updated):
                p.copy_(mp)  # rounds the updated master into the bf16 weight
                mp.grad = None
    items = [(k, v) for st in opt.state.values() for k, v in st.items() if torch.is_tensor(v)]
    out = dict(
        params=unique_bytes(params),
        grads=unique_bytes(p.grad for p in params if p.grad is not None),
        master=unique_bytes(updated) if keep_master else 0,
        optimizer=unique_bytes(v for _, v in items if v.dim() > 0),
    )
    out["total"] = sum(out.values())
    out.update(
        step_counters=unique_bytes(v for _, v in items if v.dim() == 0),
        master_grads_at_step=master_grads,
        state_dtypes={k: str(v.dtype).removeprefix("torch.") for k, v in items},
        n_params=sum(p.numel() for p in params),
        n_tensors=len(params),
        moved=sum(int((p.detach() != b).sum()) for p, b in zip(params, before)) / sum(p.numel() for p in params),
        loss=float(loss.detach()),
    )
    return out


def calculator_bytes(n_params: int, precision: str, optimizer: str = "adamw") -> dict:
    """``mlsys_nb.memory.bytes_per_param`` times ``n_params``, by kind (``params``, ``grads``, ``master``,
    ``optimizer``, ``total``): what ``measure_optimizer_bytes`` is compared with."""
    from ..memory import bytes_per_param

    b = bytes_per_param(precision, optimizer, False, None)
    out = dict(params=b["param"] * n_params, grads=b["grad"] * n_params, master=b["master"] * n_params)
    out["optimizer"] = b["optimizer"] * n_params
    out["total"] = sum(out.values())
    return out


def bytes_mismatch(measured: dict, precision: str, optimizer: str = "adamw") -> dict:
    """``{kind: (measured, calculator)}`` for every kind where ``measure_optimizer_bytes``'s bytes differ from
    ``calculator_bytes`` for the same parameter count: empty when the calculator's per-parameter bytes are what
    torch allocated."""
    model = calculator_bytes(measured["n_params"], precision, optimizer)
    return {k: (measured[k], model[k]) for k in model if measured[k] != model[k]}
