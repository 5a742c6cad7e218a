"""RLHF placement on Ray actors (one local cluster for the module): co-located, sync and one-step
off-policy async runs, the closed forms, a rollout actor that dies mid-step, no Ray process left."""

import math
import os

import pytest

from mlsys_nb.rl import placement as pl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sft_rm():
    """Notebook 18's RLHF task: the SFT policy and reward model (state dicts), trained once for the module
    (the Ray runs and the local runs start from the same ``rlhf_init(seed=1, steps=150)``; ``run`` copies
    them into its workers' models and never writes to them). Seed 1 and 150 steps are test_nb_18's, but its
    notebook runs under other CPU kernels (``other_capability``), whose start has another key (``rlhf.start_key``
    holds the kernels: they train another model) and another cache: trained here once per source and kernels,
    then loaded from ``rlhf.save_start``'s cache."""
    return pl.rlhf_init(seed=1, steps=150)


@pytest.fixture(scope="module")
def cluster(request):
    import psutil
    import ray

    out = {}
    with pl.ray_session(num_cpus=2, object_store_mb=200) as session:
        out["session"] = session
        workers = [pl.actor_class().remote() for _ in range(2)]
        # the SFT policy and reward model, loaded or trained here (the first time) while the actors start up
        init = request.getfixturevalue("sft_rm")
        for mode in ("colocated", "sync", "async"):
            out[mode] = pl.run(mode, 4, workers=workers)
        out["crash"] = pl.run("async", 4, die_at_step=2, workers=workers)
        out["workers_after"] = ray.get([w.pid.remote() for w in workers], timeout=60)
        out["worker_pythonpath"] = psutil.Process(out["workers_after"][0]).environ().get("PYTHONPATH", "")
        # notebook 18's RLHF task: PPO on the SFT policy and reward model, rollouts from the serving engine
        for mode in ("colocated", "sync", "async"):
            out["rlhf_" + mode] = pl.run(mode, 6, task="rlhf", init=init, batch=32, workers=workers, timeout_s=120)
        # the broken idea: "async" whose generation of batch t+1 waits for training step t (as stale, no overlap)
        out["rlhf_serial"] = pl.run(
            "async", 4, overlap=False, task="rlhf", init=init, batch=32, workers=workers, timeout_s=120
        )
        # after the last sync of the split run the rollout engine must serve the trainer's weights
        pl.run("sync", 2, task="rlhf", init=init, batch=16, workers=workers, timeout_s=120)
        trainer, rollout = workers
        wt, wr = ray.get([trainer.get_weights.remote(), rollout.get_weights.remote()], timeout=60)
        out["bit_equal"] = wt.keys() == wr.keys() and all(bool((wt[k] == wr[k]).all()) for k in wt)
        out["greedy"] = ray.get([trainer.greedy.remote(), rollout.greedy.remote()], timeout=60)
        ray.get(rollout.reset.remote(task="rlhf", init=init), timeout=60)  # back to the SFT policy
        out["init_greedy"] = ray.get(rollout.greedy.remote(), timeout=60)
    # ray_session's finally shut Ray down and checked this session's raylet/gcs_server are gone
    out["left"] = pl.leftover_ray_processes(out["session"])
    return out


def test_ray_shut_down_and_nothing_left(cluster):
    import ray

    assert not ray.is_initialized()
    assert cluster["left"] == []
    # the workers started with ray_session's directory of skipped imports first on PYTHONPATH; it is gone now
    skip_dir = cluster["worker_pythonpath"].split(os.pathsep)[0]
    assert os.path.basename(skip_dir).startswith("mlsys_nb_ray_skip_"), cluster["worker_pythonpath"]
    assert not os.path.exists(skip_dir)


def test_ray_processes_skip_the_slow_optional_import():
    """``jsonschema`` (imported by every Ray process) imports ``rfc3987_syntax`` when installed, seconds of
    CPU per process; with ray_session's directory first on PYTHONPATH it does not, and still validates.
    Without the directory (the broken idea) the same process does import it."""
    import importlib.util
    import shutil
    import subprocess
    import sys

    code = (
        "import sys, jsonschema; jsonschema.validate({'a': 1}, {'type': 'object'}); "
        "print('rfc3987_syntax' in sys.modules)"
    )
    from mlsys_nb.runtime.ports import skipped_imports_dir

    skip_dir = skipped_imports_dir()
    try:
        envs = {"skipped": dict(os.environ, PYTHONPATH=skip_dir)}
        if importlib.util.find_spec("rfc3987_syntax") is not None:
            envs["not skipped"] = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        procs = {
            k: subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
            for k, env in envs.items()
        }
        got = {k: p.communicate(timeout=120)[0].strip() for k, p in procs.items()}
    finally:
        shutil.rmtree(skip_dir)
    assert got["skipped"] == "False", got
    assert got.get("not skipped", "True") == "True", got


def test_weight_versions_show_on_and_off_policy(cluster):
    # sync/co-located: batch t is generated by the weights after t training steps (on-policy)
    assert cluster["colocated"].versions == [0, 1, 2, 3]
    assert cluster["sync"].versions == [0, 1, 2, 3]
    # async: generation of t+1 overlaps training of t, so batch t comes from weights one step old
    assert cluster["async"].versions == [0, 0, 1, 2]
    for mode in ("colocated", "sync", "async"):
        assert cluster[mode].trainer_version == 4


def _overlaps(r, min_share=0.75) -> bool:
    """The async idea, checked on when the phases ran (not on wall-time ratios, which a busy neighbour
    distorts): generation of batch t+1 runs during training step t in at least ``min_share`` of the steps."""
    return r.overlapped_share() >= min_share


def test_async_overlaps_generation_with_training(cluster):
    a = cluster["rlhf_async"]
    assert len(a.overlap_s()) == 5 and _overlaps(a), a.overlap_s()
    for mode in ("colocated", "sync", "rlhf_colocated", "rlhf_sync"):
        r = cluster[mode]
        # serial layouts: never any overlap, and every phase starts after the one before it ended
        assert r.overlap_s() == [0.0] * (len(r.versions) - 1) and not _overlaps(r), (mode, r.overlap_s())
        for (g0, g1), (t0, t1) in zip(r.gen_at, r.train_at):
            assert r.t0 <= g0 < g1 <= t0 < t1, (mode, r.gen_at, r.train_at)


def test_serialised_async_fails_the_overlap_check(cluster):
    s = cluster["rlhf_serial"]
    assert s.versions == [0, 0, 1, 2]  # as stale as the real async mode: the versions cannot tell them apart
    assert s.overlap_s() == [0.0] * 3 and not _overlaps(s), s.overlap_s()


def test_closed_forms_by_hand():
    assert pl.sync_step_s(3.0, 2.0, 0.5) == 5.5
    assert pl.async_step_s(3.0, 2.0, 0.5) == 3.5
    assert pl.async_step_s(1.0, 2.0, 0.5) == 2.5


def test_dead_rollout_is_replaced_and_training_state_kept(cluster):
    r = cluster["crash"]
    assert r.replaced == 1
    assert r.trainer_version == 4  # every training step happened once: the trainer never restarted
    assert len(r.versions) == 4 and r.versions[2] >= 1  # the replacement got the trainer's weights
    assert len(set(cluster["workers_after"])) == 2


def test_rlhf_task_split_layout_equals_colocated_step_for_step(cluster):
    """On-policy runs of notebook 18's task: the split layout (trainer and rollout actors, weights sent
    after every step into the engine's ``load_weights``) samples exactly what the co-located hybrid
    does, so the true rewards agree step for step; a sync that lost or delayed weights would not."""
    sync, col = cluster["rlhf_sync"], cluster["rlhf_colocated"]
    assert sync.versions == col.versions == list(range(6))
    assert sync.rewards == col.rewards
    assert sum(sync.rewards[-2:]) / 2 > sync.rewards[0] + 1.0, f"PPO did not raise the true reward: {sync.rewards}"


def test_rlhf_async_is_one_step_stale(cluster):
    a, s = cluster["rlhf_async"], cluster["rlhf_sync"]
    assert a.versions == [0, 0, 1, 2, 3, 4]
    assert a.rewards[0] == s.rewards[0]  # the same first batch from the same initial weights
    assert a.rewards[1:] != s.rewards[1:]  # later batches come from older weights
    assert a.trainer_version == 6


def test_weights_reach_the_rollout_engine(cluster):
    assert cluster["bit_equal"]
    (trained, trained_lp), (served, served_lp) = cluster["greedy"]
    init, init_lp = cluster["init_greedy"]
    assert trained == served  # the engine's greedy tokens are the trainer's
    assert all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-7) for a, b in zip(trained_lp, served_lp))
    # ... and the engine's log-probabilities differ from the SFT policy's (the argmax tokens may not):
    # the check fails if the sync left the engine on the old weights
    assert max(abs(a - b) for a, b in zip(init_lp, served_lp)) > 1e-3, (init_lp, served_lp)


def test_rlhf_task_needs_its_models():
    with pytest.raises(ValueError, match="init"):
        pl.run("sync", 2, task="rlhf")
    with pytest.raises(ValueError, match="task="):
        pl.run("sync", 2, task="chess")


def test_bad_mode_rejected_before_any_actor():
    with pytest.raises(ValueError, match="mode="):
        pl.run("hybrid-ish")
    with pytest.raises(ValueError, match="overlap=False"):
        pl.run("sync", overlap=False)


def test_a_ray_start_that_times_out_is_stopped_and_tried_again(monkeypatch):
    """Ray's node has a fixed 30 s start-up wait that a loaded machine can miss: ray_session stops the failed
    start and tries again (up to start_attempts), naming the attempts; any other error is raised at once."""
    import ray

    calls, stops = [], []
    monkeypatch.setattr(pl, "stop_ray_children", lambda wait_s: stops.append(wait_s))

    def timed_out(**kw):
        calls.append(kw)
        raise Exception("The current node timed out during startup. This could happen because ...")

    monkeypatch.setattr(ray, "init", timed_out)
    with pytest.raises(RuntimeError, match=r"Ray did not start \(2 of start_attempts=2\)"):
        with pl.ray_session(start_attempts=2):
            pass
    assert len(calls) == 2 and len(stops) == 2

    def other(**kw):
        calls.append(kw)
        raise OSError("no space left on device")

    calls.clear()
    monkeypatch.setattr(ray, "init", other)
    with pytest.raises(RuntimeError, match="1 of start_attempts=3"):
        with pl.ray_session():
            pass
    assert len(calls) == 1, "an error other than the start-up timeout must not be retried"
    with pytest.raises(ValueError, match="start_attempts"):
        with pl.ray_session(start_attempts=0):
            pass


def test_stop_ray_children_stops_only_ray_processes():
    import subprocess
    import sys

    code = "import time; time.sleep(120)"
    ray_like = subprocess.Popen([sys.executable, "-c", code, "/site-packages/ray/core/src/ray/raylet/raylet"])
    other = subprocess.Popen([sys.executable, "-c", code, "unrelated"])
    try:
        pl.stop_ray_children(wait_s=10)
        assert ray_like.wait(timeout=10) is not None
        assert other.poll() is None, "a child that is not Ray's must be left alone"
    finally:
        for p in (ray_like, other):
            p.kill()
            p.wait(timeout=10)


# ---------------------------------------------------------------- the same runs without Ray (backend="local")
@pytest.fixture(scope="module")
def local_runs(sft_rm):
    """Notebook 19's default path: the workers as ``LocalActor`` threads of this process, no Ray."""
    kw = dict(task="rlhf", init=sft_rm, batch=16, seed=0, timeout_s=120, backend="local")
    out = {mode: pl.run(mode, 4, **kw) for mode in ("colocated", "sync", "async")}
    out["serial"] = pl.run("async", 4, overlap=False, **kw)
    out["crash"] = pl.run("async", 4, die_at_step=2, **kw)
    out["kw"] = kw
    return out


def test_local_backend_versions_overlap_and_equality(local_runs):
    col, sync, a = local_runs["colocated"], local_runs["sync"], local_runs["async"]
    assert col.versions == sync.versions == [0, 1, 2, 3] and a.versions == [0, 0, 1, 2]
    assert sync.rewards == col.rewards, "the split layout's engine served other weights than the co-located one"
    assert a.rewards[0] == sync.rewards[0] and a.trainer_version == 4
    assert _overlaps(a), a.overlap_s()
    for r in (col, sync):
        assert r.overlap_s() == [0.0] * 3, r.overlap_s()
        for (g0, g1), (t0, t1) in zip(r.gen_at, r.train_at):
            assert r.t0 <= g0 < g1 <= t0 < t1, (r.gen_at, r.train_at)


def test_local_backend_serialised_async_fails_the_overlap_check(local_runs):
    s = local_runs["serial"]
    assert s.versions == [0, 0, 1, 2]
    assert s.overlap_s() == [0.0] * 3 and not _overlaps(s), s.overlap_s()


def test_local_backend_dead_rollout_is_replaced(local_runs):
    r = local_runs["crash"]
    assert r.replaced == 1 and r.trainer_version == 4
    assert len(r.versions) == 4 and r.versions[2] >= 1


def test_local_backend_equality_fails_when_the_sync_is_lost(local_runs, monkeypatch):
    """The broken idea: a rollout that takes the version number but not the weights samples from the SFT
    policy every step, so the split run no longer equals the co-located one."""

    def lost(self, state, version):
        self.version = version
        return 0.0

    monkeypatch.setattr(pl.LocalWorker, "load_weights", lost)
    broken = pl.run("sync", 4, **local_runs["kw"])
    assert broken.versions == [0, 1, 2, 3]
    assert broken.rewards[0] == local_runs["colocated"].rewards[0]
    assert broken.rewards != local_runs["colocated"].rewards


def test_local_actor_runs_calls_in_order_and_resolves_futures():
    import threading

    class W:
        def __init__(self):
            self.log, self.threads = [], set()

        def add(self, x):
            self.log.append(x)
            self.threads.add(threading.get_ident())
            return x * 2

        def snapshot(self):
            return list(self.log)

    a, b = pl.LocalActor(W()), pl.LocalActor(W())
    futs = [a.add.remote(i) for i in range(50)]
    assert [f.result(timeout=30) for f in futs] == [2 * i for i in range(50)]
    assert a.snapshot.remote().result(timeout=30) == list(range(50)) and len(a.worker.threads) == 1
    assert b.add.remote(a.add.remote(7)).result(timeout=30) == 28  # a Future argument is resolved first
    assert threading.get_ident() not in a.worker.threads
    with pytest.raises(AttributeError):
        a.no_such_method  # noqa: B018
    a.kill(), b.kill()


def test_local_worker_crash_raises_and_stays_dead():
    w = pl.LocalActor(pl.LocalWorker(die_at_step=1))
    assert w.generate.remote(0).result(timeout=60)["step"] == 0
    with pytest.raises(pl.WorkerDied):
        w.generate.remote(1).result(timeout=60)
    with pytest.raises(pl.WorkerDied):
        w.pid.remote().result(timeout=60)
    w.kill()


def test_in_process_sync_sends_a_snapshot():
    import torch

    ch = pl.InProcessSync()
    t = {"w": torch.arange(6.0)}
    handle = ch.send(t)
    t["w"] += 1  # the trainer goes on training
    got = ch.receive(handle)
    assert torch.equal(got["w"], torch.arange(6.0)) and ch.stats.nbytes == 24
    with pytest.raises(ValueError, match="handle"):
        ch.receive(None)


def test_bad_backend_rejected():
    with pytest.raises(ValueError, match="backend="):
        pl.run("sync", 2, backend="threads")


def test_local_backend_async_rise_check_fails_when_the_trainer_unlearns(sft_rm, monkeypatch):
    """Notebook 19's check "the stale async run should learn too" (mean true reward of the last 3 of 8 batches
    > the first + 1) bites: with GAE's advantages negated inside the trainer's PPO (it learns to lower the
    reward) the decoupled async run of the notebook's setting fails it."""
    from mlsys_nb.runtime import check_margin
    from mlsys_nb.rl import rlhf

    real_gae = rlhf.gae

    def flipped(*a, **k):
        adv, ret = real_gae(*a, **k)
        return -adv, ret

    monkeypatch.setattr(rlhf, "gae", flipped)
    kw = dict(task="rlhf", init=sft_rm, batch=32, seed=1, timeout_s=120, backend="local", decoupled=True)
    r = pl.run("async", 8, **kw).rewards
    with pytest.raises(AssertionError, match="async: rise"):
        check_margin("async: rise of the true reward", sum(r[-3:]) / 3 - r[0], ">", 1.0)
