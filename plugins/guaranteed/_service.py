"""The node's guaranteed-messaging service: queues, publishing and binding (SPEC 4)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import orjson
from anyio.abc import TaskStatus

from meshbus import (
    QUEUE_TOPIC_PREFIX,
    AccessDeniedError,
    ConfigurationError,
    DeliveryMode,
    Envelope,
    InvalidTopicError,
    Link,
    Message,
    Node,
    PublishRejectedError,
    QueueStatistics,
    Session,
    SpoolError,
    StateError,
    SubscriptionIndex,
    Vpn,
    write_json_atomically,
)
from meshbus.abc import Flow, GuaranteedMessaging

from ._link_ingress import spool_many
from ._queue import Queue, QueueFlow, endpoints_of, message_meta
from ._settings import MAX_MESSAGE_SIZE, META_HEADER, QueueSettings, endpoint_filter
from ._store import NewMessage, SpoolStore

__all__ = ["ROUTER", "GuaranteedService"]

log = logging.getLogger("meshbus.guaranteed")

#: Seconds between sweeps for messages past their TTL that no flow will hand out.
TTL_SWEEP_INTERVAL = 1.0
ROUTER = "guaranteed"
"""The name of the plugin's router in each VPN's pipeline."""


class GuaranteedService(GuaranteedMessaging):
    """Provisions queues, spools publishes and binds flows for every VPN of a node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._store: SpoolStore | None = None
        self._sweep_scope: anyio.CancelScope | None = None
        self._queues: dict[tuple[str, str], Queue] = {}
        self._indexes: dict[str, SubscriptionIndex[Queue]] = {}
        self._flows: dict[Session, list[QueueFlow]] = {}
        # direct messages matching queues, waiting for the spooler task
        self._outbox: list[tuple[NewMessage, list[Queue]]] = []
        self._acks_due: set[Queue] = set()
        self._work = anyio.Event()
        # The saved subscriptions of topic endpoints, as last read or written: read once
        # when the node starts, so that provisioning does no I/O.
        self._memory_subscriptions: dict[str, str] = {}
        self._subscriptions_read = False

    @property
    def store(self) -> SpoolStore:
        """The open spool store."""
        if self._store is None:
            raise StateError("guaranteed messaging is available once the node runs")
        return self._store

    # --- provisioning ------------------------------------------------------------

    def create_queue(self, name: str, *, vpn: str = "default", **settings: Any) -> Queue:
        """Provision a queue (idempotent for identical settings); see :class:`QueueSettings`.

        Messages the store already holds for it (from before a restart) come back.
        """
        the_vpn = self.node.vpn(vpn)
        self.store  # noqa: B018 -- raises StateError before the node runs
        try:
            wanted = QueueSettings(name, **settings)
        except TypeError as exc:
            raise ConfigurationError(f"queue {name!r}: {exc}") from None
        existing = self._queues.get((vpn, name))
        if existing is not None:
            if existing.settings != wanted:
                raise StateError(f"queue {name!r} exists in VPN {vpn!r} with other settings")
            return existing
        # Parsed under the VPN's own topic limits before anything is registered, so a
        # subscription over them refuses the whole queue (SPEC 1: nothing half-applied).
        try:
            filters = [endpoint_filter(text, the_vpn.topic_limits) for text in wanted.subscriptions]
        except InvalidTopicError as exc:
            raise ConfigurationError(f"queue {name!r}: invalid subscription: {exc}") from None
        queue = Queue(self, vpn, wanted)
        self._queues[(vpn, name)] = queue
        index = self._indexes.setdefault(vpn, SubscriptionIndex())
        for topic_filter in filters:
            index.add(topic_filter, queue)
        the_vpn.enable_router(ROUTER, len(index) > 0)
        self._interest_changed(queue)
        return queue

    def add_subscription(self, name: str, subscription: str, *, vpn: str = "default") -> None:
        """Add a subscription to a queue while it runs (a no-op if it has it already).

        Kept until the queue is deleted or the node stops; a queue made again from its
        settings at the next start has the subscriptions those name.

        :raises StateError: no such queue.
        :raises InvalidTopicError: the subscription is not valid for an endpoint.
        """
        queue = self.queue(name, vpn=vpn)
        topic_filter = endpoint_filter(subscription, self.node.vpn(vpn).topic_limits)
        if subscription in queue.settings.subscriptions:
            return
        queue.settings = attrs.evolve(
            queue.settings, subscriptions=(*queue.settings.subscriptions, subscription)
        )
        self._indexes.setdefault(vpn, SubscriptionIndex()).add(topic_filter, queue)
        self.node.vpn(vpn).enable_router(ROUTER, True)
        self._interest_changed(queue)

    def remove_subscription(self, name: str, subscription: str, *, vpn: str = "default") -> None:
        """Remove a subscription from a queue while it runs (a no-op if it has none such).

        :raises StateError: no such queue.
        """
        queue = self.queue(name, vpn=vpn)
        if subscription not in queue.settings.subscriptions:
            return
        # The filter stays indexed while another of the queue's subscriptions names it
        # ('a' and '#noexport/a' both attract 'a').
        before = set(queue.filters())
        queue.settings = attrs.evolve(
            queue.settings,
            subscriptions=tuple(t for t in queue.settings.subscriptions if t != subscription),
        )
        index = self._indexes[vpn]
        for topic_filter in before - set(queue.filters()):
            index.remove(topic_filter, queue)
        self.node.vpn(vpn).enable_router(ROUTER, len(index) > 0)
        self._interest_changed(queue)

    def _interest_changed(self, queue: Queue) -> None:
        vpn = self.node.vpns.get(queue.vpn_name)
        if vpn is not None:
            if queue.deleted:
                filters: tuple[str, ...] = ()
            else:  # a queue also attracts what is sent to it by name
                own = () if queue.topic_endpoint else (QUEUE_TOPIC_PREFIX + queue.settings.name,)
                filters = tuple(dict.fromkeys((*own, *queue.filters())))
            self.node.plugins.endpoint_interest(vpn, queue.endpoint, filters)

    def create_topic_endpoint(self, name: str, *, vpn: str = "default", **settings: Any) -> Queue:
        """Provision a topic endpoint: a queue-like store whose one subscription the
        consumer gives when it binds (see :meth:`meshbus.Session.bind_topic_endpoint`).

        Takes the settings of :class:`QueueSettings` except ``subscriptions``;
        ``reject_msg_to_sender_on_discard`` defaults to off, as brokers do for topic
        endpoints. The subscription last bound is kept in the data directory, so
        after a restart the endpoint spools again before any consumer binds.
        """
        the_vpn = self.node.vpn(vpn)
        self.store  # noqa: B018 -- raises StateError before the node runs
        if "subscriptions" in settings:
            raise ConfigurationError(
                f"topic endpoint {name!r}: its subscription is given by the consumer at bind"
            )
        settings.setdefault("reject_msg_to_sender_on_discard", False)
        try:
            wanted = QueueSettings(name, **settings)
        except TypeError as exc:
            raise ConfigurationError(f"topic endpoint {name!r}: {exc}") from None
        existing = self._queues.get((vpn, "#te/" + name))
        if existing is not None:
            if existing.settings != wanted:
                raise StateError(
                    f"topic endpoint {name!r} exists in VPN {vpn!r} with other settings"
                )
            return existing
        endpoint = Queue(self, vpn, wanted, topic_endpoint=True)
        self._queues[endpoint.key] = endpoint
        saved = self._saved_subscriptions().get(endpoint.endpoint)
        if saved is not None:
            self._set_subscription(the_vpn, endpoint, saved)
        return endpoint

    def topic_endpoint(self, name: str, *, vpn: str = "default") -> Queue:
        """The topic endpoint called ``name``; :class:`StateError` if there is none."""
        endpoint = self._queues.get((vpn, "#te/" + name))
        if endpoint is None:
            raise StateError(f"no topic endpoint {name!r} in VPN {vpn!r}")
        return endpoint

    async def delete_topic_endpoint(self, name: str, *, vpn: str = "default") -> None:
        """Unbind its flows, delete its messages and its subscription, and forget it."""
        endpoint = self.topic_endpoint(name, vpn=vpn)
        self._forget(endpoint)
        self._save_subscription(endpoint.endpoint, None)
        await self.store.drop_endpoint(endpoint.endpoint)

    def _set_subscription(self, vpn: Vpn, endpoint: Queue, topic_filter: str | None) -> None:
        index = self._indexes.setdefault(vpn.name, SubscriptionIndex())
        for old in endpoint.filters():
            index.remove(old, endpoint)
        endpoint.subscription = topic_filter
        if topic_filter is not None:
            index.add(topic_filter, endpoint)
        vpn.enable_router(ROUTER, len(index) > 0)
        self._interest_changed(endpoint)

    # The subscriptions of topic endpoints outlive the process (they are durable
    # subscriptions); the spool store holds messages only, so they live in a small
    # JSON file beside it, or in memory when the node has no data directory.

    def _subscriptions_file(self) -> Path | None:
        data_dir = self.node.data_dir
        return data_dir / "topic-endpoints.json" if data_dir is not None else None

    def _saved_subscriptions(self) -> dict[str, str]:
        path = self._subscriptions_file()
        if path is None or self._subscriptions_read:
            return self._memory_subscriptions
        try:
            loaded = orjson.loads(path.read_bytes())
        except FileNotFoundError:
            loaded = {}
        except (OSError, orjson.JSONDecodeError) as exc:
            raise SpoolError(f"cannot read topic endpoint subscriptions {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise SpoolError(f"{path} does not hold topic endpoint subscriptions")
        self._memory_subscriptions = {str(k): str(v) for k, v in loaded.items()}
        self._subscriptions_read = True
        return self._memory_subscriptions

    def _save_subscription(self, endpoint: str, topic_filter: str | None) -> None:
        saved = dict(self._saved_subscriptions())
        if topic_filter is None:
            saved.pop(endpoint, None)
        else:
            saved[endpoint] = topic_filter
        path = self._subscriptions_file()
        if path is not None:
            write_json_atomically(path, saved)
        self._memory_subscriptions = saved

    def queue(self, name: str, *, vpn: str = "default") -> Queue:
        """The queue called ``name``; :class:`StateError` if there is none."""
        queue = self._queues.get((vpn, name))
        if queue is None:
            raise StateError(f"no queue {name!r} in VPN {vpn!r}")
        return queue

    def queue_statistics(self, vpn: str | None = None) -> list[QueueStatistics]:
        """Every queue and topic endpoint of ``vpn`` (of all VPNs for ``None``), by name."""
        found = [q for q in self._queues.values() if vpn is None or q.vpn_name == vpn]
        found.sort(key=lambda q: (q.vpn_name, q.topic_endpoint, q.settings.name))
        return [q.statistics() for q in found]

    def find_queue(self, vpn: str, name: str) -> Queue | None:
        return self._queues.get((vpn, name))

    async def delete_queue(self, name: str, *, vpn: str = "default") -> None:
        """Unbind its flows, delete its messages and forget it."""
        queue = self.queue(name, vpn=vpn)
        self._forget(queue)
        await self.store.drop_endpoint(queue.endpoint)

    async def purge_queue(self, name: str, *, vpn: str = "default") -> int:
        """Delete every message the queue holds, in flight too; return how many."""
        return await self.queue(name, vpn=vpn).purge()

    def enable_queue(
        self,
        name: str,
        *,
        vpn: str = "default",
        ingress: bool | None = None,
        egress: bool | None = None,
    ) -> None:
        """Switch the queue's ingress and egress on or off (``None``: as it is)."""
        queue = self.queue(name, vpn=vpn)
        settings = queue.settings
        queue.settings = attrs.evolve(  # validated: booleans only
            settings,
            ingress_enabled=settings.ingress_enabled if ingress is None else ingress,
            egress_enabled=settings.egress_enabled if egress is None else egress,
        )
        queue._wake()  # flows waiting for egress look again

    def _forget(self, queue: Queue) -> None:
        for flow in list(queue.flows):
            flow.detach()
        queue.deleted = True
        del self._queues[queue.key]
        index = self._indexes.get(queue.vpn_name)
        if index is not None:
            for topic_filter in queue.filters():
                index.remove(topic_filter, queue)
            vpn = self.node.vpns.get(queue.vpn_name)
            if vpn is not None:
                vpn.enable_router(ROUTER, len(index) > 0)
        self._interest_changed(queue)
        queue._wake()

    def vpn_removed(self, vpn: Vpn) -> None:
        for queue in [q for q in self._queues.values() if q.vpn_name == vpn.name]:
            self._forget(queue)
        self._indexes.pop(vpn.name, None)

    # --- publishing ----------------------------------------------------------------

    async def send(
        self, session: Session, topic: str, payload: bytes, options: Mapping[str, Any]
    ) -> None:
        self._may_send(session)
        size = len(payload)
        whole = size + options["size"]  # the headers count against the size limits too
        if whole > MAX_MESSAGE_SIZE:
            raise PublishRejectedError("too-large", "", MAX_MESSAGE_SIZE, whole)
        index = self._indexes.get(session.vpn.name)
        accepted, refusal = self._accepting(index, topic, size, whole, session.leaves_out)
        if refusal is not None:
            raise refusal  # nothing was stored anywhere yet
        now = self.node.clock.time()
        origin = self._new_origin()
        if accepted:
            await self._spool(accepted, topic, payload, _with_meta(options, session, origin), now)
        vpn = session.vpn
        if not vpn.routers_besides(ROUTER):  # no subscription or link could take a copy
            vpn.unmatched += not accepted
            return
        # Client subscriptions get it too, as a direct message (SPEC 4).
        ttl = options["ttl"]
        message = Message(
            topic,
            payload,
            DeliveryMode.DIRECT,
            options["headers"],
            options["eliding_eligible"],
            options["reply_to"],
            options["correlation_id"],
            sender=session.client_name,
            timestamp=now,
            origin=origin,
            expires_at=now + ttl if ttl else None,
            retain=options.get("retain", False),
            redelivered=options.get("redelivered", False),
        )
        vpn.dispatch(
            Envelope(message, session, endpoints_of(accepted), _mode(options)),
            count_unmatched=not accepted,
        )

    async def send_many(
        self,
        session: Session,
        messages: Sequence[tuple[str, bytes]],
        options: Mapping[str, Any],
    ) -> list[Exception | None]:
        """Pipelined publish: every accepted message goes into one put_many (one commit)."""
        self._may_send(session)
        index = self._indexes.get(session.vpn.name)
        now = self.node.clock.time()
        results: list[Exception | None] = []
        records: list[NewMessage] = []
        reserved: list[tuple[Queue, int]] = []  # so later messages of the batch see earlier
        holders: list[list[Queue]] = []
        origins: list[tuple[str, int]] = []
        extra = options["size"]  # what the shared headers take, in each message
        # As in _spool: a message a queue will hand out at once gets its delivery mark
        # in the put's commit, as many per queue as its consumers have room for.
        room: dict[Queue, int] = {}
        # What every message of the batch shares, made once: the shared headers, and
        # the meta header but for its origin (set per message, in the same place).
        shared_headers = options["headers"]
        shared_meta = _meta(options, session, ("", 0))
        persistent = options["persistent"]
        ttl = options["ttl"]
        expires_at = now + ttl if ttl else None  # ttl 0: never expires (as in Solace)
        for topic, payload in messages:
            size = len(payload)
            accepted, refusal = self._accepting(
                index, topic, size, size + extra, session.leaves_out
            )
            if refusal is None and size + extra > MAX_MESSAGE_SIZE:
                refusal = PublishRejectedError("too-large", "", MAX_MESSAGE_SIZE, size + extra)
            results.append(refusal)
            if refusal is not None:
                continue
            holders.append(accepted)  # one per message that goes on, in order
            origins.append(self._new_origin())
            if not accepted:
                continue
            for queue in accepted:
                queue.reserve(size)
                reserved.append((queue, size))
            meta = {**shared_meta, "origin": list(origins[-1])}
            marked = []
            for queue in accepted:
                left = room.get(queue)
                if left is None:
                    left = queue.at_once_room()
                if left > 0:
                    marked.append(queue.endpoint)
                room[queue] = left - 1
            records.append(
                NewMessage(
                    topic,
                    payload,
                    tuple([q.endpoint for q in accepted]),
                    {**shared_headers, META_HEADER: meta},
                    persistent,
                    expires_at,
                    now,
                    tuple(marked),
                )
            )
        for queue, size in reserved:  # the store counts them from the put on
            queue.unreserve(size)
        if records:
            await self.store.put_many(records)
            for accepted in holders:
                for queue in accepted:
                    queue.stored()
        vpn = session.vpn
        if not vpn.routers_besides(ROUTER):  # no subscription or link could take a copy
            vpn.unmatched += sum(not accepted for accepted in holders)
            return results
        holding = iter(holders)
        origin_of = iter(origins)
        mode = _mode(options)
        for (topic, payload), result in zip(messages, results, strict=True):
            if result is None:
                accepted = next(holding)
                message = Message(
                    topic,
                    payload,
                    headers=options["headers"],
                    sender=session.client_name,
                    timestamp=now,
                    origin=next(origin_of),
                    expires_at=expires_at,
                )
                vpn.dispatch(
                    Envelope(message, session, endpoints_of(accepted), mode),
                    count_unmatched=not accepted,
                )
        return results

    def _accepting(
        self,
        index: SubscriptionIndex[Queue] | None,
        topic: str,
        size: int,
        whole: int,
        leaves_out: Callable[[str, str], bool] | None = None,
    ) -> tuple[list[Queue], PublishRejectedError | None]:
        """The queues that take a message (``size`` payload bytes, ``whole`` with its
        headers), or the refusal that rejects it to the sender; none that the sending
        session ``leaves_out`` (see :attr:`meshbus.Session.leaves_out`)."""
        accepted: list[Queue] = []
        discarding: list[Queue] = []
        for queue in index.match(topic) if index is not None else ():
            if leaves_out is not None and leaves_out(queue.endpoint, topic):
                continue
            refusal = queue.refusal(size, whole)
            if refusal is None:
                accepted.append(queue)
            elif queue.settings.reject_msg_to_sender_on_discard:
                return [], refusal  # given back to the sender: no queue discarded it
            else:
                discarding.append(queue)
        for queue in discarding:
            queue.discarded += 1
        return accepted, None

    async def send_to_queue(
        self, session: Session, queue: str, payload: bytes, options: Mapping[str, Any]
    ) -> None:
        self._may_send(session)
        topic = QUEUE_TOPIC_PREFIX + queue
        # Judged as a publish to the queue's topic (SPEC 4), before the queue is looked
        # up, so that a session the ACL denies cannot tell which queues exist.
        session.check_publish_acl(topic)
        target = self._queues.get((session.vpn.name, queue))
        targets = [] if target is None or target.topic_endpoint else [target]
        # ... and the queues that subscribe that queue's topic itself (those holding
        # messages for queues of that name on other nodes: SPEC 8); never a wildcard's.
        index = self._indexes.get(session.vpn.name)
        targets += [q for q in (index.subscribers(topic) if index else ()) if q is not target]
        if not targets:
            raise PublishRejectedError("no-such-queue", f"queue {queue!r}")
        for each in targets:
            refusal = each.refusal(len(payload), len(payload) + options["size"])
            if refusal is not None:
                raise refusal
        now = self.node.clock.time()
        meta = _with_meta(options, session, self._new_origin())
        await self._spool(targets, topic, payload, meta, now)

    async def put_in_queue(self, vpn: str, queue: str, message: Message) -> int:
        """See :meth:`meshbus.abc.GuaranteedMessaging.put_in_queue`."""
        target = self._queues.get((vpn, queue))
        if target is None or target.topic_endpoint:
            raise PublishRejectedError("no-such-queue", f"queue {queue!r}")
        refusal = target.refusal(len(message.payload), message.size)
        if refusal is not None:
            raise refusal
        meta = message_meta(message.sender, message.reply_to, message.correlation_id)
        meta["origin"] = list(message.origin or self._new_origin())
        if message.retained:
            meta["retained"] = True
        now = self.node.clock.time()
        record = NewMessage(
            message.topic,
            message.payload,
            (target.endpoint,),
            {**message.headers, META_HEADER: meta},
            message.delivery_mode is DeliveryMode.PERSISTENT,
            message.expires_at,
            now if message.timestamp is None else message.timestamp,
        )
        [message_id] = await self.store.put_many((record,))
        target.stored()
        return message_id

    def _new_origin(self) -> tuple[str, int]:
        return (self.node.node_id, self.node.next_origin_id())

    # --- guaranteed messages that came in over a link --------------------------------

    async def spool_from_link(
        self, link: Link, message: Message, *, delivered: bool = False
    ) -> tuple[str, ...]:
        """Spool ``message`` to every matching endpoint of ``link``'s VPN in one commit, or
        refuse it whole (SPEC 7), then deliver its direct copy; see
        :meth:`meshbus.abc.GuaranteedMessaging.spool_from_link`."""
        taken, refusal = await spool_many(self, link, (message,), (delivered,))
        if refusal is not None:
            raise refusal
        return taken[0]

    async def spool_many_from_link(
        self,
        link: Link,
        messages: Sequence[Message],
        *,
        delivered: Sequence[bool] | None = None,
    ) -> tuple[list[tuple[str, ...]], PublishRejectedError | None]:
        """Spool ``messages`` in order, all in one commit, up to the first that an
        endpoint refuses; see :meth:`meshbus.abc.GuaranteedMessaging.spool_many_from_link`."""
        return await spool_many(self, link, messages, delivered)

    def _may_send(self, session: Session) -> None:
        if session.closed:
            raise StateError(f"session {session.client_name!r} is closed")
        if not session.client_profile.allow_guaranteed_send:
            raise AccessDeniedError(
                session.username, "publish", why="client profile does not allow guaranteed send"
            )

    async def _spool(
        self,
        queues: list[Queue],
        topic: str,
        payload: bytes,
        options: Mapping[str, Any],
        now: float,
    ) -> None:
        # No await between the quota check and the put: the store counts it from here.
        record = _record(topic, payload, queues, options, now)
        # A queue about to hand it to a waiting consumer gets its delivery mark in this
        # same commit (one fsync per message when one is in flight, not two).
        marked = tuple(q.endpoint for q in queues if q.delivers_at_once())
        if marked:
            record = attrs.evolve(record, marked=marked)
        await self.store.put_many((record,))
        for queue in queues:
            queue.stored()

    # --- direct messages matching queues: spooled as non-persistent -----------------

    def router_for(self, vpn: Vpn) -> Any:
        index = self._indexes.setdefault(vpn.name, SubscriptionIndex())
        outbox = self._outbox
        clock_time = self.node.clock.time
        new_origin = self._new_origin

        def route(envelope: Envelope) -> int:
            if envelope.mode is not _DIRECT:  # a guaranteed publish chose its endpoints
                return 0
            message = envelope.message
            accepted = []
            size = len(message.payload)
            whole = message.size
            leaves_out = None
            for queue in index.match(message.topic):
                if not queue.settings.accept_direct:
                    continue
                if leaves_out is None:  # the publishing session's (a link has none)
                    leaves_out = getattr(envelope.origin, "leaves_out", None) or _nothing
                if leaves_out(queue.endpoint, message.topic):
                    continue
                if queue.refusal(size, whole) is None:
                    queue.reserve(size)
                    accepted.append(queue)
                else:  # a direct publisher gets no error: the queue discards it
                    queue.discarded += 1
            if accepted:
                meta = message_meta(message.sender, message.reply_to, message.correlation_id)
                # Its origin is kept with it (or given here, and to the links the
                # message goes on to), so that its copies which links may bring here
                # or take to another node are known as such: it is spooled once.
                origin = message.origin
                if origin is None:
                    origin = new_origin()
                    envelope.message = message = message.evolve(origin=origin)
                meta["origin"] = list(origin)
                if message.hop_count:
                    meta["hops"] = message.hop_count
                if message.retain:
                    meta["retain"] = True
                outbox.append(
                    (
                        NewMessage(
                            message.topic,
                            message.payload,
                            tuple(q.endpoint for q in accepted),
                            {**message.headers, META_HEADER: meta},
                            False,
                            None,
                            # Spooled messages are always stamped: now, if the publisher
                            # did not ask for timestamps.
                            clock_time() if message.timestamp is None else message.timestamp,
                        ),
                        accepted,
                    )
                )
                self._work.set()
            return len(accepted)

        return route

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The one background task: spools direct messages, commits acks of gone flows."""
        task_status.started()
        while True:
            await self._work.wait()
            self._work = anyio.Event()
            await self._drain()

    async def sweep_ttl(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Every ``TTL_SWEEP_INTERVAL`` seconds, expire what no flow will hand out."""
        clock = self.node.clock
        with anyio.CancelScope() as scope:
            self._sweep_scope = scope  # stop() ends it before the store closes
            task_status.started()
            while True:
                await clock.sleep_until(clock.monotonic() + TTL_SWEEP_INTERVAL)
                now = clock.time()
                for queue in list(self._queues.values()):
                    if queue.deleted or not queue.settings.respect_ttl:
                        continue
                    try:
                        await queue.sweep_expired(now)
                    except Exception:  # a store failure: the next sweep tries again
                        log.exception("expiring messages of queue %r failed", queue.endpoint)

    async def _drain(self) -> None:
        while self._outbox:
            # Copy and clear, never rebind: the routers hold this list object.
            batch = self._outbox[:]
            self._outbox.clear()
            for record, queues in batch:  # the store counts them from the put on
                for queue in queues:
                    queue.unreserve(len(record.payload))
            if any(queue.deleted for _, queues in batch for queue in queues):
                # Deleted since they matched: its references would outlive it in the
                # store, and a new queue of the same name would find them there.
                batch = _without_deleted(batch)
                if not batch:
                    continue
            try:
                await self.store.put_many([record for record, _ in batch])
            except Exception:
                # Direct messages were never acknowledged to anyone: losing them is
                # allowed, taking the node down is not. Count them and carry on.
                log.exception("spooling %d direct message(s) failed; discarded", len(batch))
                for _, queues in batch:
                    for queue in queues:
                        queue.discarded += 1
                continue
            for _, queues in batch:
                for queue in queues:
                    queue.stored()
        while self._acks_due:
            queue = self._acks_due.pop()
            try:
                await queue.flush_acks()
            except Exception:  # the acks stay pending in the queue and are retried
                log.exception("committing acks of queue %r failed", queue.endpoint)

    # --- consuming -----------------------------------------------------------------

    async def bind(self, session: Session, queue: str, window: int) -> Flow:
        target = self._queues.get((session.vpn.name, queue))
        if target is None or target.topic_endpoint:
            raise StateError(f"no queue {queue!r} in VPN {session.vpn.name!r}")
        return self._attach(target, session, window)

    async def bind_topic_endpoint(
        self, session: Session, endpoint: str, subscription: str, window: int
    ) -> Flow:
        target = self._queues.get((session.vpn.name, "#te/" + endpoint))
        if target is None:
            raise StateError(f"no topic endpoint {endpoint!r} in VPN {session.vpn.name!r}")
        _check_window(window)
        _check_egress(target)
        if target.subscription != subscription:
            if target.flows:
                raise StateError(
                    f"topic endpoint {endpoint!r} is bound with subscription "
                    f"{target.subscription!r}; it cannot change while a flow is bound"
                )
            # A new subscription means a new stream: what was spooled for the old one
            # goes, as on a broker. Stop attracting first, purge, then attract anew, so
            # nothing for the new subscription is spooled and then purged.
            self._set_subscription(session.vpn, target, None)
            target.forget_held()
            await self.store.drop_endpoint(target.endpoint)
            if target.subscription is not None or target.flows or target.deleted:
                raise StateError(f"topic endpoint {endpoint!r} changed while binding")
            self._set_subscription(session.vpn, target, subscription)
            self._save_subscription(target.endpoint, subscription)
        return self._attach(target, session, window)

    def _attach(self, target: Queue, session: Session, window: int) -> QueueFlow:
        _check_window(window)
        _check_egress(target)
        flow = QueueFlow(target, session, window, self.node.clock.time)
        target.flows.append(flow)
        self._flows.setdefault(session, []).append(flow)
        return flow

    def flow_detached(self, flow: QueueFlow) -> None:
        flows = self._flows.get(flow.session)
        if flows is not None:
            flows.remove(flow)
            if not flows:
                del self._flows[flow.session]
        self._acks_due.add(flow.queue)
        self._work.set()

    def session_closed(self, session: Session) -> None:
        for flow in list(self._flows.get(session, ())):
            flow.detach()

    async def stop(self) -> None:
        """Commit what is pending; called before the store closes."""
        if self._sweep_scope is not None:
            self._sweep_scope.cancel()
        for queue in list(self._queues.values()):
            for flow in list(queue.flows):
                flow.detach()
        self._acks_due.update(self._queues.values())
        await self._drain()


_DIRECT = DeliveryMode.DIRECT


def _nothing(endpoint: str, topic: str) -> bool:
    return False


def _without_deleted(
    batch: list[tuple[NewMessage, list[Queue]]],
) -> list[tuple[NewMessage, list[Queue]]]:
    """``batch`` without its references to deleted queues (and records left with none)."""
    kept = []
    for record, queues in batch:
        live = [queue for queue in queues if not queue.deleted]
        if len(live) == len(queues):
            kept.append((record, queues))
        elif live:
            kept.append((attrs.evolve(record, endpoints=endpoints_of(live)), live))
    return kept


def _mode(options: Mapping[str, Any]) -> DeliveryMode:
    return DeliveryMode.PERSISTENT if options["persistent"] else DeliveryMode.NON_PERSISTENT


def _meta(options: Mapping[str, Any], session: Session, origin: tuple[str, int]) -> dict[str, Any]:
    """The meta header of a message ``session`` sends with ``options``."""
    meta = message_meta(session.client_name, options["reply_to"], options["correlation_id"])
    meta["origin"] = list(origin)
    if options.get("redelivered"):  # sent again: its queues deliver it flagged
        meta["redelivered"] = True
    if options.get("retain"):  # published to be retained: kept for retain-as-published
        meta["retain"] = True
    return meta


def _with_meta(
    options: Mapping[str, Any], session: Session, origin: tuple[str, int]
) -> dict[str, Any]:
    """``options`` with the meta header among their headers."""
    return {
        **options,
        "headers": {**options["headers"], META_HEADER: _meta(options, session, origin)},
    }


def _record(
    topic: str,
    payload: bytes,
    queues: Sequence[Queue],
    options: Mapping[str, Any],
    now: float,
    marked: tuple[str, ...] = (),
) -> NewMessage:
    """What the store keeps of a guaranteed publish held by ``queues`` (``marked``: those
    of them that deliver it at once, see :attr:`NewMessage.marked`)."""
    ttl = options["ttl"]
    return NewMessage(
        topic,
        payload,
        tuple(q.endpoint for q in queues),
        options["headers"],
        options["persistent"],
        now + ttl if ttl else None,  # ttl 0: never expires (as in Solace)
        now,
        marked,
    )


def _check_window(window: object) -> None:
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ConfigurationError(f"window must be a positive int, got {window!r}")


def _check_egress(target: Queue) -> None:
    if not target.settings.egress_enabled:
        kind = "topic endpoint" if target.topic_endpoint else "queue"
        raise StateError(f"{kind} {target.settings.name!r} has egress disabled")
