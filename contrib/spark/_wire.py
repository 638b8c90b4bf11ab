"""The Spark connector's errors as they travel in the answers of the ``spark`` service.

A refusal of the service (an option, offsets no longer held, a bad request) comes back
as answer fields rather than a transport error, so that the data source raises the
same class the bridge raised: :class:`SparkOptionError` with its option,
:class:`OffsetsUnavailableError`, or :class:`BridgeError`.
"""

from __future__ import annotations

from typing import Any

from meshbus.errors import AccessDeniedError

from ._errors import BridgeError, OffsetsUnavailableError, SparkOptionError

__all__ = ["Body", "error_header", "raise_error"]

#: A request's or answer's body: Arrow IPC bytes, or anything with the buffer protocol.
Body = Any

_ERRORS: dict[str, type[BridgeError]] = {
    "OffsetsUnavailableError": OffsetsUnavailableError,
    "BridgeError": BridgeError,
}


def error_header(exc: BaseException) -> dict[str, Any]:
    """The answer fields that carry ``exc`` back to the data source."""
    if isinstance(exc, SparkOptionError):
        return {"error": "SparkOptionError", "option": exc.option, "why": exc.why}
    if isinstance(exc, AccessDeniedError):
        return {
            "error": "AccessDeniedError",
            "username": exc.username,
            "action": exc.action,
            "topic": exc.topic,
            "why": exc.why,
        }
    name = type(exc).__name__ if type(exc).__name__ in _ERRORS else "BridgeError"
    return {"error": name, "message": str(exc)}


def raise_error(header: dict[str, Any]) -> None:
    """Raise the error an answer carries, if it carries one."""
    error = header.get("error")
    if error is None:
        return
    if error == "SparkOptionError":
        raise SparkOptionError(str(header.get("option")), str(header.get("why")))
    if error == "AccessDeniedError":
        raise AccessDeniedError(
            str(header.get("username")),
            str(header.get("action")),
            str(header.get("topic", "")),
            str(header.get("why", "")),
        )
    raise _ERRORS.get(str(error), BridgeError)(str(header.get("message", error)))
