"""One MQTT client's connection: its login, its packets, and what it is sent.

A connection reads packets in one task and answers them in order (on plain TCP under
asyncio, QoS 0 publishes are acted on in the transport's callback as they arrive,
without waking that task, and any other packet goes to the task with the rest of its
read); what the node has for the client is written by two more: one takes the direct
messages of the connection's meshbus session (QoS 0 subscriptions, shared ones and
everything a slow client's bounded buffer keeps, SPEC 2), the other the session
queue's flow (QoS 1 subscriptions), whose window is the client's receive maximum, so
no more QoS 1 messages are in flight than the client allows. Writes share one lock;
a client that stops reading holds up only its own tasks.

Anything the client sends that breaks the protocol ends this connection only
(SPEC 13): a :class:`MalformedPacket` is answered with a DISCONNECT that says why
(MQTT 5) and the connection is closed.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import nullcontext, suppress
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
from mqtt5 import (
    ConnectPacket,
    DisconnectPacket,
    PingReqPacket,
    PubAckPacket,
    PubCompPacket,
    PublishPacket,
    PubRecPacket,
    PubRelPacket,
    QoS,
    SubscribePacket,
    UnsubscribePacket,
)

from meshbus import (
    AccessDeniedError,
    AuthenticationError,
    ConfigurationError,
    DeliveryMode,
    InvalidTopicError,
    LimitExceededError,
    MeshbusError,
    Message,
    PublishRejectedError,
    Session,
    StateError,
    check_identity,
)
from meshbus.abc import Flow
from meshbus.transports import AsyncioTcpStream, write_through_of

from ._codec import (
    MQTT_5,
    AnyPublish,
    Codec,
    MalformedPacket,
    PacketReader,
    Publish311,
    read_connect,
)
from ._delivering import Delivering
from ._reasons import (
    BAD_AUTH_METHOD,
    IMPLEMENTATION_SPECIFIC,
    KEEPALIVE_TIMEOUT,
    NOT_AUTHORIZED,
    PROTOCOL_ERROR,
    QUOTA_EXCEEDED,
    RECEIVE_MAX_EXCEEDED,
    SERVER_SHUTTING_DOWN,
    TOPIC_ALIAS_INVALID,
    TOPIC_NAME_INVALID,
    Closed,
)
from ._sessions import MqttSession
from ._subscribing import Subscribing
from ._translate import publish_options
from ._wills import PendingWill, publish_will

if TYPE_CHECKING:
    from ._listener import MqttListener

__all__ = ["MqttConnection"]

log = logging.getLogger("meshbus.mqtt")

_PERSISTENT = DeliveryMode.PERSISTENT
_READ_SIZE = 65536
_BATCH = 64  # direct messages written in one go, at most
READ_SLICE = 256  # packets of one read acted on before other tasks get a turn

_PUBLISHES = (PublishPacket, Publish311)

_ENDINGS = (
    Closed,
    MalformedPacket,
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)


class MqttConnection(Subscribing, Delivering):
    """One connected MQTT client (made by its listener for each accepted stream)."""

    def __init__(
        self,
        listener: MqttListener,
        stream: anyio.abc.ByteStream,
        peer: str,
        address: str | None,
        certificate_name: str | None,
    ) -> None:
        self.listener = listener
        self.settings = listener.settings
        self.node = listener.node
        self.stream = stream
        self.peer = peer
        self.address = address
        self.certificate_name = certificate_name
        self.codec: Codec | None = None
        self.client_id = ""
        self.session: Session | None = None
        self.state: MqttSession | None = None
        self.flow: Flow | None = None
        self.keepalive = 0
        self.will: PendingWill | None = None  # this connection's, until it is settled
        self.client_max_packet: int | None = None
        self.client_receive_max = 65535
        self._write_lock = anyio.Lock()
        self._aliases: dict[int, str] = {}
        self._waiting: list[tuple[str, AnyPublish]] = []  # QoS 1/2 publishes to commit
        self._work = anyio.Event()
        self._room = anyio.Event()
        self._commit_lock = anyio.Lock()
        self._inflight: dict[int, Message] = {}
        self._shares: dict[str, Flow] = {}
        self._share_ids: dict[int, Flow] = {}
        self._out_room: anyio.Event | None = None
        #: Spool ids of retained values put in the queue, written to the client as they
        #: go out, and the event set once none is left (see Subscribing._send_retained).
        self._retained_due: tuple[set[int], anyio.Event] | None = None
        self._written_ids: list[int] = []
        self._next_id = 0
        self._special = False  # see MqttSession.special
        self._direct_busy = False  # the direct deliverer holds messages it has not written
        #: The node's readers' shared write-through (see :meth:`_write_through`).
        self.write_through = write_through_of(self.node)
        self.marked = False
        self._unwritten: list[bytes] = []
        self._ended = anyio.Event()
        self._scope: anyio.CancelScope | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._failure: BaseException | None = None
        self.taken_over = False
        self.closing = False  # it said goodbye (see goodbye): nothing more is written

    # --- the connection's life --------------------------------------------------------

    async def serve(self, logged_in: anyio.Event) -> None:
        """Serve the connection until it closes; set ``logged_in`` once it is answered."""
        reader = PacketReader(self.settings.connect_packet_size)
        try:
            with self.node.clock.move_on_after(self.settings.connect_timeout) as waited:
                first = await self._first_packet(reader)
                accepted = await self._connect(first)
            logged_in.set()
            if waited.cancelled_caught:
                log.info("closing MQTT connection from %s: no CONNECT in time", self.peer)
                return
            if not accepted:
                return
            reader.limit = self.settings.max_packet_size
            await self._run(reader)
        except MalformedPacket as exc:
            self.listener.malformed += 1
            log.info("closing MQTT connection from %s: %s", self.peer, exc)
            await self._say_disconnect(exc.reason_code, str(exc))
        except Closed as exc:
            log.info("closing MQTT connection from %s (%s): %s", self.peer, self.client_id, exc)
            if exc.code is not None:
                await self._say_disconnect(exc.code, str(exc))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            log.debug("MQTT connection from %s lost", self.peer)
        finally:
            logged_in.set()
            with anyio.CancelScope(shield=True):
                await self._end()
                await anyio.aclose_forcefully(self.stream)

    async def _first_packet(self, reader: PacketReader) -> bytes:
        """The CONNECT. A client need not wait for the CONNACK (MQTT 3.1.4): what it
        sent after the CONNECT stays in ``reader``, read once it is logged in, under
        the logged-in packet size limit."""
        while True:
            data = await self.stream.receive(_READ_SIZE)
            packets = reader.feed(data, most=1)
            if packets:
                return packets[0]

    async def _connect(self, first: bytes) -> bool:
        try:
            level, connect = read_connect(first)
        except MalformedPacket as exc:
            if exc.reason_code == 0x84:  # answer an old or unknown version as 3.1.1 does
                await self._write(Codec(4).connack(False, 0x84))
                self.listener.refused += 1
                return False
            raise
        codec = self.codec = Codec(level)
        settings = self.settings
        if connect.authentication_method is not None:
            await self._write(codec.connack(False, BAD_AUTH_METHOD))
            self.listener.refused += 1
            return False
        client_id = connect.client_id
        assigned = None
        if not client_id:
            if level != MQTT_5 and not connect.clean_start:
                await self._write(codec.connack(False, 0x85))  # identifier rejected
                self.listener.refused += 1
                return False
            client_id = assigned = f"mqtt-{uuid.uuid4().hex[:16]}"
        try:
            check_identity("client id", client_id)  # it names the client's meshbus session
        except ConfigurationError as exc:
            log.info("MQTT login from %s refused: %s", self.peer, exc)
            await self._write(codec.connack(False, 0x85))  # identifier not valid / rejected
            self.listener.refused += 1
            return False
        self.client_id = client_id
        password = connect.password
        try:
            text = None if password is None else password.decode("utf-8")
        except UnicodeDecodeError:
            text = "\x00"  # bytes no password of a meshbus user can be: refused below
        username = connect.username or self.certificate_name or "default"
        will = connect.will
        try:
            session = await self.node.login(
                settings.vpn,
                username=username,
                password=text,
                client_name=client_id,
                certificate_name=self.certificate_name,
                address=self.address,
                replace=True,  # MQTT session takeover, once this client proved who it is
            )
            if will is not None:
                session.check_publish_acl(will.topic)
        except (AuthenticationError, AccessDeniedError, InvalidTopicError) as exc:
            code = 0x86 if isinstance(exc, AuthenticationError) else NOT_AUTHORIZED
            self.node.logins.log_refusal(log, self.peer, f"MQTT login refused: {exc}")
            await self._write(codec.connack(False, code))
            self.listener.refused += 1
            return False
        except (StateError, ConfigurationError) as exc:
            log.warning("MQTT login from %s refused: %s", self.peer, exc)
            await self._write(codec.connack(False, 0x88))  # server unavailable
            self.listener.refused += 1
            return False
        self.session = session
        session.leaves_out = self._no_local_out
        _own_retained(session)
        if will is not None:
            self.will = PendingWill.of(will, level == MQTT_5, username, session.user)
        self.keepalive = connect.keep_alive
        server_keepalive = None
        if level == MQTT_5 and (self.keepalive == 0 or self.keepalive > settings.max_keepalive):
            self.keepalive = server_keepalive = settings.max_keepalive
        self.client_max_packet = connect.max_packet_size
        self.client_receive_max = connect.receive_max if level == MQTT_5 else 65535
        expiry = min(connect.session_expiry_interval, settings.max_session_expiry)
        present = await self._take_session(connect, expiry)
        properties: dict[str, Any] = {}
        if level == MQTT_5:
            properties = {
                "assigned_client_id": assigned,
                "server_keep_alive": server_keepalive,
                "receive_max": settings.receive_maximum,
                "topic_alias_max": settings.topic_alias_maximum,
                "max_packet_size": settings.max_packet_size,
                "max_qos": QoS.EXACTLY_ONCE,  # QoS 2 publishes are taken
                "subscription_id_available": True,
            }
            if expiry != connect.session_expiry_interval:
                properties["session_expiry_interval"] = expiry
        await self._write(codec.connack(present, 0, **properties))
        self.listener.logins += 1
        return True

    async def _take_session(self, connect: ConnectPacket, expiry: int) -> bool:
        """Take over the client id's session (or start one); whether one was present."""
        registry = self.listener.registry
        vpn = self.settings.vpn
        state = registry.get(vpn, self.client_id)
        if state is not None and state.connection is not None:
            old = state.connection
            old.taken_over = True
            will, old.will = old.will, None  # its session is closed: this one publishes it
            await old.stop()
            # MQTT 5 (3.1.4): the will of a client taken over is published, unless it
            # has a delay and the session goes on (the client came back within it).
            if will is not None and (connect.clean_start or not will.delay):
                assert self.session is not None
                self.listener.wills += await publish_will(self.session, will, self.client_id)
            # Its end may have ended the session too (one that did not outlive it).
            state = registry.get(vpn, self.client_id)
        if state is not None and connect.clean_start:
            await registry.discard(state)  # a will that waits goes now, as the session ends
            state = None
        present = state is not None
        if state is None:
            state = registry.create(vpn, self.client_id, expiry)
        state.expiry = expiry
        state.connection = self
        state.offline_since = None
        state.generation += 1  # the client is back: a will that waits stands down
        state.will = self.will
        self.state = state
        session = self.session
        assert session is not None
        for sub in state.subscriptions.values():  # QoS 0 ones are this connection's own
            if sub.direct:
                for each in sub.filters:
                    session.subscribe(each)
        self._special = state.special
        registry.save(state)
        return present

    async def stop(self) -> None:
        """End this connection (taken over by a new one) and wait until it has."""
        if self._scope is not None:
            self._scope.cancel()
        elif self.session is not None:
            self.session.close()
        await self._ended.wait()

    async def _run(self, reader: PacketReader) -> None:
        async with anyio.create_task_group() as tg:
            self._scope = tg.cancel_scope
            self._tg = tg
            self._write_through()
            tg.start_soon(self._guarded, self._deliver_direct)
            tg.start_soon(self._guarded, self._commit_loop)
            state = self.state
            if state is not None and state.queue is not None:
                await self._bind(tg)
            if state is not None:
                for sub in list(state.subscriptions.values()):
                    if sub.share_queue is not None and sub.share_queue not in self._shares:
                        await self._bind_share(tg, sub.share_queue)
            await self._guarded(self._read_on, reader)
        if self._failure is not None:
            raise self._failure

    async def _guarded(self, part: Any, *args: Any) -> None:
        """Run one part of the connection; the first to end ends the others, and what
        ended it is raised by :meth:`_run` once they have all stopped."""
        try:
            await part(*args)
        except _ENDINGS as exc:
            if self._failure is None:
                self._failure = exc
        assert self._scope is not None
        self._scope.cancel()

    async def _end(self) -> None:
        """After the connection: the will, the flow, and the session's fate."""
        state, session = self.state, self.session
        try:
            if self.flow is not None:
                flow, self.flow = self.flow, None
                with suppress(MeshbusError):
                    await flow.unbind()
            for queue in list(self._shares):
                await self._unbind_share(queue)
            if state is None or state.connection is not self:
                return
            state.connection = None
            if session is not None and not session.closed:
                for sub in state.subscriptions.values():
                    if sub.direct:
                        for each in sub.filters:
                            session.unsubscribe(each)
            registry = self.listener.registry
            will, self.will = self.will, None
            state.will = None
            delay = 0 if will is None else min(will.delay, state.expiry)
            stopping = session is None or session.closed  # the node stops under it
            if will is not None and (delay or stopping):
                # It waits with the session, saved with it: for its delay, or, when the
                # node stops, until it is back (a session that ends now publishes it).
                state.will = will
            elif will is not None and session is not None:
                self.listener.wills += await publish_will(session, will, self.client_id)
            if state.expiry == 0:
                await registry.discard(state)
            else:
                # The expiry counts from now, whatever the will does meanwhile.
                state.offline_since = self.node.clock.time()
                registry.save(state)
                registry.expire_later(state)
                if state.will is not None and not stopping:
                    registry.will_later(state, delay)
        finally:
            if session is not None:
                session.close()
            self._ended.set()

    # --- reading ------------------------------------------------------------------------

    async def _read_on(self, reader: PacketReader) -> None:
        """Act on what the client sent right behind its CONNECT, then read on."""
        pending = reader.feed(b"")
        if pending:
            await self._packets(pending)
        await self._read(reader)

    async def _read(self, reader: PacketReader) -> None:
        stream = self.stream
        if isinstance(stream, AsyncioTcpStream):
            await self._read_in_callbacks(stream, reader)
            return
        clock = self.node.clock
        limit = self.keepalive * 1.5
        while True:
            with clock.move_on_after(limit) if limit else nullcontext() as waited:
                data = await stream.receive(_READ_SIZE)
            if waited is not None and waited.cancelled_caught:
                raise Closed("keepalive timed out", KEEPALIVE_TIMEOUT)
            await self._packets(reader.feed(data))

    async def _packets(self, packets: list[bytes]) -> None:
        """Act on ``packets`` in order, letting other tasks run after each
        :data:`READ_SLICE` of them (a QoS 0 publish never awaits on its own)."""
        read = self.codec.read  # type: ignore[union-attr]
        for n, raw in enumerate(packets, 1):
            packet = read(raw)
            if isinstance(packet, _PUBLISHES):
                await self._publish(packet)
            else:
                await self._control(packet)
            if not n % READ_SLICE and n < len(packets):
                await anyio.lowlevel.checkpoint()

    async def _read_in_callbacks(self, stream: AsyncioTcpStream, reader: PacketReader) -> None:
        """Read as :meth:`_read` does, acting on QoS 0 publishes and PUBACKs in the
        transport's callback as they arrive (no task wakes for them); any other packet
        goes to this task, with the rest of its read, in order, and so does what is
        left of a read after its first :data:`READ_SLICE` packets (a flood of tiny
        publishes must not hold the loop for a whole read). While input is queued
        (this task was busy), reads wait for this task's turn, as in :meth:`_read`."""
        read = self.codec.read  # type: ignore[union-attr]
        clock = self.node.clock
        limit = self.keepalive * 1.5
        heard = clock.monotonic()
        later: list[bytes] = []
        failed: list[Exception] = []

        write_through = self.write_through

        def received(data: bytes) -> None:
            nonlocal heard
            heard = clock.monotonic()
            # What the QoS 0 publishes of this read make the node write goes out in
            # one write per connection at the end (see WriteThrough).
            write_through.active = True
            try:
                packets = reader.feed(data)
                for i, raw in enumerate(packets):
                    if i == READ_SLICE:  # the rest in this task, a slice at a time
                        later.extend(packets[i:])
                        stream.set_receiver(None)
                        return
                    packet = read(raw)
                    if isinstance(packet, _PUBLISHES) and packet.qos == 0:
                        self._publish_qos0(self._topic_of(packet), packet)
                    elif isinstance(packet, PubAckPacket):
                        self._acked(packet)
                    else:
                        later.extend(packets[i:])
                        stream.set_receiver(None)
                        return
            except Exception as exc:
                failed.append(exc)
                stream.set_receiver(None)
            finally:
                write_through.drain()

        while True:
            if later:
                packets = later[:]
                later.clear()
                await self._packets(packets)
            if failed:
                raise failed[0]
            if stream.queued:
                await self._packets(reader.feed(await stream.receive(_READ_SIZE)))
                heard = clock.monotonic()
                continue
            try:
                stream.set_receiver(received)
                if later or failed:
                    continue
                wait = limit - (clock.monotonic() - heard) if limit else None
                if wait is not None and wait <= 0:
                    raise Closed("keepalive timed out", KEEPALIVE_TIMEOUT)
                with clock.move_on_after(wait) if wait else nullcontext():
                    await stream.wait_receiver()
            finally:
                stream.set_receiver(None)

    def _plain(self, packet: AnyPublish) -> bool:
        """Whether a QoS 1 publish can share a store commit with others: no retain,
        no topic alias and, on MQTT 5, no properties (those go one by one)."""
        if packet.retain or packet.topic_alias is not None or not packet.topic:
            return False
        if self.codec is not None and self.codec.v5:
            return not (
                packet.user_properties
                or packet.content_type is not None
                or packet.payload_format_indicator
                or packet.response_topic is not None
                or packet.correlation_data is not None
                or packet.message_expiry_interval is not None
            )
        return True

    async def _commit_loop(self) -> None:
        """Take the QoS 1 and 2 publishes the reader queued, in order, and answer each
        once the node holds it: plain QoS 1 ones that queued up together share one
        store commit, so a client with many in flight does not wait for a commit
        each; the reader goes on reading meanwhile."""
        while True:
            if not self._waiting:
                self._work = anyio.Event()
                await self._work.wait()
                continue
            async with self._commit_lock:
                await self._commit_waiting()

    async def _commit_waiting(self) -> None:
        items, self._waiting = self._waiting, []
        self._room.set()
        codec = self.codec
        assert codec is not None
        acks: list[bytes] = []
        state = self.state
        assert state is not None
        received = len(state.received)
        i = 0
        while i < len(items):
            j = i
            while j < len(items) and items[j][1].qos == 1 and self._plain(items[j][1]):
                j += 1
            if j - i > 1:
                acks += await self._send_batch(items[i:j])
                i = j
            else:
                acks.append(await self._send_one(*items[i]))
                i += 1
        if len(state.received) != received:
            self.listener.registry.save(state)  # kept before its PUBREC goes (see _send_one)
        await self._write(b"".join(acks))

    async def _send_batch(self, batch: list[tuple[str, AnyPublish]]) -> list[bytes]:
        """Plain QoS 1 publishes: one store commit, then a PUBACK each (with its own
        reason when one was refused)."""
        session = self.session
        codec = self.codec
        assert session is not None
        assert codec is not None
        try:
            results = await session.send_many([(t, p.payload) for t, p in batch])
        except MeshbusError as exc:
            log.warning("MQTT client %r: %d publishes failed: %s", self.client_id, len(batch), exc)
            results = [exc] * len(batch)
        acks = []
        for (_, packet), result in zip(batch, results, strict=True):
            reason = 0 if result is None else _reason(result)
            if reason:
                self.listener.refused_publishes += 1
            acks.append(codec.ack(4, packet.packet_id or 0, reason))
        return acks

    async def _send_one(self, topic: str, packet: AnyPublish) -> bytes:
        codec = self.codec
        session = self.session
        assert codec is not None
        assert session is not None
        packet_id = packet.packet_id or 0
        received = self.state.received if self.state is not None else set()
        if packet.qos == 2 and packet_id in received:
            # Sent again, maybe on a later connection: it was taken already.
            return codec.ack(5, packet_id)
        options = publish_options(packet) if codec.v5 else {}
        reason = await self._send(session, topic, packet, options)
        if packet.qos == 2:
            if reason < 0x80:
                # Part of the session (MQTT 4.3.3): the caller saves it before the
                # PUBREC goes, so a resend after a restart or crash is known too.
                received.add(packet_id)
            return codec.ack(5, packet_id, reason)
        return codec.ack(4, packet_id, reason)

    def _acked(self, packet: PubAckPacket) -> None:
        """The client's PUBACK: the message it acknowledges leaves the queue."""
        message = self._inflight.pop(packet.packet_id, None)
        if message is None:
            return
        self._wake_room()
        if self._share_ids:
            share_flow = self._share_ids.pop(packet.packet_id, None)
            if share_flow is not None:
                # Unbound meanwhile (its subscription went): the queue has it back.
                with suppress(MeshbusError):
                    share_flow.ack(message)
                return
        if self.state is not None and message.message_id is not None:
            self.state.release_id(message.message_id)
        if self.flow is not None:
            # Gone from the flow meanwhile (its session's queue was deleted while a
            # new connection took the client id over): a late PUBACK, nothing to do.
            with suppress(StateError):
                self.flow.ack(message)

    async def _released(self, packet_id: int) -> None:
        """The client's PUBREL: the id is free for a new message, in the session's
        file too before the PUBCOMP goes (a crash after it must not take a new
        message with that id for a resend)."""
        state = self.state
        codec = self.codec
        assert state is not None
        assert codec is not None
        known = packet_id in state.received
        if known:
            state.received.discard(packet_id)
            self.listener.registry.save(state)
        await self._write(codec.ack(7, packet_id, 0 if known else 0x92))

    async def _control(self, packet: Any) -> None:
        kind = type(packet)
        codec = self.codec
        assert codec is not None
        if kind is PubAckPacket:
            self._acked(packet)
        elif kind is PingReqPacket:
            await self._write(codec.pingresp())
        elif kind is SubscribePacket:
            await self._subscribe(packet)
        elif kind is UnsubscribePacket:
            await self._unsubscribe(packet)
        elif kind is PubRelPacket:
            await self._released(packet.packet_id)
        elif kind is DisconnectPacket:
            async with self._commit_lock:  # what it sent before its goodbye is answered
                if self._waiting:
                    await self._commit_waiting()
            if packet.reason_code != 4:  # 4: disconnect with will message
                self.will = None
            state = self.state
            expiry = packet.session_expiry_interval
            if state is not None and expiry is not None:
                if state.expiry == 0 and expiry:
                    raise Closed("session expiry set at DISCONNECT after 0", PROTOCOL_ERROR)
                state.expiry = min(expiry, self.settings.max_session_expiry)
            raise Closed("the client disconnected")
        elif kind is ConnectPacket:
            raise MalformedPacket("a second CONNECT", PROTOCOL_ERROR)
        elif kind in (PubRecPacket, PubCompPacket):
            pass  # the node sends at most QoS 1: nothing of these is expected, nothing to do
        else:
            # AUTH (enhanced authentication) is not offered: CONNACK said no method.
            raise MalformedPacket(f"{kind.__name__} is not supported", PROTOCOL_ERROR)

    async def _publish(self, packet: AnyPublish) -> None:
        topic = self._topic_of(packet)
        qos = packet.qos
        if qos == 0:
            self._publish_qos0(topic, packet)
            return
        taken = len(self.state.received) if self.state is not None else 0
        if taken + len(self._waiting) >= self.settings.receive_maximum and qos == 2:
            raise Closed("more QoS 2 publishes in flight than allowed", RECEIVE_MAX_EXCEEDED)
        self._waiting.append((topic, packet))
        self._work.set()
        while len(self._waiting) >= self.settings.receive_maximum:
            self._room = anyio.Event()
            await self._room.wait()  # the client sends more than it may: it waits

    def _topic_of(self, packet: AnyPublish) -> str:
        """The topic a PUBLISH is for (its alias resolved), checked; counts it."""
        topic = packet.topic
        alias = packet.topic_alias
        if alias is not None:
            if not 0 < alias <= self.settings.topic_alias_maximum:
                raise Closed(f"topic alias {alias} is out of range", TOPIC_ALIAS_INVALID)
            if topic:
                self._aliases[alias] = topic
            else:
                known = self._aliases.get(alias)
                if known is None:
                    raise Closed(f"topic alias {alias} was never set", PROTOCOL_ERROR)
                topic = known
        if "+" in topic or "#" in topic:
            raise MalformedPacket("a PUBLISH topic holds a wildcard", TOPIC_NAME_INVALID)
        self.listener.received += 1
        return topic

    def _publish_qos0(self, topic: str, packet: AnyPublish) -> None:
        codec = self.codec
        session = self.session
        assert codec is not None
        assert session is not None
        options = publish_options(packet) if codec.v5 else {}
        try:
            session.publish(
                topic,
                packet.payload,
                retain=packet.retain,
                ttl=packet.message_expiry_interval,  # None on MQTT 3.1.1
                **options,
            )
        except InvalidTopicError as exc:
            raise Closed(f"topic {topic!r} is not valid: {exc}", TOPIC_NAME_INVALID) from None
        except (AccessDeniedError, PublishRejectedError) as exc:
            self.listener.refused_publishes += 1
            log.info("MQTT client %r: QoS 0 publish dropped: %s", self.client_id, exc)

    async def _send(
        self, session: Session, topic: str, packet: AnyPublish, options: dict[str, Any]
    ) -> int:
        """Publish a QoS 1/2 message as a persistent guaranteed one; its reason code."""
        try:
            await session.send(
                topic,
                packet.payload,
                ttl=packet.message_expiry_interval,
                retain=packet.retain,
                **options,
            )
        except MeshbusError as exc:
            reason = _reason(exc)
            if reason != TOPIC_NAME_INVALID:
                self.listener.refused_publishes += 1
            log.info("MQTT client %r: publish to %r refused: %s", self.client_id, topic, exc)
            return reason
        return 0

    # --- writing ----------------------------------------------------------------------

    async def _write(self, data: bytes) -> None:
        if not data or self.closing:
            return
        async with self._write_lock:
            if not self.closing:  # it may have said goodbye while this waited
                await self.stream.send(data)

    async def goodbye(self, why: str) -> None:
        """Tell an MQTT 5 client the node closes its connection ("server shutting
        down"), within a second; nothing is written after it (MQTT-3.14.4-1): from
        now on writes are dropped, a write under way finishes first, and the direct
        messages a reader's read made wait for its end are dropped too. A 3.1.1
        client has no such packet: its connection just closes."""
        codec = self.codec
        if codec is None or not codec.v5 or self.session is None or self._scope is None:
            return
        self.closing = True
        self._unwritten.clear()
        with anyio.move_on_after(1):
            async with self._write_lock:
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    await self.stream.send(codec.disconnect(SERVER_SHUTTING_DOWN, why))

    async def _say_disconnect(self, code: int, why: str) -> None:
        codec = self.codec
        if codec is None or not codec.v5 or self.session is None:
            return
        try:
            with anyio.move_on_after(1):
                await self._write(codec.disconnect(code, why[:200]))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass


def _own_retained(session: Session) -> None:
    """Tell the retained plugin this session hands out retained values itself."""
    try:
        from meshbus.plugins.retained import OWN_RETAINED
    except ImportError:
        return
    session.stash[OWN_RETAINED] = True


def _reason(exc: BaseException) -> int:
    """The PUBACK reason code of a refused publish."""
    if isinstance(exc, InvalidTopicError):
        return TOPIC_NAME_INVALID
    if isinstance(exc, AccessDeniedError):
        return NOT_AUTHORIZED
    if isinstance(exc, PublishRejectedError | LimitExceededError):
        return QUOTA_EXCEEDED
    return IMPLEMENTATION_SPECIFIC
