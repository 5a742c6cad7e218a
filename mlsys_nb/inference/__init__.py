"""Inference: paged KV cache, a serving engine (continuous batching, chunked prefill, preemption), a server.

- ``LLM``, ``LLMEngine``, ``SamplingParams``, ``RequestOutput``, ``CompletionOutput`` (``engine``,
  ``sampling_params``, ``sequence``): vLLM-style offline generation and the engine loop.
- ``Scheduler`` (``scheduler``), ``ModelRunner`` (``model_runner``), ``sample`` (``sampler``).
- ``paged``: ``BlockManager``, ``PagedKVCache``, ``paged_attention``.
- ``workload``: Poisson arrivals, length distributions, shared prefixes; ``metrics``: TTFT, TPOT,
  ITL, latency percentiles, throughput, the CPU-overhead and overlap-scheduling models.
- ``python -m mlsys_nb.inference.serve --model tiny``: an OpenAI-compatible FastAPI server.
"""
from .sampling_params import SamplingParams
from .sequence import CompletionOutput, Logprob, RequestMetrics, RequestOutput

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics", "Logprob"]


def __getattr__(name):  # torch-heavy parts load on first use
    if name in ("LLM", "LLMEngine"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'mlsys_nb.inference' has no attribute {name!r}")
