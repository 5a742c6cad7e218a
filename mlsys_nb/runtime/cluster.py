"""Live ranks kept across notebook cells, and the ``%%ranks`` cell magic.

``mlsys_nb.launch`` answers "run this function on fresh ranks". A :class:`Cluster` keeps
``world_size`` rank processes alive with the ``torch.distributed`` process group already
initialised, so you can run a cell on every rank, look at each rank's variables, change one
thing and run again::

    cluster = mlsys_nb.Cluster(world_size=4)      # or: with mlsys_nb.Cluster(4) as cluster: ...
    %load_ext mlsys_nb

    %%ranks                      # every rank; `%%ranks 0,2` runs on a subset
    x = torch.full((2,), float(rank))
    dist.all_reduce(x)
    print(x)

    cluster.pull("x")            # list of per-rank values (rank order)
    cluster.push(lr=0.1)         # same value on every rank
    cluster.push(per_rank=True, shard=[a, b, c, d])   # value i goes to rank i
    cluster.run(fn)              # fn (cloudpickled) called on every rank, returns per-rank results
    cluster.shutdown()

Design (why not ipyparallel): measured on the project's 2-core machine, ipyparallel 9.2 starts
4 engines in ~7 s plus ~5 s to import torch in them, and a restart costs the same again, so the
deadlock demo of notebook 02 would cost ~10 s per recovery. Here the ranks are forked from a
multiprocessing *forkserver* that has torch preloaded (~0.2 s per restart) and talk to the kernel
over pipes (a warm trivial cell takes about a millisecond).

Each rank process:

- ignores SIGINT (an interrupted kernel kills and restarts its ranks instead: a rank blocked
  inside gloo would not react anyway), dies with the forkserver (``PR_SET_PDEATHSIG``), which
  itself exits when the kernel goes away;
- runs ``torch.set_num_threads(threads)`` (default 1: several ranks share few cores);
- joins the process group through a ``TCPStore`` held by the kernel and listening on
  127.0.0.1 only, with gloo bound to the loopback interface and a finite timeout;
- keeps its own namespace with ``rank``, ``world_size``, ``dist``, ``torch``, ``device`` ready;
- dumps its Python stack on SIGUSR1 (``faulthandler``) so a hung cell can be explained.

A call that does not finish within its timeout raises :class:`RankTimeoutError` carrying each running
rank's stack, after the cluster was restarted (namespaces are fresh again). An exception on a rank
raises :class:`RankError` with that rank's traceback; the cluster stays as it was, unless the
other ranks are still busy ``error_grace`` seconds later (typically blocked in a collective the
failed rank never joined): then their stacks are shown and the cluster restarts.
"""

from __future__ import annotations

import argparse
import ast
import atexit
import faulthandler
import linecache
import multiprocessing.connection as mpc
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
import traceback
import weakref

import cloudpickle

from ..config import check_choice, check_int, check_seconds
from .ranks import (
    BACKENDS,
    RankError,
    RankTimeoutError,
    context,
    device,
    die_with_parent,
    open_store,
    prestart,
    rank_environment,
    resolve_backend,
    run_on_rank,
    without_main_module,
)
from .timing import Laps

__all__ = ["Cluster", "RankError", "RankTimeoutError", "current", "register_ranks_magic"]

_clusters: weakref.WeakSet[Cluster] = weakref.WeakSet()
_current: weakref.ref[Cluster] | None = None


# --------------------------------------------------------------------------------------------
# rank side
# --------------------------------------------------------------------------------------------
def _rank_main(rank, world_size, backend, store_port, conn, pg_timeout_s, threads, workdir):
    """Entry point of a rank process: join the group, then serve the kernel's requests."""
    die_with_parent()  # the forkserver exits with the kernel, so the rank does too
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the kernel decides: it restarts the ranks
    rank_environment(rank, world_size, store_port, threads)
    stack_file = open(os.path.join(workdir, f"rank{rank}.stack"), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    out = open(os.path.join(workdir, f"rank{rank}.out"), "w+", encoding="utf-8", errors="replace")
    ready = []

    def on_ready():
        conn.send_bytes(cloudpickle.dumps(("ready", os.getpid())))
        ready.append(True)

    try:
        run_on_rank(
            _serve_forever,
            (conn, out),
            {},
            rank=rank,
            world_size=world_size,
            local_rank=rank,
            backend=backend,
            timeout=pg_timeout_s,
            threads=threads,
            store_port=store_port,
            store_timeout=pg_timeout_s,
            on_ready=on_ready,
        )
    except BaseException:
        if not ready:
            conn.send_bytes(cloudpickle.dumps(("fail", traceback.format_exc())))


def _serve_forever(conn, out):
    """The rank's loop: one request in, one reply out, until "stop" or the kernel is gone."""
    import torch
    import torch.distributed as dist

    ns = {
        "__name__": "__rank__",
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "dist": dist,
        "torch": torch,
        "device": device(),
    }
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        op, payload = cloudpickle.loads(message)
        if op == "stop":
            return
        conn.send_bytes(_serve(op, payload, ns, out))


def _exec_cell(source, filename, ns):
    """Run a cell's source in ``ns``; return the repr of its last expression (or None)."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), ns)
    if last is not None:
        value = eval(compile(last, filename, "eval"), ns)
        return None if value is None else repr(value)
    return None


def _serve(op, payload, ns, out):
    out.seek(0)
    out.truncate()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        if op == "exec":
            value = _exec_cell(payload[0], payload[1], ns)
        elif op == "call":
            fn, args, kwargs = payload
            value = fn(*args, **kwargs)
        elif op == "pull":
            missing = [n for n in payload if n not in ns]
            if missing:
                raise NameError(f"name {missing[0]!r} is not defined on rank {ns['rank']}")
            value = [ns[n] for n in payload]
        elif op == "push":
            ns.update(payload)
            value = None
        else:
            raise ValueError(f"unknown operation {op!r}")
        status, detail = "ok", value
    except BaseException as exc:  # report everything, keep serving
        tb = traceback.TracebackException.from_exception(exc)
        frames = [f for f in tb.stack if os.path.join("mlsys_nb", "runtime", "") not in f.filename]
        tb.stack = traceback.StackSummary.from_list(frames)
        status, detail = "error", "".join(tb.format())
    finally:
        sys.stdout, sys.stderr = saved
    out.flush()
    out.seek(0)
    text = out.read()
    try:
        return cloudpickle.dumps((status, text, detail))
    except Exception as exc:
        return cloudpickle.dumps(("error", text, f"the result could not be pickled: {exc!r}\n"))


# --------------------------------------------------------------------------------------------
# kernel side
# --------------------------------------------------------------------------------------------
def _kill(procs, timeout=5.0):
    for p in procs:
        if p.is_alive():
            try:
                p.kill()
            except Exception:
                pass
    for p in procs:
        p.join(timeout)


def _finalize(procs, conns, store, workdir):
    for c in conns:
        try:
            c.close()
        except Exception:
            pass
    _kill(procs)
    store.clear()  # the last reference: the TCPStore server closes its port
    shutil.rmtree(workdir, ignore_errors=True)


# The last line of a traceback whose exception means the process group is broken: torch's
# distributed errors, gloo's own timeouts ("Timed out waiting 1500ms for recv operation") and
# lost peers.
_BROKEN_GROUP = re.compile(
    r"^\S*(DistBackendError|DistNetworkError|DistStoreError|RuntimeError: "
    r"\[\S*gloo\S*\]|.*Connection (closed|reset) by peer)",
    re.M,
)
_FRAME = re.compile(r'^(\s*File "(.+)", line (\d+) in .*)$')
_HIDE = (os.sep + "multiprocessing" + os.sep, os.path.join("mlsys_nb", "runtime", ""), "c10d_logger.py", "<string>")


def _annotate_stack(text):
    """Drop the pool's own frames from a faulthandler dump and add each frame's source line."""
    lines = []
    for line in text.splitlines():
        m = _FRAME.match(line)
        if m is None:
            if line.strip() and not line.startswith("Current thread"):
                lines.append(line)
            continue
        if any(h in m.group(2) for h in _HIDE):
            continue
        lines.append(m.group(1))
        src = linecache.getline(m.group(2), int(m.group(3))).strip()
        if src:
            lines.append("    " + src)
    return "\n".join(lines)


class Cluster:
    """``world_size`` live ``torch.distributed`` ranks kept across cells (see module docstring).

    Parameters
    ----------
    world_size: number of rank processes (>= 1).
    backend: "auto" (nccl with enough GPUs, else gloo), "gloo" or "nccl".
    timeout: seconds a call (cell, ``run``, ``pull``, ``push``) may take before the ranks' stacks
        are dumped and the cluster restarts; override per call with ``timeout=``.
    threads: ``torch.set_num_threads`` on every rank (default 1: several ranks share few cores).
    error_grace: seconds to wait for the other ranks after one rank raised.
    pg_timeout: process-group timeout in seconds (finite; default ``timeout + 30`` so that the
        cluster's own timeout, which shows stacks, fires first). A rank whose collective times
        out raises ``DistBackendError``; the cluster then restarts (the group is unusable).
        Changing the attribute takes effect at the next ``restart()``.
    """

    def __init__(
        self,
        world_size: int = 4,
        backend: str = "auto",
        timeout: float = 60.0,
        *,
        threads: int = 1,
        error_grace: float = 3.0,
        pg_timeout: float | None = None,
        start_timeout: float = 120.0,
    ):
        check_int("world_size", world_size, 1)
        for name, value in (("timeout", timeout), ("error_grace", error_grace), ("start_timeout", start_timeout)):
            check_seconds(name, value)
        check_int("threads", threads, 1)
        if pg_timeout is not None:
            check_seconds("pg_timeout", pg_timeout)
        check_choice("backend", backend, BACKENDS)
        if backend != "nccl":  # the arguments are valid: the rank factory imports torch while this process does
            prestart()
        self.world_size = world_size
        self.backend = resolve_backend(backend, world_size)  # imports torch; "nccl" without the GPUs raises here
        self.timeout = float(timeout)
        self.threads = threads
        self.error_grace = float(error_grace)
        self.pg_timeout = float(pg_timeout if pg_timeout is not None else timeout + 30.0)
        self.start_timeout = float(start_timeout)
        self.last_error: RankError | None = None
        self.restarts = 0
        self._cells = 0
        self._procs: list = []
        self._conns: list = []
        self._workdir = tempfile.mkdtemp(prefix="mlsys_nb_cluster_")
        self._store: list = []  # the rendezvous TCPStore of the current ranks (127.0.0.1 only)
        self._finalizer = weakref.finalize(self, _finalize, self._procs, self._conns, self._store, self._workdir)
        self._start()
        _clusters.add(self)
        global _current
        _current = weakref.ref(self)

    # ---- lifecycle ---------------------------------------------------------------------------
    def _start(self):
        ctx = context()
        clock = Laps()
        self._store[:] = [open_store(self.start_timeout)]  # a fresh store per generation
        port = self._store[0].port
        with without_main_module():  # a script's __main__ is not re-imported in each rank
            for r in range(self.world_size):
                parent, child = ctx.Pipe(duplex=True)
                p = ctx.Process(
                    target=_rank_main,
                    name=f"mlsys_nb-rank{r}",
                    daemon=True,
                    args=(r, self.world_size, self.backend, port, child, self.pg_timeout, self.threads, self._workdir),
                )
                p.start()
                child.close()
                self._procs.append(p)
                self._conns.append(parent)
        failures = {}
        deadline = time.monotonic() + self.start_timeout
        for r, c in enumerate(self._conns):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not c.poll(remaining):
                failures[r] = f"rank {r} did not start within start_timeout={self.start_timeout} s"
                break
            try:
                status, detail = cloudpickle.loads(c.recv_bytes())
            except EOFError:
                failures[r] = f"rank {r} exited during start (exit code {self._procs[r].exitcode})"
                break
            if status != "ready":
                failures[r] = detail
                break
        if failures:
            self._stop_procs()
            raise RankError("could not start the cluster", errors=failures)
        self.start_seconds = clock.elapsed()

    def _stop_procs(self):
        _kill(self._procs)
        for c in self._conns:
            c.close()
        self._procs.clear()
        self._conns.clear()

    def restart(self):
        """Kill every rank and start fresh ones (new namespaces, new process group)."""
        self._check_alive()
        self._stop_procs()
        self.restarts += 1
        self._start()

    def shutdown(self):
        """Stop every rank process and free the rendezvous port. Idempotent."""
        for c in self._conns:
            try:
                c.send_bytes(cloudpickle.dumps(("stop", None)))
            except Exception:
                pass
        for p in self._procs:
            p.join(1.0)
        self._finalizer()
        self._procs.clear()
        self._conns.clear()

    @property
    def alive(self) -> bool:
        return self._finalizer.alive

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    @property
    def store_port(self) -> int | None:
        """The port of the current ranks' rendezvous store (a TCPStore in this process, on 127.0.0.1 only)."""
        return self._store[0].port if self._store else None

    def _check_alive(self):
        if not self.alive:
            raise RuntimeError("this Cluster was shut down; create a new one")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

    def __repr__(self):
        state = "running" if self.alive else "shut down"
        return (
            f"Cluster(world_size={self.world_size}, backend={self.backend!r}, "
            f"timeout={self.timeout}, {state}, restarts={self.restarts})"
        )

    # ---- calls -------------------------------------------------------------------------------
    def _ranks(self, ranks):
        if ranks is None:
            return list(range(self.world_size))
        ranks = [ranks] if isinstance(ranks, int) else list(ranks)
        bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < self.world_size]
        if bad or not ranks or len(set(ranks)) != len(ranks):
            raise ValueError(f"ranks must be distinct ints in 0..{self.world_size - 1}, got {ranks!r}")
        return sorted(ranks)

    def _call(self, op, payloads, ranks, timeout):
        """Send one message per rank, wait for all replies; return (results, outputs)."""
        self._check_alive()
        timeout = self.timeout if timeout is None else float(timeout)
        check_seconds("timeout", timeout)
        results, outputs, errors, exits = {}, {}, {}, {}
        pending = {}
        for r in ranks:
            try:
                self._conns[r].send_bytes(cloudpickle.dumps((op, payloads[r])))
                pending[self._conns[r]] = r
            except OSError:  # the rank died since the last call
                self._procs[r].join(1.0)
                exits[r] = self._procs[r].exitcode
        sentinels = {self._procs[r].sentinel: r for r in ranks}
        deadline = time.monotonic() + timeout
        first_error_deadline = time.monotonic() + self.error_grace if exits else None
        try:
            while pending:
                limit = deadline if first_error_deadline is None else min(deadline, first_error_deadline)
                remaining = limit - time.monotonic()
                if remaining <= 0:
                    break
                ready = mpc.wait(list(pending) + [s for s, r in sentinels.items() if r in pending.values()], remaining)
                for obj in ready:
                    r = pending.get(obj)
                    if r is None:  # a process sentinel: read its last reply or record the exit
                        r = sentinels[obj]
                        obj = self._conns[r]
                        if obj not in pending:
                            continue
                    try:
                        status, text, detail = (
                            cloudpickle.loads(obj.recv_bytes()) if obj.poll(0) else (None, None, None)
                        )
                    except (EOFError, OSError):
                        status = None
                    if status is None:  # the rank process is gone
                        self._procs[r].join(1.0)
                        exits[r] = self._procs[r].exitcode
                        del pending[obj]
                        continue
                    del pending[obj]
                    outputs[r] = text
                    if status == "ok":
                        results[r] = detail
                    else:
                        errors[r] = detail
                if (errors or exits) and first_error_deadline is None:
                    first_error_deadline = time.monotonic() + self.error_grace
        except KeyboardInterrupt:
            stacks = self._dump_stacks(sorted(pending.values()))
            self._recover(outputs, pending)
            print(RankError("interrupted: ranks restarted", stacks=stacks).report(), file=sys.stderr)
            raise
        if exits:
            errors.update({r: f"rank {r} exited with code {code}\n" for r, code in exits.items()})
        if pending or exits:
            running = sorted(pending.values())
            stacks = self._dump_stacks(running)
            self._recover(outputs, pending)
            if errors:
                who = ", ".join(map(str, sorted(errors)))
                msg = (
                    f"rank(s) {who} failed; rank(s) {running} were still running {self.error_grace:g} s later"
                    if running
                    else f"rank(s) {who} failed"
                )
                err = RankError(
                    msg + "; the cluster was restarted (namespaces are fresh)",
                    errors=errors,
                    stacks=stacks,
                    restarted=True,
                    outputs=outputs,
                )
            else:
                err = RankTimeoutError(
                    f"timed out after {timeout:g} s: rank(s) {running} still running; "
                    "the cluster was restarted (namespaces are fresh)",
                    stacks=stacks,
                    restarted=True,
                    outputs=outputs,
                )
            self.last_error = err
            raise err
        if errors:
            who = ", ".join(map(str, sorted(errors)))
            broken = [r for r, tb in errors.items() if _BROKEN_GROUP.search(tb)]
            if broken:  # after a gloo/NCCL timeout or a lost peer the group cannot be trusted
                self.restart()
            err = RankError(
                f"rank(s) {who} raised"
                + (
                    f"; rank(s) {broken} lost the process group, so the cluster was restarted (namespaces are fresh)"
                    if broken
                    else ""
                ),
                errors=errors,
                outputs=outputs,
                restarted=bool(broken),
            )
            self.last_error = err
            raise err
        self.last_error = None
        return [results[r] for r in ranks], outputs

    def _dump_stacks(self, ranks):
        stacks = {}
        for r in ranks:
            path = os.path.join(self._workdir, f"rank{r}.stack")
            try:
                open(path, "w").close()
                os.kill(self._procs[r].pid, signal.SIGUSR1)
            except OSError:
                pass
        deadline = time.monotonic() + 2.0
        for r in ranks:
            path = os.path.join(self._workdir, f"rank{r}.stack")
            text = ""
            while time.monotonic() < deadline:
                with open(path) as f:
                    text = f.read().replace("\0", "")
                if text.rstrip().endswith(">") or "in <module>" in text or len(text) > 200:
                    time.sleep(0.05)  # let the dump finish
                    with open(path) as f:
                        text = f.read().replace("\0", "")
                    break
                time.sleep(0.02)
            stacks[r] = _annotate_stack(text) or "(no stack: the rank did not answer SIGUSR1)"
        return stacks

    def _recover(self, outputs, pending):
        for r in pending.values():  # partial output of the ranks that were stopped
            try:
                with open(os.path.join(self._workdir, f"rank{r}.out"), encoding="utf-8", errors="replace") as f:
                    outputs[r] = f.read()
            except OSError:
                pass
        self.restart()

    def run(self, fn, args=(), kwargs=None, *, ranks=None, timeout=None):
        """Call ``fn(*args, **kwargs)`` on the ranks (all by default); per-rank return values.

        ``fn`` is cloudpickled, so a function defined in the notebook works; it runs in the
        rank's process (``torch.distributed`` is initialised), not in its cell namespace.
        """
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        ranks = self._ranks(ranks)
        payload = (fn, tuple(args), dict(kwargs or {}))
        try:
            results, outputs = self._call("call", {r: payload for r in ranks}, ranks, timeout)
        except RankError as err:
            _print_grouped(sorted(err.outputs), err.outputs)
            raise
        _print_grouped(ranks, outputs)
        return results

    def execute(self, source, *, ranks=None, timeout=None, show=True):
        """Run ``source`` (Python code) in each rank's namespace; per-rank repr of the last
        expression (None if the cell does not end on an expression). Output grouped by rank."""
        ranks = self._ranks(ranks)
        self._cells += 1
        filename = f"<rank cell {self._cells}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        try:
            results, outputs = self._call("exec", {r: (source, filename) for r in ranks}, ranks, timeout)
        except RankError as err:
            if show:
                _print_grouped(sorted(err.outputs), err.outputs)
            raise
        if show:
            _print_grouped(ranks, outputs, results)
        return results

    def pull(self, name, *, ranks=None, timeout=None):
        """Value of variable ``name`` on each rank (list in rank order)."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"name must be a variable name, got {name!r}")
        ranks = self._ranks(ranks)
        results, _ = self._call("pull", {r: [name] for r in ranks}, ranks, timeout)
        return [values[0] for values in results]

    def push(self, *, ranks=None, per_rank=False, timeout=None, **values):
        """Set variables on the ranks: ``push(x=1)`` gives every rank x = 1;
        ``push(per_rank=True, x=[v0, v1, ...])`` gives the i-th targeted rank x = v_i."""
        ranks = self._ranks(ranks)
        if not values:
            raise ValueError("push needs at least one name=value")
        payloads = {r: {} for r in ranks}
        for name, value in values.items():
            if per_rank:
                if not hasattr(value, "__len__") or len(value) != len(ranks):
                    raise ValueError(
                        f"with per_rank=True, {name} must have one value per "
                        f"targeted rank ({len(ranks)}), got "
                        f"{len(value) if hasattr(value, '__len__') else type(value).__name__}"
                    )
                for r, v in zip(ranks, value):
                    payloads[r][name] = v
            else:
                for r in ranks:
                    payloads[r][name] = value
        self._call("push", payloads, ranks, timeout)


def _print_grouped(ranks, outputs, values=None):
    """Print each rank's output, then its last expression's value, grouped by rank."""
    for r, value in zip(ranks, values or [None] * len(ranks)):
        for line in outputs.get(r, "").splitlines():
            print(f"[rank {r}] {line}")
        if value is not None:
            print(f"[rank {r}] Out: {value}")


def current() -> Cluster | None:
    """The most recently created Cluster that is still running (what ``%%ranks`` uses)."""
    c = _current() if _current is not None else None
    if c is not None and c.alive:
        return c
    alive = [c for c in _clusters if c.alive]
    return alive[-1] if alive else None


@atexit.register
def _shutdown_all():
    for c in list(_clusters):
        try:
            c.shutdown()
        except Exception:
            pass


# --------------------------------------------------------------------------------------------
# %%ranks
# --------------------------------------------------------------------------------------------
def _parse_ranks(spec, world_size):
    """ "0,2" or "1-3" or "all" -> sorted list of ranks."""
    if spec in (None, "", "all"):
        return None
    ranks = []
    for part in spec.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ValueError(f"ranks must look like 0,2 or 1-3 or all, got {spec!r}")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        ranks.extend(range(lo, hi + 1))
    for r in ranks:
        check_int(f"each of ranks={spec!r} (world_size={world_size})", r, 0, world_size - 1)

    return sorted(set(ranks))


def _magic_parser():
    p = argparse.ArgumentParser(prog="%%ranks", add_help=False)
    p.add_argument("ranks", nargs="?", default=None)
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--cluster", default=None)
    p.add_argument("--no-raise", action="store_true")
    return p


def ranks_magic(line, cell, ipython=None):
    """``%%ranks [RANKS] [--timeout S] [--cluster NAME] [--no-raise]``: run the cell on ranks.

    RANKS: ``0,2``, ``1-3`` or ``all`` (default). ``--cluster NAME`` picks a Cluster variable
    (default: the most recent one). ``--no-raise`` prints a failure instead of raising it (the
    error is kept in ``cluster.last_error``). Failures and bad arguments raise IPython's
    ``UsageError`` (a short message, no traceback of the magic's own machinery) after the
    per-rank tracebacks and stacks were printed.
    """
    from IPython.core.error import UsageError

    try:
        args = _magic_parser().parse_args(shlex.split(line))
    except SystemExit:
        raise UsageError(
            f"usage: %%ranks [0,2 | 1-3 | all] [--timeout S] [--cluster NAME] [--no-raise]; got {line!r}"
        ) from None
    if args.cluster is not None:
        ns = ipython.user_ns if ipython is not None else {}
        cluster = ns.get(args.cluster)
        if not isinstance(cluster, Cluster):
            raise UsageError(f"--cluster {args.cluster!r} is not a Cluster variable")
    else:
        cluster = current()
    if cluster is None:
        raise UsageError("no running cluster: create one first, e.g. cluster = mlsys_nb.Cluster(world_size=4)")
    try:
        ranks = _parse_ranks(args.ranks, cluster.world_size)
        if args.timeout is not None:
            check_seconds("--timeout", args.timeout)
    except ValueError as err:
        raise UsageError(str(err)) from None
    try:
        cluster.execute(cell, ranks=ranks, timeout=args.timeout)
    except RankError as err:
        print(err.report(), file=sys.stderr)
        if not args.no_raise:
            raise UsageError(f"{err} (details: cluster.last_error)") from None


def register_ranks_magic(ipython):
    """Register ``%%ranks`` (``%load_ext mlsys_nb``)."""

    def ranks(line, cell):
        return ranks_magic(line, cell, ipython)

    ranks.__doc__ = ranks_magic.__doc__
    ipython.register_magic_function(ranks, magic_kind="cell", magic_name="ranks")
