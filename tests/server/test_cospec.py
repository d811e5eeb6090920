"""CoSpec through the OpenAI-compatible server: opt-in, lossy flag, validation, and the rest unchanged.

A tiny random model with a `layers:1` draft serves; a tiny arbitrator is saved to a tmp
dir and loaded the way `selfspec serve --arbitrator` loads it. The reference is the
library on a second engine over the same weights with the same checkpoint.
"""

from __future__ import annotations

import httpx
import openai
import pytest
import torch
import typer
from typer.testing import CliRunner

from selfspec.engine.config import EngineConfig
from selfspec.engine.sampling import SamplingParams
from selfspec.llm import LLM
from selfspec.server import BackgroundServer, RequestDefaults, ServerConfig, create_app
from selfspec.server.cli import attach_cospec, load_llm, serve_command
from selfspec.spec.cospec import Arbitrator, CoSpecConfig
from selfspec.spec.cospec.checkpoint import load_arbitrator_for, save_arbitrator

MODEL = "tiny"
PROMPT = [{"role": "user", "content": "Count from 0 to 9."}]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    llm = load_llm(MODEL, num_slots=2, max_len=256, draft="layers:1")
    arbitrator = Arbitrator.from_draft(llm.draft_runner.model, seed=2)
    with torch.no_grad():
        for name, param in arbitrator.named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
    return save_arbitrator(arbitrator, tmp_path_factory.mktemp("arb") / "ckpt", draft="layers:1", target=MODEL)


@pytest.fixture(scope="module")
def served(checkpoint):
    """What `selfspec serve --model tiny --arbitrator DIR --cospec-k 4` builds (no --draft: the checkpoint's)."""
    llm = load_llm(MODEL, num_slots=4, max_len=256)
    defaults = RequestDefaults()
    attach_cospec(llm, defaults, checkpoint, threshold=0.6, num_tokens=4)
    assert llm.draft_spec == "layers:1" and defaults.cospec is not None
    return llm, defaults


@pytest.fixture(scope="module")
def server(served):
    llm, defaults = served
    srv = BackgroundServer(create_app(llm, ServerConfig(served_model_names=[MODEL], defaults=defaults))).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def library(served, checkpoint):
    """The same weights and checkpoint on an engine of its own."""
    llm, _ = served
    ref = LLM.from_model(
        llm.model, llm.tokenizer, engine_config=EngineConfig(num_slots=4, max_len=256), name=MODEL, draft="layers:1"
    )
    return ref, load_arbitrator_for(ref, checkpoint)


def _chat(client, *, max_tokens: int = 32, **selfspec):
    return client.chat.completions.create(
        model=MODEL, messages=PROMPT, max_tokens=max_tokens, extra_body={"selfspec": {"thinking": False, **selfspec}}
    )


def test_cospec_request_is_lossy_and_matches_the_library(client, library):
    ref, arbitrator = library
    (expected,) = ref.generate(
        PROMPT,
        SamplingParams(max_tokens=32),
        thinking=False,
        spec=CoSpecConfig(num_speculative_tokens=4, threshold=0.0, arbitrator=arbitrator),
    )
    out = _chat(client, cospec={"threshold": 0})
    usage = out.usage.selfspec
    assert usage["mode"] == "cospec" and usage["lossy"] is True
    assert usage["cospec_threshold"] == 0.0
    assert usage["kept_draft_tokens"] == expected.metrics["kept_draft_tokens"] > 0
    assert out.choices[0].message.content == expected.text


def test_plain_request_stays_lossless(client, library):
    ref, _ = library
    (plain,) = ref.generate(PROMPT, SamplingParams(max_tokens=32), thinking=False)
    out = _chat(client)
    assert out.usage.selfspec["mode"] == "plain" and out.usage.selfspec["lossy"] is False
    assert "kept_draft_tokens" not in out.usage.selfspec
    assert out.choices[0].message.content == plain.text
    # Threshold 1 never keeps: lossy by mode, but the target's own greedy text.
    never = _chat(client, cospec={"threshold": 1})
    assert never.usage.selfspec["lossy"] is True and never.usage.selfspec["kept_draft_tokens"] == 0
    assert never.choices[0].message.content == plain.text
    # `cospec: true` takes the server's defaults (threshold 0.6, K 4); streaming works too.
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=PROMPT,
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"selfspec": {"thinking": False, "cospec": True}},
        )
    )
    usage = chunks[-1].usage.selfspec
    assert usage["mode"] == "cospec" and usage["lossy"] is True and usage["cospec_threshold"] == 0.6


@pytest.mark.parametrize(
    "body, param",
    [
        ({"selfspec": {"cospec": {"threshold": 1.5}}}, "selfspec.cospec.threshold"),
        ({"selfspec": {"cospec": {"threshold": -0.1}}}, "selfspec.cospec.threshold"),
        ({"selfspec": {"cospec": {"threshold": "high"}}}, "selfspec.cospec.threshold"),
        ({"selfspec": {"cospec": {"treshold": 0.5}}}, "selfspec.cospec.treshold"),
        ({"selfspec": {"cospec": {"threshold": 0.5}}, "temperature": 0.8}, "temperature"),
        ({"selfspec": {"cospec": True, "ssr": True}}, None),
    ],
)
def test_invalid_cospec_requests_are_400_and_the_server_keeps_serving(server, body, param):
    payload = {"model": MODEL, "messages": PROMPT, "max_tokens": 4, **body}
    response = httpx.post(server.url + "/v1/chat/completions", json=payload, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if param is not None:
        assert error["param"] == param, error
    ok = httpx.post(
        server.url + "/v1/chat/completions", json={"model": MODEL, "messages": PROMPT, "max_tokens": 4}, timeout=30
    )
    assert ok.status_code == 200 and ok.json()["usage"]["selfspec"]["lossy"] is False


def test_server_without_arbitrator_refuses_cospec(served):
    llm, _ = served
    srv = BackgroundServer(create_app(llm, ServerConfig(served_model_names=[MODEL]))).start()
    try:
        payload = {"model": MODEL, "messages": PROMPT, "max_tokens": 4, "cospec": {"threshold": 0.5}}  # top-level key
        response = httpx.post(srv.url + "/v1/chat/completions", json=payload, timeout=30)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "cospec_unavailable"
        assert (
            httpx.post(
                srv.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 3}, timeout=30
            ).status_code
            == 200
        )
    finally:
        srv.stop()


def test_serve_cospec_flags_are_checked_before_loading(tmp_path):
    cli = typer.Typer()
    cli.command("serve")(serve_command)
    cli.command("noop")(lambda: None)
    for args, message in (
        (["--cospec-threshold", "1.5"], "--cospec-threshold"),
        (["--cospec-k", "0"], "--cospec-k"),
        (["--arbitrator", str(tmp_path / "missing")], "--arbitrator"),
    ):
        result = CliRunner().invoke(cli, ["serve", "--model", "no-such-model", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    help_text = CliRunner().invoke(cli, ["serve", "--help"], env={"COLUMNS": "200"}).output
    for flag in ("--draft", "--arbitrator", "--cospec-threshold", "--cospec-k"):
        assert flag in help_text
