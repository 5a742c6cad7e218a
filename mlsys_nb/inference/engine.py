"""``LLMEngine``: add requests, ``step()``, read outputs. ``LLM`` (offline batch generation) is the thin
front in ``llm.py``.

``step()`` is the whole engine in one screen: schedule -> run the model on the batch -> sample -> update ->
outputs, each phase a call into its part. ``scheduler.py`` decides (queues, token budget, preemption) and
returns a ``SchedulerOutput``: what runs and which K/V blocks move; ``model_runner.py`` moves the bytes (swap
out, copy-on-write, swap in: ``ModelRunner.move_blocks``, before the forward) and runs the packed batch over
paged K/V; ``sampler.py`` samples (grammar masks, logit processors, temperature, top-k/top-p/min-p);
``sequence.py`` holds state and outputs; ``metrics.EngineMetrics`` counts (stats, latency histograms,
``step_times``). The K/V blocks and the pool's sizing (``allocate_kv_cache``) are ``paged.py``'s, the block
manager ``block_manager.py``'s. Fault isolation is one ``try`` around the forward. Around the step: requests
are validated and prepared by ``inputs.InputProcessor``; the model, tokenizer and new weights come through
``loading.py``; CUDA graphs of the decode step are ``cuda_graphs.py``'s.

With ``speculative_model`` (a draft ``Transformer``, a preset name or ``"ngram"``) a step also drafts up to
``num_speculative_tokens`` tokens for every running decode (``spec_batch.BatchSpeculator.propose``), feeds
each as a (k+1)-token verify chunk in the same forward (``spec_batch.verify_feed``), accepts per sequence
with the rejection rule and rolls the rejected slots back (``BatchSpeculator.accept``).

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

``async_scheduling=True`` (vLLM v1's async scheduling) builds an ``AsyncLLMEngine``, whose ``step``
(``async_engine.AsyncScheduling``) prepares step t+1 on a worker thread while step t's forward runs, with
this class's parts; the same outputs. ``close()`` joins its thread.

Requests: ``prepare(prompt, params)`` validates fully and does the long work (tokenising, compiling a
grammar) without touching the engine's state; ``add_request`` then queues all ``n`` samples or none. A
request whose sequences raise inside ``step()`` fails alone (``RequestOutput.error``).
"""

from __future__ import annotations

import itertools
import time

import torch

from ..config import check_int
from ..runtime.profiling import ranged
from ..runtime.timing import Laps
from .async_engine import AsyncScheduling
from .compiled import compiled_model
from .config import EngineConfig
from .cuda_graphs import capture_decode_graphs
from .inputs import InputProcessor, Prepared
from .loading import is_hf_model, load_state_dict, resolve_eos, resolve_model, resolve_tokenizer
from .metrics import PHASES, EngineMetrics
from .model_runner import ModelRunner
from .paged import allocate_kv_cache
from .sampler import apply_mask, logprob_entry, sample
from .sampling_params import ParamError, SamplingParams
from .scheduler import Scheduler, SchedulerOutput
from .sequence import RequestOutput, Sequence, SequenceStatus
from .spec_batch import build_speculator, split_verify, verify_feed
from .speculative import SpecStats
from .tokenizer import decode_stream


class LLMEngine:
    """The serving engine (module docstring). ``EngineConfig(async_scheduling=True)`` builds an
    ``AsyncLLMEngine``, whose ``step`` (async_engine.py) reuses the parts below."""

    def __new__(cls, model=None, tokenizer=None, config: EngineConfig | None = None, **options):
        if cls is LLMEngine and EngineConfig.build(config, **options).async_scheduling:
            cls = AsyncLLMEngine
        return super().__new__(cls)

    def __init__(self, model, tokenizer=None, config: EngineConfig | None = None, **options):
        """``config``: an ``EngineConfig``; ``options``: its fields by name, overriding ``config``'s."""
        self.config = c = EngineConfig.build(config, **options)
        hf = is_hf_model(model)
        self.model = resolve_model(model, c.seed).eval()
        self.tokenizer = resolve_tokenizer(tokenizer, self.model, hf)
        p = next(self.model.parameters())
        self.kv = allocate_kv_cache(self.model.cfg, c, p.dtype, p.device)  # blocks from kv_cache_memory (paged.py)
        self.max_model_len = self.kv.manager.max_seq_len  # tokens; one sequence alone always fits
        if not c.enable_chunked_prefill:  # a prompt is computed in one step: it must fit the token budget
            check_int(
                f"max_num_batched_tokens (without chunked prefill: >= the context max_model_len={self.max_model_len})",
                c.max_num_batched_tokens,
                self.max_model_len,
            )
        self.inputs = InputProcessor(  # validates and tokenises requests, compiles grammars (inputs.py)
            self.tokenizer,
            self.model.cfg.vocab_size,
            self.max_model_len,
            resolve_eos(self.tokenizer, model if hf else None),
            c.max_grammar_states,
        )
        self.scheduler = Scheduler(self.kv.manager, c)  # decides: what runs, which blocks move
        self.runner = ModelRunner(self.model, self.kv, self.scheduler.swap_blocks)  # moves bytes, runs the model
        self.runner.compiled = compiled_model(self.model) if c.compile else None  # torch.compile'd, one per model
        self.cuda_graphs_off = capture_decode_graphs(self.runner, c)  # why the decode step runs eager, or None
        self.speculator = build_speculator(c, self.model, self.kv, self.max_model_len)  # in the batch, or None
        self.generator = torch.Generator(device="cpu").manual_seed(c.seed)
        self.requests: dict[str, list[Sequence]] = {}
        self.metrics = EngineMetrics(c.step_times_window)  # stats, latency histograms, step_times
        self._ids = itertools.count()

    # ---- what the engine counts (metrics.EngineMetrics) ----------------------------------------
    @property
    def stats(self) -> dict:
        """Tokens and requests so far (``EngineMetrics.stats``)."""
        return self.metrics.stats

    @property
    def histograms(self) -> dict:
        """vLLM's latency histograms, seconds (``EngineMetrics.histograms``)."""
        return self.metrics.histograms

    @property
    def step_times(self):
        """Per step: seconds per phase, sequences, tokens; the last ``step_times_window`` steps."""
        return self.metrics.step_times

    @step_times.setter
    def step_times(self, value) -> None:
        self.metrics.step_times = value

    @property
    def num_steps(self) -> int:
        """Steps run in all (``step_times`` keeps only the last ones)."""
        return self.metrics.num_steps

    # ---- requests ------------------------------------------------------------------------------
    def prepare(self, prompt, params: SamplingParams | None = None, *, strict_context: bool = False) -> Prepared:
        """Validate a request fully and do its long work (tokenising, compiling its grammar) WITHOUT touching
        the engine's state: safe to call from another thread while ``step()`` runs (the server does).
        ``InputProcessor.prepare`` (inputs.py): ``max_tokens=None`` becomes the rest of the context;
        ``strict_context`` refuses a ``max_tokens`` beyond it. Raises ``ParamError`` naming the parameter."""
        return self.inputs.prepare(prompt, params, strict_context=strict_context)

    @property
    def eos_token_ids(self) -> set[int]:
        """The end-of-sequence ids (the tokenizer's, else a transformers model's generation config's)."""
        return self.inputs.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids) -> None:
        self.inputs.eos_token_ids = ids

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
        msg = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return RequestOutput.from_sequences(request_id, seqs, True, error=msg)

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
        """One iteration: schedule -> run the model on the batch -> sample -> update -> outputs.

        The scheduler decides (a ``SchedulerOutput``: what runs, which K/V blocks move); the runner moves the
        blocks, then runs the forward. If the forward raises, each scheduled request runs alone and those that
        raise fail (``RequestOutput.error``); a sequence whose sampling or detokenization raises fails alone.
        With a ``speculator``, a decode and its drafts are one verify chunk, accepted per sequence."""
        t = Laps()  # wall seconds of the phases of this step
        out = self._schedule()  # 1. schedule: what runs, which blocks move
        self.runner.move_blocks(out)  # swap out, copy, swap in: before the forward writes any block
        t("schedule")
        if not out.scheduled:
            return self._idle()
        scheduled = out.scheduled
        drafts = self._propose(scheduled) if self.speculator is not None else {}  # k drafts per decode, or none
        try:  # 2. run: the packed batch ("prepare") and the forward ("model")
            logits, batch = self.runner.run(verify_feed(scheduled, drafts), timer=t)
        except Exception as e:
            if drafts:  # give the drafted slots back
                self.speculator.undo(drafts)
            return self._isolate_forward(scheduled, e)
        logits, verify = split_verify(batch, logits, drafts)
        tokens, logprobs, failed = self._sample(logits, batch.sample_seqs)  # 3. sample
        t("sample")
        self.scheduler.update([(s, n) for s, n in scheduled if s.seq_id not in drafts])  # 4. update: K/V cached
        outputs = self._outputs(batch.sample_seqs, tokens, logprobs, verify, failed)  # 5. outputs
        self.kv.sync()  # the pool catches up with this step's blocks (a quantized one seals the full ones)
        t("postprocess")
        self.metrics.record_step(t.times, scheduled, batch.num_decodes)
        return outputs

    def _schedule(self) -> SchedulerOutput:
        """The scheduler's next ``SchedulerOutput``; the first scheduling of each request goes into its metrics."""
        out = self.scheduler.schedule()
        now = time.perf_counter()
        for seq, _ in out.scheduled:
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
                if seq.index == 0:
                    self.histograms["request_queue_time_seconds"].observe(now - seq.metrics.arrival_time)
        return out

    def _idle(self) -> list[RequestOutput]:
        """Nothing was scheduled: no outputs, or an error if waiting requests can never be admitted."""
        s = self.scheduler
        if s.waiting and not s.running and not s.swapped:
            raise RuntimeError(
                f"{len(s.waiting)} waiting requests and none can be admitted "
                f"({self.kv.manager.num_free_blocks()} free blocks): the engine would hang"
            )
        return []

    def _sample(self, logits, seqs: list[Sequence]):
        """One token per row (grammar masks, logit processors, temperature...: ``sampler.sample``), its
        logprobs, and ``failed`` (request id -> exception) for the rows that raised: they fail alone."""
        errors: dict[int, BaseException] = {}
        tokens, logprobs = sample(
            logits,
            seqs,
            self.generator,
            self.tokenizer if any(s.params.logprobs for s in seqs) else None,
            eos_token_ids=sorted(self.eos_token_ids),
            errors=errors,
        )
        failed: dict[str, BaseException] = {}
        for i, e in errors.items():
            failed.setdefault(seqs[i].request_id, e)
        return tokens, logprobs, failed

    def _outputs(self, seqs, tokens, logprobs, verify, failed: dict) -> list[RequestOutput]:
        """The new tokens appended (stop checks, detokenization), drafts accepted, one output per request."""
        now = time.perf_counter()
        for seq, tok, lp in zip(seqs, tokens, logprobs):
            if getattr(seq, "spec", None) is not None:
                seq.spec.target_forwards += 1
                seq.spec.emitted += 1
            if seq.request_id in failed or seq.finished:
                continue
            try:
                self.append_token(seq, tok, lp, now)
            except Exception as e:
                failed.setdefault(seq.request_id, e)
        for d, rows_k in verify:  # speculation: accept per sequence, roll back the rejected slots
            self._accept(d, rows_k, now, failed)
        rids = dict.fromkeys([s.request_id for s in seqs] + [d.seq.request_id for d, _ in verify])
        if self.speculator is not None:  # the draft pool's blocks of finished sequences go back now
            self.speculator.release({s.seq_id for s in self.scheduler.running})
        outputs = [self.fail_request(r, failed[r]) if r in failed else self._output(r) for r in rids]
        return [o for o in outputs if o is not None]

    def close(self) -> None:
        """Release what the engine holds beside memory (``AsyncLLMEngine``: its worker thread); nothing here."""

    # ---- speculative decoding in the batch (spec_batch.BatchSpeculator) --------------------------
    def _propose(self, scheduled) -> dict:
        """Drafts for this step's decodes within the token budget left (``BatchSpeculator.propose``); the
        draft state of sequences no longer running is freed first."""
        self.speculator.release({s.seq_id for s in self.scheduler.running})
        budget = self.config.max_num_batched_tokens - sum(n for _, n in scheduled)
        return self.speculator.propose(scheduled, budget, self.generator)

    def _accept(self, d, logits, now: float, failed: dict) -> None:
        """One verified sequence: the rejection rule and the rollback (``BatchSpeculator.accept``), then its
        new tokens through the engine's path (stop rules, logprobs, detokenization)."""
        seq = d.seq
        if seq.request_id in failed or seq.finished:
            self.speculator.rollback(d, 0)
            return
        try:
            new = self.speculator.accept(d, logits, self.generator)
        except Exception as e:
            self.speculator.undo({seq.seq_id: d})
            failed.setdefault(seq.request_id, e)
            return
        self.manager_mark(seq)
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
                self.append_token(seq, tok, lp, now)
            except Exception as e:
                failed.setdefault(seq.request_id, e)
                return
            if seq.spec is not None:
                seq.spec.emitted += 1

    @property
    def spec_counters(self):
        """vLLM's speculative-decoding counters (``BatchSpeculator.counters``), or None without speculation."""
        return None if self.speculator is None else self.speculator.counters

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

    def append_token(self, seq: Sequence, tok: int, lp, now: float) -> None:
        """Append one sampled token ``tok`` to ``seq`` (its logprobs ``lp`` or None; ``now`` in perf_counter
        seconds): metrics, incremental detokenization, the stop rules; a finished sequence frees its blocks.
        The step calls it per sequence inside its fault isolation (an exception fails that request alone)."""
        p, m = seq.params, seq.metrics
        if seq.num_preemptions == 0 and not seq.output_token_ids:
            self.metrics.first_token(len(seq.prompt_token_ids), seq.num_cached_tokens)
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

    def _output(self, request_id: str) -> RequestOutput:
        seqs = self.requests[request_id]
        done = all(s.finished for s in seqs)
        if done:
            del self.requests[request_id]
            self.metrics.request_finished(seqs[0].metrics)
        return RequestOutput.from_sequences(request_id, seqs, done)

    # ---- tokens <-> text -----------------------------------------------------------------------
    def encode(self, prompt) -> list[int]:
        """A text prompt's token ids (needs a tokenizer), or a list of token ids checked and copied."""
        return self.inputs.encode(prompt)

    def decode(self, ids) -> str:
        return self.inputs.decode(ids)

    # ---- weights and state ---------------------------------------------------------------------
    def load_weights(self, state_dict) -> None:
        """Swap the model's weights in place and forget the prefix cache (its K/V came from the old weights).

        ``state_dict`` uses the package's parameter names, or ``transformers``' (``model.layers.N...``, e.g.
        a trained ``LlamaForCausalLM``'s), mapped as ``models.from_hf`` does. Requests already running keep
        the K/V they computed with the old weights (as in vLLM)."""
        load_state_dict(self.model, state_dict)  # loading.py
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
            **({"compile": dict(self.runner.compiled.stats)} if self.runner.compiled else {}),
            **self.stats,
        }


class AsyncLLMEngine(AsyncScheduling, LLMEngine):
    """``LLMEngine`` with vLLM v1's async scheduling: ``AsyncScheduling`` (async_engine.py) overrides ``step``
    and reuses this class's parts. ``LLMEngine(..., async_scheduling=True)`` builds it."""


__all__ = ["PHASES", "AsyncLLMEngine", "LLMEngine", "SequenceStatus", "resolve_model", "resolve_tokenizer"]
