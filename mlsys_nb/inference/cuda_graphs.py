"""CUDA graphs of the engine's decode step (vLLM's default; ``EngineConfig.enforce_eager=True`` turns it off).

``CUDAGraphRunner`` (CUDA only, guarded by ``torch.cuda.is_available()``): decode steps replay one captured
CUDA graph per batch-size bucket (``graph_buckets``); a batch is padded up to its bucket by repeating its first
row (the repeated row writes the same K/V value into the same slot, so padding changes nothing). A graph's
inputs live in static buffers (``StaticDecodeBatch``, a ``step_batch.StepBatch`` of fixed shapes) that each
step's batch is copied into. A graph removes the per-kernel launch cost, CPU time spent inside the model's
forward; on CPU there is nothing to capture, and the per-operator dispatch a graph would replace is part of the
``model`` phase of ``LLMEngine.step_times`` (the ``prepare`` phase stays, plus the copy into static buffers).

``capture_decode_graphs(runner, config)`` is what the engine does when it is built: capture (on a
``model_runner.ModelRunner``: ``runner.capture_cuda_graphs``), or say why it runs eager (``cuda_graph_refusal``,
or a capture that failed).
"""

from __future__ import annotations

import warnings

import torch

from ..config import check_int
from .step_batch import StepBatch

__all__ = [
    "GRAPH_BUCKETS",
    "CUDAGraphRunner",
    "StaticDecodeBatch",
    "capture_decode_graphs",
    "cuda_graph_refusal",
    "graph_buckets",
]

GRAPH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # decode batch sizes captured by default (vLLM's are alike)


def graph_buckets(max_num_seqs: int) -> tuple[int, ...]:
    """The decode graphs the engine captures: every size in ``GRAPH_BUCKETS`` up to ``max_num_seqs`` and
    ``max_num_seqs`` itself (at most 512), so any decode batch of the engine fits one (padded to the next size up)."""
    check_int("max_num_seqs", max_num_seqs, 1)
    top = min(max_num_seqs, GRAPH_BUCKETS[-1])
    return tuple(sorted({b for b in GRAPH_BUCKETS if b <= top} | {top}))


def cuda_graph_refusal(config, device) -> str | None:
    """Why the engine does not capture CUDA graphs for ``config`` (an ``EngineConfig``) on ``device``, or None where
    it does: graphs are the default on CUDA (``enforce_eager=True`` turns them off), for the paths whose decode step
    reads nothing back to the host: the "gather" attention backend ("tiled" sizes its loop from the longest context,
    "varlen" packs the contexts on the host each step), an unquantized KV pool (a quantized one plans its K residual on
    the host every step) and synchronous scheduling (async scheduling prepares steps on a worker thread)."""
    if config.enforce_eager:
        return "enforce_eager=True"
    if torch.device(device).type != "cuda":
        return f"the model is on {torch.device(device).type}, not CUDA"
    if config.attention_backend != "gather":
        return f"attention_backend={config.attention_backend!r} (graphs need 'gather')"
    if config.kv_cache_dtype in ("int8", "fp8"):
        return f"kv_cache_dtype={config.kv_cache_dtype!r} (graphs need an unquantized pool)"
    if config.async_scheduling:
        return "async_scheduling=True"
    return None


class CUDAGraphRunner:
    """Decode-only CUDA graphs, one per batch bucket, over static input buffers (CUDA only).

    A graph replays fixed kernels on fixed addresses, so every input lives in a static tensor that is
    overwritten before ``replay()``: tokens, positions, slots, block tables padded to
    ``max_blocks_per_seq`` columns, context lengths. Capture runs a warm-up pass on a side stream
    first (as PyTorch's ``torch.cuda.graphs`` documentation requires)."""

    def __init__(self, runner, buckets, max_blocks_per_seq=None):
        kv, dev = runner.kv, runner.kv.k.device
        self.buckets = sorted(buckets)
        self.width = max_blocks_per_seq or kv.manager.blocks_needed(kv.manager.max_seq_len)
        self.graphs, self.io = {}, {}
        for b in self.buckets:
            io = StaticDecodeBatch(kv, b, self.width, dev)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.inference_mode():
                runner.model(io.tokens, positions=io.positions, cache=io)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g), torch.inference_mode():
                io.logits = runner.model(io.tokens, positions=io.positions, cache=io)[0]
            self.graphs[b], self.io[b] = g, io

    def fits(self, batch: StepBatch) -> bool:
        return batch.num_decodes <= self.buckets[-1] and batch.dec_tables.shape[1] <= self.width

    def run(self, batch: StepBatch) -> torch.Tensor:
        b = next(x for x in self.buckets if x >= batch.num_decodes)
        self.io[b].load(batch)
        self.graphs[b].replay()
        return self.io[b].logits[: batch.num_decodes][batch.sample_rows]


class StaticDecodeBatch(StepBatch):
    """A decode batch of ``b`` rows in static buffers (for graph capture): attend = StepBatch's decode path."""

    def __init__(self, kv, b, width, dev):
        self.kv, self.num_decodes, self.prefills, self.tentative, self.dec_varlen = kv, b, [], None, None
        self.tokens = torch.zeros(1, b, dtype=torch.long, device=dev)
        self.positions = torch.zeros(1, b, dtype=torch.long, device=dev)
        self.slots = torch.zeros(b, dtype=torch.long, device=dev)
        self.dec_tables = torch.zeros(b, width, dtype=torch.long, device=dev)
        self.dec_lens = torch.ones(b, dtype=torch.long, device=dev)
        self.dec_groups = [(0, b, self.dec_tables, self.dec_lens)]  # one group: fixed shapes for the graph

    def load(self, batch: StepBatch) -> None:
        """Copy a decode batch of n <= b rows into the static buffers; rows n..b-1 repeat row 0."""
        n, b = batch.num_decodes, self.num_decodes
        rows = list(range(n)) + [0] * (b - n)
        self.tokens[0] = batch.tokens[0][rows]
        self.positions[0] = batch.positions[0][rows]
        self.slots.copy_(batch.slots[rows])
        self.dec_tables.zero_()
        self.dec_tables[:, : batch.dec_tables.shape[1]] = batch.dec_tables[rows]
        self.dec_lens.copy_(batch.dec_lens[rows])


def capture_decode_graphs(runner, config) -> str | None:
    """Capture ``runner``'s decode graphs for ``config`` (an ``EngineConfig``): None once captured, else why
    the engine runs eager (``cuda_graph_refusal``, or a model whose forward a graph cannot hold: a warning)."""
    off = cuda_graph_refusal(config, next(runner.model.parameters()).device)
    if off is not None:
        return off
    try:
        runner.capture_cuda_graphs(graph_buckets(config.max_num_seqs))
    except RuntimeError as e:
        runner.graphs = None
        warnings.warn(
            f"CUDA graph capture failed, the engine runs eager ({e}); enforce_eager=True skips the capture",
            RuntimeWarning,
            stacklevel=3,
        )
        return f"capture failed: {e}"
    return None
