"""Server defects a client or a hostile page would hit: one rule for stop strings, validated
defaults, quiet disconnects, model retrieval, the API key on every route, JSON-only POSTs, no
local paths shown as model names, and deadlines for request heads and bodies."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import httpx
import openai
import pytest

from selfspec.engine.config import EngineConfig
from selfspec.engine.llm_engine import Engine
from selfspec.engine.sampling import SamplingParams
from selfspec.engine.stop_strings import hits_stop_string
from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.server.cli import build_defaults, default_served_name, load_llm
from selfspec.server.connections import HeadTimeoutH11Protocol

MODEL = "tiny"


@pytest.fixture(scope="module")
def served():
    return load_llm(MODEL, num_slots=4, max_len=256)


@pytest.fixture(scope="module")
def server(served):
    srv = BackgroundServer(create_app(served, ServerConfig(served_model_names=[MODEL]))).start()
    yield srv
    srv.stop()


def test_stop_strings_match_the_text_without_special_tokens(served):
    """A stop string spanning a hidden special token stops generation; a special token's own
    text never does — the rule the client-side text follows."""
    tokenizer = served.tokenizer
    engine = Engine(served.model, tokenizer, EngineConfig(num_slots=1, max_len=64))
    y, i = tokenizer.encode("y", add_special_tokens=False), tokenizer.encode("i", add_special_tokens=False)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    seq = engine.add_request([1, 2, 3], SamplingParams(max_tokens=8, stop=["yi"]))
    seq.token_ids.extend(y + [end] + i)
    assert tokenizer.decode(seq.output_ids, skip_special_tokens=True) == "yi"
    assert hits_stop_string(engine.tokenizer, seq.token_ids, seq.prompt_len, seq.params.stop)
    hidden = engine.add_request([1, 2, 3], SamplingParams(max_tokens=8, stop=["<|im_end|>"]))
    hidden.token_ids.extend(y + [end])
    assert not hits_stop_string(engine.tokenizer, hidden.token_ids, hidden.prompt_len, hidden.params.stop)


def test_a_visible_stop_string_ends_generation_with_reason_stop(served, server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    free = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=24, temperature=0)
    text = free.choices[0].text
    stop = next(
        (
            text[k : k + 3]
            for k in range(4, len(text) - 3)
            if text[k : k + 3].strip() and text[k : k + 3] not in text[:k]
        ),
        None,
    )
    assert stop is not None, text
    cut = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.usage.completion_tokens < free.usage.completion_tokens


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_server_default_temperature_is_validated_before_the_model_loads(value):
    with pytest.raises(ValueError, match="temperature"):
        build_defaults(temperature=value)


def test_serve_refuses_a_nan_temperature_at_start_up():
    from typer.testing import CliRunner

    from selfspec.cli.main import app

    result = CliRunner().invoke(app, ["serve", "--model", "no-such-model-to-load", "--temperature", "nan"])
    assert result.exit_code == 2
    assert "temperature" in result.output and "no-such-model" not in result.output  # failed before loading


def test_a_client_that_hangs_up_mid_body_costs_one_log_line_and_a_counter(served, caplog):
    app = create_app(served, ServerConfig(served_model_names=[MODEL]))
    state = app.state.selfspec
    messages = [
        {"type": "http.request", "body": b'{"model": "tiny", "mess', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict] = []

    async def receive():
        return messages.pop(0)

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    with caplog.at_level(logging.INFO, logger="selfspec.server"):
        asyncio.run(app(scope, receive, send))
    records = [r for r in caplog.records if r.name.startswith("selfspec")]
    assert len(records) == 1 and records[0].exc_info is None and "hung up" in records[0].getMessage()
    assert state.metrics.body_disconnects._value.get() == 1


def test_models_retrieve(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_api_key_covers_every_route_but_health(served):
    srv = BackgroundServer(create_app(served, ServerConfig(served_model_names=[MODEL], api_key="s3cret"))).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            for path in ("/docs", "/openapi.json", "/metrics", "/v1/models", f"/v1/models/{MODEL}"):
                assert http.get(path).status_code == 401, path
                assert http.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200, path
            assert (
                http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1}).status_code == 401
            )
            assert http.get("/health").status_code == 200
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data", None]
)
def test_posts_must_be_json(server, content_type):
    headers = {} if content_type is None else {"content-type": content_type}
    body = json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1})
    response = httpx.post(server.url + "/v1/completions", content=body, headers=headers, timeout=30)
    assert response.status_code == 415
    assert response.json()["error"]["code"] == "unsupported_media_type"
    ok = httpx.post(
        server.url + "/v1/completions",
        content=body,
        headers={"content-type": "application/json; charset=utf-8"},
        timeout=30,
    )
    assert ok.status_code == 200


def test_served_name_is_never_a_local_path(tmp_path):
    assert default_served_name("smollm2") == "smollm2"
    assert default_served_name(str(tmp_path / "models" / "my-model")) == "my-model"
    assert default_served_name("/srv/weights/qwen3-4b.gguf") == "qwen3-4b"
    assert default_served_name("./local-dir/") == "local-dir"


def _closed_within(sock, seconds: float) -> bool:
    """Whether the server closed `sock` within `seconds` (recv returns b"" or the peer resets)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_idle_and_half_sent_request_heads_are_closed(served, monkeypatch):
    """Connections that never complete a request head are closed after the head deadline — idle
    ones and ones that stall mid-head — while a normal request on the same server still works."""
    monkeypatch.setattr(HeadTimeoutH11Protocol, "header_timeout_s", 0.5)
    before = HeadTimeoutH11Protocol.closed_for_timeout
    with BackgroundServer(create_app(served, ServerConfig(served_model_names=[MODEL]))) as srv:
        idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
        partial = socket.create_connection(("127.0.0.1", srv.port))
        partial.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: appl")
        try:
            assert all(_closed_within(s, 3.0) for s in idle + [partial])
            assert HeadTimeoutH11Protocol.closed_for_timeout - before == 21
            assert httpx.get(srv.url + "/health", timeout=10).status_code == 200
        finally:
            for s in idle + [partial]:
                s.close()


def _read_until_closed(sock: socket.socket) -> bytes:
    """The whole reply: head and body may arrive in separate segments, so one recv is not enough."""
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_stalled_body_gets_408(served):
    with BackgroundServer(create_app(served, ServerConfig(served_model_names=[MODEL], body_timeout_s=0.5))) as srv:
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n"
            sock.sendall(head + b'{"model": ')
            sock.settimeout(5.0)
            reply = _read_until_closed(sock)
        assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in reply
        assert b"connection: close" in reply.lower()  # closed at once, not after the keep-alive timeout
