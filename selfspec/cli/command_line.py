"""The exact command behind a result: every option spelled out, defaults included.

Reports and checkpoints record it so that a later change of a default cannot change what
the record says was run.
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
