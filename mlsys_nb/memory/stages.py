"""Pipeline stages: layers per stage, parameters per stage and TP/EP rank, micro-batches in flight.

Stages get ⌊L/pp⌋ or ⌈L/pp⌉ layers (``stage_layers``) or a published uneven split (``train.pp_layers``); the
embedding sits on the first stage, the head on the last; DualPipe ranks hold two stages. The micro-batches a
stage holds at its peak come from the schedule's closed form (``pipeline.peak_in_flight``).
"""

from __future__ import annotations

import math
from functools import lru_cache

from ..config import ModelConfig, TrainConfig, check_int, layer_kinds, layer_params, norm_params
from ..pipeline.closed_forms import peak_in_flight


def stage_layers(n_layers: int, pp: int, split=None) -> tuple[int, ...]:
    """Transformer layers on each of ``pp`` pipeline stages.

    ``split`` (a published uneven split, e.g. from a paper) is validated and returned. Otherwise
    every stage gets ⌊L/pp⌋ layers and the ``L mod pp`` extra layers go to the middle stages
    1, 2, ... first (the first stage also holds the embedding, the last the LM head and loss), then
    to stage 0 and stage pp-1. For Llama 3.1 405B (126 layers, PP16) this gives 7, 8 x 14, 7: the
    split Meta describes ("one Transformer layer" fewer on the first and the last stage; Llama Team
    2024, arXiv:2407.21783, §3.3.2)."""
    if split is None:
        return even_stage_layers(n_layers, pp)
    check_int(f"pp (a stage needs a layer: n_layers={n_layers})", pp, 1, n_layers)
    split = tuple(int(x) for x in split)
    if len(split) != pp or sum(split) != n_layers or min(split) < 1:
        raise ValueError(f"pp_layers={split}: need {pp} stage sizes >= 1 summing to n_layers={n_layers}")
    return split


def max_chunks(n_layers: int, pp: int, split=None) -> int:
    """Most interleaved-schedule chunks (``virtual_stages``) each of ``pp`` pipeline ranks can hold: every chunk
    needs a layer, except that the first stage's first chunk may hold only the embedding and the last stage's
    last chunk only the output layer and loss (Llama Team 2024, arXiv:2407.21783, §3.3.2: 126 layers on 16
    stages of 7, 8 x 14, 7 layers make 8 chunks per rank)."""
    sizes = stage_layers(n_layers, pp, split)
    if pp == 1:
        return sizes[0]
    return min(n + (s == 0) + (s == pp - 1) for s, n in enumerate(sizes))


@lru_cache(maxsize=1024, typed=True)
def even_stage_layers(n_layers: int, pp: int) -> tuple[int, ...]:
    """``stage_layers`` without a published split. Cached (a planner search asks for the same few splits ~10^5
    times); ``typed``: 2 and 2.0 are different keys, so a bad type still raises, an exception is never cached."""
    check_int(f"pp (a stage needs a layer: n_layers={n_layers})", pp, 1, n_layers)
    q, r = divmod(n_layers, pp)
    counts = [q] * pp
    order = (list(range(1, pp - 1)) + [0, pp - 1]) if pp > 2 else list(range(pp))
    for s in order[:r]:
        counts[s] += 1
    return tuple(counts)


def stage_range(m: ModelConfig, t: TrainConfig, stage: int) -> range:
    """The transformer layers (0-based indices) of pipeline stage ``stage``."""
    sizes = stage_layers(m.n_layers, t.pp, t.pp_layers)
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])


def stage_params(m: ModelConfig, t: TrainConfig, stage: int) -> tuple[float, float, float, int]:
    """(dense, expert, largest layer) parameters on ``stage`` per TP/EP rank, and its layer count."""
    layers = stage_range(m, t, stage)
    per = len(layers)
    dense = expert = 0.0
    largest = 0.0
    for i, n in layer_kinds(m, layers).items():
        lp = layer_params(m, i, tp=t.tp, ep=t.ep)
        dense += n * lp["dense"]
        expert += n * lp["expert"]
        largest = max(largest, lp["dense"] + lp["expert"])
    vshard = math.ceil(m.vocab_size / t.tp) * m.hidden
    if stage == 0:
        dense += vshard
    if stage == t.pp - 1:
        dense += norm_params(m) + (vshard if (not m.tied_embeddings or t.pp > 1) else 0)
    return dense, expert, largest, per


def stage_activations(m: ModelConfig, t: TrainConfig, layers: range, one_layer) -> float:
    """Saved activations of one micro-batch through the stage ``layers`` (bytes); ``one_layer(i, recompute)``
    gives layer ``i``'s. With ``t.recompute_layers = k`` the stage's first k layers are recomputed (only their
    inputs kept) and the others keep everything, as Megatron-LM's ``--recompute-method block`` does."""
    k = len(layers) if t.recompute_layers is None else min(t.recompute_layers, len(layers))
    cut = layers.start + k
    kept = "none" if t.recompute_layers is not None else None
    return sum(n * one_layer(i) for i, n in layer_kinds(m, range(layers.start, cut)).items()) + sum(
        n * one_layer(i, kept) for i, n in layer_kinds(m, range(cut, layers.stop)).items()
    )


def in_flight_microbatches(t: TrainConfig, stage: int) -> float:
    """Micro-batches (in units of one micro-batch through a whole stage) whose activations a
    stage holds at its peak: the pipeline schedule's own closed form (``peak_in_flight``)."""
    if t.pp == 1:
        return 1.0
    return in_flight_stages(t)[stage]


def in_flight_stages(t: TrainConfig) -> list[float]:
    """``in_flight_microbatches`` of every stage of a pipeline (``t.pp > 1``): one evaluation of the closed form."""
    if t.pp_schedule == "dualpipe":  # PP + 1 micro-batches in flight (DeepSeek-AI 2024, arXiv:2412.19437, Table 2)
        return [float(min(t.microbatches, t.pp + 1))] * t.pp
    v = t.virtual_stages if t.pp_schedule == "interleaved-1f1b" else None
    return [float(x) for x in peak_in_flight(t.pp_schedule, t.pp, t.microbatches, v)]
