"""Serving throughput: the engine vs the transformers peers a user would pick, and engine ablations.

    .venv/bin/python benchmarks/serving.py [--quick] [--sizes small,135m] [--repeats 3] [--no-servers]
                                           [--out data/measured/serving.md]  (no --out: print only)

Offline (every request at t=0, greedy, every request producing exactly its output length, at most ``--batch``
sequences in flight unless a row says otherwise), on random weights, all systems in one process on the same
weights, run round-robin ``--repeats`` times (the median run is shown):

- ``small`` preset (its RoPE table extended to 512 positions): 64 requests, prompt and output lengths uniform in
  16-256; ``135m``: SmolLM2-135M's shape (``LlamaConfig``: hidden 576, 30 layers, 9 heads, 3 KV heads,
  intermediate 1536, vocab 49152, tied embeddings; built without the network, converted with ``from_hf``),
  compute-bound on one thread, so a small workload: 32 requests, prompts 8-16, outputs 8-16, one repeat.
- ``engine`` (``LLM``: continuous batching, chunked prefill, prefix caching), its ablations on ``small``
  (static batching, no prefix caching) and with 4x as many sequences in flight;
- ``transformers generate (static)``: ``to_hf(model)``, batches in arrival order, left-padded,
  ``generate(do_sample=False)`` for the longest output of the batch (the waste of static batching), batches
  of ``--batch`` and of 4x that;
- ``transformers continuous batching``: ``init_continuous_batching`` with a persistent, warmed manager and
  an explicit paged cache (``benchmarks/_peers.py``), at ``--batch`` and 4x that sequences per batch.

Each row gives wall seconds, output tokens/s, the process CPU seconds of the run (every thread, so the
transformers manager's thread counts) and output tokens per CPU second.

Servers (not in ``--quick``; ``--no-servers`` skips them): the same weights saved as a checkpoint directory
with a word-level tokenizer, served by the kit's server (``python -m mlsys_nb.inference.serve --model-dir``,
uvicorn on 127.0.0.1), ``transformers serve`` and ``transformers serve --continuous-batching`` (explicit
cache size), all three running at once (``HF_HUB_OFFLINE=1``, each with a start timeout and killed with its
process group at the end, also on error); the ``openai`` client streams ``/v1/completions``. A burst of 32
requests at 32 concurrent (``small``: prompts 16-64, outputs 16-32; ``135m``: prompts 8-16, outputs 8-16),
then on ``small`` a request-rate sweep (16 requests per rate, Poisson arrivals), each point round-robin over
the three servers. Reported as vLLM's ``benchmark_serving`` does: output token throughput, TTFT, TPOT
(excluding the first token) and ITL mean/p50/p99, and the server process's CPU seconds.

Then, on ``small``: a torch.profiler profile of 20 steps of transformers' continuous batching taken inside its
generation thread (the ops that take its time per step), and the engine's CPU overhead of a decode step by phase
with the overlap-scheduling closed form. ``--output-len``, ``--no-ablations``, ``--server-requests`` and
``--rates`` shrink the run on a loaded machine (the record states the command).
``--profile-step``: only a profile of one decode step of the engine per size (``--profile-batch`` running
sequences, 64-token prompts on ``small``, 16 on ``135m``): the engine's phase timers, torch.profiler's top ops by
self CPU time and the CPU time inside ranges put around scheduling, prepare, the model forward, the attention
layers and sampling (``profile_ranges``), and transformers' own decode step at the same batch, interleaved (wall and CPU).
``--attention-ab``: only the engine's decode step with ``attention_backend="gather"`` (decodes in groups of
``DECODE_GROUP``) and ``"varlen"`` (all decodes in one call per layer) side by side, at 4, 16 and 64 running
sequences (``--sizes``, ``tiny`` allowed here), steps of the two engines interleaved, process CPU time.
``--compile``: two more offline rows, the engine with ``EngineConfig.compile=True`` (the forward compiled by
``torch.compile``/inductor, attention one opaque op: ``inference/compiled.py``) at ``--batch`` and 4x, in the same
round-robin; its one compile is paid in a warm-up run before the timed runs and reported with the graph count. The
peers get the same chance where transformers' API allows: static ``generate`` compiled (a static cache and a
``CompileConfig`` with its ``_compile_all_devices`` switch: ``generate`` compiles only on accelerators otherwise) and
its continuous batching compiled (``default_compile_level=1``), at 4x ``--batch``, each warmed on the workload first.
``--mixed``: issue 49's mixed workload instead (64 requests at t=0, prompts 8-64, outputs 16-96; the peer is one
static batch of 64). ``--phases``: only the decode-step CPU time per phase (schedule, prepare, forward: attention
and the rest, sample, update; thread CPU time of each part, ``CPUPhases``) of the eager and the compiled engine beside
transformers' own decode step, interleaved, at 8, 32 and 64 sequences, with the compiled forward's generated kernels.
``--quick``: 4 short requests on ``tiny`` (offline systems, step profile, HF profile, overhead table), no servers,
no record.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GOALS = {"small": 3.0, "135m": 1.5}  # issue 30: engine vs static generate at 64 in flight (batches of 64)
MIXED_GOAL = 2.0  # issue 49: compiled engine vs one static batch of 64 on the mixed workload (--mixed)
MIXED = dict(n=64, prompt_len=(8, 64), output_len=(16, 96))  # issue 49's mixed-length workload, all at t=0
SERVER_GOAL = 5.0  # issue 30: the kit's server vs `transformers serve` at 32 concurrent requests


def smollm2_135m_shape(seq_len: int = 512, seed: int = 0):
    """A transformers ``LlamaForCausalLM`` with SmolLM2-135M's configuration and random weights (seeded), and the
    kit's ``Transformer`` with the same weights (``from_hf``). ``seq_len``: the positions built (its 8192 cut)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from mlsys_nb.models import from_hf

    hc = LlamaConfig(
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=seq_len,
    )
    torch.manual_seed(seed)
    hf = LlamaForCausalLM(hc).eval()
    return hf, from_hf(hf)


def run_engine(model, reqs, batch, **kw):
    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.metrics import summarize
    from mlsys_nb.inference.workload import run_workload

    eng = LLMEngine(model, max_num_seqs=batch, max_num_batched_tokens=512, **kw)  # on CUDA: graphs captured here
    outs, secs = run_workload(eng, reqs, realtime=False, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [r.max_tokens for r in reqs]
    return summarize(outs, secs), [o.outputs[0].token_ids for o in outs]


def hf_compile_config():
    """transformers' ``CompileConfig`` for static-cache ``generate`` on a CPU: ``generate`` compiles its decode
    forward only on cuda/xpu/neuron/tpu unless ``_compile_all_devices`` (its own switch, set on the instance) is on."""
    from transformers import CompileConfig

    cc = CompileConfig(fullgraph=False, dynamic=False)
    cc._compile_all_devices = True
    return cc


class CompiledCBModel:
    """``hf`` as ``_peers.HFContinuousBatching`` sees it, with transformers' own compile of its continuous batching
    switched on (``ContinuousBatchingConfig.default_compile_level = 1``: ``torch.compile`` mode "default",
    ``dynamic=True``, on its varlen path; its decode fast path needs flash attention, absent on a CPU)."""

    def __init__(self, hf):
        self.hf = hf

    def init_continuous_batching(self, generation_config, continuous_batching_config):
        continuous_batching_config.default_compile_level = 1
        return self.hf.init_continuous_batching(
            generation_config=generation_config, continuous_batching_config=continuous_batching_config
        )


def run_hf(hf, reqs, batch, compile=False):
    """transformers' static ``generate`` in batches of ``batch`` (left-padded; each batch runs to its longest
    output); ``compile``: a static cache and ``hf_compile_config`` (its decode forward through inductor)."""
    from mlsys_nb.runtime.timing import Laps

    extra = {"cache_implementation": "static", "compile_config": hf_compile_config()} if compile else {}
    clock, tokens, outs = Laps(), 0, []
    for i in range(0, len(reqs), batch):
        group = reqs[i : i + batch]
        width = max(len(r.prompt_token_ids) for r in group)
        ids = torch.tensor(
            [[0] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids for r in group], device=hf.device
        )
        mask = torch.tensor(
            [[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids) for r in group], device=hf.device
        )
        n = max(r.max_tokens for r in group)
        with torch.inference_mode():
            out = hf.generate(
                ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **extra
            )
        outs += [out[j, width : width + r.max_tokens].tolist() for j, r in enumerate(group)]
        tokens += sum(r.max_tokens for r in group)
    secs = clock.elapsed()
    return {"duration_s": secs, "output_tokens_per_s": tokens / secs}, outs


def with_cpu(fn):
    """``fn()`` -> (row, outputs), with the process CPU seconds of the call added to the row."""
    c0 = time.process_time()
    row, outs = fn()
    row["cpu_s"] = time.process_time() - c0
    return row, outs


def cpu_overhead_table(model, batch_sizes, steps) -> list[str]:
    """Median phase times of pure decode steps per batch size, and the overlap-scheduling model on them."""
    from mlsys_nb.inference.engine import PHASES, LLMEngine
    from mlsys_nb.inference.metrics import measure_decode_overhead, overlap_speedup

    rows = measure_decode_overhead(
        lambda: LLMEngine(model, max_num_seqs=max(batch_sizes)), batch_sizes, prompt_len=64, steps=steps
    )
    out = [
        "",
        f"CPU overhead of a decode step (64-token prompts, median of {steps} decode steps; ms):",
        "",
        "| batch | " + " | ".join(PHASES) + " | CPU (all but model) | CPU share | overlap speed-up (model) |",
        "|---" * (len(PHASES) + 4) + "|",
    ]
    for r in rows:
        out.append(
            f"| {r['batch']} | "
            + " | ".join(f"{1e3 * r[p]:.3f}" for p in PHASES)
            + f" | {1e3 * r['cpu']:.3f} | {r['cpu_share']:.0%} | {overlap_speedup(r['cpu'], r['model']):.2f}x |"
        )
    out += [
        "",
        "Overlap speed-up = (cpu + model) / max(cpu, model): the closed form of preparing step N+1 while "
        "step N runs, applied to the measured phases (a model: on a CPU the model runs on the same cores).",
    ]
    return out


PROFILE_RANGES = {  # profiler ranges put around the engine's parts for --profile-step (restored afterwards)
    "scheduling": ("mlsys_nb.inference.engine", "LLMEngine", "_schedule"),
    "prepare": ("mlsys_nb.inference.model_runner", "ModelRunner", "prepare"),
    "attention layer (K/V write + read + paged attention)": ("mlsys_nb.inference.step_batch", "StepBatch", "attend"),
    "paged attention (gather + SDPA)": ("mlsys_nb.inference.step_batch", None, "paged_attention"),
    "varlen decode attention (gather + one SDPA + merge)": (
        "mlsys_nb.inference.step_batch",
        None,
        "paged_decode_attention_varlen",
    ),
    "sampling": ("mlsys_nb.inference.engine", None, "sample"),
}


@contextlib.contextmanager
def wrapped(targets: dict, wrap):
    """Replace each target {name: (module, class or None, attribute)} by ``wrap(name)(original)`` (a module
    attribute or a class method, in this process only), restored on exit."""
    import importlib

    saved = []
    try:
        for name, (mod, cls, attr) in targets.items():
            owner = importlib.import_module(mod)
            owner = getattr(owner, cls) if cls else owner
            saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, wrap(name)(saved[-1][2]))
        yield
    finally:
        for owner, attr, fn in reversed(saved):
            setattr(owner, attr, fn)


def profile_ranges():
    """Wrap each part in ``PROFILE_RANGES`` in a profiler range of that name (``runtime.profiling.ranged``), so a
    profile shows each part's CPU time."""
    from mlsys_nb.runtime.profiling import ranged

    return wrapped(PROFILE_RANGES, ranged)


PHASE_TIMERS = {  # the parts of a decode step timed by --phases (thread CPU seconds, inclusive; nested ones inside)
    "step": ("mlsys_nb.inference.engine", "LLMEngine", "step"),
    "schedule": ("mlsys_nb.inference.engine", "LLMEngine", "_schedule"),
    "prepare": ("mlsys_nb.inference.model_runner", "ModelRunner", "prepare"),
    "forward": ("mlsys_nb.inference.model_runner", "ModelRunner", "forward"),
    "attention": ("mlsys_nb.inference.step_batch", "StepBatch", "attend"),
    "sdpa": ("torch.nn.functional", None, "scaled_dot_product_attention"),
    "sample": ("mlsys_nb.inference.engine", "LLMEngine", "_sample"),
}


class CPUPhases:
    """Per-part thread CPU seconds (``time.thread_time``: this thread only, so a neighbour's load does not count;
    with one torch thread the step's whole work) accumulated while ``timing()`` is active; ``take()`` returns and
    clears them. A part's time includes the parts it calls (attention inside forward, SDPA inside attention)."""

    def __init__(self):
        self.acc: dict = {}

    def wrap(self, name):
        def deco(fn):
            def inner(*args, **kwargs):
                t = time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.acc[name] = self.acc.get(name, 0.0) + time.thread_time() - t

            return inner

        return deco

    def timing(self):
        return wrapped(PHASE_TIMERS, self.wrap)

    def take(self) -> dict:
        out, self.acc = self.acc, {}
        return out


class HFDecoder:
    """transformers' own decode loop at batch ``len(prompts)`` (equal-length prompts, no padding): one forward over
    the prompts into a ``DynamicCache``, then ``step()`` = one greedy decode step (a forward of one token per
    sequence with the cache, as ``generate`` runs it)."""

    def __init__(self, hf, prompts):
        from transformers import DynamicCache

        self.hf, self.cache = hf, DynamicCache()
        with torch.inference_mode():
            out = hf(input_ids=torch.tensor(prompts), past_key_values=self.cache, use_cache=True)
        self.next = out.logits[:, -1:].argmax(-1)

    def step(self) -> None:
        with torch.inference_mode():
            out = self.hf(input_ids=self.next, past_key_values=self.cache, use_cache=True)
        self.next = out.logits[:, -1:].argmax(-1)


def profile_engine_step(
    model, hf, batch: int, prompt_len: int, steps: int, top: int = 12, attention_backend: str = "gather"
) -> list[str]:
    """One decode step of the kit's engine at ``batch`` running sequences (``prompt_len``-token prompts, every
    prompt prefilled first), three ways: the engine's own phase timers (wall, median of ``steps`` unprofiled steps),
    torch.profiler over ``steps`` further steps (the ops with the most self CPU time, and the CPU time inside the
    ranges of ``PROFILE_RANGES`` and the engine's ``engine.model``), and transformers' decode step at the same batch
    (``HFDecoder``), timed interleaved with the engine's (wall and process CPU seconds). -> markdown lines."""
    from statistics import median

    from mlsys_nb.inference.engine import PHASES, LLMEngine
    from mlsys_nb.inference.sampling_params import SamplingParams
    from mlsys_nb.runtime.profiling import light_profile

    eng = LLMEngine(model, max_num_seqs=batch, max_num_batched_tokens=512, attention_backend=attention_backend)
    prompts = [[(7 * i + j) % 200 + 1 for j in range(prompt_len)] for i in range(batch)]
    sp = SamplingParams(temperature=0, max_tokens=2 * steps + 8, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"p{i}", p, sp)

    def decoding(st):
        return st["num_seqs"] == batch and st["num_decodes"] == st["num_tokens"] == batch

    for _ in range(batch * prompt_len // 512 + batch + 2):  # prefill until every sequence decodes, then one more
        eng.step()
        if decoding(eng.step_times[-1]):
            break
    else:
        raise RuntimeError(f"the engine never ran {batch} decodes in one step")
    eng.step()
    hf_dec = HFDecoder(hf, prompts)
    hf_dec.step()  # warm
    eng.step_times.clear()
    times = {"engine": [], "hf": []}  # (wall s, process CPU s) per decode step, the two interleaved
    for _ in range(steps):
        for name, fn in (("engine", eng.step), ("hf", hf_dec.step)):
            w, c = time.perf_counter(), time.process_time()
            fn()
            times[name].append((time.perf_counter() - w, time.process_time() - c))
    timed = [st for st in eng.step_times if decoding(st)]
    phase_ms = {ph: 1e3 * median(st.get(ph, 0.0) for st in timed) for ph in PHASES}
    wall = {k: 1e3 * median(t[0] for t in v) for k, v in times.items()}
    cpu = {k: 1e3 * median(t[1] for t in v) for k, v in times.items()}
    with profile_ranges(), light_profile("cpu") as prof:
        for _ in range(steps):
            eng.step()
    ev = {e.key: e for e in prof.key_averages()}
    ranges = {"engine.step", "engine.model", *PROFILE_RANGES}
    ops = [e for k, e in ev.items() if k not in ranges]
    total = sum(e.self_cpu_time_total for e in ops)  # us over the profiled steps

    def per_step(name):
        return 1e-3 * ev[name].cpu_time_total / steps if name in ev else float("nan")

    step_ms = sum(phase_ms.values())
    cfg = model.cfg
    lines = [
        "",
        f"Decode step of the kit's engine, {batch} running sequences, {prompt_len}-token prompts, "
        f"{sum(p.numel() for p in model.parameters()):,} parameters ({cfg.n_layers} layers, hidden {cfg.hidden}), "
        f"torch threads {torch.get_num_threads()}, attention_backend {attention_backend!r}:",
        "",
        f"Engine phase timers (wall, median of {len(timed)} unprofiled decode steps): "
        + ", ".join(f"{ph} {phase_ms[ph]:.2f} ms" for ph in PHASES)
        + f"; step {step_ms:.2f} ms, model {phase_ms['model'] / step_ms:.0%} of it.",
        "",
        f"torch.profiler (CPU) over the next {steps} decode steps: time inside each range per step (the profiler's "
        "clock: elapsed time on the engine's thread, so a share of a busy machine's core shows as longer ops; a range "
        "includes the ops it calls; the profiler's own cost included):",
        "",
        "| range | ms per step | share of `engine.step` | of which outside any torch op or inner range (ms) |",
        "|---|---|---|---|",
    ]
    whole = per_step("engine.step")
    for name in ["engine.step", "scheduling", "prepare", "engine.model", *list(PROFILE_RANGES)[2:5], "sampling"]:
        if name not in ev:  # a range this configuration never enters (the other attention backend's)
            continue
        own = 1e-3 * ev[name].self_cpu_time_total / steps
        lines.append(f"| {name} | {per_step(name):.2f} | {per_step(name) / whole:.0%} | {own:.2f} |")
    lines += [
        "",
        f"The ops with the most self time ({1e-3 * total / steps:.1f} ms of profiled self time in torch ops per step):",
        "",
        "| op | calls per step | self time per step (ms) | share |",
        "|---|---|---|---|",
    ]
    for e in sorted(ops, key=lambda e: -e.self_cpu_time_total)[:top]:
        lines.append(
            f"| `{e.key}` | {e.count / steps:.1f} | {1e-3 * e.self_cpu_time_total / steps:.3f} | "
            f"{e.self_cpu_time_total / total:.0%} |"
        )
    lines += [
        "",
        f"Beside transformers' own decode step at the same batch and prompts (a forward of one token per sequence "
        f"with a `DynamicCache`, as `generate` runs it), interleaved step by step with the engine's, median of {steps}: "
        f"engine {wall['engine']:.2f} ms wall / {cpu['engine']:.2f} ms process CPU, transformers {wall['hf']:.2f} ms "
        f"wall / {cpu['hf']:.2f} ms CPU: the engine's step takes {cpu['engine'] / cpu['hf']:.2f}x the CPU time "
        f"({wall['engine'] / wall['hf']:.2f}x the wall time).",
    ]
    return lines


def decoding_engine(model, batch: int, prompt_len: int, steps: int, **options):
    """An ``LLMEngine`` with ``batch`` sequences running (prompts of ``prompt_len`` minus 0-6 times
    ``prompt_len // 12`` tokens, so context lengths differ), every prompt prefilled and one decode step run, with
    ``steps + 8`` decode steps left; -> (engine, prompts)."""
    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.sampling_params import SamplingParams

    eng = LLMEngine(model, max_num_seqs=batch, max_num_batched_tokens=512, **options)
    prompts = [[(7 * i + j) % 200 + 1 for j in range(prompt_len - (i % 7) * (prompt_len // 12))] for i in range(batch)]
    sp = SamplingParams(temperature=0, max_tokens=steps + 8, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"p{i}", p, sp)
    for _ in range(-(-sum(map(len, prompts)) // 512) + 2):  # every prompt prefilled, then a decode step
        eng.step()
    return eng, prompts


PHASE_COLS = ("schedule", "prepare", "forward: attention", "of which SDPA", "forward: rest", "sample", "update")


def phase_table(model, hf, batch_sizes, steps: int, prompt_len: int) -> list[str]:
    """Decode-step CPU time per phase (``CPUPhases``: thread CPU ms, median over ``steps`` steps) of the engine
    eager and compiled (``EngineConfig.compile``) and of transformers' own decode step (``HFDecoder``, equal-length
    prompts, a ``DynamicCache``), the three interleaved step by step, at each batch size. Attention = the engine's
    ``StepBatch.attend`` (K/V write + gather + mask + SDPA) or transformers' SDPA calls; forward: rest = the forward
    minus attention (matmuls, norms, RoPE, SwiGLU, LM head); update = the step minus the other phases (the scheduler's
    update, outputs, the pool's sync). -> markdown lines."""
    from statistics import median

    from mlsys_nb.inference.compiled import compiled_model

    timer = CPUPhases()
    lines = [
        "",
        "| running sequences | system | " + " | ".join(PHASE_COLS) + " | step CPU ms | vs transformers' step |",
        "|---" * (len(PHASE_COLS) + 4) + "|",
    ]
    for batch in batch_sizes:
        engines = {
            name: decoding_engine(model, batch, prompt_len, steps, **kw)[0]
            for name, kw in (("engine, eager", {}), ("engine, compiled", {"compile": True}))
        }
        prompts = [[(7 * i + j) % 200 + 1 for j in range(prompt_len)] for i in range(batch)]
        hf_dec = HFDecoder(hf, prompts)
        hf_dec.step()
        graphs = compiled_model(model).stats["graphs"]
        per = {name: [] for name in [*engines, "transformers decode step"]}
        with timer.timing():
            for _ in range(steps):
                for name, eng in engines.items():
                    timer.take()
                    eng.step()
                    per[name].append(timer.take())
                t = time.thread_time()
                hf_dec.step()
                per["transformers decode step"].append({"step": time.thread_time() - t, **timer.take()})
        if compiled_model(model).stats["graphs"] != graphs:
            raise RuntimeError("the compiled engine recompiled during the phase measurement")
        if batch == batch_sizes[0]:
            from mlsys_nb.inference.compiled import generated_kernels

            code = generated_kernels()
            lines.insert(
                1,
                f"The compiled forward's generated code: {code['attention_calls']} attention calls (the opaque op, one "
                f"per layer), library calls {code['extern']}, {len(code['fused'])} generated C++ kernels called "
                f"{code['fused_calls']} times: " + ", ".join(f"`{k}`" for k in code["fused"]) + ".\n",
            )
        hf_ms = 1e3 * median(d["step"] for d in per["transformers decode step"])
        for name, rows in per.items():
            ph = {}
            for d in rows:
                d = {k: d.get(k, 0.0) for k in ("step", *PHASE_TIMERS)}
                split = {
                    "schedule": d["schedule"],
                    "prepare": d["prepare"],
                    "forward: attention": d["attention"] or d["sdpa"],
                    "of which SDPA": d["sdpa"],
                    "forward: rest": (d["forward"] - d["attention"]) if d["forward"] else d["step"] - d["sdpa"],
                    "sample": d["sample"],
                    "update": d["step"] - d["schedule"] - d["prepare"] - d["forward"] - d["sample"]
                    if d["forward"]
                    else 0.0,
                    "step": d["step"],
                }
                for k, v in split.items():
                    ph.setdefault(k, []).append(1e3 * v)
            med = {k: median(v) for k, v in ph.items()}
            cells = " | ".join(f"{med[c]:.2f}" for c in PHASE_COLS)
            lines.append(f"| {batch} | {name} | {cells} | {med['step']:.2f} | {med['step'] / hf_ms:.2f}x |")
    return lines


def attention_ab(model, batch_sizes, steps: int, prompt_len: int, variants=None) -> list[str]:
    """Decode steps of two engines on the same weights and prompts, ``attention_backend`` "gather" and "varlen"
    (``variants``: another pair, {name: engine options}, e.g. eager vs ``compile=True``), one step of each in turn
    (``steps`` each, after every prompt is prefilled; prompts of ``prompt_len`` minus 0-6 times ``prompt_len // 12``
    tokens, so context lengths differ), process CPU time per step. -> markdown lines (a table)."""
    from statistics import median

    variants = variants or {"gather": {"attention_backend": "gather"}, "varlen": {"attention_backend": "varlen"}}
    a, b = variants
    lines = [
        "",
        f"| running sequences | context tokens per sequence | `{a}` step, CPU ms (median) | `{b}` step, CPU ms "
        f"(median) | {a} / {b} |",
        "|---|---|---|---|---|",
    ]
    for batch in batch_sizes:
        engines = {}
        for backend, options in variants.items():
            engines[backend], prompts = decoding_engine(model, batch, prompt_len, steps, **options)
        cpu = {k: [] for k in engines}
        for _ in range(steps):
            for k, eng in engines.items():
                c = time.process_time()
                eng.step()
                cpu[k].append(time.process_time() - c)
        g, v = (1e3 * median(cpu[k]) for k in (a, b))
        ctx = f"{min(map(len, prompts))}-{max(map(len, prompts)) + steps + 2}"
        lines.append(f"| {batch} | {ctx} | {g:.2f} | {v:.2f} | {g / v:.2f}x |")
    return lines


def offline_section(
    preset,
    model,
    hf,
    reqs,
    batch,
    repeats,
    ablations,
    threads,
    seed,
    stack,
    cb_batches=None,
    attention_backend="gather",
    compile=False,
) -> tuple[list[str], dict, dict]:
    """Every offline system round-robin ``repeats`` times on ``reqs``; -> (markdown lines, rows by name).
    ``cb_batches``: the sequences per batch of the transformers continuous-batching rows (default ``batch`` and 4x);
    their managers are returned ({sequences per batch: manager}), to be stopped by the caller's ExitStack ``stack``."""
    from _peers import HFContinuousBatching

    big = 4 * batch
    max_len = max(len(r.prompt_token_ids) + r.max_tokens for r in reqs)
    systems = [("engine", batch, {})]
    if ablations:
        systems += [
            ("engine, static batching", batch, {"continuous_batching": False}),
            ("engine, no prefix caching", batch, {"enable_prefix_caching": False}),
        ]
    systems.append((f"engine, {big} in flight", big, {}))
    if next(model.parameters()).is_cuda:  # the default engine captures CUDA-graph decode; these rows do not
        systems += [
            ("engine, enforce_eager", batch, {"enforce_eager": True}),
            (f"engine, {big} in flight, enforce_eager", big, {"enforce_eager": True}),
        ]
    if attention_backend != "gather":  # the same engine with another attention backend, in the same round-robin
        systems.append((f"engine, {big} in flight, {attention_backend}", big, {"attention_backend": attention_backend}))
    warm = []
    if compile:  # EngineConfig.compile: the compiled engine beside eager in the same round-robin, compiled first
        from mlsys_nb.inference.compiled import compiled_model

        systems += [
            ("engine, compiled", batch, {"compile": True}),
            (f"engine, {big} in flight, compiled", big, {"compile": True}),
        ]
        t0 = time.perf_counter()
        run_engine(model, reqs[:2], batch, compile=True)  # warm-up: the one compile (one graph for every batch size)
        st = dict(compiled_model(model).stats)
        warm.append(
            f"Compiled engine: {st['graphs']} graph(s), compile {st['compile_seconds']:.1f} s "
            f"(warm-up run {time.perf_counter() - t0:.1f} s), paid once before the timed runs."
        )
    hf_name = f"transformers generate (static), batches of {batch}"
    runs = [(name, lambda b=b, kw=kw: run_engine(model, reqs, b, **kw)) for name, b, kw in systems]
    runs += [
        (hf_name, lambda: run_hf(hf, reqs, batch)),
        (f"transformers generate (static), batches of {big}", lambda: run_hf(hf, reqs, big)),
    ]
    managers = {}
    for b in cb_batches or (batch, big):  # persistent, warmed managers, stopped by the caller (also on error)
        managers[b] = cb = HFContinuousBatching(hf, b, max_len)
        stack.callback(cb.close)
        runs.append((f"transformers continuous batching, {b} per batch", lambda cb=cb: cb.run(reqs)))
    if compile:  # the peers compiled too, where transformers' API allows: each warmed on the workload first
        warm += compiled_peers(hf, reqs, big, max_len, stack, runs)
    results: dict = {name: [] for name, _ in runs}
    from torch._dynamo.utils import counters

    graphs = counters["stats"]["unique_graphs"]
    for _ in range(repeats):  # round-robin, so slow phases of a shared machine hit every system alike
        for name, fn in runs:
            results[name].append(with_cpu(fn))
    if compile:
        warm.append(
            f"Graphs dynamo compiled during the timed runs (every system): {counters['stats']['unique_graphs'] - graphs}."
        )
    rows, outputs = {}, {}
    for name, res in results.items():  # the run with the median duration
        rows[name], outputs[name] = sorted(res, key=lambda x: x[0]["duration_s"])[len(res) // 2]
    if compile:
        st = compiled_model(model).stats
        warm.append(f"Graphs after the timed runs: {st['graphs']} (every batch size ran on the graph(s) above).")
    base = rows[hf_name]["output_tokens_per_s"]
    useful = sum(r.max_tokens for r in reqs)
    lo_p, hi_p = min(len(r.prompt_token_ids) for r in reqs), max(len(r.prompt_token_ids) for r in reqs)
    lo_o, hi_o = min(r.max_tokens for r in reqs), max(r.max_tokens for r in reqs)
    lines = [
        f"Offline, `{preset}` ({sum(p.numel() for p in model.parameters()):,} parameters, context "
        f"{model.cfg.seq_len}): {len(reqs)} requests, prompt lengths {lo_p}-{hi_p}, output lengths {lo_o}-{hi_o} "
        f"(seed {seed}), all at t=0, greedy, {useful} output tokens, torch threads {threads}, device "
        f"{next(model.parameters()).device}; each system run "
        f"{repeats}x round-robin, the median run shown. CPU s: the process's CPU seconds during the run.",
        "",
        "| system | seconds | output tokens/s | CPU s | tokens per CPU s | vs static generate "
        f"({batch}) | TTFT p50/p90/p99 (ms) | TPOT p50/p90/p99 (ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def pct(r, k):
        return "/".join(f"{r[f'{k}_p{p}']:.0f}" for p in (50, 90, 99)) if f"{k}_p50" in r else "n/a"

    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['duration_s']:.2f} | {r['output_tokens_per_s']:.1f} | {r['cpu_s']:.2f} | "
            f"{useful / r['cpu_s']:.1f} | {r['output_tokens_per_s'] / base:.2f}x | {pct(r, 'ttft_ms')} | "
            f"{pct(r, 'tpot_ms')} |"
        )
    same = {
        name: sum(x == y for x, y in zip(outputs["engine"], out)) for name, out in outputs.items() if name != "engine"
    }
    lines += [
        "",
        "Greedy outputs identical to the engine's: " + "; ".join(f"{k} {v}/{len(reqs)}" for k, v in same.items()) + ".",
        *(["", *warm] if warm else []),
    ]
    return lines, rows, managers


def compiled_peers(hf, reqs, big, max_len, stack, runs) -> list[str]:
    """Append transformers' static ``generate`` compiled (``run_hf(compile=True)``) and its continuous batching
    compiled (``CompiledCBModel``), both at ``big``, to ``runs``; each runs the workload once untimed first (its
    compiles: dynamo's graph count before and after). -> the record's lines on those warm-ups."""
    from _peers import HFContinuousBatching
    from torch._dynamo.utils import counters

    cb = HFContinuousBatching(CompiledCBModel(hf), big, max_len)
    stack.callback(cb.close)
    new = [
        (f"transformers generate (static, compiled), batches of {big}", lambda: run_hf(hf, reqs, big, compile=True)),
        (f"transformers continuous batching, compiled, {big} per batch", lambda: cb.run(reqs)),
    ]
    lines = []
    for name, fn in new:
        g0, t0 = counters["stats"]["unique_graphs"], time.perf_counter()
        fn()
        lines.append(
            f"{name}: warm-up run {time.perf_counter() - t0:.1f} s, {counters['stats']['unique_graphs'] - g0} graph(s) "
            "compiled by dynamo, before the timed runs."
        )
    runs += new
    return lines


def ratio_lines(preset, rows, batch, goal=None) -> list[str]:
    big = 4 * batch
    e, e_big = rows["engine"], rows[f"engine, {big} in flight"]
    s, s_big = (
        rows[f"transformers generate (static), batches of {batch}"],
        rows[f"transformers generate (static), batches of {big}"],
    )
    cb_big = rows[f"transformers continuous batching, {big} per batch"]
    tps = "output_tokens_per_s"
    goal = goal or GOALS.get(preset)
    w = e_big[tps] / s_big[tps]
    c = e_big["cpu_s"] and s_big["cpu_s"] / e_big["cpu_s"]
    out = [
        "",
        f"Ratios on `{preset}` (output tokens/s): engine vs static generate at {batch} in flight "
        f"{e[tps] / s[tps]:.2f}x; at {big} in flight (batches of {big}) {w:.2f}x on wall time, {c:.2f}x on CPU time"
        + (f" (goal >= {goal}x: {'met' if w >= goal else 'not met'})" if goal else "")
        + f"; transformers continuous batching ({big}) vs its static generate ({big}) {cb_big[tps] / s_big[tps]:.2f}x; "
        f"engine ({big}) vs transformers continuous batching ({big}) {e_big[tps] / cb_big[tps]:.2f}x.",
    ]
    comp = rows.get(f"engine, {big} in flight, compiled")
    if comp is not None and goal:
        w, c = comp[tps] / s_big[tps], s_big["cpu_s"] / comp["cpu_s"]
        out.append(
            f"Goal (issue 49): the compiled engine ({big} in flight) vs static generate (batches of {big}): {w:.2f}x "
            f"on wall time, {c:.2f}x on CPU time (goal >= {goal}x: {'met' if min(w, c) >= goal else 'not met'})."
        )
        peer = rows.get(f"transformers generate (static, compiled), batches of {big}")
        if peer is not None:
            out.append(
                f"The compiled engine ({big}) vs static generate compiled (batches of {big}): {comp[tps] / peer[tps]:.2f}x "
                f"on wall time, {peer['cpu_s'] / comp['cpu_s']:.2f}x on CPU time; static generate compiled vs eager: "
                f"{peer[tps] / s_big[tps]:.2f}x on wall time."
            )
    for name in [n for n in rows if n.startswith(f"engine, {big} in flight, ")]:
        r = rows[name]
        out.append(
            f"{name}: {r[tps] / s_big[tps]:.2f}x static generate ({big}) on wall time, "
            f"{s_big['cpu_s'] / r['cpu_s']:.2f}x on CPU time; {r[tps] / e_big[tps]:.2f}x the default engine ({big})."
        )
    if "engine, static batching" in rows:
        st, nc = rows["engine, static batching"][tps], rows["engine, no prefix caching"][tps]
        out.append(f"Engine vs its own static batching: {e[tps] / st:.2f}x; prefix caching on/off: {e[tps] / nc:.2f}x.")
    return out


def _mpp(r, k) -> str:
    return "/".join(f"{r[f'{k}_{s}']:.0f}" for s in ("mean", "p50", "p99"))


SERVER_COLS = "| server | rate (req/s) | requests | seconds | output tokens/s | server CPU s | TTFT mean/p50/p99 (ms) | TPOT mean/p50/p99 (ms) | ITL mean/p50/p99 (ms) |"


def server_section(preset, hf, reqs_burst, sweeps, threads, max_seqs) -> tuple[list[str], dict]:
    """The three OpenAI-compatible servers on the same checkpoint, all running at once; the burst and each sweep
    point round-robin over them. -> (markdown lines, {server: burst row})."""
    from _peers import ServerProcess, bench_server, kit_server_cmd, save_model_dir

    from mlsys_nb.runtime.ports import free_port

    exe = os.path.join(os.path.dirname(sys.executable), "transformers")
    max_len = max(len(r.prompt_token_ids) + r.max_tokens for rs in [reqs_burst, *sweeps.values()] for r in rs)
    blocks = str(max_seqs * -(-max_len // 32) + 1)
    rows: dict = {}
    with tempfile.TemporaryDirectory(prefix="serving-peers-") as tmp, contextlib.ExitStack() as stack:
        d = save_model_dir(hf, os.path.join(tmp, "model"))
        env = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads), "TRANSFORMERS_VERBOSITY": "error"}
        specs = {
            "kit server": (kit_server_cmd(d, max_seqs, threads), {"ignore_eos": True}),
            "transformers serve": ([exe, "serve", d, "--host", "127.0.0.1", "--device", "cpu", "--port"], {}),
            "transformers serve --continuous-batching": (
                [
                    exe,
                    "serve",
                    d,
                    "--host",
                    "127.0.0.1",
                    "--device",
                    "cpu",
                    "--continuous-batching",
                    "--cb-block-size",
                    "32",
                    "--cb-num-blocks",
                    blocks,
                    "--cb-max-batch-tokens",
                    "512",
                    "--port",
                ],
                {},
            ),
        }
        servers = {}
        for name, (cmd, extra) in specs.items():
            port = free_port()
            log = os.path.join(tmp, name.replace(" ", "_") + ".log")
            servers[name] = (
                stack.enter_context(ServerProcess(cmd + [str(port)], f"http://127.0.0.1:{port}", log, env=env)),
                extra,
            )
        for s, extra in servers.values():  # warm each once (lazy model load, first-request paths)
            bench_server(s, d, reqs_burst[:2], 2, extra)
        points = [("burst", math.inf, reqs_burst), *((f"rate {k}", k, v) for k, v in sweeps.items())]
        texts = {}
        lines = ["", SERVER_COLS, "|---|---|---|---|---|---|---|---|---|"]
        table = []
        for label, rate, reqs in points:
            for name, (s, extra) in servers.items():
                row, txt = bench_server(s, d, reqs, 32, extra)
                if label == "burst":
                    rows[name], texts[name] = row, txt
                if row["exact_lengths"] != len(reqs):
                    raise RuntimeError(f"{name}: {row['exact_lengths']}/{len(reqs)} requests produced max_tokens")
                table.append((name, rate, row))
    for name, rate, r in sorted(table, key=lambda t: (list(specs).index(t[0]), -1 if math.isinf(t[1]) else t[1])):
        lines.append(
            f"| {name} | {'inf (burst)' if math.isinf(rate) else rate} | {r['requests']} | {r['duration_s']:.2f} | "
            f"{r['output_tokens_per_s']:.1f} | {r['server_cpu_s']:.2f} | {_mpp(r, 'ttft')} | {_mpp(r, 'tpot')} | {_mpp(r, 'itl')} |"
        )
    kit = texts["kit server"]
    same = "; ".join(
        f"{k} {sum(a == b for a, b in zip(kit, v))}/{len(kit)}" for k, v in texts.items() if k != "kit server"
    )
    lo_p, hi_p = min(len(r.prompt_token_ids) for r in reqs_burst), max(len(r.prompt_token_ids) for r in reqs_burst)
    lo_o, hi_o = min(r.max_tokens for r in reqs_burst), max(r.max_tokens for r in reqs_burst)
    sweep_txt = (
        f"; then {', '.join(str(k) for k in sweeps)} requests/s (Poisson, {len(next(iter(sweeps.values())))} requests each)"
        if sweeps
        else ""
    )
    head = [
        f"Servers, `{preset}`: burst of {len(reqs_burst)} requests at t=0, 32 concurrent, prompts {lo_p}-{hi_p}, "
        f"outputs {lo_o}-{hi_o} tokens{sweep_txt}; greedy, streamed `/v1/completions` through the `openai` client, "
        f"every completion exactly max_tokens; one run per point, each point round-robin over the servers (all three "
        f"up at once; each warmed with 2 requests first); torch threads {threads} in every server. Server CPU s: "
        "user + system seconds of the server process during the point.",
    ]
    k, t = rows["kit server"]["output_tokens_per_s"], rows["transformers serve"]["output_tokens_per_s"]
    tail = [
        "",
        f"Burst completions identical to the kit server's: {same}. Kit server vs `transformers serve` at 32 "
        f"concurrent: {k / t:.2f}x output tokens/s (goal >= {SERVER_GOAL}x: {'met' if k / t >= SERVER_GOAL else 'not met'}); "
        f"vs `transformers serve --continuous-batching`: {k / rows['transformers serve --continuous-batching']['output_tokens_per_s']:.2f}x.",
    ]
    return head + lines + tail, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 short requests on the tiny preset, no servers")
    ap.add_argument("--sizes", default="small,135m", help="comma-separated: small, 135m")
    ap.add_argument("--requests", type=int, default=64, help="offline requests on small")
    ap.add_argument("--batch", type=int, default=16, help="sequences in flight at most (all systems)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="round-robin repeats on small; the median run is reported")
    ap.add_argument("--rates", default="1,4", help="request rates (req/s) of the server sweep on small")
    ap.add_argument("--server-requests", type=int, default=32, help="requests in the servers' burst (32 concurrent)")
    ap.add_argument("--output-len", default="16,256", help="LO,HI: output lengths of the offline workload on small")
    ap.add_argument("--no-ablations", action="store_true", help="skip the engine's static/no-prefix-cache rows")
    ap.add_argument("--no-servers", action="store_true", help="offline systems only")
    ap.add_argument("--profile-only", action="store_true", help="only the profile and the CPU-overhead table")
    ap.add_argument("--no-profile", action="store_true", help="skip the profile and the CPU-overhead table")
    ap.add_argument(
        "--profile-step",
        action="store_true",
        help="only the profile of one decode step of the engine (phase timers, torch.profiler ops and ranges, "
        "transformers generate's step beside it) per size, at --profile-batch running sequences",
    )
    ap.add_argument(
        "--attention-ab",
        action="store_true",
        help='only the decode step with attention_backend "gather" vs "varlen", interleaved, at 4, 16, 64 sequences',
    )
    ap.add_argument(
        "--attention-backend",
        default="gather",
        choices=("gather", "tiled", "varlen", "flex"),
        help="the engine's attention_backend in --profile-step; offline: an extra engine row with it (not gather)",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="offline: the engine with EngineConfig.compile (torch.compile, inductor) beside eager, at --batch and 4x; "
        "with --attention-ab: the decode step eager (gather) vs compiled (with --attention-backend) instead of gather "
        "vs varlen",
    )
    ap.add_argument(
        "--mixed",
        action="store_true",
        help="offline: issue 49's mixed workload instead (64 requests at t=0, prompts 8-64, outputs 16-96; goal: the "
        f"compiled engine >= {MIXED_GOAL}x one static batch of 64); add --compile for the compiled rows",
    )
    ap.add_argument(
        "--phases",
        action="store_true",
        help="only the decode-step CPU time per phase, eager vs compiled engine vs transformers' step, at 8, 32, 64",
    )
    ap.add_argument("--profile-batch", type=int, default=64, help="running sequences of --profile-step")
    ap.add_argument("--profile-steps", type=int, default=10, help="decode steps timed, then profiled (--profile-step)")
    ap.add_argument(
        "--out",
        default=None,
        help="append the results (markdown) to this file, e.g. data/measured/serving.md (default: print only; "
        "never in --quick mode)",
    )
    ap.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where the offline systems run (cuda: the engine with its default CUDA graphs and with enforce_eager; "
        "use with --no-servers --no-profile)",
    )
    a = ap.parse_args()
    if a.device == "cuda" and not (a.no_servers and a.no_profile):
        raise SystemExit("--device cuda: the servers and the profile run on the CPU; add --no-servers --no-profile")
    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    torch.set_num_threads(a.threads)
    from _peers import HFContinuousBatching, profile_hf_cb

    from mlsys_nb.config import load_model_preset
    from mlsys_nb.inference.workload import make_workload
    from mlsys_nb.models import Transformer, to_hf
    from mlsys_nb.runtime.machine import summary as machine

    sizes = ["tiny"] if a.quick else [s.strip() for s in a.sizes.split(",")]
    bad = [s for s in sizes if s not in ("small", "135m", "tiny") or (s == "tiny" and not (a.quick or a.attention_ab))]
    if bad:
        raise SystemExit(f"--sizes: {bad} not among small, 135m")
    lines, t_start = [], time.perf_counter()
    with contextlib.ExitStack() as stack:  # the transformers managers, stopped at the end (also on error)
        for size in sizes:
            torch.manual_seed(a.seed)
            if size == "135m":
                hf, model = smollm2_135m_shape(seed=a.seed)
                n, (p_lo, p_hi), (o_lo, o_hi), repeats = 32, (8, 16), (8, 16), a.repeats if a.mixed else 1
            else:
                tiny = a.quick or size == "tiny"
                cfg = load_model_preset("tiny") if tiny else load_model_preset("small").replace(seq_len=512)
                model = Transformer(cfg).eval()
                hf = to_hf(model)
                if a.quick:
                    n, (p_lo, p_hi), (o_lo, o_hi), repeats = 4, (4, 8), (4, 8), 1
                else:
                    o_lo, o_hi = (int(x) for x in a.output_len.split(","))
                    n, (p_lo, p_hi), repeats = a.requests, (16, 256), a.repeats
            model, hf = model.to(a.device), hf.to(a.device)
            if a.mixed:  # issue 49's mixed-length workload, whatever the model
                n, (p_lo, p_hi), (o_lo, o_hi) = MIXED["n"], MIXED["prompt_len"], MIXED["output_len"]
            reqs = make_workload(n, prompt_len=(p_lo, p_hi), output_len=(o_lo, o_hi), vocab_size=256, seed=a.seed)
            t0, managers = time.perf_counter(), {}
            lines += ["", f"### `{size}`"]
            if a.phases:
                b_sizes, plen = ((4,) if a.quick else (8, 32, 64)), (8 if a.quick else 64 if size != "135m" else 16)
                lines += phase_table(model, hf, b_sizes, 2 if a.quick else a.profile_steps, plen)
                lines.append(f"(phases: {time.perf_counter() - t0:.0f} s)")
                continue
            if a.attention_ab:
                b_sizes, plen = (((8, 32, 64) if a.compile else (4, 16, 64)), 64) if size != "135m" else ((64,), 16)
                backend = a.attention_backend
                name = "compiled" if backend == "gather" else f"compiled, {backend}"
                pair = {"eager": {}, name: {"compile": True, "attention_backend": backend}} if a.compile else None
                lines += attention_ab(model, b_sizes, a.profile_steps, plen, pair)
                lines.append(f"(attention A/B: {time.perf_counter() - t0:.0f} s)")
                continue
            if a.profile_step or a.quick:  # the engine's decode step (in --quick: 4 sequences of tiny, 2 steps)
                b, plen = (4, 8) if a.quick else (a.profile_batch, 64 if size == "small" else 16)
                lines += profile_engine_step(
                    model, hf, b, plen, 2 if a.quick else a.profile_steps, 12, a.attention_backend
                )
                lines.append(f"(engine step profile: {time.perf_counter() - t0:.0f} s)")
                if a.profile_step:
                    continue
            ablate = size != "135m" and not a.no_ablations
            cb_batches = (4 * a.batch,) if a.quick else None  # quick: one manager (each costs a gc.collect on stop)
            if not a.profile_only:
                sec, rows, managers = offline_section(
                    size,
                    model,
                    hf,
                    reqs,
                    a.batch,
                    repeats,
                    ablate,
                    a.threads,
                    a.seed,
                    stack,
                    cb_batches,
                    a.attention_backend,
                    a.compile,
                )
                lines += ["", *sec, *ratio_lines(size, rows, a.batch, MIXED_GOAL if a.mixed else None)]
                lines.append(f"(offline section: {time.perf_counter() - t0:.0f} s)")
            if not a.quick and not a.no_servers and not a.profile_only:
                t0 = time.perf_counter()
                if size == "135m":
                    burst = make_workload(
                        a.server_requests, prompt_len=(8, 16), output_len=(8, 16), vocab_size=256, seed=a.seed + 1
                    )
                    sweeps = {}
                else:
                    burst = make_workload(
                        a.server_requests, prompt_len=(16, 64), output_len=(16, 32), vocab_size=256, seed=a.seed + 1
                    )
                    sweeps = {
                        float(r): make_workload(
                            16, rate=float(r), prompt_len=(16, 64), output_len=(16, 32), vocab_size=256, seed=a.seed + 2
                        )
                        for r in a.rates.split(",")
                    }
                sec, _ = server_section(size, hf, burst, sweeps, a.threads, 32)
                lines += ["", *sec, f"(server section: {time.perf_counter() - t0:.0f} s)"]
            if not a.no_profile and size != "135m":
                t0 = time.perf_counter()
                stats = {}
                for b in [4 * a.batch] if a.quick else [a.batch, 4 * a.batch]:  # decode steps, after every prefill
                    dec = make_workload(
                        4 if a.quick else b,
                        prompt_len=(4, 8) if a.quick else (16, 64),
                        output_len=(8, 8) if a.quick else (64, 64),
                        vocab_size=256,
                        seed=a.seed + 3,
                    )
                    start = 2 if a.quick else -(-sum(len(r.prompt_token_ids) for r in dec) // 512) + 2
                    cb = managers.get(b)
                    if cb is None:
                        cb = HFContinuousBatching(hf, b, max(len(r.prompt_token_ids) + r.max_tokens for r in dec))
                        stack.callback(cb.close)
                    pl, stats[b] = profile_hf_cb(hf, dec, b, 0, steps=3 if a.quick else 20, cb=cb, start=start)
                    lens = sorted(len(r.prompt_token_ids) for r in dec)
                    head = f"{len(dec)} requests, prompts {lens[0]}-{lens[-1]}, {dec[0].max_tokens} output tokens each"
                    lines += ["", f"{head}, profiled from step {start} (every prompt prefilled by then):", *pl]
                if len(stats) == 2 and all(stats.values()):
                    lo, hi = stats[a.batch], stats[4 * a.batch]
                    lines += [
                        "",
                        f"Attention (`*scaled_dot_product*`) per decode step: {lo['attention_ms']:.1f} ms at "
                        f"{a.batch} sequences, {hi['attention_ms']:.1f} ms at {4 * a.batch}: "
                        f"{hi['attention_ms'] / lo['attention_ms']:.1f}x for 4x the sequences (per-sequence attention "
                        "over equal lengths: 4x; one packed query over every sequence's keys with a block-diagonal "
                        f"mask: 16x). Whole step: {hi['wall_ms'] / lo['wall_ms']:.1f}x wall, "
                        f"{hi['cpu_ms'] / lo['cpu_ms']:.1f}x profiled CPU.",
                    ]
                lines += cpu_overhead_table(model, [1, 2] if a.quick else [1, 4, 16, 64], 2 if a.quick else 30)
                lines.append(f"(profile section: {time.perf_counter() - t0:.0f} s)")
    lines.append(
        f"\nTotal: {time.perf_counter() - t_start:.0f} s. Command: `python benchmarks/serving.py {' '.join(sys.argv[1:])}`."
    )
    text = "\n".join(lines)
    print(text)
    if a.out and not a.quick:
        with open(a.out, "a") as f:
            gpu = f", {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}" if a.device == "cuda" else ""
            f.write(f"\n## {machine()}{gpu}\n{text}\n")


if __name__ == "__main__":
    main()
