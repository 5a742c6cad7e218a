"""``LLMEngine``: add requests, ``step()``, read outputs. ``LLM`` (offline batch generation) is the thin
front in ``llm.py``.

``step()`` is the whole engine in one screen: schedule -> run the model on the batch -> sample ->
update. With ``speculative_model`` (a draft ``Transformer``, a preset name or ``"ngram"``) a step also
drafts up to ``num_speculative_tokens`` tokens for every running decode, feeds each as a (k+1)-token
verify chunk in the same forward, accepts per sequence with the rejection rule and rolls the rejected
slots back (``speculative.BatchSpeculator``). The parts live in their own files: ``scheduler.py``
(queues, token budget, preemption), ``model_runner.py`` (packed batch over paged K/V), ``sampler.py``,
``sequence.py`` (state and outputs); the K/V blocks and the block manager are ``paged.py``'s.

``LLM(model, *, tokenizer=None, config=None, **options)`` and ``LLMEngine(model, tokenizer, config,
**options)``: every option is a field of ``EngineConfig`` (``inference/config.py``: block size, pool
size, KV dtype, token budget, chunking, prefix caching, continuous or static batching, preemption mode
and swap space, seed, speculative settings), given as one config or by name (``LLM(m, block_size=8)``).
``model`` is a preset name or ``ModelConfig`` (random weights from ``seed``), a package
``Transformer``, or a ``transformers`` causal LM (converted to the package's model). With
``num_blocks=None`` the cache gets ``kv_cache_memory`` bytes (default 256 MiB), capped at what
``max_num_seqs`` sequences of the full context can use; an int8/fp8 pool (``kv_cache_dtype``, KIVI's
per-channel K and per-token V) first takes its fp32 K residual out of that budget (2 blocks per running
sequence, more with speculation: ``paged.kv_residual_blocks``). ``step_times`` keeps the last
``step_times_window`` steps (bounded memory; ``num_steps`` counts all).

``async_scheduling=True`` (vLLM v1's async scheduling): while step t's forward runs on the caller's thread,
a worker thread (``LookAhead``) schedules step t+1 and builds its input tensors, as if each sequence that
samples at step t already had its token (a ``PLACEHOLDER``); when step t has sampled, the real tokens are
written where the placeholders are (``_fill_in``). A sequence that finished at step t loses the slot
reserved for it and its prepared batch is built again without it. Outputs are those of the synchronous
engine. Not with ``speculative_model`` (drafting needs the sampled token). ``close()`` joins the thread.

Requests: ``prepare(prompt, params)`` validates fully and does the long work (tokenising, compiling a
grammar) without touching the engine's state; ``add_request`` then queues all ``n`` samples or none. A
request whose sequences raise inside ``step()`` fails alone (``RequestOutput.error``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
import warnings
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import torch

from ..config import check_int
from ..runtime.profiling import ranged
from ..runtime.timing import Laps
from .model_runner import ModelRunner, SwapPool, cuda_graph_refusal, graph_buckets
from .paged import KV_QUANT_DTYPES, PagedKVCache, kv_block_bytes, kv_residual_blocks, kv_residual_bytes
from .sampler import apply_mask, filter_probs, logprob_entry, sample
from .sampling_params import ParamError, SamplingParams
from .config import EngineConfig
from .scheduler import Scheduler
from .speculative import BatchSpeculator, SpecDecodingCounters, SpecStats, VerifyView, to_probs
from .sequence import LATENCY_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, Histogram, RequestOutput, Sequence, SequenceStatus
from .tokenizer import ByteTokenizer, decode_stream

PHASES = ("schedule", "prepare", "model", "sample", "postprocess")
_GRAMMAR_LOCK = threading.Lock()
PLACEHOLDER = -1  # async scheduling: the input id of a token the step in flight has not sampled yet
LOOKAHEAD_TIMEOUT_S = 120.0  # the longest one thread of async scheduling waits for the other


class LookAhead:
    """Async scheduling's worker: one thread that prepares step t+1 while the engine's thread runs step t's
    forward (torch's operators release the GIL while they compute).

    ``start(fn, *args)`` runs ``fn`` on the worker. ``result(future)`` waits for it (at most
    ``LOOKAHEAD_TIMEOUT_S`` seconds) and, if it raised, stops the worker and raises a ``RuntimeError`` from
    its exception: a look-ahead that failed half-way leaves the engine's state half-updated, so the engine
    refuses further steps. ``wait_forward()`` (the scheduler's ``before_preempt``) lets the worker wait for
    the forward in flight before a preemption frees or copies blocks that forward may be writing.
    ``close()`` joins the thread; it also runs when the engine is garbage-collected."""

    def __init__(self, owner):
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mlsys-lookahead")
        self.forward_done = threading.Event()
        self.forward_done.set()  # no forward in flight
        self.next = None  # (scheduled, batch, worker seconds) prepared for the next step, or None
        self.error: BaseException | None = None
        self._finalizer = weakref.finalize(owner, self.pool.shutdown, True)  # no reference to the engine

    def start(self, fn, *args):
        self.forward_done.clear()
        return self.pool.submit(fn, *args)

    def wait_forward(self) -> None:
        if not self.forward_done.wait(LOOKAHEAD_TIMEOUT_S):
            raise TimeoutError(f"async scheduling: the forward in flight took over {LOOKAHEAD_TIMEOUT_S} s")

    def result(self, future):
        try:
            return future.result(timeout=LOOKAHEAD_TIMEOUT_S)
        except BaseException as e:
            self.error, self.next = e, None
            timed_out = not future.done()
            self._finalizer.detach()
            self.pool.shutdown(wait=not timed_out, cancel_futures=True)  # a stuck worker cannot be joined
            raise RuntimeError(
                f"async scheduling: preparing the next step failed ({type(e).__name__}: {e}); the engine is stopped"
            ) from e

    def close(self) -> None:
        self._finalizer()


@dataclasses.dataclass
class Prepared:
    """A validated request ready to queue (``LLMEngine.prepare``): prompt text (or None), its token ids,
    the final ``SamplingParams`` (``max_tokens`` resolved), the compiled grammar or None, one torch
    generator (or None) per sample, and ``budget``: the tokens it can really still produce,
    min(max_tokens, context − prompt), the budget its grammar mask plans for."""

    prompt: str | None
    ids: list[int]
    params: SamplingParams
    grammar: object
    generators: list
    budget: int


class LLMEngine:
    def __init__(self, model, tokenizer=None, config: EngineConfig | None = None, **options):
        """``config``: an ``EngineConfig``; ``options``: its fields by name, overriding ``config``'s."""
        self.config = c = EngineConfig.build(config, **options)
        block_size, max_num_seqs, max_num_batched_tokens = c.block_size, c.max_num_seqs, c.max_num_batched_tokens
        hf = _is_hf(model)
        self.model = resolve_model(model, c.seed).eval()
        self.tokenizer = resolve_tokenizer(tokenizer, self.model, hf)
        # the end-of-sequence id: the tokenizer's, else a transformers model's generation config's
        eos = (
            getattr(self.tokenizer, "eos_token_id", None)
            if self.tokenizer is not None
            else getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            if hf
            else None
        )
        self.eos_token_ids = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
        cfg = self.model.cfg
        p = next(self.model.parameters())
        # a dtype, or "int8"/"fp8": a quantized pool whose blocks also hold their scales (counted in block_bytes)
        kv_dtype = p.dtype if c.kv_cache_dtype == "auto" else c.kv_cache_dtype
        block_bytes = kv_block_bytes(cfg, block_size, kv_dtype)
        blocks_per_seq = math.ceil(cfg.seq_len / block_size)
        # a quantized pool keeps the K of blocks not yet full in fp32 (KIVI's residual), taken from the budget
        spec_k = c.num_speculative_tokens if c.speculative_model is not None else 0
        residual = kv_residual_blocks(max_num_seqs, block_size, spec_k) if kv_dtype in KV_QUANT_DTYPES else None
        memory = c.kv_cache_memory - (kv_residual_bytes(cfg, block_size, residual) if residual else 0)
        num_blocks = c.num_blocks
        if num_blocks is None:  # from the memory budget, capped at max_num_seqs full-length sequences
            num_blocks = max(1, min(memory // block_bytes, max_num_seqs * blocks_per_seq))
        left = f", {memory} after the K residual's {c.kv_cache_memory - memory}" if residual else ""
        check_int(f"num_blocks (from kv_cache_memory={c.kv_cache_memory} bytes{left})", num_blocks, 2)
        self.max_model_len = min(cfg.seq_len, num_blocks * block_size)  # one sequence alone always fits
        if not c.enable_chunked_prefill:  # a prompt is computed in one step: it must fit the token budget
            check_int(
                f"max_num_batched_tokens (without chunked prefill: >= the context max_model_len={self.max_model_len})",
                max_num_batched_tokens,
                self.max_model_len,
            )
        self.kv = PagedKVCache(
            cfg,
            num_blocks=num_blocks,
            block_size=block_size,
            dtype=kv_dtype,
            device=p.device,
            prefix_caching=c.enable_prefix_caching,
            max_seq_len=self.max_model_len,
            residual_blocks=residual,
        )
        self.kv.attention_backend = c.attention_backend
        pool = SwapPool(self.kv, c.swap_blocks or num_blocks) if c.preemption_mode == "swap" else None
        self.scheduler = Scheduler(self.kv, c, swap_pool=pool)
        self.runner = ModelRunner(self.model, self.kv)
        # CUDA-graph decode (vLLM's default; enforce_eager=True turns it off): why not, or None where captured
        self.cuda_graphs_off = cuda_graph_refusal(c, p.device)
        if self.cuda_graphs_off is None:
            try:
                self.runner.capture_cuda_graphs(graph_buckets(max_num_seqs))
            except RuntimeError as e:  # a model whose forward a graph cannot hold: run eager, and say why
                self.runner.graphs = None
                self.cuda_graphs_off = f"capture failed: {e}"
                warnings.warn(
                    f"CUDA graph capture failed, the engine runs eager ({e}); enforce_eager=True skips the capture",
                    RuntimeWarning,
                    stacklevel=2,
                )
        self._ahead = LookAhead(self) if c.async_scheduling else None
        if self._ahead is not None:
            self.scheduler.before_preempt = self._ahead.wait_forward
        self.speculator = None  # speculative decoding inside the batch (speculative.BatchSpeculator)
        if c.speculative_model is not None:
            draft = c.speculative_model
            if draft != "ngram":
                draft = resolve_model(draft, c.seed + 1).eval()
                if draft.cfg.vocab_size != cfg.vocab_size:
                    raise ValueError(
                        f"speculative_model vocab_size={draft.cfg.vocab_size} differs from the target's "
                        f"{cfg.vocab_size}"
                    )
            self.speculator = BatchSpeculator(
                draft, c.num_speculative_tokens, self.kv, max_model_len=self.max_model_len, max_num_seqs=max_num_seqs
            )
        # vLLM's speculative-decoding counters (verified drafts, drafted and accepted tokens, accepted per
        # position), counted by the acceptance rule; /metrics exports them
        self.spec_counters = SpecDecodingCounters(c.num_speculative_tokens) if self.speculator is not None else None
        self.generator = torch.Generator(device="cpu").manual_seed(c.seed)
        self.requests: dict[str, list[Sequence]] = {}
        # per step: seconds per phase, sequences, tokens; the last ``step_times_window`` steps (bounded memory)
        self.step_times: deque[dict] = deque(maxlen=c.step_times_window)
        self.num_steps = 0  # steps run in all (step_times keeps only the last ones)
        self.max_grammar_states = c.max_grammar_states
        self.stats = {
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "generation_tokens": 0,
            "requests_finished": 0,
            "requests_failed": 0,
        }
        # vLLM's latency histograms (seconds), /metrics exports them: the queue time (arrival -> first
        # scheduled) of each request when it is first scheduled, the others when it finishes
        self.histograms = {
            "request_queue_time_seconds": Histogram(LATENCY_BUCKETS),
            "time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "time_per_output_token_seconds": Histogram(TPOT_BUCKETS),
            "e2e_request_latency_seconds": Histogram(LATENCY_BUCKETS),
        }
        self._ids = itertools.count()

    # ---- requests ------------------------------------------------------------------------------
    def prepare(self, prompt, params: SamplingParams | None = None, *, strict_context: bool = False) -> Prepared:
        """Validate a request fully and do its long work (tokenising, compiling its grammar) WITHOUT touching
        the engine's state: safe to call from another thread while ``step()`` runs (the server does).

        ``params.max_tokens=None`` becomes the rest of the context. ``strict_context``: a ``max_tokens``
        beyond the context is an error (the server's rule, as vLLM's), else generation stops at the end of
        the context (finish reason "length"). Raises ``ParamError`` (a ValueError) naming the parameter."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ParamError("params", f"params must be a SamplingParams, got {type(params).__name__}")
        ids = self.encode(prompt)
        vocab = self.model.cfg.vocab_size
        if not ids:
            raise ParamError("prompt", "prompt is empty: a request needs at least one token")
        if any(not 0 <= t < vocab for t in ids):
            raise ParamError("prompt", f"prompt token ids must be in [0, {vocab}) (the model's vocab_size)")
        if len(ids) >= self.max_model_len:
            raise ParamError(
                "prompt",
                f"prompt of {len(ids)} tokens is too long: the context is max_model_len="
                f"{self.max_model_len} tokens, including at least one generated token",
            )
        rest = self.max_model_len - len(ids)
        if params.max_tokens is None:
            params = dataclasses.replace(params, max_tokens=rest)
        elif strict_context and params.max_tokens > rest:
            raise ParamError(
                "max_tokens",
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(ids) + params.max_tokens} tokens ({len(ids)} in the prompt, {params.max_tokens} in the "
                f"completion): max_tokens must be <= {rest}",
            )
        if params.logprobs is not None and params.logprobs > vocab:
            raise ParamError("logprobs", f"logprobs={params.logprobs}: must be <= the vocabulary size {vocab}")
        for name, toks in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias or {})):
            if any(not 0 <= t < vocab for t in toks):
                raise ParamError(name, f"{name}: token ids must be in [0, {vocab}) (the model's vocab_size)")
        gens = []
        for i in range(params.n):  # every sample's generator before anything is queued (add_request is atomic)
            seed = params.sample_seed(i)
            gens.append(None if seed is None else torch.Generator(device="cpu").manual_seed(seed))
        budget = min(params.max_tokens, rest)  # generation stops at whichever comes first
        grammar = self._grammar(params, ids, budget) if params.structured else None
        return Prepared(prompt if isinstance(prompt, str) else None, ids, params, grammar, gens, budget)

    def add_request(
        self,
        request_id: str,
        prompt,
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        *,
        prepared: Prepared | None = None,
    ) -> None:
        """Queue one request; ``prompt`` is a string (needs a tokenizer) or a list of token ids.

        Atomic: it validates everything first (``prepare``, or pass ``prepared=`` from an earlier
        ``prepare`` and ``prompt=None``), then queues all ``n`` samples; on an error nothing is queued."""
        if request_id in self.requests:
            raise ParamError("request_id", f"request_id={request_id!r} is already in use")
        pr = prepared if prepared is not None else self.prepare(prompt, params)
        now = time.perf_counter() if arrival_time is None else arrival_time
        seqs = []
        for i in range(pr.params.n):
            seq = Sequence(
                next(self._ids),
                request_id,
                pr.ids,
                pr.params,
                index=i,
                arrival_time=now,
                generator=pr.generators[i],
                prompt=pr.prompt,
            )
            seq.allowed = None if pr.grammar is None else pr.grammar.walker(pr.budget)
            seq.spec = SpecStats() if self.speculator is not None else None  # measured, per sample
            seqs.append(seq)
        for seq in seqs:  # nothing above touched the engine's state
            self.scheduler.add(seq)
        self.requests[request_id] = seqs

    def _grammar(self, params: SamplingParams, ids: list[int], budget: int):
        """Compile a request's json_schema/regex/choice into a budget-aware token mask (structured.py);
        ``budget``: the tokens the request can produce, so a match that cannot end within it is refused."""
        from .structured import Grammar, GrammarError

        vocab = self.model.cfg.vocab_size
        eos = min(self.eos_token_ids, default=None)
        if self.tokenizer is None or eos is None or not 0 <= eos < vocab:
            raise GrammarError(
                f"structured outputs need a tokenizer with an end-of-sequence id below vocab_size={vocab} "
                f"(got tokenizer {type(self.tokenizer).__name__}, eos {eos}); pass LLM(model, tokenizer=...)"
            )
        tb, strips = self._token_bytes()
        given = next(n for n in ("json_schema", "regex", "choice") if getattr(params, n) is not None)
        with _GRAMMAR_LOCK:  # one compilation at a time: bounded memory however many requests bring one
            try:
                g = Grammar.compile(
                    json_schema=params.json_schema,
                    regex=params.regex,
                    choice=params.choice,
                    vocab_size=vocab,
                    eos_id=eos,
                    token_bytes=tb,
                    no_leading_space=strips,
                    max_states=self.max_grammar_states,
                )
            except GrammarError as e:
                e.param = e.param or given  # the request parameter that brought the grammar
                raise
        if params.max_tokens < max(1, g.min_tokens):
            raise GrammarError(
                f"max_tokens={params.max_tokens} is out of range: the shortest match takes {g.min_tokens} tokens",
                param="max_tokens",
            )
        if budget < g.min_tokens:  # the context, not max_tokens, is the binding limit
            raise GrammarError(
                f"prompt of {len(ids)} tokens + the shortest match ({g.min_tokens}) exceeds "
                f"max_model_len={self.max_model_len}",
                param="prompt",
            )
        return g

    def _token_bytes(self):
        """Each token's bytes for grammar masks (``tokenizer.token_bytes``, cached per tokenizer)."""
        from .structured import GrammarError
        from .tokenizer import TokenBytesError, token_bytes

        try:
            return token_bytes(self.tokenizer, self.model.cfg.vocab_size)
        except TokenBytesError as e:
            raise GrammarError(str(e)) from None

    def abort_request(self, request_id: str) -> None:
        """Stop a request now (e.g. its client went away) and free its blocks."""
        for seq in self.requests.pop(request_id, []):
            if not seq.finished:
                seq.finish_reason = "abort"
                self.scheduler.finish(seq)

    def fail_request(self, request_id: str, error: BaseException | str) -> RequestOutput | None:
        """Finish a request with an error (all its samples, blocks freed): the output carries ``error``."""
        seqs = self.requests.get(request_id)
        if seqs is None:
            return None
        self.abort_request(request_id)
        self.stats["requests_failed"] += 1
        s0 = seqs[0]
        msg = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return RequestOutput(
            request_id,
            s0.prompt,
            list(s0.prompt_token_ids),
            [s.completion() for s in seqs],
            True,
            s0.metrics,
            s0.num_cached_tokens,
            error=msg,
        )

    def fail_all(self, error: BaseException | str) -> list[RequestOutput]:
        """Fail every unfinished request (the last resort when a step fails as a whole)."""
        return [o for rid in list(self.requests) if (o := self.fail_request(rid, error)) is not None]

    def request_counts(self) -> dict:
        """Requests (not sequences): ``waiting`` (no sample scheduled yet) and ``running`` (the others)."""
        waiting = sum(all(s.metrics.first_scheduled_time is None for s in seqs) for seqs in self.requests.values())
        return {"waiting": waiting, "running": len(self.requests) - waiting}

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the engine loop -----------------------------------------------------------------------
    @ranged("engine.step")  # a profiler range (notebook 15); ~1-2 us while no profiler records
    def step(self) -> list[RequestOutput]:
        """One iteration: schedule -> run the model on the batch -> sample -> update.

        A sequence whose grammar mask, sampling or detokenization raises fails alone: its request is
        finished with ``RequestOutput.error`` and the others go on. If the forward pass raises, each
        scheduled request is run alone to find the ones that raise; they fail, the rest are recomputed at
        the next step (their K/V positions are simply written again).

        With ``async_scheduling`` the schedule and the batch usually come ready from the look-ahead (the
        step's ``lookahead`` time: the worker's seconds, overlapped with the previous forward), and the
        next step's look-ahead runs during this forward (``wait``: the time it outlasted the forward;
        ``overlapped``: the share of the worker's time that ran beside the forward, in [0, 1])."""
        t = Laps()  # wall seconds of the phases of this step
        ahead, batch, extra = self._ahead, None, {}
        if ahead is not None and ahead.error is not None:
            raise RuntimeError("async scheduling failed in an earlier step: the engine is stopped") from ahead.error
        scheduled, batch, extra = self._take_prepared() if ahead is not None else ([], None, {})
        if not scheduled:
            scheduled = self._schedule()  # 1. schedule
        t("schedule")
        if not scheduled:
            if self.scheduler.waiting and not self.scheduler.running and not self.scheduler.swapped:
                raise RuntimeError(
                    f"{len(self.scheduler.waiting)} waiting requests and none can be admitted "
                    f"({self.kv.manager.num_free_blocks()} free blocks): the engine would hang"
                )
            return []
        drafts = self._propose(scheduled) if self.speculator is not None else {}  # 1b. draft k tokens
        feed = []  # a decode with k drafts is fed as a (k+1)-token verify chunk
        for seq, n in scheduled:
            d = drafts.get(seq.seq_id)
            m = 1 + len(d.tokens) if d is not None else n
            feed.append(
                (seq if d is None else VerifyView(seq.seq_id, seq.token_ids + d.tokens, seq.num_computed_tokens, m), m)
            )
        future = None
        try:
            if ahead is None:
                logits, batch = self.runner.run(feed, timer=t)  # 2. prepare + forward (verify chunks included)
            else:  # async: the batch may come prepared; step t+1's CPU work runs on the worker meanwhile
                batch = batch if batch is not None else self.runner.prepare(feed)
                t("prepare")
                future = ahead.start(self._look_ahead, scheduled, list(batch.sample_seqs))
                f0 = time.perf_counter()
                try:
                    logits = self.runner.forward(batch)
                finally:
                    ahead.forward_done.set()
                t("model")
                f1 = time.perf_counter()
        except Exception as e:
            if future is not None:
                self._undo_look_ahead(future, scheduled, batch.sample_seqs)
            self.speculator.undo(drafts) if drafts else None
            return self._isolate_forward(scheduled, e)
        if future is not None:
            ahead.next = ahead.result(future)  # raises what the worker raised
            w0, w1 = ahead.next[2].pop("span")  # the share of the worker's time spent beside the forward
            ahead.next[2]["overlapped"] = max(0.0, min(w1, f1) - max(w0, f0)) / max(w1 - w0, 1e-12)
            for seq in batch.sample_seqs:  # the real token comes from this step's sampler
                seq.output_token_ids.pop()
            t("wait")
        failed: dict[str, BaseException] = {}
        verify, rows, off = [], [], 0  # split the logits: verify chunks (k+1 rows) and one row per other
        for seq, m in zip(batch.sample_seqs, batch.num_logits):
            if isinstance(seq, VerifyView):
                verify.append((drafts[seq.seq_id], logits[off : off + m]))
            else:
                rows.append(off)
            off += m
        if verify:
            logits = logits[rows]
            batch.sample_seqs = [s for s in batch.sample_seqs if not isinstance(s, VerifyView)]
        if any(getattr(s, "allowed", None) is not None for s in batch.sample_seqs):  # grammar masks
            logits = logits.clone()
            for i, seq in enumerate(batch.sample_seqs):
                try:
                    mask = None if seq.allowed is None else seq.allowed(seq.output_token_ids)
                    if mask is not None:
                        logits[i] = apply_mask(logits[i], mask)
                except Exception as e:
                    failed.setdefault(seq.request_id, e)
        errors: dict[int, BaseException] = {}
        tokens, logprobs = sample(
            logits,
            batch.sample_seqs,
            self.generator,  # 3. sample
            self.tokenizer if any(s.params.logprobs for s in batch.sample_seqs) else None,
            eos_token_ids=sorted(self.eos_token_ids),
            errors=errors,
        )
        for i, e in errors.items():
            failed.setdefault(batch.sample_seqs[i].request_id, e)
        t("sample")
        if future is None:
            self.scheduler.update([(s, n) for s, n in scheduled if s.seq_id not in drafts])  # 4. update: K/V cached,
        else:  # the look-ahead advanced num_computed_tokens; the blocks become hits now that their K/V exist
            for seq, _ in scheduled:
                if seq.status is SequenceStatus.RUNNING:
                    self.manager_mark(seq)
        now = time.perf_counter()
        for seq, tok, lp in zip(batch.sample_seqs, tokens, logprobs):  #    new tokens, stop checks
            if getattr(seq, "spec", None) is not None:
                seq.spec.target_forwards += 1
                seq.spec.emitted += 1
            if seq.request_id in failed or seq.finished:
                continue
            try:
                self._append_token(seq, tok, lp, now)
            except Exception as e:
                failed.setdefault(seq.request_id, e)
        for d, rows_k in verify:  # 4b. speculation: accept per sequence, roll back the rejected slots
            self._accept(d, rows_k, now, failed)
        rids = dict.fromkeys([s.request_id for s in batch.sample_seqs] + [d.seq.request_id for d, _ in verify])
        if self.speculator is not None:  # the draft pool's blocks of finished sequences go back now
            self.speculator.release({s.seq_id for s in self.scheduler.running})
        outputs = [self.fail_request(r, failed[r]) if r in failed else self._output(r) for r in rids]
        outputs = [o for o in outputs if o is not None]
        if future is not None:
            self._fill_in(batch.sample_seqs)
        t("postprocess")
        self.num_steps += 1
        self.step_times.append(
            dict(
                t.times,
                **extra,
                num_seqs=len(scheduled),
                num_tokens=sum(n for _, n in scheduled),
                num_decodes=batch.num_decodes,
            )
        )
        return outputs

    def _schedule(self) -> list[tuple[Sequence, int]]:
        """The scheduler's next step; the first scheduling of each request goes into its metrics."""
        scheduled = self.scheduler.schedule()
        now = time.perf_counter()
        for seq, _ in scheduled:
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
                if seq.index == 0:
                    self.histograms["request_queue_time_seconds"].observe(now - seq.metrics.arrival_time)
        return scheduled

    # ---- async scheduling (LookAhead) -----------------------------------------------------------
    def _look_ahead(self, scheduled, sampling: list[Sequence]):
        """On the worker, while step t's forward runs: step t+1's schedule and batch, as if step t were done
        (every scheduled token computed, a ``PLACEHOLDER`` token for each sequence that samples). Returns
        (schedule, batch or None, {"lookahead": worker seconds, "span": its start and end, perf_counter})."""
        t0 = time.perf_counter()
        for seq, n in scheduled:
            seq.num_computed_tokens += n
        for seq in sampling:
            seq.output_token_ids.append(PLACEHOLDER)
        nxt = self._schedule()
        batch = self.runner.prepare(nxt) if nxt else None
        t1 = time.perf_counter()
        return nxt, batch, {"lookahead": t1 - t0, "span": (t0, t1)}

    def _fill_in(self, sampled: list[Sequence]) -> None:
        """After step t: its sampled tokens replace the placeholders in the block manager's token lists
        (their block hashes are computed from them) and in the prepared batch's input ids."""
        live = [s for s in sampled if not s.finished]
        seqs = self.kv.manager.seqs
        for seq in live:
            held = seqs.get(seq.seq_id)
            if held is not None and len(held.tokens) >= seq.num_tokens:  # its slot was reserved in step t+1
                held.tokens[seq.num_tokens - 1] = seq.output_token_ids[-1]
        nxt = self._ahead.next
        if nxt is None or nxt[1] is None:
            return
        want, rows, toks, off = {s.seq_id: s for s in live}, [], [], 0
        for seq, n in nxt[1].scheduled:  # packed order: a decode's one input id at its offset
            if seq.seq_id in want:
                rows.append(off)
                toks.append(seq.output_token_ids[-1])
            off += n
        if rows:
            nxt[1].tokens[0, rows] = torch.tensor(toks, dtype=nxt[1].tokens.dtype, device=nxt[1].tokens.device)

    def _take_prepared(self):
        """The look-ahead's schedule and batch for this step, without the sequences that finished (or were
        aborted) since: their batch is built again. ([], None, {}) when there is none."""
        nxt, self._ahead.next = self._ahead.next, None
        if nxt is None:
            return [], None, {}
        scheduled, batch, extra = nxt
        live = [(s, n) for s, n in scheduled if s.status is SequenceStatus.RUNNING]
        if len(live) < len(scheduled):
            batch = self.runner.prepare(live) if live else None
        return live, batch, extra

    def _undo_look_ahead(self, future, scheduled, sampling) -> None:
        """Step t's forward raised: take back what the look-ahead assumed (placeholders, their reserved
        slots, the advanced computed counts); sequences it admitted stay admitted."""
        self._ahead.result(future)
        self._ahead.next = None
        mgr = self.kv.manager
        for seq in sampling:
            seq.output_token_ids.pop()
            if seq.seq_id in mgr.seqs and mgr.num_tokens(seq.seq_id) > seq.num_tokens:
                mgr.truncate(seq.seq_id, seq.num_tokens)
        for seq, n in scheduled:
            if seq.status is not SequenceStatus.WAITING:  # a preempted (recompute) one starts from 0 anyway
                seq.num_computed_tokens -= n

    def close(self) -> None:
        """Join async scheduling's worker thread (also done when the engine is garbage-collected); the engine
        goes on synchronously (a batch the worker prepared is dropped: its sequences keep their reserved slots
        and are scheduled again)."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead, self.scheduler.before_preempt = None, None

    # ---- speculative decoding in the batch (speculative.BatchSpeculator) ------------------------
    def _propose(self, scheduled) -> dict:
        """Draft tokens for the scheduled decodes that can take them: k_i = min(k, tokens the request may
        still produce − 1, context left − 1, token budget left); none for requests with logit processors."""
        sp = self.speculator
        sp.release({s.seq_id for s in self.scheduler.running})
        budget = self.config.max_num_batched_tokens - sum(n for _, n in scheduled)
        wants = []
        for seq, n in scheduled:
            p = seq.params
            if n != 1 or seq.num_uncomputed != 1 or not seq.output_token_ids or p.processes_logits:
                continue
            ki = min(
                sp.k, p.max_tokens - len(seq.output_token_ids) - 1, self.max_model_len - seq.num_tokens - 1, budget
            )
            if ki > 0:
                wants.append((seq, ki))
                budget -= ki
        if not wants:
            return {}
        drafts = sp.propose(wants, self._spec_dist, self._uniform, self._spec_allows)
        for d in drafts.values():
            if d.seq.spec is not None:
                d.seq.spec.drafted += len(d.tokens)
                d.seq.spec.draft_forwards += 0 if sp.ngram else len(d.tokens)
        return drafts

    def _spec_dist(self, seq: Sequence, logits, extra: list[int]):
        """The distribution the engine's sampler draws ``seq``'s next token from after ``extra`` more
        tokens: the grammar mask, then temperature/top_k/top_p/min_p (one-hot argmax when greedy)."""
        if seq.allowed is not None:
            mask = seq.allowed(seq.output_token_ids + extra)
            if mask is not None:
                logits = apply_mask(logits, mask)
        p = seq.params
        if p.greedy:
            return to_probs(logits, 0)
        return filter_probs(logits.float(), p.temperature, p.top_k, p.top_p, p.min_p)

    def _spec_allows(self, seq: Sequence, extra: list[int], tok: int) -> bool:
        if seq.allowed is None:
            return True
        mask = seq.allowed(seq.output_token_ids + extra)
        return mask is None or bool(mask[tok])

    def _uniform(self, seq: Sequence):
        return torch.rand((), generator=seq.generator or self.generator)

    def _accept(self, d, logits, now: float, failed: dict) -> None:
        """The rejection rule for one verified sequence, the rollback, then its new tokens through the
        engine's path (stop rules, logprobs, detokenization)."""
        seq = d.seq
        if seq.request_id in failed or seq.finished:
            self.speculator.rollback(d, 0)
            return
        try:
            new, n = self.speculator.accept(d, logits, self._spec_dist, self._uniform)
        except Exception as e:
            self.speculator.undo({seq.seq_id: d})
            failed.setdefault(seq.request_id, e)
            return
        self.spec_counters.observe(len(d.tokens), n)
        self.manager_mark(seq)
        s = seq.spec
        if s is not None:
            s.target_forwards += 1
            s.tested += n + (n < len(d.tokens))
            s.accepted += n
            s.accepted_per_step.append(n)
        want_lp = seq.params.logprobs is not None
        for j, tok in enumerate(new):
            if seq.finished:
                break
            lp = None
            if want_lp:
                row = logits[j]
                if seq.allowed is not None and (mask := seq.allowed(seq.output_token_ids)) is not None:
                    row = apply_mask(row, mask)
                lp = logprob_entry(torch.log_softmax(row.float(), -1), tok, seq.params.logprobs, self.tokenizer)
            try:
                self._append_token(seq, tok, lp, now)
            except Exception as e:
                failed.setdefault(seq.request_id, e)
                return
            if s is not None:
                s.emitted += 1

    def manager_mark(self, seq: Sequence) -> None:
        """Register the blocks now holding computed K/V (after the rollback: never a rejected token)."""
        self.kv.manager.mark_computed(seq.seq_id, seq.num_computed_tokens)

    def _isolate_forward(self, scheduled, error: BaseException) -> list[RequestOutput]:
        """The forward pass raised: run each request's part alone; fail those that raise (all scheduled
        requests if none does alone: the failure is the batch's)."""
        by_request: dict[str, list] = {}
        for seq, n in scheduled:
            by_request.setdefault(seq.request_id, []).append((seq, n))
        culprits = {}
        for rid, part in by_request.items():
            try:
                self.runner.run(part)
            except Exception as e:
                culprits[rid] = e
        culprits = culprits or dict.fromkeys(by_request, error)
        return [o for rid, e in culprits.items() if (o := self.fail_request(rid, e)) is not None]

    def _append_token(self, seq: Sequence, tok: int, lp, now: float) -> None:
        p, m = seq.params, seq.metrics
        if seq.num_preemptions == 0 and not seq.output_token_ids:
            self.stats["prompt_tokens"] += len(seq.prompt_token_ids)
            self.stats["cached_tokens"] += seq.num_cached_tokens
        seq.output_token_ids.append(tok)
        self.stats["generation_tokens"] += 1
        m.first_token_time = m.first_token_time or now
        m.last_token_time = now
        m.token_times.append(now)
        if lp is not None:
            seq.logprobs.append(lp)
            seq.cumulative_logprob += lp[tok].logprob
        is_eos = tok in self.eos_token_ids and not p.ignore_eos
        if self.tokenizer is not None and not is_eos:  # incremental detokenization
            seq.detok = seq.detok or decode_stream(self.tokenizer)
            seq.text += seq.detok.step(tok)
        end = p.finish(
            tok,
            len(seq.output_token_ids),
            seq.text,
            eos_token_ids=self.eos_token_ids,
            at_context_end=seq.num_tokens >= self.max_model_len,
        )
        if end is not None:
            seq.finish_reason, seq.stop_reason, cut = end
            seq.text = seq.text if cut is None else seq.text[:cut]
        if seq.finish_reason is not None and seq.detok is not None and seq.stop_reason not in p.stop:
            seq.text += seq.detok.flush()  # an incomplete character at the end, as U+FFFD
        if seq.finish_reason is not None:
            m.finished_time = now
            self.scheduler.finish(seq)

    def _observe(self, m) -> None:
        """A finished request's latencies (its first sample's) into the histograms."""
        h = self.histograms
        for name, value in (
            ("time_to_first_token_seconds", m.ttft),
            ("time_per_output_token_seconds", m.tpot),
            ("e2e_request_latency_seconds", m.e2e),
        ):
            if value is not None:
                h[name].observe(value)

    def _output(self, request_id: str) -> RequestOutput:
        seqs = self.requests[request_id]
        done = all(s.finished for s in seqs)
        if done:
            del self.requests[request_id]
            self.stats["requests_finished"] += 1
            self._observe(seqs[0].metrics)
        s0 = seqs[0]
        return RequestOutput(
            request_id,
            s0.prompt,
            list(s0.prompt_token_ids),
            [s.completion() for s in seqs],
            done,
            s0.metrics,
            s0.num_cached_tokens,
        )

    # ---- tokens <-> text -----------------------------------------------------------------------
    def encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer: pass tokenizer=... or a list of token ids")
            return list(self.tokenizer.encode(prompt))
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"prompt must be a string or a list of int token ids, got {type(prompt).__name__}")
        return list(prompt)

    def decode(self, ids) -> str:
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except TypeError:
            return self.tokenizer.decode(ids)

    # ---- weights and state ---------------------------------------------------------------------
    def load_weights(self, state_dict) -> None:
        """Swap the model's weights in place and forget the prefix cache (its K/V came from the old weights).

        ``state_dict`` uses the package's parameter names, or ``transformers``' (``model.layers.N...``, e.g.
        a trained ``LlamaForCausalLM``'s), mapped as ``models.from_hf`` does. Requests already running keep
        the K/V they computed with the old weights (as in vLLM)."""
        if any(k.startswith("model.") for k in state_dict):
            from ..models.hf import hf_name_map

            names = hf_name_map(self.model.cfg)
            missing = [theirs for theirs in names.values() if theirs not in state_dict]
            if missing:
                raise KeyError(f"transformers-style state_dict lacks {missing[:3]} ({len(missing)} missing in all)")
            state_dict = {ours: state_dict[theirs] for ours, theirs in names.items()}
            if self.model.cfg.tied_embeddings:  # one tensor under both names
                state_dict["lm_head.weight"] = state_dict["embed.weight"]
        with torch.no_grad():
            self.model.load_state_dict(state_dict, strict=True)
        self.kv.manager.forget_prefixes()

    def num_blocks_used(self) -> int:
        m = self.kv.manager
        return m.num_blocks - m.num_free_blocks()

    def status(self) -> dict:
        """Queue lengths and KV blocks in use (what ``/metrics`` exports)."""
        s = self.scheduler
        return {
            "running": len(s.running),
            "waiting": len(s.waiting),
            "swapped": len(s.swapped),
            "blocks_used": self.num_blocks_used(),
            "blocks_total": self.kv.manager.num_blocks,
            "preemptions": dict(s.num_preemptions),
            **self.stats,
        }


def resolve_model(model, seed: int = 0):
    """A package ``Transformer`` from a preset name, a ``ModelConfig``, a ``Transformer`` or a transformers model."""
    from ..config import ModelConfig, load_model_preset
    from ..models import Transformer

    if isinstance(model, str):
        model = load_model_preset(model)
    if isinstance(model, ModelConfig):
        torch.manual_seed(seed)
        return Transformer(model)
    if isinstance(model, Transformer):
        return model
    if _is_hf(model):
        from ..models import from_hf

        return from_hf(model)
    raise TypeError(
        f"model={type(model).__name__}: expected a preset name, a ModelConfig, a Transformer "
        "or a transformers causal LM"
    )


def _is_hf(model) -> bool:
    return hasattr(model, "config") and hasattr(model, "generate") and not hasattr(model, "cfg")


def resolve_tokenizer(tokenizer, model, hf: bool = False):
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer)
    if tokenizer is not None:
        return tokenizer
    if hf:
        return None  # a converted transformers model: token ids only unless its tokenizer is passed
    return ByteTokenizer(model.cfg.vocab_size) if model.cfg.vocab_size >= 256 else None


__all__ = ["PHASES", "LLMEngine", "SequenceStatus", "resolve_model", "resolve_tokenizer"]
