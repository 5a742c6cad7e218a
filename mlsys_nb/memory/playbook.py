"""The Ultra-Scale Playbook's memory widget, exactly (its bugs included; docs/references.md#playbook-memory-widget).

``playbook_estimate(**inputs)`` ports the widget's ``src/memory.js``; ``playbook_inputs`` maps a model/training
pair to its inputs and ``estimate(..., compat="playbook")`` shows it as a ``Breakdown``. ``memory.estimate``'s
default mode fixes those bugs (tests in ``tests/test_memory.py`` pin each fix).
"""

from __future__ import annotations

import math

from ..config import ModelConfig, TrainConfig, check_choice
from .breakdown import Breakdown
from .states import bytes_per_param
from .units import PRECISION_BYTES


def _playbook_data() -> dict:
    """The widget's presets and initial page (``data/playbook_memory.yaml``)."""
    from ..config import load_yaml

    return load_yaml("playbook_memory.yaml")


PLAYBOOK_PRESETS = {k: v["inputs"] for k, v in _playbook_data()["presets"].items()}

PLAYBOOK_INITIAL = _playbook_data()["initial"]["inputs"]


def format_playbook_bytes(n: float) -> str:
    """The widget's ``formatBytes``: divides by 1024**i but prints KB/MB/GB/TB (they are KiB...)."""
    if n == 0:
        return "0 Bytes"
    # The widget's list stops at TB and fails from 1 PiB on (4 of 500 random inputs reached it):
    # the units continue in its style, and i is clamped to the list.
    sizes = ["Bytes", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"]
    i = min(max(int(math.floor(math.log(n) / math.log(1024))), 0), len(sizes) - 1)
    return f"{n / 1024**i:.2f} {sizes[i]}"


def playbook_estimate(
    *,
    a=8,
    b=32,
    h=512,
    h_ff=2048,
    L=12,
    s=128,
    v=30522,
    tp=8,
    k=8,
    dp=1,
    mixed=True,
    seq_parallel=False,
    recomputation="none",
    zero=0,
    ff_activation="relu",
) -> dict:
    """The Playbook widget's numbers exactly (``src/memory.js``; bugs included).

    Returns bytes: ``activations`` (with its parts), ``parameters``, ``gradients``, ``optimizer``,
    ``total``, the widget's parameter count ``N`` and ``shown`` (its label: GiB printed as "GB")."""
    check_choice("recomputation", recomputation, ("none", "selective", "full"))
    check_choice("ff_activation", ff_activation, ("relu", "gelu", "swiglu"))
    zero = int(zero)  # the widget passes a string; JS coerces it in >=
    B = 2 if mixed else 4
    X = 1 / tp if seq_parallel else 1
    sbh = s * b * h
    if recomputation in ("none", "full"):
        if seq_parallel:
            attn = sbh / tp * (5 * B + 1) + (2 * B + 1) * a * s * s * b  # bug: s^2 term not / tp
        else:
            attn = sbh * (4 * B / tp + B + 1) + (2 * B + 1) * a * s * s * b / tp
    else:
        attn = sbh / tp * (5 * B + 1) if seq_parallel else sbh * (4 * B / tp + B + 1)
    ff = {
        "relu": sbh * B * X + s * b * h_ff * B / tp + sbh * X,
        "gelu": sbh * B * X + 2 * s * b * h_ff * B / tp + sbh * X,
        "swiglu": sbh * B * X + 4 * s * b * h_ff * B / tp + sbh * X,
    }[ff_activation]
    ln = sbh * B * X
    parts = {
        "dropout": sbh * X,
        "output layernorm": sbh * B * X,
        "output projection": sbh * B * X,
        "cross entropy": 4 * s * b * v * X,
    }
    if recomputation == "full":
        parts = {"layer inputs": sbh * B * L, **parts}  # bug: never divided by tp
        layers = 0.0
    else:
        layers = L * (attn + ff + 2 * ln)
        parts = {"attention": L * attn, "feedforward": L * ff, "layernorm": L * 2 * ln, **parts}
    act = layers + sum(v_ for k_, v_ in parts.items() if k_ not in ("attention", "feedforward", "layernorm"))
    N = h * (v + s) + L * (12 * h * h + 13 * h) + 2 * h
    kk = k + 4 if mixed else k
    bpp = 2 if mixed else 4
    params = bpp * N / dp if zero >= 3 else bpp * N
    grads = bpp * N / dp if zero >= 2 else bpp * N
    opt = kk * N / dp if zero >= 1 else kk * N
    total = act + params + grads + opt
    return dict(
        N=N,
        activations=act,
        activation_parts=parts,
        parameters=params,
        gradients=grads,
        optimizer=opt,
        total=total,
        shown=format_playbook_bytes(total),
        shown_activations=format_playbook_bytes(act),
    )


def playbook_inputs(model: ModelConfig, train: TrainConfig) -> dict:
    """Map a model/training pair to the widget's inputs (what the widget can express of them)."""
    mixed = train.precision != "fp32"
    k = train.optimizer_bytes_per_param
    if k is None:
        states = bytes_per_param(train.precision, train.optimizer, False, None)["optimizer"]
        k = states * (4 / PRECISION_BYTES[train.precision]["state"])
    return dict(
        a=model.n_heads,
        b=train.micro_batch,
        h=model.hidden,
        h_ff=model.ffn_hidden,
        L=model.n_layers,
        s=train.seq_len,
        v=model.vocab_size,
        tp=train.tp,
        k=k,
        dp=train.dp,
        mixed=mixed,
        seq_parallel=train.sp,
        recomputation=train.recompute,
        zero=train.zero,
        ff_activation=model.activation,
    )


def playbook_breakdown(model: ModelConfig, train: TrainConfig) -> Breakdown:
    """``estimate(model, train, compat="playbook")``: the widget's numbers for this pair as a ``Breakdown``."""
    from .. import hardware

    r = playbook_estimate(**playbook_inputs(model, train))
    n = r["N"]
    return Breakdown(
        params=r["parameters"],
        grads=r["gradients"],
        optimizer=r["optimizer"],
        master=0.0,
        activations=r["activations"],
        activations_per_layer=float("nan"),
        activations_layers=r["activations"]
        - sum(
            v
            for k, v in r["activation_parts"].items()
            if k in ("dropout", "output layernorm", "output projection", "cross entropy")
        ),
        activations_outside=sum(
            v
            for k, v in r["activation_parts"].items()
            if k in ("dropout", "output layernorm", "output projection", "cross entropy")
        ),
        temporary=0.0,
        overhead=0.0,
        total=r["total"],
        n_params_rank=n,
        n_params_total=n,
        n_params_active=n,
        layers=model.n_layers,
        in_flight=1.0,
        stage=0,
        gpu=train.gpu,
        gpu_memory=hardware.gpu(train.gpu).memory_bytes,
        mode="playbook",
        detail={"playbook": r},
    )
