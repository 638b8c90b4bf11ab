"""MQTT wills: what a client asks the node to publish for it when its connection ends
without a normal DISCONNECT.

A will goes once its delay (MQTT 5's will delay interval; none in 3.1.1) is up or its
session ends, whichever is first, and not at all if the client connects again before
(MQTT 5, 3.1.2.5 and 3.1.3.2). MQTT 5 counts a will that waits as part of the session,
so it is kept in the session's file (:mod:`._saved_sessions`): a node that stops or
crashes while a will waits publishes it after the restart when its time comes (or at
once when it came while the node was down), unless the client came back first. A will
that waits is published as its client's username, with its profiles as they are then.
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any

import attrs

from meshbus import ClientUsername, MeshbusError, Session

from ._translate import publish_options

__all__ = ["PendingWill", "publish_will"]

log = logging.getLogger("meshbus.mqtt")

_OPTION_KEYS = frozenset({"headers", "reply_to", "correlation_id"})


@attrs.frozen
class PendingWill:
    """A client's will, as the node publishes it."""

    topic: str
    payload: bytes
    qos: int
    """0: published as a direct message; 1 or 2: sent as a guaranteed one."""
    retain: bool
    delay: int
    """Seconds from the end of the connection (MQTT 5's will delay interval)."""
    ttl: int | None
    """MQTT 5's message expiry interval."""
    options: dict[str, Any]
    """``headers``, ``reply_to``, ``correlation_id``: its MQTT 5 properties."""
    username: str
    """Who it is published as."""
    user: ClientUsername | None = attrs.field(default=None, eq=False)
    """The username's settings at the login that set it (not saved: after a restart,
    the configured username's)."""

    @classmethod
    def of(cls, will: Any, v5: bool, username: str, user: ClientUsername) -> PendingWill:
        """The will of a CONNECT packet (MQTT 3.1.1 has no delay and no properties)."""
        return cls(
            will.topic,
            bytes(will.payload or b""),
            int(will.qos),
            bool(will.retain),
            will.will_delay_interval if v5 else 0,
            will.message_expiry_interval if v5 else None,
            publish_options(will) if v5 else {},
            username,
            user,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "payload": base64.b64encode(self.payload).decode("ascii"),
            "qos": self.qos,
            "retain": self.retain,
            "delay": self.delay,
            "ttl": self.ttl,
            "options": self.options,
            "username": self.username,
        }

    @classmethod
    def from_json(cls, raw: object) -> PendingWill:
        """Read what :meth:`to_json` wrote; :class:`ValueError` saying what is wrong."""
        if not isinstance(raw, dict):
            raise ValueError(f"bad will {raw!r}")
        topic, username = raw.get("topic"), raw.get("username")
        if not isinstance(topic, str) or not topic or not isinstance(username, str):
            raise ValueError("bad will topic or username")
        try:
            payload = base64.b64decode(raw.get("payload", ""), validate=True)
        except (binascii.Error, TypeError) as exc:
            raise ValueError(f"bad will payload: {exc}") from None
        qos, retain = raw.get("qos"), raw.get("retain")
        delay, ttl = raw.get("delay"), raw.get("ttl")
        if qos not in (0, 1, 2) or not isinstance(retain, bool):
            raise ValueError("bad will qos or retain")
        if not isinstance(delay, int) or not _seconds(delay) or not (ttl is None or _seconds(ttl)):
            raise ValueError("bad will delay or ttl")
        options = raw.get("options")
        if not isinstance(options, dict) or not set(options) <= _OPTION_KEYS:
            raise ValueError("bad will options")
        headers = options.get("headers", {})
        if not isinstance(headers, dict) or not all(
            isinstance(k, str) and _property_value(v) for k, v in headers.items()
        ):
            raise ValueError("bad will headers")
        for key in ("reply_to", "correlation_id"):
            if not isinstance(options.get(key, ""), str):
                raise ValueError(f"bad will {key}")
        return cls(topic, payload, qos, retain, delay, ttl, options, username)


def _property_value(value: object) -> bool:
    """Whether ``value`` is what a will's user property name holds as a header: a
    string, or a list of them for a name that came more than once."""
    if isinstance(value, list):
        return len(value) > 1 and all(isinstance(v, str) for v in value)
    return isinstance(value, str)


def _seconds(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFFFFFF


async def publish_will(session: Session, will: PendingWill, client_id: str) -> bool:
    """Publish ``will`` through ``session``; whether the node took it (a refusal is
    logged: a will has no one to answer)."""
    try:
        if will.qos:
            await session.send(
                will.topic, will.payload, ttl=will.ttl, retain=will.retain, **will.options
            )
        else:
            session.publish(
                will.topic, will.payload, retain=will.retain, ttl=will.ttl, **will.options
            )
    except MeshbusError as exc:
        log.warning("will of MQTT client %r not published: %s", client_id, exc)
        return False
    return True
