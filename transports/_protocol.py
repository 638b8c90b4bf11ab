"""The link protocol as a sans-IO state machine: bytes in, frames out, no sockets.

One :class:`LinkProtocol` per connection and side. The I/O layer (a remote
session, a listener's connection, later a bridge or a DMR link) feeds it what
arrives with :meth:`~LinkProtocol.receive_data`, acts on the frames it returns,
queues frames with :meth:`~LinkProtocol.send` and writes
:meth:`~LinkProtocol.data_to_send`. Keepalive is bookkeeping here and timing in
the I/O layer: it passes the current time in.

The conversation::

    client                                   node
      HELLO {version, vpn, username, ...}  ->
                                          <-  WELCOME {client_name, compression, ...}
                                              (or REFUSED {error, message}, then close)
      ... both sides compress from here when WELCOME named an algorithm ...
      SUBSCRIBE / PUBLISH / SEND / BIND / ACK / PING ...  ->
                                          <-  OK / ERROR / DELIVER / FLOW_DELIVER / PONG ...

The client sends nothing after HELLO until WELCOME arrives. Every frame is
checked against the state and the side it may come from before it is returned,
and every control frame is returned as its typed event (:mod:`._events`): the
layers above read typed fields, never a header's JSON.

**Link mode.** A HELLO that names a ``link`` (a node opening a link to another:
a bridge, a routing link) asks for link mode, and its WELCOME confirms it. Then
both sides may send requests (SUBSCRIBE, SEND, BIND, ADVERTISE, ...) and answer
the other's (OK, ERROR), each numbering its own requests, and messages travel as
DELIVER frames in both directions, keeping their sender, timestamp and origin.

Until the handshake is done a side reads only a small frame (a login is well under
1 KB), so a connection that never logs in cannot make its peer hold more than that.
HELLO and WELCOME each say the largest frame their sender reads
(``max_frame_size``): a side never writes a data frame its peer would refuse.
"""

from __future__ import annotations

import enum
from typing import Any

from meshbus.errors import ProtocolError

from . import _events as ev
from ._compression import ALGORITHMS, Compressor, Decompressor
from ._events import CONTROL_KINDS, decode_event
from ._framing import FrameDecoder, FrameKind, encode_frame
from ._settings import LOGIN_FRAME_SIZE, MAX_FRAME_SIZE

__all__ = ["FRAME_SLICE", "PROTOCOL_VERSION", "ConnectionState", "LinkProtocol", "Role"]

_INFLATE_STEP = 256 * 1024

FRAME_SLICE = 256
"""Frames a :class:`~meshbus.transports._connection.Connection` has its protocol decode
per call (:attr:`LinkProtocol.frame_slice`): a read of thousands of small frames is
acted on a slice at a time, with other tasks' turns in between."""

PROTOCOL_VERSION = 1
"""The version a HELLO names; a node refuses versions it does not speak."""

K = FrameKind


class Role(enum.Enum):
    """Which side of a connection a protocol object is."""

    CLIENT = "client"
    """Opens the connection and logs in (an application, a bridge, a DMR link)."""
    SERVER = "server"
    """Accepts connections on a listener and serves sessions."""


class ConnectionState(enum.Enum):
    """Where a connection is in its life."""

    HANDSHAKE = "handshake"
    """Waiting for HELLO (server) or WELCOME (client)."""
    OPEN = "open"
    """Logged in: any frame the side may receive is accepted."""
    CLOSED = "closed"
    """A CLOSE or REFUSED was sent or received, or the protocol failed."""


# What each side may receive once the connection is open. ADVERTISE travels both
# ways on node-to-node links; a node serving an application ignores it.
_SERVER_RECEIVES = frozenset(
    {
        K.CLOSE,
        K.PING,
        K.PONG,
        K.SUBSCRIBE,
        K.UNSUBSCRIBE,
        K.PUBLISH,
        K.PUBLISH_BATCH,
        K.SEND,
        K.BIND,
        K.UNBIND,
        K.ACK,
        K.REQUEST,
        K.ADVERTISE,
    }
)
_CLIENT_RECEIVES = frozenset(
    {
        K.CLOSE,
        K.PING,
        K.PONG,
        K.OK,
        K.ERROR,
        K.DELIVER,
        K.DELIVER_BATCH,
        K.FLOW_DELIVER,
        K.FLOW_CLOSED,
        K.ADVERTISE,
    }
)
# In link mode either side takes what both sides take in a session, but PUBLISH:
# messages cross a link as DELIVER frames, with their sender and origin.
_LINK_RECEIVES = (_SERVER_RECEIVES | _CLIENT_RECEIVES) - {K.PUBLISH, K.PUBLISH_BATCH}
_ARRAY_HEADERS = frozenset({K.PUBLISH, K.DELIVER, K.FLOW_DELIVER, K.PUBLISH_BATCH, K.DELIVER_BATCH})
_CONTROL = frozenset(int(k) for k in CONTROL_KINDS)


def _shapes(kinds: frozenset[FrameKind]) -> dict[int, type]:
    return {int(k): list if k in _ARRAY_HEADERS else dict for k in kinds}


class LinkProtocol:
    """The state of one side of one connection.

    :param role: :attr:`Role.CLIENT` or :attr:`Role.SERVER`.
    :param max_frame_size: largest frame accepted from the peer once logged in; the
        handshake tells the peer.
    :param handshake_frame_size: largest frame accepted before that (the login's).
    """

    def __init__(
        self,
        role: Role,
        *,
        max_frame_size: int,
        handshake_frame_size: int = LOGIN_FRAME_SIZE,
    ) -> None:
        self.role = role
        self.state = ConnectionState.HANDSHAKE
        self.max_frame_size = max_frame_size
        self._decoder = FrameDecoder(min(handshake_frame_size, max_frame_size))
        self._decoder.limit_note = " before login"
        #: The largest frame the peer reads, as its HELLO or WELCOME said (until then, and
        #: for peers that do not say, what meshbus read before it said so).
        self.peer_max_frame_size = MAX_FRAME_SIZE
        #: Whether the connection is a link between nodes (see the module's docs): set
        #: when the client's HELLO names a link.
        self.link_mode = False
        self._receives = _shapes(_SERVER_RECEIVES if role is Role.SERVER else _CLIENT_RECEIVES)
        self._out = bytearray()
        self._compressor: Compressor | None = None
        self._decompressor: Decompressor | None = None
        self._plain = b""  # written before what is compressed (the WELCOME)
        self._held = b""  # bytes that arrived after the handshake frame, before the switch
        #: The algorithm in force (``None``: no compression).
        self.compression: str | None = None
        #: Why the connection closed, once it has.
        self.close_reason: str | None = None
        #: At most this many frames per :meth:`receive_data` once open (0: all that
        #: are complete). The rest wait, decoded by the next call, even with ``b""``:
        #: :attr:`has_pending_input` says when they do.
        self.frame_slice = 0
        #: Time the last bytes arrived / were queued (in the I/O layer's clock).
        self.last_received = 0.0
        self.last_sent = 0.0
        self.bytes_received = 0
        self.bytes_sent = 0

    # --- sending ------------------------------------------------------------------

    def send(self, kind: FrameKind, header: Any, payload: bytes = b"") -> None:
        """Queue a frame for :meth:`data_to_send`."""
        if self.state is ConnectionState.CLOSED:
            raise ProtocolError(f"connection is closed ({self.close_reason})")
        self._out += encode_frame(kind, header, payload)

    def send_raw(self, frame: bytes) -> None:
        """Queue a frame encoded elsewhere (the data path encodes its own)."""
        self._out += frame

    @property
    def out(self) -> bytearray:
        """The queued, unencoded bytes (the data path appends frames here directly)."""
        return self._out

    def data_to_send(self, now: float = 0.0) -> bytes:
        """What to write next (compressed when negotiated); empty when nothing is queued."""
        if not self._out:
            data, self._plain = self._plain, b""
            if data:  # the WELCOME on its own
                self.last_sent = now
                self.bytes_sent += len(data)
            return data
        data = bytes(self._out)
        self._out.clear()
        if self._compressor is not None:
            data = self._compressor.compress(data)
        if self._plain:
            data, self._plain = self._plain + data, b""
        self.last_sent = now
        self.bytes_sent += len(data)
        return data

    # --- handshake ----------------------------------------------------------------

    def hello(self, header: dict[str, Any]) -> None:
        """Client: queue HELLO (``version``, ``max_frame_size`` and the compression offer
        are filled in). A ``link`` in ``header`` asks for link mode."""
        self._expect(Role.CLIENT, "hello")
        if header.get("link") is not None:
            self._link_mode()
        offer = header.get("compression") or []
        self.send(
            K.HELLO,
            {
                **header,
                "version": PROTOCOL_VERSION,
                "max_frame_size": self.max_frame_size,
                "compression": list(offer),
            },
        )

    def accept(self, header: dict[str, Any], *, compression: str | None) -> None:
        """Server: queue WELCOME and open the connection, switching on ``compression``
        (``max_frame_size`` is filled in unless ``header`` has it; in link mode the
        header must name the ``link`` kind accepted)."""
        self._expect(Role.SERVER, "accept")
        if self.link_mode and not header.get("link"):
            raise ProtocolError("a link's WELCOME must name the link kind accepted")
        self.send(
            K.WELCOME,
            {"max_frame_size": self.max_frame_size, **header, "compression": compression},
        )
        self._plain = bytes(self._out)  # WELCOME itself goes out uncompressed
        self._out.clear()
        self._open(compression)

    def refuse(self, error: str, message: str, why: str = "", username: str | None = None) -> None:
        """Server: queue REFUSED; the connection is closed after it is written."""
        self._expect(Role.SERVER, "refuse")
        header = {"error": error, "message": message, "why": why or message}
        if username is not None:
            header["username"] = username
        self.send(K.REFUSED, header)
        self._closed(f"refused: {message}")

    def close(self, reason: str) -> None:
        """Queue CLOSE (if still open) and mark the connection closed."""
        if self.state is ConnectionState.OPEN:
            self.send(K.CLOSE, {"reason": reason})
        self._closed(reason)

    def _link_mode(self) -> None:
        self.link_mode = True
        self._receives = _shapes(_LINK_RECEIVES)

    def _expect(self, role: Role, action: str) -> None:
        if self.role is not role or self.state is not ConnectionState.HANDSHAKE:
            raise ProtocolError(f"{action}() is for the {role.value} during the handshake")

    def _open(self, compression: str | None) -> None:
        if compression is not None:
            if compression not in ALGORITHMS:
                raise ProtocolError(f"unknown compression {compression!r}")
            self._compressor = Compressor(compression)
            # One inflate step per receive_data call, at most 1 MiB (or one frame's limit):
            # the I/O layer calls again while has_pending_input, before reading more.
            self._decompressor = Decompressor(min(self.max_frame_size, _INFLATE_STEP), compression)
        self.compression = compression
        self.state = ConnectionState.OPEN
        decoder = self._decoder
        decoder.accept = self._receives  # from now on: only the kinds this side takes
        decoder.max_frame_size = self.max_frame_size  # and frames of any size it takes
        decoder.limit_note = ""
        # What followed the handshake frame in the same read is in the new encoding.
        self._held = self._decoder.take_buffer()

    def _closed(self, reason: str) -> None:
        if self.state is not ConnectionState.CLOSED:
            self.state = ConnectionState.CLOSED
            self.close_reason = reason

    # --- receiving ----------------------------------------------------------------

    def receive_data(self, data: bytes, now: float = 0.0) -> list[tuple[int, Any, bytes]]:
        """Feed bytes from the peer; return the frames they complete, checked.

        During the handshake this returns at most the handshake frame; call it
        again (with ``b""``) after :meth:`accept` to get what followed it.

        :raises ProtocolError: the bytes break the protocol; the connection is
            then closed and must be dropped.
        """
        if self.state is ConnectionState.CLOSED:
            return []
        self.last_received = now
        self.bytes_received += len(data)
        if self._held:
            data, self._held = self._held + data, b""
        try:
            if self.state is ConnectionState.HANDSHAKE:
                frames = self._handshake(data)
                state: ConnectionState = self.state  # _handshake may have opened it
                if state is ConnectionState.OPEN and self._held:
                    frames += self.receive_data(b"", now)
                return frames
            decoder = self._decoder
            if self._decompressor is None:
                frames = decoder.feed(data, self.frame_slice)
            else:
                frames = self._inflate(data)
            control = _CONTROL
            for i, (kind, header, payload) in enumerate(frames):
                if kind not in control:
                    continue  # data frames: the codec decodes them where they are used
                event = decode_event(kind, header)
                frames[i] = (kind, event, payload)
                if kind == K.PING:
                    self.send(K.PONG, {})
                elif kind == K.CLOSE:
                    self._closed(f"peer closed: {event.reason}")
            return frames
        except ProtocolError as exc:
            self._closed(str(exc))
            raise

    def _inflate(self, data: bytes) -> list[tuple[int, Any, bytes]]:
        decompressor = self._decompressor
        assert decompressor is not None
        return self._decoder.feed(decompressor.decompress(data))

    @property
    def has_pending_input(self) -> bool:
        """Input is left that the last call did not decode (frames beyond
        :attr:`frame_slice`) or inflate: call :meth:`receive_data` with ``b""`` before
        reading more from the stream."""
        if self._decompressor is not None:
            return self._decompressor.has_more
        return self._decoder.sliced

    def _handshake(self, data: bytes) -> list[tuple[int, Any, bytes]]:
        # Decode one frame only: what follows it may be in another encoding.
        frames = self._decoder.feed(data, limit=1)
        if not frames:
            return []
        kind, header, payload = frames[0]
        if type(header) is not dict:
            raise ProtocolError(f"{FrameKind(kind).name} frame has a malformed header")
        if self.role is Role.SERVER:
            if kind != K.HELLO:
                raise ProtocolError(f"expected HELLO, got {FrameKind(kind).name}")
            version = header.get("version")
            if type(version) is not int or version != PROTOCOL_VERSION:  # not True, not 1.0
                raise ProtocolError(f"protocol version {version!r} is not supported")
            hello: ev.Hello = decode_event(kind, header)
            if hello.max_frame_size is not None:
                self.peer_max_frame_size = hello.max_frame_size
            if hello.link is not None:
                self._link_mode()
            if self._decoder.buffered:
                raise ProtocolError("client sent frames before its login was answered")
            return [(kind, hello, payload)]
        if kind == K.WELCOME:
            welcome: ev.Welcome = decode_event(kind, header)
            if self.link_mode and welcome.link is None:
                raise ProtocolError("the node did not accept a link: it logged in a session")
            if welcome.max_frame_size is not None:
                self.peer_max_frame_size = welcome.max_frame_size
            self._open(welcome.compression)
            return [(kind, welcome, payload)]
        if kind == K.REFUSED:
            refused: ev.Refused = decode_event(kind, header)
            self._closed(f"refused: {refused.message}")
            return [(kind, refused, payload)]
        raise ProtocolError(f"expected WELCOME or REFUSED, got {FrameKind(kind).name}")

    # --- keepalive ----------------------------------------------------------------

    def ping_due(self, now: float, interval: float) -> bool:
        """Whether nothing was sent for ``interval`` seconds (then send a PING)."""
        return self.state is ConnectionState.OPEN and now - self.last_sent >= interval

    def peer_silent(self, now: float, timeout: float) -> bool:
        """Whether nothing arrived for ``timeout`` seconds: the peer is taken as dead."""
        return now - self.last_received >= timeout
