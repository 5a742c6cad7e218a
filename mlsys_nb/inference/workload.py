"""Serving workloads: Poisson arrivals, prompt/output length distributions, shared prefixes; a replay loop.

``make_workload(n, rate=..., prompt_len=(16, 256), output_len=(16, 256), shared_prefix_len=0,
n_prefixes=1, vocab_size=256, seed=0)`` -> ``[WorkloadRequest]``: arrival times in seconds after the
start (a Poisson process of ``rate`` requests/s: exponential gaps of mean 1/rate; ``rate=inf`` puts
every request at t=0, the offline "batch" case), prompt and output lengths uniform in the closed
ranges, and, with ``shared_prefix_len``, every prompt starting with one of ``n_prefixes`` random
prefixes (a system prompt shared by many users). Seeded: the same arguments give the same requests.

``run_workload(engine, requests, realtime=True)`` replays them on an ``LLMEngine``: a request is
added when the wall clock passes its arrival time (its metrics count from that arrival, so queueing
shows in TTFT), the engine steps while anything is pending, and the loop sleeps when idle until the
next arrival. Greedy decoding with ``ignore_eos`` so every request produces exactly its output length.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

from ..config import check_int, check_number
from ..runtime.timing import Laps
from .sampling_params import SamplingParams


@dataclass(frozen=True)
class WorkloadRequest:
    request_id: str
    arrival_time: float  # seconds after the start of the run
    prompt_token_ids: list
    max_tokens: int


def _range(name, value):
    lo, hi = value
    check_int(f"{name} low", lo, 1)
    check_int(f"{name} high (>= its low)", hi, lo)

    return lo, hi


def make_workload(
    n: int,
    *,
    rate: float = math.inf,
    prompt_len=(16, 256),
    output_len=(16, 256),
    shared_prefix_len: int = 0,
    n_prefixes: int = 1,
    vocab_size: int = 256,
    seed: int = 0,
) -> list[WorkloadRequest]:
    check_int("n", n, 1)
    if rate != math.inf:  # math.inf: all requests at once
        check_number("rate", rate, 0, lo_open=True, unit="requests per second (or math.inf)")
    p_lo, p_hi = _range("prompt_len", prompt_len)
    o_lo, o_hi = _range("output_len", output_len)
    check_int(f"shared_prefix_len (prompt_len low={p_lo})", shared_prefix_len, 0, p_lo - 1)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(vocab_size) for _ in range(shared_prefix_len)] for _ in range(n_prefixes)]
    t, out = 0.0, []
    for i in range(n):
        if i and math.isfinite(rate):
            t += rng.expovariate(rate)
        length = rng.randint(p_lo, p_hi)
        prefix = prefixes[rng.randrange(n_prefixes)] if shared_prefix_len else []
        prompt = prefix + [rng.randrange(vocab_size) for _ in range(length - len(prefix))]
        out.append(WorkloadRequest(str(i), t, prompt, rng.randint(o_lo, o_hi)))
    return out


def shared_prefix_tokens(requests, block_size: int) -> int:
    """Prompt tokens a block-granular prefix cache can skip if it never evicts (the analytical count):
    per request, the full blocks of its longest prefix shared with an earlier request, at least one
    prompt token always computed."""
    seen: set[tuple] = set()
    total = 0
    for r in requests:
        ids = r.prompt_token_ids
        n_full = (len(ids) - 1) // block_size
        hit = 0
        while hit < n_full and tuple(ids[: (hit + 1) * block_size]) in seen:
            hit += 1
        total += hit * block_size
        seen.update(tuple(ids[: (k + 1) * block_size]) for k in range(len(ids) // block_size))
    return total


def run_workload(engine, requests, *, realtime: bool = True, use_tqdm: bool = True, timeout: float = 600.0):
    """Replay ``requests`` on ``engine``; returns (outputs in request order, wall seconds)."""
    from tqdm.auto import tqdm

    pending = sorted(requests, key=lambda r: r.arrival_time)
    done, clock, i = {}, Laps(), 0  # clock.start: the perf_counter timestamp arrivals count from
    with tqdm(total=len(pending), desc="workload", disable=not use_tqdm) as bar:
        while len(done) < len(pending):
            now = clock.elapsed()
            if now > timeout:
                raise TimeoutError(f"workload not finished after timeout={timeout} s ({len(done)}/{len(pending)} done)")
            while i < len(pending) and (not realtime or pending[i].arrival_time <= now):
                r = pending[i]
                engine.add_request(
                    r.request_id,
                    r.prompt_token_ids,
                    SamplingParams(temperature=0, max_tokens=r.max_tokens, ignore_eos=True),
                    arrival_time=clock.start + (r.arrival_time if realtime else 0.0),
                )
                i += 1
            if engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
            elif i < len(pending):
                time.sleep(max(0.0, pending[i].arrival_time - clock.elapsed()))
    return [done[r.request_id] for r in requests], clock.elapsed()
