"""Messages (public, immutable by contract) and envelopes (internal, per hop).

A :class:`Message` is created once per publish and shared by every delivery,
so it must never change after creation. Making it a true ``attrs`` frozen class
would enforce that at run time, but a frozen init costs 0.6-1.0 µs here against
0.16 µs for a slotted class, which is more than the rest of a publish. So the
class is frozen for type checkers (assignments are type errors) and slotted at
run time; per-delivery variations (the discard indication, the redelivered
flag) are made with :meth:`Message.evolve` on the rare paths that need them.

Per-hop mutable state (hop count, the link a message came in on) lives in the
internal :class:`Envelope`, never in the message.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

__all__ = ["DeliveryMode", "Envelope", "Message", "MessageOptions", "make_message"]


class DeliveryMode(enum.Enum):
    """How the bus treats a message (SPEC 2 and 4)."""

    DIRECT = "direct"
    """At most once, never spooled."""
    NON_PERSISTENT = "non-persistent"
    """Guaranteed, spooled but may be held in memory."""
    PERSISTENT = "persistent"
    """Guaranteed, spooled durably before the publisher's ack."""


_EMPTY_HEADERS: Mapping[str, Any] = {}


@attrs.frozen
class MessageOptions:
    """The settings of a message that publishers rarely change, shared between messages.

    They live apart from :class:`Message` so that a plain publish stores five
    references instead of eleven; read them through the message's properties.
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
    origin: tuple[str, int] | None = None
    """Where the message entered the mesh: ``(node id, message id)``, set once it crosses
    a link (or is spooled) and kept on every later hop; links drop a message whose origin
    they have seen recently (SPEC 7)."""
    hop_count: int = 0
    """Links it crossed that count hops (SPEC 9)."""
    expires_at: float | None = None
    """When it expires on this node's clock (``clock.time()`` seconds), or ``None``; on the
    wire it travels as the time left, so nodes need not agree on the time."""


DEFAULT_OPTIONS = MessageOptions()
ELIGIBLE_OPTIONS = MessageOptions(eliding_eligible=True)

if TYPE_CHECKING:
    from attrs import frozen as _value
else:

    def _value(**options: Any) -> Any:
        return attrs.define(slots=True, weakref_slot=False, **options)


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
    ) -> None:
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
            origin,
            hop_count,
            expires_at,
        )
        if options == DEFAULT_OPTIONS:  # share the common ones
            options = DEFAULT_OPTIONS
        self.topic = topic  # type: ignore[misc]
        self.payload = payload  # type: ignore[misc]
        self.sender = sender  # type: ignore[misc]
        self.timestamp = timestamp  # type: ignore[misc]
        self.options = options  # type: ignore[misc]

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
    def origin(self) -> tuple[str, int] | None:
        """``(node id, message id)`` of where it entered the mesh, once it crossed a link."""
        return self.options.origin

    @property
    def hop_count(self) -> int:
        """How many counted links it crossed (SPEC 9)."""
        return self.options.hop_count

    @property
    def expires_at(self) -> float | None:
        """When it expires on this node's clock, or ``None``."""
        return self.options.expires_at

    def evolve(self, **changes: Any) -> Message:
        """A copy with some settings changed (not for the per-message path)."""
        current: dict[str, Any] = {
            "topic": self.topic,
            "payload": self.payload,
            "sender": self.sender,
            "timestamp": self.timestamp,
            **attrs.asdict(self.options, recurse=False),
        }
        unknown = set(changes) - set(current)
        if unknown:
            raise TypeError(f"Message has no field(s) {', '.join(sorted(unknown))}")
        current.update(changes)
        return Message(**current)

    @property
    def size(self) -> int:
        """Bytes counted against egress limits: the payload length."""
        return len(self.payload)

    def __repr__(self) -> str:
        changed = [
            f"{name}={value!r}"
            for name, value in attrs.asdict(self.options, recurse=False).items()
            if value != getattr(DEFAULT_OPTIONS, name)
        ]
        extra = "".join(", " + c for c in changed)
        return (
            f"Message(topic={self.topic!r}, payload={self.payload!r}, sender={self.sender!r}, "
            f"timestamp={self.timestamp!r}{extra})"
        )


_new = object.__new__


def make_message(
    topic: str,
    payload: bytes,
    sender: str | None,
    timestamp: float | None,
    options: MessageOptions,
) -> Message:
    """The publish path's constructor: five slot stores, no argument processing."""
    message: Message = _new(Message)
    message.topic = topic  # type: ignore[misc]
    message.payload = payload  # type: ignore[misc]
    message.sender = sender  # type: ignore[misc]
    message.timestamp = timestamp  # type: ignore[misc]
    message.options = options  # type: ignore[misc]
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
        self.hop_count = message.options.hop_count if message is not None else 0

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
