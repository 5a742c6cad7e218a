"""The OpenAI-compatible server, started as a real uvicorn process on a free loopback port and driven by
the official ``openai`` client: concurrency, streaming deltas, OpenAI-style errors, disconnects."""

import concurrent.futures as cf
import time

import httpx
import pytest

from serve_helpers import serve_process

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server[0]  # shared with tests/test_server_robust.py (conftest)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", timeout=120, max_retries=0)


def metrics(url) -> dict:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {
        line.split()[0].removeprefix("mlsys_nb_"): float(line.split()[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server + "/health", timeout=10).status_code == 200
    m = metrics(server)
    assert {"num_requests_running", "num_requests_waiting", "kv_blocks_used", "generation_tokens_per_second"} <= set(m)


def test_32_concurrent_requests_stream_equals_non_stream(server, client):
    from mlsys_nb.inference import LLM, SamplingParams

    prompts = [f"request {i}: " + "abc" * (i % 5) for i in range(32)]
    kw = {"model": "tiny", "max_tokens": 24, "temperature": 0, "extra_body": {"ignore_eos": True}}

    def plain(p):
        return client.completions.create(prompt=p, **kw)

    def streamed(p):
        chunks = list(client.completions.create(prompt=p, stream=True, **kw))
        return "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason

    with cf.ThreadPoolExecutor(32) as pool:
        futures = [pool.submit(plain, p) for p in prompts] + [pool.submit(streamed, p) for p in prompts]
        results = [f.result(timeout=300) for f in futures]
    plain_out, stream_out = results[:32], results[32:]
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs: the same reduction order, bit-identical logits
    try:
        offline = LLM("tiny", seed=0).generate(
            prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False
        )
    finally:
        torch.set_num_threads(threads)
    for p, r, (text, finish), o in zip(prompts, plain_out, stream_out, offline):
        assert r.choices[0].text == o.outputs[0].text, "the server must answer what the offline engine computes"
        assert text == r.choices[0].text, "streamed deltas must concatenate to the non-streamed text"
        assert finish == r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 24 and r.usage.prompt_tokens == len(p.encode())
    assert metrics(server)["num_requests_running"] == 0


def test_chat_completions(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    r = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0, seed=1)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    chunks = list(
        client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=0, stream=True)
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == r.choices[0].message.content
    s1 = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=1.0, seed=3)
    s2 = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=12, temperature=1.0, seed=3)
    assert s1.choices[0].message.content == s2.choices[0].message.content, "seeded sampling is reproducible"
    r = client.completions.create(
        model="tiny",
        prompt="hi",
        n=2,
        max_tokens=4,
        temperature=1.0,
        seed=0,
        logprobs=0,
        extra_body={"ignore_eos": True},
    )
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 8
    assert len(r.choices[0].logprobs.token_logprobs) == 4 and all(x <= 0 for x in r.choices[0].logprobs.token_logprobs)


def test_openai_style_errors(server, client):
    r = httpx.post(
        server + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"}, timeout=10
    )
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.post(server + "/v1/completions", json={"model": "tiny", "prompt": "x", "temperature": -1}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="hi")
    assert e.value.status_code == 404 and "gpt-4" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x" * 500)
    assert "too long" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[])
    assert client.completions.create(model="tiny", prompt="still serving", max_tokens=3).usage.completion_tokens >= 1


def test_disconnect_mid_stream_frees_blocks(server):
    before = metrics(server)
    body = {
        "model": "tiny",
        "prompt": "a long story",
        "max_tokens": 110,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "n": 4,
    }
    with httpx.stream("POST", server + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # the first token arrived: it is running
        assert metrics(server)["kv_blocks_used"] > 0
    deadline = time.monotonic() + 30
    while (m := metrics(server))["kv_blocks_used"] > 0 or m["num_requests_running"] > 0:
        assert time.monotonic() < deadline, f"blocks not freed after the client went away: {m}"
        time.sleep(0.1)
    assert m["requests_aborted_total"] == before["requests_aborted_total"] + 1


def test_response_format_json_schema(client):
    import json

    import jsonschema

    schema = {
        "type": "object",
        "required": ["city", "n"],
        "properties": {"city": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    for seed in range(2):
        r = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "a city?"}],
            max_tokens=40,
            temperature=1.5,
            seed=seed,
            response_format=fmt,
        )
        jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError, match="json_schema"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=40, response_format=bad
        )
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=3, response_format=fmt
        )
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=40, response_format=fmt
    )  # the server still serves
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)


def test_metrics_histograms_parse_and_count_every_finished_request(server):
    """/metrics' latency histograms, read by prometheus_client's own parser (an independent reader of the
    text format): cumulative buckets, +Inf equal to the count, each count grows by one per finished request,
    and the server's TTFT <= its end-to-end latency <= the client's wall time (summed over the requests)."""
    from prometheus_client.parser import text_string_to_metric_families

    def histos():
        text = httpx.get(server + "/metrics", timeout=10).text
        out = {}
        for fam in text_string_to_metric_families(text):
            if fam.type == "histogram":
                b = {s.labels["le"]: s.value for s in fam.samples if s.name.endswith("_bucket")}
                c = next(s.value for s in fam.samples if s.name.endswith("_count"))
                t = next(s.value for s in fam.samples if s.name.endswith("_sum"))
                out[fam.name.removeprefix("mlsys_nb_")] = (b, c, t)
        return out

    before = histos()
    assert set(before) == {
        "request_queue_time_seconds",
        "time_to_first_token_seconds",
        "time_per_output_token_seconds",
        "e2e_request_latency_seconds",
    }
    walls = []
    for i in range(3):
        t0 = time.perf_counter()
        r = httpx.post(
            server + "/v1/completions", json={"prompt": f"h{i}", "max_tokens": 4, "ignore_eos": True}, timeout=60
        )
        walls.append(time.perf_counter() - t0)
        assert r.status_code == 200
    after = histos()
    for name, (b, c, _) in after.items():
        counts = [v for _, v in sorted(((float(k), v) for k, v in b.items()))]
        assert counts == sorted(counts) and counts[-1] == c, name  # cumulative, +Inf holds them all
        assert c - before[name][1] == 3, name  # each finished request observed once
    ttft_sum = after["time_to_first_token_seconds"][2] - before["time_to_first_token_seconds"][2]
    e2e_sum = after["e2e_request_latency_seconds"][2] - before["e2e_request_latency_seconds"][2]
    assert 0 < ttft_sum <= e2e_sum <= sum(walls)


def test_speculative_server_from_the_cli_answers_what_the_plain_server_does(server, client):
    """``--speculative-model ngram --num-speculative-tokens 4`` on the real command line: concurrent greedy
    requests (streamed and not) get exactly the plain server's completions, and ``/metrics`` counts drafts and
    accepted draft tokens (a flag that never reached the engine leaves them out: the plain server has none)."""
    prompts = [f"spec {i}: " + "ab" * (i + 2) for i in range(6)]
    kw = {"model": "tiny", "max_tokens": 20, "temperature": 0, "extra_body": {"ignore_eos": True}}
    with serve_process("--speculative-model", "ngram", "--num-speculative-tokens", "4") as (spec_url, _):
        spec = openai.OpenAI(base_url=spec_url + "/v1", api_key="unused", timeout=120, max_retries=0)

        def both(p):
            plain = client.completions.create(prompt=p, **kw).choices[0].text
            done = spec.completions.create(prompt=p, **kw).choices[0].text
            streamed = "".join(c.choices[0].text for c in spec.completions.create(prompt=p, stream=True, **kw))
            return plain, done, streamed

        with cf.ThreadPoolExecutor(6) as pool:
            for plain, done, streamed in pool.map(both, prompts, timeout=300):
                assert done == streamed == plain, "speculation must not change greedy outputs"
        m = metrics(spec_url)
    assert m["spec_decode_num_drafts_total"] > 0 and m["spec_decode_num_draft_tokens_total"] > 0
    assert 0 < m["spec_decode_num_accepted_tokens_total"] <= m["spec_decode_num_draft_tokens_total"]
    assert not any(k.startswith("spec_decode") for k in metrics(server))
