"""Messages (public, immutable by contract) and envelopes (internal, per hop).

A :class:`Message` is created once per publish and shared by every delivery,
so it must never change after creation. Making it a true ``attrs`` frozen class
would enforce that at run time, but a frozen init costs 0.6-1.0 µs here against
0.16 µs for a slotted class, which is more than the rest of a publish. So the
class is frozen for type checkers (assignments are type errors) and slotted at
run time. :class:`MessageOptions` is made the same way. Per-delivery variations (the
discard indication, the redelivered flag) are made with :meth:`Message.evolve` on the
rare paths that need them.

A message's origin and hop count are slots of the message, not options: they are
what changes when it crosses a link (every message gets an origin of its own), and
a copy with eight slots costs a third of new options of thirteen fields, on the path
every bridged message takes. The hop count a link *would* give a message, while its
stages decide, lives in the internal :class:`Envelope`.

What a message may carry besides its topic and payload is bounded by one
:class:`HeaderLimits` value, :data:`HEADER_LIMITS`, applied wherever messages come in
(sessions in the process, a node's connections, a remote client before it sends), so
that whatever one side accepts every other side can carry (SPEC 10). Checking the
headers also estimates the memory they take once parsed; that estimate travels in
:attr:`MessageOptions.size`, and :attr:`Message.size`, the whole size that egress
buffers and spool limits count, adds it to the payload's length once, when the
message is made, rather than at every delivery.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import orjson

from .errors import ConfigurationError, PublishRejectedError

__all__ = [
    "HEADER_LIMITS",
    "DeliveryMode",
    "Envelope",
    "HeaderLimits",
    "Message",
    "MessageOptions",
    "make_message",
]


class DeliveryMode(enum.Enum):
    """How the bus treats a message (SPEC 2 and 4)."""

    DIRECT = "direct"
    """At most once, never spooled."""
    NON_PERSISTENT = "non-persistent"
    """Guaranteed, spooled but may be held in memory."""
    PERSISTENT = "persistent"
    """Guaranteed, spooled durably before the publisher's ack."""


_EMPTY_HEADERS: Mapping[str, Any] = {}


if TYPE_CHECKING:
    from attrs import frozen as _value
else:

    def _value(**options: Any) -> Any:
        return attrs.define(slots=True, weakref_slot=False, **options)


@_value()
class MessageOptions:
    """The settings of a message that publishers rarely change, shared between messages.

    They live apart from :class:`Message` so that messages with the same settings share
    one value instead of storing each; read them through the message's properties.
    """

    delivery_mode: DeliveryMode = DeliveryMode.DIRECT
    """How the bus treats the message."""
    headers: Mapping[str, Any] = _EMPTY_HEADERS
    """Application headers (user properties); treat as read-only."""
    eliding_eligible: bool = False
    """The publisher allows the message to be elided (SPEC 5)."""
    reply_to: str | None = None
    """Topic a requester waits on for the reply."""
    correlation_id: str | None = None
    """Ties a reply to its request."""
    discard_indication: bool = False
    """Messages meant for this receiver were discarded just before it."""
    redelivered: bool = False
    """This guaranteed message was delivered before and not acknowledged."""
    message_id: int | None = None
    """The spool's id of a guaranteed message received from a queue (what acks name)."""
    destination: str | None = None
    """The queue a guaranteed message was received from."""
    expires_at: float | None = None
    """When it expires on this node's clock (``clock.time()`` seconds), or ``None``; on the
    wire it travels as the time left, so nodes need not agree on the time."""
    retain: bool = False
    """Published to be kept as its topic's last value (SPEC 12); live subscribers see the
    flag as published (an MQTT listener clears it unless retain-as-published)."""
    retained: bool = False
    """This delivery is a topic's kept last value, sent because a subscription is new."""
    size: int = attrs.field(default=0, eq=False, repr=False)
    """Bytes of memory the headers, reply-to and correlation id take, as estimated when
    the message came in (0 without them); part of :attr:`Message.size`. Derived from
    the other settings, so it takes no part in comparisons."""


DEFAULT_OPTIONS = MessageOptions()
ELIGIBLE_OPTIONS = MessageOptions(eliding_eligible=True)


# --- header limits ------------------------------------------------------------------


def _bytes_limit(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"HeaderLimits.{attribute.name} must be an int >= 1, got {value!r}"
        )


def _depth_limit(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # orjson writes at most 254 levels, and a frame wraps headers in up to three more.
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 250:
        raise ConfigurationError(
            f"HeaderLimits.{attribute.name} must be an int from 1 to 250, got {value!r}"
        )


@attrs.frozen
class HeaderLimits:
    """What one message may carry besides its topic and payload (SPEC 10).

    A message whose headers, reply-to and correlation id break these limits is
    refused with :class:`~meshbus.PublishRejectedError` where it comes in, so
    what a node accepts it can always write to a subscriber, and what a client
    sends the node accepts. The transports derive their frame limits from
    :data:`HEADER_LIMITS`, with room for what they wrap around a message.
    """

    max_bytes: int = attrs.field(default=64 * 1024, validator=_bytes_limit)
    """Most bytes the headers, reply-to and correlation id of one message take
    together, written as JSON."""
    max_depth: int = attrs.field(default=32, validator=_depth_limit)
    """Deepest nesting of objects and arrays in the headers; the headers object
    itself is level 1, so ``{"a": [1]}`` is 2 deep."""

    def check(
        self,
        headers: Mapping[str, Any] | None,
        reply_to: str | None = None,
        correlation_id: str | None = None,
    ) -> int:
        """Refuse settings over the limits; return the memory they take, in bytes.

        The result is an estimate of what the parsed headers and the two strings
        hold in memory (an upper bound for values read from JSON), the
        :attr:`MessageOptions.size` of a message carrying them. Values JSON cannot
        hold, which an in-process publisher may use, are measured by their length
        (bytes) or their text (anything else).

        :raises PublishRejectedError: ``"headers-too-large"`` or ``"headers-too-deep"``,
            with the limit and the size found (bytes, or levels).
        :raises TypeError: a reply-to or correlation id that is not a string, or
            headers that cannot be measured (integers beyond 64 bits).
        """
        return held_size(headers, reply_to, correlation_id, self)


HEADER_LIMITS = HeaderLimits()
"""The limits every meshbus node and client applies to message headers."""

# Bytes of memory per JSON token, at least: a parsed value never takes more than
# the JSON length plus these (measured with CPython 3.11 and orjson over every kind of
# value, the worst being small objects, empty containers and non-ASCII strings).
_CONTAINER_COST = 200  # per '{' or '[': a dict with its first table, a list, a pointer
_ITEM_COST = 32  # per ',' or ':': a number object and the pointer or table slot to it
_QUOTE_COST = 40  # per '"': half a string object's header (UCS-4 strings are the largest)
STRING_COST = 80
"""Bytes of memory a str object takes besides its characters (4 bytes each at most)."""
_CONTAINERS = (dict, list, tuple)
_count_options = orjson.OPT_NON_STR_KEYS


def held_size(
    headers: Mapping[str, Any] | None,
    reply_to: str | None,
    correlation_id: str | None,
    limits: HeaderLimits | None,
) -> int:
    """The memory estimate of a message's settings (:attr:`MessageOptions.size`),
    checked against ``limits`` unless it is ``None``. Without headers, the common case
    of a request (a reply-to, a correlation id), it takes a few operations."""
    if headers:
        return measure(headers, reply_to, correlation_id, limits)[1]
    if reply_to is None and correlation_id is None:
        return 0
    return texts_size(reply_to, correlation_id, 0, limits)


def measure(
    headers: Mapping[str, Any] | None,
    reply_to: str | None,
    correlation_id: str | None,
    limits: HeaderLimits | None,
    *,
    strict: bool = False,
) -> tuple[bytes, int]:
    """``(headers as JSON, memory estimate)`` of a message's settings, checked against
    ``limits`` unless it is ``None``. With ``strict`` the headers must be JSON as they
    are (what a client is about to send); otherwise other values are measured as
    :meth:`HeaderLimits.check` describes."""
    encoded = b""
    held = 0
    if headers:
        try:
            if strict:
                encoded = orjson.dumps(headers)
            else:
                encoded = orjson.dumps(headers, default=_opaque, option=_count_options)
        except orjson.JSONEncodeError as exc:
            # orjson stops at 255 levels (a cycle never ends): too deep, whatever the limit.
            if limits is not None and _depth(headers, limits.max_depth) > limits.max_depth:
                raise _too_deep(headers, limits) from None
            raise TypeError(f"message headers must be JSON-serializable: {exc}") from None
        if limits is not None:
            if len(encoded) > limits.max_bytes:
                raise _too_large(len(encoded), limits)
            # A value cannot be nested deeper than it has brackets: most headers skip the walk.
            if (
                encoded.count(b"{") + encoded.count(b"[") > limits.max_depth
                and _depth(headers, limits.max_depth) > limits.max_depth
            ):
                raise _too_deep(headers, limits)
        held = (
            len(encoded)
            + _CONTAINER_COST * (encoded.count(b"{") + encoded.count(b"["))
            + _ITEM_COST * (encoded.count(b",") + encoded.count(b":"))
            + _QUOTE_COST * encoded.count(b'"')
        )
    if reply_to is not None or correlation_id is not None:
        held += texts_size(reply_to, correlation_id, len(encoded), limits)
    return encoded, held


def texts_size(
    reply_to: str | None, correlation_id: str | None, used: int, limits: HeaderLimits | None
) -> int:
    """The memory estimate of a reply-to and a correlation id, checked against
    ``limits`` (unless ``None``) with ``used`` bytes taken by the headers already."""
    characters = held = 0
    if reply_to is not None:
        if type(reply_to) is not str:
            raise TypeError(f"reply_to must be a str, not {reply_to!r}")
        characters = len(reply_to)
        held = STRING_COST
    if correlation_id is not None:
        if type(correlation_id) is not str:
            raise TypeError(f"correlation_id must be a str, not {correlation_id!r}")
        characters += len(correlation_id)
        held += STRING_COST
    # JSON writes a character in at most 6 bytes: count exactly only near the limit.
    if limits is not None and used + 6 * characters + 4 > limits.max_bytes:
        used += sum(
            len(orjson.dumps(text)) for text in (reply_to, correlation_id) if text is not None
        )
        if used > limits.max_bytes:
            raise _too_large(used, limits)
    return held + 4 * characters


def _opaque(value: object) -> str:
    """How a value JSON cannot hold is measured: bytes by their length, others as text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return " " * len(value)
    return str(value)


def _depth(value: object, cap: int) -> int:
    """How deep ``value`` nests dicts, lists and tuples (0 for a scalar), up to ``cap + 1``.
    Level by level, not recursively: a hostile value must not exhaust the stack."""
    depth = 0
    level = [value]
    while depth <= cap:
        containers = [v for v in level if isinstance(v, _CONTAINERS)]
        if not containers:
            break
        depth += 1
        level = [c for v in containers for c in (v.values() if isinstance(v, dict) else v)]
    return depth


def _too_large(size: int, limits: HeaderLimits) -> PublishRejectedError:
    return PublishRejectedError(
        "headers-too-large",
        f"headers, reply-to and correlation id take {size} bytes as JSON, "
        f"more than {limits.max_bytes}",
        limits.max_bytes,
        size,
    )


def _too_deep(headers: object, limits: HeaderLimits) -> PublishRejectedError:
    depth = _depth(headers, 1024)
    found = f"{depth} levels" if depth <= 1024 else "more than 1024 levels"
    return PublishRejectedError(
        "headers-too-deep",
        f"headers are nested {found} deep, more than {limits.max_depth}",
        limits.max_depth,
        depth if depth <= 1024 else None,
    )


@_value(init=False, repr=False)
class Message:
    """One message as subscribers receive it. Immutable by contract (see module docs).

    Construct it with every setting as a keyword (``Message("t", b"x",
    eliding_eligible=True)``); the rarely changed ones are stored together in
    :attr:`options` and read through properties of the same names.
    """

    topic: str
    """The concrete topic it was published to."""
    payload: bytes
    """The body, as bytes."""
    sender: str | None
    """Client name of the publishing session, or ``None`` for system messages."""
    timestamp: float | None
    """Wall-clock publish time, seconds since the epoch, from the node's clock; ``None``
    for a direct message from a session opened without ``timestamps=True``. A
    guaranteed message carries the time the node took it."""
    options: MessageOptions
    """The rarely changed settings, shared between messages that have the same."""
    origin: tuple[str, int] | None
    """Where the message entered the mesh: ``(node id, message id)``, set once it crosses
    a link (or is spooled) and kept on every later hop; links drop a message whose origin
    they have seen recently (SPEC 7)."""
    hop_count: int
    """How many counted links it crossed (SPEC 9)."""
    size: int = attrs.field(eq=False)
    """Bytes counted against egress and spool limits: the payload's length plus the
    memory its headers, reply-to and correlation id take (:attr:`MessageOptions.size`).
    Worked out once, when the message is made: buffers read it at every delivery."""

    def __init__(
        self,
        topic: str,
        payload: bytes,
        delivery_mode: DeliveryMode = DeliveryMode.DIRECT,
        headers: Mapping[str, Any] = _EMPTY_HEADERS,
        eliding_eligible: bool = False,
        reply_to: str | None = None,
        correlation_id: str | None = None,
        sender: str | None = None,
        timestamp: float | None = None,
        discard_indication: bool = False,
        redelivered: bool = False,
        message_id: int | None = None,
        destination: str | None = None,
        origin: tuple[str, int] | None = None,
        hop_count: int = 0,
        expires_at: float | None = None,
        retain: bool = False,
        retained: bool = False,
    ) -> None:
        size = held_size(headers, reply_to, correlation_id, None)
        options = MessageOptions(
            delivery_mode,
            headers,
            eliding_eligible,
            reply_to,
            correlation_id,
            discard_indication,
            redelivered,
            message_id,
            destination,
            expires_at,
            retain,
            retained,
            size,
        )
        if options == DEFAULT_OPTIONS:  # share the common ones
            options = DEFAULT_OPTIONS
        self.topic = topic  # type: ignore[misc]
        self.payload = payload  # type: ignore[misc]
        self.sender = sender  # type: ignore[misc]
        self.timestamp = timestamp  # type: ignore[misc]
        self.options = options  # type: ignore[misc]
        self.origin = origin  # type: ignore[misc]
        self.hop_count = hop_count  # type: ignore[misc]
        self.size = len(payload) + size  # type: ignore[misc]

    @property
    def delivery_mode(self) -> DeliveryMode:
        """How the bus treats it."""
        return self.options.delivery_mode

    @property
    def headers(self) -> Mapping[str, Any]:
        """Application headers (user properties); treat as read-only."""
        return self.options.headers

    @property
    def eliding_eligible(self) -> bool:
        """The publisher allows this message to be elided (SPEC 5)."""
        return self.options.eliding_eligible

    @property
    def reply_to(self) -> str | None:
        """Topic a requester waits on for the reply."""
        return self.options.reply_to

    @property
    def correlation_id(self) -> str | None:
        """Ties a reply to its request."""
        return self.options.correlation_id

    @property
    def discard_indication(self) -> bool:
        """``True`` when messages meant for this receiver were discarded just before it."""
        return self.options.discard_indication

    @property
    def redelivered(self) -> bool:
        """``True`` when this guaranteed message was delivered before and not acknowledged."""
        return self.options.redelivered

    @property
    def message_id(self) -> int | None:
        """The spool's id of a guaranteed message received from a queue (what acks name)."""
        return self.options.message_id

    @property
    def destination(self) -> str | None:
        """The queue a guaranteed message was received from."""
        return self.options.destination

    @property
    def expires_at(self) -> float | None:
        """When it expires on this node's clock, or ``None``."""
        return self.options.expires_at

    @property
    def retain(self) -> bool:
        """Published to be kept as its topic's last value (SPEC 12)."""
        return self.options.retain

    @property
    def retained(self) -> bool:
        """A topic's kept last value, delivered because the subscription is new."""
        return self.options.retained

    def evolve(self, **changes: Any) -> Message:
        """A copy with some settings changed (not for the per-message path)."""
        current: dict[str, Any] = {
            "topic": self.topic,
            "payload": self.payload,
            "sender": self.sender,
            "timestamp": self.timestamp,
            "origin": self.origin,
            "hop_count": self.hop_count,
        }
        settings = attrs.asdict(self.options, recurse=False)
        size = settings.pop("size")
        unknown = set(changes) - set(current) - set(settings)
        if unknown:
            raise TypeError(f"Message has no field(s) {', '.join(sorted(unknown))}")
        if not _MEASURED.isdisjoint(changes):
            return Message(**{**current, **settings, **changes})
        for name, value in changes.items():
            (current if name in current else settings)[name] = value
        options = MessageOptions(**settings, size=size)
        if options == DEFAULT_OPTIONS and not size:
            options = DEFAULT_OPTIONS
        return make_message(
            current["topic"],
            current["payload"],
            current["sender"],
            current["timestamp"],
            options,
            current["origin"],
            current["hop_count"],
        )

    def __repr__(self) -> str:
        changed = [
            f"{name}={value!r}"
            for name, value in attrs.asdict(self.options, recurse=False).items()
            if value != getattr(DEFAULT_OPTIONS, name) and name != "size"
        ]
        if self.origin is not None:
            changed.append(f"origin={self.origin!r}")
        if self.hop_count:
            changed.append(f"hop_count={self.hop_count!r}")
        extra = "".join(", " + c for c in changed)
        return (
            f"Message(topic={self.topic!r}, payload={self.payload!r}, sender={self.sender!r}, "
            f"timestamp={self.timestamp!r}{extra})"
        )


_new = object.__new__
_MEASURED = frozenset({"headers", "reply_to", "correlation_id"})


def make_message(
    topic: str,
    payload: bytes,
    sender: str | None,
    timestamp: float | None,
    options: MessageOptions,
    origin: tuple[str, int] | None = None,
    hop_count: int = 0,
) -> Message:
    """The publish path's constructor: eight slot stores, no argument processing."""
    # Session.publish inlines the fenced part; tests/test_inline_copies.py compares them.
    # inline-source: build begin
    message: Message = _new(Message)
    message.topic = topic  # type: ignore[misc]
    message.payload = payload  # type: ignore[misc]
    message.sender = sender  # type: ignore[misc]
    message.timestamp = timestamp  # type: ignore[misc]
    message.options = options  # type: ignore[misc]
    message.origin = origin  # type: ignore[misc]
    message.hop_count = hop_count  # type: ignore[misc]
    message.size = len(payload) + options.size  # type: ignore[misc]
    # inline-source: build end
    return message


class Envelope:
    """Internal per-hop wrapper of a message on its way through one node.

    Mutable and never shared across hops: a link or bridge makes a new one.
    Routers must not keep an envelope after they return (a session reuses one
    for all its publishes); keep the message instead, or :meth:`copy` it.
    """

    __slots__ = ("endpoints", "hop_count", "message", "mode", "origin")

    def __init__(
        self,
        message: Message,
        origin: object,
        endpoints: tuple[str, ...] = (),
        mode: DeliveryMode = DeliveryMode.DIRECT,
    ) -> None:
        self.message = message
        #: The publishing session, or the link it arrived on.
        self.origin = origin
        #: The endpoints (queues, topic endpoints) that already hold this message.
        self.endpoints = endpoints
        #: What the message really is. A guaranteed publish is routed as its direct copy
        #: (what client subscriptions get) with its real mode here; routers that spool
        #: leave such a message alone (its endpoints were chosen when it was spooled).
        self.mode = mode
        #: The hop count a link would give it (set per link while it is forwarded).
        self.hop_count = message.hop_count if message is not None else 0

    @property
    def guaranteed(self) -> bool:
        """Whether it is a guaranteed message (routed as its direct copy)."""
        return self.mode is not DeliveryMode.DIRECT

    def copy(self) -> Envelope:
        """A new envelope with the same contents."""
        new = Envelope(self.message, self.origin, self.endpoints, self.mode)
        new.hop_count = self.hop_count
        return new

    def __repr__(self) -> str:
        return f"Envelope({self.message.topic!r}, origin={self.origin!r}, mode={self.mode.value})"
