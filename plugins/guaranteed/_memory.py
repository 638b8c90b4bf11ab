"""``MemoryStore``: the spool in RAM, for tests and non-persistent use.

Same contract as every :class:`SpoolStore`, applied at once: each call is one
checkpoint (so a loop of puts still lets other tasks run, and a cancelled call is
not applied), then the change, without I/O. A put is the exception: it is applied
before it yields (and cannot be cancelled after), because stats() must count a put
from the moment it is called.

Durability: none. Everything is gone when the process ends or the store is closed
(closing and reopening starts empty, as a restart would).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from heapq import heapify, heappop, heappush

from anyio.lowlevel import cancel_shielded_checkpoint, checkpoint, checkpoint_if_cancelled

from ._store import (
    DEFAULT_PAGE,
    EndpointStats,
    NewMessage,
    SpoolEntry,
    SpoolError,
    SpoolStatistics,
    SpoolStore,
    StateError,
    StoredMessage,
    decode_headers,
    validate_endpoint,
    validate_expired_read,
    validate_ids,
    validate_messages,
    validate_page,
    validate_put_and_ack,
)

__all__ = ["MemoryStore"]


class _Endpoint:
    """The references of one endpoint.

    ``counts`` maps message id -> delivery count, the truth. ``order`` lists ids
    ascending for ``read`` to bisect; acked ids stay in it as tombstones (removing
    from the middle of a list is O(n) per ack) until they are half of it.
    ``expiring`` is a heap of ``(expires_at, id)`` for the messages with a TTL, so
    the TTL sweep finds the expired ones without a scan; it keeps tombstones too.
    """

    __slots__ = ("bytes", "counts", "expiring", "order")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.order: list[int] = []
        self.expiring: list[tuple[float, int]] = []
        self.bytes = 0

    def compact(self) -> None:
        counts = self.counts
        if len(self.order) > 2 * len(counts) + 64:
            self.order = [i for i in self.order if i in counts]
        if len(self.expiring) > 2 * len(counts) + 64:
            self.expiring = [e for e in self.expiring if e[1] in counts]
            heapify(self.expiring)


class MemoryStore(SpoolStore):
    """A :class:`SpoolStore` in RAM."""

    def __init__(self) -> None:
        self._open = False
        self._reset()

    def _reset(self) -> None:
        self._messages: dict[int, StoredMessage] = {}
        self._refcounts: dict[int, int] = {}
        self._endpoints: dict[str, _Endpoint] = {}
        self._next_id = 1
        self._commits = 0
        self._records = 0

    def _check_open(self) -> None:
        if not self._open:
            raise StateError("spool store is not open")

    async def open(self) -> None:
        if self._open:
            raise StateError("spool store is open already")
        await checkpoint()
        self._reset()
        self._open = True

    async def close(self) -> None:
        self._open = False
        self._reset()

    async def put_many(self, messages: Sequence[NewMessage]) -> list[int]:
        self._check_open()
        encoded = validate_messages(messages)
        # Stored before yielding, as SpoolStore promises: stats() counts a put from the
        # moment it is called, so a quota check and the put need no lock between them.
        await checkpoint_if_cancelled()
        ids = self._store(messages, encoded)
        self._commit(len(ids))
        await cancel_shielded_checkpoint()  # let others run; the put is done, so no cancel
        return ids

    async def put_and_ack(
        self, messages: Sequence[NewMessage], endpoint: str, message_ids: Iterable[int]
    ) -> list[int]:
        self._check_open()
        acked, encoded = validate_put_and_ack(messages, endpoint, message_ids)
        await checkpoint_if_cancelled()
        ids = self._store(messages, encoded)  # both before any yield: one change
        self._remove(endpoint, acked)
        self._commit(len(ids) + len(acked))
        await cancel_shielded_checkpoint()
        return ids

    def _store(self, messages: Sequence[NewMessage], encoded: list[str]) -> list[int]:
        ids = []
        for message, headers in zip(messages, encoded, strict=True):
            message_id = self._next_id
            self._next_id += 1
            # Headers take the JSON round trip a durable store gives them, so code
            # tested on this store sees the same values (tuples come back as lists).
            self._messages[message_id] = StoredMessage(
                message_id,
                message.topic,
                message.payload,
                decode_headers(headers),
                bool(message.persistent),
                message.expires_at,
                float(message.published_at),
            )
            self._refcounts[message_id] = len(message.endpoints)
            size = len(message.payload)
            for name in message.endpoints:
                endpoint = self._endpoints.get(name)
                if endpoint is None:
                    endpoint = self._endpoints[name] = _Endpoint()
                endpoint.counts[message_id] = 0
                endpoint.order.append(message_id)  # ids only grow: stays sorted
                endpoint.bytes += size
                if message.expires_at is not None:
                    heappush(endpoint.expiring, (message.expires_at, message_id))
            ids.append(message_id)
        return ids

    def _commit(self, records: int) -> None:
        self._commits += 1
        self._records += records

    def _unref(self, endpoint: _Endpoint, message_id: int) -> None:
        """Drop one reference (already removed from ``endpoint.counts``)."""
        endpoint.bytes -= len(self._messages[message_id].payload)
        left = self._refcounts[message_id] - 1
        if left:
            self._refcounts[message_id] = left
        else:
            del self._refcounts[message_id]
            del self._messages[message_id]

    async def ack(self, endpoint: str, message_ids: Iterable[int]) -> int:
        self._check_open()
        validate_endpoint(endpoint)
        ids = validate_ids(message_ids)
        await checkpoint()
        self._check_open()
        removed = self._remove(endpoint, ids)
        self._commit(len(ids))
        return removed

    def _remove(self, endpoint: str, ids: Iterable[int]) -> int:
        held = self._endpoints.get(endpoint)
        removed = 0
        if held is not None:
            for message_id in ids:
                if held.counts.pop(message_id, None) is not None:
                    self._unref(held, message_id)
                    removed += 1
            if not held.counts:
                del self._endpoints[endpoint]
            else:
                held.compact()
        return removed

    async def mark_delivered(self, endpoint: str, message_ids: Iterable[int]) -> int:
        self._check_open()
        validate_endpoint(endpoint)
        ids = validate_ids(message_ids)
        await checkpoint()
        self._check_open()
        held = self._endpoints.get(endpoint)
        marked = 0
        if held is not None:
            counts = held.counts
            for message_id in ids:
                count = counts.get(message_id)
                if count is not None:
                    counts[message_id] = count + 1
                    marked += 1
        self._commit(len(ids))
        return marked

    async def read(
        self,
        endpoint: str,
        after_id: int = 0,
        limit: int = DEFAULT_PAGE,
        max_bytes: int | None = None,
    ) -> list[SpoolEntry]:
        self._check_open()
        validate_endpoint(endpoint)
        validate_page(after_id, limit, max_bytes)
        await checkpoint()
        self._check_open()
        held = self._endpoints.get(endpoint)
        if held is None:
            return []
        order, counts, messages = held.order, held.counts, self._messages
        total = 0
        page: list[SpoolEntry] = []
        for i in range(bisect_right(order, after_id), len(order)):
            message_id = order[i]
            count = counts.get(message_id)
            if count is None:  # a tombstone
                continue
            message = messages[message_id]
            page.append(SpoolEntry(message, count))
            if len(page) == limit:
                break
            if max_bytes is not None:
                total += len(message.payload)
                if total >= max_bytes:
                    break
        return page

    async def read_expired(
        self, endpoint: str, after_id: int, now: float, limit: int = DEFAULT_PAGE
    ) -> list[SpoolEntry]:
        self._check_open()
        validate_endpoint(endpoint)
        validate_expired_read(after_id, now, limit)
        await checkpoint()
        self._check_open()
        held = self._endpoints.get(endpoint)
        if held is None:
            return []
        heap, counts = held.expiring, held.counts
        while heap and heap[0][1] not in counts:
            heappop(heap)  # acked: a tombstone at the top goes now
        # The entries due by ``now`` are the heap's top: walk down while they are due.
        ids: list[int] = []
        stack = [0] if heap and heap[0][0] <= now else []
        size = len(heap)
        while stack:
            i = stack.pop()
            message_id = heap[i][1]
            if message_id > after_id and message_id in counts:
                ids.append(message_id)
            for child in (2 * i + 1, 2 * i + 2):
                if child < size and heap[child][0] <= now:
                    stack.append(child)
        ids.sort()
        messages = self._messages
        return [SpoolEntry(messages[i], counts[i]) for i in ids[:limit]]

    def stats(self, endpoint: str) -> EndpointStats:
        held = self._endpoints.get(endpoint)
        if held is None:
            return EndpointStats(0, 0)
        return EndpointStats(len(held.counts), held.bytes)

    def endpoints(self) -> list[str]:
        return sorted(self._endpoints)

    async def drop_endpoint(self, endpoint: str) -> int:
        self._check_open()
        validate_endpoint(endpoint)
        await checkpoint()
        self._check_open()
        held = self._endpoints.pop(endpoint, None)
        if held is None:
            self._commit(1)
            return 0
        removed = list(held.counts)
        held.counts.clear()
        for message_id in removed:
            self._unref(held, message_id)
        self._commit(1)
        return len(removed)

    def statistics(self) -> SpoolStatistics:
        return SpoolStatistics(commits=self._commits, syncs=0, records=self._records)

    async def check(self) -> None:
        self._check_open()
        await checkpoint()
        refcounts: dict[int, int] = {}
        for name, held in self._endpoints.items():
            if not held.counts:
                raise SpoolError(f"endpoint {name!r} is listed but holds nothing")
            size = 0
            for message_id in held.counts:
                message = self._messages.get(message_id)
                if message is None:
                    raise SpoolError(f"endpoint {name!r} holds missing message {message_id}")
                size += len(message.payload)
                refcounts[message_id] = refcounts.get(message_id, 0) + 1
            if size != held.bytes:
                raise SpoolError(f"endpoint {name!r} counts {held.bytes} bytes, holds {size}")
            if sorted(held.counts) != [i for i in held.order if i in held.counts]:
                raise SpoolError(f"endpoint {name!r} lost its id order")
            expiring = {message_id for _, message_id in held.expiring}
            for message_id in held.counts:
                if self._messages[message_id].expires_at is not None and (
                    message_id not in expiring
                ):
                    raise SpoolError(f"endpoint {name!r} lost the expiry of {message_id}")
        if refcounts != self._refcounts or set(refcounts) != set(self._messages):
            raise SpoolError("message refcounts do not match the references held")
