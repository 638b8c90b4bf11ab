"""Every error meshbus raises, under one base class.

The hierarchy::

    MeshbusError
    ├── ConfigurationError          a setting, profile or plugin composition is invalid
    │   └── PluginError             a plugin could not be found, loaded or registered
    ├── StateError                  the object is not in a state that allows the call
    │                               (node not running, session closed, duplicate name)
    ├── InvalidTopicError           a topic or subscription filter breaks SPEC section 1
    ├── AccessDeniedError           an ACL profile forbids the publish or subscribe
    │   └── AuthenticationError     login refused: unknown user, wrong password
    ├── LimitExceededError          a configured maximum would be exceeded (limit)
    ├── PublishRejectedError        the bus refused a message (reason, limit, size)
    ├── TransportError              a link or stream failed
    │   └── ProtocolError           a peer sent something the protocol does not allow
    └── SpoolError                  the guaranteed-message store failed

Errors carry their data as attributes so callers never parse messages.
"""

from __future__ import annotations

__all__ = [
    "AccessDeniedError",
    "AuthenticationError",
    "ConfigurationError",
    "InvalidTopicError",
    "LimitExceededError",
    "MeshbusError",
    "PluginError",
    "ProtocolError",
    "PublishRejectedError",
    "SpoolError",
    "StateError",
    "TransportError",
]


class MeshbusError(Exception):
    """Base class of every error raised by meshbus."""


class ConfigurationError(MeshbusError):
    """A setting, profile or composition is invalid.

    :ivar problems: every problem found, one string each (a configuration is
        validated as a whole, so all of them are reported at once).
    """

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems: list[str] = problems if problems is not None else [message]


class PluginError(ConfigurationError):
    """A plugin could not be found, loaded or registered.

    :ivar plugin: the name or object that failed.
    """

    def __init__(self, message: str, plugin: object = None) -> None:
        super().__init__(message)
        self.plugin = plugin


class StateError(MeshbusError):
    """The object is not in a state that allows the call."""


class InvalidTopicError(MeshbusError, ValueError):
    """A topic or subscription filter is not valid.

    :ivar topic: the offending topic or filter, as given.
    :ivar level: 1-based index of the offending level, or ``None`` when the
        problem is not tied to one level (empty, too long, too many levels).
    :ivar reason: a short explanation.
    """

    def __init__(self, topic: str, reason: str, level: int | None = None) -> None:
        where = f" (level {level})" if level is not None else ""
        super().__init__(f"invalid topic {topic!r}{where}: {reason}")
        self.topic = topic
        self.level = level
        self.reason = reason


class AccessDeniedError(MeshbusError):
    """An ACL profile denies the operation; nothing was changed.

    :ivar username: the client username whose ACL profile applied.
    :ivar action: ``"publish"``, ``"subscribe"`` or ``"connect"``.
    :ivar topic: the topic or filter concerned (empty for ``connect``).
    :ivar why: the reason, when one was given.
    """

    def __init__(self, username: str, action: str, topic: str = "", why: str = "") -> None:
        what = f" to {topic!r}" if topic else ""
        extra = f": {why}" if why else ""
        super().__init__(f"{action}{what} denied for user {username!r}{extra}")
        self.username = username
        self.action = action
        self.topic = topic
        self.why = why


class AuthenticationError(AccessDeniedError):
    """A login was refused (unknown VPN or user, wrong password, disabled user).

    A client is told ``why``, which for a failed authentication is the same
    whatever went wrong, so that it cannot tell whether the username exists
    (SPEC 6).

    :ivar reason: what really went wrong, for the node's log; never sent to a
        client. The same as ``why`` unless the refusal hides it.
    """

    def __init__(self, username: str, why: str, reason: str | None = None) -> None:
        super().__init__(username, "connect", why=why)
        self.reason = why if reason is None else reason


class LimitExceededError(MeshbusError):
    """A configured maximum would be exceeded; nothing was changed.

    :ivar limit: the maximum that applies.
    """

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class PublishRejectedError(MeshbusError):
    """The bus refused a message; it was not stored or delivered.

    :ivar reason: machine-readable reason, e.g. ``"too-large"``, ``"no-such-queue"``.
    :ivar limit: the limit that was hit, when there is one.
    :ivar size: the size or count that exceeded it, when there is one.
    """

    def __init__(
        self, reason: str, detail: str = "", limit: int | None = None, size: int | None = None
    ) -> None:
        super().__init__(f"publish rejected ({reason}){': ' + detail if detail else ''}")
        self.reason = reason
        self.limit = limit
        self.size = size


class TransportError(MeshbusError):
    """A link or stream failed."""


class ProtocolError(TransportError):
    """A peer sent something the link protocol does not allow."""


class SpoolError(MeshbusError):
    """The guaranteed-message store failed."""
