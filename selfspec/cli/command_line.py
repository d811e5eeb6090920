"""Small helpers shared by the typer commands.

`explicit_command`: the exact command behind a result, every option spelled out (defaults
included), so that a later change of a default cannot change what a record says was run.
"""

from __future__ import annotations

import shlex

import typer


def explicit_command(ctx: typer.Context, *words: str) -> str:
    """`selfspec <words...> --opt value ...` for this typer invocation."""
    parts = ["selfspec", *words]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or not getattr(param, "opts", None):
            continue
        if getattr(param, "is_flag", False) and getattr(param, "secondary_opts", None):
            parts.append(param.opts[0] if value else param.secondary_opts[0])
        else:
            parts += [param.opts[0], str(value)]
    return shlex.join(parts)


def fail(message: str) -> None:
    """Exit with status 2 and the message on stderr (bad input, nothing run)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


def auto_device_and_dtype(device: str, dtype: str) -> tuple[str, str]:
    """Resolve "auto": CUDA when present; bfloat16 on CUDA, float32 elsewhere (the server's rule,
    `selfspec.server.cli.resolve_device_dtype`, so every command resolves it alike)."""
    from selfspec.server.cli import resolve_device_dtype

    return resolve_device_dtype(device, dtype)
