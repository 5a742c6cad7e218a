"""A server that survives its clients, driven live (uvicorn on a free loopback port, the ``openai`` client, httpx
and raw sockets): poisoned values never hurt other requests, every field is honoured or refused with a 4xx naming
it, disconnected clients (streaming or not) are aborted, a full queue answers 429, a failing request gets an error
event while the others finish, and the server's memory stays flat over 2,000 requests."""

import concurrent.futures as cf
import json
import math
import random
import socket
import threading
import time

import httpx
import pytest

from serve_helpers import free_port, wait_health

openai = pytest.importorskip("openai")
psutil = pytest.importorskip("psutil")
CONTEXT = 128  # the tiny preset's context


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server  # (url, pid), shared with tests/test_server.py (conftest)


@pytest.fixture(scope="module")
def url(server):
    return server[0]


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def offline():
    """Greedy texts of the offline engine (as the server runs it: one torch thread, the same seed)."""
    import torch

    from mlsys_nb.inference import LLM, SamplingParams

    llm, cache = LLM("tiny", seed=0), {}

    def texts(prompts, max_tokens=24):
        todo = [p for p in prompts if (p, max_tokens) not in cache]
        if todo:
            n = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
                for p, o in zip(todo, llm.generate(todo, sp, use_tqdm=False)):
                    cache[p, max_tokens] = o.outputs[0].text
            finally:
                torch.set_num_threads(n)
        return [cache[p, max_tokens] for p in prompts]

    return texts


def metrics(url) -> dict:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        line.split()[0].removeprefix("mlsys_nb_"): float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def wait_idle(url, timeout=60) -> dict:
    """Blocks, queues and open streams back to zero (every wait bounded)."""
    deadline = time.monotonic() + timeout
    keys = (
        "kv_blocks_used",
        "num_requests_running",
        "num_requests_waiting",
        "num_sequences_waiting",
        "num_open_streams",
    )
    while any((m := metrics(url))[k] for k in keys):
        assert time.monotonic() < deadline, f"not back to zero: { {k: m[k] for k in keys} }"
        time.sleep(0.1)
    return m


GOOD = {"model": "tiny", "temperature": 0, "max_tokens": 24, "ignore_eos": True}
COMPL, CHAT = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

# (what, path, body (dict or raw bytes), expected status, expected error param)
POISONED = [
    ("logprobs above the vocabulary", COMPL, {"prompt": "p", "logprobs": 321}, 400, "logprobs"),
    ("top_logprobs above the vocabulary", CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 321}, 400,
     "top_logprobs"),
    ("temperature NaN", COMPL, b'{"model": "tiny", "prompt": "p", "temperature": NaN}', 400, "temperature"),
    ("seed 2**64-1 with n 2", COMPL, {"prompt": "p", "seed": 2**64 - 1, "n": 2}, 400, "seed"),
]  # fmt: skip
DEEP = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
MALFORMED = [
    ("not JSON", COMPL, b"{not json", 400, None),
    ("nested too deeply", COMPL, DEEP, 400, None),
    ("a list body", COMPL, b"[1, 2]", 400, None),
    ("unknown model", COMPL, {"model": "gpt-4", "prompt": "p"}, 404, "model"),
    ("stream as a string", COMPL, {"prompt": "p", "stream": "false"}, 400, "stream"),
    ("temperature as a string", COMPL, {"prompt": "p", "temperature": "1"}, 400, "temperature"),
    ("negative temperature", COMPL, {"prompt": "p", "temperature": -1}, 400, "temperature"),
    ("top_p 0", COMPL, {"prompt": "p", "top_p": 0}, 400, "top_p"),
    ("top_k 0", COMPL, {"prompt": "p", "top_k": 0}, 400, "top_k"),
    ("max_tokens 0", COMPL, {"prompt": "p", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens beyond the context", COMPL, {"prompt": "p", "max_tokens": CONTEXT}, 400, "max_tokens"),
    ("chat max_tokens beyond the context", CHAT, {"messages": MSG, "max_tokens": CONTEXT}, 400, "max_tokens"),
    ("n above max_n", COMPL, {"prompt": "p", "n": 8000}, 400, "n"),
    ("logprobs as a bool", COMPL, {"prompt": "p", "logprobs": True}, 400, "logprobs"),
    ("seed as a string", COMPL, {"prompt": "p", "seed": "1"}, 400, "seed"),
    ("stop as a number", COMPL, {"prompt": "p", "stop": 5}, 400, "stop"),
    ("stop_token_ids beyond the vocabulary", COMPL, {"prompt": "p", "stop_token_ids": [999]}, 400, "stop_token_ids"),
    ("logit_bias key not a token id", COMPL, {"prompt": "p", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("logit_bias above 100", COMPL, {"prompt": "p", "logit_bias": {"5": 1000}}, 400, "logit_bias"),
    ("presence_penalty 3", COMPL, {"prompt": "p", "presence_penalty": 3}, 400, "presence_penalty"),
    ("suffix", COMPL, {"prompt": "p", "suffix": "x"}, 400, "suffix"),
    ("tools", CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("an unknown field", COMPL, {"prompt": "p", "frobnicate": 1}, 400, "frobnicate"),
    ("best_of above n", COMPL, {"prompt": "p", "best_of": 3}, 400, "best_of"),
    ("top_logprobs without logprobs", CHAT, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    ("an unknown role", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("a 10 MB prompt", COMPL, {"prompt": "x" * 10_000_000}, 400, "prompt"),
    ("stream_options without stream", COMPL, {"prompt": "p", "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    ("min_tokens above max_tokens", COMPL, {"prompt": "p", "min_tokens": 9, "max_tokens": 4}, 400, "min_tokens"),
    ("echo as a string", COMPL, {"prompt": "p", "echo": "yes"}, 400, "echo"),
    ("a schema keyword the grammar ignores", CHAT, {"messages": MSG, "max_tokens": 20, "response_format": {
        "type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer", "minimum": 5}}}}, 400,
     "response_format"),
]  # fmt: skip


def send(url, path, body, timeout=120) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=timeout)
    return httpx.post(url + path, json={"model": "tiny", **body}, timeout=timeout)


def check_error(r: httpx.Response, status, param, what):
    assert r.status_code == status, (what, r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], (what, err)
    assert err["param"] == param, (what, err)


def stream_text(client, prompt, **kw) -> tuple[str, str]:
    chunks = list(client.completions.create(prompt=prompt, stream=True, **kw))
    return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].choices[0].finish_reason


def good_kw(max_tokens=24):
    return {"model": "tiny", "temperature": 0, "max_tokens": max_tokens, "extra_body": {"ignore_eos": True}}


def test_poisoned_values_never_hurt_the_other_streams(url, client, offline):
    """Each poisoned value while 8 good streams run: 8/8 finish with the offline engine's text, each poisoned
    request gets a 400 naming its field, temperature 1e-45 is served (sampled at 0.01) and top_p 1e-320 gives
    the argmax."""
    prompts = [f"stream {i}: " + "xyz" * i for i in range(8)]
    want = offline(prompts, 60)
    with cf.ThreadPoolExecutor(16) as pool:
        streams = [pool.submit(stream_text, client, p, **good_kw(60)) for p in prompts]
        bad = [pool.submit(send, url, path, body) for _, path, body, _, _ in POISONED]
        tiny = [
            pool.submit(send, url, COMPL, {**GOOD, "prompt": "argmax", "temperature": 1e-45}),
            pool.submit(send, url, COMPL, {**GOOD, "prompt": "argmax", "temperature": 1.0, "top_p": 1e-320}),
        ]
        for (what, _, _, status, param), f in zip(POISONED, bad):
            check_error(f.result(timeout=300), status, param, what)
        r = tiny[0].result(timeout=300)  # sampled at temperature 0.01 (vLLM's floor)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 24
        r = tiny[1].result(timeout=300)  # only the most likely token survives top_p
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == offline(["argmax"])[0]
        assert [f.result(timeout=300) for f in streams] == [(w, "length") for w in want]
    wait_idle(url)


def raw_request(url, path, body: dict) -> socket.socket:
    """Send a request on a raw socket and return it (unread): closing it is a client that went away."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    s = socket.create_connection((host, int(port)), timeout=30)
    head = f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
    s.sendall(f"{head}content-length: {len(data)}\r\n\r\n".encode() + data)
    return s


def test_a_client_that_leaves_before_its_body_is_read_counts_as_aborted(url):
    """Half a body, then the socket closes: the request never reaches the engine, yet it ended because its client
    left, so it counts once in requests_aborted_total (under load this is how a quick leaver ends)."""
    before = metrics(url)
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps({**GOOD, "prompt": "never read"}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as s:
        head = f"POST {COMPL} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        s.sendall(f"{head}content-length: {len(data)}\r\n\r\n".encode() + data[: len(data) // 2])
        time.sleep(0.3)  # the handler is now waiting for the rest of the body
    deadline = time.monotonic() + 30
    while metrics(url)["requests_aborted_total"] == before["requests_aborted_total"]:
        assert time.monotonic() < deadline, "a client that left mid-body was never counted as aborted"
        time.sleep(0.05)
    m = wait_idle(url)
    assert m["requests_aborted_total"] - before["requests_aborted_total"] == 1
    assert m["requests_finished_total"] == before["requests_finished_total"]


def test_fields_are_honoured(url, client, offline):
    """logit_bias, min_tokens, stop_reason, echo, include_usage, logprobs in OpenAI's shapes (streamed too)."""
    p = {**GOOD, "prompt": "honour", "max_tokens": 6}
    r = send(url, COMPL, {**p, "logit_bias": {"65": 100}}).json()
    assert r["choices"][0]["text"] == "A" * 6
    r = send(url, COMPL, {**p, "ignore_eos": False, "logit_bias": {"256": 100}}).json()
    assert r["usage"]["completion_tokens"] == 1 and r["choices"][0]["finish_reason"] == "stop"
    r = send(url, COMPL, {**p, "ignore_eos": False, "logit_bias": {"256": 100}, "min_tokens": 4}).json()
    assert r["usage"]["completion_tokens"] == 5, "min_tokens keeps the end of sequence away for 4 tokens"
    r = send(url, COMPL, {**p, "logit_bias": {"120": 100}, "stop": ["xx"]}).json()["choices"][0]
    assert (r["text"], r["finish_reason"], r["stop_reason"]) == ("", "stop", "xx")
    r = send(url, COMPL, {**p, "echo": True}).json()
    assert r["choices"][0]["text"] == "honour" + offline(["honour"], 6)[0]
    chunks = list(client.completions.create(prompt="honour", stream=True, stream_options={"include_usage": True},
                                            **good_kw(6)))  # fmt: skip
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    # completions logprobs: tokens, token_logprobs, top_logprobs, text_offset; the offline engine's values
    from mlsys_nb.inference import LLM, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3)
    ref = LLM("tiny", seed=0).generate("honour", sp, use_tqdm=False)[0].outputs[0]
    r = client.completions.create(prompt="honour", logprobs=3, **good_kw(6))
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == pytest.approx([e[t].logprob for t, e in zip(ref.token_ids, ref.logprobs)], abs=1e-4)
    assert all(len(d) >= 3 for d in lp.top_logprobs) and lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset) and len(lp.tokens) == 6
    streamed = list(client.completions.create(prompt="honour", logprobs=3, stream=True, **good_kw(6)))
    assert sum((c.choices[0].logprobs.tokens for c in streamed if c.choices[0].logprobs), []) == lp.tokens
    # chat logprobs: content = [{token, logprob, bytes, top_logprobs}], read by the openai client
    kw = dict(model="tiny", messages=MSG, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2)
    c = client.chat.completions.create(**kw).choices[0].logprobs.content
    assert len(c) == 5 and all(len(e.top_logprobs) == 2 and e.logprob <= 0 and isinstance(e.bytes, list) for e in c)
    assert all(e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob for e in c)
    s = list(client.chat.completions.create(stream=True, **kw))
    assert [e.token for ch in s if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content] == [
        e.token for e in c
    ]
    # chat without max_tokens: the rest of the context
    r = send(url, CHAT, {"messages": MSG, "temperature": 0, "ignore_eos": True}).json()
    assert r["usage"]["total_tokens"] == CONTEXT and r["choices"][0]["finish_reason"] == "length"


def test_grammar_compilation_is_off_the_event_loop(url, client):
    """(a|b)*a(a|b){15} passes the count before compiling (65,536 character-level states, below the server's
    max_grammar_states=100,000) but compiles to 131,072 states: a 400 naming the limit after compiling; while it
    compiles, /health and a completion are served (the compilation runs in a worker thread, outside the engine
    lock). (a|b)*a(a|b){16} is refused by the count, before compiling."""
    with cf.ThreadPoolExecutor(1) as pool:
        f = pool.submit(send, url, COMPL, {**GOOD, "prompt": "p", "regex": "(a|b)*a(a|b){15}", "max_tokens": 30})
        time.sleep(0.3)
        assert httpx.get(url + "/health", timeout=60).status_code == 200
        assert client.completions.create(prompt="meanwhile", **good_kw(3)).usage.completion_tokens == 3
        assert not f.done(), "the compilation should still be running (else this test shows nothing)"
        r = f.result(timeout=300)
    check_error(r, 400, "regex", "too many grammar states")
    assert "max_grammar_states" in r.json()["error"]["message"]
    assert "before compiling" not in r.json()["error"]["message"]
    r = send(url, COMPL, {**GOOD, "prompt": "p", "regex": "(a|b)*a(a|b){16}", "max_tokens": 30})
    check_error(r, 400, "regex", "too many grammar states, counted before compiling")
    assert "max_grammar_states=100000" in r.json()["error"]["message"]
    assert "before compiling" in r.json()["error"]["message"]


def test_memory_flat_over_2000_requests(server):
    """2,000 short requests (8 at a time): the server's RSS after the last 1,500 is within a few MB of the RSS
    after the first 500 (the engine's step records and token log are bounded windows)."""
    url, pid = server
    proc = psutil.Process(pid)
    body = {**GOOD, "max_tokens": 2}

    def batch(k):
        with httpx.Client(timeout=60) as c:
            for i in range(k):
                assert c.post(url + COMPL, json={**body, "prompt": f"r{i % 50}"}).status_code == 200

    with cf.ThreadPoolExecutor(8) as pool:
        list(pool.map(batch, [500 // 8 + 1] * 8))
        rss0 = proc.memory_info().rss
        list(pool.map(batch, [1500 // 8 + 1] * 8))
    rss1 = proc.memory_info().rss
    wait_idle(url)
    assert rss1 - rss0 < 8 * 2**20, f"RSS grew {(rss1 - rss0) / 2**20:.1f} MiB over 1,500 requests"


# ---- in-process server: a request that fails inside the engine, and a full queue -------------------------
@pytest.fixture
def local_server():
    """build_app in this process (so the engine can be patched), served by uvicorn in a thread."""
    import torch
    import uvicorn

    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.serve import Limits, build_app

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = []

    def start(max_num_seqs=64, clock=time.perf_counter, **limits):
        engine = LLMEngine("tiny", max_num_seqs=max_num_seqs, seed=0)
        app = build_app(engine, "tiny", Limits(**limits), clock=clock)
        port = free_port()
        srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        th = threading.Thread(target=srv.run, daemon=True)
        th.start()
        started.append((srv, th))
        u = f"http://127.0.0.1:{port}"
        wait_health(u, timeout=60)
        return u, engine

    yield start
    for srv, th in started:
        srv.should_exit = True
        th.join(timeout=30)
    torch.set_num_threads(threads)


def test_a_non_streaming_client_that_leaves_while_tokens_flow_is_aborted(local_server):
    """A non-streaming request runs (each step takes about 20 ms more: 110 tokens take over 2 s), its client
    closes the socket: the request is aborted at once, not run to completion. The engine hands the handler an
    output at every step, so a handler that looks for the disconnect only when no output came for 0.1 s (the
    bug behind CI's "4 of 8 leavers aborted" on a quiet machine) never sees it and this test fails."""
    u, engine = local_server()
    real_step = engine.step

    def slow_step():
        time.sleep(0.02)
        return real_step()

    engine.step = slow_step
    before = metrics(u)
    s = raw_request(u, COMPL, {**GOOD, "prompt": "long story", "max_tokens": 110})
    deadline = time.monotonic() + 60
    while metrics(u)["num_requests_running"] == 0:  # it runs: tokens flow to the handler at every step
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.01)
    s.close()
    m = wait_idle(u)
    assert m["requests_aborted_total"] - before["requests_aborted_total"] == 1
    assert m["requests_finished_total"] == before["requests_finished_total"], "it ran to completion"
    assert m["generation_tokens_total"] - before["generation_tokens_total"] < 110


def test_a_failing_request_gets_an_error_event_and_the_others_finish(local_server, offline):
    u, engine = local_server()
    real = engine.append_token

    def append(seq, tok, lp, now):  # requests whose prompt starts with "POISON" raise after 3 tokens
        if bytes(seq.prompt_token_ids[:6]) == b"POISON" and len(seq.output_token_ids) >= 3:
            raise FloatingPointError("poisoned")
        return real(seq, tok, lp, now)

    engine.append_token = append
    client = openai.OpenAI(base_url=u + "/v1", api_key="unused", timeout=120, max_retries=0)
    prompts = [f"good {i}" for i in range(8)]
    want = offline(prompts, 40)

    def poisoned_stream():
        with pytest.raises(openai.APIError, match="poisoned"):
            list(client.completions.create(prompt="POISON s", stream=True, **good_kw(40)))

    with cf.ThreadPoolExecutor(10) as pool:
        good = [pool.submit(stream_text, client, p, **good_kw(40)) for p in prompts]
        bad = pool.submit(poisoned_stream)
        r = send(u, COMPL, {**GOOD, "prompt": "POISON n", "max_tokens": 40})
        assert r.status_code == 500 and "poisoned" in r.json()["error"]["message"]
        bad.result(timeout=300)
        assert [f.result(timeout=300) for f in good] == [(w, "length") for w in want]
    m = wait_idle(u)
    assert m["requests_failed_total"] == 2


LEAVER_STEP_S = 0.05  # seconds added to every engine step in test_everything_at_once (see there)


def test_everything_at_once(local_server, offline):
    """32 streams, 8 non-streaming, 8 clients that leave early (4 streaming, 4 not: raw sockets closed), the
    poisoned values and the malformed requests, all at once: every good request gets the offline text, every bad
    one a 4xx JSON error naming its field, every leaver is aborted, and blocks and queues return to zero.

    Served in this process with every engine step LEAVER_STEP_S slower (as in the one-leaver test above): the
    tiny model runs a leaver's 110 tokens in ~0.33 s at full speed, so a non-streaming leaver that closes 0.2 s
    after sending (later still when its thread waits for the GIL among 96) could finish before its close was
    handled (CI: "3 aborted, 5 finished, of 8", alone too). At 0.05 s a step its 110 tokens take over 5.5 s,
    25x the time it takes to leave: every leaver must be aborted, and a handler that misses a disconnect
    lets its leaver finish and fails the check."""
    url, engine = local_server()
    real_step = engine.step

    def slow_step():
        time.sleep(LEAVER_STEP_S)
        return real_step()

    engine.step = slow_step
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=120, max_retries=0)
    before = metrics(url)
    prompts = [f"request {i}: " + "abc" * (i % 5) for i in range(40)]
    want = offline(prompts)
    leave = {**GOOD, "prompt": "long story", "max_tokens": 110}

    def leave_streaming():
        with httpx.stream("POST", url + COMPL, json={**leave, "stream": True}, timeout=60) as r:
            next(line for line in r.iter_lines() if line.startswith("data:"))  # it runs: now go away

    def leave_waiting():
        s = raw_request(url, COMPL, leave)
        time.sleep(0.2)
        s.close()

    plain = lambda p: client.completions.create(prompt=p, **good_kw()).choices[0].text  # noqa: E731
    with cf.ThreadPoolExecutor(96) as pool:
        streams = [pool.submit(stream_text, client, p, **good_kw()) for p in prompts[:32]]
        plains = [pool.submit(plain, p) for p in prompts[32:]]
        leavers = [pool.submit(leave_streaming) for _ in range(4)] + [pool.submit(leave_waiting) for _ in range(4)]
        bad = [(case, pool.submit(send, url, case[1], case[2])) for case in POISONED + MALFORMED]
        for (what, _, _, status, param), f in bad:
            check_error(f.result(timeout=300), status, param, what)
        assert [f.result(timeout=300) for f in streams] == [(w, "length") for w in want[:32]]
        assert [f.result(timeout=300) for f in plains] == want[32:]
        for f in leavers:
            f.result(timeout=300)
    m = wait_idle(url)  # nothing left running, waiting or holding blocks
    aborted = m["requests_aborted_total"] - before["requests_aborted_total"]
    finished = m["requests_finished_total"] - before["requests_finished_total"] - len(prompts)
    # Every leaver is aborted (each asks for 110 tokens, >5.5 s here, and leaves after its first one, or 0.2 s
    # after sending).
    assert (aborted, finished) == (8, 0), f"leavers: {aborted} aborted, {finished} finished, of 8"
    assert m["requests_failed_total"] == before["requests_failed_total"], "no request may fail inside the engine"
    r = httpx.get(url + "/v1/nowhere", timeout=10)
    check_error(r, 404, None, "unknown route")
    check_error(httpx.get(url + COMPL, timeout=10), 405, None, "wrong method")


def test_retry_after_is_the_time_the_queue_needs_to_drain():
    """Retry-After = ceil(waiting / recent departures per second), clamped to [1, 60]; 60 when none left."""
    from mlsys_nb.inference.serve import retry_after_seconds

    rng = random.Random(0)
    for _ in range(200):
        now, window = rng.uniform(50, 100), rng.uniform(1, 20)
        times = [rng.uniform(now - 2 * window, now + 1) for _ in range(rng.randrange(0, 40))]
        waiting = rng.randrange(0, 300)
        recent = [t for t in times if now - window <= t <= now]  # future times (another clock) do not count
        want = 60 if not recent else min(60, max(1, math.ceil(waiting / (len(recent) / window))))
        assert retry_after_seconds(waiting, times, now, window) == want
    assert retry_after_seconds(5, [9.5] * 10, now=10, window=10) == 5  # 1 request/s: 5 s for 5 waiting
    assert retry_after_seconds(5, [], now=10) == 60 and retry_after_seconds(0, [9.0], now=10) == 1
    with pytest.raises(ValueError, match="window"):
        retry_after_seconds(1, [], now=0, window=0)


def test_a_full_queue_answers_429(local_server):
    """One sequence runs at a time and 2 requests may wait: the 4th gets 429 with a Retry-After derived from the
    queue (a frozen clock: the 3 requests that finished before stay in the 10 s window, 0.3 requests/s, so 2
    waiting need ceil(2 / 0.3) = 7 s); /metrics counts the waiting requests and their queue time; everything
    drains afterwards.

    Every engine step is LEAVER_STEP_S slower (100 tokens take over 5 s; at full speed the tiny model ran them in
    ~0.3 s, so the running request could finish before the two waiting ones were queued: 2 failures in 6 runs on
    a loaded machine), and the queue is read until both wait (bounded) before the 4th request is sent."""
    u, engine = local_server(max_num_seqs=1, max_waiting_requests=2, clock=lambda: 1000.0)
    for i in range(3):
        assert send(u, COMPL, {**GOOD, "prompt": f"warm {i}", "max_tokens": 2}).status_code == 200
    real_step = engine.step

    def slow_step():
        time.sleep(LEAVER_STEP_S)
        return real_step()

    engine.step = slow_step
    body = {"model": "tiny", "messages": MSG, "max_tokens": 100, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=60) as c, c.stream("POST", u + CHAT, json=body) as r1:
        lines = r1.iter_lines()
        next(x for x in lines if '"content": "' in x and '"content": ""' not in x)  # the first token: it runs
        with c.stream("POST", u + CHAT, json=body), c.stream("POST", u + CHAT, json=body):
            deadline = time.monotonic() + 30
            while (m := metrics(u))["num_requests_waiting"] < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert (m["num_requests_running"], m["num_requests_waiting"]) == (1, 2), m
            r = httpx.post(u + COMPL, json={**GOOD, "prompt": "p"}, timeout=60)
            check_error(r, 429, None, "full queue")
            assert r.headers["retry-after"] == "7" and r.json()["error"]["type"] == "rate_limit_error"
    m = wait_idle(u)
    assert m["requests_rejected_total"] == 1 and m["request_queue_time_seconds_count"] >= 1


# ---- max_grammar_states: a bounded count before compiling -------------------------------------------------
def random_regex(rng, depth=0) -> str:
    """A random regex over a few characters: literals, classes, alternation, stars and bounded repeats."""
    kind = rng.randrange(7) if depth < 3 else rng.randrange(2)
    if kind == 0:
        return rng.choice("abc")
    if kind == 1:
        return rng.choice(["[ab]", "[^a]", "[a-c]", "\\d", "."])
    if kind == 2:
        return "(" + "|".join(random_regex(rng, depth + 1) for _ in range(rng.randrange(2, 4))) + ")"
    if kind == 3:
        return "(" + random_regex(rng, depth + 1) + ")*"
    if kind == 4:
        lo = rng.randrange(0, 3)
        return "(" + random_regex(rng, depth + 1) + f"){{{lo},{lo + rng.randrange(0, 3)}}}"
    return "".join(random_regex(rng, depth + 1) for _ in range(rng.randrange(2, 4)))


def test_the_state_count_before_compiling_is_at_most_the_compiled_one():
    """On random regexes, the bounded count of the character-level DFA never exceeds the states of
    outlines-core's compiled automaton over the byte vocabulary (so refusing on it never refuses a grammar the
    exact check would accept), stops at limit + 1, and is 2^(n+1) on (a|b)*a(a|b){n} (the DFA must remember the
    last n+1 characters; outlines-core's has 2^(n+2), reporting matches a byte late)."""
    from outlines_core import Index, Vocabulary

    from mlsys_nb.inference.structured import dfa_states

    vocab = Vocabulary(256, {bytes([i]): [i] for i in range(256)})
    rng, counted = random.Random(1), 0
    for _ in range(80):
        rx = random_regex(rng)
        est = dfa_states(rx, 10**6)
        if est is None:  # an alternation of more than single characters: left to the exact check
            assert "|" in rx, rx
            continue
        counted += 1
        exact = len(Index(rx, vocab).get_transitions())
        assert 1 <= est <= exact, (rx, est, exact)
        if est > 1:
            assert dfa_states(rx, est - 1) == est  # stops one past the limit
    assert counted >= 30, counted
    for n in range(2, 8):
        assert dfa_states(f"(a|b)*a(a|b){{{n}}}", 10**6) == 2 ** (n + 1)
    assert dfa_states("(a)\\1", 10) is None  # a back-reference: not modelled, only the exact check applies
    assert dfa_states("(x?|bxx1)", 10) is None  # leftmost-first priorities: outlines-core keeps 2 states
    assert dfa_states("(a?b?){1200}", 10**5) is None  # the count's own work is bounded (quadratic here)
    assert dfa_states("a{4000}", 10**5) == 4001 and dfa_states("a{6000}", 10**5) is None  # max_nfa


def test_too_many_grammar_states_are_refused_before_compiling(monkeypatch):
    """(a|b)*a(a|b){16} (262,144 states compiled; minutes on a busy CPU) with max_states=1000: refused by the
    bounded count, naming the limit, without outlines-core ever building the automaton."""
    import outlines_core

    from mlsys_nb.inference.structured import Grammar, GrammarError

    def never(*a, **k):
        raise AssertionError("the automaton was built: the limit was checked after compiling")

    monkeypatch.setattr(outlines_core, "Index", never)
    with pytest.raises(GrammarError, match="max_grammar_states=1000"):
        Grammar.compile(regex="(a|b)*a(a|b){16}", max_states=1000)
