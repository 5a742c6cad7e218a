"""Inference: what happens after training. The KV cache, paged blocks, prefix caching, the roofline.

Everything runs on the package's own ``mlsys_nb.models.Transformer`` (which can be loaded from a
Hugging Face Llama/Qwen2/Mistral checkpoint with ``mlsys_nb.models.from_hf``).

- ``KVCache(model, n_seqs, max_len)`` (``kv_cache``): the contiguous cache; its module docstring is
  the cache PROTOCOL every cache implements (``plan``, ``begin``, ``attend``, ``commit``) and that
  ``Transformer.forward(tokens, cache=cache)`` calls.
- ``kv_cache_bytes(model, tokens, dtype)``, ``kv_bytes_per_token``, ``weight_bytes``,
  ``max_concurrent_sequences(model, gpu, seq_len, ...)``: sizes in bytes (MHA/GQA/MQA and MLA).
- ``ByteTokenizer`` (``tokenizer``): ids 0-255 are bytes, ``eos_id`` = 256; incremental decoding
  (``decode_stream``) holds back an incomplete UTF-8 character. ``token_bytes(tok, vocab_size)``: each
  token's exact bytes (byte tokenizer, or a ``transformers`` byte-level BPE / SentencePiece-style
  tokenizer) for grammar masks; ``train_tokenizer(text, vocab_size, style)`` trains a small one here.
- ``generate(model, tokenizer, prompts, ...)`` (``generation``): greedy/sampled decoding with the cache.
- Roofline (``roofline``; ``matmul_params``, ``attention_flops``): ``step_cost``, ``prefill_cost``,
  ``decode_cost`` -> ``StepCost`` (FLOPs, bytes, arithmetic intensity, compute- or memory-bound, modelled
  time per token on a GPU of data/hardware.yaml); ``measure_throughput`` (``measure``) measures tokens/s on
  this machine and ``machine_roofline`` its matmul FLOP/s and copy bandwidth; ``decode_bytes_read`` counts the
  parameter and KV-cache bytes a real decode step reads (traced), the independent check of ``decode_cost``'s
  bytes.
- Paged KV cache and prefix caching (``paged``): ``BlockManager`` (``block_manager``, no torch: the one truth
  of which blocks hold computed K/V: a block is a prefix-cache hit only after ``mark_computed``; its keys
  ``block_hash``; ``fragmentation`` counts paging's waste), ``PagedKVCache``, ``paged_attention``,
  ``kv_block_bytes``. The engine's prefix index is these hash-chained blocks.
- ``RadixCache`` (``radix``): SGLang's token-level radix tree with LRU eviction, a notebook exhibit
  (notebook 14 measures it beside the hash-chained blocks on a multi-turn workload, ``multi_turn_workload``).
  The engine does not use it.
- The serving engine, in vLLM's style (``llm``, ``engine``, ``config``, ``scheduler``, ``model_runner``, ``sampler``,
  ``sampling_params``, ``sequence``): ``LLM(model, ...).generate(prompts, SamplingParams(...))`` ->
  ``RequestOutput``s; ``LLMEngine`` (``add_request``, ``step``, ``abort_request``) with continuous
  batching, chunked prefill, preemption (recompute or swap), prefix caching; ``llm.load_weights``.
  ``LLMEngine.step`` is five phases (``engine.PHASES`` names the timed ones); the scheduler decides
  (``scheduler.SchedulerOutput``: what runs, which blocks to swap out, swap in or copy) and the model runner
  moves the bytes (``model_runner.ModelRunner.move_blocks``, its ``SwapPool``) and runs the forward. Requests
  are validated by ``inputs.InputProcessor``; models, tokenizers and weights come through ``loading``.
  Every option is a field of one ``EngineConfig`` (``config``), shared by ``LLM``, ``LLMEngine``, the
  ``Scheduler`` and the server's command line.
  ``async_scheduling=True`` builds an ``AsyncLLMEngine`` (its step: ``async_engine.py``), which prepares step t+1
  (schedule, input tensors) on a worker thread while step t's forward runs.
  On CUDA the engine captures its decode step as CUDA graphs (``cuda_graphs``: ``CUDAGraphRunner`` over
  ``StaticDecodeBatch`` buffers), one per batch size up to ``max_num_seqs`` (``cuda_graphs.graph_buckets``), as
  vLLM does; ``enforce_eager=True`` turns that off, and ``LLMEngine.cuda_graphs_off`` says why a configuration
  runs eager (``cuda_graphs.cuda_graph_refusal``). The sampler's ``filter_probs`` is temperature, top-k, top-p
  and min-p on one row.
  ``attention_backend="varlen"`` attends all decodes of a step in one call per layer
  (``paged.paged_decode_attention_varlen``).
  ``compile=True`` runs the forward through ``torch.compile`` (``compiled``: ``CompiledModel``, one graph symbolic
  in the step's token count, attention one opaque op; ``compiled.generated_kernels`` lists the fused kernels
  inductor generated for it).
- ``workload`` (Poisson arrivals, length distributions, shared prefixes: ``make_workload``, ``run_workload``,
  ``shared_prefix_tokens``) and ``metrics`` (TTFT, TPOT, ITL, latency percentiles and throughput:
  ``summarize``; CPU overhead per phase: ``measure_decode_overhead``, ``phase_breakdown``, ``fastest_step``,
  ``cpu_per_sequence_ratio``; the overlap-scheduling model: ``overlap_speedup``, ``simulate_overlap``,
  ``overlap_model_error``; async scheduling measured: ``measure_async_scheduling``, ``async_step_model``).
- ``python -m mlsys_nb.inference.serve --model tiny`` (``serve``): an OpenAI-compatible server.
- Speculative decoding (``speculative``): ``speculative_generate(target, prompt_ids, draft=model|"ngram",
  k=...)``, the rejection rule ``verify``, closed forms ``expected_tokens_per_step``,
  ``expected_speedup``, ``best_k`` (``spec_math``, no torch); inside the engine's batch
  ``spec_batch.BatchSpeculator``.
- Structured outputs (``structured``): ``Grammar.compile(json_schema=|regex=|choice=)``, a budget-aware
  token mask over outlines-core's automaton, ``apply_mask``, ``generate_structured``.

Where each file's counterpart lives in vLLM v1 (paths in the vllm-project/vllm repository), for reading
one beside the other:

- ``llm.LLM``: ``vllm/entrypoints/llm.py`` (the offline front).
- ``engine.LLMEngine``: ``vllm/v1/engine/llm_engine.py`` and ``vllm/v1/engine/core.py`` (``EngineCore``, the
  schedule -> execute -> update loop, in a process of its own there, in-process here).
- ``scheduler.Scheduler``: ``vllm/v1/core/sched/scheduler.py`` (one token budget, chunked prefill,
  preemption; v1 only recomputes, this one can also swap); ``scheduler.SchedulerOutput``:
  ``vllm/v1/core/sched/output.py``.
- ``paged.BlockManager``: ``vllm/v1/core/kv_cache_manager.py``, ``vllm/v1/core/block_pool.py`` (the free
  queue, hash-chained prefix blocks) and ``vllm/v1/core/kv_cache_utils.py`` (block hashes).
- ``model_runner``: ``vllm/v1/worker/gpu_model_runner.py`` (a step's inputs); ``cuda_graphs``: its CUDA-graph
  capture (``capture_model``). ``inputs.InputProcessor``: ``vllm/v1/engine/processor.py``.
- ``sampler``: ``vllm/v1/sample/sampler.py`` and ``vllm/v1/sample/logits_processor/``;
  ``sampling_params``: ``vllm/sampling_params.py``.
- ``sequence``: ``vllm/v1/request.py`` (``Request``) and ``vllm/outputs.py`` (``RequestOutput``);
  ``tokenizer.decode_stream``: ``vllm/v1/engine/detokenizer.py``.
- ``serve``: ``vllm/entrypoints/openai/api_server.py`` over ``vllm/v1/engine/async_llm.py``; ``metrics``
  and ``/metrics``: ``vllm/v1/metrics/loggers.py`` (Prometheus histograms with the same bucket bounds).
- ``speculative``: ``vllm/v1/spec_decode/`` (n-gram and draft proposers) and
  ``vllm/v1/sample/rejection_sampler.py``; ``structured``: ``vllm/v1/structured_output/`` (grammar
  backends, the token bitmask).
"""

from .kv_cache import DTYPE_BYTES, KVCache, kv_bytes_per_token, kv_cache_bytes, max_concurrent_sequences, weight_bytes
from .tokenizer import ByteTokenizer

__all__ = [
    "DTYPE_BYTES",
    "LLM",
    "BlockManager",
    "ByteTokenizer",
    "CompletionOutput",
    "Generation",
    "KVCache",
    "LLMEngine",
    "AsyncLLMEngine",
    "EngineConfig",
    "PagedKVCache",
    "RadixCache",
    "RequestOutput",
    "SamplingParams",
    "StepCost",
    "attention_flops",
    "decode_bytes_read",
    "decode_cost",
    "generate",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "machine_roofline",
    "matmul_params",
    "max_concurrent_sequences",
    "measure_throughput",
    "paged_attention",
    "prefill_cost",
    "step_cost",
    "weight_bytes",
    "Grammar",
    "GrammarError",
    "apply_mask",
    "best_k",
    "expected_speedup",
    "expected_tokens_per_step",
    "generate_structured",
    "speculative_generate",
]

_LAZY = {
    "generate": ".generation",
    "StepCost": ".roofline",
    "step_cost": ".roofline",
    "prefill_cost": ".roofline",
    "decode_cost": ".roofline",
    "decode_bytes_read": ".roofline",
    "measure_throughput": ".measure",
    "machine_roofline": ".measure",
    "matmul_params": ".roofline",
    "attention_flops": ".roofline",
    "Generation": ".generation",
    "BlockManager": ".paged",
    "PagedKVCache": ".paged",
    "paged_attention": ".paged",
    "RadixCache": ".radix",
    "LLM": ".llm",
    "LLMEngine": ".engine",
    "AsyncLLMEngine": ".engine",
    "EngineConfig": ".config",
    "SamplingParams": ".sampling_params",
    "RequestOutput": ".sequence",
    "CompletionOutput": ".sequence",
    "speculative_generate": ".speculative",
    "best_k": ".speculative",
    "expected_speedup": ".speculative",
    "expected_tokens_per_step": ".speculative",
    "Grammar": ".structured",
    "GrammarError": ".structured",
    "apply_mask": ".sampler",
    "generate_structured": ".structured",
}


def __getattr__(name):  # the roofline, paged and radix parts load on first use
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'mlsys_nb.inference' has no attribute {name!r}")
