"""The backend seam: the server drives any `ServingBackend`; what a backend declares it cannot
run is a 400 naming the field, before the request reaches the engine. Checked here on our own
engine behind a backend that declares the vLLM backend's capabilities, narrowed further (no
logprobs, one sample) so every kind of refusal is exercised (the vLLM tests run the real one);
the main suite thus covers the planner's side without vLLM installed."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from selfspec.integrations.vllm.serving import CAPABILITIES, VLLMBackend
from selfspec.server import BackgroundServer, ServerConfig, create_app
from selfspec.server.backend import LocalBackend, as_backend
from selfspec.server.cli import load_llm

MODEL = "tiny"


class Restricted(LocalBackend):
    capabilities = dataclasses.replace(CAPABILITIES, logprobs=False, max_n=1)
    unsupported_spec = VLLMBackend.unsupported_spec

    def unsupported_params(self, params):
        return ("temperature", "not exact here") if params.temperature > 0 else None


@pytest.fixture(scope="module")
def llm():
    return load_llm(MODEL, num_slots=2, max_len=256)


@pytest.fixture(scope="module")
def server(llm):
    srv = BackgroundServer(create_app(Restricted(llm), ServerConfig(served_model_names=[MODEL]))).start()
    yield srv
    srv.stop()


def test_an_llm_is_served_through_the_local_backend(llm):
    backend = as_backend(llm)
    assert isinstance(backend, LocalBackend) and as_backend(backend) is backend
    assert (backend.max_len, backend.num_slots) == (256, 2)


def test_what_runs_runs(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    for options in ({}, {"selfspec": {"ssr": {"draft_budgets": [2]}, "cot_cap": 4}}):
        response = httpx.post(server.url + "/v1/chat/completions", json={**body, **options}, timeout=60)
        assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"selfspec": {"cospec": True}}, "selfspec.cospec"),
        ({"selfspec": {"speculation": {"method": "ngram"}}}, "selfspec.speculation"),
        ({"selfspec": {"ssr": {"use_draft_probs": True}}}, "selfspec.ssr.use_draft_probs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"selfspec": {"grammar": 'root ::= "a"'}}, "selfspec.grammar"),
        ({"logprobs": True}, "logprobs"),
        ({"n": 2}, "n"),
        ({"min_tokens": 2}, "min_tokens"),
        ({"temperature": 0.5}, "temperature"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                "tool_choice": "required",
            },
            "tool_choice",
        ),
    ],
)
def test_what_the_backend_cannot_run_is_a_400_naming_it(server, extra, param):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **extra}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, "unsupported_feature")
    assert "not supported with the vllm backend" in error["message"]
