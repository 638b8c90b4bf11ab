"""What the halves of an MQTT connection share: the state they read, declared once.

:class:`~meshbus.plugins.mqtt._connection.MqttConnection` is put together from its
subscription half and its delivery half; each is a subclass of :class:`Parts`, which
names what the connection holds, so each half type-checks on its own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from meshbus import Message, Session
from meshbus.abc import Flow
from meshbus.transports import WriteThrough

if TYPE_CHECKING:
    from ._codec import Codec
    from ._sessions import MqttSession

__all__ = ["Parts"]


class Parts:
    """The state of a connection, as its halves see it."""

    codec: Codec | None
    session: Session | None
    state: MqttSession | None
    flow: Flow | None
    client_id: str
    peer: str  # the client's address, in logs
    settings: Any
    listener: Any
    node: Any
    stream: anyio.abc.ByteStream
    taken_over: bool
    closing: bool  # it said goodbye: nothing more is written
    client_max_packet: int | None
    client_receive_max: int
    _special: bool
    _inflight: dict[int, Message]
    #: The flows bound to share groups' queues, by queue; and the flow of each QoS 1
    #: message in flight from one of them.
    _shares: dict[str, Flow]
    _share_ids: dict[int, Flow]
    _out_room: anyio.Event | None  # set when an ack makes room in the client's window
    _retained_due: tuple[set[int], anyio.Event] | None  # see Subscribing._until_written
    _written_ids: list[int]
    _next_id: int
    _tg: anyio.abc.TaskGroup | None
    _write_lock: anyio.Lock
    _direct_busy: bool
    write_through: WriteThrough
    marked: bool  # in the write-through's list already
    _unwritten: list[bytes]  # packets for the end of a reader's read
    # The connection's own methods the halves call (declared, not defined, here).
    _write: Callable[[bytes], Awaitable[None]]
    _guarded: Callable[..., Coroutine[Any, Any, None]]
    _bind: Callable[[anyio.abc.TaskGroup], Awaitable[None]]
    _bind_share: Callable[[anyio.abc.TaskGroup, str], Awaitable[None]]
    _unbind_share: Callable[[str], Awaitable[None]]
    _wake_room: Callable[[], None]
    _encode: Callable[..., bytes]  # (message, qos, packet id, retain, *, queued, ids)
