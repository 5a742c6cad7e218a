"""Notebook 15 under papermill with other parameters (the defaults run under nbval): another seed and
request count, the worked solutions of the exercises, and ``quick=False`` (the full sweeps and section 9's compiled
engine). Also: each check of sections 5 and 6 fails
when its idea is broken (a runner whose preparation costs a fixed time per sequence; a wrong reading of
the profiler trace's host time; a wrong overlap formula; async scheduling's look-ahead run in line)."""

import time

import pytest
from nbrun import passed_labels, printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_15_other_seed_with_solutions():
    nb = run_notebook("15_batching_and_scheduling.ipynb", seed=1, n_requests=12, solutions=True, quick=False)
    text = printed_text(nb)
    print(text)
    labels = passed_labels(nb)
    for check in (
        "continuous batching needs",
        "every chunked step stays within",
        "preempted requests",
        "prefix-cache hits equal the analytical count",
        "model time per token falls",
        "the host time per step from the trace's ranges agrees with the engine's timers",
        "the overlap speed-up (c + g) / max(c, g) agrees with the simulated overlapped loop",
        "async scheduling gives the synchronous engine's tokens",
        "more load -> more throughput",
        "the OpenAI client gets the offline engine's text",
        "the compiled engine gives eager's greedy tokens; one graph, 0 recompiles",  # section 9 (quick=False only)
    ):
        assert any(check in label for label in labels), (check, labels)
    assert any(label.startswith("exercise 1") for label in labels), labels
    assert any(label.startswith("exercise 2") for label in labels), labels


PER_SEQUENCE_S = 1e-3  # the broken runner's preparation cost per sequence (busy wait, so it is CPU time)


def _overhead_rows(per_sequence_s):
    """Notebook 15 section 5's measurement at its end points (batches 1 and 16: the ratio reads only
    those), optionally with a runner whose preparation costs ``per_sequence_s`` seconds per scheduled
    sequence; both kinds interleaved."""
    import torch

    from mlsys_nb.inference import LLM
    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.metrics import measure_decode_overhead
    from mlsys_nb.inference.model_runner import ModelRunner

    class PerSequencePrepare(ModelRunner):
        def run(self, scheduled, timer=None):
            end = time.perf_counter() + per_sequence_s * len(scheduled)
            while time.perf_counter() < end:  # falls into the "prepare" phase of the step's timer
                pass
            return super().run(scheduled, timer)

    torch.set_num_threads(1)
    base = LLM("tiny", seed=0).engine.model

    def make():
        eng = LLMEngine(base, max_num_seqs=64)
        if per_sequence_s:
            eng.runner = PerSequencePrepare(eng.model, eng.kv)
        return eng

    return measure_decode_overhead(make, (1, 16), steps=20, use_tqdm=False)


def test_cpu_per_sequence_check_fails_for_a_per_sequence_preparation():
    from mlsys_nb.inference.metrics import cpu_per_sequence_ratio

    good, bad = cpu_per_sequence_ratio(_overhead_rows(0.0)), cpu_per_sequence_ratio(_overhead_rows(PER_SEQUENCE_S))
    print(f"CPU time per sequence, batch 16 / batch 1: engine {good:.2f}, per-sequence preparation {bad:.2f}")
    assert good < 0.5  # the notebook's check passes for the engine ...
    assert bad >= 0.5  # ... and fails for a preparation that costs a fixed time per sequence


def test_host_time_check_fails_for_a_wrong_reading_of_the_trace():
    """Notebook 15 section 5's traced decode steps (smaller: 16, 4 and 1 sampling sequences): the host
    time read from the trace (step range minus model range) agrees with the engine's timers; taking the
    whole step as model time, forgetting to subtract the model, or pairing each step's ranges with
    another step's timers fails the same check."""
    import tempfile

    import torch

    from mlsys_nb.inference import LLM, SamplingParams
    from mlsys_nb.inference.engine import PHASES, LLMEngine
    from mlsys_nb.runtime.profiling import (
        host_time_mismatch,
        inner_time,
        light_profile,
        load_trace,
        most_agree,
        trace_range,
    )

    torch.set_num_threads(1)
    window = (16, 4, 1)
    eng = LLMEngine(LLM("tiny", seed=0).engine.model, max_num_seqs=64)
    n = 0
    for k, (b, later) in enumerate(zip(window, window[1:] + (0,))):
        for _ in range(b - later):
            sp = SamplingParams(temperature=0.8, top_k=40, top_p=0.9, max_tokens=3 + k, ignore_eos=True, seed=n)
            eng.add_request(f"s{n}", [(7 * n + j) % 200 + 1 for j in range(4)], sp)
            n += 1
    eng.step(), eng.step()
    with light_profile("cpu") as prof:
        with trace_range("profiler warm-up"):
            pass
        for _ in window:
            eng.step()
    with tempfile.TemporaryDirectory() as tmp:
        prof.export_chrome_trace(f"{tmp}/decode.json")
        events = load_trace(f"{tmp}/decode.json")
    steps = list(eng.step_times)[-len(window) :]
    assert [s["num_seqs"] for s in steps] == list(window)
    timers = [(sum(s[p] for p in PHASES) * 1e6, s["model"] * 1e6) for s in steps]
    trace = inner_time(events, "engine.step", "engine.model")
    print("trace (step, model) us:", trace, "\ntimers:", timers)
    assert most_agree(host_time_mismatch(trace, timers))  # the notebook's check passes ...
    wrong = {
        "whole step as model time": [(st, st) for st, _ in trace],
        "model not subtracted": [(st, 0.0) for st, _ in trace],
        "another step's ranges": trace[1:] + trace[:1],
    }
    for name, rows in wrong.items():  # ... and fails for each wrong reading
        assert not most_agree(host_time_mismatch(rows, timers)), name


def test_simulate_overlap_by_hand():
    from mlsys_nb.inference.metrics import simulate_overlap

    # CPU 1 s, model 2 s, 3 steps: sequential 9 s; overlapped the model runs back to back after 1 s: 7 s
    assert simulate_overlap([1, 1, 1], [2, 2, 2]) == (9.0, 7.0)
    # CPU-bound: CPU 2 s, model 1 s: the CPU runs back to back (6 s), the last model step adds 1 s
    assert simulate_overlap([2, 2, 2], [1, 1, 1]) == (9.0, 7.0)
    # a slow model step (5 s): the CPU prepares step 1 meanwhile, then waits for its launch at 6 s
    # (one step of look-ahead); steps 1 and 2 end at 7 s and 8 s
    assert simulate_overlap([1, 1, 1], [5, 1, 1]) == (10.0, 8.0)
    with pytest.raises(ValueError, match="one value per step"):
        simulate_overlap([1], [1, 2])


def test_overlap_check_fails_for_a_wrong_formula():
    from mlsys_nb.inference.metrics import overlap_model_error, overlap_speedup

    ratios = [r / 20 for r in range(1, 81)]  # as notebook 15 section 6
    assert overlap_model_error(overlap_speedup, ratios) <= 1 / 200 + 1e-12
    for wrong in (
        lambda c, g: 1 + c / g,  # right only while c <= g
        lambda c, g: (c + g) / min(c, g),
        lambda c, g: 2.0,
        lambda c, g: (c + g) / (c + g / 2),
    ):
        assert overlap_model_error(wrong, ratios) > 1 / 200


def test_async_overlap_check_fails_for_a_look_ahead_run_in_line(monkeypatch):
    """Notebook 15 section 6's async check (smaller: batch 4, 2 rounds of 4 steps): the worker's preparation
    finishes before the forward it runs beside; a look-ahead run in line on the engine's thread (before the
    forward, the same work, the same tokens) fails it."""
    from concurrent.futures import Future

    import torch

    from mlsys_nb.inference import LLM
    from mlsys_nb.inference.async_engine import LookAhead
    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.metrics import measure_async_scheduling

    torch.set_num_threads(1)
    base = LLM("tiny", seed=0).engine.model

    def measure():
        return measure_async_scheduling(lambda on: LLMEngine(base, async_scheduling=on), 4, rounds=2, steps=4)

    good = measure()
    assert good["outputs_equal"] and good["overlapped"] >= 0.5  # the notebook's check passes ...

    def in_line(self, fn, *args):
        done = Future()
        done.set_result(fn(*args))
        return done

    monkeypatch.setattr(LookAhead, "start", in_line)
    bad = measure()
    assert bad["outputs_equal"] and bad["overlapped"] < 0.5  # ... and fails for a look-ahead run in line
