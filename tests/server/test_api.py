"""The OpenAI-compatible server over real HTTP on 127.0.0.1, driven by the official client.

A tiny random model serves (its text is noise, which is good: it exercises odd bytes and
broken UTF-8); the reference is the library itself (`LLM.generate`) on a second engine
over the same weights. Greedy outputs must be identical, alone and under concurrency.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.server import BackgroundServer, RequestDefaults, ServerConfig, create_app
from selfspec.server.cli import load_llm
from selfspec.spec.ssr import SSRConfig
from selfspec.thinking.policy import ThinkingLimits

MODEL = "tiny"
PROMPTS = [
    "What is the capital of France?",
    "Add 12 and 30.",
    "Write a function that adds two numbers.",
    "Hello, world!",
    "Find the shortest route from A to C.",
    "Records: name=Alice, age=30.",
    "Say something.",
    "Count from 0 to 9.",
]


@pytest.fixture(scope="module")
def served():
    return load_llm(MODEL, num_slots=8, max_len=512)


@pytest.fixture(scope="module")
def library(served):
    """The reference: the same weights and tokenizer on an engine of its own."""
    return LLM.from_model(
        served.model, served.tokenizer, engine_config=EngineConfig(num_slots=8, max_len=512), name=MODEL
    )


def start(llm, **config) -> BackgroundServer:
    return BackgroundServer(create_app(llm, ServerConfig(served_model_names=[MODEL], **config))).start()


@pytest.fixture(scope="module")
def server(served):
    srv = start(served)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def expected_split(ref, tokenizer) -> tuple[str, str]:
    """The library's output, split as the server presents it: CoT (closed by the cap, so
    `cot_tokens` sampled tokens) stripped, answer without its leading blank line."""
    cot = ref.token_ids[: ref.metrics["cot_tokens"]]
    reasoning = tokenizer.decode(cot, skip_special_tokens=True).strip()
    return reasoning, tokenizer.decode(ref.answer_token_ids, skip_special_tokens=True).lstrip()


def metric(server, name: str, labels: str = "") -> float:
    body = httpx.get(server.url + "/metrics").text
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    match = re.search(pattern, body)
    return float(match.group(1)) if match else 0.0


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# ---------------------------------------------------------------------- outputs
def test_chat_greedy_equals_library(client, library):
    for i, prompt in enumerate(PROMPTS[:3]):
        max_tokens = 20 + 7 * i
        (ref,) = library.generate(chat(prompt), SamplingParams(max_tokens=max_tokens), thinking=False)
        out = client.chat.completions.create(
            model=MODEL, messages=chat(prompt), max_tokens=max_tokens, extra_body={"selfspec": {"thinking": False}}
        )
        choice = out.choices[0]
        assert choice.message.content == ref.text
        assert choice.finish_reason == ref.finish_reason
        assert out.usage.prompt_tokens == len(ref.prompt_token_ids)
        assert out.usage.completion_tokens == len(ref.token_ids)
        assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens


def test_eight_concurrent_clients_equal_library(client, library):
    """Requests batched together by the server give what each gives alone in the library."""
    jobs = [(prompt, 24 + 5 * i, i % 2 == 1) for i, prompt in enumerate(PROMPTS)]
    refs = [library.generate(chat(p), SamplingParams(max_tokens=n), thinking=False)[0] for p, n, _ in jobs]
    barrier = threading.Barrier(len(jobs))

    def run(job):
        prompt, max_tokens, streamed = job
        barrier.wait()
        kwargs = dict(
            model=MODEL, messages=chat(prompt), max_tokens=max_tokens, extra_body={"selfspec": {"thinking": False}}
        )
        if not streamed:
            return client.chat.completions.create(**kwargs).choices[0].message.content
        parts = []
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts)

    with ThreadPoolExecutor(len(jobs)) as pool:
        texts = list(pool.map(run, jobs))
    assert texts == [r.text for r in refs]


def test_completion_equals_library(client, library, served):
    prompt = "The quick brown fox"
    ids = served.tokenizer.encode(prompt)
    (ref,) = library.generate(ids, SamplingParams(max_tokens=30), thinking=False)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=30)
    assert out.choices[0].text == ref.text
    assert out.usage.prompt_tokens == len(ids)
    # Token ids work as the prompt too.
    out_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=30)
    assert out_ids.choices[0].text == ref.text
    streamed = "".join(
        c.choices[0].text for c in client.completions.create(model=MODEL, prompt=prompt, max_tokens=30, stream=True)
    )
    assert streamed == ref.text


def test_reasoning_split_matches_library(client, library):
    """A thinking request: CoT in reasoning_content, answer in content, markers in neither."""
    limits = ThinkingLimits(cot_cap=12, answer_cap=20)
    (ref,) = library.generate(chat(PROMPTS[1]), SamplingParams(max_tokens=64), limits=limits, thinking=True)
    assert ref.metrics["thinking_closed_by"] == "cap"
    out = client.chat.completions.create(
        model=MODEL,
        messages=chat(PROMPTS[1]),
        max_tokens=64,
        extra_body={"selfspec": {"thinking": True, "cot_cap": 12, "answer_cap": 20}},
    )
    message = out.choices[0].message
    assert (message.reasoning_content, message.content) == expected_split(ref, library.tokenizer)
    assert message.content == ref.answer_text.lstrip()
    usage = out.usage.selfspec
    assert usage["cot_tokens"] == 12 and usage["answer_tokens"] == ref.metrics["answer_tokens"]
    assert out.usage.completion_tokens_details.reasoning_tokens == 12
    assert (
        usage["first_answer_token_s"] is not None
        and usage["ttft_s"] <= usage["first_answer_token_s"] <= usage["total_s"]
    )


def test_streaming_equals_non_streaming(client):
    body = dict(
        model=MODEL,
        messages=chat(PROMPTS[4]),
        max_tokens=60,
        extra_body={"selfspec": {"thinking": True, "cot_cap": 15}},
    )
    whole = client.chat.completions.create(**body)
    reasoning, content, finish, usage, roles = [], [], None, None, []
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body):
        if chunk.usage is not None:
            usage = chunk.usage
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        roles.append(delta.role)
        reasoning.append(getattr(delta, "reasoning_content", None) or "")
        content.append(delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    assert roles[0] == "assistant"
    assert "".join(reasoning) == whole.choices[0].message.reasoning_content
    assert "".join(content) == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.selfspec["cot_tokens"] == whole.usage.selfspec["cot_tokens"] == 15


def test_stop_string_trims_like_library(client, library):
    (plain,) = library.generate(chat(PROMPTS[3]), SamplingParams(max_tokens=40), thinking=False)
    stop = next(
        plain.text[i : i + 2]
        for i in range(5, len(plain.text) - 2)
        if plain.text[i : i + 2].strip() and "\ufffd" not in plain.text[i : i + 2]
    )
    (ref,) = library.generate(chat(PROMPTS[3]), SamplingParams(max_tokens=40, stop=[stop]), thinking=False)
    assert ref.finish_detail == "stop string"
    out = client.chat.completions.create(
        model=MODEL, messages=chat(PROMPTS[3]), max_tokens=40, stop=[stop], extra_body={"selfspec": {"thinking": False}}
    )
    assert out.choices[0].message.content == ref.text
    assert stop not in out.choices[0].message.content
    assert out.choices[0].finish_reason == "stop"


# ---------------------------------------------------------------------- SSR options
def test_ssr_options_are_exact_and_reported(client, library):
    """Per-request SSR through extra_body: same tokens as plain greedy, drafts reported."""
    limits = ThinkingLimits(cot_cap=16, answer_cap=24)
    params = SamplingParams(max_tokens=64)
    (plain,) = library.generate(chat(PROMPTS[0]), params, limits=limits, thinking=True)
    ssr = SSRConfig(draft_budgets=[6, 10], max_draft_len=30)
    (lib_ssr,) = library.generate(chat(PROMPTS[0]), params, spec=ssr, limits=limits)
    out = client.chat.completions.create(
        model=MODEL,
        messages=chat(PROMPTS[0]),
        max_tokens=64,
        extra_body={
            "selfspec": {"ssr": {"draft_budgets": [6, 10], "max_draft_len": 30}, "cot_cap": 16, "answer_cap": 24}
        },
    )
    usage = out.usage.selfspec
    assert usage["mode"] == "ssr" and usage["lossy"] is False
    assert usage["drafts"] == 2  # forked at CoT 6 and 10
    for key in (
        "drafts",
        "draft_tokens",
        "accepted_prefix",
        "suffix_accepted_tokens",
        "accepted_tokens",
        "proposed_tokens",
    ):
        assert usage[key] == lib_ssr.metrics[key], key
    assert usage["draft_tokens"] > 0
    assert out.usage.completion_tokens == len(plain.token_ids)
    message = out.choices[0].message
    assert (message.reasoning_content, message.content) == expected_split(plain, library.tokenizer)
    for key in ("accepted_prefix", "suffix_accepted_tokens", "accepted_tokens", "proposed_tokens", "ttft_s", "total_s"):
        assert key in usage


def test_speculation_and_top_level_keys(client, library):
    (plain,) = library.generate(chat(PROMPTS[2]), SamplingParams(max_tokens=40), thinking=False)
    out = client.chat.completions.create(
        model=MODEL,
        messages=chat(PROMPTS[2]),
        max_tokens=40,
        extra_body={"speculation": {"method": "ngram"}, "thinking": False},  # top-level selfspec keys
    )
    assert out.usage.selfspec["mode"] == "ngram"
    assert out.choices[0].message.content == plain.text
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL,
            messages=chat("x"),
            max_tokens=4,
            extra_body={"thinking": False, "selfspec": {"thinking": True}},
        )
    assert "thinking" in str(err.value)


def test_invalid_ssr_option_names_the_field(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=chat("x"), max_tokens=4, extra_body={"selfspec": {"ssr": {"reuse": "maybe"}}}
        )
    assert err.value.body["param"] == "selfspec.ssr.reuse"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=chat("x"), max_tokens=4, extra_body={"selfspec": {"ssr": {"draft_budget": [5]}}}
        )
    assert err.value.body["param"] == "selfspec.ssr.draft_budget"


def test_server_default_ssr_and_per_request_override(served, library):
    defaults = RequestDefaults(ssr=SSRConfig(draft_budgets=[8], max_draft_len=20), cot_cap=14, answer_cap=16)
    srv = start(served, defaults=defaults)
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        by_default = c.chat.completions.create(model=MODEL, messages=chat(PROMPTS[5]), max_tokens=60)
        assert by_default.usage.selfspec["mode"] == "ssr"
        assert by_default.usage.selfspec["drafts"] == 1
        assert by_default.usage.selfspec["cot_tokens"] == 14
        off = c.chat.completions.create(
            model=MODEL, messages=chat(PROMPTS[5]), max_tokens=60, extra_body={"selfspec": {"ssr": False}}
        )
        assert off.usage.selfspec["mode"] == "plain" and off.usage.selfspec["drafts"] == 0
        merged = c.chat.completions.create(
            model=MODEL,
            messages=chat(PROMPTS[5]),
            max_tokens=60,
            extra_body={"selfspec": {"ssr": {"draft_budgets": [4]}}},
        )
        assert merged.usage.selfspec["drafts"] == 1
        # Every variant says the same thing, the library's plain greedy answer.
        (plain,) = library.generate(
            chat(PROMPTS[5]),
            SamplingParams(max_tokens=60),
            limits=ThinkingLimits(cot_cap=14, answer_cap=16),
            thinking=True,
        )
        for out in (by_default, off, merged):
            assert out.choices[0].message.content == plain.answer_text.lstrip()
    finally:
        srv.stop()


# ---------------------------------------------------------------------- service behaviour
def test_models_health_and_metrics(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    client.chat.completions.create(
        model=MODEL, messages=chat("hi"), max_tokens=5, extra_body={"selfspec": {"thinking": True, "cot_cap": 2}}
    )
    body = httpx.get(server.url + "/metrics").text
    for name in (
        "selfspec_requests_total",
        "selfspec_generation_tokens_total",
        "selfspec_e2e_request_latency_seconds_bucket",
        "selfspec_time_to_first_token_seconds_bucket",
        "selfspec_time_to_first_answer_token_seconds_bucket",
        "selfspec_spec_accepted_tokens_total",
        "selfspec_queue_depth",
        "selfspec_slots_in_use",
    ):
        assert name in body, name
    assert metric(server, "selfspec_requests_total", 'code="200",endpoint="/v1/chat/completions"') >= 1


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=chat("hi"), max_tokens=5)
    assert err.value.body["param"] == "model"


def test_prompt_over_the_context_is_400(client):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=chat("word " * 2000), max_tokens=5)
    assert err.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=chat("hi"), max_tokens=10**9)
    assert err.value.body["param"] == "max_tokens"


def test_api_key(served):
    srv = start(served, api_key="s3cret")
    try:
        bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model=MODEL, messages=chat("hi"), max_tokens=3)
        wrong_scheme = {"Authorization": "Basic s3cret"}
        assert (
            httpx.post(
                srv.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}, headers=wrong_scheme
            ).status_code
            == 401
        )
        assert httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "hi"}).status_code == 401
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model=MODEL, messages=chat("hi"), max_tokens=3).usage.completion_tokens >= 1
        assert httpx.get(srv.url + "/health").status_code == 200
    finally:
        srv.stop()


def long_request(url: str, **extra) -> httpx.Response:
    body = {"model": MODEL, "prompt": "Count from 0 to 9.", "max_tokens": 400, "ignore_eos": True, **extra}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def test_full_queue_gets_429_with_retry_after(served):
    """1 slot + 1 waiting place: of 6 simultaneous long requests, 4 are refused at once."""
    llm = load_llm(MODEL, num_slots=1, max_len=512)
    srv = start(llm, max_queue=1)
    try:
        barrier = threading.Barrier(6)

        def send(_):
            barrier.wait()
            return long_request(srv.url)

        with ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(send, range(6)))
        codes = sorted(r.status_code for r in responses)
        assert codes == [200, 200, 429, 429, 429, 429]
        refused = [r for r in responses if r.status_code == 429]
        assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
        assert refused[0].json()["error"]["code"] == "queue_full"
        assert metric(srv, "selfspec_requests_rejected_queue_full_total") == 4
    finally:
        srv.stop()


def test_disconnect_mid_stream_frees_slots(server, client):
    before = metric(server, "selfspec_requests_aborted_total", 'reason="client disconnected"')
    body = {"model": MODEL, "prompt": "Count.", "max_tokens": 480, "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            seen = 0
            for line in lines:
                if line.startswith("data: "):
                    seen += 1
                if seen == 3:
                    break
            assert metric(server, "selfspec_slots_in_use") >= 1
        # leaving the block closes the connection mid-stream
    assert wait_for(
        lambda: metric(server, "selfspec_requests_aborted_total", 'reason="client disconnected"') == before + 1
    )
    assert wait_for(lambda: metric(server, "selfspec_slots_in_use") == 0)
    assert metric(server, "selfspec_requests_in_flight") == 0


def test_disconnect_while_waiting_non_streaming(server):
    before = metric(server, "selfspec_requests_aborted_total", 'reason="client disconnected"')
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/v1/completions",
            json={"model": MODEL, "prompt": "Count.", "max_tokens": 480, "ignore_eos": True},
            timeout=httpx.Timeout(5.0, read=0.05),
        )
    assert wait_for(
        lambda: metric(server, "selfspec_requests_aborted_total", 'reason="client disconnected"') == before + 1
    )
    assert wait_for(lambda: metric(server, "selfspec_slots_in_use") == 0)


def test_request_timeout(server):
    before = metric(server, "selfspec_requests_aborted_total", 'reason="timeout"')
    response = long_request(server.url, max_tokens=480, selfspec={"timeout_s": 0.05})
    assert response.status_code == 408
    assert response.json()["error"]["code"] == "timeout"
    assert wait_for(lambda: metric(server, "selfspec_requests_aborted_total", 'reason="timeout"') == before + 1)
    assert wait_for(lambda: metric(server, "selfspec_slots_in_use") == 0)
    # A streamed request that times out ends with an error event and [DONE].
    text = long_request(server.url, max_tokens=480, stream=True, selfspec={"timeout_s": 0.1}).text
    assert '"code": "timeout"' in text and text.rstrip().endswith("data: [DONE]")
    assert wait_for(lambda: metric(server, "selfspec_slots_in_use") == 0)


def test_a_failing_engine_step_fails_its_requests_not_the_server():
    """A server-side fault is a 500 for the requests it hit; the loop carries on."""
    llm = load_llm(MODEL, num_slots=2, max_len=512)
    real_step = llm.engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected fault")
        return real_step()

    llm.engine.step = flaky_step
    srv = start(llm)
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError):
            c.completions.create(model=MODEL, prompt="Hello", max_tokens=10, extra_body={"ignore_eos": True})
        assert wait_for(lambda: metric(srv, "selfspec_slots_in_use") == 0)
        after = c.completions.create(model=MODEL, prompt="Hello", max_tokens=10, extra_body={"ignore_eos": True})
        assert after.usage.completion_tokens == 10
        assert httpx.get(srv.url + "/health").json()["status"] == "ok"
    finally:
        srv.stop()
