"""Our OpenAI server over the vLLM backend (`selfspec serve --backend vllm`), over real HTTP.

The reference is vLLM without SSR (a `VLLMEngine` without a speculative config) on the same
bigram model: greedy text must be identical, with SSR and without, concurrent and streamed.
Client errors must be the very responses our own backend gives (same status and body), and a
feature the vLLM path does not run is a 400 naming it. /metrics counts the SSR metrics each
response reports.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from selfspec.engine.sampling import SamplingParams  # noqa: E402
from selfspec.integrations.vllm.engine import VLLMEngine  # noqa: E402
from selfspec.integrations.vllm.serving import VLLMBackend  # noqa: E402
from selfspec.server import BackgroundServer, ServerConfig, create_app  # noqa: E402
from selfspec.server.cli import load_llm  # noqa: E402
from selfspec.thinking.policy import ThinkingLimits  # noqa: E402

from .test_vllm_ssr import ENGINE_ARGS, PROMPTS, _save  # noqa: E402

MODEL = "tiny"
COT_CAP, ANSWER_CAP = 20, 24
SSR = {"draft_budgets": [8], "max_draft_len": 24}
CAPS = {"cot_cap": COT_CAP, "answer_cap": ANSWER_CAP}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(_save(tmp_path_factory.mktemp("bigram"), "bigram"))


@pytest.fixture(scope="module")
def plain_vllm(model_dir):
    """The reference: vLLM without a speculative config."""
    engine = VLLMEngine(model_dir, speculation=False, **ENGINE_ARGS)
    yield engine
    del engine


@pytest.fixture(scope="module")
def backend(model_dir):
    return VLLMBackend.load(model_dir, name=MODEL, num_speculative_tokens=8, **ENGINE_ARGS)


@pytest.fixture(scope="module")
def server(backend):
    srv = BackgroundServer(create_app(backend, ServerConfig(served_model_names=[MODEL]))).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def our_server():
    """Our own backend on a tiny model of the same tokenizer and context (512 tokens)."""
    srv = BackgroundServer(
        create_app(load_llm("tiny", num_slots=4, max_len=512), ServerConfig(served_model_names=[MODEL]))
    )
    srv.start()
    yield srv
    srv.stop()


def post(server, body, path: str = "/v1/completions", **kwargs) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120, **kwargs)


def metrics(server) -> dict[str, float]:
    """Every sample of /metrics by name (labels ignored: summed)."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics").text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


# ---------------------------------------------------------------------- outputs
@pytest.mark.parametrize("ssr", [True, False], ids=["ssr", "plain"])
def test_greedy_text_equals_vllm_without_ssr(server, plain_vllm, ssr):
    """Eight concurrent completions (the chat-templated prompt as token ids) give vLLM's own text."""
    prompts = [plain_vllm.encode_prompt(p, thinking=True) for p in PROMPTS]
    expected = plain_vllm.generate(
        prompts, SamplingParams(max_tokens=200), limits=ThinkingLimits(**CAPS), thinking=True
    )
    options = {**CAPS, "thinking": True, **({"ssr": SSR} if ssr else {})}

    def complete(prompt):
        response = post(server, {"model": MODEL, "prompt": prompt, "max_tokens": 200, "selfspec": options})
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(complete, prompts))
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g["choices"][0]["text"] == e.text, f"prompt {i}"
        usage = g["usage"]
        assert usage["completion_tokens"] == len(e.token_ids)
        assert usage["selfspec"]["mode"] == ("ssr" if ssr else "plain")
        assert usage["selfspec"]["cot_tokens"] == e.metrics["cot_tokens"]
        assert (usage["selfspec"]["drafts"] >= 1) == ssr
    if ssr:
        assert sum(g["usage"]["selfspec"]["accepted_prefix"] for g in got) > 0


def test_n_choices_are_each_vllms_greedy_text(server, plain_vllm, backend):
    """n > 1 runs n driver requests of one job: under greedy every choice is vLLM's own text, each
    with its own SSR metrics, and none of them is left behind in the engine."""
    prompt = plain_vllm.encode_prompt(PROMPTS[0], thinking=True)
    (expected,) = plain_vllm.generate(
        [prompt], SamplingParams(max_tokens=200), limits=ThinkingLimits(**CAPS), thinking=True
    )
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "n": 3, "selfspec": {**CAPS, "ssr": SSR}}
    response = post(server, body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert all(c["text"] == expected.text for c in choices)
    assert response.json()["usage"]["completion_tokens"] == 3 * len(expected.token_ids)
    assert backend.engine.num_vllm_requests == 0 and not backend._choices


def test_logprobs_with_ssr_are_plain_vllms(server, plain_vllm):
    """logprobs come from vLLM's raw model output for every token the parent kept: with SSR (tokens
    verified from drafts) the same tokens, values and alternatives as vLLM decoding one at a time."""
    prompt = plain_vllm.encode_prompt(PROMPTS[1], thinking=True)
    params = SamplingParams(max_tokens=200, logprobs=3)
    (expected,) = plain_vllm.generate([prompt], params, limits=ThinkingLimits(**CAPS), thinking=True)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "logprobs": 3, "selfspec": {**CAPS, "ssr": SSR}}
    response = post(server, body)
    assert response.status_code == 200, response.text
    got = response.json()["choices"][0]["logprobs"]
    assert response.json()["usage"]["selfspec"]["accepted_prefix"] > 0
    want = [e for e in expected.logprobs if e is not None]
    assert len(got["token_logprobs"]) == len(want) > 0
    tok = plain_vllm.tokenizer
    for i, (lp, top, e) in enumerate(zip(got["token_logprobs"], got["top_logprobs"], want)):
        assert lp == pytest.approx(e.logprob, abs=1e-4), i
        assert len(e.top) == 3  # the wire format keys alternatives by text: byte pieces may share one
        assert top == pytest.approx({tok.decode([t]): v for t, v in e.top}, abs=1e-4), i


def test_chat_and_stream_split_reasoning_like_vllm(server, plain_vllm):
    """Chat: reasoning and answer from vLLM's tokens; the stream's deltas add up to the same."""
    (ref,) = plain_vllm.generate(
        [[{"role": "user", "content": PROMPTS[0]}]],
        SamplingParams(max_tokens=200),
        limits=ThinkingLimits(**CAPS),
        thinking=True,
    )
    tok = plain_vllm.tokenizer
    reasoning = tok.decode(ref.token_ids[: ref.metrics["cot_tokens"]], skip_special_tokens=True).strip()
    answer = tok.decode(ref.answer_token_ids, skip_special_tokens=True).lstrip()
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "max_tokens": 200,
        "selfspec": {**CAPS, "ssr": SSR},
    }
    message = post(server, body, "/v1/chat/completions").json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (reasoning, answer)
    stream = post(server, {**body, "stream": True, "stream_options": {"include_usage": True}}, "/v1/chat/completions")
    events = [json.loads(line[6:]) for line in stream.text.splitlines() if line.startswith("data: {")]
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == reasoning
    assert "".join(d.get("content") or "" for d in deltas) == answer
    assert len([d for d in deltas if d.get("content")]) > 1, "the answer came in one piece: not streamed"
    assert events[-1]["usage"]["selfspec"]["mode"] == "ssr" and stream.text.rstrip().endswith("[DONE]")


# ---------------------------------------------------------------------- errors
TOO_LONG = list(range(10, 410)) * 2  # 800 token ids: more than the 512-token context

CLIENT_ERRORS = {
    "malformed JSON": b'{"model": "tiny", "prompt": "hi", ',
    "not an object": b"[1, 2]",
    "unknown field": {"model": MODEL, "prompt": "hi", "max_token": 5},
    "temperature < 0": {"model": MODEL, "prompt": "hi", "temperature": -1.0},
    "top_p 0": {"model": MODEL, "prompt": "hi", "top_p": 0.0},
    "max_tokens 0": {"model": MODEL, "prompt": "hi", "max_tokens": 0},
    "prompt over the context": {"model": MODEL, "prompt": TOO_LONG, "max_tokens": 5},
    "max_tokens over the room": {"model": MODEL, "prompt": "hi", "max_tokens": 100_000},
    "token id outside the vocabulary": {"model": MODEL, "prompt": [1, 10**6]},
    "empty prompt": {"model": MODEL, "prompt": ""},
    "bad SSR option": {"model": MODEL, "prompt": "hi", "selfspec": {"ssr": {"reuse": "everything"}}},
    "bad cot_cap": {"model": MODEL, "prompt": "hi", "selfspec": {"fixed_length": True}},
    "unknown model": {"model": "gpt-4o", "prompt": "hi"},
    "chat: unknown role": {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]},
    "chat: too long": {"model": MODEL, "messages": [{"role": "user", "content": "word " * 2000}], "max_tokens": 5},
}


@pytest.mark.parametrize("case", list(CLIENT_ERRORS))
def test_client_errors_are_our_backends(server, our_server, case):
    body = CLIENT_ERRORS[case]
    path = "/v1/chat/completions" if case.startswith("chat") else "/v1/completions"

    def send(srv) -> httpx.Response:
        if isinstance(body, bytes):
            return httpx.post(srv.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=60)
        return post(srv, body, path)

    ours, theirs = send(our_server), send(server)
    assert 400 <= ours.status_code < 500, ours.text
    assert (theirs.status_code, theirs.json()) == (ours.status_code, ours.json())


UNSUPPORTED = {
    "selfspec.cospec": {"selfspec": {"cospec": True}},
    "selfspec.speculation": {"selfspec": {"speculation": {"method": "suffix"}}},
    "selfspec.ssr.use_draft_probs": {"selfspec": {"ssr": {"use_draft_probs": True}}},
    "selfspec.ssr.speculate_thinking": {"selfspec": {"ssr": {"speculate_thinking": True}}},
    "selfspec.ssr.suffix_sources": {"selfspec": {"ssr": {"suffix_sources": ["draft", "global"]}}},
    "response_format": {"response_format": {"type": "json_object"}},
    "selfspec.regex": {"selfspec": {"regex": "[a-z]+"}},
    "min_tokens": {"min_tokens": 3},
    "min_p": {"min_p": 0.1},
}


@pytest.mark.parametrize("param", list(UNSUPPORTED))
def test_unsupported_features_are_400_naming_them(server, param):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, **UNSUPPORTED[param]}
    response = post(server, body, "/v1/chat/completions")
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == "unsupported_feature"
    assert "vllm backend" in error["message"]


def test_sampling_is_refused_where_vllm_verifies_it_wrong(server, backend):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 5, "temperature": 0.7}
    response = post(server, body)
    if "temperature" not in backend.engine.sampler_issues:
        assert response.status_code == 200, response.text
        return
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "temperature"
    assert "expand" in response.json()["error"]["message"]


# ---------------------------------------------------------------------- metrics
def test_metrics_count_each_responses_ssr_metrics(server):
    before = metrics(server)
    usages = []
    for reuse in ("prefix", "suffix"):
        body = {
            "model": MODEL,
            "prompt": "hello",
            "max_tokens": 200,
            "selfspec": {**CAPS, "ssr": {**SSR, "reuse": reuse}},
        }
        usages.append(post(server, body).json()["usage"]["selfspec"])
    after = metrics(server)
    for name, key in (
        ("selfspec_ssr_drafts_total", "drafts"),
        ("selfspec_ssr_accepted_prefix_tokens_total", "accepted_prefix"),
        ("selfspec_ssr_suffix_accepted_tokens_total", "suffix_accepted_tokens"),
        ("selfspec_spec_accepted_tokens_total", "accepted_tokens"),
        ("selfspec_spec_proposed_tokens_total", "proposed_tokens"),
    ):
        total = sum(u[key] for u in usages)
        assert after.get(name, 0) - before.get(name, 0) == total, name
        assert total > 0, f"{key}: nothing to count"
    assert usages[0]["accepted_prefix"] > 0 and usages[1]["suffix_accepted_tokens"] > 0
    assert after["selfspec_slots_in_use"] == 0


def test_a_stream_abandoned_mid_answer_frees_its_requests(server, backend):
    body = {
        "model": MODEL,
        "prompt": "hello",
        "max_tokens": 400,
        "ignore_eos": True,
        "stream": True,
        "selfspec": {"ssr": SSR, "cot_cap": 300},
    }
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        for i, _ in enumerate(response.iter_lines()):
            if i > 8:
                break
    deadline = time.monotonic() + 10
    while backend.engine.num_vllm_requests and time.monotonic() < deadline:
        time.sleep(0.05)
    assert backend.engine.num_vllm_requests == 0
    assert metrics(server)["selfspec_requests_aborted_total"] >= 1


def test_tools_are_rendered_by_the_template(server, plain_vllm):
    """`tools` with tool_choice auto: the prompt holds them (as vLLM's own prompt of the same messages)."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "add 2 and 3"}]
    body = {"model": MODEL, "messages": messages, "tools": tools, "max_tokens": 8, "selfspec": {"thinking": False}}
    response = post(server, body, "/v1/chat/completions")
    assert response.status_code == 200, response.text
    expected = plain_vllm.encode_prompt(messages, thinking=False, tools=tools)
    assert response.json()["usage"]["prompt_tokens"] == len(expected) > len(plain_vllm.encode_prompt(messages, False))
