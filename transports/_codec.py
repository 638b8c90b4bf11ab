"""Messages to and from data frames.

Data frames carry an array header, shortest for the common message::

    PUBLISH       [topic]                                  or [topic, options]
    DELIVER       [topic, sender, timestamp]               or [..., options]
    FLOW_DELIVER  [flow, message_id, topic, sender, timestamp, options]
    PUBLISH_BATCH [[topic, size], [topic, size, options], ...]
    DELIVER_BATCH [[topic, sender, timestamp, size], [..., size, options], ...]

The batch frames carry the payloads joined in order, ``size`` bytes each. They
are how a busy connection moves direct messages: one header parse and one
frame per write instead of one per message. A batch that would be larger than
the frame the peer reads, or whose header would be over
:data:`~meshbus.transports._framing.HEADER_LIMIT`, is written as several frames;
a single message too large for the peer raises :class:`FrameTooLarge`.

``options`` is an object holding only what differs from the defaults, with
short keys (see :func:`options_to_wire`). Decoding checks every type before
building a :class:`~meshbus.Message`; anything else is a :class:`~meshbus.ProtocolError`.
Unknown option keys are ignored, so a newer peer may add some.

A message that crossed a link carries what it keeps across nodes there too: its
origin (``o``: ``[node id, message id]``), its hop count (``hc``) and the seconds
it has left to live (``x``: the time left, not a time of day, so the nodes need
not agree on the clock; each side converts with its own ``now``).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Mapping
from typing import Any

import orjson

from meshbus._messages import (
    DEFAULT_OPTIONS,
    STRING_COST,
    DeliveryMode,
    Message,
    MessageOptions,
    held_size,
)
from meshbus.errors import ProtocolError

from ._framing import HEADER_DEPTH_LIMIT, HEADER_LIMIT, FrameKind, too_deep

__all__ = [
    "FRAME_MESSAGES",
    "BATCH_LIMIT",
    "FrameTooLarge",
    "decode_deliver",
    "decode_deliver_batch",
    "decode_publish_batch",
    "encode_deliver_batch",
    "encode_publish_batch",
    "decode_flow_deliver",
    "decode_publish",
    "encode_deliver",
    "encode_flow_deliver",
    "encode_publish",
    "message_to_wire",
    "options_from_wire",
    "options_to_wire",
    "trail_from_wire",
]

_PREFIX = struct.Struct("!IBI")
_pack = _PREFIX.pack
_dumps = orjson.dumps
_new = object.__new__
_DELIVER = FrameKind.DELIVER
_PUBLISH = FrameKind.PUBLISH
_FLOW_DELIVER = FrameKind.FLOW_DELIVER
_PUBLISH_BATCH = FrameKind.PUBLISH_BATCH
_DELIVER_BATCH = FrameKind.DELIVER_BATCH
_MODES = {mode.value: mode for mode in DeliveryMode}


_UNLIMITED = 2**32 - 1  # what a frame's length field holds


class FrameTooLarge(ValueError):
    """A message does not fit in one frame the peer reads.

    :ivar size: the frame's length in bytes.
    :ivar limit: the largest frame the peer reads.
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"a frame of {size} bytes is larger than the peer reads ({limit})")
        self.size = size
        self.limit = limit


def _frame(kind: int, head: bytes, payload: bytes) -> bytes:
    return _pack(5 + len(head) + len(payload), kind, len(head)) + head + payload


def _fitting(kind: int, head: bytes, payload: bytes, max_frame: int) -> bytes:
    """One frame, or :class:`FrameTooLarge` if the peer would refuse it."""
    size = 9 + len(head) + len(payload)
    if size > max_frame or len(head) > HEADER_LIMIT:
        raise FrameTooLarge(size, max_frame)
    return _pack(size - 4, kind, len(head)) + head + payload


# --- options ----------------------------------------------------------------------


def options_to_wire(options: MessageOptions, now: float | None = None) -> dict[str, Any]:
    """The non-default settings of ``options``, with wire keys.

    :param now: the sender's clock time, for the time a message has left to live
        (default: :func:`time.time`).
    """
    wire: dict[str, Any] = {}
    if options.delivery_mode is not DeliveryMode.DIRECT:
        wire["m"] = options.delivery_mode.value
    if options.headers:
        wire["h"] = options.headers
    if options.eliding_eligible:
        wire["e"] = True
    if options.reply_to is not None:
        wire["r"] = options.reply_to
    if options.correlation_id is not None:
        wire["c"] = options.correlation_id
    if options.discard_indication:
        wire["d"] = True
    if options.redelivered:
        wire["rd"] = True
    if options.destination is not None:
        wire["q"] = options.destination
    if options.retain:
        wire["rt"] = True
    if options.retained:
        wire["rtd"] = True
    if options.expires_at is not None:
        left = options.expires_at - (time.time() if now is None else now)
        wire["x"] = left if left > 0 else 0
    return wire


def message_to_wire(message: Message, now: float | None = None) -> dict[str, Any]:
    """The wire keys of ``message``'s options, its origin and its hop count."""
    options = message.options
    # Most messages crossing a link have nothing but their trail: no options to look at.
    wire = {} if options is DEFAULT_OPTIONS else options_to_wire(options, now)
    if message.origin is not None:
        wire["o"] = message.origin
    if message.hop_count:
        wire["hc"] = message.hop_count
    return wire


def trail_from_wire(wire: Any) -> tuple[tuple[str, int] | None, int]:
    """``(origin, hop count)`` from wire keys (a message's trail through the mesh);
    :class:`ProtocolError` on bad types."""
    if type(wire) is not dict:
        raise ProtocolError("message options must be an object")
    origin = wire.get("o")
    if origin is not None:
        if (
            type(origin) is not list
            or len(origin) != 2
            or type(origin[0]) is not str
            or type(origin[1]) is not int
        ):
            raise ProtocolError("message origin must be [node id, message id]")
        origin = (origin[0], origin[1])
    hop_count = _check(wire.get("hc", 0), int, "hop count")
    if hop_count < 0:
        raise ProtocolError("message hop count must not be negative")
    return origin, hop_count


_OPTION_DEPTH = HEADER_DEPTH_LIMIT - 3  # a batch, its entry and the options hold each value


def _check_nesting(value: Any) -> None:
    """Refuse a value of a batch entry's options (a container) nested deeper than any
    frame may be: the frame decoder leaves batches to this, as only options can nest."""
    if too_deep(value, _OPTION_DEPTH):
        raise ProtocolError(f"frame header is nested deeper than {HEADER_DEPTH_LIMIT} levels")


def _check(value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ProtocolError(f"message {what} has the wrong type ({type(value).__name__})")
    return value


def options_from_wire(
    wire: Any, message_id: int | None = None, now: float | None = None
) -> MessageOptions:
    """:class:`MessageOptions` from wire keys; :class:`ProtocolError` on bad types (the
    origin and hop count are the message's own: see :func:`trail_from_wire`).

    :param now: the receiver's clock time, which a time to live left counts from
        (default: :func:`time.time`).
    """
    if type(wire) is not dict:
        raise ProtocolError("message options must be an object")
    mode_name = wire.get("m", "direct")
    mode = _MODES.get(mode_name) if type(mode_name) is str else None  # [] is unhashable
    if mode is None:
        raise ProtocolError(f"unknown delivery mode {wire.get('m')!r}")
    headers = wire.get("h", {})
    _check(headers, dict, "headers")
    # What a buffer holds of them (MessageOptions.size), as held_size() reckons it.
    size = held_size(headers, None, None, None) if headers else 0
    reply_to = wire.get("r")
    if reply_to is not None:
        _check(reply_to, str, "reply_to")
        size += STRING_COST + 4 * len(reply_to)
    correlation_id = wire.get("c")
    if correlation_id is not None:
        _check(correlation_id, str, "correlation_id")
        size += STRING_COST + 4 * len(correlation_id)
    destination = wire.get("q")
    if destination is not None:
        _check(destination, str, "destination")
    expires_at = None
    left = wire.get("x")
    if left is not None:
        if not 0 <= _check(left, (int, float), "time to live") < float("inf"):
            raise ProtocolError("message time to live must be a finite number >= 0")
        expires_at = (time.time() if now is None else now) + left
    return MessageOptions(
        mode,
        headers,
        _check(wire.get("e", False), bool, "eliding flag"),
        reply_to,
        correlation_id,
        _check(wire.get("d", False), bool, "discard indication"),
        _check(wire.get("rd", False), bool, "redelivered flag"),
        message_id,
        destination,
        expires_at,
        _check(wire.get("rt", False), bool, "retain flag"),
        _check(wire.get("rtd", False), bool, "retained flag"),
        size,
    )


# --- client to node -----------------------------------------------------------------


def encode_publish(
    topic: str,
    payload: bytes,
    headers: Mapping[str, Any] | None = None,
    eliding_eligible: bool = False,
    reply_to: str | None = None,
    correlation_id: str | None = None,
) -> bytes:
    """A PUBLISH frame for a direct message."""
    wire = publish_options(headers, eliding_eligible, reply_to, correlation_id)
    if wire is None:
        return _frame(_PUBLISH, _dumps((topic,)), payload)
    try:
        head = _dumps((topic, wire))
    except TypeError as exc:  # orjson: a header value it cannot serialize
        raise TypeError(f"message headers must be JSON-serializable: {exc}") from None
    return _frame(_PUBLISH, head, payload)


def decode_publish(header: list[Any]) -> tuple[str, dict[str, Any] | None]:
    """``(topic, options or None)`` of a PUBLISH header, types checked."""
    n = len(header)
    if n == 1:
        topic = header[0]
        options = None
    elif n == 2:
        topic, options = header
        if type(options) is not dict:
            raise ProtocolError("PUBLISH options must be an object")
    else:
        raise ProtocolError(f"PUBLISH header has {n} items, not 1 or 2")
    if type(topic) is not str:
        raise ProtocolError("PUBLISH topic must be a string")
    return topic, options


# --- node to client -----------------------------------------------------------------


def encode_deliver(
    message: Message, max_frame: int = _UNLIMITED, now: float | None = None
) -> bytes:
    """A DELIVER frame for a message a remote session receives.

    :param now: the sender's clock time (for the time the message has left to live).
    :raises FrameTooLarge: the frame would be longer than ``max_frame`` (what the
        peer reads), or its header longer than ``HEADER_LIMIT``.
    """
    if message.options is DEFAULT_OPTIONS and message.origin is None and not message.hop_count:
        head = _dumps((message.topic, message.sender, message.timestamp))
    else:
        wire = message_to_wire(message, now)
        head = _dumps((message.topic, message.sender, message.timestamp, wire))
    return _fitting(_DELIVER, head, message.payload, max_frame)


def decode_deliver(header: list[Any], payload: bytes, now: float | None = None) -> Message:
    """The :class:`Message` of a DELIVER frame, types checked."""
    n = len(header)
    if n == 3:
        topic, sender, timestamp = header
        return _message(topic, payload, sender, timestamp, DEFAULT_OPTIONS, None, 0)
    if n == 4:
        topic, sender, timestamp, wire = header
        origin, hop_count = trail_from_wire(wire)
        options = _options(wire, None, now)
        return _message(topic, payload, sender, timestamp, options, origin, hop_count)
    raise ProtocolError(f"DELIVER header has {n} items, not 3 or 4")


def encode_flow_deliver(
    flow: int, message_id: int, message: Message, now: float | None = None
) -> bytes:
    """A FLOW_DELIVER frame: a guaranteed message on flow ``flow``."""
    head = _dumps(
        (
            flow,
            message_id,
            message.topic,
            message.sender,
            message.timestamp,
            message_to_wire(message, now),
        )
    )
    return _frame(_FLOW_DELIVER, head, message.payload)


def decode_flow_deliver(
    header: list[Any], payload: bytes, now: float | None = None
) -> tuple[int, Message]:
    """``(flow, message)`` of a FLOW_DELIVER frame; the message carries its id."""
    if len(header) != 6:
        raise ProtocolError(f"FLOW_DELIVER header has {len(header)} items, not 6")
    flow, message_id, topic, sender, timestamp, wire = header
    _check(flow, int, "flow")
    _check(message_id, int, "id")
    origin, hop_count = trail_from_wire(wire)
    options = options_from_wire(wire, message_id, now)
    message = _message(topic, payload, sender, timestamp, options, origin, hop_count)
    return flow, message


_TRAIL_KEYS = frozenset({"o", "hc"})


def _options(wire: dict[str, Any], message_id: int | None, now: float | None) -> MessageOptions:
    """:func:`options_from_wire`, sharing the default options when ``wire`` holds
    nothing but the message's trail (what most messages crossing a link carry)."""
    if message_id is None and _TRAIL_KEYS.issuperset(wire):
        return DEFAULT_OPTIONS
    return options_from_wire(wire, message_id, now)


def _message(
    topic: Any,
    payload: bytes,
    sender: Any,
    timestamp: Any,
    options: MessageOptions,
    origin: tuple[str, int] | None,
    hop_count: int,
) -> Message:
    if type(topic) is not str:
        raise ProtocolError("message topic must be a string")
    if sender is not None and type(sender) is not str:
        raise ProtocolError("message sender must be a string or null")
    if timestamp is not None and type(timestamp) is not float and type(timestamp) is not int:
        raise ProtocolError("message timestamp must be a number or null")
    message = _new(Message)
    message.topic = topic  # type: ignore[misc]
    message.payload = payload  # type: ignore[misc]
    message.sender = sender  # type: ignore[misc]
    message.timestamp = timestamp  # type: ignore[misc]
    message.options = options  # type: ignore[misc]
    message.origin = origin  # type: ignore[misc]
    message.hop_count = hop_count  # type: ignore[misc]
    message.size = len(payload) + options.size  # type: ignore[misc]
    return message


# --- batches ----------------------------------------------------------------------

PublishEntry = tuple[str, bytes, "dict[str, Any] | None"]
"""A direct publish waiting to be written: topic, payload, wire options or ``None``."""


def publish_options(
    headers: Mapping[str, Any] | None,
    eliding_eligible: bool,
    reply_to: str | None,
    correlation_id: str | None,
) -> dict[str, Any] | None:
    """The wire options of a direct publish, ``None`` for the defaults."""
    if headers is None and not eliding_eligible and reply_to is None and correlation_id is None:
        return None
    wire: dict[str, Any] = {}
    if headers:
        wire["h"] = dict(headers)
    if eliding_eligible:
        wire["e"] = True
    if reply_to is not None:
        wire["r"] = reply_to
    if correlation_id is not None:
        wire["c"] = correlation_id
    return wire


BATCH_LIMIT = 4096
"""Messages per batch frame (PUBLISH_BATCH, DELIVER_BATCH), at most: a frame with more
is refused. A frame is decoded in one step, so this bounds how long one frame holds
the reader's loop."""


def encode_publish_batch(entries: list[PublishEntry], max_frame: int = _UNLIMITED) -> bytes:
    """PUBLISH_BATCH frames for ``entries`` (in order): one, or more when one would be
    longer than ``max_frame`` (what the node reads), its header over ``HEADER_LIMIT`` or
    its messages more than :data:`BATCH_LIMIT`.

    :raises FrameTooLarge: an entry does not fit in a frame on its own.
    """
    head = [
        (topic, len(payload)) if options is None else (topic, len(payload), options)
        for topic, payload, options in entries
    ]
    try:
        header = _dumps(head)
    except TypeError as exc:
        raise TypeError(f"message headers must be JSON-serializable: {exc}") from None
    payload = b"".join([e[1] for e in entries])
    if (
        9 + len(header) + len(payload) <= max_frame
        and len(header) <= HEADER_LIMIT
        and len(entries) <= BATCH_LIMIT
    ):
        return _frame(_PUBLISH_BATCH, header, payload)
    if len(entries) == 1:
        raise FrameTooLarge(9 + len(header) + len(payload), max_frame)
    half = len(entries) // 2  # rare: halve until each part fits
    return encode_publish_batch(entries[:half], max_frame) + encode_publish_batch(
        entries[half:], max_frame
    )


def _over_batch_limit(kind: str, count: int) -> ProtocolError:
    return ProtocolError(f"{kind} holds {count} messages, more than the limit of {BATCH_LIMIT}")


def decode_publish_batch(header: list[Any], payload: bytes) -> list[PublishEntry]:
    """The entries of a PUBLISH_BATCH frame, sizes and types checked."""
    if len(header) > BATCH_LIMIT:
        raise _over_batch_limit("PUBLISH_BATCH", len(header))
    entries: list[PublishEntry] = []
    offset = 0
    total = len(payload)
    for item in header:
        if type(item) is not list or not 2 <= len(item) <= 3:
            raise ProtocolError(
                "PUBLISH_BATCH entry must be [topic, size] or [topic, size, options]"
            )
        topic = item[0]
        size = item[1]
        if type(topic) is not str or type(size) is not int or size < 0:
            raise ProtocolError("PUBLISH_BATCH entry has a malformed topic or size")
        end = offset + size
        if end > total:
            raise ProtocolError("PUBLISH_BATCH sizes exceed the payload")
        options = item[2] if len(item) == 3 else None
        if options is not None:
            if type(options) is not dict:
                raise ProtocolError("PUBLISH_BATCH options must be an object")
            for value in options.values():  # only a container calls: most hold none
                if type(value) is dict or type(value) is list:
                    _check_nesting(value)
        entries.append((topic, payload[offset:end], options))
        offset = end
    if offset != total:
        raise ProtocolError("PUBLISH_BATCH sizes do not add up to the payload")
    return entries


FRAME_MESSAGES = 1024
"""Messages per DELIVER_BATCH frame, at most. A link's writer may find tens of thousands
waiting; in one frame their header passed ``HEADER_LIMIT`` (so it was encoded again in
halves) and the peer's decoding of it cost a third more a message."""


def encode_deliver_batch(
    messages: list[Message],
    max_frame: int = _UNLIMITED,
    *,
    hops: list[int] | None = None,
    now: float | None = None,
) -> bytes:
    """DELIVER_BATCH frames for ``messages`` (in order): one for each
    :data:`FRAME_MESSAGES`, or more when one would be longer than ``max_frame`` (what
    the peer reads) or its header over ``HEADER_LIMIT``.

    :param hops: on a link, the hop count each message crosses it with (its own,
        plus what the link's stages added), in the order of ``messages``.
    :param now: the sender's clock time (for the time messages have left to live).
    :raises FrameTooLarge: a message does not fit in a frame on its own.
    """
    if len(messages) > FRAME_MESSAGES:
        n = FRAME_MESSAGES
        return b"".join(
            [
                encode_deliver_batch(
                    messages[i : i + n],
                    max_frame,
                    hops=None if hops is None else hops[i : i + n],
                    now=now,
                )
                for i in range(0, len(messages), n)
            ]
        )
    if hops is None:
        head = [
            (m.topic, m.sender, m.timestamp, len(m.payload))
            if m.options is DEFAULT_OPTIONS and m.origin is None and not m.hop_count
            else (m.topic, m.sender, m.timestamp, len(m.payload), message_to_wire(m, now))
            for m in messages
        ]
    else:
        head = [_link_entry(m, hop, now) for m, hop in zip(messages, hops, strict=True)]
    header = _dumps(head)
    payload = b"".join([m.payload for m in messages])
    if 9 + len(header) + len(payload) <= max_frame and len(header) <= HEADER_LIMIT:
        return _frame(_DELIVER_BATCH, header, payload)
    if len(messages) == 1:
        raise FrameTooLarge(9 + len(header) + len(payload), max_frame)
    half = len(messages) // 2  # rare: halve until each part fits
    first, rest = (None, None) if hops is None else (hops[:half], hops[half:])
    return encode_deliver_batch(
        messages[:half], max_frame, hops=first, now=now
    ) + encode_deliver_batch(messages[half:], max_frame, hops=rest, now=now)


def _link_entry(message: Message, hop_count: int, now: float | None) -> tuple[Any, ...]:
    """A DELIVER_BATCH entry for a message crossing a link with ``hop_count``."""
    options = message.options
    origin = message.origin
    if options is DEFAULT_OPTIONS:
        if origin is None and not hop_count:
            return (message.topic, message.sender, message.timestamp, len(message.payload))
        wire: dict[str, Any] = {"o": origin} if origin is not None else {}
    else:
        wire = options_to_wire(options, now)
        if origin is not None:
            wire["o"] = origin
    if hop_count:
        wire["hc"] = hop_count
    return (message.topic, message.sender, message.timestamp, len(message.payload), wire)


def _origin_only(wire: Any) -> tuple[tuple[str, int], int] | None:
    """The origin and hop count of what a link mostly carries, a plain message that
    has nothing else, read without :func:`options_from_wire`'s checks of every other
    key; ``None`` for any other options (those go the general way)."""
    if type(wire) is not dict:
        return None
    origin = wire.get("o")
    n = len(wire)
    if type(origin) is not list or n > 2:
        return None
    hop_count: Any = 0
    if n == 2:
        hop_count = wire.get("hc")
        if type(hop_count) is not int or hop_count < 0:
            return None  # absent or bad: the general way finds which, and says so
    if len(origin) != 2 or type(origin[0]) is not str or type(origin[1]) is not int:
        return None
    return (origin[0], origin[1]), hop_count


def decode_deliver_batch(
    header: list[Any], payload: bytes, now: float | None = None
) -> list[Message]:
    """The messages of a DELIVER_BATCH frame, sizes and types checked."""
    if len(header) > BATCH_LIMIT:
        raise _over_batch_limit("DELIVER_BATCH", len(header))
    messages: list[Message] = []
    append = messages.append
    offset = 0
    total = len(payload)
    for item in header:
        if type(item) is not list:
            raise ProtocolError("DELIVER_BATCH entry must be an array")
        n = len(item)
        if n == 4:
            topic, sender, timestamp, size = item
            options = DEFAULT_OPTIONS
            origin = None
            hop_count = 0
        elif n == 5:
            topic, sender, timestamp, size, wire = item
            trail = _origin_only(wire)
            if trail is not None:
                options = DEFAULT_OPTIONS
                origin, hop_count = trail
            else:
                origin, hop_count = trail_from_wire(wire)
                options = _options(wire, None, now)
                for value in wire.values():  # only a container calls: most hold none
                    if type(value) is dict or type(value) is list:
                        _check_nesting(value)
        else:
            raise ProtocolError(f"DELIVER_BATCH entry has {n} items, not 4 or 5")
        if type(size) is not int or size < 0 or offset + size > total:
            raise ProtocolError("DELIVER_BATCH entry has a bad size")
        if (
            type(topic) is not str
            or (sender is not None and type(sender) is not str)
            or (
                timestamp is not None
                and type(timestamp) is not float
                and type(timestamp) is not int
            )
        ):
            raise ProtocolError("DELIVER_BATCH entry has a malformed topic, sender or timestamp")
        end = offset + size
        message = _new(Message)
        message.topic = topic  # type: ignore[misc]
        message.payload = payload[offset:end]  # type: ignore[misc]
        message.sender = sender  # type: ignore[misc]
        message.timestamp = timestamp  # type: ignore[misc]
        message.options = options  # type: ignore[misc]
        message.origin = origin  # type: ignore[misc]
        message.hop_count = hop_count  # type: ignore[misc]
        message.size = size + options.size  # type: ignore[misc]
        append(message)
        offset = end
    if offset != total:
        raise ProtocolError("DELIVER_BATCH sizes do not add up to the payload")
    return messages
