"""A queue at run time and the consumer flows bound to it (SPEC 4).

Messages live in the spool store; a queue keeps only a cursor into it, a page of
messages read ahead (``_ready``), the messages handed back by flows that unbound
(``_returned``, delivered first and in id order), and what each flow holds in
flight. So memory stays bounded however many messages the queue holds.

Delivery is pulled: a flow asks for messages when its application calls
:meth:`QueueFlow.receive`. Before messages are handed out they are marked
delivered in the store (one commit for a batch up to the flow's window), so a
restart delivers them again flagged ``redelivered=True``: nothing is delivered
twice without that flag. Acks are collected and committed in batches; a crash
before such a commit means a redelivery, flagged, never a loss.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import anyio

from meshbus import (
    DeliveryMode,
    Message,
    PublishRejectedError,
    QueueStatistics,
    Session,
    StateError,
)
from meshbus.abc import Flow

from ._settings import META_HEADER, AccessType, QueueSettings, endpoint_filter
from ._store import NewMessage, SpoolEntry, SpoolStore, StoredMessage

if TYPE_CHECKING:
    from ._service import GuaranteedService

__all__ = ["Queue", "QueueFlow", "endpoints_of", "message_meta"]

log = logging.getLogger("meshbus.guaranteed")

_PAGE = 256  # messages read ahead from the store per refill
# Acks are committed in batches of this many, or when a flow runs out of messages
# to hand out, or when it unbinds: one commit per ack would cap a consumer at the
# disk's commit rate. A crash before the commit redelivers those, flagged.
_ACK_BATCH = 128


class Queue:
    """One provisioned queue of one VPN."""

    def __init__(
        self,
        service: GuaranteedService,
        vpn_name: str,
        settings: QueueSettings,
        topic_endpoint: bool = False,
    ) -> None:
        self.service = service
        self.store: SpoolStore = service.store
        self.vpn_name = vpn_name
        self.settings = settings
        #: A topic endpoint takes its one subscription from the consumer at bind time.
        self.topic_endpoint = topic_endpoint
        #: The topic endpoint's current subscription (a filter), or ``None`` before the
        #: first bind; queues keep theirs in ``settings.subscriptions``.
        self.subscription: str | None = None
        #: Its name in the store: VPN names have no '/' and queue names no leading '#',
        #: so neither can collide.
        self.endpoint = (
            f"{vpn_name}/#te/{settings.name}" if topic_endpoint else f"{vpn_name}/{settings.name}"
        )
        self.flows: list[QueueFlow] = []
        self._cursor = 0  # highest message id read from the store into _ready
        self._ready: deque[SpoolEntry] = deque()
        self._returned: list[SpoolEntry] = []  # handed back by flows; sorted by id
        self._returned_ids: list[int] = []
        self._in_flight = 0  # messages held by flows (prefetched or unacked)
        self._pending_acks: list[int] = []
        self._pending_ack_bytes = 0
        # (messages, bytes) accepted but not yet handed to the store; once put_many has
        # started, store.stats() counts them itself, so a reservation must end then.
        self._reserved = (0, 0)
        self._changed = anyio.Event()
        self._waiting = 0  # flows waiting in wait(): wake only when there are some
        #: Bumped by every wake: a flow that looked before awaiting the store passes
        #: what it saw to wait(), which returns at once if something happened since.
        self.version = 0
        self._refill_lock = anyio.Lock()
        self.deleted = False
        #: The highest message id a purge deleted: acks of such ids are ignored and
        #: entries up to it never come back to the queue.
        self.purged_through = 0
        # counters
        self.spooled = 0
        self.delivered = 0
        self.acked = 0
        self.redelivered = 0
        self.expired = 0
        self.dead_lettered = 0
        self.discarded = 0

    def __repr__(self) -> str:
        return f"<Queue {self.endpoint!r} flows={len(self.flows)} in_flight={self._in_flight}>"

    @property
    def key(self) -> tuple[str, str]:
        """Its key in the service's table (topic endpoints apart from queues)."""
        prefix = "#te/" if self.topic_endpoint else ""
        return (self.vpn_name, prefix + self.settings.name)

    def filters(self) -> list[str]:
        """The topic filters that attract messages to it."""
        if self.topic_endpoint:
            return [self.subscription] if self.subscription is not None else []
        return [endpoint_filter(text) for text in self.settings.subscriptions]

    async def purge(self) -> int:
        """Delete every message it holds, those its flows hold too; return how many.

        Under the refill lock, so no page read before the purge lands after it. Every
        entry handed out so far has an id up to the read cursor, and messages stored
        later have higher ids: :attr:`purged_through` tells the two apart.
        """
        async with self._refill_lock:
            self.purged_through = self._cursor
            self.forget_held()
            for flow in self.flows:
                flow.forget_purged()
            dropped = await self.store.drop_endpoint(self.endpoint)
        self._wake()
        return dropped

    def forget_held(self) -> None:
        """Drop the read-ahead state (the store's copies were just dropped)."""
        self._ready.clear()
        self._returned.clear()
        self._returned_ids.clear()
        self._pending_acks.clear()
        self._pending_ack_bytes = 0

    # --- ingress -----------------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        """(messages, bytes) counted against the quota: stored, reserved, not yet acked."""
        stats = self.store.stats(self.endpoint)
        return (
            stats.messages + self._reserved[0] - len(self._pending_acks),
            stats.bytes + self._reserved[1] - self._pending_ack_bytes,
        )

    def statistics(self) -> QueueStatistics:
        """Its depth (what :meth:`usage` counts), quota, flows and counters now."""
        messages, size = self.usage()
        s = self.settings
        return QueueStatistics(
            vpn=self.vpn_name,
            name=s.name,
            kind="topic-endpoint" if self.topic_endpoint else "queue",
            messages=messages,
            bytes=size,
            max_messages=s.max_messages,
            max_bytes=s.max_bytes,
            flows=len(self.flows),
            in_flight=self._in_flight,
            subscriptions=tuple(self.filters()),
            dead_message_queue=s.dead_message_queue,
            ingress_enabled=s.ingress_enabled,
            egress_enabled=s.egress_enabled,
            spooled=self.spooled,
            delivered=self.delivered,
            acked=self.acked,
            redelivered=self.redelivered,
            expired=self.expired,
            dead_lettered=self.dead_lettered,
            discarded=self.discarded,
        )

    def refusal(self, size: int, message_size: int | None = None) -> PublishRejectedError | None:
        """Why this queue cannot take a message of ``size`` payload bytes now, or ``None``.

        :param message_size: its whole size (:attr:`meshbus.Message.size`: the payload
            and what its headers take), held against ``max_message_size``; the quota
            counts payload bytes, as the store does.
        """
        s = self.settings
        if self.deleted:
            return PublishRejectedError("no-such-queue", f"queue {s.name!r}")
        if not s.ingress_enabled:
            return PublishRejectedError("ingress-disabled", f"queue {s.name!r}")
        whole = size if message_size is None else message_size
        if whole > s.max_message_size:
            return PublishRejectedError("too-large", f"queue {s.name!r}", s.max_message_size, whole)
        if s.max_messages is None and s.max_bytes is None:
            return None  # no quota: nothing to count (this runs for every publish)
        where = f"queue {s.name!r}"
        messages, used = self.usage()
        if s.max_messages is not None and messages + 1 > s.max_messages:
            return PublishRejectedError("over-quota", where, s.max_messages, messages + 1)
        if s.max_bytes is not None and used + size > s.max_bytes:
            return PublishRejectedError("over-quota", where, s.max_bytes, used + size)
        return None

    def reserve(self, size: int) -> None:
        """Count a message that will be stored shortly against the quota."""
        m, b = self._reserved
        self._reserved = (m + 1, b + size)

    def unreserve(self, size: int) -> None:
        """End a reservation: call it right before the put starts (no await between)."""
        m, b = self._reserved
        self._reserved = (m - 1, b - size)

    def delivers_at_once(self) -> bool:
        """Whether a message stored now would go straight to a consumer: a flow that
        may take it has room in its window for it and for every message waiting ahead.

        A guess that only decides :attr:`NewMessage.marked`: when it is wrong, the
        message merely counts as delivered once more after a crash.
        """
        return self.at_once_room() > 0

    def at_once_room(self) -> int:
        """How many messages stored now would go straight to a consumer (the guess of
        :meth:`delivers_at_once`, for a batch): the room left in the windows of the
        flows that may take them once every message waiting ahead is handed out."""
        flows = self.flows
        if not flows or not self.settings.egress_enabled:
            return 0
        if self.settings.access_type is AccessType.EXCLUSIVE:
            flows = flows[:1]
        room = 0
        for flow in flows:
            room += flow.window - len(flow._unacked) - len(flow._prefetched) - flow._fetching
        if room <= 0:
            return 0
        held = self.store.stats(self.endpoint).messages - len(self._pending_acks)
        return max(0, room - (held - self._in_flight))

    def stored(self) -> None:
        """A message for this queue was committed: wake flows waiting for one."""
        self.spooled += 1
        self._wake()

    def _wake(self) -> None:
        self.version += 1
        if self._waiting:
            self._changed.set()
            self._changed = anyio.Event()

    # --- egress ------------------------------------------------------------------

    def may_deliver_to(self, flow: QueueFlow) -> bool:
        if not self.settings.egress_enabled or flow not in self.flows:
            return False
        if self.settings.access_type is AccessType.EXCLUSIVE:
            return self.flows[0] is flow
        # Round-robin: flows are kept in turn order (a flow that takes a message moves to
        # the end); a flow's turn comes when no flow before it is waiting for a message.
        for other in self.flows:
            if other is flow or other._hungry:
                return other is flow
        return False

    async def take(self, count: int) -> list[SpoolEntry]:
        """Up to ``count`` entries to hand out next: returned ones first, then new ones."""
        out: list[SpoolEntry] = []
        while len(out) < count:
            if self._returned:
                out.append(self._returned.pop(0))
                self._returned_ids.pop(0)
            elif self._ready:
                out.append(self._ready.popleft())
            elif out:
                # Never await with entries in hand: a cancelled refill would lose them.
                break
            else:
                async with self._refill_lock:
                    if not self._ready:
                        page = await self.store.read(self.endpoint, self._cursor, _PAGE)
                        if not page:
                            break
                        self._cursor = page[-1].message.id
                        self._ready.extend(page)
        return out

    async def sweep_expired(self, now: float) -> int:
        """Dispose of messages past their TTL that no flow holds; return how many.

        Flows check TTL when they hand a message out; this finds the ones nobody will
        ask for (no consumer, or a slow one). What flows hold is left to them. An
        entry is claimed (taken out of ``_ready``/``_returned``) before any await, and
        the store beyond the read cursor is scanned under the refill lock, so a flow
        can never be handed a message the sweep is disposing of.
        """
        if not self.settings.respect_ttl:
            return 0

        def due(entry: SpoolEntry) -> bool:
            expires = entry.message.expires_at
            return expires is not None and expires <= now

        expired = [e for e in self._returned if due(e)] + [e for e in self._ready if due(e)]
        if expired:
            kept = [e for e in self._returned if not due(e)]
            self._returned[:] = kept
            self._returned_ids[:] = [e.message.id for e in kept]
            self._ready = deque(e for e in self._ready if not due(e))
        async with self._refill_lock:
            after = self._cursor
            while True:  # the store finds them by expiry time: no scan of the rest
                page = await self.store.read_expired(self.endpoint, after, now, _PAGE)
                if not page:
                    break
                after = page[-1].message.id
                expired += page
            for entry in expired:
                with anyio.CancelScope(shield=True):  # claimed: finish it, then stop
                    await self.dispose(entry, "ttl")
        return len(expired)

    def give_back(self, entries: list[SpoolEntry]) -> None:
        """Entries a flow held are available again, in id order, before new ones."""
        if self.purged_through:
            entries = [e for e in entries if e.message.id > self.purged_through]
        for entry in entries:
            i = bisect.bisect(self._returned_ids, entry.message.id)
            self._returned_ids.insert(i, entry.message.id)
            self._returned.insert(i, entry)
        if entries:
            self._wake()

    def ack_later(self, message_id: int, size: int) -> None:
        self._pending_acks.append(message_id)
        self._pending_ack_bytes += size
        self.acked += 1
        self._wake()  # a flow may be waiting for room in its window

    async def flush_acks(self) -> None:
        """Commit the acks collected so far (one store call for all of them)."""
        if not self._pending_acks:
            return
        ids, self._pending_acks = self._pending_acks, []
        size, self._pending_ack_bytes = self._pending_ack_bytes, 0
        try:
            await self.store.ack(self.endpoint, ids)
        except BaseException:
            self._pending_acks[:0] = ids  # not committed: keep them for the next try
            self._pending_ack_bytes += size
            raise
        self._wake()

    async def wait(self, seen: int | None = None) -> None:
        if seen is not None and seen != self.version:
            return  # woken while the caller was busy with the store: look again
        self._waiting += 1
        try:
            await self._changed.wait()
        finally:
            self._waiting -= 1

    async def dispose(self, entry: SpoolEntry, reason: str) -> None:
        """A message past its TTL or its redeliveries: to the DMQ if there is one, else gone."""
        dmq_name = self.settings.dead_message_queue
        dmq = self.service.find_queue(self.vpn_name, dmq_name) if dmq_name else None
        message = entry.message
        if reason == "ttl":
            self.expired += 1
        if dmq is not None and dmq is not self and dmq.refusal(len(message.payload)) is None:
            # One store change: a crash leaves the message here or there, not in both.
            await self.store.put_and_ack(
                [_copy_to(message, dmq.endpoint)], self.endpoint, [message.id]
            )
            dmq.stored()
            self.dead_lettered += 1
        else:
            self.discarded += 1
            await self.store.ack(self.endpoint, [message.id])
        self._wake()


def _copy_to(message: StoredMessage, endpoint: str) -> NewMessage:
    return NewMessage(
        message.topic,
        message.payload,
        (endpoint,),
        dict(message.headers),
        message.persistent,
        None,  # a dead message does not expire again
        message.published_at,
    )


_flow_ids = itertools.count(1)


class QueueFlow(Flow):
    """A consumer flow bound to a queue; see :meth:`meshbus.Session.bind`."""

    def __init__(self, queue: Queue, session: Session, window: int, clock: Callable[[], float]):
        self.queue = queue
        self.session = session
        self.window = window
        self.id = next(_flow_ids)
        self._now = clock
        self._prefetched: deque[SpoolEntry] = deque()
        self._unacked: dict[int, SpoolEntry] = {}  # handed to the application
        self._hungry = False  # in receive() with room: its turn counts (non-exclusive)
        self._filling = False  # a task fetches messages for receive_nowait()
        self._fetching = 0  # the room a fetch under way has taken (receive() or the task's)
        # What fetches under way took from the queue and are marking delivered now: an
        # unbind gives them back at once, with the rest (see detach).
        self._marking: list[list[SpoolEntry]] = []
        self._turned_away = False  # a fetch found no room because of the one under way
        self.unbound = False

    def __repr__(self) -> str:
        return f"<QueueFlow {self.id} on {self.queue.settings.name!r} unacked={len(self._unacked)}>"

    async def receive(self) -> Message:
        try:
            return await self._receive()
        finally:
            if self._hungry:  # got one, or gave up: the turn passes to the next flow
                self._hungry = False
                self.queue._wake()

    async def _receive(self) -> Message:
        queue = self.queue
        while True:
            seen = queue.version
            if self.unbound:
                raise StateError(f"flow {self.id} on queue {queue.settings.name!r} is unbound")
            if len(queue._pending_acks) >= _ACK_BATCH:
                await queue.flush_acks()
            if not self._prefetched:
                room = self._room()
                if queue.settings.access_type is AccessType.NON_EXCLUSIVE:
                    room = min(room, 1)  # one at a time keeps the round-robin fair
                    self._hungry = room > 0
                if room > 0 and queue.may_deliver_to(self):
                    await self._prefetch(room)
            if self._prefetched and not self.unbound:
                entry = self._prefetched.popleft()
                unfit = self._unfit(entry)
                if unfit is not None:
                    await self._drop(entry, unfit)
                    continue
                return self._hand_out(entry)
            await queue.flush_acks()  # nothing to hand out: a good moment to commit acks
            if self._prefetched or self.unbound:
                continue
            await queue.wait(seen)

    def _unfit(self, entry: SpoolEntry) -> str | None:
        """Why ``entry`` is disposed of rather than handed out (``"ttl"``,
        ``"redelivery"``), or ``None``."""
        if self._expired(entry):
            return "ttl"
        limit = self.queue.settings.max_redelivery
        if limit and entry.delivery_count > limit:
            return "redelivery"
        return None

    def _hand_out(self, entry: SpoolEntry) -> Message:
        queue = self.queue
        self._unacked[entry.message.id] = entry
        queue.delivered += 1
        if entry.delivery_count:
            queue.redelivered += 1
        return _to_message(entry, queue)

    def receive_nowait(self) -> Message | None:
        """The next message this flow has fetched, or ``None`` without waiting.

        Messages are marked delivered in the store before the application sees them,
        which takes an await; so a flow with nothing fetched starts a task of the
        node that fetches up to its window (waiting for messages if the queue has
        none), and a later call hands out what it fetched.

        :raises StateError: the flow is unbound.
        """
        if self.unbound:
            raise StateError(f"flow {self.id} on queue {self.queue.settings.name!r} is unbound")
        message = None
        while self._prefetched:
            entry = self._prefetched.popleft()
            unfit = self._unfit(entry)
            if unfit is None:
                message = self._hand_out(entry)
                break
            self._spawn(self._drop, entry, unfit)
        if not self._prefetched:
            self._fill_soon()
        return message

    def _spawn(self, job: Callable[..., Awaitable[None]], *args: Any) -> None:
        async def run() -> None:
            try:
                await job(*args)
            except Exception:  # a store failure: the next receive_nowait() tries again
                if self.unbound:
                    # Unbound meanwhile (a node stopping detaches its flows, then closes
                    # the store under what they were fetching): nothing is lost.
                    log.debug("flow %d on queue %r ended", self.id, self.queue.endpoint)
                else:
                    log.exception("flow %d on queue %r failed", self.id, self.queue.endpoint)

        self.session.node.task_group.start_soon(run)

    def _fill_soon(self) -> None:
        if not self._filling:
            self._filling = True
            self._spawn(self._fill)

    async def _fill(self) -> None:
        """Fetch messages for :meth:`receive_nowait`, as :meth:`receive` would, without
        handing one out; wait for some if the queue has none for this flow now."""
        queue = self.queue
        try:
            while not self.unbound and not self._prefetched:
                seen = queue.version
                if len(queue._pending_acks) >= _ACK_BATCH:
                    await queue.flush_acks()
                room = self._room()
                if queue.settings.access_type is AccessType.NON_EXCLUSIVE:
                    room = min(room, 1)
                    self._hungry = room > 0
                if room > 0 and queue.may_deliver_to(self):
                    await self._prefetch(room)
                if self._prefetched or self.unbound:
                    break
                await queue.flush_acks()  # nothing to fetch: a good moment to commit acks
                await queue.wait(seen)
        finally:
            self._filling = False
            if self._hungry:
                self._hungry = False
                queue._wake()

    def _room(self) -> int:
        """How many more messages the window lets this flow fetch now: neither handed
        out nor fetched already; none while a fetch is under way (:meth:`receive` and
        the task of :meth:`receive_nowait` may both try). One fetch at a time keeps the
        window, and the order: two at once could finish in either order."""
        if self._fetching:
            self._turned_away = True  # woken when the fetch under way kept messages
            return 0
        return self.window - len(self._unacked) - len(self._prefetched)

    async def _prefetch(self, room: int) -> None:
        self._fetching += room
        fetched = 0
        try:
            fetched = await self._fetch(room)
        finally:
            self._fetching -= room
            # A fetch turned away meanwhile looks again only if this one found something
            # (it waits for the queue otherwise): two fetchers of an empty queue that
            # woke each other would take turns for ever.
            if self._turned_away and fetched:
                self._turned_away = False
                self.queue._wake()

    async def _fetch(self, room: int) -> int:
        """Take up to ``room`` messages, mark them delivered, keep them for handing
        out; how many were kept."""
        queue = self.queue
        entries = await queue.take(room)
        if not entries:
            return 0
        if self.unbound:  # unbound while it read: never handed out
            queue.give_back(entries)
            return 0
        if queue.settings.access_type is AccessType.NON_EXCLUSIVE and self in queue.flows:
            queue.flows.remove(self)  # took its turn: to the end of the line
            queue.flows.append(self)
        queue._in_flight += len(entries)
        marking = self._marking
        marking.append(entries)
        try:
            # Marked before the application can see them: after a crash they come back
            # flagged. If the mark fails or is cancelled they were never handed out.
            await queue.store.mark_delivered(queue.endpoint, [e.message.id for e in entries])
        except BaseException:
            if _taken_from(marking, entries):  # (else an unbind gave them back)
                queue._in_flight -= len(entries)
                queue.give_back(entries)
            raise
        if not _taken_from(marking, entries):
            return 0  # unbound while marking: given back then, flagged (see detach)
        if queue.purged_through >= entries[0].message.id:  # purged while marking
            kept = [e for e in entries if e.message.id > queue.purged_through]
            queue._in_flight -= len(entries) - len(kept)
            entries = kept
        self._prefetched.extend(entries)
        return len(entries)

    def _expired(self, entry: SpoolEntry) -> bool:
        expires = entry.message.expires_at
        return self.queue.settings.respect_ttl and expires is not None and self._now() >= expires

    async def _drop(self, entry: SpoolEntry, reason: str) -> None:
        self.queue._in_flight -= 1
        await self.queue.dispose(entry, reason)

    def ack(self, message: Message) -> None:
        message_id = message.message_id
        entry = self._unacked.pop(message_id, None) if message_id is not None else None
        if entry is None:
            if message_id is not None and message_id <= self.queue.purged_through:
                return  # purged while the application held it: nothing left to ack
            raise StateError(f"message {message_id!r} is not unacknowledged on flow {self.id}")
        self.queue._in_flight -= 1
        self.queue.ack_later(entry.message.id, len(entry.message.payload))

    def forget_purged(self) -> None:
        """Drop what it holds: the queue was purged (see :meth:`Queue.purge`)."""
        self.queue._in_flight -= len(self._prefetched) + len(self._unacked)
        self._prefetched.clear()
        self._unacked.clear()

    def detach(self) -> None:
        """Unbind without waiting: everything held goes back to the queue for redelivery."""
        if self.unbound:
            return
        self.unbound = True
        queue = self.queue
        queue.flows.remove(self)
        handed = [SpoolEntry(e.message, e.delivery_count + 1) for e in self._unacked.values()]
        # Those a fetch is marking delivered go back now too, flagged as the mark will
        # have them: left until the mark is done, a flow bound meanwhile (taking over an
        # exclusive queue) would hand out later messages before them.
        marked = [SpoolEntry(e.message, e.delivery_count + 1) for m in self._marking for e in m]
        self._marking.clear()
        held = [*handed, *self._prefetched, *marked]
        queue._in_flight -= len(held)
        self._unacked.clear()
        self._prefetched.clear()
        queue.give_back(held)
        queue._wake()  # a standby flow may be active now
        self.queue.service.flow_detached(self)

    async def unbind(self) -> None:
        self.detach()
        await self.queue.flush_acks()

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except StateError:
            if self.unbound:
                raise StopAsyncIteration from None
            raise


def _to_message(entry: SpoolEntry, queue: Queue) -> Message:
    stored = entry.message
    headers = dict(stored.headers)
    meta = headers.pop(META_HEADER, None)
    if not isinstance(meta, dict):
        meta = {}
    origin = meta.get("origin")
    hops = meta.get("hops", 0)
    return Message(
        stored.topic,
        stored.payload,
        DeliveryMode.PERSISTENT if stored.persistent else DeliveryMode.NON_PERSISTENT,
        headers,
        reply_to=meta.get("reply_to"),
        correlation_id=meta.get("correlation_id"),
        sender=meta.get("sender"),
        timestamp=stored.published_at,
        # Or flagged when it came over a link (see _link_ingress): it may be a second copy.
        redelivered=entry.delivery_count > 0 or meta.get("redelivered") is True,
        message_id=stored.id,
        destination=queue.settings.name,
        # Kept in the spool so that a message that crossed links keeps what it is.
        origin=(origin[0], origin[1]) if _is_origin(origin) else None,
        hop_count=hops if type(hops) is int and hops > 0 else 0,
        expires_at=stored.expires_at,
        # Published to be retained, or a topic's retained value put in one consumer's
        # queue (see put_in_queue).
        retain=meta.get("retain") is True or meta.get("retained") is True,
        retained=meta.get("retained") is True,
    )


def _is_origin(value: object) -> TypeGuard[list[Any]]:
    return (
        isinstance(value, list)
        and len(value) == 2
        and type(value[0]) is str
        and type(value[1]) is int
    )


def endpoints_of(queues: Sequence[Queue]) -> tuple[str, ...]:
    """The endpoint names of ``queues``."""
    return tuple(queue.endpoint for queue in queues)


def message_meta(
    sender: str | None, reply_to: str | None, correlation_id: str | None
) -> dict[str, Any]:
    """What a spooled message keeps of its publisher in its meta header."""
    return {
        k: v
        for k, v in (("sender", sender), ("reply_to", reply_to), ("correlation_id", correlation_id))
        if v is not None
    }


def _taken_from(marking: list[list[SpoolEntry]], entries: list[SpoolEntry]) -> bool:
    """Take ``entries`` (a fetch's) out of a flow's ``marking``; whether they were
    still there (not given back by an unbind meanwhile)."""
    for i, each in enumerate(marking):
        if each is entries:
            del marking[i]
            return True
    return False
