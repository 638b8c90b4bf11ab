"""Guaranteed messages that came in over a link, spooled in batches (SPEC 7).

A link acknowledges a guaranteed message to its peer only once every matching local
endpoint holds it, all of them in one commit, or none. :func:`spool_many` does that for
several messages at once, in order, so that a flow with a window of messages in flight
costs one commit (one fsync, for a durable store) per batch instead of one per message:

* each message's matching endpoints are checked in order, each one's quota counting
  the messages of the batch before it (reserved until the put starts);
* the first message that an endpoint refuses ends the batch: it and every message
  after it are left out, to be offered again (the flow waits on it, keeping order);
* what is left is stored in one :meth:`SpoolStore.put_many`, then each message's
  direct copy is delivered to matching client subscriptions and other links, in order.

A message the peer sends flagged ``redelivered`` may be here already: the peer sends
again what it saw no ack for, and an ack lost with a connection that stayed down for
longer than the origin de-duplication window (SPEC 7) leaves nothing here to know it
by. So it keeps the flag: in the spool (its consumers get it flagged, whatever this
node's own delivery count says) and on its direct copy. Nothing is delivered twice
without the flag (SPEC 4), and nothing is held back that may never have come.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from meshbus import (
    QUEUE_TOPIC_PREFIX,
    DeliveryMode,
    Envelope,
    Link,
    Message,
    PublishRejectedError,
    SubscriptionIndex,
)

from ._queue import endpoints_of, message_meta
from ._settings import MAX_MESSAGE_SIZE, META_HEADER
from ._store import NewMessage

if TYPE_CHECKING:
    from ._queue import Queue
    from ._service import GuaranteedService

__all__ = ["spool_many"]


async def spool_many(
    service: GuaranteedService,
    link: Link,
    messages: Sequence[Message],
    delivered: Sequence[bool] | None = None,
) -> tuple[list[tuple[str, ...]], PublishRejectedError | None]:
    """Spool ``messages`` from ``link`` in one commit, up to the first one refused; the
    direct copy of each is delivered, unless ``delivered`` says it was already.

    Return the endpoints that hold each message taken (empty: none matched, or it had
    expired; counted on the link), in order, and the refusal of the first message not
    taken (``None`` when all were). Returns once the commit is done.

    :raises SpoolError: the commit failed: none was taken.
    """
    vpn = link.vpn
    index = service._indexes.get(vpn.name)
    now = service.node.clock.time()
    planned: list[tuple[Message, list[Queue] | None]] = []
    records: list[NewMessage] = []
    reserved: list[tuple[Queue, int]] = []
    refusal: PublishRejectedError | None = None
    try:
        for message in messages:
            size = len(message.payload)
            whole = message.size  # the headers count against the size limits too
            if whole > MAX_MESSAGE_SIZE:
                refusal = PublishRejectedError("too-large", "", MAX_MESSAGE_SIZE, whole)
                break
            accepted: list[Queue] = []
            for queue in _matching(service, vpn.name, index, message.topic):
                if not link.spools_to(queue.endpoint):
                    continue  # the queue that feeds this link, or one it keeps out
                refusal = queue.refusal(size, whole)
                if refusal is not None:
                    break
                accepted.append(queue)
            if refusal is not None:
                break  # all or nothing: the peer keeps it and offers it again
            expires_at = message.expires_at
            if expires_at is not None and expires_at <= now:
                planned.append((message, None))
                continue
            for queue in accepted:
                queue.reserve(size)  # the next message of the batch sees it in the quota
                reserved.append((queue, size))
            if accepted:
                meta = message_meta(message.sender, message.reply_to, message.correlation_id)
                meta["origin"] = list(message.origin or service._new_origin())
                if message.hop_count:
                    meta["hops"] = message.hop_count
                if message.retain:
                    meta["retain"] = True
                if message.redelivered:
                    meta["redelivered"] = True  # see the module's docs
                records.append(
                    NewMessage(
                        message.topic,
                        message.payload,
                        endpoints_of(accepted),
                        {**message.headers, META_HEADER: meta},
                        message.delivery_mode is DeliveryMode.PERSISTENT,
                        expires_at,
                        message.timestamp if message.timestamp is not None else now,
                    )
                )
            planned.append((message, accepted))
    finally:
        for queue, size in reserved:  # the put counts them from here (no await between)
            queue.unreserve(size)
    if records:
        await service.store.put_many(records)
    taken: list[tuple[str, ...]] = []
    stored = iter(records)
    for position, (message, holders) in enumerate(planned):
        if holders is None:
            link.count_drop("expired")
            taken.append(())
            continue
        if holders:
            record = next(stored)
            for queue in holders:
                queue.stored()
            origin = record.headers[META_HEADER]["origin"]
            origin = (origin[0], origin[1])
        else:
            link.count_drop("no_eligible_destination")
            origin = message.origin or service._new_origin()
        endpoints = endpoints_of(holders)
        taken.append(endpoints)
        if delivered is not None and delivered[position]:
            continue  # its direct copy came first, over another link
        copy = Message(
            message.topic,
            message.payload,
            DeliveryMode.DIRECT,
            message.headers,
            message.eliding_eligible,
            message.reply_to,
            message.correlation_id,
            sender=message.sender,
            timestamp=message.timestamp,
            origin=origin,
            hop_count=message.hop_count,
            expires_at=message.expires_at,
            redelivered=message.redelivered,
        )
        # Routed as what it was stored as: a message a peer sent as direct was stored
        # non-persistent, and must not be spooled again as a direct message would be.
        mode = message.delivery_mode
        if mode is DeliveryMode.DIRECT:
            mode = DeliveryMode.NON_PERSISTENT
        vpn.dispatch(Envelope(copy, link, endpoints, mode), count_unmatched=not holders)
    return taken, refusal


def _matching(
    service: GuaranteedService, vpn: str, index: SubscriptionIndex[Queue] | None, topic: str
) -> tuple[Queue, ...]:
    """The endpoints whose subscriptions match ``topic``; for a message sent to a queue by
    name (``#P2P/QUE/<name>``), that queue and those that subscribe its topic exactly."""
    if not topic.startswith(QUEUE_TOPIC_PREFIX):
        return index.match(topic) if index is not None else ()
    # Sent to a queue by name: that queue, and those subscribing its topic itself.
    following = index.subscribers(topic) if index is not None else ()
    named = service.find_queue(vpn, topic[len(QUEUE_TOPIC_PREFIX) :])
    if named is not None and not named.topic_endpoint and named not in following:
        return (named, *following)
    return following
