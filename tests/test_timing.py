"""mlsys_nb.runtime.timing: the statistics against ``statistics``/numpy on random lists, the timer and the
repeat loop against a fake clock (no wall-clock time is asserted), the profiler wrapper on a tiny matmul."""

import random
import statistics
import time

import numpy as np
import pytest

from mlsys_nb.runtime import timing
from mlsys_nb.runtime.timing import Laps, Timer, lower_quartile, median, profile_ops, quantile, repeat


class FakeClock:
    """A clock that moves only when told: ``advance(s)``; stands in for perf_counter and process_time."""

    def __init__(self, start=1000.0):
        self.now = start

    def __call__(self):
        return self.now

    def advance(self, s):
        self.now += s


@pytest.fixture
def clocks(monkeypatch):
    wall, cpu = FakeClock(1000.0), FakeClock(5.0)
    monkeypatch.setattr(time, "perf_counter", wall)
    monkeypatch.setattr(time, "process_time", cpu)
    return wall, cpu


@pytest.mark.parametrize("seed", range(20))
def test_statistics_match_references_on_random_lists(seed):
    rng = random.Random(seed)
    xs = [rng.lognormvariate(0, 1) for _ in range(rng.randint(1, 40))]
    assert median(xs) == pytest.approx(float(np.median(xs)), rel=1e-12)
    assert median(iter(xs)) == statistics.median(xs)  # any iterable, not only lists
    assert lower_quartile(xs) == pytest.approx(float(np.quantile(xs, 0.25)), rel=1e-12)
    if len(xs) >= 4:  # the lower quartile sits at or below the median, above the minimum
        assert min(xs) <= lower_quartile(xs) <= median(xs)


def test_the_reference_comparison_bites():
    """The comparisons above tell statistics apart: a mean for the median, or the default (exclusive)
    quantile method for the lower quartile, disagree with the references on these random lists."""
    rng = random.Random(0)
    lists = [[rng.lognormvariate(0, 1) for _ in range(5 + k)] for k in range(10)]
    assert any(statistics.mean(xs) != pytest.approx(float(np.median(xs)), rel=1e-12) for xs in lists)
    wrong_q = [statistics.quantiles(xs, n=4)[0] for xs in lists]
    assert any(w != pytest.approx(float(np.quantile(xs, 0.25)), rel=1e-12) for w, xs in zip(wrong_q, lists))


def test_lower_quartile_is_not_the_median_nor_another_quantile_method():
    xs = [1.0, 2.0, 3.0, 4.0, 100.0]
    assert lower_quartile(xs) == 2.0  # sorted position 0.25 * (5 - 1) = 1
    assert median(xs) == 3.0
    assert statistics.quantiles(xs, n=4)[0] == 1.5  # the default "exclusive" method differs: not this one


@pytest.mark.parametrize("seed", range(20))
def test_quantile_matches_numpy_both_methods(seed):
    rng = random.Random(seed)
    xs = [rng.lognormvariate(0, 1) for _ in range(rng.randint(1, 40))]
    for q in (0.0, 0.1, 0.25, 0.5, 0.9, 0.99, 1.0, rng.random()):
        assert quantile(xs, q) == pytest.approx(float(np.quantile(xs, q)), rel=1e-12)
        assert quantile(xs, q, method="nearest") == float(np.quantile(xs, q, method="nearest"))
        assert quantile(xs, q, method="nearest") in xs  # a measured value, never an interpolated one


def test_quantile_check_bites():
    """The numpy comparison above tells the methods apart, and catches a "nearest" that truncates the
    position instead of rounding it."""
    rng = random.Random(1)
    lists = [[rng.random() for _ in range(3 + k)] for k in range(10)]
    assert any(quantile(xs, 0.9) != quantile(xs, 0.9, method="nearest") for xs in lists)
    truncated = [sorted(xs)[int(0.9 * (len(xs) - 1))] for xs in lists]
    assert any(t != float(np.quantile(xs, 0.9, method="nearest")) for t, xs in zip(truncated, lists))


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(q=1.5), "q"), (dict(q=-0.1), "q"), (dict(q=0.5, method="midpoint"), "method")],
)
def test_quantile_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantile([1.0, 2.0], **kwargs)


def test_statistics_of_nothing_is_a_clear_error():
    with pytest.raises(ValueError, match="xs must hold at least one"):
        median([])
    with pytest.raises(ValueError, match="xs must hold at least one"):
        lower_quartile(iter(()))


def test_timer_reads_the_clock_at_entry_and_exit(clocks):
    wall, cpu = clocks
    t = Timer()
    wall.advance(3.0)  # before the block: not counted
    with t:
        wall.advance(0.25)
    wall.advance(7.0)  # after the block: not counted
    assert t.seconds == 0.25 and t.samples == [0.25]
    assert np.isnan(t.cpu_seconds) and t.cpu_samples == []  # cpu off by default
    with t:
        wall.advance(0.5)
    assert t.seconds == 0.5 and t.samples == [0.25, 0.5]


def test_timer_cpu_seconds_from_process_time(clocks):
    wall, cpu = clocks
    with Timer(cpu=True) as t:
        wall.advance(2.0)
        cpu.advance(0.75)
    assert (t.seconds, t.cpu_seconds) == (2.0, 0.75)
    assert t.cpu_samples == [0.75]


def test_timer_as_decorator_takes_one_sample_per_call_and_survives_errors(clocks):
    wall, _ = clocks
    t = Timer()

    @t
    def work(s):
        wall.advance(s)
        if s > 1:
            raise RuntimeError("boom")
        return s

    assert work(0.125) == 0.125
    assert work(0.5) == 0.5
    with pytest.raises(RuntimeError, match="boom"):
        work(3.0)
    assert t.samples == [0.125, 0.5, 3.0]  # the failing call is timed too, and the timer is free again
    with t:
        pass


def test_timer_refuses_nesting_itself_and_bad_cpu():
    t = Timer()
    with t:
        with pytest.raises(RuntimeError, match="not reentrant"):
            t.__enter__()
    with pytest.raises(TypeError, match="cpu must be a bool"):
        Timer(cpu="yes")


def test_laps_split_one_clock_into_phases(clocks):
    wall, _ = clocks
    wall.advance(2.0)  # before the Laps is made: not counted
    laps = Laps()
    wall.advance(0.25)
    assert laps("schedule") == 0.25
    wall.advance(0.5)
    assert laps("model") == 0.5
    wall.advance(0.125)
    assert laps("schedule") == 0.125  # a repeated phase sums
    assert laps.times == {"schedule": 0.375, "model": 0.5}
    assert laps.elapsed() == 0.875 == sum(laps.times.values())  # the phases tile the time since the start
    wall.advance(1.0)
    assert laps.elapsed() == 1.875 and laps.times == {"schedule": 0.375, "model": 0.5}  # no phase ended
    with pytest.raises(TypeError, match="phase must be a str"):
        laps(3)


def test_laps_check_bites(clocks):
    """A lap timer that forgets to move its mark (each phase counted from the start) fails the check
    above: its phases 0.25 then 0.5 come out as 0.25 and 0.75."""
    wall, _ = clocks

    class NoMark(Laps):
        def __call__(self, phase):
            last = self.last
            seconds = super().__call__(phase)
            self.last = last  # the bug: the next phase is counted from the same mark
            return seconds

    laps = NoMark()
    wall.advance(0.25)
    laps("schedule")
    wall.advance(0.5)
    assert laps("model") != 0.5
    assert laps.times == {"schedule": 0.25, "model": 0.75}


def test_engine_step_times_are_laps(clocks, monkeypatch):
    """The engine's per-step phase times come from ``Laps``: the phases it names, each the fake-clock
    seconds spent in it (the model runner advances the clock by a known amount per phase)."""
    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.sampling_params import SamplingParams

    wall, _ = clocks
    eng = LLMEngine("tiny", seed=0)
    real_run = eng.runner.run

    def run(scheduled, timer=None):
        wall.advance(0.25)  # the prepare phase
        out = real_run(scheduled, timer=None)
        timer("prepare")
        wall.advance(0.5)  # the forward pass
        timer("model")
        return out

    monkeypatch.setattr(eng.runner, "run", run)
    eng.add_request("r", [1, 2, 3], SamplingParams(max_tokens=2, temperature=0.0))
    eng.step()
    step = eng.step_times[-1]
    assert (step["prepare"], step["model"]) == (0.25, 0.5)
    assert set(step) >= {"schedule", "prepare", "model", "sample", "postprocess"}
    assert all(step[k] == 0.0 for k in ("schedule", "sample", "postprocess"))  # the fake clock did not move


def test_repeat_times_each_call_after_untimed_warmup(clocks):
    wall, _ = clocks
    durations = iter([9.0, 9.0, 0.125, 0.25, 0.5])  # dyadic: exact in binary  # the first two calls are the warmup

    def fn():
        wall.advance(next(durations))

    assert repeat(fn, 3, warmup=2) == [0.125, 0.25, 0.5]
    with pytest.raises(StopIteration):
        next(durations)  # exactly warmup + n calls


@pytest.mark.parametrize(
    "kwargs, match",
    [(dict(n=0), "n must be an int >= 1"), (dict(n=2, warmup=-1), "warmup must be an int >= 0"), (dict(n=1.5), "n")],
)
def test_repeat_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        repeat(lambda: None, **kwargs)
    with pytest.raises(TypeError, match="fn must be callable"):
        repeat(3, 1)


def test_timer_uses_the_module_clock():
    """The fake clock only works because timing reads ``time.perf_counter`` at call time: a module that
    bound ``perf_counter`` at import would ignore the monkeypatch, and the tests above would fail."""
    assert not hasattr(timing, "perf_counter")


def test_profile_ops_on_a_tiny_matmul():
    import torch

    a, b = torch.randn(32, 16), torch.randn(16, 8)
    ops = profile_ops(lambda: a @ b)
    assert "aten::mm" in ops
    assert all(s >= 0 for s in ops.values())
    assert list(ops.values()) == sorted(ops.values(), reverse=True)  # largest first
    added = profile_ops(lambda: a + a)  # a different op shows up under its own name
    assert "aten::add" in added and "aten::mm" not in added
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        profile_ops(lambda: None, warmup=-1)
