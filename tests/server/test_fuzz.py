"""Hostile and malformed requests: never a 5xx, errors name the field, the server survives.

Over 200 requests: broken JSON and encodings, wrong types and out-of-range values for
every field, huge numbers, NaN, empty and unknown-role messages, prompts over the
context, invalid UTF-8, unknown models, bad SSR options, wrong methods and paths. They
are sent concurrently; afterwards the server must be healthy, with no slot leaked.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.server.cli import load_llm

MODEL = "tiny"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@dataclass
class Case:
    name: str
    path: str
    body: bytes | None
    method: str = "POST"
    expect_client_error: bool = True  # False: any status below 500 is fine (odd but valid)
    param: str | None = None  # the field the error must name
    headers: dict | None = None


def chat_body(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, **fields}


def completion_body(**fields) -> dict:
    return {"model": MODEL, "prompt": "Hello", "max_tokens": 4, **fields}


def js(obj) -> bytes:
    return json.dumps(obj, allow_nan=True).encode()


WRONG_VALUES = ["text", 1.5, -1, True, [], {}, [1, "a"], 10**30, -(10**30), None]

# field -> values that must be rejected (None allowed only where the field is optional)
FIELD_CASES: dict[str, list] = {
    "model": [1, [], {}, True, "", "x" * 600, None],
    "max_tokens": ["10", 1.5, 0, -1, True, 10**9, 10**30, [], {}],
    "max_completion_tokens": ["10", 0, -5, 10**12, 2.5],
    "temperature": ["hot", -0.5, -1e9, 1e309, [], True],
    "top_p": [0, -0.1, 1.5, "1", [], 1e309],
    "top_k": [-2, 1.5, "5", [], -(10**12)],
    "min_p": [-0.1, 1.1, "0", {}],
    "n": [0, 1000, -1, "1", 1.0],
    "stop": [1, [1, 2], [""], ["x" * 1000], ["s"] * 100, {}, [None]],
    "stop_token_ids": [[-1], [10**9], "1", [1.5], [[1]]],
    "stream": ["yes", 1, [], {}],
    "stream_options": ["on", 1, {"include_usage": "yes"}, {"bogus": True}],
    "seed": [2**64, -(2**64), "7", 1.5, []],
    "ignore_eos": ["true", 2, []],
    "min_tokens": [-1, 10, "1", 1.5],
    "logprobs": ["yes", 21, -1],
    "top_logprobs": [3, 21],
    "logit_bias": [{"1": 5.0}, "x", [1]],
    "presence_penalty": [2.5, "x"],
    "frequency_penalty": [-2.5],
    "repetition_penalty": [0, -1.0],
    "tools": [[{"type": "function"}], "x", [{"type": "function", "function": {"name": "bad name!"}}]],
    "response_format": [{"type": "json_schema"}, "json", {"type": "xml"}],
    "chat_template_kwargs": [{"enable_thinking": "yes"}, {"foo": 1}, "x"],
    "max_token": [10],  # a typo: unknown field
    "temprature": [0.5],
}

SELFSPEC_CASES: list = [
    "on",
    1,
    [],
    {"bogus": 1},
    {"ssr": "yes"},
    {"ssr": 1},
    {"ssr": {"bogus": 1}},
    {"ssr": {"draft_budgets": [-5]}},
    {"ssr": {"draft_budgets": []}},
    {"ssr": {"draft_budgets": "500"}},
    {"ssr": {"draft_interval": 0}},
    {"ssr": {"max_draft_len": 0}},
    {"ssr": {"reuse": "sometimes"}},
    {"ssr": {"suffix": {"max_depth": 1}}},
    {"ssr": {"suffix": {"min_token_prob": 2}}},
    {"ssr": {"suffix_sources": []}},
    {"ssr": {"suffix_sources": ["web"]}},
    {"ssr": {"max_drafts": -1}},
    {"speculation": {"method": "eagle"}},
    {"speculation": {"num_tokens": 0}},
    {"speculation": "suffix"},
    {"ssr": True, "speculation": True},
    {"thinking": "yes"},
    {"cot_cap": 0},
    {"cot_cap": -3},
    {"cot_cap": "10"},
    {"answer_cap": 0},
    {"answer_cap": 1.5},
    {"fixed_length": True},
    {"fixed_length": True, "cot_cap": 4},
    {"timeout_s": 0},
    {"timeout_s": -1},
    {"timeout_s": 1e12},
    {"timeout_s": "1"},
]

MESSAGES_CASES: list = [
    [],
    {},
    "hello",
    None,
    [{}],
    [{"role": "user"}],
    [{"role": "user", "content": ""}],
    [{"role": "user", "content": "   \n  "}],
    [{"role": "robot", "content": "hi"}],
    [{"role": "", "content": "hi"}],
    [{"role": None, "content": "hi"}],
    [{"role": 1, "content": "hi"}],
    [{"role": "user", "content": 5}],
    [{"role": "user", "content": {"text": "hi"}}],
    [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}],
    [{"role": "user", "content": [{"type": "text"}]}],
    [{"role": "user", "content": [{"text": "no type"}]}],
    [{"role": "user", "content": [1, 2]}],
    [{"role": "user", "content": "word " * 3000}],  # over the 512-token context
    [{"role": "user", "content": "hi"}] * 5000,  # more messages than allowed
    ["user: hi"],
    [[{"role": "user", "content": "hi"}]],
]

PROMPT_CASES: list = [
    "",
    "   ",
    [],
    [[]],
    [-1],
    [10**9],
    [1.5],
    ["a", "b"],
    [[1, 2], [3]],
    5,
    None,
    {"text": "hi"},
    "word " * 3000,
    list(range(1, 600)),  # ids over the context
    True,
]

RAW_BODIES: list[bytes] = [
    b"",
    b" ",
    b"{",
    b"}",
    b"[",
    b"null",
    b"true",
    b"1",
    b'"a string"',
    b"[]",
    b"{'model': 'tiny'}",
    b'{"model": }',
    b'{"model": "tiny",}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": Infinity}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": -Infinity}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}',
    b"\xff\xfe\x00{\x00}",
    b"\xef\xbb\xbf" + js(chat_body()),  # BOM before valid JSON
    js(chat_body()).decode().encode("utf-16"),
    b"\x00" * 64,
    b"[" * 50000 + b"]" * 50000,
    b'{"a":' * 5000 + b"1" + b"}" * 5000,
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e400}',
    b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 99999999999999999999999999999999999999}',
    b'{"model": "tiny", "model": 5}',
    b"model=tiny&prompt=hi",
]


def build_cases() -> list[Case]:
    cases: list[Case] = []
    for field, values in FIELD_CASES.items():
        for value in values:
            for path, body in ((CHAT, chat_body), (COMPLETIONS, completion_body)):
                chat_only = field in ("max_completion_tokens", "tools", "response_format", "chat_template_kwargs")
                if chat_only and path == COMPLETIONS:
                    continue
                fields = {field: value}
                if field in ("min_tokens",):
                    fields["max_tokens"] = 4
                cases.append(Case(f"{path} {field}={str(value)[:40]}", path, js(body(**fields)), param=field))
    for value in SELFSPEC_CASES:
        cases.append(Case(f"selfspec={str(value)[:60]}", CHAT, js(chat_body(selfspec=value))))
        cases.append(Case(f"completions selfspec={str(value)[:60]}", COMPLETIONS, js(completion_body(selfspec=value))))
    for value in MESSAGES_CASES:
        cases.append(Case(f"messages={str(value)[:60]}", CHAT, js(chat_body(messages=value)), param="messages"))
    for value in PROMPT_CASES:
        cases.append(Case(f"prompt={str(value)[:60]}", COMPLETIONS, js(completion_body(prompt=value)), param="prompt"))
    for raw in RAW_BODIES:
        cases.append(Case(f"raw {raw[:40]!r}", CHAT, raw))
        cases.append(Case(f"completions raw {raw[:40]!r}", COMPLETIONS, raw))
    cases += [
        Case("unknown model", CHAT, js(chat_body(model="gpt-4o")), param="model"),
        Case("unknown model (completions)", COMPLETIONS, js(completion_body(model="llama")), param="model"),
        Case("model with spaces", CHAT, js(chat_body(model=" tiny ")), param="model"),
        Case("missing model", CHAT, js({"messages": [{"role": "user", "content": "hi"}]}), param="model"),
        Case("missing messages", CHAT, js({"model": MODEL}), param="messages"),
        Case("missing prompt", COMPLETIONS, js({"model": MODEL}), param="prompt"),
        Case("echo", COMPLETIONS, js(completion_body(echo=True)), param="echo"),
        Case("best_of", COMPLETIONS, js(completion_body(best_of=3)), param="best_of"),
        Case("suffix", COMPLETIONS, js(completion_body(suffix="end")), param="suffix"),
        Case("body over the limit", CHAT, b'{"model": "tiny", "pad": "' + b"x" * (9 * 1024 * 1024) + b'"}'),
        Case("GET on a POST route", CHAT, None, method="GET"),
        Case("PUT on a POST route", COMPLETIONS, b"{}", method="PUT"),
        Case("POST to /v1/models", "/v1/models", b"{}"),
        Case("unknown path", "/v1/embeddings", js({"model": MODEL, "input": "x"})),
        Case("path traversal", "/v1/../../etc/passwd", None, method="GET"),
        # Only JSON bodies: a page may send form / text POSTs cross-site without a preflight.
        Case("form content type", CHAT, js(chat_body()), headers={"content-type": "application/x-www-form-urlencoded"}),
        Case("text content type", COMPLETIONS, js(completion_body()), headers={"content-type": "text/plain"}),
        Case(
            "bogus authorization",
            CHAT,
            js(chat_body()),
            headers={"authorization": "Bearer " + "x" * 10000},
            expect_client_error=False,
        ),
        # Odd but valid: must work (2xx) or be refused politely, never crash.
        Case(
            "control characters",
            CHAT,
            js(chat_body(messages=[{"role": "user", "content": "\x00\x01\x1b[31m\u202e\ufeff"}])),
            expect_client_error=False,
        ),
        Case(
            "emoji and CJK",
            CHAT,
            js(chat_body(messages=[{"role": "user", "content": "😀 中文 🇫🇷"}])),
            expect_client_error=False,
        ),
        Case("stop = whole alphabet", CHAT, js(chat_body(stop=list("abcdefghijklmnop"))), expect_client_error=False),
        Case(
            "stream with bad tail",
            CHAT,
            js(chat_body(stream=True, max_tokens=4, stop=["\ufffd"])),
            expect_client_error=False,
        ),
        Case("tool role", CHAT, js(chat_body(messages=[{"role": "tool", "content": "42"}])), expect_client_error=False),
        Case(
            "assistant first",
            CHAT,
            js(chat_body(messages=[{"role": "assistant", "content": "hi"}])),
            expect_client_error=False,
        ),
        Case(
            "sampled with seed",
            CHAT,
            js(chat_body(temperature=1.7, top_p=0.3, top_k=3, min_p=0.2, seed=-(2**63))),
            expect_client_error=False,
        ),
        Case("min_tokens = max_tokens", CHAT, js(chat_body(min_tokens=4, ignore_eos=True)), expect_client_error=False),
        Case("top_k -1 (vLLM off)", CHAT, js(chat_body(top_k=-1)), expect_client_error=False),
        Case(
            "ssr + thinking off",
            CHAT,
            js(chat_body(selfspec={"ssr": {"draft_budgets": [1]}, "thinking": False})),
            expect_client_error=False,
        ),
        Case(
            "ssr tiny budgets",
            CHAT,
            js(chat_body(max_tokens=40, selfspec={"ssr": {"draft_interval": 1}, "cot_cap": 6})),
            expect_client_error=False,
        ),
        Case(
            "fixed length",
            CHAT,
            js(chat_body(max_tokens=20, selfspec={"fixed_length": True, "cot_cap": 3, "answer_cap": 3})),
            expect_client_error=False,
        ),
        Case(
            "speculation suffix global",
            CHAT,
            js(chat_body(selfspec={"speculation": {"sources": ["global"]}})),
            expect_client_error=False,
        ),
        Case(
            "max_tokens = context room",
            COMPLETIONS,
            js(completion_body(prompt=[5], max_tokens=511)),
            expect_client_error=False,
        ),
        Case(
            "prompt fills the context",
            COMPLETIONS,
            js(completion_body(prompt=[5] * 511, max_tokens=1)),
            expect_client_error=False,
        ),
        Case("prompt one over", COMPLETIONS, js(completion_body(prompt=[5] * 512, max_tokens=1)), param="prompt"),
        Case(
            "special tokens in prompt",
            COMPLETIONS,
            js(completion_body(prompt="<|im_end|><think></think><pad>")),
            expect_client_error=False,
        ),
    ]
    return cases


@pytest.fixture(scope="module")
def server():
    srv = BackgroundServer(
        create_app(load_llm(MODEL, num_slots=4, max_len=512), ServerConfig(served_model_names=[MODEL]))
    ).start()
    yield srv
    srv.stop()


def send(http: httpx.Client, url: str, case: Case) -> httpx.Response:
    headers = {"content-type": "application/json", **(case.headers or {})}
    return http.request(case.method, url + case.path, content=case.body, headers=headers)


def test_hostile_requests_never_get_a_5xx(server):
    cases = build_cases()
    assert len(cases) >= 200
    with httpx.Client(timeout=60) as http:
        with ThreadPoolExecutor(6) as pool:
            responses = list(pool.map(lambda c: send(http, server.url, c), cases))

    server_errors = [(c.name, r.status_code, r.text[:200]) for c, r in zip(cases, responses) if r.status_code >= 500]
    assert server_errors == []
    not_rejected = [
        (c.name, r.status_code)
        for c, r in zip(cases, responses)
        if c.expect_client_error and not 400 <= r.status_code < 500
    ]
    assert not_rejected == []
    for case, response in zip(cases, responses):
        if 400 <= response.status_code < 500:
            assert response.json()["error"]["message"], case.name  # OpenAI's error shape
        if case.param is not None:
            assert response.json()["error"]["param"].split(".")[0] == case.param, (case.name, response.text[:300])

    # The server is healthy, nothing leaked, and it still answers.
    with httpx.Client(timeout=30) as http:
        assert http.get(server.url + "/health").json()["status"] == "ok"
        ok = http.post(server.url + CHAT, json=chat_body(max_tokens=6))
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
        metrics = http.get(server.url + "/metrics").text
    assert re.search(r"^selfspec_slots_in_use 0\.0$", metrics, re.M)
    assert re.search(r"^selfspec_requests_in_flight 0\.0$", metrics, re.M)
    assert not re.search(r'code="5\d\d"', metrics)
