"""Two server gaps of issue 28, measured before and after the fix in one run (interleaved).

1. A non-streaming client that leaves while its request runs. A raw socket sends a completion of 110 tokens on
   the ``tiny`` preset, waits until ``/metrics`` shows it running, closes; we read how many engine steps ran after
   the close and whether it ended aborted or finished. Two servers run side by side: the current one and one whose
   ``serve.py`` is taken from git at ``--before`` (the handler that looked for the disconnect only after 0.1 s
   without an output); trials alternate between them.
2. The grammar-states limit for (a|b)*a(a|b){n} (2^(n+1) states on characters): seconds of
   ``structured.dfa_states`` (the bounded count made before compiling, stopping at ``max_grammar_states`` + 1)
   against seconds of outlines-core's compilation (``Index`` + ``get_transitions``, which the old check waited
   for), alternating, with both counts.

    .venv/bin/python benchmarks/server_robustness.py [--trials 5] [--out data/measured/server_robustness.md]
    .venv/bin/python benchmarks/server_robustness.py --quick   # a smoke run: the current server only, one
                                                               # leaver, one grammar size; writes nothing
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from mlsys_nb.runtime.machine import summary as machine  # noqa: E402
from mlsys_nb.runtime.timing import Timer, median  # noqa: E402


def metrics(url: str) -> dict:
    import httpx

    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        line.split()[0].removeprefix("mlsys_nb_"): float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def leaver_trial(url: str, timeout: float = 60) -> dict:
    """One non-streaming leaver: steps after the close, aborted or finished (every wait bounded)."""
    host, port = url.removeprefix("http://").split(":")
    before = metrics(url)
    body = {"model": "tiny", "prompt": "long story", "max_tokens": 110, "temperature": 0, "ignore_eos": True}
    data = json.dumps(body).encode()
    deadline = time.monotonic() + timeout
    with socket.create_connection((host, int(port)), timeout=30) as s:
        head = f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        s.sendall(f"{head}content-length: {len(data)}\r\n\r\n".encode() + data)
        while metrics(url)["num_requests_running"] == 0:
            if time.monotonic() > deadline:
                raise TimeoutError("the request never started")
            time.sleep(0.005)
        at_close = metrics(url)["engine_steps_total"]
    while (m := metrics(url))["num_requests_running"] or m["kv_blocks_used"]:
        if time.monotonic() > deadline:
            raise TimeoutError("the request never ended")
        time.sleep(0.01)
    return {
        "steps_after_close": int(m["engine_steps_total"] - at_close),
        "aborted": int(m["requests_aborted_total"] - before["requests_aborted_total"]),
        "finished": int(m["requests_finished_total"] - before["requests_finished_total"]),
    }


@contextlib.contextmanager
def old_package(commit: str):
    """A copy of ``mlsys_nb`` whose ``inference/serve.py`` is the one at ``commit``; yields its parent folder."""
    tmp = Path(tempfile.mkdtemp(prefix="serve_before_"))
    try:
        shutil.copytree(ROOT / "mlsys_nb", tmp / "mlsys_nb", ignore=shutil.ignore_patterns("__pycache__"))
        old = subprocess.run(
            ["git", "show", f"{commit}:mlsys_nb/inference/serve.py"], cwd=ROOT, check=True, capture_output=True
        ).stdout
        (tmp / "mlsys_nb" / "inference" / "serve.py").write_bytes(old)
        (tmp / "data").symlink_to(ROOT / "data")  # the presets (data/models.yaml)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def server(pythonpath: Path):
    from serve_helpers import free_port, stop_process, wait_health

    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    cmd = [sys.executable, "-m", "mlsys_nb.inference.serve", "--model", "tiny", "--port", str(port)]
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, env=env, cwd=pythonpath, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_health(url, timeout=120)
        except Exception:
            log.seek(0)
            raise RuntimeError(f"the server at {pythonpath} did not start: {log.read()[-2000:]}") from None
        yield url
    finally:
        log.close()
        stop_process(proc)


def grammar_rows(ns, limit: int) -> list[dict]:
    from outlines_core import Index, Vocabulary

    from mlsys_nb.inference.structured import dfa_states

    vocab = Vocabulary(256, {bytes([i]): [i] for i in range(256)})
    rows = []
    for n in ns:
        rx = f"(a|b)*a(a|b){{{n}}}"
        with Timer() as t_count:
            counted = dfa_states(rx, limit)
        with Timer() as t_compile:
            compiled = len(Index(rx, vocab).get_transitions())
        rows.append(dict(n=n, counted=counted, count_s=t_count.seconds, compiled=compiled, compile_s=t_compile.seconds))
    return rows


def main(argv=None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5, help="leavers per server (alternating)")
    ap.add_argument("--before", default="10e2cdf", help="the commit whose serve.py is the 'before' server")
    ap.add_argument("--limit", type=int, default=100_000, help="max_grammar_states (the server's default)")
    ap.add_argument("--out", default=None, help="append the report to this markdown file")
    ap.add_argument("--quick", action="store_true", help="smoke run: no before server, 1 trial, n = 2")
    args = ap.parse_args(argv)
    if args.trials < 1:
        raise SystemExit(f"--trials={args.trials}: must be >= 1")
    if args.quick and args.out:
        raise SystemExit("--quick is a smoke run: it writes no record (drop --out)")
    head = machine()
    trials: dict[str, list[dict]] = {"before": [], "after": []}
    if args.quick:
        with server(ROOT) as after_url:
            trials["after"].append(leaver_trial(after_url))
    else:
        with old_package(args.before) as old, server(ROOT) as after_url, server(old) as before_url:
            for _ in range(args.trials):
                trials["before"].append(leaver_trial(before_url))
                trials["after"].append(leaver_trial(after_url))
    grammar = grammar_rows([2] if args.quick else [10, 12, 14, 15, 16], args.limit)
    lines = [f"## {head}", ""]
    lines += [
        f"Non-streaming leavers ({args.trials} per server, alternating; 110 tokens asked, the socket closed once the "
        "request runs):",
        "",
        "| server | aborted | finished | engine steps after the close (median, max) |",
        "|---|---|---|---|",
    ]
    now = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    after = f"after (the working tree at {now.strip() or 'an unknown commit'})"
    for name, label in (("before", f"before (`serve.py` at {args.before})"), ("after", after)):
        ts = trials[name]
        if not ts:  # --quick: no 'before' server
            continue
        steps = [t["steps_after_close"] for t in ts]
        lines.append(
            f"| {label} | {sum(t['aborted'] for t in ts)}/{len(ts)} | {sum(t['finished'] for t in ts)}/{len(ts)} | "
            f"{median(steps):.0f}, {max(steps)} |"
        )
    lines += [
        "",
        f"Grammar states of (a|b)*a(a|b){{n}}: the bounded count before compiling (stops at {args.limit:,} + 1) vs "
        "outlines-core's compilation over the byte vocabulary (one run each, alternating):",
        "",
        "| n | counted before compiling | seconds | compiled states | seconds to compile |",
        "|---|---|---|---|---|",
    ]
    for r in grammar:
        counted = f"> {args.limit:,} (stopped)" if r["counted"] > args.limit else f"{r['counted']:,}"
        lines.append(f"| {r['n']} | {counted} | {r['count_s']:.2f} | {r['compiled']:,} | {r['compile_s']:.2f} |")
    lines += ["", f"Load average at the end: {os.getloadavg()[0]:.1f} (other jobs share this machine).", ""]
    report = "\n".join(lines)
    print(report)
    if args.out:
        out = Path(args.out)
        if not out.exists():
            out.write_text(
                "# Server robustness: leavers and the grammar-states limit (benchmarks/server_robustness.py)\n\n"
                "Measured on a shared 2-core machine. Regenerate with "
                "`.venv/bin/python benchmarks/server_robustness.py --out data/measured/server_robustness.md`.\n\n"
            )
        with out.open("a") as f:
            f.write(report + "\n")
    return report


if __name__ == "__main__":
    main()
