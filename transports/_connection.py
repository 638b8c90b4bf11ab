"""A byte stream joined to a :class:`LinkProtocol`: the I/O half of a link, either side.

Writes are coalesced: callers queue frames in the protocol and call
:meth:`Connection.flush`, which writes everything queued so far in one
``send`` (one compression step, one syscall). One lock keeps writers from
interleaving, which TLS streams do not allow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from meshbus._clock import SystemClock
from meshbus.abc import Clock
from meshbus.errors import AuthenticationError, MeshbusError, ProtocolError, TransportError

from . import _events as ev
from ._asyncio_tcp import AsyncioTcpStream
from ._framing import FrameKind
from ._protocol import FRAME_SLICE, ConnectionState, LinkProtocol, Role
from ._streams import map_exceptions

__all__ = ["READ_SIZE", "REST", "STEP_MESSAGES", "Connection", "unwrap_errors"]

READ_SIZE = 256 * 1024
"""Most bytes taken from the stream per read."""

_SYSTEM_CLOCK = SystemClock()

Frames = list[tuple[int, Any, bytes]]
"""Frames as :meth:`LinkProtocol.receive_data` returns them: kind, header or event, payload."""
Handle = Callable[[Frames], Frames | None]

STEP_MESSAGES = 1024
"""Messages a reader acts on in one step, at most: the rest of a read of large batches
is handed back to its task (see :data:`REST`) and acted on after other tasks' turns."""
REST = -1
"""Not a frame kind: ``(REST, messages, b"")`` at the head of what a reader's handle
returns holds what it left of a read for its next step (already decoded)."""


@contextmanager
def unwrap_errors() -> Iterator[None]:
    """Let a meshbus error out of a task group as itself, not in an exception group.

    A connection's tasks fail together: the first meshbus error (a lost stream,
    a protocol violation, a keepalive timeout) is the reason the connection ends.
    Anything else (a bug) keeps its group, so nothing is hidden.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        matched, rest = group.split(MeshbusError)
        if matched is not None and rest is not None:
            cancelled, other = rest.split(anyio.get_cancelled_exc_class())
            if other is None and cancelled is not None:
                # An outer scope is cancelling the connection (a session shutting
                # down) while its stream failed: the cancellation is what happened,
                # and the scope that asked for it must see it to end quietly.
                raise _first_leaf(cancelled) from None
        if matched is None or rest is not None:
            raise
        raise _first_leaf(matched) from None


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


class Connection:
    """One connection: its stream, its protocol state and its peer's name."""

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        protocol: LinkProtocol,
        peer: str,
        clock: Clock | None = None,
    ) -> None:
        self.stream = stream
        self.protocol = protocol
        self.peer = peer
        #: What the connection's times and keepalive are measured on.
        self.clock: Clock = clock if clock is not None else _SYSTEM_CLOCK
        self._now = self.clock.monotonic
        self._lock = anyio.Lock(fast_acquire=True)  # no extra scheduling pass when free
        #: The stream, when it can be written without an await (TCP on asyncio).
        self._nowait = stream if isinstance(stream, AsyncioTcpStream) else None
        self.closed = False
        #: A write was cut short (cancelled or failed): the peer may have part of a
        #: frame, so nothing more is written, not even a CLOSE.
        self.cut = False
        #: Frames that arrived in the same read as the handshake frame (client side).
        self.early: list[tuple[int, Any, bytes]] = []
        # A read of thousands of small frames is decoded and acted on a slice at a
        # time, other tasks' turns in between (the readers here call again while the
        # protocol has pending input).
        protocol.frame_slice = FRAME_SLICE

    async def receive_frames(self) -> list[tuple[int, Any, bytes]]:
        """Read once from the stream; return the frames completed (maybe none).

        :raises TransportError: the stream ended or failed (a ``ProtocolError``
            when the bytes broke the protocol).
        """
        protocol = self.protocol
        if protocol.has_pending_input:  # inflate what is already here before reading more
            await anyio.lowlevel.checkpoint()
            return protocol.receive_data(b"", self._now())
        with map_exceptions(f"reading from {self.peer}"):
            data = await self.stream.receive(READ_SIZE)
        return protocol.receive_data(data, self._now())

    async def receive_next(self, handle: Handle, *, wait_turn: bool = False) -> Frames | None:
        """What :meth:`receive_into` returns, except when ``wait_turn`` is true or bytes
        already wait in the stream: then one read is taken in this task's turn, after
        the other tasks, and ``handle``'s answer for it is returned.

        A reader passes ``wait_turn`` when its last read left writes to another
        connection's writer task: acting on every read as it arrives would let a fast
        publisher's reads take the loop from the writers that carry its messages on.
        """
        stream = self._nowait
        if wait_turn or (stream is not None and stream.queued > 0):
            return handle(await self.receive_frames())
        return await self.receive_into(handle)

    async def receive_into(self, handle: Handle) -> Frames | None:
        """Give ``handle`` the frames of each read, until it gives some back or the
        connection leaves the OPEN state.

        ``handle`` must not await. It returns ``None`` to go on, or the frames it
        left for the caller (maybe none), which this then returns: the caller acts on
        them with awaits (writing what the stream would not take at once, say) and
        calls again.

        On TCP under asyncio without compression, ``handle`` runs in the transport's
        callback as the bytes arrive: the task that waits for a message wakes once,
        not after a reading task did first. Elsewhere this loops on
        :meth:`receive_frames`.

        :returns: what ``handle`` gave back; ``None`` once the connection is not OPEN.
        :raises TransportError: as :meth:`receive_frames` (and what ``handle`` raised).
        """
        protocol = self.protocol
        stream = self._nowait
        if stream is None or protocol.compression is not None:
            while protocol.state is ConnectionState.OPEN:
                rest = handle(await self.receive_frames())
                if rest is not None:
                    return rest
            return None
        now = self._now
        failed: list[Exception] = []
        given: list[Frames] = []

        def received(data: bytes) -> None:
            try:
                rest = handle(protocol.receive_data(data, now()))
            except Exception as exc:
                failed.append(exc)
                stream.set_receiver(None)
                return
            if rest is not None:
                given.append(rest)
                stream.set_receiver(None)  # what arrives next waits for the caller
            elif protocol.state is not ConnectionState.OPEN or protocol.has_pending_input:
                stream.set_receiver(None)  # (the rest of a sliced read: in this task)

        while True:
            # What a read left beyond its first slice, a slice per turn of this task.
            while protocol.has_pending_input and protocol.state is ConnectionState.OPEN:
                await anyio.lowlevel.checkpoint()
                rest = handle(protocol.receive_data(b"", now()))
                if rest is not None:
                    return rest
            if protocol.state is not ConnectionState.OPEN:
                return None
            try:
                stream.set_receiver(received)
                with map_exceptions(f"reading from {self.peer}"):
                    await stream.wait_receiver()
            finally:
                stream.set_receiver(None)
            if failed:
                raise failed[0]
            if given:
                return given[0]
            if not protocol.has_pending_input:
                return None

    async def receive_handshake(self) -> ev.Hello | ev.Welcome:
        """Read until the handshake frame: HELLO (server side) or WELCOME (client side).

        :raises AuthenticationError: (client) the node refused the login.
        :raises ProtocolError: the peer broke the protocol.
        :raises TransportError: the stream ended first.
        """
        protocol = self.protocol
        while True:
            frames = await self.receive_frames()
            if not frames:
                continue
            _, event, _ = frames[0]
            if isinstance(event, ev.Refused):
                raise AuthenticationError(event.username or "", event.why)
            if protocol.role is Role.CLIENT and len(frames) > 1:
                self.early = frames[1:]
            else:
                self.early = []
            return event  # type: ignore[no-any-return]

    async def flush(self) -> None:
        """Write whatever the protocol has queued. :raises TransportError: the write failed."""
        protocol = self.protocol
        async with self._lock:
            data = protocol.data_to_send(self._now())
            if data:
                self.cut = True  # until the stream has taken all of it
                with map_exceptions(f"writing to {self.peer}"):
                    await self.stream.send(data)
                self.cut = False

    @property
    def writes_nowait(self) -> bool:
        """Whether :meth:`flush_nowait` can ever succeed on this stream."""
        return self._nowait is not None

    def can_flush_nowait(self) -> bool:
        """Whether :meth:`flush_nowait` would write now: the stream has a write that
        never waits, no writer holds the connection, and the stream's buffer has room."""
        stream = self._nowait
        return stream is not None and not self._lock.locked() and stream.writable_now()

    def flush_nowait(self) -> bool:
        """Write what the protocol has queued without awaiting, if
        :meth:`can_flush_nowait`; else write nothing.

        :returns: whether the queued frames were handed to the stream.
        """
        if not self.can_flush_nowait():
            return False
        data = self.protocol.data_to_send(self._now())
        if data:
            self._nowait.send_nowait(data)  # type: ignore[union-attr]
        return True

    async def keep_alive(
        self, interval: float, timeout: float, wake_writer: Callable[[], None] | None = None
    ) -> None:
        """Run for the life of the connection: ping after ``interval`` seconds of sending
        nothing; raise :class:`TransportError` after ``timeout`` seconds of hearing nothing.

        :param wake_writer: how a ping gets written when a writer task owns the stream
            (a client); without it the ping is flushed here (a node's connection).
        """
        protocol = self.protocol
        clock = self.clock
        while True:
            await clock.sleep_until(clock.monotonic() + min(interval, timeout) / 2)
            now = clock.monotonic()
            if protocol.peer_silent(now, timeout):
                raise TransportError(f"keepalive: nothing heard from {self.peer} for {timeout:g} s")
            if protocol.ping_due(now, interval):
                protocol.send(FrameKind.PING, {})
                if wake_writer is None:
                    await self.flush()
                else:
                    wake_writer()

    async def flush_quietly(self) -> None:
        """Like :meth:`flush`, ignoring failures (for goodbyes to a peer being dropped)."""
        try:
            with anyio.move_on_after(1):
                await self.flush()
        except TransportError:
            pass

    async def send_close(self, reason: str) -> None:
        """Tell the peer the connection is closing (best effort; not after a write that
        was cut short, which may have left a frame half written)."""
        if self.protocol.state is ConnectionState.OPEN and not self.cut:
            try:
                self.protocol.close(reason)
            except ProtocolError:
                return
            await self.flush_quietly()

    async def aclose(self) -> None:
        """Close the stream without waiting for the peer."""
        if not self.closed:
            self.closed = True
            await anyio.aclose_forcefully(self.stream)
