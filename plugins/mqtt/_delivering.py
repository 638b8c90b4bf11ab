"""What an MQTT connection sends its client: direct messages at QoS 0 from its
session's bounded buffer, and QoS 1 ones from its queue's flow, whose window keeps
no more of them in flight than the client's receive maximum."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import anyio
import anyio.abc

from meshbus import (
    DeliveryMode,
    MeshbusError,
    Message,
    StateError,
    filter_matches,
)
from meshbus.abc import Flow

from ._parts import Parts
from ._reasons import (
    SERVER_SHUTTING_DOWN,
    SESSION_TAKEN_OVER,
    Closed,
)
from ._sessions import Subscribed
from ._translate import v5_properties

log = logging.getLogger("meshbus.mqtt")
_PERSISTENT = DeliveryMode.PERSISTENT
_BATCH = 64  # messages written in one go, at most

__all__ = ["Delivering", "wild_first"]


class Delivering(Parts):
    """The delivery half of :class:`~meshbus.plugins.mqtt._connection.MqttConnection`."""

    # --- delivering -------------------------------------------------------------------

    async def _bind(self, tg: anyio.abc.TaskGroup) -> None:
        state, session = self.state, self.session
        assert state is not None
        assert session is not None
        assert state.queue is not None
        self.flow = await session.bind(state.queue, window=self._window())
        tg.start_soon(self._guarded, self._deliver_queued, self.flow)

    def _window(self) -> int:
        """The most QoS 1 messages in flight to the client: what it and the listener
        allow."""
        allowed: int = self.settings.max_inflight
        return min(allowed, self.client_receive_max)

    async def _bind_share(self, tg: anyio.abc.TaskGroup, queue: str) -> None:
        """Bind a flow to a share group's queue and deliver from it: the queue hands
        each message to one of the group's connected members."""
        session = self.session
        assert session is not None
        flow = await session.bind(queue, window=self._window())
        self._shares[queue] = flow

        async def deliver() -> None:
            with contextlib.suppress(_Unbound):  # its subscription went: the connection stays
                await self._guarded(self._deliver_shared, flow, queue)

        tg.start_soon(deliver)

    async def _unbind_share(self, queue: str) -> None:
        """Stop delivering from a share group's queue: what the client has not
        acknowledged goes back to the queue, for another member. Its deliverer ends
        when it next meets the flow, never in the middle of a write."""
        flow = self._shares.pop(queue, None)
        if flow is not None:
            self._wake_room()  # a deliverer waiting for room in the window sees it too
            with contextlib.suppress(MeshbusError):  # the queue is gone already
                await flow.unbind()

    async def _window_room(self, queue: str | None = None) -> None:
        """Wait until the client's window has room, when flows of share groups' queues
        fill it too (a flow's own window bounds only what comes through it); for the
        deliverer of ``queue``, :class:`_Unbound` once it is unbound."""
        window = self._window()
        while self._shares and len(self._inflight) >= window:
            if queue is not None and queue not in self._shares:
                raise _Unbound
            if self._out_room is None:
                self._out_room = anyio.Event()
            await self._out_room.wait()
        if queue is not None and queue not in self._shares:
            raise _Unbound

    def _wake_room(self) -> None:
        room = self._out_room
        if room is not None:
            self._out_room = None
            room.set()

    def _skip(self, message: Message) -> bool:
        """Whether no-local keeps the direct ``message`` (QoS 0) from the client (only
        when asked for): only the session's direct subscriptions count, per subscription
        (MQTT-3.8.3-3: a no-local t/# and a t/a of the client's own message, each on its
        own way, deliver it through t/a only). Decided as it is delivered: direct
        messages wait in a short buffer only."""
        return self._no_local(message.sender, message.topic, False)

    def _hidden(self, topic: str, queued: bool) -> bool:
        """Whether a message to a ``$`` topic came only through subscriptions whose
        filters start with a wildcard (``#``, ``+/x``), which match no such topic in
        MQTT (MQTT-4.7.2-1), though they do in meshbus; called for ``$`` topics only."""
        state = self.state
        if state is None:
            return False
        for s in state.subscriptions.values():
            if s.queued if queued else s.direct:
                for f in s.filters:
                    if filter_matches(_shared_filter(f), topic) and not wild_first(f):
                        return False
        return True

    def _no_local_out(self, endpoint: str, topic: str) -> bool:
        """The session's :attr:`~meshbus.Session.leaves_out`: the client's own message
        does not go to its queue when only no-local subscriptions of the queue match
        it, decided as it is sent: a subscription replaced later (MQTT 5: that loses no
        message) or removed changes nothing of what was queued before."""
        state = self.state
        if not self._special or state is None or state.queue is None:
            return False
        if endpoint != f"{state.vpn}/{state.queue}":
            return False
        return self._no_local(self.client_id, topic, True)

    def _no_local(self, sender: str | None, topic: str, queued: bool) -> bool:
        if sender != self.client_id or self.state is None:
            return False
        matching = [  # shared subscriptions take no no-local: they are left out
            s
            for s in self.state.subscriptions.values()
            if (s.queued if queued else s.direct)
            and not s.shared
            and any(filter_matches(f, topic) for f in s.filters)
        ]
        return bool(matching) and all(s.no_local for s in matching)

    def _retain_flag(self, message: Message) -> bool:
        if message.retained:
            return True
        if not message.retain or not self._special or self.state is None:
            return False
        return any(
            s.retain_as_published and any(filter_matches(f, message.topic) for f in s.filters)
            for s in self.state.subscriptions.values()
        )

    def _identifiers(self, topic: str, queued: bool) -> list[int]:
        """The identifiers of the subscriptions that bring ``topic`` by this way (the
        session's direct subscriptions, or its queue's), which its PUBLISH carries."""
        state = self.state
        if state is None:
            return []
        found = {
            s.identifier
            for s in state.subscriptions.values()
            if s.identifier is not None
            and (s.queued if queued else s.direct)
            and any(filter_matches(_shared_filter(f), topic) for f in s.filters)
        }
        return sorted(found)

    def _encode(
        self,
        message: Message,
        qos: int,
        packet_id: int | None,
        retain: bool,
        *,
        queued: bool = False,
        ids: list[int] | None = None,
    ) -> bytes:
        """The PUBLISH of ``message``; with a subscription identifier in play, it
        carries those of the subscriptions that bring it (``ids``, or found for the
        way it came: the queue's subscriptions if ``queued``, else the session's)."""
        codec = self.codec
        assert codec is not None
        properties = v5_properties(message, self.node.clock.time()) if codec.v5 else None
        if self._special and codec.v5:
            ids = self._identifiers(message.topic, queued) if ids is None else ids
            if ids:
                properties = {**(properties or {}), "subscription_ids": ids}
        return codec.publish(
            message.topic,
            message.payload,
            qos,
            packet_id,
            retain,
            message.redelivered and qos > 0,
            properties,
        )

    def _write_through(self) -> None:
        """Write direct messages from the publisher's own call when the connection is
        idle: nothing buffered for it, no write under way, and a socket that takes
        bytes now. It saves the wake-up of :meth:`_deliver_direct` per message (a good
        part of a round trip); anything else goes to the session's bounded buffer as
        before, in order. Only on a session without delivery stages (eliding's), and
        on a stream that can write without waiting (plain TCP on asyncio).

        While a reader of this node publishes what it read (the node's
        :class:`~meshbus.transports.WriteThrough` is active), the packets wait in
        :attr:`_unwritten` and go out in one write when the reader is done with its
        read (:meth:`write_ready`), not one write each."""
        session = self.session
        stream: Any = self.stream
        if session is None or session.deliver is not session.sink:
            return
        writable = getattr(stream, "writable_now", None)
        if writable is None:
            return
        buffered = session.sink
        egress = session.egress
        lock = self._write_lock
        send_now = stream.send_nowait
        limit = self.client_max_packet
        listener = self.listener
        write_through = self.write_through
        unwritten = self._unwritten

        def deliver(message: Message) -> None:
            if len(egress) or self._direct_busy or lock.locked() or self.closing or not writable():
                buffered(message)
                return
            if self._special and self._skip(message):
                return
            if message.topic[0] == "$" and self._hidden(message.topic, False):
                return
            try:
                data = self._encode(message, 0, None, self._retain_flag(message))
            except Exception:  # the buffered path meets it again and ends the connection
                buffered(message)
                return
            if limit is not None and len(data) > limit:
                listener.too_large += 1
                return
            listener.sent += 1
            listener.written_through += 1
            if not write_through.active:
                send_now(data)
                return
            unwritten.append(data)
            if not self.marked:
                self.marked = True
                write_through.ready.append(self)

        session.sink = deliver
        session.deliver = deliver

    def write_ready(self) -> bool:
        """Write the packets :meth:`_write_through` kept for the end of a reader's
        read, in one write (the node's write-through calls it then)."""
        unwritten = self._unwritten
        if unwritten and not self.closing:
            data = b"".join(unwritten)
            unwritten.clear()
            stream: Any = self.stream
            if stream.writable_now():  # else it is closing: the packets go with it
                stream.send_nowait(data)
        return True

    def wake_writer(self) -> None:
        """Nothing to wake: :meth:`write_ready` writes at once or not at all."""

    async def _deliver_direct(self) -> None:
        session = self.session
        assert session is not None
        limit = self.client_max_packet
        clock_time = self.node.clock.time
        while True:
            try:
                message = await session.receive()
            except StateError:
                code = SESSION_TAKEN_OVER if self.taken_over else SERVER_SHUTTING_DOWN
                raise Closed("the session was closed by the node", code) from None
            # Taken out of the buffer and not written yet: the write-through waits.
            self._direct_busy = True
            try:
                batch = [message]
                while len(batch) < _BATCH:
                    more = session.receive_nowait()
                    if more is None:
                        break
                    batch.append(more)
                out = []
                now = clock_time()
                for each in batch:
                    expires = each.expires_at
                    if expires is not None and expires <= now:
                        # It waited in the buffer past its expiry interval: gone, as
                        # MQTT-3.3.2-5 asks (the write-through path sends at once).
                        self.listener.expired += 1
                        continue
                    if self._special and self._skip(each):
                        continue
                    if each.topic[0] == "$" and self._hidden(each.topic, False):
                        continue
                    data = self._encode(each, 0, None, self._retain_flag(each))
                    if limit is not None and len(data) > limit:
                        self.listener.too_large += 1
                        continue
                    out.append(data)
                if out:
                    self.listener.sent += len(out)
                    await self._write(b"".join(out))
            finally:
                self._direct_busy = False

    async def _deliver_queued(self, flow: Flow) -> None:
        """Send the queue's messages as the flow hands them out: what it holds already
        goes in one write with the first (up to :data:`_BATCH`), not a write each."""
        inflight, window = self._inflight, self._window()
        while True:
            try:
                each: Message | None = await flow.receive()
                if self._shares:
                    # Held until the client's window has room (a flow of a share
                    # group may have filled it while this one waited for a message).
                    await self._window_room()
                out: list[bytes] = []
                while each is not None:
                    data = self._queued_packet(flow, each)
                    if data is not None:
                        out.append(data)
                    more = len(out) < _BATCH and (not self._shares or len(inflight) < window)
                    each = flow.receive_nowait() if more else None
            except (MeshbusError, StopAsyncIteration):
                raise Closed(
                    "the queue's flow was closed by the node", SERVER_SHUTTING_DOWN
                ) from None
            if out:
                self.listener.sent += len(out)
                await self._write(b"".join(out))
                due = self._retained_due
                if due is not None:
                    due[0].difference_update(self._written_ids)
                    if not due[0]:
                        due[1].set()
            self._written_ids.clear()

    async def _deliver_shared(self, flow: Flow, queue: str) -> None:
        """Send the messages a share group's queue hands this member, at the QoS of the
        member's subscription."""
        inflight, window = self._inflight, self._window()
        while True:
            try:
                each: Message | None = await flow.receive()
                await self._window_room(queue)  # held until the client's window has room
                sub = self._share_subscription(queue)
                out: list[bytes] = []
                while each is not None:
                    data = self._shared_packet(flow, sub, each)
                    if data is not None:
                        out.append(data)
                    more = len(out) < _BATCH and len(inflight) < window
                    each = flow.receive_nowait() if more else None
            except (MeshbusError, StopAsyncIteration):
                if queue not in self._shares:
                    raise _Unbound from None
                raise Closed(
                    "the share group's flow was closed by the node", SERVER_SHUTTING_DOWN
                ) from None
            if out:
                self.listener.sent += len(out)
                await self._write(b"".join(out))

    def _share_subscription(self, queue: str) -> Subscribed | None:
        state = self.state
        if state is not None:
            for sub in state.subscriptions.values():
                if sub.share_queue == queue:
                    return sub
        return None

    def _shared_packet(self, flow: Flow, sub: Subscribed | None, message: Message) -> bytes | None:
        """The PUBLISH that carries a share group's ``message`` to this member, or
        ``None`` when it is not sent (too large, a ``$`` topic a filter that starts with
        a wildcard does not match); a QoS 1 one waits for its PUBACK in flight. Its
        packet id is not kept with the session: should the member go away, the queue
        hands the message to another."""
        if sub is None or (message.topic[0] == "$" and wild_first(sub.filters[0])):
            flow.ack(message)  # unsubscribed meanwhile; or MQTT-4.7.2-1
            return None
        retain = message.retained or (message.retain and sub.retain_as_published)
        ids = [] if sub.identifier is None else [sub.identifier]
        qos = 1 if sub.qos and message.delivery_mode is _PERSISTENT else 0
        packet_id = self._packet_id() if qos else None
        data = self._encode(message, qos, packet_id, retain, ids=ids)
        limit = self.client_max_packet
        if limit is not None and len(data) > limit:
            self.listener.too_large += 1
            flow.ack(message)
            return None
        if packet_id is None:
            flow.ack(message)
        else:
            self._inflight[packet_id] = message
            self._share_ids[packet_id] = flow
        return data

    def _queued_packet(self, flow: Flow, message: Message) -> bytes | None:
        """The PUBLISH that carries ``message`` to the client, or ``None`` when it is
        not sent (no-local, too large, a ``$`` topic); a QoS 1 one waits for its PUBACK
        in flight."""
        if message.topic[0] == "$" and self._hidden(message.topic, True):
            flow.ack(message)
            if self.state is not None and message.message_id is not None:
                self.state.release_id(message.message_id)
            return None
        if message.delivery_mode is _PERSISTENT:
            state = self.state
            spool_id = message.message_id
            packet_id = None
            if state is not None and spool_id is not None:
                packet_id = state.packet_ids.get(spool_id)  # sent before: the same id
            if packet_id is None or packet_id in self._inflight:
                packet_id = self._packet_id(spool_id)
            data = self._encode(message, 1, packet_id, self._retain_flag(message), queued=True)
            limit = self.client_max_packet
            if limit is not None and len(data) > limit:
                self.listener.too_large += 1
                flow.ack(message)
                if state is not None and spool_id is not None:
                    state.release_id(spool_id)
                return None
            self._inflight[packet_id] = message
            if state is not None and spool_id is not None:
                state.keep_id(spool_id, packet_id)
                if self._retained_due is not None:
                    self._written_ids.append(spool_id)
            return data
        # a QoS 0 (or non-persistent) message matching a QoS 1 subscription
        data = self._encode(message, 0, None, self._retain_flag(message), queued=True)
        flow.ack(message)
        return data

    def _packet_id(self, spool_id: int | None = None) -> int:
        """A packet id neither in flight nor kept by the session for a message that
        may come again (at most 65,535 are: a session's window is smaller).

        A queued message's id follows from its spool id when that id is free. The
        ids in flight at a crash are not on disk; derived so, they are the same after
        it (MQTT-4.4.0-1), unless two messages in flight collided."""
        inflight = self._inflight
        reserved = self.state.reserved_ids if self.state is not None else ()
        if spool_id is not None:
            derived = spool_id % 65535 + 1
            if derived not in inflight and derived not in reserved:
                return derived
        while True:
            self._next_id = self._next_id % 65535 + 1
            if self._next_id not in inflight and self._next_id not in reserved:
                return self._next_id


class _Unbound(Exception):
    """The flow of a share group's queue was unbound as its subscription went."""


def wild_first(meshbus_filter: str) -> bool:
    """Whether an MQTT subscription's meshbus filter starts with a wildcard level
    (``#`` is ``>``, ``+`` is ``*``; a shared one's own filter counts), so that in MQTT
    it matches no topic starting with ``$`` (MQTT-4.7.2-1)."""
    meshbus_filter = _shared_filter(meshbus_filter)
    return meshbus_filter[:1] in ("*", ">") and meshbus_filter[1:2] in ("", "/")


def _shared_filter(topic_filter: str) -> str:
    """The filter of a shared subscription (``#share/group/f`` is ``f``), or the filter."""
    if topic_filter.startswith("#share/"):
        return topic_filter.split("/", 2)[2]
    return topic_filter
