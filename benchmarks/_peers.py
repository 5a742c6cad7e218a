"""The peers of ``benchmarks/serving.py``: transformers' continuous batching, ``transformers serve``, the kit's server.

- ``HFContinuousBatching``: one persistent ``init_continuous_batching`` manager per model (transformers 5.x), with
  an explicit paged cache (``num_blocks`` x ``page_size`` tokens) sized for the workload: on a CPU it otherwise
  sizes the cache from system RAM. Warmed once; requests go in with ``add_request`` and come back with
  ``get_result`` (each wait under a timeout).
- ``save_model_dir``: the same weights as a transformers checkpoint directory with a word-level tokenizer
  (``"t17 t3"`` is tokens 17 and 3, no special tokens), so both servers tokenise a text prompt to the same ids
  and every completion token is one word. Built without the network.
- ``ServerProcess`` (``mlsys_nb.runtime.ports``, re-exported): a server in its own process group, ready when
  ``/health`` answers 200, killed with its group on exit (also on error).
- ``bench_server``: the ``openai`` client streaming ``/v1/completions``, at most ``concurrency`` requests in
  flight, each sent at its arrival time (Poisson arrivals, or all at t=0); per request TTFT, the gaps between
  streamed chunks (ITL) and TPOT = (latency - TTFT) / (tokens - 1), as vLLM's ``benchmark_serving`` reports them.
- ``kit_server_cmd(DIR)``: the kit's server over the checkpoint in DIR, started through its own command line
  (``python -m mlsys_nb.inference.serve --model-dir DIR``).
"""

from __future__ import annotations

import asyncio
import sys
import time

from mlsys_nb.runtime.ports import ServerProcess  # noqa: F401  (re-exported: the servers' process manager)

TIMEOUT_S = 600.0  # the longest any one wait may take (a request, a result, a server start)


def word_tokenizer(vocab_size: int):
    """A ``PreTrainedTokenizerFast``: whitespace-separated words ``t0`` .. ``t{vocab_size-1}`` are ids 0 ..
    vocab_size-1; no special tokens are added; decoding joins the words with spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", pad_token="t0")


def as_text(ids) -> str:
    """The prompt text that ``word_tokenizer`` encodes to ``ids``."""
    return " ".join(f"t{i}" for i in ids)


def save_model_dir(hf, path: str) -> str:
    """Save a transformers causal LM with no EOS (every request runs to ``max_tokens``) and a word tokenizer."""
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    hf.save_pretrained(path)
    word_tokenizer(hf.config.vocab_size).save_pretrained(path)
    return path


class HFContinuousBatching:
    """transformers' continuous batching: one persistent, warmed manager; ``run(reqs)`` -> (row, outputs)."""

    def __init__(self, hf, batch: int, max_len: int, max_batch_tokens: int = 512, page_size: int = 32):
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        blocks = batch * -(-max_len // page_size) + 1  # every sequence in flight at full length, and one spare
        gen = GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0, max_new_tokens=max_len)
        cb = ContinuousBatchingConfig(
            page_size=page_size,
            num_blocks=blocks,
            max_batch_tokens=max_batch_tokens,
            max_requests_per_batch=batch,
            allow_block_sharing=False,  # the workload shares no prefix; the engine's prefix cache finds none either
        )
        self.cache_tokens = blocks * page_size
        self.manager = hf.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        self.manager.warmup()
        self.manager.start()
        self._n = 0

    def run(self, reqs, tqdm_desc: str | None = None):
        from mlsys_nb.runtime.timing import Laps

        clock = Laps()
        tag = f"r{self._n}-"
        self._n += 1
        for r in reqs:
            self.manager.add_request(r.prompt_token_ids, request_id=tag + r.request_id, max_new_tokens=r.max_tokens)
        done = {}
        while len(done) < len(reqs):
            out = self.manager.get_result(timeout=TIMEOUT_S)
            if out is None or out.error is not None:
                raise RuntimeError(f"transformers continuous batching failed: {out and out.error}")
            if out.is_finished():
                done[out.request_id] = out
        secs = clock.elapsed()
        outs = [list(done[tag + r.request_id].generated_tokens) for r in reqs]
        assert [len(o) for o in outs] == [r.max_tokens for r in reqs]
        return {"duration_s": secs, "output_tokens_per_s": sum(map(len, outs)) / secs}, outs

    def close(self):
        self.manager.stop(block=True, timeout=30)


def profile_hf_cb(
    hf, reqs, batch: int, max_len: int, steps: int = 20, top: int = 12, cb=None, start: int = 2
) -> tuple[list[str], dict]:
    """torch.profiler (CPU) over ``steps`` consecutive steps of transformers' continuous batching, taken inside its
    generation thread from step ``start`` on, while it serves ``reqs``: the ops with the most self CPU time per
    step and the step's wall time. -> (markdown lines, {"wall_ms", "cpu_ms", "attention_ms"} per step), attention
    being the ops named ``*scaled_dot_product*``. ``cb``: a running ``HFContinuousBatching`` to reuse (it is left
    running), else one is made for ``batch`` and ``max_len`` and stopped."""
    from torch.profiler import ProfilerActivity, profile

    own = cb is None
    cb = HFContinuousBatching(hf, batch, max_len) if own else cb
    mgr, state = cb.manager, {"n": 0, "prof": None, "t": [0.0, 0.0], "steps": 0}
    inner = mgr._generation_step

    def step():  # runs in the manager's thread: the profiler must start and stop there to see its ops
        state["n"] += 1
        if state["n"] == start:
            state["prof"] = profile(activities=[ProfilerActivity.CPU]).__enter__()
            state["t"][0] = time.perf_counter()
        inner()
        if state["prof"] is not None and state["steps"] < steps:
            state["steps"] += 1
            if state["steps"] == steps:
                state["t"][1] = time.perf_counter()
                state["prof"].__exit__(None, None, None)

    mgr._generation_step = step
    try:
        cb.run(reqs)
    finally:
        mgr._generation_step = inner
        if own:
            cb.close()
    k = state["steps"]
    if state["prof"] is None or k < steps:
        return [f"(profile: the run had {state['n']} steps, fewer than the {start + steps - 1} needed)"], {}
    ev = state["prof"].key_averages()
    total = sum(e.self_cpu_time_total for e in ev if e.key != "ProfilerStep*")
    wall = (state["t"][1] - state["t"][0]) / k
    lines = [
        f"torch.profiler (CPU) inside transformers' continuous-batching thread, steps {start}-{start + k - 1} of a run of "
        f"{len(reqs)} requests at {batch} per batch: {1e3 * wall:.1f} ms wall per step with the profiler on, "
        f"{1e-3 * total / k:.1f} ms of profiled self CPU time per step; the ops with the most self CPU time:",
        "",
        "| op | calls per step | self CPU per step (ms) | share of profiled self CPU |",
        "|---|---|---|---|",
    ]
    for e in sorted(ev, key=lambda e: -e.self_cpu_time_total)[:top]:
        lines.append(
            f"| `{e.key}` | {e.count / k:.1f} | {1e-3 * e.self_cpu_time_total / k:.3f} | "
            f"{e.self_cpu_time_total / total:.0%} |"
        )
    attn = sum(e.self_cpu_time_total for e in ev if "scaled_dot_product" in e.key)
    return lines, {"wall_ms": 1e3 * wall, "cpu_ms": 1e-3 * total / k, "attention_ms": 1e-3 * attn / k}


def kit_server_cmd(model_dir: str, max_num_seqs: int = 32, threads: int = 1) -> list[str]:
    """The kit's server over the checkpoint ``model_dir``, started through its real command line
    (``python -m mlsys_nb.inference.serve --model-dir``); the caller appends ``--port``'s value."""
    return [
        sys.executable,
        "-m",
        "mlsys_nb.inference.serve",
        "--model-dir",
        model_dir,
        "--max-num-seqs",
        str(max_num_seqs),
        "--max-num-batched-tokens",
        "512",
        "--max-waiting-requests",
        "4096",
        "--threads",
        str(threads),
        "--port",
    ]


async def _one(client, model, req, extra, t0, sem):
    delay = t0 + req.arrival_time - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    async with sem:
        start = time.perf_counter()
        stamps, text, usage = [], [], None
        stream = await client.completions.create(
            model=model,
            prompt=as_text(req.prompt_token_ids),
            max_tokens=req.max_tokens,
            temperature=0,
            stream=True,
            extra_body=extra,
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].text:
                stamps.append(time.perf_counter())
                text.append(chunk.choices[0].text)
            if getattr(chunk, "usage", None):
                usage = chunk.usage
    # latency and TTFT count from the scheduled arrival (queueing in the client counts, as in vLLM's benchmark)
    arrival = min(t0 + req.arrival_time, start)
    n = usage.completion_tokens if usage else len(stamps)
    return {
        "ttft": stamps[0] - arrival,
        "e2e": stamps[-1] - arrival,
        "itl": [b - a for a, b in zip(stamps, stamps[1:])],
        "tokens": n,
        "prompt_tokens": len(req.prompt_token_ids),
        "text": "".join(text).split(),
    }


async def _bench(url, model, reqs, concurrency, extra):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none", timeout=TIMEOUT_S, max_retries=0)
    sem = asyncio.Semaphore(concurrency)
    t0 = time.perf_counter()
    try:
        res = await asyncio.wait_for(
            asyncio.gather(*(_one(client, model, r, extra, t0, sem) for r in reqs)), timeout=TIMEOUT_S
        )
    finally:
        await client.close()
    return res, time.perf_counter() - t0


def bench_server(server: ServerProcess, model: str, reqs, concurrency: int, extra: dict | None = None) -> tuple:
    """Replay ``reqs`` (their arrival times) against ``server``; -> (vLLM-style metrics dict, completions as
    word lists)."""
    from mlsys_nb.inference.metrics import percentile

    cpu0 = server.cpu_seconds()
    res, secs = asyncio.run(_bench(server.url, model, reqs, concurrency, extra or {}))
    cpu = server.cpu_seconds() - cpu0
    ms = 1e3
    ttft = [r["ttft"] * ms for r in res]
    tpot = [(r["e2e"] - r["ttft"]) * ms / (r["tokens"] - 1) for r in res if r["tokens"] > 1]
    itl = [g * ms for r in res for g in r["itl"]]
    tokens = sum(r["tokens"] for r in res)
    row = {
        "requests": len(res),
        "duration_s": secs,
        "server_cpu_s": cpu,
        "output_tokens": tokens,
        "output_tokens_per_s": tokens / secs,
        "request_rate": len(res) / secs,
        "exact_lengths": sum(r["tokens"] == q.max_tokens for r, q in zip(res, reqs)),
    }
    for name, xs in (("ttft", ttft), ("tpot", tpot), ("itl", itl)):
        row[f"{name}_mean"] = sum(xs) / len(xs) if xs else float("nan")
        for p in (50, 99):
            row[f"{name}_p{p}"] = percentile(xs, p) if xs else float("nan")
    return row, [r["text"] for r in res]
