"""SEND frames between the two ends of a link: a guaranteed message keeps everything.

A client's SEND carries what a publisher may set; over a link the message also keeps
its sender, timestamp, origin, hop count and expiry, as it was on the peer's node.
"""

from __future__ import annotations

from typing import Any

from meshbus._messages import HEADER_LIMITS, DeliveryMode, Message, make_message
from meshbus.errors import ProtocolError

from . import _events as ev
from ._codec import message_to_wire, options_from_wire, trail_from_wire

__all__ = ["link_send_header", "sent_message"]

_MODES = {True: "persistent", False: "non-persistent"}


def link_send_header(message: Message, now: float) -> dict[str, Any]:
    """A SEND header that keeps everything of ``message`` (link mode)."""
    wire = message_to_wire(message, now)
    header: dict[str, Any] = {key: value for key, value in wire.items() if key in _SEND_KEYS}
    header["topic"] = message.topic
    header["persistent"] = message.delivery_mode is DeliveryMode.PERSISTENT
    if message.sender is not None:
        header["s"] = message.sender
    if message.timestamp is not None:
        header["t"] = message.timestamp
    return header


_SEND_KEYS = frozenset({"h", "e", "r", "c", "o", "hc", "x", "rt", "rd"})


def sent_message(send: ev.Send, payload: bytes, now: float) -> Message:
    """The message a peer's SEND carries, as it was on the peer's node."""
    if send.topic is None:
        raise ProtocolError("a SEND over a link names a topic")
    wire = dict(send.options)
    sender = wire.pop("s", None)
    timestamp = wire.pop("t", None)
    if sender is not None and type(sender) is not str:
        raise ProtocolError("a SEND's sender must be a string")
    if timestamp is not None and type(timestamp) not in (int, float):
        raise ProtocolError("a SEND's timestamp must be a number")
    wire["m"] = _MODES[send.persistent]
    if send.headers:
        wire["h"] = send.headers
    origin, hop_count = trail_from_wire(wire)
    options = options_from_wire(wire, None, now)
    if options.size:  # as a session's send would be (SPEC 10)
        HEADER_LIMITS.check(options.headers, options.reply_to, options.correlation_id)
    return make_message(send.topic, payload, sender, timestamp, options, origin, hop_count)
