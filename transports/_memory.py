"""An in-process network: nodes in one process reach each other by name, on the node's clock.

:class:`MemoryNetwork` gives names to listeners (:meth:`MemoryNetwork.listen`) and
hands out connectables for them (:meth:`MemoryNetwork.connectable`); a connection is a
pair of :class:`MemoryStream` byte streams. A test then does to the network what real
networks do to links, between any two names, and the protocols above cannot tell:

* :meth:`~MemoryNetwork.cut` breaks the connections between two names (both ends see
  the connection lost), and :meth:`~MemoryNetwork.partition` also refuses new ones
  until :meth:`~MemoryNetwork.heal`;
* :meth:`~MemoryNetwork.half_open` makes the connections silently lose what is
  written, in both directions, without telling either end (a peer that vanished, or
  a firewall that dropped the flow): only keepalive notices;
* :meth:`~MemoryNetwork.delay` holds what is written for a while, on the network's
  clock (a :class:`~meshbus.ManualClock` in tests, so delays cost no real time).

Closing an end works as it does for TCP: the other end reads what was written
before the close, then the end of the stream; its writes meanwhile are lost
without an error until the reset could have come back (twice the delay), then fail.

Nothing here uses sockets or the wall clock, so a multi-node test on a manual clock
runs the same way every time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel
from anyio.abc import SocketAttribute

from meshbus._clock import SystemClock
from meshbus.abc import Clock
from meshbus.errors import ConfigurationError, TransportError

__all__ = ["MemoryListener", "MemoryNetwork", "MemoryStream"]

_HIGH_WATER = 1024 * 1024  # bytes buffered one way before a writer waits


class _Pipe:
    """One direction of a connection: what one end wrote and the other has not read."""

    __slots__ = (
        "_buffered",
        "_chunks",
        "_clock",
        "_reader_waiting",
        "_room",
        "broken",
        "delay",
        "eof",
        "lossy",
        "reset_at",
    )

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._chunks: deque[tuple[float, bytes]] = deque()
        self._buffered = 0
        self._reader_waiting: anyio.Event | None = None
        self._room: anyio.Event | None = None
        self.eof = False  # the writer is done: the reader gets EndOfStream once drained
        self.broken = False  # the connection was cut: both ends fail
        self.lossy = False  # half-open: writes vanish
        self.delay = 0.0
        # The reader closed its end: writes vanish until this time, then fail.
        self.reset_at: float | None = None

    def _wake_reader(self) -> None:
        event, self._reader_waiting = self._reader_waiting, None
        if event is not None:
            event.set()

    def _wake_writer(self) -> None:
        event, self._room = self._room, None
        if event is not None:
            event.set()

    async def write(self, data: bytes) -> None:
        while True:
            if self.broken:
                raise anyio.BrokenResourceError
            if self.reset_at is not None:
                if self._clock.monotonic() >= self.reset_at:
                    raise anyio.BrokenResourceError
                await anyio.lowlevel.checkpoint()  # the writer cannot tell yet
                return
            if self.eof:
                raise anyio.ClosedResourceError
            if self._buffered < _HIGH_WATER:
                break
            if self._room is None:
                self._room = anyio.Event()
            await self._room.wait()
        # Taken, then a shielded yield, as a TCP socket's write: a writer cancelled
        # after this (a node stopping) has sent what it wrote, it did not lose it.
        if not (self.lossy or self.broken):
            self._chunks.append((self._clock.monotonic() + self.delay, bytes(data)))
            self._buffered += len(data)
            self._wake_reader()
        await anyio.lowlevel.cancel_shielded_checkpoint()

    async def read(self, max_bytes: int) -> bytes:
        while True:
            if self.broken or self.reset_at is not None:
                raise anyio.BrokenResourceError
            if self._chunks:
                due, data = self._chunks[0]
                if due > self._clock.monotonic():
                    await self._clock.sleep_until(due)
                    continue
                if len(data) > max_bytes:
                    self._chunks[0] = (due, data[max_bytes:])
                    data = data[:max_bytes]
                else:
                    self._chunks.popleft()
                self._buffered -= len(data)
                self._wake_writer()
                await anyio.lowlevel.checkpoint()
                return data
            if self.eof:
                raise anyio.EndOfStream
            if self._reader_waiting is None:
                self._reader_waiting = anyio.Event()
            await self._reader_waiting.wait()

    def close(self) -> None:
        if self.lossy:
            return  # half-open: the end of the stream is lost like the rest
        self.eof = True
        self._wake_reader()
        self._wake_writer()

    def reader_closed(self) -> None:
        """The reading end closed, as a TCP socket does: what is still on its way is
        dropped, and the writer learns it a round trip later, from the reset (its
        writes until then are lost without an error). So the other end still reads
        what was written to it before the close, even if it writes meanwhile."""
        self.reset_at = self._clock.monotonic() + 2 * self.delay
        self._chunks.clear()
        self._buffered = 0
        self._wake_reader()
        self._wake_writer()

    def break_(self) -> None:
        self.broken = True
        self._chunks.clear()
        self._buffered = 0
        self._wake_reader()
        self._wake_writer()


class MemoryStream(anyio.abc.ByteStream):
    """One end of a connection of a :class:`MemoryNetwork`."""

    def __init__(self, incoming: _Pipe, outgoing: _Pipe, local: str, remote: str) -> None:
        self._incoming = incoming
        self._outgoing = outgoing
        self.local = local
        self.remote = remote
        self._closed = False

    def __repr__(self) -> str:
        return f"<MemoryStream {self.local} -> {self.remote}>"

    async def send(self, item: bytes) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if item:
            await self._outgoing.write(item)

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._closed:
            raise anyio.ClosedResourceError
        return await self._incoming.read(max_bytes)

    async def send_eof(self) -> None:
        self._outgoing.close()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._outgoing.close()  # the peer reads what is left, then the end
            self._incoming.reader_closed()  # a read of ours still waiting fails
        await anyio.lowlevel.checkpoint()

    @property
    def extra_attributes(self) -> Any:
        return {
            SocketAttribute.remote_address: lambda: self.remote,
            SocketAttribute.local_address: lambda: self.local,
        }


class _Connection:
    """Both directions of one connection, for the network's tools."""

    def __init__(self, client: str, server: str, clock: Clock) -> None:
        self.client = client
        self.server = server
        self.up = _Pipe(clock)  # client -> server
        self.down = _Pipe(clock)  # server -> client

    def joins(self, a: str, b: str) -> bool:
        return {self.client, self.server} == {a, b}

    @property
    def broken(self) -> bool:
        """Cut, or closed at either end."""
        up, down = self.up, self.down
        return up.broken or up.reset_at is not None or down.reset_at is not None


class MemoryListener(anyio.abc.Listener[anyio.abc.ByteStream]):
    """Where a :class:`MemoryNetwork` delivers the connections made to one name."""

    def __init__(self, network: MemoryNetwork, name: str) -> None:
        self.network = network
        self.name = name
        self._incoming: deque[MemoryStream] = deque()
        self._arrived: anyio.Event | None = None
        self.closed = False

    def _deliver(self, stream: MemoryStream) -> None:
        self._incoming.append(stream)
        event, self._arrived = self._arrived, None
        if event is not None:
            event.set()

    async def serve(
        self,
        handler: Callable[[anyio.abc.ByteStream], Any],
        task_group: anyio.abc.TaskGroup | None = None,
    ) -> None:
        async with AsyncExitStack() as stack:
            if task_group is None:
                task_group = await stack.enter_async_context(anyio.create_task_group())
            while not self.closed:
                if self._incoming:
                    task_group.start_soon(handler, self._incoming.popleft())
                    continue
                self._arrived = anyio.Event()
                await self._arrived.wait()

    async def aclose(self) -> None:
        if self.network._listeners.get(self.name) is self:
            del self.network._listeners[self.name]
        self.closed = True
        for stream in self._incoming:
            await stream.aclose()
        self._incoming.clear()
        event, self._arrived = self._arrived, None
        if event is not None:
            event.set()
        await anyio.lowlevel.checkpoint()

    @property
    def extra_attributes(self) -> Any:
        return {SocketAttribute.local_address: lambda: self.name}


class _Connectable(anyio.abc.ByteStreamConnectable):
    def __init__(self, network: MemoryNetwork, target: str, source: str) -> None:
        self.network = network
        self.target = target
        self.source = source

    def __repr__(self) -> str:
        return f"memory://{self.target}"

    async def connect(self) -> anyio.abc.ByteStream:
        return await self.network.connect(self.target, source=self.source)


class MemoryNetwork:
    """Named listeners and the connections between them, all in this process.

    :param clock: what delays are measured on (the nodes' clock in a test).
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self._listeners: dict[str, MemoryListener] = {}
        self._connections: list[_Connection] = []
        self._partitions: set[frozenset[str]] = set()
        self._lossy: set[frozenset[str]] = set()
        self._delays: dict[frozenset[str], float] = {}
        #: Connections made, ever.
        self.connects = 0

    def listen(self, name: str) -> MemoryListener:
        """A listener for the connections made to ``name`` (serve it, or give it to
        :func:`~meshbus.transports.start_server`).

        :raises ConfigurationError: something listens on ``name`` already.
        """
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a memory address is a non-empty name, got {name!r}")
        if name in self._listeners:
            raise ConfigurationError(f"something listens on memory://{name} already")
        listener = self._listeners[name] = MemoryListener(self, name)
        return listener

    def connectable(self, target: str, *, source: str = "client") -> _Connectable:
        """What connects to ``target`` on this network (an anyio
        :class:`~anyio.abc.ByteStreamConnectable`), as ``source`` for the network's tools."""
        return _Connectable(self, target, source)

    async def connect(self, target: str, *, source: str = "client") -> MemoryStream:
        """Open a connection from ``source`` to the listener on ``target``.

        :raises TransportError: nothing listens there, or the two are partitioned.
        """
        await anyio.lowlevel.checkpoint()
        pair = frozenset((source, target))
        listener = self._listeners.get(target)
        if listener is None:
            raise TransportError(f"connecting to memory://{target}: nothing listens there")
        if pair in self._partitions:
            raise TransportError(f"connecting to memory://{target}: unreachable from {source}")
        connection = _Connection(source, target, self.clock)
        delay = self._delays.get(pair, 0.0)
        connection.up.delay = connection.down.delay = delay
        if pair in self._lossy:
            connection.up.lossy = connection.down.lossy = True
        client = MemoryStream(connection.down, connection.up, source, target)
        server = MemoryStream(connection.up, connection.down, target, source)
        self._connections = [c for c in self._connections if not c.broken]
        self._connections.append(connection)
        listener._deliver(server)
        self.connects += 1
        return client

    def _between(self, a: str, b: str) -> list[_Connection]:
        return [c for c in self._connections if c.joins(a, b) and not c.broken]

    def connections(self, a: str, b: str) -> int:
        """How many connections between ``a`` and ``b`` are up."""
        return len(self._between(a, b))

    def cut(self, a: str, b: str) -> int:
        """Break every connection between ``a`` and ``b`` (both ends see it lost); new
        ones may be made at once. Returns how many were cut."""
        cut = self._between(a, b)
        for connection in cut:
            connection.up.break_()
            connection.down.break_()
        return len(cut)

    def partition(self, a: str, b: str) -> None:
        """Cut ``a`` from ``b`` and refuse new connections between them until :meth:`heal`."""
        self._partitions.add(frozenset((a, b)))
        self.cut(a, b)

    def half_open(self, a: str, b: str, *, new_connections: bool = True) -> None:
        """From now on, what ``a`` and ``b`` write to each other on their connections
        (these and, unless ``new_connections`` is false, new ones) is lost, closing them
        included, and neither is told, until :meth:`heal`."""
        pair = frozenset((a, b))
        if new_connections:
            self._lossy.add(pair)
        for connection in self._between(a, b):
            connection.up.lossy = connection.down.lossy = True

    def delay(self, a: str, b: str, seconds: float) -> None:
        """Deliver what ``a`` and ``b`` write to each other ``seconds`` late (0 to stop)."""
        pair = frozenset((a, b))
        self._delays[pair] = seconds
        for connection in self._between(a, b):
            connection.up.delay = connection.down.delay = seconds

    def heal(self, a: str, b: str) -> None:
        """Undo :meth:`partition`, :meth:`half_open` and :meth:`delay` between ``a`` and
        ``b`` (connections cut meanwhile stay cut)."""
        pair = frozenset((a, b))
        self._partitions.discard(pair)
        self._lossy.discard(pair)
        self._delays.pop(pair, None)
        for connection in self._between(a, b):
            connection.up.lossy = connection.down.lossy = False
            connection.up.delay = connection.down.delay = 0.0
