"""The thread that drives the engine: ``AsyncEngine`` puts an ``LLMEngine`` behind a lock, steps it on one
background thread while requests are pending, and hands each output to its request's ``asyncio.Queue`` on
the request's event loop (vLLM's ``AsyncLLM`` over its engine core, in one process here).

The engine is not thread-safe: every call into it holds ``AsyncEngine.lock``. If a step raises, the engine
has already failed only the requests that caused it (``LLMEngine.step``'s fault isolation); if the step
fails as a whole, every request gets an error output (``fail_all``) and the thread goes on.
It also keeps what ``/metrics`` and ``Retry-After`` read: tokens generated per step and the times requests
left the engine, over the last ``token_window`` seconds; ``prometheus_text()`` is the ``/metrics`` page.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque

from .protocol import retry_after_seconds


class AsyncEngine:
    """The engine behind a lock, stepped by one background thread; per-request asyncio queues of outputs.

    ``token_window`` seconds of (time, tokens) are kept for tokens/s, and of the times requests left the
    engine for ``Retry-After`` (both trimmed at every step); ``clock`` gives those times in seconds.
    ``preparing`` (requests being tokenised or compiled), ``aborted`` and ``rejected`` are counted by the routes."""

    def __init__(self, engine, token_window: float = 10.0, clock=time.perf_counter):
        self.engine, self.lock = engine, threading.Lock()
        self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.work = threading.Event()
        self.stopped = False
        self.aborted = self.rejected = self.preparing = 0
        self.num_waiting = self.num_running = 0  # requests in the engine, updated under the lock
        self.token_window = token_window
        self.token_log: deque[tuple[float, int]] = deque()  # (time, tokens generated in that step)
        self.clock = clock
        self.left_log: deque[float] = deque(maxlen=2**16)  # times requests left the engine (finished, failed, aborted)
        self.thread = threading.Thread(target=self.loop, name="engine", daemon=True)
        self.thread.start()

    def submit(self, request_id: str, prepared) -> asyncio.Queue:
        """Queue a request prepared by ``engine.prepare`` (quick: the long work is done)."""
        q: asyncio.Queue = asyncio.Queue()
        with self.lock:
            self.engine.add_request(request_id, None, prepared=prepared)
            self.queues[request_id] = (asyncio.get_running_loop(), q)
            self.num_waiting += 1
        self.work.set()
        return q

    def abort(self, request_id: str) -> None:
        """Abort ``request_id`` if it is still in the engine (its blocks are freed at once); drop its queue."""
        with self.lock:
            if request_id in self.engine.requests:
                self.engine.abort_request(request_id)
                self.aborted += 1
                self.left_log.append(self.clock())
            self.queues.pop(request_id, None)
            self.count()

    def count(self) -> None:
        """Refresh ``num_waiting`` / ``num_running`` from the engine (call under the lock)."""
        c = self.engine.request_counts()
        self.num_waiting, self.num_running = c["waiting"], c["running"]

    def retry_after(self) -> int:
        """``Retry-After`` seconds for a request refused now (``retry_after_seconds`` of the queue). Without the
        engine lock (a step may hold it): the counts are the ones the admission check read, the copy is atomic."""
        waiting, left = self.num_waiting + self.preparing, list(self.left_log)
        return retry_after_seconds(waiting, left, self.clock(), self.token_window)

    def tokens_per_second(self) -> float:
        """Tokens generated over the last ``token_window`` seconds, per second."""
        now, log = self.clock(), list(self.token_log)
        return sum(n for t, n in log if t >= now - self.token_window) / self.token_window

    def loop(self) -> None:
        """The engine thread: wait for work, step, deliver the outputs (outside the lock)."""
        while not self.stopped:
            if not self.work.wait(timeout=0.5):
                continue
            with self.lock:
                if not self.engine.has_unfinished_requests():
                    self.work.clear()
                    self.count()
                    continue
                targets = self.step()
            for out, target in targets:
                if target is not None:
                    loop, q = target
                    with contextlib.suppress(RuntimeError):  # the client's loop is closed
                        loop.call_soon_threadsafe(q.put_nowait, out)

    def step(self) -> list:
        """One engine step under the lock: ``[(output, its request's (loop, queue) or None)]``; finished
        requests leave ``queues``; the token and departure logs are updated and trimmed."""
        before = self.engine.stats["generation_tokens"]
        try:
            outputs = self.engine.step()  # fails only the requests whose sequences raise
        except Exception as e:  # the step failed as a whole: fail every request, with an error event
            outputs = self.engine.fail_all(e)
        now = self.clock()
        self.token_log.append((now, self.engine.stats["generation_tokens"] - before))
        while self.token_log and self.token_log[0][0] < now - self.token_window:
            self.token_log.popleft()
        targets = [(out, self.queues.get(out.request_id)) for out in outputs]
        for out in outputs:
            if out.finished:
                self.queues.pop(out.request_id, None)
                self.left_log.append(now)
        while self.left_log and self.left_log[0] < now - self.token_window:
            self.left_log.popleft()
        self.count()
        return targets

    def prometheus_text(self) -> str:
        """``/metrics`` in Prometheus' text format: gauges and counters of requests, sequences, KV blocks and
        tokens, then the engine's latency histograms and speculative-decoding counters (vLLM's names)."""
        engine = self.engine
        with self.lock:
            st, counts = engine.status(), engine.request_counts()
        rows = [
            ("num_requests_running", "gauge", counts["running"]),
            ("num_requests_waiting", "gauge", counts["waiting"] + self.preparing),
            ("num_requests_preparing", "gauge", self.preparing),
            ("num_sequences_running", "gauge", st["running"]),
            ("num_sequences_waiting", "gauge", st["waiting"]),
            ("num_sequences_swapped", "gauge", st["swapped"]),
            ("num_open_streams", "gauge", len(self.queues)),
            ("kv_blocks_used", "gauge", st["blocks_used"]),
            ("kv_blocks_total", "gauge", st["blocks_total"]),
            ("generation_tokens_total", "counter", st["generation_tokens"]),
            ("prompt_tokens_total", "counter", st["prompt_tokens"]),
            ("prefix_cache_hit_tokens_total", "counter", st["cached_tokens"]),
            ("requests_finished_total", "counter", st["requests_finished"]),
            ("requests_aborted_total", "counter", self.aborted),
            ("requests_failed_total", "counter", st["requests_failed"]),
            ("requests_rejected_total", "counter", self.rejected),
            ("preemptions_total", "counter", sum(st["preemptions"].values())),
            ("engine_steps_total", "counter", engine.num_steps),
            ("generation_tokens_per_second", "gauge", round(self.tokens_per_second(), 3)),
        ]
        text = "".join(f"# TYPE mlsys_nb_{n} {t}\nmlsys_nb_{n} {v}\n" for n, t, v in rows)
        with self.lock:
            text += "".join(h.prometheus(f"mlsys_nb_{n}") for n, h in engine.histograms.items())
            if getattr(engine, "spec_counters", None) is not None:  # vLLM's spec_decode_* counters
                text += engine.spec_counters.prometheus("mlsys_nb_")
        return text

    def shutdown(self) -> None:
        """Stop the engine thread (within 5 s)."""
        self.stopped = True
        self.work.set()
        self.thread.join(timeout=5)
