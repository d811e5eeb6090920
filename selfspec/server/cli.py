"""`selfspec serve`: load a model and serve it over the OpenAI API with uvicorn.

`serve_command` is a typer command function; the main CLI registers it with
`app.command("serve")(serve_command)`, and `python -m selfspec.server` runs it alone.
Flags set the server's limits and the defaults every request inherits (SSR on/off,
draft budgets, CoT and answer caps); a request overrides them in its `selfspec` object.
`--model tiny` serves a random-weight test model (no download, for load tests and demos
of the HTTP layer only: its text is noise). `--arbitrator DIR` (with `--draft`, or the draft
the checkpoint records) lets requests opt in to CoSpec, the one lossy mode. `--backend vllm`
serves the same API over SSR on the pinned vLLM (`selfspec.integrations.vllm.serving`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

if TYPE_CHECKING:  # imported lazily: `selfspec --help` should not pay for torch
    from selfspec.server.config import RequestDefaults

TINY_MODEL = "tiny"
_REUSE_MODES = ("off", "prefix", "suffix", "prefix+suffix")
_SPECULATION_METHODS = ("auto", "off", "suffix", "ngram")
BACKENDS = ("selfspec", "vllm")


def resolve_device_dtype(device: str, dtype: str, *, cuda_available: bool | None = None) -> tuple[str, str]:
    """`--device auto` and `--dtype auto` made concrete: CUDA and bfloat16 where CUDA is present,
    else cpu and float32 (the CPU kernels' dtype: bfloat16 matmuls there are slow and inexact).

    Why auto is the default: a server started on a GPU machine without flags should use the GPU.
    An explicit value passes through (the loader checks it); `dtype auto` follows the device.
    `cuda_available` defaults to `torch.cuda.is_available()`.
    """
    if device == "auto":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        device = "cuda" if cuda_available else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
    return device, dtype


def load_llm(
    model: str,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    num_slots: int = 8,
    max_len: int | None = None,
    draft: str | None = None,
    tokenizer: str | None = None,
    max_step_tokens: int | None = None,
):
    """The LLM to serve: a packaged name, GGUF file, local dir or hub id; or `tiny`.

    `draft` attaches a draft model (SpS / CoSpec): "layers:N" or a model name. `tokenizer`: a
    tokenizer directory to use instead of the model's own.
    """
    from selfspec.engine.config import EngineConfig
    from selfspec.llm import LLM

    engine_config = EngineConfig(num_slots=num_slots, max_len=max_len, max_step_tokens=max_step_tokens)
    if model == TINY_MODEL:
        from selfspec.testing.tiny import tiny_model, tiny_tokenizer

        tokenizer = tiny_tokenizer()
        net = tiny_model("qwen3", len(tokenizer), eos_token_id=tokenizer.eos_token_id)
        engine_config = EngineConfig(num_slots=num_slots, max_len=max_len or 512, max_step_tokens=max_step_tokens)
        return LLM.from_model(net, tokenizer, engine_config=engine_config, name=TINY_MODEL, draft=draft)
    llm = LLM(model, device=device, dtype=dtype, engine_config=engine_config, draft=draft, tokenizer=tokenizer)
    runner = llm.engine.runner
    if runner.static is not None and runner.static.capture:
        # Capture the decode / verify shapes before serving, so no request pays for a capture.
        buckets = runner.static.buckets
        seconds = runner.warm_up_graphs(list(buckets.batch), list(buckets.tokens), runner.max_len)
        print(f"selfspec: CUDA graphs captured for {len(runner.static.forwards)} shapes in {seconds:.1f}s", flush=True)
    return llm


def parse_vllm_args(pairs: list[str]) -> dict[str, Any]:
    """`--vllm-arg KEY=VALUE` pairs as keyword arguments (VALUE read as JSON when it parses:
    `true`, `268435456`, `{"a": 1}`; else kept as a string)."""
    import json

    args: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"--vllm-arg {pair!r}: write KEY=VALUE (an EngineArgs field, e.g. enforce_eager=true)")
        try:
            args[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            args[key.strip()] = value
    return args


def check_backend_flags(
    backend: str,
    vllm_args: list[str],
    *,
    draft: str | None,
    arbitrator: Path | None,
    speculation: str | None,
    max_step_tokens: int | None = None,
) -> dict[str, Any]:
    """Validate `--backend` and the flags that depend on it before any model loads; the vLLM
    engine arguments. ValueError names the flag; `VLLMUnsupportedError` says how to install vLLM."""
    if backend not in BACKENDS:
        raise ValueError(f"--backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "vllm":
        if vllm_args:
            raise ValueError("--vllm-arg needs --backend vllm")
        return {}
    given = [
        flag
        for flag, value in (("--draft", draft), ("--arbitrator", arbitrator), ("--speculation", speculation))
        if value and value != "off"
    ]
    if given:
        raise ValueError(f"{', '.join(given)}: not supported with --backend vllm (it serves plain decoding and SSR)")
    if max_step_tokens is not None:
        raise ValueError(
            "--max-step-tokens is selfspec's engine budget; with --backend vllm pass --vllm-arg max_num_batched_tokens=N"
        )
    args = parse_vllm_args(vllm_args)
    for key, flag in _VLLM_ARGS_WITH_FLAGS.items():
        if key in args:
            raise ValueError(f"--vllm-arg {key}: set it with {flag} (serve passes it to vLLM)")
    _backend_module("compat").check_vllm()
    return args


_VLLM_ARGS_WITH_FLAGS = {
    "model": "--model",
    "dtype": "--dtype",
    "max_num_seqs": "--num-slots",
    "max_model_len": "--max-len",
    "tokenizer": "--tokenizer",
}
"""vLLM engine arguments that `serve` fills from its own flags: given twice, which one wins would be a guess."""


def _backend_module(name: str):
    """A module of the vLLM integration, looked up by name: the integration implements this
    package's `backend.ServingBackend`, so it sits a layer above the server and the server never
    imports it statically (only `selfspec serve --backend vllm` loads it, at run time)."""
    import importlib

    return importlib.import_module(f"selfspec.integrations.vllm.{name}")


def check_cospec_flags(arbitrator: Path | None, threshold: float, num_tokens: int) -> None:
    """Validate the CoSpec flags before any model is loaded (ValueError names the flag)."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"--cospec-threshold must lie in [0, 1], got {threshold}")
    if not 1 <= num_tokens <= 64:
        raise ValueError(f"--cospec-k must be in [1, 64], got {num_tokens}")
    if arbitrator is not None:
        from selfspec.spec.cospec.checkpoint import read_checkpoint_config

        try:
            read_checkpoint_config(arbitrator)
        except (OSError, ValueError) as exc:
            raise ValueError(f"--arbitrator: {exc}") from None


def attach_cospec(llm: Any, defaults: "RequestDefaults", arbitrator: Path, threshold: float, num_tokens: int) -> None:
    """Load the arbitrator onto `llm`'s draft (attaching the checkpoint's draft if none) and
    offer CoSpec to requests that opt in."""
    from selfspec.server.config import CoSpecDefaults
    from selfspec.spec.cospec.checkpoint import load_arbitrator_for

    loaded = load_arbitrator_for(llm, arbitrator)
    defaults.cospec = CoSpecDefaults(arbitrator=loaded, threshold=threshold, num_speculative_tokens=num_tokens)


def default_served_name(model: str) -> str:
    """What clients pass as `model` when no --served-model-name is given: a packaged name as is,
    a path by its last component (a local path tells a client nothing and leaks the layout)."""
    path = Path(model).expanduser()
    if path.suffix == ".gguf":
        return path.stem
    return path.name if len(path.parts) > 1 or model.startswith((".", "~", "/")) else model


def build_defaults(
    *,
    ssr: bool = False,
    draft_budget: list[int] | None = None,
    draft_interval: int | None = None,
    max_draft_len: int | None = None,
    reuse: str = "prefix+suffix",
    speculation: str | None = None,
    cot_cap: int | None = None,
    answer_cap: int | None = None,
    fixed_length: bool = False,
    think: bool | None = None,
    temperature: float = 0.0,
    max_tokens: int | None = None,
    backend: str = "selfspec",
) -> RequestDefaults:
    """Request defaults from CLI values; raises ValueError naming the flag at fault. Without
    `--ssr` or `--speculation`, requests run auto (`selfspec.spec.auto`); the vLLM backend has no
    auto and serves them plainly."""
    from pydantic import ValidationError

    from selfspec.config import AutoConfig, parse_baseline_spec
    from selfspec.engine.sampling import InvalidSamplingParams, SamplingParams
    from selfspec.server.config import RequestDefaults
    from selfspec.spec.ssr import SSRConfig
    from selfspec.thinking.policy import ThinkingLimits

    if reuse not in _REUSE_MODES:
        raise ValueError(f"--reuse must be one of {_REUSE_MODES}, got {reuse!r}")
    if speculation is not None and speculation not in _SPECULATION_METHODS:
        raise ValueError(f"--speculation must be one of {_SPECULATION_METHODS}, got {speculation!r}")
    if ssr and speculation is not None:
        raise ValueError("--ssr and --speculation are alternatives; choose one")
    ssr_fields_given = (
        bool(draft_budget) or draft_interval is not None or max_draft_len is not None or reuse != "prefix+suffix"
    )
    if ssr_fields_given and not ssr:
        raise ValueError(
            "--draft-budget/--draft-interval/--max-draft-len/--reuse set SSR defaults; add --ssr to turn it on"
        )
    ssr_config = None
    if ssr:
        fields: dict[str, Any] = {"reuse": reuse}
        if draft_budget:
            fields["draft_budgets"] = list(draft_budget)
        if draft_interval is not None:
            fields["draft_interval"] = draft_interval
        if max_draft_len is not None:
            fields["max_draft_len"] = max_draft_len
        try:
            ssr_config = SSRConfig(**fields)
        except ValidationError as exc:
            raise ValueError(f"invalid SSR flags: {exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}") from None
    ThinkingLimits(cot_cap=cot_cap, answer_cap=answer_cap, fixed_length=fixed_length).validate()
    try:  # the same rule a request's own temperature meets, so a default never fails a request later
        SamplingParams(temperature=temperature).validate()
    except InvalidSamplingParams as exc:
        raise ValueError(f"--temperature {temperature}: {exc}") from None
    default_spec = None
    if not ssr and speculation in (None, "auto"):
        default_spec = AutoConfig() if backend != "vllm" else None
    elif not ssr and speculation != "off":
        default_spec = parse_baseline_spec({"method": speculation})
    return RequestDefaults(
        ssr=ssr_config,
        speculation=default_spec,
        thinking=think,
        cot_cap=cot_cap,
        answer_cap=answer_cap,
        fixed_length=fixed_length,
        temperature=temperature,
        max_tokens=max_tokens,
    )


_LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def check_listen_address(host: str, port: int, log_level: str) -> None:
    """Raise ValueError unless the server could listen on host:port and uvicorn knows the log level.

    Why before the model loads: uvicorn finds a busy port or a bad level only when it starts,
    after the model has loaded (seconds for a GGUF, more on a GPU), and answers a busy port with a
    log line and exit 1. Binding a probe socket here has a race with other processes, but turns
    the common mistake (a second server on the same port) into one clear line at once."""
    import socket

    if log_level.lower() not in _LOG_LEVELS:
        raise ValueError(f"--log-level {log_level!r}: choose from {', '.join(_LOG_LEVELS)}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ValueError(f"--host {host!r}: not an address this machine can resolve ({exc.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind(address)
        except OSError as exc:
            raise ValueError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def serve_command(
    model: str = typer.Option(
        "smollm2",
        "--model",
        "-m",
        help="Packaged name (smollm2, gemma3-270m), a .gguf file, a local HF directory, or 'tiny' (random test model).",
    ),
    host: str = typer.Option(
        "127.0.0.1", help="Address to bind. Keep 127.0.0.1 unless the server must be reachable from other machines."
    ),
    port: int = typer.Option(8000, min=0, max=65535, help="TCP port to listen on (0: any free one)."),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto (cuda when present, else cpu)."),
    dtype: str = typer.Option(
        "auto", help="float32 | bfloat16 | float16 | auto (bfloat16 on CUDA, float32 on cpu; vLLM: its own auto)."
    ),
    tokenizer: Optional[str] = typer.Option(
        None, "--tokenizer", help="Tokenizer directory to use instead of the model's own."
    ),
    chat_template: Optional[str] = typer.Option(
        None,
        "--chat-template",
        help="Chat template to use instead of the tokenizer's: a Jinja file, the template text, or a packaged name (smollm2-tools: SmolLM2 with Hermes-style tools).",
    ),
    tool_call_parser: Optional[str] = typer.Option(
        None,
        "--tool-call-parser",
        help="Tool-call format of the model's output (vLLM's names): hermes | qwen3_xml | qwen3_coder | llama3_json (default: read from the chat template).",
    ),
    reasoning_parser: Optional[str] = typer.Option(
        None,
        "--reasoning-parser",
        help="Thinking markers that split reasoning from the answer (vLLM's names): deepseek_r1 | qwen3 (both <think>...</think>; default: read from the tokenizer and template).",
    ),
    num_slots: int = typer.Option(
        8, min=1, help="KV-cache slots: sequences decoded together (SSR drafts take slots too)."
    ),
    max_len: Optional[int] = typer.Option(
        None, min=1, help="Context length per slot in tokens (default: the model's, at most 4096)."
    ),
    max_step_tokens: Optional[int] = typer.Option(
        None,
        min=1,
        help="At most this many tokens fed per forward across the batch: under load, speculation shrinks to fit.",
    ),
    max_queue: int = typer.Option(64, help="Requests that may wait for a slot; beyond that, 429 with Retry-After."),
    request_timeout: float = typer.Option(
        600.0, help="Seconds after which a request is cancelled (a request may ask for less)."
    ),
    grammar_compile_timeout: float = typer.Option(
        30.0,
        min=0.001,
        help="Seconds a request's grammar (response_format, a forced tool call) may take to compile; beyond: 400.",
    ),
    api_key: Optional[str] = typer.Option(
        None,
        envvar="SELFSPEC_API_KEY",
        help="Require 'Authorization: Bearer <key>' on /v1 endpoints (also read from SELFSPEC_API_KEY).",
    ),
    served_model_name: Optional[list[str]] = typer.Option(
        None, help="Name(s) clients pass as 'model' (default: the --model value). Repeat for aliases."
    ),
    ssr: bool = typer.Option(
        False, "--ssr/--no-ssr", help="Run SSR (self-speculation) on every request unless it says otherwise."
    ),
    draft_budget: Optional[list[int]] = typer.Option(
        None, help="SSR default: CoT length at which a draft is forked (repeat for several drafts)."
    ),
    draft_interval: Optional[int] = typer.Option(
        None, help="SSR default: fork a draft every N CoT tokens (iterative drafting)."
    ),
    max_draft_len: Optional[int] = typer.Option(None, help="SSR default: a draft stops after this many answer tokens."),
    reuse: str = typer.Option(
        "prefix+suffix", help="SSR default: how drafts are used: off | prefix | suffix | prefix+suffix."
    ),
    speculation: Optional[str] = typer.Option(
        None,
        help="Default speculation without SSR: auto (the default: SSR with prompt lookup on thinking requests, "
        "prompt lookup elsewhere, as measured costs pay), off (plain decoding), suffix (suffix decoding) or ngram "
        "(prompt lookup).",
    ),
    cot_cap: Optional[int] = typer.Option(None, help="Default: close thinking by force after this many CoT tokens."),
    answer_cap: Optional[int] = typer.Option(
        None, help="Default: stop the answer after this many tokens (continuation cap)."
    ),
    fixed_length: bool = typer.Option(
        False,
        "--fixed-length/--no-fixed-length",
        help="Default: ignore the model's end-of-thinking and EOS (paper rows; needs --cot-cap and --answer-cap).",
    ),
    think: Optional[bool] = typer.Option(
        None, "--think/--no-think", help="Default for thinking (unset: the model's own default)."
    ),
    temperature: float = typer.Option(0.0, help="Default sampling temperature when a request gives none (0 = greedy)."),
    default_max_tokens: Optional[int] = typer.Option(
        None, help="max_tokens for requests that give none (default: the room left in the context)."
    ),
    draft: Optional[str] = typer.Option(
        None,
        "--draft",
        help="Draft model for SpS/CoSpec: layers:N (the target's first N layers) or a model name (default with --arbitrator: the checkpoint's).",
    ),
    arbitrator: Optional[Path] = typer.Option(
        None,
        help="CoSpec arbitrator checkpoint directory; requests opt in with selfspec.cospec (LOSSY: responses say usage.selfspec.lossy=true).",
    ),
    cospec_threshold: float = typer.Option(
        0.6, help="CoSpec default: keep a draft token at a mismatch iff π(keep) >= this (0..1; 1 never keeps)."
    ),
    cospec_k: int = typer.Option(25, help="CoSpec default: draft tokens per round (1..64)."),
    log_level: str = typer.Option("info", help="uvicorn log level: critical | error | warning | info | debug."),
    backend: str = typer.Option(
        "selfspec",
        help="selfspec (this package's engine) | vllm (SSR over the pinned vLLM: the [vllm] extra; --model is a local HF directory).",
    ),
    vllm_arg: Optional[list[str]] = typer.Option(
        None,
        "--vllm-arg",
        help="With --backend vllm: KEY=VALUE for vllm.EngineArgs or num_speculative_tokens (VALUE as JSON), e.g. enforce_eager=true. Repeat.",
    ),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (chat, completions, streaming, /metrics)."""
    try:
        import uvicorn

        from selfspec.server.app import create_app
        from selfspec.server.connections import uvicorn_options
    except ImportError as exc:  # the [server] extra is optional: say how to get it, not a traceback
        typer.echo(
            f"error: the server needs the [server] extra ({exc.name} is missing): pip install 'selfspec[server]'",
            err=True,
        )
        raise typer.Exit(code=2) from None
    from selfspec.server.backend import as_backend
    from selfspec.server.chat_template import apply_chat_settings, check_chat_flags
    from selfspec.server.config import ServerConfig

    try:
        defaults = build_defaults(
            ssr=ssr,
            draft_budget=draft_budget,
            draft_interval=draft_interval,
            max_draft_len=max_draft_len,
            reuse=reuse,
            speculation=speculation,
            cot_cap=cot_cap,
            answer_cap=answer_cap,
            fixed_length=fixed_length,
            think=think,
            temperature=temperature,
            max_tokens=default_max_tokens,
            backend=backend,
        )
        check_cospec_flags(arbitrator, cospec_threshold, cospec_k)
        chat = check_chat_flags(chat_template, tool_call_parser, reasoning_parser)
        config = ServerConfig(
            served_model_names=list(served_model_name or [default_served_name(model)]),
            max_queue=max_queue,
            request_timeout_s=request_timeout,
            grammar_compile_timeout_s=grammar_compile_timeout,
            api_key=api_key,
            defaults=defaults,
        )
        check_listen_address(host, port, log_level)
        engine_args = check_backend_flags(
            backend,
            list(vllm_arg or []),
            draft=draft,
            arbitrator=arbitrator,
            speculation=speculation,
            max_step_tokens=max_step_tokens,
        )
    except (ValueError, RuntimeError) as exc:  # RuntimeError: VLLMUnsupportedError (vLLM missing or untested)
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    try:
        if backend == "vllm":
            llm = _backend_module("serving").VLLMBackend.load(
                model,
                name=config.served_model_names[0],
                num_slots=num_slots,
                max_len=max_len,
                dtype=dtype,
                tokenizer=tokenizer,
                **engine_args,
            )
        else:
            device, dtype = resolve_device_dtype(device, dtype)
            llm = load_llm(
                model,
                device=device,
                dtype=dtype,
                num_slots=num_slots,
                max_len=max_len,
                draft=draft,
                tokenizer=tokenizer,
                max_step_tokens=max_step_tokens,
            )
    except (ValueError, TypeError, FileNotFoundError, OSError) as exc:
        typer.echo(f"error: could not load {model!r}: {exc}", err=True)
        raise typer.Exit(code=2) from None
    if backend == "vllm":
        from selfspec.engine.sampling import SamplingParams

        unsupported = llm.unsupported_params(SamplingParams(temperature=defaults.temperature))
        if unsupported is not None:
            typer.echo(f"error: --temperature {defaults.temperature:g} with --backend vllm: {unsupported[1]}", err=True)
            raise typer.Exit(code=2)
    if arbitrator is not None:
        try:
            attach_cospec(llm, defaults, arbitrator, cospec_threshold, cospec_k)
        except (ValueError, FileNotFoundError, OSError) as exc:
            typer.echo(f"error: could not load the arbitrator {str(arbitrator)!r}: {exc}", err=True)
            raise typer.Exit(code=2) from None
    apply_chat_settings(llm, chat)
    served = as_backend(llm)
    served.tool_call_parser = chat.tool_family
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    app = create_app(served, config)
    context = llm.max_len if backend == "vllm" else llm.engine.max_len
    typer.echo(
        f"serving {config.served_model_names} ({context}-token context, {num_slots} slots"
        + (", vLLM" if backend == "vllm" else "")
        + f") on http://{host}:{port}/v1"
        + (" (API key required)" if api_key else "")
        + (f"; CoSpec (lossy) on request, default threshold {cospec_threshold:g}" if arbitrator is not None else "")
    )
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=log_level == "debug", **uvicorn_options())


def main() -> None:
    """Entry point of `python -m selfspec.server`."""
    typer.run(serve_command)
