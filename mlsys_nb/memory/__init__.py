"""Training memory per GPU: parameters, gradients, optimizer states, master weights, activations.

``estimate(model, train)`` returns a ``Breakdown`` whose fields are **bytes per rank** (the
heaviest pipeline stage unless ``stage=`` is given). Model states follow the ZeRO paper's analysis
(Rajbhandari et al. 2020, arXiv:1910.02054, §3; Micikevicius et al. 2018, arXiv:1710.03740) with exact
parameter counts (``ModelConfig.param_count``: GQA, SwiGLU, untied head, MoE total vs active,
DeepSeek MLA) sharded by TP (Megatron column/row split, vocab-parallel embedding), PP (``stage_layers``:
⌊L/pp⌋ or ⌈L/pp⌉ layers per stage, or a published uneven split ``train.pp_layers``; embedding on the
first stage, head on the last; DualPipe ranks hold two stages), EP (experts) and ZeRO 0-3 over dp x cp.
Activations are summed from named saved-for-backward tensors of one transformer layer
(``layer_terms``), so every number can be traced to a tensor; ``kernels="eager"`` describes this
package's ``Transformer`` exactly as PyTorch runs it (validated on CPU against
``torch.autograd.graph.saved_tensors_hooks``, ``mlsys_nb.models.measure``), ``kernels="fused"`` a GPU
training stack (Korthikanti et al. 2022's accounting, arXiv:2205.05198, eq. 1-2, Table 2). PP multiplies them
by the schedule's in-flight micro-batches; ``train.recompute_layers`` recomputes only the first k layers of
each stage.

``playbook_estimate(**inputs)`` ports the Ultra-Scale Playbook widget exactly (its bugs included,
docs/references.md#playbook-memory-widget); ``estimate(..., compat="playbook")`` shows it for a model/training
pair. The default mode fixes those bugs (tests in ``tests/test_memory.py`` pin each fix).

The parts, one file each:

- ``estimator``: ``estimate``, stage by stage (model states, activations, transient buffers);
- ``breakdown``: ``Breakdown`` (bytes by component, ``to_frame``) and ``check`` (combinations that cannot run);
- ``states``: ``bytes_per_param``, ``model_state_bytes`` (ZeRO 0-3), ``sharded_elements`` (an implementation's
  own padding), ``param_count``, ``scalar_head_params``, CPU offload;
- ``finetune``: LoRA / QLoRA (``block_linear_shapes``, ``lora_layer_params``, ``finetune_elements``);
- ``activations``: ``layer_terms`` (one layer's saved tensors) and the tensors outside the layers;
- ``stages``: ``stage_layers``, ``max_chunks``, ``stage_params``, ``in_flight_microbatches``;
- ``playbook``: the Playbook widget (``playbook_estimate``, ``playbook_inputs``, ``PLAYBOOK_PRESETS``,
  ``format_playbook_bytes``);
- ``units``: ``GB = 1e9``, ``GiB = 2**30`` (bytes everywhere), the precision recipes' bytes per element,
  ``preset``/``presets`` (``data/models.yaml``).
"""

from ..config import LORA_TARGETS, ModelConfig, ParamCount, TrainConfig, norm_params
from .activations import layer_terms
from .breakdown import Breakdown, check
from .estimator import estimate
from .finetune import block_linear_shapes, block_linear_weights, finetune_elements, lora_layer_params
from .playbook import PLAYBOOK_INITIAL, PLAYBOOK_PRESETS, format_playbook_bytes, playbook_estimate, playbook_inputs
from .stages import in_flight_microbatches, max_chunks, stage_layers, stage_params
from .states import (
    ModelStates,
    bytes_per_param,
    model_state_bytes,
    param_count,
    scalar_head_params,
    sharded_elements,
)
from .units import GB, GiB, preset, presets

__all__ = [
    "ModelConfig",
    "TrainConfig",
    "preset",
    "presets",
    "ParamCount",
    "param_count",
    "ModelStates",
    "model_state_bytes",
    "Breakdown",
    "estimate",
    "layer_terms",
    "playbook_estimate",
    "playbook_inputs",
    "PLAYBOOK_PRESETS",
    "GB",
    "GiB",
    "format_playbook_bytes",
    "stage_layers",
    "block_linear_shapes",
    "lora_layer_params",
    "block_linear_weights",
    "finetune_elements",
    "scalar_head_params",
    "LORA_TARGETS",
    "norm_params",
    "check",
    "PLAYBOOK_INITIAL",
    "in_flight_microbatches",
    "max_chunks",
    "stage_params",
    "bytes_per_param",
    "sharded_elements",
]
