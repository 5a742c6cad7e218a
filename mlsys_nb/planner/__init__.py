"""A 5D-parallelism planner: search dp x tp x pp x cp x ep (+ ZeRO stage, recomputation,
micro-batch, pipeline schedule) for a model on a cluster, rank the layouts by a *modelled* step time.

``search(model, gpus=, gpu=, global_batch_tokens=, seq_len=)`` returns a pandas DataFrame of the
configurations that fit in memory, best (shortest modelled step) first; ``evaluate(model, layout,
...)`` returns one ``Plan`` with its memory ``Breakdown`` and its time breakdown (``Plan.to_frame()``).

Everything here is a model (no GPU is touched), built only from the package's calculators:

- **memory**: ``mlsys_nb.memory.estimate`` on the heaviest pipeline stage (stages get ⌊L/pp⌋ or
  ⌈L/pp⌉ layers, ``memory.stage_layers``), plus ``overhead_bytes`` per GPU (CUDA context, NCCL
  buffers, allocator fragmentation; an assumption, default 4 GB). Two closed-form lower bounds prune
  layouts before the full estimate is called: model states or last-stage activations for every
  candidate, then, in step-time order, model states + block activations x in-flight micro-batches of
  every pipeline rank (``bounds.stage_memory_bound``; tests check both stay below the estimate and that the
  pruned search returns the unpruned rows).
- **compute**: matmul FLOPs of the heaviest stage from ``mlsys_nb.flops`` (causal attention; full
  recomputation re-runs the stage's forward, selective the attention scores), divided by
  ``peak(dtype) x compute_efficiency x`` the fitted matmul efficiency of the GPU's generation
  (``Calibration``), plus the non-matmul kernels as bytes at HBM bandwidth (fitted), plus a fixed time
  per layer and micro-batch that does not scale with its tokens (``layer_s``, fitted: kernel launches and
  tails, synchronisation, narrow per-rank GEMMs; it makes many small micro-batches cost more than few large ones).
- **calibration** (``calibration=``, default ``"fitted"``: the values stored in
  ``data/published_runs.yaml``, ``fitted_calibration()``): efficiencies fitted by ``calibrate()`` on
  15 published runs (leave-one-out: all 15 within 20 % of the reported MFU; 14 without ``layer_s``).
  ``calibration=None`` is the uncalibrated model (datasheet peaks, no non-matmul or fixed term, no overlap):
  an upper bound.
- **communication**: α-β costs (``mlsys_nb.comm.collective_time``) on the link each group uses.
  Ranks are ordered tp (fastest), cp, ep, rest of dp, pp (Megatron-LM's order): a group whose span
  fits in ``gpus_per_node`` uses the GPU's NVLink, otherwise the network (``network``, one NIC per
  GPU). TP with sequence parallelism: 4 all-gathers + 4 reduce-scatters of the activations per
  layer per micro-batch (forward + backward; + 4 with full recomputation), a fitted fraction
  hidden (it fits at 0). CP: all-gather of K and V per layer (reduce-scatter of their gradients in
  backward), as Llama 3 does, same fraction hidden. EP: dispatch + combine all-to-all per MoE
  layer, forward and backward, of
  ``ep_copies`` token copies (default top_k) at ``ep_bytes`` bytes per element (default 2); the
  ``dualpipe`` schedule hides it behind the other micro-batch's compute (DeepSeek-AI 2024,
  arXiv:2412.19437, §3.2.1), other schedules expose it. PP: one activation send per stage boundary
  per micro-batch and direction. DP: gradient all-reduce (ZeRO-1/2: reduce-scatter + all-gather, the
  same bytes) over dp x cp (experts over dp x cp / ep) once per step, a fraction ``dp_overlap``
  (default 0.8) hidden behind backward compute; ZeRO-3 also all-gathers parameters in forward and
  backward of every micro-batch (same overlap).
- **pipeline bubble**: ``mlsys_nb.pipeline.closed_form`` (1F1B ``(p-1)/m``, interleaved
  ``(p-1)/(v m)``, ZB-H1, DualPipe) with backward = 2 x forward (+ recompute). Interleaved chunks per rank
  ``v`` up to one layer per chunk, the first stage's first chunk holding only the embedding and the last
  stage's last only the head (Llama 3's split, ``memory.max_chunks``: v = 8 for 126 layers on 16 stages);
  each chunk boundary is a p2p send (``PP comm`` is v x that of 1F1B).

- **partial recomputation**: with ``recompute="full"`` a layout may recompute only ``recompute_layers``
  layers of each stage (Megatron-LM's ``--recompute-method block --recompute-num-layers``); the search
  gives each such layout the fewest layers that fit (``bounds.fewest_recomputed``, ``bounds.layers_short``), its
  recomputation, TP traffic and non-matmul time scaled by the recomputed share of the stage, and
  lists it only where the same layout without recomputation does not fit.

Not modelled: network congestion and stragglers, optimizer step time, load imbalance between
experts, attention efficiency at short per-rank chunks (``attn_eff`` is held at 1). Checked in
``tests/test_planner.py``: held-out MFU of the published runs; Llama 3 405B's long-context layout and
Korthikanti et al.'s 175B layout among the 10 best distinct layouts of an unconstrained search; not
Llama 3's 8K layouts: on 16,384 GPUs (TP8 PP16 DP128, v 8) 16th distinct, 0.10 s per step (1.5 %) behind the
10th (TP8 CP2 PP16 DP64), which wins by the bubble of twice the micro-batches per pipeline (0.33 s) for 0.03 s
of CP all-gather; on 8,192 GPUs 34th, because the kit's memory model needs one recomputed layer per stage
(0.40 s) where Meta recomputed none, and TP 8's exposed traffic (1.2 s) weighs more at 32 micro-batches.
CP at 8K is not an artefact of the model: NVIDIA's tuned recipe for the same model and sequence length on H100 runs
TP8 PP8 CP2 VP8 (Megatron-Bridge performance summary, FP8, 1,024 GPUs; docs/references.md#megatron-bridge-perf).
``compare(a, b)`` says which term decides between two plans and where that term's formula comes from
(``TERM_SOURCES``); ``sensitivity(fit)`` ranks the published layouts with each fitted parameter at the
ends of its bootstrap interval; ``goodput_mfu`` scales an MFU by the fraction of time spent training
(``effective_training_time``). The step times and MFUs are a model; DeepSeek-V3's MFU to compare with is
``flops.implied_mfu`` (the kit's FLOPs over the reported GPU-hours), also a model.

The parts, one file each (read them in this order):

- ``plan``: ``Layout`` (one configuration), ``Plan`` (its modelled cost), ``compare`` and ``TERM_SOURCES``;
- ``context``: ``PlanContext`` (the model, cluster and assumptions, ``DEFAULTS``), the ``TrainConfig`` a layout
  gives ``memory``, ``clear_caches``;
- ``model``: the step-time model (``step_pieces``, ``assemble_step``, ``step_time``), ``bubble_ratio`` and
  ``evaluate``;
- ``traffic``: the communication terms on each group's link;
- ``bounds``: the closed-form memory lower bounds that prune the search;
- ``layout_search``: ``search`` (candidates, pruning, estimates in step-time order) and ``rank_of``;
- ``calibration``: ``Calibration``, ``fitted_calibration``, ``published_runs``, ``goodput_mfu``;
- ``fitting``: ``calibrate`` (``Fit``) and ``sensitivity``.
"""

from .calibration import (
    BOUNDS,
    FITTED,
    FIXED,
    PARAMS,
    Calibration,
    effective_training_time,
    fitted_calibration,
    generation,
    goodput_mfu,
    published_runs,
)
from .context import DEFAULTS, clear_caches
from .fitting import Fit, calibrate, sensitivity
from .layout_search import rank_of, search
from .model import bubble_ratio, evaluate
from .plan import COLUMNS, SCHEDULES, TERM_SOURCES, Layout, Plan, compare

__all__ = [
    "bubble_ratio",
    "Layout",
    "Plan",
    "search",
    "evaluate",
    "rank_of",
    "clear_caches",
    "compare",
    "sensitivity",
    "goodput_mfu",
    "effective_training_time",
    "TERM_SOURCES",
    "calibrate",
    "Calibration",
    "fitted_calibration",
    "published_runs",
    "COLUMNS",
    "SCHEDULES",
    "DEFAULTS",
    "Fit",
    "PARAMS",
    "FITTED",
    "FIXED",
    "BOUNDS",
    "generation",
]
