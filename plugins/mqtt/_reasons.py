"""MQTT 5 reason codes the listener answers with, and how a connection ends."""

from __future__ import annotations

__all__ = ["Closed"]

# Reason codes (MQTT 5) used here.
NOT_AUTHORIZED = 0x87
TOPIC_NAME_INVALID = 0x90
TOPIC_FILTER_INVALID = 0x8F
QUOTA_EXCEEDED = 0x97
UNSPECIFIED = 0x80
IMPLEMENTATION_SPECIFIC = 0x83
NO_SUBSCRIPTION = 0x11
PROTOCOL_ERROR = 0x82
KEEPALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
SERVER_SHUTTING_DOWN = 0x8B
RECEIVE_MAX_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
BAD_AUTH_METHOD = 0x8C


class Closed(Exception):
    """The connection ends: ``reason`` for the log, ``code`` for a DISCONNECT."""

    def __init__(self, reason: str, code: int | None = None) -> None:
        super().__init__(reason)
        self.code = code
