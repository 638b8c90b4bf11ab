"""Control frames as typed events, decoded once, in the protocol (SPEC 10).

The sans-IO :class:`~meshbus.transports.LinkProtocol` turns the JSON header of every
control frame into one of the frozen classes below, checking each field's type as
it does: a frame that breaks the protocol (a request without an integer ``id``, a
subscription that is not a string, a window out of range) is a
:class:`~meshbus.ProtocolError` there, and the I/O layers above only read typed
fields. Fields whose value the application judges, not the protocol (a TTL a send
asks for, the flow an UNBIND names), are kept as the wire gave them, so a bad one
is refused with an ERROR answer rather than a closed connection, as before.

Data frames (PUBLISH, DELIVER, FLOW_DELIVER and their batches) are not events: their
array headers are decoded by :mod:`meshbus.transports._codec` on the per-message path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from meshbus.errors import ProtocolError

from ._framing import FrameKind

__all__ = [
    "ADVERTISE_VERSION",
    "Ack",
    "Advertise",
    "Bind",
    "Close",
    "ErrorAnswer",
    "Event",
    "FlowClosed",
    "Hello",
    "LinkLogin",
    "Ok",
    "Ping",
    "Pong",
    "Refused",
    "Request",
    "Send",
    "Subscribe",
    "SubscribeFor",
    "Unbind",
    "Unsubscribe",
    "Welcome",
    "decode_event",
]

K = FrameKind

ADVERTISE_VERSION = 1
"""The version of the ADVERTISE schema (see :class:`Advertise`)."""

_MISSING = object()


def _name(link: dict[str, Any], key: str) -> str:
    """A name a link's HELLO gives (its kind, its name, its node): a non-empty string."""
    value = link.get(key)
    if type(value) is not str or not value:
        raise ProtocolError(f"HELLO link {key} must be a non-empty string")
    return value


def _text(header: dict[str, Any], key: str, what: str, *, default: Any = _MISSING) -> Any:
    value = header.get(key, default)
    if value is _MISSING or (type(value) is not str and not (value is None and default is None)):
        raise ProtocolError(f"{what} {key} must be a string")
    return value


def _flag(header: dict[str, Any], key: str, what: str, default: bool) -> bool:
    value = header.get(key, default)
    if type(value) is not bool:
        raise ProtocolError(f"{what} {key} must be a boolean")
    return value


def _request_id(header: dict[str, Any], what: str) -> int:
    value = header.get("id")
    if type(value) is not int:
        raise ProtocolError(f"{what} frame needs an integer 'id'")
    return value


def _strings(header: dict[str, Any], key: str, what: str) -> tuple[str, ...]:
    value = header.get(key, [])
    if type(value) is not list or any(type(item) is not str for item in value):
        raise ProtocolError(f"{what} '{key}' must be a list of strings")
    return tuple(value)


# --- the handshake ----------------------------------------------------------------------


@attrs.frozen
class LinkLogin:
    """What a peer that opens a link (not a session) says of itself in its HELLO."""

    kind: str
    """The kind of link it asks for (``"bridge"``, ...)."""
    name: str
    """Its name for the link."""
    node: str
    """Its node id."""
    cluster: str | None
    """Its cluster, if any."""
    vpn: str | None = None
    """The VPN of its end of the link, if it says (a bridge does: the pair of bridges
    between two VPNs is found by it)."""
    tls: bool | None = None
    """Whether its settings for the link ask for TLS, if it says (two bridges of a pair
    share a connection only when they agree)."""

    @classmethod
    def decode(cls, value: object) -> LinkLogin:
        if type(value) is not dict:
            raise ProtocolError("HELLO link must be an object")
        optional = {}
        for key in ("cluster", "vpn"):
            optional[key] = value.get(key)
            if optional[key] is not None and type(optional[key]) is not str:
                raise ProtocolError(f"HELLO link {key!r} must be a string")
        tls = value.get("tls")
        if tls is not None and type(tls) is not bool:
            raise ProtocolError("HELLO link 'tls' must be a boolean")
        return cls(
            _name(value, "kind"),
            _name(value, "name"),
            _name(value, "node"),
            optional["cluster"],
            optional["vpn"],
            tls,
        )

    def encode(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"kind": self.kind, "name": self.name, "node": self.node}
        if self.cluster is not None:
            wire["cluster"] = self.cluster
        if self.vpn is not None:
            wire["vpn"] = self.vpn
        if self.tls is not None:
            wire["tls"] = self.tls
        return wire


@attrs.frozen
class Hello:
    """A client's login (the first frame of a connection)."""

    vpn: str | None
    username: str | None
    password: str | None
    client_name: str | None
    no_local: bool
    timestamps: bool
    compression: tuple[str, ...]
    max_frame_size: int | None
    """The largest frame the client reads, or ``None`` if it does not say."""
    link: LinkLogin | None
    """Set when the peer opens a link (link mode) rather than a session."""


@attrs.frozen
class Welcome:
    """The node's answer to a login it accepted."""

    client_name: str | None
    vpn: str | None
    node: str | None
    """The node's name."""
    node_id: str | None
    """The node's identity (nodes before links did not say)."""
    cluster: str | None
    keepalive: float
    keepalive_timeout: float
    max_frame_size: int | None
    compression: str | None
    link: str | None
    """The kind of link accepted, for a link login."""


@attrs.frozen
class Refused:
    """The node's answer to a login it refused."""

    error: str
    message: str
    why: str
    username: str | None


# --- either side, once open ----------------------------------------------------------


@attrs.frozen
class Close:
    """The peer closes the connection."""

    reason: str


@attrs.frozen
class Ping:
    """Are you there (answered by the protocol itself)."""


@attrs.frozen
class Pong:
    """The answer to a ping."""


@attrs.frozen
class Subscribe:
    """Add a subscription (a session) or interest (a link); answered by OK or ERROR."""

    id: int
    subscription: str


@attrs.frozen
class Unsubscribe:
    """Remove a subscription or interest; answered by OK or ERROR."""

    id: int
    subscription: str


@attrs.frozen
class Send:
    """A guaranteed message; answered by OK once held, or ERROR.

    ``ttl`` and the option values are judged by the guaranteed service, which refuses
    bad ones with an ERROR answer; only their JSON shape is the protocol's.
    """

    id: int
    topic: str | None
    queue: str | None
    persistent: bool
    headers: dict[str, Any] | None
    ttl: Any
    options: dict[str, Any]
    """The per-message options given (``e``, ``r``, ``c``, and on links ``s``,
    ``t``, ``o``, ``hc``, ``x``), type-checked, as the wire gave them."""

    @property
    def batchable(self) -> bool:
        """Whether sends like this can share one store commit (``send_many``): to a
        topic, with no per-message options."""
        return self.topic is not None and not self.options


@attrs.frozen
class Bind:
    """Bind a flow to a queue (``queue``) or a topic endpoint (``endpoint`` and its
    ``subscription``); OK carries the flow's number."""

    id: int
    queue: str | None
    endpoint: str | None
    subscription: str | None
    window: int


@attrs.frozen
class Unbind:
    """Release a flow; ``flow`` as the wire gave it (an unknown one is an ERROR)."""

    id: int
    flow: Any


@attrs.frozen
class Ack:
    """These message ids of a flow were processed; values as the wire gave them."""

    flow: Any
    ids: tuple[Any, ...]


@attrs.frozen
class FlowClosed:
    """A flow ended on the peer's side."""

    flow: Any
    reason: str


@attrs.frozen
class Request:
    """A request for information (``what``); answered by OK or ERROR.

    A ``call`` of a service a plugin provides also names the ``service`` and its
    ``args`` (an object); the frame's payload is the call's body.
    """

    id: int
    what: Any
    service: Any = None
    args: Any = None


@attrs.frozen
class SubscribeFor:
    """A subscription manager adds (``add``) or removes a subscription of another
    session of its VPN, by that session's client name: a ``REQUEST`` whose ``what``
    is ``"subscribe_for"`` or ``"unsubscribe_for"``; answered by OK or ERROR."""

    id: int
    client_name: str
    subscription: str
    add: bool


@attrs.frozen
class Ok:
    """A request succeeded; ``result`` holds what else the answer carries."""

    id: Any
    result: dict[str, Any]


@attrs.frozen
class ErrorAnswer:
    """A request failed (``id`` set), or something failed without a request."""

    id: Any
    header: dict[str, Any]
    """The whole header: :func:`~meshbus.transports._wire_errors.error_from` rebuilds
    the error from it."""


@attrs.frozen
class Advertise:
    """What a linked peer wants, version :data:`ADVERTISE_VERSION` (links only).

    A peer numbers its advertisements: ``epoch`` names a run of them (a new one
    each time it starts over, with a ``snapshot`` of everything it wants), ``seq``
    counts them within it. A receiver that sees a gap in ``seq``, or an epoch it
    has no snapshot for, asks for a fresh one with ``resync``. ``vpn`` names the
    VPN the interest is for (the link's, when absent). ``data`` holds what else a
    plugin puts in (kinds of interest, say), as the wire gave it.
    """

    epoch: int
    seq: int
    snapshot: bool
    add: tuple[str, ...]
    remove: tuple[str, ...]
    resync: bool
    vpn: str | None
    data: dict[str, Any]

    def encode(self) -> dict[str, Any]:
        wire: dict[str, Any] = {"v": ADVERTISE_VERSION, "epoch": self.epoch, "seq": self.seq}
        if self.snapshot:
            wire["snapshot"] = True
        if self.add:
            wire["add"] = list(self.add)
        if self.remove:
            wire["remove"] = list(self.remove)
        if self.resync:
            wire["resync"] = True
        if self.vpn is not None:
            wire["vpn"] = self.vpn
        if self.data:
            wire["data"] = self.data
        return wire


Event = (
    Hello
    | Welcome
    | Refused
    | Close
    | Ping
    | Pong
    | Subscribe
    | Unsubscribe
    | Send
    | Bind
    | Unbind
    | Ack
    | FlowClosed
    | Request
    | SubscribeFor
    | Ok
    | ErrorAnswer
    | Advertise
)
"""Any control frame, decoded."""


# --- decoding ---------------------------------------------------------------------------


def _frame_size(header: dict[str, Any], what: str) -> int | None:
    """The ``max_frame_size`` a handshake frame announces, or ``None`` when it does not
    (a meshbus before it said so reads :data:`~meshbus.transports.MAX_FRAME_SIZE`)."""
    if "max_frame_size" not in header:
        return None
    size = header["max_frame_size"]
    if type(size) is not int or size < 1:
        raise ProtocolError(f"{what} max_frame_size must be a positive integer, got {size!r}")
    return size


def _hello(header: dict[str, Any]) -> Hello:
    offer = header.get("compression", [])
    if not isinstance(offer, list):
        raise ProtocolError("HELLO compression offer must be a list")
    size = _frame_size(header, "HELLO")
    link = header.get("link")
    return Hello(
        _text(header, "vpn", "HELLO", default=None),
        _text(header, "username", "HELLO", default=None),
        _text(header, "password", "HELLO", default=None),
        _text(header, "client_name", "HELLO", default=None),
        _flag(header, "no_local", "HELLO", False),
        _flag(header, "timestamps", "HELLO", False),
        tuple(item for item in offer if type(item) is str),
        size,
        None if link is None else LinkLogin.decode(link),
    )


def _number(header: dict[str, Any], key: str, default: float) -> float:
    value = header.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ProtocolError(f"WELCOME {key} must be a positive number")
    return float(value)


def _welcome(header: dict[str, Any]) -> Welcome:
    size = _frame_size(header, "WELCOME")
    compression = header.get("compression")
    if compression is not None and type(compression) is not str:
        raise ProtocolError("WELCOME names a malformed compression")
    return Welcome(
        _text(header, "client_name", "WELCOME", default=None),
        _text(header, "vpn", "WELCOME", default=None),
        _text(header, "node", "WELCOME", default=None),
        _text(header, "node_id", "WELCOME", default=None),
        _text(header, "cluster", "WELCOME", default=None),
        _number(header, "keepalive", 10.0),
        _number(header, "keepalive_timeout", 30.0),
        size,
        compression,
        _text(header, "link", "WELCOME", default=None),
    )


def _refused(header: dict[str, Any]) -> Refused:
    message = header.get("message")
    why = header.get("why") or message
    username = header.get("username")
    return Refused(
        str(header.get("error") or "refused"),
        str(message) if message else "login refused",
        str(why) if why else "login refused",
        username if type(username) is str else None,
    )


def _close(header: dict[str, Any]) -> Close:
    reason = header.get("reason")
    return Close(reason if type(reason) is str else "?")


def _subscription(header: dict[str, Any], what: str) -> tuple[int, str]:
    return _request_id(header, what), _text(header, "subscription", what)


_SEND_OPTIONS: dict[str, tuple[type | tuple[type, ...], str]] = {
    "e": (bool, "eliding_eligible must be a boolean"),
    "r": (str, "reply_to must be a string"),
    "c": (str, "correlation_id must be a string"),
    "rt": (bool, "retain must be a boolean"),
    # Sent again by a client that got no answer (the connection ended): may be here.
    "rd": (bool, "redelivered must be a boolean"),
    # On links, a message keeps what it is (SPEC 7).
    "s": (str, "sender must be a string"),
    "t": ((int, float), "timestamp must be a number"),
    "o": (list, "origin must be [node, id]"),
    "hc": (int, "hop count must be an integer"),
    "x": ((int, float), "time to live left must be a number"),
}


def _send(header: dict[str, Any]) -> Send:
    request = _request_id(header, "SEND")
    topic = header.get("topic")
    queue = header.get("queue")
    if queue is not None:
        if type(queue) is not str:
            raise ProtocolError("'queue' must be a string")
        topic = None
    elif type(topic) is not str:
        raise ProtocolError("'topic' must be a string")
    headers = header.get("h")
    if headers is not None and type(headers) is not dict:
        raise ProtocolError("SEND headers must be an object")
    options: dict[str, Any] = {}
    for key, (kind, why) in _SEND_OPTIONS.items():
        if key in header:
            value = header[key]
            if type(value) is bool and kind is not bool:
                raise ProtocolError(f"SEND {why}")
            if not isinstance(value, kind):
                raise ProtocolError(f"SEND {why}")
            options[key] = value
    return Send(
        request,
        topic,
        queue,
        _flag(header, "persistent", "SEND", True),
        headers,
        header.get("ttl"),
        options,
    )


def _bind(header: dict[str, Any]) -> Bind:
    request = _request_id(header, "BIND")
    window = header.get("window", 255)
    if type(window) is not int or not 1 <= window <= 65535:
        raise ProtocolError("BIND window must be an integer from 1 to 65535")
    if "endpoint" in header:
        return Bind(
            request,
            None,
            _text(header, "endpoint", "BIND"),
            _text(header, "subscription", "BIND"),
            window,
        )
    return Bind(request, _text(header, "queue", "BIND"), None, None, window)


def _ack(header: dict[str, Any]) -> Ack:
    ids = header.get("ids")
    if type(ids) is not list:
        raise ProtocolError("ACK needs a list of 'ids'")
    return Ack(header.get("flow"), tuple(ids))


def _flow_closed(header: dict[str, Any]) -> FlowClosed:
    reason = header.get("reason")
    return FlowClosed(header.get("flow"), reason if type(reason) is str else "")


_FOR = {"subscribe_for": True, "unsubscribe_for": False}


def _request(header: dict[str, Any]) -> Request | SubscribeFor:
    request = _request_id(header, "REQUEST")
    what = header.get("what")
    if type(what) is str and what in _FOR:
        return SubscribeFor(
            request,
            _text(header, "client", f"REQUEST {what}"),
            _text(header, "subscription", f"REQUEST {what}"),
            _FOR[what],
        )
    return Request(request, what, header.get("service"), header.get("args"))


def _ok(header: dict[str, Any]) -> Ok:
    return Ok(header.get("id"), {k: v for k, v in header.items() if k != "id"})


def _error(header: dict[str, Any]) -> ErrorAnswer:
    return ErrorAnswer(header.get("id"), header)


def _advertise(header: dict[str, Any]) -> Advertise:
    version = header.get("v")
    if type(version) is not int or version != ADVERTISE_VERSION:
        raise ProtocolError(f"ADVERTISE version {version!r} is not supported")
    epoch = header.get("epoch")
    seq = header.get("seq")
    if type(epoch) is not int or type(seq) is not int or seq < 0:
        raise ProtocolError("ADVERTISE needs an integer 'epoch' and 'seq'")
    data = header.get("data", {})
    if type(data) is not dict:
        raise ProtocolError("ADVERTISE 'data' must be an object")
    return Advertise(
        epoch,
        seq,
        _flag(header, "snapshot", "ADVERTISE", False),
        _strings(header, "add", "ADVERTISE"),
        _strings(header, "remove", "ADVERTISE"),
        _flag(header, "resync", "ADVERTISE", False),
        _text(header, "vpn", "ADVERTISE", default=None),
        data,
    )


_DECODERS: dict[int, Callable[[dict[str, Any]], Any]] = {
    K.HELLO: _hello,
    K.WELCOME: _welcome,
    K.REFUSED: _refused,
    K.CLOSE: _close,
    K.PING: lambda header: Ping(),
    K.PONG: lambda header: Pong(),
    K.SUBSCRIBE: lambda header: Subscribe(*_subscription(header, "SUBSCRIBE")),
    K.UNSUBSCRIBE: lambda header: Unsubscribe(*_subscription(header, "UNSUBSCRIBE")),
    K.SEND: _send,
    K.BIND: _bind,
    K.UNBIND: lambda header: Unbind(_request_id(header, "UNBIND"), header.get("flow")),
    K.ACK: _ack,
    K.FLOW_CLOSED: _flow_closed,
    K.REQUEST: _request,
    K.OK: _ok,
    K.ERROR: _error,
    K.ADVERTISE: _advertise,
}

CONTROL_KINDS = frozenset(_DECODERS)
"""The frame kinds that decode to events."""


def decode_event(kind: int, header: Any) -> Any:
    """The event of a control frame; :class:`ProtocolError` if it is malformed."""
    if type(header) is not dict:
        raise ProtocolError(f"{FrameKind(kind).name} frame has a malformed header")
    return _DECODERS[kind](header)
