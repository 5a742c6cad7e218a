"""Quantize the linear layers of a model: calibration inputs captured by hooks, then RTN, GPTQ or AWQ per layer.

``linear_inputs(model, tokens)`` runs ``model(tokens)`` once and returns each targeted ``nn.Linear``'s input
[n_tokens, in]; ``quantize_linears(model, method, inputs, group_size=128)`` returns a copy of ``model`` whose
targeted weights are replaced by their int4 dequantization (simulated quantization: the numbers a W4A16 kernel
would compute with, in fp32), and the stored bytes. Every layer sees the full-precision model's inputs (the
simplest calibration; the GPTQ paper quantizes layer after layer on the already-quantized model's inputs).
The embeddings and the output head stay in full precision, as usual.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..config import LORA_TARGETS, check_choice
from .awq import awq
from .gptq import gptq, rtn

METHODS = ("rtn", "gptq", "awq")
TARGETS = LORA_TARGETS  # every linear layer of a block


def target_linears(model: nn.Module, targets=TARGETS) -> dict:
    """``{name: nn.Linear}`` for the linear layers whose last name is in ``targets``."""
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.split(".")[-1] in targets}


@torch.no_grad()
def linear_inputs(model: nn.Module, tokens: torch.Tensor, targets=TARGETS) -> dict:
    """The inputs [n_tokens, in] of each targeted linear layer during ``model(tokens)``."""
    seen, hooks = {}, []

    def keep(name):
        def hook(module, args, output):
            seen[name] = args[0].reshape(-1, args[0].shape[-1])  # returns None: the output is left alone

        return hook

    for name, lin in target_linears(model, targets).items():
        hooks.append(lin.register_forward_hook(keep(name)))
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return seen


@torch.no_grad()
def quantize_linears(model: nn.Module, method: str, inputs: dict, *, group_size: int = 128):
    """A copy of ``model`` with each layer of ``inputs`` quantized by ``method`` ("rtn", "gptq", "awq");
    returns ``(model_copy, stored_bytes)`` (stored bytes of the quantized layers)."""
    check_choice("method", method, METHODS)
    out = copy.deepcopy(model)
    stored = 0
    for name, x in inputs.items():
        lin = out.get_submodule(name)
        if method == "rtn":
            q = rtn(lin.weight, group_size)
        elif method == "gptq":
            q = gptq(lin.weight, x, group_size=group_size)
        else:
            q = awq(lin.weight, x, group_size=group_size)
        lin.weight.copy_(q.dequantize())
        stored += q.nbytes
    return out, stored


@torch.no_grad()
def plant_outliers(model: nn.Module, channels: int = 4, factor: float = 30.0, *, seed: int = 0) -> nn.Module:
    """A model of LLMs' outlier features (Dettmers et al. 2022): in each block, ``channels`` hidden channels of
    the norms' gains are multiplied by ``factor`` and the matching input columns of the linear layers that read
    them divided by ``factor``. The function is unchanged (up to rounding); the activations of those channels
    are ``factor``× larger and their weights ``factor``× smaller, as in the large models where round-to-nearest
    breaks. In place; returns ``model``."""
    g = torch.Generator().manual_seed(seed)
    for blk in model.blocks:
        for norm, readers in (
            (blk.attn_norm, ("q_proj", "k_proj", "v_proj")),
            (blk.mlp_norm, ("gate_proj", "up_proj")),
        ):
            idx = torch.randperm(norm.weight.numel(), generator=g)[:channels]
            norm.weight[idx] *= factor
            owner = blk.attn if readers[0] == "q_proj" else blk.mlp
            for r in readers:
                getattr(owner, r).weight[:, idx] /= factor
    return model
