"""The node's side of one remote session: frames in, session calls; deliveries out.

A :class:`ServedSession` runs four kinds of task while its connection is open:

- the reader: decodes frames and acts on them (publishes inline, no await);
- the pump: moves the session's egress buffer into DELIVER frames, so a slow
  reader is a slow consumer with the usual bounded buffer (SPEC 2);
- the sender: turns pipelined SEND frames into batched guaranteed publishes,
  answering each with OK or ERROR in order;
- keepalive: pings a quiet peer, and drops one that stays silent.

Plus one task per bound flow, feeding FLOW_DELIVER frames within the flow's window.

Deliveries caused by a remote publisher skip the pump when they can: while a
reader publishes, an idle subscriber's connection is only marked, and when the
read's frames are done the reader writes each marked connection's deliveries
itself, without an await (see :class:`WriteThrough`). That saves the pump's
wakeup and the write's scheduling pass on every hop through the node.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import anyio
import anyio.abc
import anyio.lowlevel
import attrs

from meshbus._messages import Message
from meshbus._stash import StashKey
from meshbus._stats import NodeStatistics
from meshbus.errors import (
    MeshbusError,
    ProtocolError,
    StateError,
    TransportError,
)

from . import _events as ev
from ._answering import Answers, ServedFlows
from ._calls import ServedCalls
from ._codec import (
    FrameTooLarge,
    PublishEntry,
    decode_publish,
    decode_publish_batch,
    encode_deliver,
    encode_deliver_batch,
)
from ._connection import REST, STEP_MESSAGES, Frames, unwrap_errors
from ._framing import FrameKind
from ._protocol import ConnectionState
from ._settings import ListenerSettings

if TYPE_CHECKING:
    from meshbus._node import Node
    from meshbus._session import Session
    from meshbus._vpn import Vpn

    from ._connection import Connection

__all__ = [
    "SERVED",
    "WRITE_THROUGH",
    "ServedSession",
    "WriteThrough",
    "Writer",
    "write_through_of",
]

log = logging.getLogger("meshbus.transports")

K = FrameKind
_PUBLISH = int(K.PUBLISH)
_PUBLISH_BATCH = int(K.PUBLISH_BATCH)
_BATCH_BYTES = 256 * 1024  # deliveries encoded per write, at most (about)
_BATCH_MESSAGES = 4096  # and at most this many, so a batch header stays small
_WRITE_BYTES = 1024 * 1024  # a writer's batches per write, at most (about)
_MAX_PIPELINED_SENDS = 4096  # SEND frames waiting for the sender before reading pauses
_MAX_PIPELINED_BYTES = 64 * 1024 * 1024  # and their payload bytes, beyond the first one


class Writer(Protocol):
    """What a :class:`WriteThrough` writes for: a served session, a link."""

    marked: bool

    @property
    def peer(self) -> str:
        """Who the writes are for, in logs."""
        ...

    def write_ready(self) -> bool:
        """Write what waits now if the stream takes it without waiting, else wake the
        writer task; return ``False`` when the writer task was woken for it."""
        ...

    def wake_writer(self) -> None: ...


class WriteThrough:
    """A node's connections whose deliveries wait for the current reader to write them.

    One per node, shared by its listeners. A reader sets :attr:`active` while it
    publishes the frames of one read (no await in between); deliveries to an idle
    connection that can write without waiting are then collected here instead of
    waking its pump, and :meth:`drain` writes them, one write per connection per
    read, in delivery order. Outside a reader (an in-process publisher, a
    guaranteed delivery) nothing is collected and pumps are woken as before.
    """

    __slots__ = ("active", "ready", "writes")

    def __init__(self) -> None:
        self.active = False
        self.ready: list[Writer] = []
        #: Writes made this way (a reader writing another connection's deliveries).
        self.writes = 0

    def drain(self) -> bool:
        """Stop collecting and write what was collected.

        :returns: whether everything was written; ``False`` when some connection's
            stream would not take its writes now and they were left to its writer task
            (the reader is then ahead of a destination: see :meth:`ServedSession._read`).
        """
        self.active = False
        ready = self.ready
        written = True
        if ready:
            self.ready = []
            for served in ready:
                served.marked = False  # first: a failure below must not leave it marked
                try:
                    written = served.write_ready() and written
                except Exception:  # a bug there must not end the reader's connection
                    log.exception("writing deliveries to %s failed", served.peer)
                    served.wake_writer()  # its writer writes them, or fails on its own
                    written = False
        return written


class ServedSession:
    """Relays between one connection and the :class:`~meshbus.Session` it logged in to."""

    def __init__(
        self,
        connection: Connection,
        session: Session,
        settings: ListenerSettings,
        write_through: WriteThrough | None = None,
    ):
        self.connection = connection
        self.protocol = connection.protocol
        self.session = session
        self.settings = settings
        self._sends: deque[tuple[ev.Send, bytes]] = deque()
        self._sends_waiting = anyio.Event()
        self._sends_room = anyio.Event()
        self._send_bytes = 0  # payload bytes appended to _sends, at least what it holds
        self.answers = Answers(connection)
        self.flows = ServedFlows(connection, self.answers)
        self.calls = ServedCalls(connection, session, self.answers)
        #: Messages that could not be written: headers JSON cannot hold, or a message
        #: larger than the client reads (both only from in-process publishers).
        self.undeliverable = 0
        self._write_through = write_through if write_through is not None else WriteThrough()
        #: In its node's write-through list already (see :class:`WriteThrough`).
        self.marked = False
        #: The last read left a destination's writes to its writer task.
        self._behind = False
        #: When the client logged in, in wall-clock seconds of the node's clock.
        self.since = session.node.clock.time()
        session.stash[SERVED] = self  # the management API finds connections this way
        if connection.writes_nowait:
            session.egress.on_ready = self._on_ready

    async def run(self) -> None:
        """Serve until the peer closes, the connection fails or the session closes."""
        try:
            with unwrap_errors():
                async with anyio.create_task_group() as tg:
                    self._tg = tg
                    tg.start_soon(self._pump)
                    tg.start_soon(self._sender)
                    settings = self.settings
                    tg.start_soon(
                        self.connection.keep_alive, settings.keepalive, settings.keepalive_timeout
                    )
                    await self._read()
                    tg.cancel_scope.cancel()
        finally:
            self.flows.close()  # unacknowledged messages go back for redelivery

    # --- reading --------------------------------------------------------------------

    async def _read(self) -> None:
        connection = self.connection
        protocol = self.protocol
        while protocol.state is ConnectionState.OPEN:
            try:
                frames = await connection.receive_next(self._received, wait_turn=self._behind)
            except ProtocolError:
                raise  # a violation, even though the protocol has marked itself closed
            except TransportError as exc:
                if protocol.state is ConnectionState.OPEN:  # not a goodbye: a failure
                    raise
                log.debug("connection from %s ended: %s", connection.peer, exc)
                return
            while frames:  # from a control frame that may await on, or past the budget
                kind, event, payload = frames[0]
                if kind == REST:  # the publishes beyond one step's: after others' turns
                    await anyio.lowlevel.checkpoint()
                    frames = self._received(frames)
                    continue
                await self._control(event, payload)
                frames = self._received(frames[1:])  # as before: all of the read's frames
            if protocol.out:
                await connection.flush()
        if protocol.close_reason:
            log.info("connection from %s closed: %s", connection.peer, protocol.close_reason)

    def _received(self, frames: Frames) -> Frames | None:
        """Act on the frames of one read up to the first that may await (returned with
        the rest, for :meth:`_read`), without awaiting: publishes and acks. Also returns
        (nothing) when what is queued for the peer cannot be written without a wait,
        or when a destination's writes were left to its writer task.

        What the publishes make the node write (to sessions, to links) goes out in one
        write per connection at the end (see :class:`WriteThrough`).
        """
        write_through = self._write_through
        write_through.active = True
        written = False
        budget = STEP_MESSAGES
        try:
            for i, (kind, header, payload) in enumerate(frames):
                if kind == _PUBLISH_BATCH:
                    entries = decode_publish_batch(header, payload)
                elif kind == _PUBLISH:
                    topic, options = decode_publish(header)
                    entries = [(topic, payload, options)]
                elif kind == REST:
                    entries = header
                elif type(header) is ev.Ack:
                    self._ack(header)
                    continue
                else:  # a control frame: the protocol made it an event
                    return frames[i:]
                if len(entries) > budget:  # the rest is for the reader's next step
                    self._publish(entries[:budget])
                    return [(REST, entries[budget:], b""), *frames[i + 1 :]]
                self._publish(entries)
                budget -= len(entries)
                if budget <= 0 and i + 1 < len(frames):
                    return [(REST, [], b""), *frames[i + 1 :]]
        finally:
            written = write_through.drain()
            self._behind = not written
        if not written or (self.protocol.out and not self.connection.flush_nowait()):
            return []
        return None

    def _publish(self, entries: list[PublishEntry]) -> None:
        publish = self.session.publish
        for topic, body, options in entries:
            try:
                if options is None:
                    publish(topic, body)
                else:
                    self._publish_with(topic, body, options)
            except (MeshbusError, TypeError, ValueError) as exc:
                self.answers.error(None, exc, topic=topic)

    def _ack(self, event: ev.Ack) -> None:
        try:
            self.flows.ack(event)
        except StateError as exc:
            self.answers.error(None, exc)

    def _publish_with(self, topic: str, payload: bytes, options: dict[str, Any]) -> None:
        headers = options.get("h")
        reply_to = options.get("r")
        correlation_id = options.get("c")
        eliding = options.get("e", False)
        retain = options.get("rt", False)
        ttl = options.get("x")
        if headers is not None and type(headers) is not dict:
            raise ProtocolError("PUBLISH headers must be an object")
        if reply_to is not None and type(reply_to) is not str:
            raise ProtocolError("PUBLISH reply_to must be a string")
        if correlation_id is not None and type(correlation_id) is not str:
            raise ProtocolError("PUBLISH correlation_id must be a string")
        if type(eliding) is not bool:
            raise ProtocolError("PUBLISH eliding flag must be a boolean")
        if type(retain) is not bool:
            raise ProtocolError("PUBLISH retain flag must be a boolean")
        if ttl is not None and type(ttl) is not int and type(ttl) is not float:
            raise ProtocolError("PUBLISH time to live must be a number")  # its value: publish()
        self.session.publish(
            topic,
            payload,
            headers=headers,
            eliding_eligible=eliding,
            reply_to=reply_to,
            correlation_id=correlation_id,
            retain=retain,
            ttl=ttl,
        )

    @property
    def errors_sent(self) -> int:
        """ERROR frames written for this connection's requests and publishes."""
        return self.answers.errors_sent

    async def _control(self, event: object, payload: bytes) -> None:
        answers = self.answers
        if isinstance(event, ev.Ack):
            self._ack(event)
            return
        if isinstance(event, ev.Send):  # answered by the sender, in order
            self._sends.append((event, payload))
            self._sends_waiting.set()
            self._send_bytes += len(payload)
            while len(self._sends) >= _MAX_PIPELINED_SENDS or self._sends_too_large():
                self._sends_room = anyio.Event()
                await self._sends_room.wait()
            return
        if isinstance(event, ev.Request) and event.what == "call":
            await self.calls.start(event, payload, self._tg)  # answered by its own task
            return
        request = getattr(event, "id", None)
        if request is None:
            return  # PING (answered by the protocol), PONG, CLOSE, ADVERTISE (links only)
        try:
            if isinstance(event, ev.Subscribe):
                self.session.subscribe(event.subscription)
                answers.ok(request)
            elif isinstance(event, ev.Unsubscribe):
                self.session.unsubscribe(event.subscription)
                answers.ok(request)
            elif isinstance(event, ev.SubscribeFor):  # the session's checks, as in-process
                if event.add:
                    self.session.subscribe_for(event.client_name, event.subscription)
                else:
                    self.session.unsubscribe_for(event.client_name, event.subscription)
                answers.ok(request)
            elif isinstance(event, ev.Bind):
                if event.endpoint is not None:
                    assert event.subscription is not None
                    flow = await self.session.bind_topic_endpoint(
                        event.endpoint, event.subscription, window=event.window
                    )
                else:
                    assert event.queue is not None
                    flow = await self.session.bind(event.queue, window=event.window)
                self.flows.bound(request, flow, self._tg)
            elif isinstance(event, ev.Unbind):
                await self.flows.unbind(event)
            elif isinstance(event, ev.Request):
                self._request(event)
        except ProtocolError:
            raise
        except (MeshbusError, TypeError, ValueError) as exc:
            answers.error(request, exc)

    def _sends_too_large(self) -> bool:
        """Whether the sends waiting for the spool hold too many bytes to read more.

        Only this reader counts: what the sender took since the last look is found by
        adding up what is left, which happens only once the count passes the bound.
        """
        if self._send_bytes <= _MAX_PIPELINED_BYTES:
            return False
        sends = self._sends
        self._send_bytes = sum(len(payload) for _, payload in sends)
        return len(sends) > 1 and self._send_bytes > _MAX_PIPELINED_BYTES

    def _request(self, event: ev.Request) -> None:
        what = event.what
        if what == "sync":  # a barrier: everything sent before it has been applied
            self.answers.ok(event.id)
        elif what == "stats":
            self.answers.ok(event.id, result=node_statistics(self.session))
        else:
            raise StateError(f"unknown request {what!r}")

    # --- guaranteed publishing ----------------------------------------------------------

    async def _sender(self) -> None:
        sends = self._sends
        while True:
            await self._sends_waiting.wait()
            self._sends_waiting = anyio.Event()
            while sends:
                batch = self._next_sends()
                # Every request of the batch is answered below, once, whatever refused it:
                # one message (its result), or the batch as a whole (its shared options, a
                # closed session), which refuses each of its requests alike.
                try:
                    results = await self._send(batch)
                except ProtocolError:
                    raise  # the connection ends: the client fails what it still waits for
                except (MeshbusError, TypeError, ValueError) as exc:
                    results = [exc] * len(batch)
                for (send, _), result in zip(batch, results, strict=True):
                    if result is None:
                        self.answers.ok(send.id)
                    else:
                        self.answers.error(send.id, result)
            await self.connection.flush()

    def _next_sends(self) -> list[tuple[ev.Send, bytes]]:
        """The next SEND, with the pipelined ones behind it that can share its commit."""
        sends = self._sends
        batch = [sends.popleft()]
        first = batch[0][0]
        if first.batchable:
            while sends and sends[0][0].batchable and _same_send(sends[0][0], first):
                batch.append(sends.popleft())
        if len(sends) < _MAX_PIPELINED_SENDS:
            self._sends_room.set()
        return batch

    async def _send(self, batch: list[tuple[ev.Send, bytes]]) -> list[Any]:
        """Send ``batch``; one result per request: ``None`` (held) or the refusal.

        Raises when the batch is refused as a whole.
        """
        session = self.session
        send, payload = batch[0]
        options = _send_options(send)
        if options.pop("redelivered", False):  # sent again: the node may hold it already
            if send.queue is not None:
                options.pop("eliding_eligible", None)
                options.pop("retain", None)
            await session._send_again(send.topic, send.queue, payload, **options)
            return [None]
        if send.queue is not None:
            options.pop("eliding_eligible", None)
            options.pop("retain", None)
            await session.send_to_queue(send.queue, payload, **options)
            return [None]
        assert send.topic is not None
        if len(batch) == 1:
            await session.send(send.topic, payload, **options)
            return [None]
        # Only batchable sends get here: their options are the ones send_many takes.
        messages = [(each.topic or "", body) for each, body in batch]
        return await session.send_many(messages, **options)

    # --- deliveries and keepalive -------------------------------------------------------

    async def _pump(self) -> None:
        session = self.session
        receive_nowait = session.receive_nowait
        out = self.protocol.out
        while True:
            try:
                message: Message | None = await session.receive()
                # Everything waiting goes in one write, up to a bound: a reader may hand
                # the egress more per turn than one batch (a compressed connection's
                # inflate step, say), and a writer that took one batch per turn would
                # fall behind it and discard. One write is also one compression step.
                while message is not None:
                    self._encode_deliveries(message)
                    message = receive_nowait() if len(out) < _WRITE_BYTES else None
            except StateError:  # the session was closed (the node is stopping)
                await self.connection.send_close("session closed by the node")
                self._tg.cancel_scope.cancel()
                return
            await self.connection.flush()

    def _encode_deliveries(self, message: Message) -> None:
        """Queue ``message`` and what waits behind it, up to a batch's limits, as frames."""
        receive_nowait = self.session.receive_nowait
        batch = [message]
        # Whole sizes (headers too): what the batch's frame holds, at most about that.
        size = message.size
        while size < _BATCH_BYTES and len(batch) < _BATCH_MESSAGES:
            message = receive_nowait()  # type: ignore[assignment]
            if message is None:
                break
            batch.append(message)
            size += message.size
        protocol = self.protocol
        out = protocol.out  # a bytearray, extended in place
        limit = protocol.peer_max_frame_size
        try:
            if len(batch) == 1:
                out += encode_deliver(batch[0], limit)
            else:
                out += encode_deliver_batch(batch, limit)
        except (TypeError, FrameTooLarge):  # only an in-process publisher can cause these
            self._deliver_one_by_one(batch)

    def _on_ready(self) -> None:
        """The egress's hook: a message arrived while the pump waits for one."""
        write_through = self._write_through
        if not write_through.active:
            self.session.egress.wake()
        elif not self.marked:
            self.marked = True
            write_through.ready.append(self)

    @property
    def peer(self) -> str:
        """The client's address, in logs."""
        return self.connection.peer

    def wake_writer(self) -> None:
        """Let the pump write what waits (when :meth:`write_ready` could not)."""
        self.session.egress.wake()

    def write_ready(self) -> bool:
        """Write the waiting deliveries now, without the pump, if the stream takes them
        without waiting; otherwise wake the pump to write them (and return ``False``)."""
        egress = self.session.egress
        if not egress.consumer_waiting:
            return True  # the pump is awake (or the session closed): it takes them
        connection = self.connection
        receive_nowait = self.session.receive_nowait
        # Take messages only while they can be written at once: frames left queued
        # with no message behind them would wait for the next delivery.
        while self.protocol.state is ConnectionState.OPEN and connection.can_flush_nowait():
            message = receive_nowait()
            if message is None:
                return True
            self._encode_deliveries(message)
            connection.flush_nowait()
            self._write_through.writes += 1
        egress.wake()  # the pump writes the rest, awaiting room in the stream
        return False

    def _deliver_one_by_one(self, batch: list[Message]) -> None:
        out = self.protocol.out
        limit = self.protocol.peer_max_frame_size
        for message in batch:
            try:
                out += encode_deliver(message, limit)
            except (TypeError, FrameTooLarge) as exc:
                self.undeliverable += 1
                if self.undeliverable == 1:
                    log.warning(
                        "cannot send a message on %r to remote session %r: %s "
                        "(further ones are only counted)",
                        message.topic,
                        self.session.client_name,
                        exc,
                    )


def node_statistics(session: Session) -> dict[str, Any]:
    """What ``meshbus stats`` shows to ``session`` (SPEC 6).

    A session sees its own VPN's counters only: ``{"node": ..., "vpns": {own: ...}}``.
    A session whose username has the management role also gets the node's
    ``totals``, every VPN and the ``listeners``, which count every tenant's traffic.
    """
    node = session.node
    if not session.user.management:
        vpn = session.vpn
        return {
            "node": node.name,
            "vpns": {vpn.name: _as_dict(vpn.statistics())},
            "links": {vpn.name: _links(vpn)},
            "plugins": _plugins({vpn.name: vpn}),
        }
    from ._server import SERVERS

    stats: NodeStatistics = node.statistics()
    return {
        "node": node.name,
        "totals": _as_dict(stats),
        "vpns": {name: _as_dict(vpn.statistics()) for name, vpn in node.vpns.items()},
        "links": {name: _links(vpn) for name, vpn in node.vpns.items() if len(vpn.links)},
        "plugins": _plugins(node.vpns),
        "listeners": {
            server.url: _as_dict(server.statistics()) for server in node.stash.get(SERVERS, [])
        },
    }


def _links(vpn: Vpn) -> dict[str, Any]:
    """The counters of each of the VPN's links (bridges, routes), by link name."""
    return {link.name: _as_dict(link.statistics()) for link in vpn.links}


def _plugins(vpns: Mapping[str, Vpn]) -> dict[str, Any]:
    """The plugins' own figures for each VPN that has some."""
    found = {}
    for name, vpn in vpns.items():
        figures = vpn.node.plugins.vpn_statistics(vpn)
        if figures:
            found[name] = figures
    return found


def _as_dict(value: Any) -> dict[str, Any]:
    return attrs.asdict(value)


def _same_send(a: ev.Send, b: ev.Send) -> bool:
    """Whether two SENDs have the same options, as the wire gave them: ``1`` and ``true``
    differ, so a batch never lets through what the first one's checks would refuse."""
    return a.persistent is b.persistent and _same(a.headers, b.headers) and _same(a.ttl, b.ttl)


def _same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(value, b[key]) for key, value in a.items())
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


_OPTION_NAMES = (
    ("e", "eliding_eligible"),
    ("r", "reply_to"),
    ("c", "correlation_id"),
    ("rt", "retain"),
    ("rd", "redelivered"),
)


def _send_options(send: ev.Send) -> dict[str, Any]:
    """The keyword arguments of ``Session.send`` a SEND asks for."""
    options: dict[str, Any] = {
        "persistent": send.persistent,
        "headers": send.headers,
        "ttl": send.ttl,
    }
    for wire, name in _OPTION_NAMES:
        if wire in send.options:
            options[name] = send.options[wire]
    return options


WRITE_THROUGH: StashKey[WriteThrough] = StashKey()
"""The node's :class:`WriteThrough`, shared by its listeners' connections and its links."""


def write_through_of(node: Node) -> WriteThrough:
    """The node's :class:`WriteThrough`, made on first use: a listener of another kind
    (a plugin's) uses it so that what its readers publish reaches this node's
    connections and links in one write each, and its own connections' deliveries
    wait for whichever reader is publishing."""
    return node.stash.setdefault(WRITE_THROUGH, WriteThrough())


SERVED: StashKey[ServedSession] = StashKey()
"""A session's :class:`ServedSession` (``session.stash``), when a listener serves it."""
