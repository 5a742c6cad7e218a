"""mlsys_nb.launch: real ranks from a function, and each failure behaviour of issue 2."""

import ast
import importlib
import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

import mlsys_nb
from mlsys_nb.runtime.launcher import RankError, RankTimeoutError, launch, resolve_backend
from mlsys_nb.runtime.ports import free_port
from serve_helpers import load_scaled

launch_module = importlib.import_module("mlsys_nb.runtime.launcher")
TESTS_DIR = str(Path(__file__).resolve().parent)


# ---------------------------------------------------------------- bad arguments, no processes
@pytest.fixture
def no_process_may_start(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a rank process was started despite invalid arguments")

    monkeypatch.setattr(launch_module, "start_rank", refuse)
    monkeypatch.setattr(launch_module, "prestart", refuse)  # nor the rank factory, which launch starts early


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(world_size=0), ValueError, ["world_size", ">= 1"]),
        (dict(world_size=2.0), ValueError, ["world_size"]),
        (dict(backend="mpi"), ValueError, ["backend", "gloo", "nccl", "auto"]),
        (dict(backend="nccl"), ValueError, ["nccl", "device_count"]),
        (dict(timeout=0), ValueError, ["timeout", "> 0"]),
        (dict(threads=0), ValueError, ["threads", ">= 1"]),
        (dict(output="loud"), ValueError, ["output", "stream"]),
        (dict(args=(threading.Lock(),)), TypeError, ["args", "pickle"]),
        (dict(kwargs={"f": (x for x in [1])}), TypeError, ["kwargs", "pickle"]),
    ],
)
def test_bad_arguments_raise_before_any_process_starts(no_process_may_start, kwargs, error, words):
    if kwargs.get("backend") == "nccl" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has enough GPUs for NCCL")  # never on the CPU CI machine
    kwargs.setdefault("world_size", 2)
    with pytest.raises(error) as info:
        launch(lambda: 0, **kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_resolve_backend_on_this_machine():
    n = torch.cuda.device_count()
    assert resolve_backend("auto", 1) == ("nccl" if n >= 1 else "gloo")
    assert resolve_backend("auto", n + 1) == "gloo"
    assert resolve_backend("gloo", 8) == "gloo"
    with pytest.raises(ValueError, match="world_size"):
        resolve_backend("gloo", -1)


def test_device_outside_a_group_is_cpu():
    assert mlsys_nb.device() == torch.device("cpu")


# ---------------------------------------------------------------- happy path on real ranks
@pytest.mark.slow
def test_closure_and_lambda_run_on_every_rank_and_results_come_back_by_rank():
    offset = 7.0  # captured by the closure: travels by value with cloudpickle

    def work(scale):
        x = torch.tensor([float(dist.get_rank() + 1)]) * scale + offset
        dist.all_reduce(x)
        return dist.get_rank(), dist.get_world_size(), x.item(), str(mlsys_nb.device()), torch.get_num_threads()

    world = 3
    results = launch(work, world, args=(2.0,), output="quiet")
    expected_sum = sum((r + 1) * 2.0 + offset for r in range(world))  # closed form of the all_reduce
    assert results == [(r, world, expected_sum, "cpu", 1) for r in range(world)]
    assert launch(lambda: dist.get_rank() ** 2, 2, output="quiet") == [0, 1]


@pytest.mark.slow
def test_ranks_come_from_a_forkserver_even_after_the_caller_ran_threaded_ops():
    # The known fork hang: a child forked from a process that ran a multi-threaded op blocks in
    # its first parallel op. The ranks must be children of the forkserver, never of this process.
    torch.set_num_threads(2)
    a = torch.randn(256, 256)
    (a @ a).sum()

    def work():
        b = torch.randn(256, 256)
        return os.getppid(), (b @ b).shape[0], torch.get_num_threads()

    results = launch(work, 2, threads=2, output="quiet")
    assert all(ppid != os.getpid() for ppid, _, _ in results), "a rank was forked from the caller"
    assert [(n, t) for _, n, t in results] == [(256, 2), (256, 2)]  # threads= overrides the default


@pytest.mark.slow
def test_module_function_gives_the_same_results_as_a_closed_form():
    from _launch_targets import rank_report

    world = 2
    results = launch(rank_report, world, kwargs={"scale": 3.0}, output="quiet")
    total = 3.0 * sum(r**2 for r in range(world))
    assert results == [(r, world, r, total, 1) for r in range(world)]


@pytest.mark.slow
def test_two_launches_at_the_same_time_use_separate_ports_and_both_succeed():
    from concurrent.futures import ThreadPoolExecutor

    def job(tag):
        x = torch.tensor([float(tag)])
        dist.all_reduce(x)
        return x.item(), int(os.environ["MASTER_PORT"])

    main_before = sys.modules["__main__"]
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda tag: launch(job, 2, args=(tag,), output="quiet"), [1, 10])
    assert [v for v, _ in a] == [2.0, 2.0] and [v for v, _ in b] == [20.0, 20.0]
    assert a[0][1] != b[0][1], "both launches used the same rendezvous port"
    assert sys.modules["__main__"] is main_before


# ---------------------------------------------------------------- output
@pytest.mark.slow
def test_output_is_captured_by_rank_and_results_do_not_depend_on_it(capsys):
    n_lines = 2000  # ~100 KB per rank: more than a pipe buffer, so the launcher must read while ranks run

    def chatty():
        rank = dist.get_rank()
        for i in range(n_lines):
            print(f"line {i} of rank {rank} " + "x" * 40)
        print(f"warning from {rank}", file=sys.stderr)
        os.write(1, f"raw fd write from {rank}\n".encode())  # C-level output is captured too
        print("no newline at the end", end="")
        return rank * 100

    assert launch(chatty, 2) == [0, 100]
    out, err = capsys.readouterr()
    for rank in range(2):
        mine = [line for line in out.splitlines() if line.startswith(f"[rank {rank}] ")]
        numbered = [line for line in mine if line.startswith(f"[rank {rank}] line ")]
        assert [line.split()[3] for line in numbered] == [str(i) for i in range(n_lines)]
        assert all(f"of rank {rank} " in line for line in numbered)
        assert f"[rank {rank}] raw fd write from {rank}" in mine
        assert f"[rank {rank}] no newline at the end" in mine
        assert f"[rank {rank}] warning from {rank}" in err.splitlines()

    assert launch(chatty, 2, output="quiet") == [0, 100]
    assert capsys.readouterr().out == ""

    def short():
        print("first", dist.get_rank())
        print("second", dist.get_rank())

    launch(short, 2, output="grouped")
    out = capsys.readouterr().out
    blocks = out.split("----- rank ")
    assert blocks[1:] == ["0 stdout -----\nfirst 0\nsecond 0\n", "1 stdout -----\nfirst 1\nsecond 1\n"]


# ---------------------------------------------------------------- failures
def _pids_alive(pids):
    return [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]


def _wait_for_pid_files(directory, n, timeout_s=60.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        files = list(directory.glob("pid*"))
        if len(files) == n and all(f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError(f"ranks did not write {n} pid files into {directory}")


@pytest.mark.slow
def test_exception_names_the_rank_stops_all_and_summarises_collateral(tmp_path):
    def fail_on_one():
        rank = dist.get_rank()
        (tmp_path / f"pid{rank}").write_text(str(os.getpid()))
        if rank == 1:
            raise ValueError("bad shard on rank one")
        if rank == 2:
            time.sleep(120)  # not in a collective: only the launcher can stop it
        dist.all_reduce(torch.ones(1))  # rank 0 loses its peer: collateral error

    with pytest.raises(RankError) as info:
        launch(fail_on_one, 3, timeout=100, output="quiet")
    error = info.value
    text = str(error)
    assert error.ranks == [1]
    assert "rank 1 failed" in text and "ValueError: bad shard on rank one" in text
    assert 'raise ValueError("bad shard on rank one")' in text  # the remote traceback, source line included
    assert isinstance(error.__cause__, ValueError)
    assert sorted(error.consequences) == [0, 2]
    assert "stopped by the launcher" in error.consequences[2]
    assert "Consequences on the other ranks (not causes)" in text
    assert "rank 0:" in error.consequences[0]
    assert _pids_alive(int(p.read_text()) for p in tmp_path.glob("pid*")) == []

    # A rank that dies without raising (exit code, signal) and a result that cannot be pickled.
    def die():
        if dist.get_rank() == 0:
            os._exit(3)
        dist.all_reduce(torch.ones(1))

    with pytest.raises(RankError, match="rank 0 failed") as info:
        launch(die, 2, output="quiet")
    assert "exited with code 3" in str(info.value)

    def segfault():
        if dist.get_rank() == 1:
            import ctypes

            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return 0

    with pytest.raises(RankError, match="rank 1 failed") as info:
        launch(segfault, 2, output="quiet")
    assert "SIGSEGV" in str(info.value)

    with pytest.raises(RankError, match="cannot be pickled"):
        launch(lambda: threading.Lock(), 2, output="quiet")

    def two_fail():
        if dist.get_rank() in (0, 2):
            raise KeyError(f"missing key on rank {dist.get_rank()}")
        dist.all_reduce(torch.ones(1))

    with pytest.raises(RankError, match="ranks 0, 2 failed") as info:
        launch(two_fail, 3, output="quiet")
    assert info.value.ranks == [0, 2] and sorted(info.value.consequences) == [1]
    assert "missing key on rank 0" in str(info.value) and "missing key on rank 2" in str(info.value)


@pytest.mark.slow
def test_hang_dumps_every_rank_stack_kills_all_and_raises_timeout(tmp_path):
    def deadlock():
        (tmp_path / f"pid{dist.get_rank()}").write_text(str(os.getpid()))
        buffer = torch.zeros(1)
        dist.recv(buffer, src=1 - dist.get_rank())  # both ranks receive: nobody sends

    with pytest.raises(RankTimeoutError) as info:
        launch(deadlock, 2, timeout=1.5, output="quiet")
    error = info.value
    assert isinstance(error, TimeoutError)
    assert sorted(error.stacks) == [0, 1]
    for rank, stack in error.stacks.items():
        assert "in recv" in stack and "in deadlock" in stack, stack
        assert f"--- rank {rank} ---" in str(error)
        assert "_watch_parent" not in stack and "run_on_rank" not in stack  # launcher frames trimmed
    assert _pids_alive(int(p.read_text()) for p in tmp_path.glob("pid*")) == []


class _SlowToUnpickle:
    """Unpickling this on a rank sleeps 30 s: the rank never joins the group in time."""

    def __reduce__(self):
        return (time.sleep, (30,))


@pytest.mark.slow
def test_ranks_that_never_join_hit_the_start_timeout_with_stacks():
    launch(lambda: 0, 2, output="quiet")  # forkserver warm: the 1 s below is for the ranks only
    with pytest.raises(RankTimeoutError, match="did not start and join the process group") as info:
        launch(lambda x: x, 2, args=(_SlowToUnpickle(),), start_timeout=1.0, output="quiet")
    assert sorted(info.value.stacks) == [0, 1]
    assert all("in _rank_main" in stack for stack in info.value.stacks.values()), info.value.stacks


@pytest.mark.slow
def test_keyboard_interrupt_stops_every_rank(tmp_path):
    """SIGINT (Jupyter's "interrupt kernel") while 2 ranks sleep: KeyboardInterrupt, and no rank survives it.

    The SIGINT goes out once both ranks run, however long their start takes: the waiting thread stops only when
    the launch is over. It used to give up after a fixed 60 s counted from before the launch, while the launch's
    own start_timeout (60 s) counts only from once its ranks are spawned (a cold rank factory imports torch
    first); beside two busy processes the thread could give up, send no SIGINT, and leave the launch to its 100 s
    timeout (RankTimeoutError, CI's failure). The start gets ``load_scaled(60)`` s."""
    run_s = 100.0  # the launch's timeout; the ranks sleep longer still
    start_s = load_scaled(60)

    def sleeper():
        (tmp_path / f"pid{dist.get_rank()}").write_text(str(os.getpid()))
        time.sleep(120)

    interrupted, launch_over = {}, threading.Event()

    def interrupt_when_ranks_run():
        while not launch_over.is_set():
            files = list(tmp_path.glob("pid*"))
            if len(files) == 2 and all(f.read_text() for f in files):
                interrupted["pids"] = [int(f.read_text()) for f in files]
                interrupted["at"] = time.monotonic()
                os.kill(os.getpid(), signal.SIGINT)  # what a Jupyter "interrupt kernel" delivers
                return
            time.sleep(0.05)

    thread = threading.Thread(target=interrupt_when_ranks_run, daemon=True)
    began = time.monotonic()
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(sleeper, 2, timeout=run_s, start_timeout=start_s, output="quiet")
    finally:
        launch_over.set()
        thread.join()
    stopped_after_s = time.monotonic() - interrupted["at"]
    assert _pids_alive(interrupted["pids"]) == [], "ranks survived the interrupt"
    print(f"ranks ran {interrupted['at'] - began:.1f} s after launch; stopped {stopped_after_s:.3f} s after SIGINT")
    # Not a benchmark (measured 0.01-0.09 s, data/measured/interrupt.md; the README quotes that record): a launcher
    # that waited for its 100 s timeout or the ranks' 120 s sleep fails this bound, 10 s scaled by the load and
    # capped at half the timeout so that such a launcher fails it under any load.
    bound = min(load_scaled(10), run_s / 2)
    assert stopped_after_s < bound, f"ranks stopped {stopped_after_s:.1f} s after the interrupt (bound {bound:.0f} s)"


PARENT_SCRIPT = """
import sys, time, torch.distributed as dist
import mlsys_nb
directory = sys.argv[1]
def sleeper():
    import os
    open(f"{directory}/pid{dist.get_rank()}", "w").write(str(os.getpid()))
    time.sleep(120)
mlsys_nb.launch(sleeper, 2, timeout=100)
"""


@pytest.mark.slow
def test_ranks_do_not_outlive_a_killed_parent(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(PARENT_SCRIPT)
    parent = subprocess.Popen([sys.executable, str(script), str(tmp_path)])
    try:
        pids = _wait_for_pid_files(tmp_path, 2, timeout_s=90)
        helpers = [c.pid for c in psutil.Process(parent.pid).children()]  # forkserver, resource tracker
        parent.kill()  # SIGKILL: no cleanup code runs in the parent
        parent.wait(10)
        end = time.monotonic() + 15
        while _pids_alive(pids + helpers) and time.monotonic() < end:
            time.sleep(0.1)
        assert _pids_alive(pids) == [], "ranks outlived their SIGKILLed parent"
        assert _pids_alive(helpers) == [], "the forkserver outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()


# ---------------------------------------------------------------- leaks
def _listening_sockets(process):
    return sorted(c.laddr for c in process.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN)


def _shm_entries():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


@pytest.mark.slow
def test_fifty_launches_with_failures_leak_no_process_port_fd_or_shared_memory():
    me = psutil.Process()
    launch(lambda: 0, 2, output="quiet")  # start the forkserver (kept on purpose: warm launches)
    children_before = {c.pid for c in me.children(recursive=True)}
    fds_before = me.num_fds()
    listening_before = _listening_sockets(me)
    shm_before = _shm_entries()

    def job(kind):
        x = torch.ones(1)
        dist.all_reduce(x)
        if kind == "raise" and dist.get_rank() == 1:
            raise RuntimeError("planned failure")
        if kind == "exit" and dist.get_rank() == 0:
            os._exit(2)
        if kind == "hang":
            dist.recv(x, src=1 - dist.get_rank())  # both ranks receive: deadlock
        return x.item()

    kinds = ["ok"] * 40 + ["raise"] * 5 + ["exit"] * 4 + ["hang"]
    outcomes = []
    for kind in kinds:
        try:
            assert launch(job, 2, args=(kind,), timeout=1.0, output="quiet") == [2.0, 2.0]
            outcomes.append("ok")
        except RankTimeoutError:
            outcomes.append("hang")
        except RankError as e:
            outcomes.append("raise" if "planned failure" in str(e) else "exit")
    assert outcomes == kinds

    leftover = {c.pid for c in me.children(recursive=True)} - children_before
    assert leftover == set(), f"processes left behind: {leftover}"
    assert me.num_fds() == fds_before
    assert _listening_sockets(me) == listening_before
    ours = ("torch_", "sem.mp-", "psm_", "mp-", f"{os.getpid()}")
    new_shm = [n for n in _shm_entries() - shm_before if n.startswith(ours[:4]) or ours[4] in n]
    assert new_shm == [], f"shared-memory segments left behind: {new_shm}"


# ---------------------------------------------------------------- torchrun entry point


def _torchrun(*extra, timeout_s=180):
    env = dict(os.environ, PYTHONPATH=TESTS_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        *extra,
        "-m",
        "mlsys_nb.run",
        "_launch_targets:rank_report",
        "--args",
        "[3.0]",
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _results(*processes, timeout_s=180):
    results = {}
    for p in processes:
        try:
            out, err = p.communicate(timeout=timeout_s)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        assert p.returncode == 0, err[-3000:]
        for match in re.finditer(r"^\[rank (\d+)\] result: (.*)$", out, re.M):
            results[int(match.group(1))] = ast.literal_eval(match.group(2))
    return [results[r] for r in sorted(results)]


@pytest.fixture(scope="module")
def torchrun_jobs():
    """Both torchrun jobs, started together (their agents and workers each import torch: the start-ups overlap):
    one node of 2 processes, and two nodes of 1 process on loopback. Each test below reads its own."""
    one_node_port = free_port()
    port = free_port()
    while port == one_node_port:
        port = free_port()
    jobs = {
        "one_node": [
            _torchrun("--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(one_node_port))
        ]
    }
    jobs["two_nodes"] = [
        _torchrun(
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "1",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
        )
        for node in (0, 1)
    ]
    yield jobs
    for p in jobs["one_node"] + jobs["two_nodes"]:  # a test that failed early leaves none running
        if p.poll() is None:
            p.kill()
            p.communicate()


@pytest.mark.slow
def test_torchrun_entry_point_two_ranks_matches_launch(torchrun_jobs):
    under_torchrun = _results(*torchrun_jobs["one_node"])
    from _launch_targets import rank_report

    assert under_torchrun == launch(rank_report, 2, args=(3.0,), output="quiet")
    assert under_torchrun == [(r, 2, r, 3.0, 1) for r in range(2)]


@pytest.mark.slow
def test_torchrun_entry_point_two_nodes_on_loopback(torchrun_jobs):
    # each node runs one process: global ranks 0 and 1, both with local rank 0
    assert _results(*torchrun_jobs["two_nodes"]) == [(0, 2, 0, 3.0, 1), (1, 2, 0, 3.0, 1)]


@pytest.mark.filterwarnings("ignore:Unable to enable fault handler")  # pytest's captured stderr has no fd
def test_run_without_torchrun_environment_explains_itself(monkeypatch, capsys):
    from mlsys_nb.runtime import torchrun as run

    for name in run.ENV_NEEDED:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit):
        run.main(["_launch_targets:rank_report"])
    assert "torchrun" in capsys.readouterr().err
    with pytest.raises(ValueError, match="module:function"):
        run.load_function("no_colon")


def test_source_lines_missing_on_the_rank_are_filled_in_from_this_process():
    import linecache

    name = "/tmp/ipykernel_0/cell_that_only_the_kernel_knows.py"
    linecache.cache[name] = (30, None, ["def f():\n", "    raise ValueError('x')\n"], name)
    remote = f'Traceback (most recent call last):\n  File "{name}", line 2, in f\nValueError: x'
    assert launch_module.with_caller_source(remote).splitlines()[2] == "    raise ValueError('x')"
    dump = f'  File "{name}", line 1 in f'  # faulthandler's format has no comma
    assert launch_module.with_caller_source(dump).splitlines()[1] == "    def f():"


@pytest.mark.slow
def test_output_is_streamed_while_the_ranks_run(tmp_path, monkeypatch):
    # Rank 0 prints, then waits until the caller has *seen* that line. Without streaming the
    # line would only arrive at the end, the file would never appear and the launch would time out.
    go = tmp_path / "go"

    class Watcher(io.StringIO):
        def write(self, text):
            if "waiting for go" in text:
                go.write_text("go")
            return super().write(text)

    monkeypatch.setattr(sys, "stdout", Watcher())

    def wait_for_go():
        if dist.get_rank() == 0:
            print("waiting for go")
            while not go.exists():
                time.sleep(0.01)
        dist.barrier()
        return "went"

    assert launch(wait_for_go, 2, timeout=30) == ["went", "went"]
    assert "[rank 0] waiting for go" in sys.stdout.getvalue()
