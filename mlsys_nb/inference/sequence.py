"""One sequence's state inside the engine, and what ``LLM.generate`` returns (vLLM's output types).

A ``Sequence`` is a prompt plus the tokens generated so far. ``num_computed_tokens`` counts the
leading tokens whose K/V are in the cache: the scheduler feeds the model ``token_ids[num_computed:]``
(a prefill chunk, or the one last sampled token of a decode). A request with ``n > 1`` is ``n``
sequences with the same prompt (its full blocks are shared through the prefix cache).

Status: WAITING (queued, or preempted by recompute: its cache was dropped) -> RUNNING ->
FINISHED; SWAPPED when preempted by swapping its blocks to the CPU pool.

Outputs: ``RequestOutput(request_id, prompt, prompt_token_ids, outputs=[CompletionOutput], finished,
metrics, num_cached_tokens, error)``; ``CompletionOutput(index, text, token_ids, cumulative_logprob,
logprobs, finish_reason, stop_reason)``; ``RequestMetrics`` holds wall-clock times in seconds (``time.perf_counter``).
``Histogram`` aggregates them over requests in Prometheus' cumulative buckets (vLLM's bounds), for ``/metrics``.
"""

from __future__ import annotations

import bisect
import enum
import itertools
from dataclasses import dataclass, field

from .sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    FINISHED = "finished"


@dataclass
class Logprob:
    """One token's log-probability, its rank in the model's distribution (1 = most likely), its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's bucket bounds (seconds) for its request-latency histograms (vLLM v1, vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
TTFT_BUCKETS += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0)
LATENCY_BUCKETS += (240.0, 480.0, 960.0, 1920.0, 7680.0)


class Histogram:
    """A Prometheus histogram: counts of observations at or below each bound (seconds), their sum and count.

    ``observe(x)`` adds one value; ``counts[i]`` is the number of values <= ``bounds[i]`` (cumulative, as
    Prometheus' ``le`` buckets), and ``count`` includes the values above the last bound (the ``+Inf``
    bucket). Memory is one counter per bound, whatever the number of requests."""

    def __init__(self, bounds=LATENCY_BUCKETS):
        self.bounds = tuple(float(b) for b in bounds)
        if not self.bounds or any(b >= c for b, c in zip(self.bounds, self.bounds[1:])):
            raise ValueError(f"bounds={bounds!r}: must be a non-empty, strictly increasing sequence of seconds")
        self._per_bucket = [0] * (len(self.bounds) + 1)  # the last one is (last bound, +Inf)
        self.sum, self.count = 0.0, 0

    def observe(self, x: float) -> None:
        self._per_bucket[bisect.bisect_left(self.bounds, x)] += 1
        self.sum += x
        self.count += 1

    @property
    def counts(self) -> list[int]:
        out, run = [], 0
        for n in self._per_bucket[:-1]:
            run += n
            out.append(run)
        return out

    def prometheus(self, name: str) -> str:
        """The histogram in Prometheus' text exposition format, under metric ``name``."""
        lines = [f"# TYPE {name} histogram"]
        lines += [f'{name}_bucket{{le="{b:g}"}} {n}' for b, n in zip(self.bounds, self.counts)]
        lines += [
            f'{name}_bucket{{le="+Inf"}} {self.count}',
            f"{name}_sum {self.sum:.6f}",
            f"{name}_count {self.count}",
        ]
        return "\n".join(lines) + "\n"


@dataclass
class RequestMetrics:
    """Times in seconds on the ``time.perf_counter`` clock; ``token_times`` one per generated token."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    token_times: list[float] = field(default_factory=list)

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival -> first generated token (queueing + prefill)."""
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (last - first) / (tokens - 1)."""
        n = len(self.token_times)
        return None if n < 2 else (self.token_times[-1] - self.token_times[0]) / (n - 1)

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: gaps between consecutive generated tokens."""
        t = self.token_times
        return [b - a for a, b in itertools.pairwise(t)]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = None  # "length" | "stop" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    num_cached_tokens: int = 0
    error: str | None = None  # set when the engine failed this request (its sequences raised); finished

    @classmethod
    def from_sequences(cls, request_id: str, seqs: list[Sequence], finished: bool, error: str | None = None):
        """The output of a request from its ``Sequence`` objects, one per sample (``SamplingParams.n``): the
        first holds the prompt, the request's metrics and its prefix-cached tokens."""
        s0 = seqs[0]
        outputs = [s.completion() for s in seqs]
        prompt_ids = list(s0.prompt_token_ids)
        return cls(request_id, s0.prompt, prompt_ids, outputs, finished, s0.metrics, s0.num_cached_tokens, error)


class Sequence:
    def __init__(
        self,
        seq_id: int,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        index: int = 0,
        arrival_time: float = 0.0,
        generator=None,
        prompt: str | None = None,
    ):
        self.seq_id, self.request_id, self.index = seq_id, request_id, index
        self.prompt = prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.params, self.generator = params, generator
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at the first admission
        self.num_preemptions = 0
        self.logprobs: list[dict[int, Logprob]] | None = [] if params.logprobs is not None else None
        self.cumulative_logprob = 0.0
        self.text = ""  # detokenized so far (never ends inside a UTF-8 character while running)
        self.detok = None  # the tokenizer's incremental decoder
        self.finish_reason: str | None = None
        self.stop_reason: int | str | None = None
        self.metrics = RequestMetrics(arrival_time)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        """Tokens still to feed the model before the next token can be sampled (1 for a decode)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """Still computing the prompt (or recomputing after a preemption): more than one token to feed."""
        return self.num_uncomputed > 1 or not self.output_token_ids

    @property
    def finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED

    def completion(self) -> CompletionOutput:
        return CompletionOutput(
            self.index,
            self.text,
            list(self.output_token_ids),
            self.cumulative_logprob if self.logprobs is not None else None,
            list(self.logprobs) if self.logprobs is not None else None,
            self.finish_reason,
            self.stop_reason,
        )

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, {self.status.value}, prompt={len(self.prompt_token_ids)}, "
            f"out={len(self.output_token_ids)}, computed={self.num_computed_tokens})"
        )
