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

from meshbus._messages import HEADER_LIMITS
from meshbus.errors import ProtocolError

__all__ = [
    "FRAME_HEADROOM",
    "HEADER_DEPTH_LIMIT",
    "HEADER_LIMIT",
    "FrameDecoder",
    "FrameKind",
    "encode_frame",
]

_PREFIX = struct.Struct("!IBI")
_PREFIX_SIZE = _PREFIX.size  # 9
_BODY_MIN = _PREFIX_SIZE - 4  # kind + header length
HEADER_LIMIT = 1024 * 1024
"""Largest JSON header a frame may carry, whatever the frame size limit. It holds a
message's headers at their limit (:data:`meshbus.HEADER_LIMITS`) many times over; the
frames that carry several messages are split to stay within it."""
HEADER_DEPTH_LIMIT = HEADER_LIMITS.max_depth + 3
"""Deepest nesting of arrays and objects in a frame header: message headers at their
depth limit, wrapped in the most a data frame puts around them (a batch's array, the
message's entry and its options object). Message headers any deeper are refused where
they come in (:class:`~meshbus.PublishRejectedError`) when the frame still fits this
limit, and close the connection when it does not."""
FRAME_HEADROOM = 64 * 1024
"""Bytes a node may add to a message it accepted when it writes it to a subscriber
(the sender's name, a timestamp, flow and message numbers, the queue's name), with
room to spare: a client reads frames this much larger than a node accepts."""


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
    PUBLISH_BATCH = 23
    """Client to node: several direct messages in one frame (array header, joined payloads)."""
    DELIVER_BATCH = 24
    """Node to client: several direct messages in one frame (array header, joined payloads)."""
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
    :param accept: when given, the only frame kinds accepted, each with the JSON
        type its header must have (``dict`` or ``list``); others are errors.
    """

    __slots__ = (
        "_chunks",
        "_need",
        "_size",
        "accept",
        "limit_note",
        "max_frame_size",
    )

    def __init__(self, max_frame_size: int, accept: dict[int, type] | None = None) -> None:
        self.max_frame_size = max_frame_size
        self.accept = accept
        #: Said after the limit when a frame is over it (which limit it was).
        self.limit_note = ""
        # Received bytes not yet decoded, kept as pieces until the next frame can be
        # whole: joining on every read would copy a large frame once per read.
        self._chunks: list[bytes] = []
        self._size = 0
        self._need = _PREFIX_SIZE  # bytes to hold before decoding can make progress

    @property
    def buffered(self) -> int:
        """Bytes received and not yet part of a whole frame."""
        return self._size

    def take_buffer(self) -> bytes:
        """Remove and return what is buffered (when the stream changes encoding)."""
        data = b"".join(self._chunks)
        self._chunks = []
        self._size = 0
        self._need = _PREFIX_SIZE
        return data

    @property
    def sliced(self) -> bool:
        """Whether the last :meth:`feed` stopped at its ``limit`` with bytes left that
        it did not look at (``feed(b"")`` decodes them)."""
        return self._need == 0 and self._size > 0

    def feed(self, data: bytes, limit: int = 0) -> list[tuple[int, Any, bytes]]:
        """Add ``data``; return every frame now complete, in order (at most ``limit``
        when it is not 0: the rest stays buffered)."""
        if data:
            self._chunks.append(data if type(data) is bytes else bytes(data))
            self._size += len(data)
        if self._size < self._need:
            return []
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        need = _PREFIX_SIZE
        frames: list[tuple[int, Any, bytes]] = []
        append = frames.append
        size = len(data)
        offset = 0
        max_size = self.max_frame_size
        accept = self.accept
        unpack = _PREFIX.unpack_from
        loads = orjson.loads
        try:
            while size - offset >= _PREFIX_SIZE:
                length, kind, head_length = unpack(data, offset)
                if length > max_size:
                    raise ProtocolError(
                        f"frame of {length} bytes is larger than the limit of "
                        f"{max_size}{self.limit_note}"
                    )
                if length < _BODY_MIN:
                    raise ProtocolError(f"frame length {length} is shorter than a frame header")
                if accept is None:
                    if kind not in _KINDS:
                        raise ProtocolError(f"unknown frame kind {kind}")
                    shape = None
                else:
                    shape = accept.get(kind)
                    if shape is None:
                        raise _refused(kind)
                if head_length > length - _BODY_MIN or head_length > HEADER_LIMIT:
                    raise ProtocolError(
                        f"header length {head_length} does not fit a frame of {length} bytes"
                    )
                end = offset + 4 + length
                if end > size:
                    need = 4 + length  # checked against the limit above
                    break
                split = offset + _PREFIX_SIZE + head_length
                head = data[offset + _PREFIX_SIZE : split]
                try:
                    header = loads(head)
                except orjson.JSONDecodeError as exc:
                    raise ProtocolError(f"frame header is not valid JSON: {exc}") from None
                if (
                    head_length > _DEPTH_CHECK_FROM
                    and kind not in _BATCHES  # their codecs check what in them can nest
                    and head.count(b"[") + head.count(b"{") > HEADER_DEPTH_LIMIT
                    and too_deep(header, HEADER_DEPTH_LIMIT)
                ):
                    raise ProtocolError(
                        f"frame header is nested deeper than {HEADER_DEPTH_LIMIT} levels"
                    )
                if shape is not None and type(header) is not shape:
                    raise ProtocolError(f"{FrameKind(kind).name} frame has a malformed header")
                append((kind, header, data[split:end]))
                offset = end
                if len(frames) == limit:
                    need = 0  # not looked at yet: decode on the next call
                    break
        finally:
            rest = data[offset:] if offset else data
            self._chunks = [rest] if rest else []
            self._size = len(rest)
            self._need = need
        return frames


def _refused(kind: int) -> ProtocolError:
    if kind in _KINDS:
        return ProtocolError(f"{FrameKind(kind).name} frames are not accepted here")
    return ProtocolError(f"unknown frame kind {kind}")


_DEPTH_CHECK_FROM = 2 * HEADER_DEPTH_LIMIT  # a shorter header cannot be too deep
# A batch holds one array per message; walking thousands of them to find the depth
# would cost more than decoding them, and only a message's options can nest anyway.
_BATCHES = frozenset({FrameKind.PUBLISH_BATCH, FrameKind.DELIVER_BATCH})


def too_deep(value: Any, limit: int) -> bool:
    """Whether ``value`` nests arrays and objects more than ``limit`` deep (level by level,
    not recursively: a hostile value must not exhaust the stack)."""
    if type(value) is not list and type(value) is not dict:
        return False
    level = [value]  # the containers inside as many others as this loop went round
    for _ in range(limit):
        level = [
            child
            for container in level
            for child in (container.values() if type(container) is dict else container)
            if type(child) is list or type(child) is dict
        ]
        if not level:
            return False
    return True
