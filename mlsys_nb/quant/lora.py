"""LoRA (Hu et al. 2021, arXiv:2106.09685) and QLoRA (Dettmers et al. 2023, arXiv:2305.14314) from scratch.

``LoRALinear(base, r, alpha, dropout=0.0)`` freezes ``base`` and adds a rank-r update:
``y = base(x) + (alpha / r) · lora_B(lora_A(dropout(x)))`` with ``lora_A = nn.Linear(in, r, bias=False)``
(Kaiming-uniform, as ``peft``) and ``lora_B = nn.Linear(r, out, bias=False)`` (zeros, so training starts
from the base model); ``.merged()`` folds the update into one ``nn.Linear`` (no extra latency at serving).
Tested equal to ``peft``'s LoRA on the same weights, outputs and gradients.

``NF4Linear(linear, group_size=64, double_quant=True)`` stores a linear layer's weight as NF4 (codes and
scales as buffers, nothing trainable) and dequantizes it to ``compute_dtype`` on the fly in ``forward``:
QLoRA's frozen base. ``add_lora(model, r, alpha, targets, quantize_base=False)`` wraps the named linear
layers of a model in place; ``trainable_parameters`` and ``state_bytes`` count what a fine-tune holds.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ArgumentError, check_int, check_number
from .formats import nf4_codebook, quantize, unpack_int4


class LoRALinear(nn.Module):
    """A frozen ``base`` linear layer plus a trainable rank-``r`` update scaled by ``alpha / r``."""

    def __init__(self, base: nn.Module, r: int, alpha: float, dropout: float = 0.0):
        super().__init__()
        in_f, out_f = base.in_features, base.out_features
        check_int("r", r, 1, min(in_f, out_f))
        check_number("alpha", alpha, 0, lo_open=True)
        check_number("dropout", dropout, 0, 1, hi_open=True)
        self.base, self.r, self.alpha = base, r, alpha
        self.in_features, self.out_features = in_f, out_f
        for p in base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Linear(in_f, r, bias=False)
        self.lora_B = nn.Linear(r, out_f, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    @property
    def scaling(self) -> float:
        """alpha / r."""
        return self.alpha / self.r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + self.scaling * self.lora_B(self.lora_A(self.dropout(x)))

    def merged(self) -> nn.Linear:
        """One ``nn.Linear`` with weight ``W + (alpha / r) · B A`` (and the base's bias)."""
        w = self.base.weight if isinstance(self.base, nn.Linear) else self.base.dequantize()
        lin = nn.Linear(self.in_features, self.out_features, bias=self.base.bias is not None)
        with torch.no_grad():
            lin.weight.copy_(w.float() + self.scaling * self.lora_B.weight @ self.lora_A.weight)
            if self.base.bias is not None:
                lin.bias.copy_(self.base.bias)
        return lin


class NF4Linear(nn.Module):
    """A linear layer whose weight is stored in NF4 (buffers: packed codes, scales), dequantized per forward."""

    def __init__(self, linear: nn.Linear, group_size: int = 64, double_quant: bool = True, compute_dtype=None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        q = quantize(linear.weight, "nf4", group_size=group_size, double_quant=double_quant)
        self.shape, self.group_size = q.shape, group_size
        self.register_buffer("codes", q.codes)
        self.register_buffer("scales", q.scales)
        self.register_buffer("scale_scales", q.scale_scales)
        self.register_buffer("scale_offset", q.scale_offset)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.compute_dtype = compute_dtype or torch.float32

    def dequantize(self) -> torch.Tensor:
        """The weight [out, in] in ``compute_dtype``."""
        s = self.scales.float()
        if self.scale_scales is not None:
            pad = (-s.numel()) % 256
            s = torch.cat([s, s.new_zeros(pad)]).view(-1, 256) * self.scale_scales[:, None]
            s = s.reshape(-1)[: self.scales.numel()] + self.scale_offset
        n = self.in_features * self.out_features
        v = nf4_codebook()[unpack_int4(self.codes, n).long()].view(-1, self.group_size) * s[:, None]
        return v.view(self.shape).to(self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = None if self.bias is None else self.bias.to(self.compute_dtype)
        return F.linear(x.to(self.compute_dtype), self.dequantize(), b).to(x.dtype)


def add_lora(
    model: nn.Module,
    r: int,
    alpha: float,
    targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
    *,
    dropout: float = 0.0,
    quantize_base: bool = False,
    group_size: int = 64,
) -> nn.Module:
    """Freeze every parameter of ``model`` and wrap each ``nn.Linear`` whose name ends in one of ``targets``
    in a ``LoRALinear`` (its base first turned into an ``NF4Linear`` when ``quantize_base``: QLoRA). In place;
    returns ``model``."""
    for p in model.parameters():
        p.requires_grad_(False)
    hits = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.split(".")[-1] in targets]
    if not hits:
        raise ArgumentError(f"targets must name linear layers of the model, got {tuple(targets)}")
    for name, lin in hits:
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        base = NF4Linear(lin, group_size=group_size) if quantize_base else lin
        setattr(parent, name.split(".")[-1], LoRALinear(base, r, alpha, dropout))
    return model


def trainable_parameters(model: nn.Module) -> int:
    """Number of parameters with ``requires_grad``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict:
    """Bytes a fine-tune holds, measured from the tensors: ``frozen`` (parameters without grad and buffers),
    ``trainable`` (parameters with grad), ``grads`` (their ``.grad``), ``optimizer`` (every tensor in the
    optimizer's state)."""

    def nb(t):
        return t.numel() * t.element_size()

    out = {
        "frozen": sum(nb(p) for p in model.parameters() if not p.requires_grad) + sum(nb(b) for b in model.buffers()),
        "trainable": sum(nb(p) for p in model.parameters() if p.requires_grad),
        "grads": sum(nb(p.grad) for p in model.parameters() if p.grad is not None),
        "optimizer": 0,
    }
    if optimizer is not None:
        out["optimizer"] = sum(
            nb(v) for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)
        )
    return out
