"""How long does it take to start 4 ranks, do one 1-element all_reduce and return?

    .venv/bin/python benchmarks/launch.py [--rounds 5] [--warm-calls 5] [--world-size 4]

Compared, in fresh Python processes that have already imported torch (like a kernel):
  (a) mlsys_nb.launch, cold: the first call (it starts the forkserver, which imports torch and torch._dynamo)
  (b) mlsys_nb.launch, warm: the following calls
  (c) accelerate.notebook_launcher, first call and warm calls (it forks the caller: that is only
      safe here because these processes have run no multi-threaded torch op and no CUDA)
  (d) torch.multiprocessing.spawn of a module function (every rank imports torch afresh)
and, as a reference for the cold numbers, the time of `python -c "import torch.distributed"`.
Methods run alternately, one fresh process per method per round, so load from other users of the
machine falls on all of them alike. Prints medians (s) and ratios against the named baseline
(accelerate warm), plus the speed-up over mp.spawn. Not a test: numbers go to data/measured/.
"""

from __future__ import annotations

import argparse
import os
import selectors
import signal
import subprocess
import sys
from mlsys_nb.runtime.machine import summary as machine
from mlsys_nb.runtime.ports import free_port
from mlsys_nb.runtime.timing import Timer, median

METHODS = ("mlsys_nb", "accelerate", "mp_spawn")
BASELINE = "accelerate.notebook_launcher warm"


# ------------------------------------------------------------------ the job, three ways
def job():
    """mlsys_nb.launch job: the process group is already up."""
    import torch
    import torch.distributed as dist

    x = torch.ones(1)
    dist.all_reduce(x)
    return x.item()


def job_env():
    """accelerate job: the launcher only sets env:// variables; the function joins the group."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    x = torch.ones(1)
    dist.all_reduce(x)
    dist.destroy_process_group()
    return x.item()


def job_spawn(rank, world_size):
    """mp.spawn job (a module function: spawn cannot ship a notebook function)."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    x = torch.ones(1)
    dist.all_reduce(x)
    dist.destroy_process_group()


def child(method: str, world_size: int, calls: int) -> None:
    """Run in a fresh process: time ``calls`` launches with ``method``; print seconds per line."""
    import torch  # noqa: F401 - a kernel has torch imported before it launches anything

    for _ in range(calls):
        if method == "mlsys_nb":
            import mlsys_nb

            with Timer() as t:
                result = mlsys_nb.launch(job, world_size, output="quiet")
            elapsed = t.seconds
            assert result == [float(world_size)] * world_size
        elif method == "accelerate":
            from accelerate import notebook_launcher

            port = str(free_port())
            with Timer() as t:
                notebook_launcher(job_env, num_processes=world_size, use_port=port, master_addr="127.0.0.1")
            elapsed = t.seconds
        else:
            import torch.multiprocessing as tmp

            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            with Timer() as t:
                tmp.spawn(job_spawn, args=(world_size,), nprocs=world_size, join=True)
            elapsed = t.seconds
        print(f"TIME {elapsed}", flush=True)


# ------------------------------------------------------------------ driver
def run_child(method: str, world_size: int, calls: int, call_timeout: float) -> tuple[list[float], bool]:
    """Times of each call, and whether a call hung (no result within ``call_timeout`` s).

    The child runs in its own session so that a hung child and everything it forked can be
    killed together.
    """
    p = subprocess.Popen(
        [sys.executable, __file__, "--child", method, "--world-size", str(world_size), "--calls", str(calls)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    times, hung = [], False
    with selectors.DefaultSelector() as selector:
        selector.register(p.stdout, selectors.EVENT_READ)
        while len(times) < calls:
            if not selector.select(timeout=call_timeout):
                hung = True
                break
            line = p.stdout.readline()
            if not line:
                break
            if line.startswith("TIME "):
                times.append(float(line.split()[1]))
    if hung:
        os.killpg(p.pid, signal.SIGKILL)
    p.wait(60)
    err = p.stderr.read()
    if not hung and (p.returncode != 0 or len(times) < calls):
        raise RuntimeError(f"{method} child failed:\n{err[-3000:]}")
    return times, hung


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm-calls", type=int, default=5)
    parser.add_argument("--spawn-calls", type=int, default=1)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--child", choices=METHODS)
    parser.add_argument("--calls", type=int, default=1)
    parser.add_argument(
        "--call-timeout", type=float, default=90.0, help="seconds without a finished call before a child counts as hung"
    )
    parser.add_argument("--quick", action="store_true", help="one round, 2 ranks, 1 warm call")
    ns = parser.parse_args()
    if ns.quick:
        ns.rounds, ns.warm_calls, ns.spawn_calls, ns.world_size = 1, 1, 1, 2
    if ns.child:
        child(ns.child, ns.world_size, ns.calls)
        return

    samples = {
        name: []
        for name in (
            "mlsys_nb.launch cold",
            "mlsys_nb.launch warm",
            "accelerate.notebook_launcher first",
            BASELINE,
            "torch.multiprocessing.spawn",
            "reference: fresh python -c 'import torch.distributed'",
        )
    }
    hangs = {method: 0 for method in METHODS}
    print(f"# {machine()}")
    for round_ in range(ns.rounds):
        order = METHODS[round_ % 3 :] + METHODS[: round_ % 3]  # rotate who goes first
        for method in order:
            calls = ns.spawn_calls if method == "mp_spawn" else 1 + ns.warm_calls
            times, hung = run_child(method, ns.world_size, calls, ns.call_timeout)
            hangs[method] += hung
            if method == "mp_spawn":
                samples["torch.multiprocessing.spawn"] += times
            elif times:
                first, *warm = times
                cold_name = "mlsys_nb.launch cold" if method == "mlsys_nb" else "accelerate.notebook_launcher first"
                warm_name = "mlsys_nb.launch warm" if method == "mlsys_nb" else BASELINE
                samples[cold_name].append(first)
                samples[warm_name] += warm
        # What any fresh rank (and a cold forkserver) must pay before it can do anything.
        with Timer() as t:
            subprocess.run([sys.executable, "-c", "import torch.distributed"], check=True)
        samples["reference: fresh python -c 'import torch.distributed'"].append(t.seconds)
        print(f"round {round_ + 1}/{ns.rounds} done; hangs so far {hangs}", file=sys.stderr, flush=True)

    medians = {k: median(v) for k, v in samples.items()}
    spawn = medians["torch.multiprocessing.spawn"]
    header = ("method", "n", "median s", "min s", "max s", "ratio to baseline", "speed-up vs mp.spawn")
    print(
        f"\n{ns.world_size} ranks: start, one 1-element all_reduce (gloo), return. "
        f"Baseline: {BASELINE}. {ns.rounds} rounds, methods alternated.\n"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, values in samples.items():
        print(
            f"| {name} | {len(values)} | {medians[name]:.3f} | {min(values):.3f} | {max(values):.3f} | "
            f"{medians[name] / medians[BASELINE]:.2f} | {spawn / medians[name]:.1f}x |"
        )
    warm = medians["mlsys_nb.launch warm"]
    print(
        f"\nTargets: warm / accelerate warm = {warm / medians[BASELINE]:.2f} (<= 1.0), "
        f"mp.spawn / warm = {spawn / warm:.0f}x (>= 20x), cold = {medians['mlsys_nb.launch cold']:.2f} s (<= 2 s)"
    )
    print(f"Load average at the end: {os.getloadavg()[0]:.1f} (other jobs share this machine)")
    print(f"Child processes that hung (no call finished within {ns.call_timeout:g} s, killed): {hangs}")


if __name__ == "__main__":
    main()
