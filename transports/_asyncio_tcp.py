"""A TCP byte stream for asyncio loops that keeps reading on, with its own flow control.

anyio's TCP stream on asyncio switches the transport's reading on before every
``receive`` and off after it. On a link that answers one small frame at a time
(a request and its reply) that is two system calls per read in every process
on the way, about a fifth of a round trip here. :class:`AsyncioTcpStream` takes
over the transport of a connected anyio stream instead: reading stays on, what
arrives is queued, and reading is paused only while more than
:data:`READ_HIGH_WATER` bytes wait to be read, which bounds memory as before.

It also offers a write that never waits (:meth:`AsyncioTcpStream.send_nowait`),
which the node uses to write deliveries from a publisher's read, and a read that
hands what arrives to a function right in the transport's callback
(:meth:`AsyncioTcpStream.set_receiver`), without waking a reading task first.

Only asyncio loops (uvloop included) have transports; on trio, streams stay
anyio's. :func:`adopt_tcp_stream` decides.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
from anyio.lowlevel import cancel_shielded_checkpoint, checkpoint

__all__ = ["READ_HIGH_WATER", "AsyncioTcpStream", "adopt_tcp_stream"]

READ_HIGH_WATER = 1024 * 1024
"""Bytes received and not yet read above which the transport stops reading."""

_READ_LOW_WATER = READ_HIGH_WATER // 4


class _Protocol(asyncio.Protocol):
    """Queues what arrives and wakes the one reader; tracks the transport's flow control."""

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.transport: asyncio.Transport | None = None
        self.reading_paused = False
        self.writing_paused = False
        self.eof = False
        self.lost = False
        self.exception: BaseException | None = None
        self.read_waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None
        #: Takes what arrives instead of the queue, while set.
        self.receiver: Callable[[bytes], None] | None = None

    def _wake_reader(self) -> None:
        waiter = self.read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        waiter = self.drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        receiver = self.receiver
        if receiver is not None:
            receiver(bytes(data))
            return
        self.chunks.append(bytes(data))
        self.buffered += len(data)
        if self.buffered > READ_HIGH_WATER and not self.reading_paused:
            assert self.transport is not None
            self.transport.pause_reading()
            self.reading_paused = True
        self._wake_reader()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake_reader()
        return True  # keep the transport: the other direction may still be written

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.exception = exc
        self.writing_paused = False
        self._wake_reader()
        self._wake_writer()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_writer()


class AsyncioTcpStream(anyio.abc.ByteStream):
    """A connected TCP stream on an asyncio loop (see the module's documentation)."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol, original: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        self._original = original  # anyio's stream: its extra attributes still hold
        self._closed = False

    # -- reading -----------------------------------------------------------------------

    async def receive(self, max_bytes: int = 65536) -> bytes:
        protocol = self._protocol
        chunks = protocol.chunks
        if chunks:
            await checkpoint()  # data is here, but let other tasks run between reads
        elif not (protocol.eof or protocol.lost or self._closed):
            waiter = protocol.read_waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                protocol.read_waiter = None
        if not chunks:
            raise self._read_error()
        chunk = chunks.popleft()
        if len(chunk) > max_bytes:
            chunk, rest = chunk[:max_bytes], chunk[max_bytes:]
            chunks.appendleft(rest)
        protocol.buffered -= len(chunk)
        if protocol.reading_paused and protocol.buffered <= _READ_LOW_WATER:
            protocol.reading_paused = False
            self._transport.resume_reading()
        return chunk

    @property
    def queued(self) -> int:
        """Bytes received and not read yet (none while a receiver takes them)."""
        return self._protocol.buffered

    def set_receiver(self, receiver: Callable[[bytes], None] | None) -> None:
        """Hand every chunk that arrives to ``receiver``, in the transport's callback
        and in order, starting with what is queued now; ``None`` goes back to queueing
        for :meth:`receive` and wakes a task in :meth:`wait_receiver`.

        ``receiver`` must not raise, and must bound what it keeps: reading is not
        paused for it.
        """
        protocol = self._protocol
        protocol.receiver = receiver
        if receiver is None:
            protocol._wake_reader()
        chunks = protocol.chunks
        while receiver is not None and chunks and protocol.receiver is receiver:
            chunk = chunks.popleft()
            protocol.buffered -= len(chunk)
            receiver(chunk)
        if protocol.reading_paused and protocol.buffered <= _READ_LOW_WATER:
            protocol.reading_paused = False
            self._transport.resume_reading()

    async def wait_receiver(self) -> None:
        """Wait while a receiver is set and the stream is open.

        :returns: when the receiver was taken away (:meth:`set_receiver`).
        :raises anyio.EndOfStream: (or the other errors of :meth:`receive`) the
            stream ended first.
        """
        protocol = self._protocol
        receiver = protocol.receiver
        while protocol.receiver is receiver is not None:
            if protocol.eof or protocol.lost or self._closed:
                raise self._read_error()
            waiter = protocol.read_waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                protocol.read_waiter = None

    def _read_error(self) -> Exception:
        protocol = self._protocol
        if self._closed:
            return anyio.ClosedResourceError()
        if protocol.exception is not None:
            error = anyio.BrokenResourceError()
            error.__cause__ = protocol.exception
            return error
        if protocol.lost and not protocol.eof:
            return anyio.BrokenResourceError()
        return anyio.EndOfStream()

    # -- writing -----------------------------------------------------------------------

    def writable_now(self) -> bool:
        """Whether :meth:`send_nowait` may be called: open, healthy, nothing buffered."""
        protocol = self._protocol
        return not (
            self._closed or protocol.lost or protocol.writing_paused or self._transport.is_closing()
        )

    def send_nowait(self, data: bytes) -> None:
        """Hand ``data`` to the kernel now, buffering what it does not take. Call it only
        right after :meth:`writable_now` said yes, with no await in between."""
        self._transport.write(data)

    async def send(self, item: bytes) -> None:
        protocol = self._protocol
        while True:
            if self._closed:
                raise anyio.ClosedResourceError
            if protocol.lost or self._transport.is_closing():
                error = anyio.BrokenResourceError()
                error.__cause__ = protocol.exception
                raise error
            if not protocol.writing_paused:
                break
            await self._drained()
        self._transport.write(item)
        if protocol.writing_paused:
            await self._drained()  # what the kernel did not take is written before we go on
        else:
            await cancel_shielded_checkpoint()  # written: a cancel now would mislead

    async def _drained(self) -> None:
        protocol = self._protocol
        waiter = protocol.drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            protocol.drain_waiter = None

    async def send_eof(self) -> None:
        with contextlib.suppress(OSError):
            self._transport.write_eof()

    async def aclose(self) -> None:
        self._closed = True
        self._transport.abort()
        self._protocol._wake_reader()
        self._protocol._wake_writer()
        await checkpoint()

    @property
    def extra_attributes(self) -> Any:
        return self._original.extra_attributes


def adopt_tcp_stream(stream: anyio.abc.ByteStream) -> anyio.abc.ByteStream:
    """``stream`` as an :class:`AsyncioTcpStream` if it is anyio's TCP stream on an
    asyncio loop; otherwise ``stream`` itself. Call it before anything reads from it.

    What anyio already received is carried over; anyio's stream object must not
    be used afterwards (it no longer sees the transport).
    """
    kind = type(stream)
    if kind.__name__ != "SocketStream" or kind.__module__ != "anyio._backends._asyncio":
        return stream
    transport = getattr(stream, "_transport", None)
    old = getattr(stream, "_protocol", None)
    if not isinstance(getattr(old, "read_queue", None), deque) or not all(
        hasattr(transport, name) for name in ("set_protocol", "resume_reading", "write")
    ):
        return stream  # a different anyio inside: keep its stream
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if raw is None or raw.family not in (socket.AF_INET, socket.AF_INET6):
        return stream
    assert transport is not None
    assert old is not None
    protocol = _Protocol()
    protocol.transport = transport
    for chunk in old.read_queue:
        protocol.chunks.append(chunk)
        protocol.buffered += len(chunk)
    old.read_queue.clear()
    protocol.eof = bool(getattr(old, "is_at_eof", False))
    protocol.exception = getattr(old, "exception", None)
    write_event = getattr(old, "write_event", None)
    protocol.writing_paused = write_event is not None and not write_event.is_set()
    transport.set_protocol(protocol)
    transport.set_write_buffer_limits(0)  # as anyio: anything unsent pauses writing
    if transport.is_closing():
        protocol.lost = True
    else:
        transport.resume_reading()
    return AsyncioTcpStream(transport, protocol, stream)
