"""``TailCache``: the newest references of the endpoints whose consumers keep up, as
committed, so that :meth:`SqliteStore.read` hands them out without a trip to the
database thread.

A consumer that keeps up reads, after each commit, exactly the messages that commit
put: a read through the worker thread costs a thread round trip (a wake-up and a GIL
hand-over each way), the SQL and a row decode per message, all on the path from the
publisher's commit to the consumer. The store already holds those messages in
memory when they commit; this keeps them, for a while, per endpoint.

The invariant, per endpoint with a tail: every committed reference of the endpoint
with an id above the tail's ``after`` is in the tail, with the delivery count the
database holds for it. A read after ``after`` or later is then answered from the
tail exactly as the database would answer it. The store keeps the invariant by
telling the cache every committed change, in commit order, between a commit and the
next (puts, acks, marks, dropped endpoints).

A tail starts empty, when a read of the database came back with less than it asked
for: its consumer has read everything, so the endpoint held nothing after the last
reference returned, and the consumer's next read starts there. The store starts it
only when no commit has changed the cache since the read ran (see
:meth:`SqliteStore.read`). A tail that would grow past its bounds is dropped whole:
its consumer is behind, and reads from the database again until it has read
everything once more. So puts to an endpoint nobody reads, or whose consumer is far
behind, cost the cache nothing.
"""

from __future__ import annotations

import bisect
from collections.abc import Container, Iterable, Sequence
from typing import Any

from ._store import SpoolEntry, StoredMessage, decode_headers

__all__ = ["TailCache"]

MAX_ENTRIES = 1024
"""References one tail holds at most: a consumer's window and what arrives while it
works through it. A tail that would hold more is dropped (its consumer is behind)."""

MAX_BYTES = 16 * 1024 * 1024
"""Payload bytes all tails hold at most together; one tail holds an eighth of it at
most, so a tail whose consumer went away cannot keep the others out."""


class _Tail:
    __slots__ = ("after", "entries", "ids", "size")

    def __init__(self, after: int) -> None:
        self.after = after  # every committed reference with a higher id is here
        self.ids: list[int] = []
        self.entries: list[tuple[Any, int]] = []  # (row as inserted, delivery count)
        self.size = 0  # payload bytes


class TailCache:
    """The tails of the store's endpoints; see the module docs. Used on the event
    loop only, by the store, after each commit and for each read."""

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._tails: dict[str, _Tail] = {}
        self.size = 0  # payload bytes in all tails
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._tails)

    def clear(self) -> None:
        self._tails.clear()
        self.size = 0

    def follow(self, endpoint: str, after: int) -> None:
        """Start an empty tail for ``endpoint``, which holds no committed reference
        above ``after`` (unless it has a tail already)."""
        if endpoint not in self._tails:
            self._tails[endpoint] = _Tail(after)

    # -- what was committed -----------------------------------------------------------

    def put(self, rows: Sequence[Any], refs: Sequence[Any]) -> None:
        """A committed put: its message rows and references, as the store inserted them
        (rows ``(id, topic, payload, headers JSON, persistent, expires_at,
        published_at, ...)`` with consecutive ids, refs ``(endpoint, id, delivery
        count)``). Kept as they are: a message is made only if it is read."""
        tails = self._tails
        if not tails:
            return
        first = rows[0][0] if rows else 0
        for endpoint, message_id, count in refs:
            tail = tails.get(endpoint)
            if tail is None:
                continue
            row = rows[message_id - first]
            size = len(row[2])
            if (
                len(tail.ids) >= self.max_entries
                or tail.size + size > self.max_bytes // 8
                or self.size + size > self.max_bytes
            ):
                self.drop(endpoint)  # behind, or no room: it reads from the database
                continue
            tail.ids.append(message_id)
            tail.entries.append((row, count))
            tail.size += size
            self.size += size

    def ack(self, endpoint: str, message_ids: Iterable[int]) -> None:
        """Committed acks (deleted references) of ``endpoint``."""
        tail = self._tails.get(endpoint)
        if tail is None:
            return
        ids = tail.ids
        for message_id in message_ids:
            i = bisect.bisect_left(ids, message_id)
            if i < len(ids) and ids[i] == message_id:
                del ids[i]
                size = len(tail.entries.pop(i)[0][2])
                tail.size -= size
                self.size -= size

    def mark(self, endpoint: str, message_ids: Iterable[int]) -> None:
        """Committed delivery marks (each reference's count + 1) of ``endpoint``."""
        tail = self._tails.get(endpoint)
        if tail is None:
            return
        ids, entries = tail.ids, tail.entries
        for message_id in message_ids:
            i = bisect.bisect_left(ids, message_id)
            if i < len(ids) and ids[i] == message_id:
                row, count = entries[i]
                entries[i] = (row, count + 1)

    def drop(self, endpoint: str) -> None:
        """Forget ``endpoint``'s tail (a dropped endpoint, or one that outgrew it)."""
        tail = self._tails.pop(endpoint, None)
        if tail is not None:
            self.size -= tail.size

    # -- reads ------------------------------------------------------------------------

    def read(
        self,
        endpoint: str,
        after_id: int,
        limit: int,
        max_bytes: int | None,
        premarked: Container[tuple[str, int]],
    ) -> list[SpoolEntry] | None:
        """What the database would return for this read (see :meth:`SpoolStore.read`),
        or ``None`` when the tail does not hold all of it (or there is none).

        :param premarked: the references whose put wrote their mark and that
            ``mark_delivered`` has not counted yet: reported undelivered, as the
            store's reads of the database report them.
        """
        tail = self._tails.get(endpoint)
        if tail is None or after_id < tail.after:
            self.misses += 1
            return None
        self.hits += 1
        i = bisect.bisect_right(tail.ids, after_id)
        page = []
        total = 0
        for row, count in tail.entries[i : i + limit]:
            message_id, payload = row[0], row[2]
            if count and (endpoint, message_id) in premarked:
                count -= 1
            message = StoredMessage(
                message_id, row[1], payload, decode_headers(row[3]), bool(row[4]), row[5], row[6]
            )
            page.append(SpoolEntry(message, count))
            if max_bytes is not None:
                total += len(payload)
                if total >= max_bytes:
                    break
        return page
