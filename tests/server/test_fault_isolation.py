"""Over HTTP, one request can never fail another.

The regression: a two-turn chat whose history holds the JSON (or tool call) the grammar allows,
with prompt lookup (`speculation: {"method": "ngram"}`), once proposed the answer, the end-of-turn
token and the text after it; xgrammar aborted the engine step and every request decoded beside
it got a 500. Now the structured request equals its run without speculation and its neighbours
are untouched.

Fault injection: the faulty request (its user turn says FAULT) gets a fault in its own policy or
constraint instance, patched right after the engine built them; it gets a 500 (an error event
when streamed) naming the cause, while plain and speculating requests sent with it get their
alone answers, and every slot is free afterwards.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.server.cli import load_llm

pytest.importorskip("xgrammar")

MODEL = "tiny"
NUM_SLOTS = 8
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "enum": [1, 2, 3]},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
# No arguments: the call is all but forced, so turn 2 repeats turn 1's call token for token and
# prompt lookup reaches the end-of-turn token after it (as the system prompt's format line has it).
TIME_TOOL = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
NGRAM = {"method": "ngram"}


@pytest.fixture(scope="module")
def served():
    return load_llm(MODEL, num_slots=NUM_SLOTS, max_len=1024, draft="layers:1")


@pytest.fixture(scope="module")
def client(served):
    server = BackgroundServer(create_app(served, ServerConfig(served_model_names=[MODEL]))).start()
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    server.stop()


def _chat(client, messages, *, speculation=None, stream=False, **kwargs):
    extra = {"thinking": False}
    if speculation is not None:
        extra["speculation"] = speculation
    kwargs.setdefault("max_tokens", 120)
    return client.chat.completions.create(model=MODEL, messages=messages, extra_body=extra, stream=stream, **kwargs)


def _answer(response) -> tuple[str | None, list[tuple[str, str]], str]:
    message = response.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return message.content, calls, response.choices[0].finish_reason


def _assert_slots_free(served):
    engine = served.engine
    assert engine.scheduler.slots.num_free == NUM_SLOTS and not engine.has_unfinished()
    assert served.draft_runner.slots.num_free == NUM_SLOTS


# ---------------------------------------------------------------------- prompt lookup under a grammar
STRUCTURED = {
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}}},
    "json_object": {"response_format": {"type": "json_object"}},
    "tool_required": {"tools": TIME_TOOL, "tool_choice": "required"},
}


@pytest.mark.parametrize("kind", list(STRUCTURED))
def test_a_two_turn_chat_under_prompt_lookup_and_a_grammar(client, served, kind):
    """Turn 2 repeats turn 1's question: prompt lookup copies the earlier answer and what followed
    it in the history. Every request answers 200, the structured one as without speculation."""
    options = STRUCTURED[kind]
    first = [{"role": "user", "content": "Give me the weather as JSON."}]
    content, calls, _ = _answer(_chat(client, first, **options))
    if calls:
        call = {"id": "call_1", "type": "function", "function": {"name": calls[0][0], "arguments": calls[0][1]}}
        turn = {"role": "assistant", "content": None, "tool_calls": [call]}
    else:  # json_object: the tiny model may still be inside a string at max_tokens
        turn = {"role": "assistant", "content": content}
    history = first + [turn, {"role": "user", "content": "Give me the weather as JSON."}]
    plain = [{"role": "user", "content": "Say something."}]
    expected = _answer(_chat(client, history, **options))
    plain_alone = _answer(_chat(client, plain, max_tokens=40))
    with ThreadPoolExecutor(3) as pool:
        spec = pool.submit(_chat, client, history, speculation=NGRAM, **options)
        beside = pool.submit(_chat, client, plain, max_tokens=40)
        beside_spec = pool.submit(_chat, client, plain, speculation=NGRAM, max_tokens=40)
        got = _answer(spec.result())
        assert _answer(beside.result()) == plain_alone and _answer(beside_spec.result()) == plain_alone
    assert got == expected
    if kind != "json_object":
        assert got[2] in ("stop", "tool_calls") and isinstance(json.loads(got[0] or got[1][0][1]), dict)
    _assert_slots_free(served)


# ---------------------------------------------------------------------- fault injection
class Boom(RuntimeError):
    pass


def _failing_after(calls: int, original, message: str):
    count = {"n": 0}

    def method(*args, **kwargs):
        count["n"] += 1
        if count["n"] > calls:
            raise Boom(message)
        return original(*args, **kwargs)

    return method


def _inject_propose(seq):
    seq.policy.propose = _failing_after(2, seq.policy.propose, "injected propose")


def _inject_propose_many(seq):
    """The draft-model proposer's per-sequence start, which the group call (`propose_many`) runs
    for every sequence of the group: it fails the group call, then this request's retry alone."""
    proposer = seq.policy.proposer
    proposer._start = _failing_after(2, proposer._start, "injected propose_many")


def _inject_mask(seq):
    seq.constraint.masks = _failing_after(3, seq.constraint.masks, "injected mask")


def _inject_accept(seq):
    state = seq.constraint._grammar
    state.accept = _failing_after(4, state.accept, "injected accept")


def _inject_verify(seq):
    seq.policy.custom_verify = True
    seq.policy.verify = _failing_after(0, None, "injected verify")


def _inject_on_step(seq):
    seq.policy.on_step = _failing_after(3, seq.policy.on_step, "injected on_step")


def _inject_on_finish(seq):
    seq.policy.on_finish = _failing_after(0, None, "injected on_finish")


# injection, the faulty request's speculation, its options, words of the stage in the message
FAULTS = {
    "propose": (_inject_propose, NGRAM, {}, "proposing"),
    "propose_many": (_inject_propose_many, {"method": "draft"}, {}, "proposing"),
    "grammar_mask": (_inject_mask, NGRAM, STRUCTURED["json_schema"], "output grammar"),
    "grammar_accept": (_inject_accept, NGRAM, STRUCTURED["tool_required"], "output grammar"),
    "verify": (_inject_verify, NGRAM, {}, "verifying"),
    "on_step": (_inject_on_step, {"method": "suffix"}, {}, "step hook"),
    "on_finish": (_inject_on_finish, NGRAM, {}, "finish hook"),
}


@pytest.fixture
def faulty_submit(served, monkeypatch):
    """Patch the request whose prompt says FAULT with `injection` once its policy exists."""
    tokenizer = served.tokenizer
    injection = {}
    original = served.submit

    def submit(prompt_ids, *args, **kwargs):
        seq = original(prompt_ids, *args, **kwargs)
        if "FAULT" in tokenizer.decode(prompt_ids):
            injection["fn"](seq)
        return seq

    monkeypatch.setattr(served, "submit", submit)
    return injection


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("point", list(FAULTS))
def test_one_faulty_request_fails_alone(client, served, faulty_submit, point, stream):
    inject, speculation, options, stage = FAULTS[point]
    faulty_submit["fn"] = inject
    others = [
        ([{"role": "user", "content": "Say something."}], None),
        ([{"role": "user", "content": "Count from 0 to 9."}], NGRAM),
        ([{"role": "user", "content": "Is 42 even?"}], speculation),  # same method as the faulty one
    ]
    alone = [_answer(_chat(client, messages, speculation=spec, max_tokens=40)) for messages, spec in others]
    faulty = [{"role": "user", "content": "FAULT: give me the weather as JSON."}]
    with ThreadPoolExecutor(len(others) + 1) as pool:
        bad = pool.submit(_faulty_answer, client, faulty, speculation, options, stream)
        good = [pool.submit(_chat, client, m, speculation=s, max_tokens=40) for m, s in others]
        status, message = bad.result()
        assert [_answer(g.result()) for g in good] == alone
    assert status == 500 and "Boom: injected" in message and stage in message, message
    _assert_slots_free(served)


def _faulty_answer(client, messages, speculation, options, stream) -> tuple[int, str]:
    """(status, error message) of the faulty request; a stream reports its error as an event."""
    if not stream:
        try:
            _chat(client, messages, speculation=speculation, **options)
        except openai.InternalServerError as exc:
            return exc.status_code, exc.body["message"] if isinstance(exc.body, dict) else str(exc)
        return 200, ""
    try:
        for _ in _chat(client, messages, speculation=speculation, stream=True, **options):
            pass
    except openai.APIError as exc:  # the client raises the stream's error event
        return 500, exc.message
    return 200, ""
