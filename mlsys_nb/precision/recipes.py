"""The memory calculator's precision recipes, built for real: an Adam(W) whose every tensor has its recipe's dtype.

``torch.optim.AdamW`` keeps its moments in the parameters' dtype and has no master copy, so it cannot build most
recipes. ``RecipeAdam`` holds, for each parameter of a model, exactly what ``TrainConfig.precision`` says a rank
holds (bytes per parameter with Adam, the numbers ``mlsys_nb.memory`` uses):

=============== ======================== ============== ============ ==================== =====
recipe          model weights            gradients      fp32 master  Adam moments (m, v)  total
=============== ======================== ============== ============ ==================== =====
fp32            fp32 (4)                 fp32 (4)       no           fp32 (4 + 4)          16
bf16-mixed      bf16 (2)                 bf16 (2)       yes (4)      fp32 (4 + 4)          16
bf16-nomaster   bf16 (2)                 bf16 (2)       no           fp32 (4 + 4)          12
fp8-te          fp32 (4), cast to e4m3   fp32 (4)       no           fp32 (4 + 4)          16
                per tensor in forward
fp8-dsv3        e4m3 codes (1) + one     bf16 (2) and   yes (4)      bf16 (2 + 2)          15
                fp32 scale per 128×128   an fp32 accu-
                block                    mulator (4)
=============== ======================== ============== ============ ==================== =====

Transformer Engine (fp8-te) keeps fp32 weights and casts them to fp8 for each matmul (here: e4m3 with one current
scale per tensor, read back through a straight-through estimator, so the gradient reaches the fp32 weight);
DeepSeek-V3 (arXiv:2412.19437 §3.3) stores fp8 weights with 128×128 block scales, an fp32 master and fp32 gradient
accumulation, and bf16 Adam moments. The calculator counts 1 B/param of fp8 weights for every parameter; DeepSeek-V3
itself keeps the embedding, the output head and the norms in higher precision (a small share at 671B parameters,
most of a tiny model): this module follows the calculator, so it can test it.

The update is AdamW (Loshchilov & Hutter, arXiv:1711.05101) computed in fp32 from the recipe's stored tensors and
written back in the stored dtypes (rounding there is what the recipe costs). The forward pass runs the module
through ``torch.func.functional_call`` on weights in the compute dtype (fp32, or bf16 for the 16-bit and dsv3
recipes; dsv3's bf16 copy of its fp8 weights is a transient of this emulation, dropped after backward: real fp8
GEMMs read the codes). ``held_bytes`` sums the distinct storages the recipe holds (measured, not computed).
"""

from __future__ import annotations

import math

from ..config import PRECISIONS, ArgumentError, check_choice, check_int, check_number
from .fp8 import amax_scale, quantize_tensor

# what each recipe stores: weight dtype, gradient dtype, master copy, moment dtype, fp32 gradient accumulator
RECIPES = {
    "fp32": dict(weight="float32", grad="float32", master=False, moments="float32", accum=False),
    "bf16-mixed": dict(weight="bfloat16", grad="bfloat16", master=True, moments="float32", accum=False),
    "bf16-nomaster": dict(weight="bfloat16", grad="bfloat16", master=False, moments="float32", accum=False),
    "fp8-te": dict(weight="float32", grad="float32", master=False, moments="float32", accum=False),
    "fp8-dsv3": dict(weight="float8_e4m3fn", grad="bfloat16", master=True, moments="bfloat16", accum=True),
}
assert tuple(RECIPES) == PRECISIONS  # one recipe per TrainConfig.precision
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
