"""Length-prefixed frames: the unit every link and remote session exchanges.

A frame on the wire::

    u32 length | u8 kind | u32 header length | header | payload
    '--------- length counts everything after itself ---------'

All integers are big-endian. The header is JSON (made and read with orjson):
an object for control frames, an array for the data frames that carry messages.
The payload is the message body as raw bytes, never re-encoded.

:class:`FrameDecoder` is sans-IO: bytes go in, ``(kind, header, payload)`` tuples
come out. It checks every length against the limit before buffering more, and
every header's JSON before returning it, so hostile input ends in a
:class:`~meshbus.ProtocolError` and nothing else.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

import orjson

from meshbus.errors import ProtocolError

__all__ = ["HEADER_LIMIT", "FrameDecoder", "FrameKind", "encode_frame"]

_PREFIX = struct.Struct("!IBI")
_PREFIX_SIZE = _PREFIX.size  # 9
_BODY_MIN = _PREFIX_SIZE - 4  # kind + header length
HEADER_LIMIT = 1024 * 1024
"""Largest JSON header a frame may carry, whatever the frame size limit."""


class FrameKind(enum.IntEnum):
    """What a frame is. Values are part of the wire format: never renumber."""

    HELLO = 1
    """Client to node: protocol version, VPN, credentials, options asked for."""
    WELCOME = 2
    """Node to client: login accepted; the options in force (compression, keepalive)."""
    REFUSED = 3
    """Node to client: login refused, with an error code and a reason."""
    CLOSE = 4
    """Either side: the connection is closing, with a reason."""
    PING = 5
    """Either side: are you there (keepalive)."""
    PONG = 6
    """Either side: the answer to a ping."""
    SUBSCRIBE = 10
    """Add a subscription; answered by OK or ERROR with the same ``id``."""
    UNSUBSCRIBE = 11
    """Remove a subscription; answered by OK or ERROR."""
    OK = 12
    """A request (``id``) succeeded; may carry a result."""
    ERROR = 13
    """A request (``id``) failed, or an asynchronous error (no ``id``)."""
    PUBLISH = 20
    """Client to node: a direct message (array header)."""
    DELIVER = 21
    """Node to client: a direct message for the session (array header)."""
    SEND = 22
    """Client to node: a guaranteed message; acknowledged by OK or ERROR (``id``)."""
    BIND = 30
    """Bind a flow to a queue or topic endpoint; OK carries the flow number."""
    UNBIND = 31
    """Client to node: release a flow."""
    ACK = 32
    """Client to node: these message ids of a flow are processed."""
    FLOW_DELIVER = 33
    """Node to client: a guaranteed message on a flow (array header)."""
    FLOW_CLOSED = 34
    """Node to client: a flow ended (its queue was deleted, or the node is stopping)."""
    ADVERTISE = 40
    """Links only: subscriptions added to or withdrawn from the sender's interest."""
    REQUEST = 50
    """A request for information (``what``: ``"stats"``); answered by OK or ERROR."""


_KINDS = frozenset(FrameKind)


def encode_frame(kind: int, header: Any, payload: bytes = b"") -> bytes:
    """One frame as bytes; ``header`` is anything orjson can serialize."""
    head = orjson.dumps(header)
    return _PREFIX.pack(_BODY_MIN + len(head) + len(payload), kind, len(head)) + head + payload


class FrameDecoder:
    """Turns a byte stream into frames (sans-IO).

    :param max_frame_size: largest ``length`` accepted; a bigger one is a
        :class:`~meshbus.ProtocolError` raised before its bytes are buffered.
    """

    __slots__ = ("_buffer", "max_frame_size")

    def __init__(self, max_frame_size: int) -> None:
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes received and not yet part of a whole frame."""
        return len(self._buffer)

    def take_buffer(self) -> bytes:
        """Remove and return what is buffered (when the stream changes encoding)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data

    def feed(self, data: bytes, limit: int = 0) -> list[tuple[int, Any, bytes]]:
        """Add ``data``; return every frame now complete, in order (at most ``limit``
        when it is not 0: the rest stays buffered)."""
        buffer = self._buffer
        buffer += data
        frames: list[tuple[int, Any, bytes]] = []
        size = len(buffer)
        offset = 0
        max_size = self.max_frame_size
        unpack = _PREFIX.unpack_from
        loads = orjson.loads
        try:
            while size - offset >= _PREFIX_SIZE:
                length, kind, head_length = unpack(buffer, offset)
                if length > max_size:
                    raise ProtocolError(
                        f"frame of {length} bytes is larger than the limit of {max_size}"
                    )
                if length < _BODY_MIN:
                    raise ProtocolError(f"frame length {length} is shorter than a frame header")
                if kind not in _KINDS:
                    raise ProtocolError(f"unknown frame kind {kind}")
                if head_length > length - _BODY_MIN or head_length > HEADER_LIMIT:
                    raise ProtocolError(
                        f"header length {head_length} does not fit a frame of {length} bytes"
                    )
                end = offset + 4 + length
                if end > size:
                    break
                start = offset + _PREFIX_SIZE
                split = start + head_length
                try:
                    header = loads(buffer[start:split])
                except orjson.JSONDecodeError as exc:
                    raise ProtocolError(f"frame header is not valid JSON: {exc}") from None
                frames.append((kind, header, bytes(buffer[split:end])))
                offset = end
                if len(frames) == limit:
                    break
        finally:
            if offset:
                del buffer[:offset]
        return frames
