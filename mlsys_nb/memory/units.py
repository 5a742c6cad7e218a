"""Units, the precision recipes' bytes per element and the model presets (``memory``'s tables).

Units: bytes everywhere; ``GB = 1e9``, ``GiB = 2**30``.
"""

from __future__ import annotations

from ..config import ModelConfig, load_model_preset, model_presets

GB = 1e9
GiB = 2.0**30

# bytes per element: params, grads, fp32 master, one optimizer state, activations
PRECISION_BYTES = {
    "fp32": dict(param=4, grad=4, master=0, state=4, act=4),
    "bf16-mixed": dict(param=2, grad=2, master=4, state=4, act=2),
    "bf16-nomaster": dict(param=2, grad=2, master=0, state=4, act=2),
    "fp8-te": dict(param=4, grad=4, master=0, state=4, act=2),
    "fp8-dsv3": dict(param=1, grad=2 + 4, master=4, state=2, act=2),
}


def presets() -> list[str]:
    """Names of the model presets in ``data/models.yaml``."""
    return list(model_presets())


def preset(name: str) -> ModelConfig:
    """The ``ModelConfig`` of a preset (e.g. ``"llama-3.1-8b"``); the error lists valid names."""
    return load_model_preset(name)
