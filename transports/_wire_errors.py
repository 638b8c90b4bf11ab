"""meshbus errors on the wire: the node sends a code and the attributes, the client
rebuilds the same class, so ``except AccessDeniedError`` works for remote sessions too."""

from __future__ import annotations

from typing import Any

from meshbus.errors import (
    AccessDeniedError,
    ConfigurationError,
    InvalidTopicError,
    LimitExceededError,
    MeshbusError,
    ProtocolError,
    PublishRejectedError,
    StateError,
)

__all__ = ["error_attributes", "error_code", "error_from"]

_ERROR_CODES: tuple[tuple[type[Exception], str], ...] = (
    (InvalidTopicError, "invalid-topic"),
    (AccessDeniedError, "access-denied"),
    (PublishRejectedError, "rejected"),
    (LimitExceededError, "limit-exceeded"),
    (StateError, "state"),
    (ProtocolError, "protocol"),
    (ConfigurationError, "configuration"),  # a bad setting a call gave (window, queue)
)


def error_code(exc: BaseException) -> str:
    """The wire code of a meshbus error (the client maps it back to the class)."""
    for cls, code in _ERROR_CODES:
        if isinstance(exc, cls):
            return code
    return "error"


def error_attributes(exc: BaseException) -> dict[str, Any]:
    """The attributes a client needs to rebuild ``exc`` as the same class."""
    if isinstance(exc, InvalidTopicError):
        return {"topic": exc.topic, "reason": exc.reason, "level": exc.level}
    if isinstance(exc, AccessDeniedError):
        return {"username": exc.username, "action": exc.action, "topic": exc.topic, "why": exc.why}
    if isinstance(exc, PublishRejectedError):
        return {"reason": exc.reason, "limit": exc.limit, "size": exc.size}
    if isinstance(exc, LimitExceededError):
        return {"limit": exc.limit}
    return {}


_CODES: dict[str, type[MeshbusError]] = {
    "invalid-topic": InvalidTopicError,
    "access-denied": AccessDeniedError,
    "rejected": PublishRejectedError,
    "limit-exceeded": LimitExceededError,
    "state": StateError,
    "protocol": ProtocolError,
    "configuration": ConfigurationError,
}


def error_from(header: dict[str, Any]) -> MeshbusError:
    """The error an ERROR frame stands for: the class the node raised, its attributes
    rebuilt, and the node's own message."""
    code = header.get("error")
    message = str(header.get("message", "request failed"))
    cls = _CODES.get(code, MeshbusError) if isinstance(code, str) else MeshbusError
    given = header.get("attrs")
    a: dict[str, Any] = given if isinstance(given, dict) else {}

    def text(key: str) -> str:
        value = a.get(key)
        return value if isinstance(value, str) else ""

    def number(key: str) -> int | None:
        value = a.get(key)
        return value if type(value) is int else None

    error: MeshbusError
    if cls is InvalidTopicError:
        error = InvalidTopicError(text("topic"), text("reason"), number("level"))
    elif cls is AccessDeniedError:
        error = AccessDeniedError(text("username"), text("action"), text("topic"), text("why"))
    elif cls is PublishRejectedError:
        error = PublishRejectedError(
            text("reason") or "rejected", "", number("limit"), number("size")
        )
    elif cls is LimitExceededError:
        error = LimitExceededError(message, number("limit") or 0)
    else:
        error = cls(message)
    error.args = (message,)  # the node's words, exactly
    return error
