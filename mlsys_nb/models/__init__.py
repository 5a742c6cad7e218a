"""The real models the kit runs, the data they learn and the measurements taken on them.

- ``Transformer(cfg)`` (``transformer``): the package's small Llama- or GPT-style transformer,
  built from a ``mlsys_nb.config.ModelConfig`` (also ``Block``, ``Attention``, ``MLP``, ``MoE``).
- ``routing``: mixture-of-experts routing shared by ``MoE`` and expert parallelism: softmax or
  sigmoid (DeepSeek-V3, bias-balanced) top-k gating, capacity with the pinned drop rule,
  load-balancing and z losses (``route``, ``Routing``, ``update_bias``).
- ``measure``: memory measured on a real model: ``saved_activation_bytes``,
  ``measure_activations``, ``measure_model_states``, ``cpu_setting`` (the ``TrainConfig`` of these runs on
  CPU) and ``measured_state_bytes`` (the bytes of
  parameters, gradients and optimizer states a rank holds, from its tensors), which the formulas
  of ``mlsys_nb.memory`` are tested against.
- ``corpus``: ``MarkovLanguage``, a synthetic language with a known entropy rate (the loss floor).
- ``ladder``: the scaling ladder: tiny transformers trained on that language under several
  compute budgets, to which ``mlsys_nb.scaling.fit`` is fitted (notebook 11).
- ``hf``: ``from_hf(hf_model)`` / ``to_hf(model)``: transformers Llama/Qwen2/Mistral <-> Transformer
  (logits equal to 1e-4; unsupported RoPE scaling refused). ``Transformer.forward(tokens,
  targets=None, *, positions=None, cache=None)`` prefills and decodes with a cache
  (``mlsys_nb.inference.KVCache``).
"""

from .transformer import MLP, Attention, Block, MoE, Transformer, build_norm, rope_tables

__all__ = [
    "MLP",
    "Attention",
    "Block",
    "MoE",
    "Transformer",
    "build_norm",
    "config_from_hf",
    "from_hf",
    "rope_tables",
    "to_hf",
]


def __getattr__(name):  # transformers loads only when a conversion is asked for
    if name in ("from_hf", "to_hf", "config_from_hf"):
        from . import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'mlsys_nb.models' has no attribute {name!r}")
