"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

The official clients raise typed exceptions from the status code and show `message`, so
every rejection names the offending field both in `param` and in the message.
Validation errors are reported as 400 (as OpenAI and vLLM do), with the field path
written the way it appears in the body (`messages.0.role`, `selfspec.ssr.reuse`).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
    504: "timeout_error",
}

# Location parts pydantic adds for union members and validators, not body keys.
_TAG = re.compile(r"^(function-\w+\[.*\]|[a-z\-]+\[.*\]|str|int|float|bool|none|dict|list|bytes|[A-Z][A-Za-z0-9]*)$")


class APIError(Exception):
    """An error response: status, message, and the field it concerns."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        error_type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.error_type = error_type or _TYPE_BY_STATUS.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


def field_path(loc: tuple[Any, ...], prefix: str = "") -> str | None:
    """`('messages', 0, 'role')` -> 'messages.0.role', dropping pydantic's union tags."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and _TAG.match(p))]
    if prefix:
        parts.insert(0, prefix)
    return ".".join(parts) or None


def from_validation_error(exc: ValidationError, *, prefix: str = "") -> APIError:
    """One 400 naming the first offending field (and up to two more in the message)."""
    from selfspec.server.schemas import UnsupportedField

    details = exc.errors(include_url=False)
    if details and details[0]["type"] == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {details[0]['msg']}", code="invalid_json")
    described: list[tuple[str | None, str]] = []
    for detail in details:
        cause = (detail.get("ctx") or {}).get("error")
        message = str(detail.get("msg", "invalid value"))
        if isinstance(cause, UnsupportedField):
            path, message = cause.field, str(cause)
        else:
            path = field_path(tuple(detail.get("loc", ())), prefix)
            message = message.removeprefix("Value error, ")
            if path is None and detail["type"] == "model_type":
                message = "the body must be a JSON object"
        if (path, message) not in described:
            described.append((path, message))
    # A union reports every member's complaint; keep the deepest ones (the member the
    # value was meant for), e.g. `ssr.reuse` rather than "ssr: not a boolean".
    described = [
        (path, message)
        for path, message in described
        if not any(other and path is not None and other.startswith(path + ".") for other, _ in described)
    ] or described
    if not described:
        return APIError(400, "invalid request body")
    text = "; ".join(f"{path}: {message}" if path else message for path, message in described[:3])
    if len(described) > 3:
        text += f" (and {len(described) - 3} more)"
    return APIError(400, text, param=described[0][0], code="invalid_value")


# A library's source location: "[04:29:21] /project/cpp/json_schema_converter.cc:5082: " and the like.
_TIMESTAMP = re.compile(r"\[\d{1,2}:\d{2}:\d{2}\]\s*")
_SOURCE_LOCATION = re.compile(r"(?:[A-Za-z]:)?(?:[\w.\-~]*[/\\])+[\w.\-]+(?::\d+)+:?\s*")
_PATH = re.compile(r"(?:[A-Za-z]:)?(?:[\w.\-~]*[/\\]){2,}[\w.\-]+")
_CHECK_FAILED = re.compile(r"Check failed:\s*(?:\(.*?\)\s*is\s*false:?\s*)?")


def clean_library_message(text: str, fallback: str = "rejected by the library") -> str:
    """A library's error text as a client may see it: its first meaningful line without
    timestamps, source files, line numbers or assertion wording (xgrammar reports
    `[hh:mm:ss] /path/to/cpp/file.cc:123: Check failed: ...`). The server logs the full text;
    paths in a response would only tell a client how the server is built."""
    for line in text.splitlines():
        line = _TIMESTAMP.sub("", line)
        line = _SOURCE_LOCATION.sub("", line)
        line = _CHECK_FAILED.sub("", line)
        line = _PATH.sub("<path>", line).strip(" :")
        if line and not line.lower().startswith(("stack trace", "traceback")):
            return line
    return fallback
