"""`selfspec serve`: flags, their validation, and a real server process started from them."""

from __future__ import annotations

import inspect
import socket

import httpx
import openai
import pytest
import typer
from typer.testing import CliRunner

from selfspec.server.cli import build_defaults, serve_command
from selfspec.testing.serve_process import serve_process


@pytest.fixture(scope="module")
def cli() -> typer.Typer:
    """A throwaway app registering the command the way the main CLI does."""
    app = typer.Typer()
    app.command("serve")(serve_command)

    @app.command("noop")
    def noop() -> None:  # a second command, so "serve" is a real subcommand
        pass

    return app


def test_every_option_has_help(cli):
    for name, parameter in inspect.signature(serve_command).parameters.items():
        assert parameter.default.help, f"--{name} has no help text"
    result = CliRunner().invoke(cli, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in (
        "--model",
        "--host",
        "--port",
        "--num-slots",
        "--max-queue",
        "--request-timeout",
        "--api-key",
        "--ssr",
        "--draft-budget",
        "--cot-cap",
        "--answer-cap",
        "--reuse",
    ):
        assert flag in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--draft-budget", "5"], "add --ssr"),
        (["--ssr", "--reuse", "often"], "--reuse"),
        (["--ssr", "--speculation", "ngram"], "alternatives"),
        (["--fixed-length", "--cot-cap", "5"], "fixed_length"),
        (["--max-queue", "-1"], "max_queue"),
        (["--request-timeout", "0"], "request_timeout"),
        (["--ssr", "--draft-budget", "0"], "SSR"),
        (["--port", "70000"], "--port"),
        (["--log-level", "loud"], "--log-level"),
        (["--host", "no-such-host.invalid"], "--host"),
        (["--backend", "tgi"], "--backend"),
        (["--vllm-arg", "enforce_eager=true"], "--vllm-arg needs --backend vllm"),
        (["--backend", "vllm", "--speculation", "suffix"], "not supported with --backend vllm"),
        (["--backend", "vllm", "--draft", "layers:1"], "--draft"),
        (["--backend", "vllm", "--max-step-tokens", "64"], "max_num_batched_tokens"),
        (["--max-step-tokens", "0"], "--max-step-tokens"),
        (["--backend", "vllm", "--vllm-arg", "no equals sign"], "KEY=VALUE"),
        (["--backend", "vllm", "--vllm-arg", "dtype=float32"], "set it with --dtype"),
        (["--backend", "vllm", "--vllm-arg", "max_model_len=512"], "set it with --max-len"),
        (["--chat-template", "/no/such/template.jinja"], "--chat-template '/no/such/template.jinja': no such file"),
        (["--chat-template", "{% for m in messages %}"], "not a valid Jinja template"),
        (["--tool-call-parser", "pythonic"], "--tool-call-parser 'pythonic': choose from"),
        (["--reasoning-parser", "r2"], "--reasoning-parser 'r2': choose from deepseek_r1, qwen3"),
    ],
)
def test_bad_flags_exit_2_before_loading(cli, args, message):
    result = CliRunner().invoke(cli, ["serve", "--model", "no-such-model", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "could not load" not in result.output


def test_device_and_dtype_default_to_auto():
    from selfspec.server.cli import resolve_device_dtype

    params = inspect.signature(serve_command).parameters
    assert (params["device"].default.default, params["dtype"].default.default) == ("auto", "auto")
    assert resolve_device_dtype("auto", "auto") == ("cpu", "float32")  # no CUDA on the test machines
    assert resolve_device_dtype("auto", "auto", cuda_available=True) == ("cuda", "bfloat16")
    assert resolve_device_dtype("auto", "auto", cuda_available=False) == ("cpu", "float32")
    assert resolve_device_dtype("cuda:1", "auto", cuda_available=False) == ("cuda:1", "bfloat16")
    assert resolve_device_dtype("auto", "float16", cuda_available=True) == ("cuda", "float16")
    assert resolve_device_dtype("cpu", "bfloat16", cuda_available=True) == ("cpu", "bfloat16")


def test_auto_follows_torch_cuda_availability(monkeypatch):
    import torch

    from selfspec.server.cli import resolve_device_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device_dtype("auto", "auto") == ("cuda", "bfloat16")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device_dtype("auto", "auto") == ("cpu", "float32")


def test_generate_defaults_to_auto_too():
    from selfspec.cli.main import generate

    params = inspect.signature(generate).parameters
    assert (params["device"].default.default, params["dtype"].default.default) == ("auto", "auto")


def test_a_busy_port_exits_2_before_loading(cli):
    """A second server on a taken port: one line at once, not a model load and then uvicorn's exit 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["serve", "--model", "no-such-model", "--port", str(port)])
    assert result.exit_code == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.output and "could not load" not in result.output


def test_backend_vllm_without_vllm_says_how_to_install_it(cli):
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    result = CliRunner().invoke(cli, ["serve", "--backend", "vllm", "--model", "no-such-model"])
    assert result.exit_code == 2
    assert "pip install 'selfspec[vllm]'" in result.output and "could not load" not in result.output


def test_vllm_args_are_json_or_strings():
    from selfspec.server.cli import parse_vllm_args

    args = parse_vllm_args(["enforce_eager=true", "kv_cache_memory_bytes=268435456", "dtype=bfloat16", 'x={"a": 1}'])
    assert args == {"enforce_eager": True, "kv_cache_memory_bytes": 268435456, "dtype": "bfloat16", "x": {"a": 1}}


def test_unknown_model_exits_2(cli):
    result = CliRunner().invoke(cli, ["serve", "--model", "no-such-model-anywhere"])
    assert result.exit_code == 2
    assert "could not load" in result.output


def test_defaults_from_flags():
    d = build_defaults(ssr=True, draft_budget=[300, 100], reuse="prefix", cot_cap=500, answer_cap=200, think=True)
    assert d.ssr.draft_budgets == [100, 300] and d.ssr.reuse == "prefix"
    assert (d.cot_cap, d.answer_cap, d.thinking, d.speculation) == (500, 200, True, None)
    assert build_defaults(speculation="suffix").speculation.method == "suffix"
    assert build_defaults().ssr is None


def test_serve_process_end_to_end(tmp_path):
    """`python -m selfspec.server` with flags: key required, SSR on by default, clean exit."""
    args = [
        "--model", "tiny", "--num-slots", "4", "--api-key", "k3y", "--ssr", "--draft-budget", "4",
        "--cot-cap", "10", "--answer-cap", "8", "--log-level", "warning",
    ]  # fmt: skip
    with serve_process(args, tmp_path / "server.log", startup_timeout=60, stop_timeout=20) as server:
        assert httpx.get(server.url + "/v1/models").status_code == 401
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k3y", max_retries=0)
        try:
            out = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=30
            )
        except openai.APIError as exc:
            pytest.fail(f"{exc}\nserver log:\n{server.log()}")
        assert out.usage.selfspec["mode"] == "ssr"
        assert out.usage.selfspec["drafts"] == 1
        assert out.usage.selfspec["cot_tokens"] == 10
    assert server.process.returncode == 0, server.log()
