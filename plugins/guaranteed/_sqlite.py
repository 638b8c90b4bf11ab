"""``SqliteStore``: the embedded, durable spool (stdlib ``sqlite3``, WAL mode).

Durability, exactly (``durability="full"``, the default):

* When ``put_many``/``put`` of a **persistent** message returns, its transaction is in
  the write-ahead log and the log was fsynced (``synchronous=FULL``): the message
  survives a process crash (kill -9), an OS crash and a power loss.
* ``mark_delivered`` and ``drop_endpoint`` are synced the same way, so a message handed
  to a consumer after ``mark_delivered`` returned is flagged ``redelivered`` after any
  crash (SPEC 4: nothing delivered twice without that flag). A reference the put wrote
  already marked (``NewMessage.marked``) was synced with the put: its mark_delivered
  commits nothing.
* ``ack`` and puts of only **non-persistent** messages commit without their own fsync:
  once the call returns they survive a process crash (the log is written, and the OS
  keeps it), and they reach the disk with the next synced commit or checkpoint. A power
  loss before that can bring acked messages back; they are then redelivered with
  ``redelivered=True`` (their delivery was marked, durably), never silently.

``durability="relaxed"`` (``synchronous=NORMAL``): every call survives a process crash
once it has returned, but an OS crash or power loss may take back the last commits
(up to the last checkpoint). In both modes the file is never left half-written: SQLite
recovers to the last complete commit.

Group commit: the store keeps one *pending* batch. A caller appends its operation to it;
if no commit is running, it becomes the *leader*: it yields once (so callers already
runnable join in), takes the batch, runs it as one transaction (one fsync) on the
store's worker thread, wakes every caller of the batch, and hands the lead to the first
caller of the batch that filled up meanwhile. So a lone publisher goes to disk after
one scheduling round, and under load each commit takes everything that arrived during
the previous one. There is no background task, hence no task group to own (the store
opens and closes like a file).

Threading: every SQLite call runs through ``anyio.to_thread.run_sync`` with the store's
``CapacityLimiter(1)``, so one thread at a time uses the connection (opened with
``check_same_thread=False`` because anyio may pick another pool thread each time), and
the event loop never blocks on the disk. Reads queue behind commits on that limiter.
A read of what an endpoint's consumer has not seen yet, once it has read everything,
is answered from the committed puts the store keeps in memory (``_tail.py``): a
consumer that keeps up gets each message without a trip to the worker thread.

The file is opened with ``locking_mode=EXCLUSIVE``: a second process (or store) on the
same file gets :class:`~meshbus.SpoolError` instead of sharing, and SQLite needs no
shared-memory index beside the log.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import anyio
from anyio.lowlevel import checkpoint, checkpoint_if_cancelled

from ._sqlite_sql import (
    _CHECKS,
    _DELETE_REF,
    _DROP_ENDPOINT,
    _DROP_REFS,
    _ENDPOINT_FIGURES,
    _MARK_REF,
    _READ,
    _READ_EXPIRED,
    _SCHEMA,
    _SET_NEXT_ID,
    SCHEMA_VERSION,
    _insert,
)
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
from ._tail import TailCache

__all__ = ["SqliteStore"]

_PUT, _ACK, _MARK, _DROP, _PUT_ACK = range(5)


class _Ticket:
    """One call's operation, waiting in a batch for its group commit.

    Only the first caller of a batch that has to wait gets an ``event`` of its own: it
    is the one the lead is handed to (``lead``), and the event is also set when its
    batch is committed (``done``). The other callers wait on their batch's shared
    event, so a commit of N callers costs one event, not N.
    """

    __slots__ = (
        "args",
        "batch",
        "delta",
        "done",
        "endpoint",
        "error",
        "event",
        "kind",
        "lead",
        "records",
        "result",
        "sync",
    )

    def __init__(self, kind: int, endpoint: str, args: Any, records: int, sync: bool) -> None:
        self.kind = kind
        self.endpoint = endpoint
        self.args = args  # statement parameters, built before queueing
        self.records = records
        self.sync = sync  # the commit must fsync for this operation
        self.delta: dict[str, list[int]] | None = None  # a put's [messages, bytes] per endpoint
        self.batch: _Batch | None = None
        self.event: anyio.Event | None = None
        self.lead = False  # the lead was handed to this caller
        self.done = False
        self.error: SpoolError | None = None
        self.result = 0


class _Batch:
    """Operations that will share one transaction, in call order."""

    __slots__ = ("delta", "shared", "tickets")

    def __init__(self) -> None:
        self.tickets: list[_Ticket] = []
        self.shared: anyio.Event | None = None  # what callers without an event wait on
        # What its puts add to each endpoint: stats() counts it before the commit.
        self.delta: dict[str, list[int]] = {}


# What a commit reports back: each ticket's count, then [messages, bytes] of every
# endpoint it changed, as committed.
_Outcome = tuple[list[int], dict[str, tuple[int, int]]]


class SqliteStore(SpoolStore):
    """The embedded default :class:`SpoolStore`: one SQLite file in WAL mode.

    :param path: the database file (created if missing; ``-wal`` beside it).
    :param durability: ``"full"`` (fsync before a persistent put returns) or
        ``"relaxed"`` (survives a process crash, not a power loss); see the module docs.
    """

    def __init__(
        self, path: str | os.PathLike[str], durability: Literal["full", "relaxed"] = "full"
    ) -> None:
        if durability not in ("full", "relaxed"):
            raise ValueError(f"durability must be 'full' or 'relaxed', not {durability!r}")
        self.path = os.fspath(path)
        self.durability = durability
        self._full = durability == "full"
        self._conn: sqlite3.Connection | None = None
        self._closing = False
        self._synced = self._full  # the connection's synchronous setting (worker only)
        self._limiter: anyio.CapacityLimiter | None = None
        self._next_id = 1
        self._pending = _Batch()
        self._inflight: _Batch | None = None
        self._busy = False  # some caller holds the lead
        self._idle: anyio.Event | None = None  # close() and check() wait on it
        self._committed: dict[str, tuple[int, int]] = {}  # figures on disk, per endpoint
        # References this open store wrote already marked delivered (NewMessage.marked)
        # and that mark_delivered has not counted yet: reads report them undelivered.
        self._premarked: set[tuple[str, int]] = set()
        # What consumers that keep up read next, as committed (see _tail.py); the number
        # of the last commit the worker ran (set by it) and of the last the cache took.
        self._tail = TailCache()
        self._commit_number = self._ran = self._cached = 0
        self._commits = self._syncs = self._records = 0

    def __repr__(self) -> str:
        state = "open" if self._conn is not None else "closed"
        return f"<SqliteStore {self.path!r} {self.durability} {state}>"

    # -- lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        if self._conn is not None:
            raise StateError(f"spool {self.path!r} is open already")
        limiter = anyio.CapacityLimiter(1)
        conn, next_id, committed = await anyio.to_thread.run_sync(self._connect, limiter=limiter)
        self._limiter = limiter
        self._conn = conn
        self._closing = False
        self._synced = self._full
        self._next_id = next_id
        self._pending = _Batch()
        self._committed = committed
        self._premarked = set()
        self._tail = TailCache()
        self._commits = self._syncs = self._records = 0

    def _connect(self) -> tuple[sqlite3.Connection, int, dict[str, tuple[int, int]]]:
        try:
            # timeout=0: a file locked by another store fails at once, it will not free up
            conn = sqlite3.connect(
                self.path, timeout=0, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise SpoolError(f"cannot open spool {self.path!r}: {exc}") from exc
        try:
            conn.execute("PRAGMA locking_mode = EXCLUSIVE")
            (mode,) = conn.execute("PRAGMA journal_mode = WAL").fetchone()
            if mode != "wal":
                raise SpoolError(f"spool {self.path!r} cannot use a write-ahead log ({mode})")
            conn.execute(f"PRAGMA synchronous = {'FULL' if self._full else 'NORMAL'}")
            if self._full:
                conn.execute("PRAGMA fullfsync = ON")  # macOS: F_FULLFSYNC, a real flush
            (version,) = conn.execute("PRAGMA user_version").fetchone()
            if version not in (0, SCHEMA_VERSION):
                raise SpoolError(
                    f"{self.path!r} is a spool of version {version}, this is {SCHEMA_VERSION}"
                )
            # Writing takes the exclusive lock now, so a file in use fails here.
            conn.executescript(f"BEGIN IMMEDIATE; {_SCHEMA} COMMIT;")
            (stored_next,) = conn.execute("SELECT value FROM meta WHERE key = 'next_id'").fetchone()
            (top,) = conn.execute("SELECT coalesce(max(id), 0) FROM messages").fetchone()
            committed = {
                name: (messages, size)
                for name, messages, size in conn.execute(
                    "SELECT name, messages, bytes FROM endpoints WHERE messages > 0"
                )
            }
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise SpoolError(f"cannot open spool {self.path!r}: {exc}") from exc
            raise
        return conn, max(stored_next, top + 1), committed

    async def close(self) -> None:
        conn = self._conn
        if conn is None or self._closing:
            return
        self._closing = True  # new calls fail from here; queued ones still commit
        with anyio.CancelScope(shield=True):  # never leave the file half-closed
            await self._wait_idle()
            await anyio.to_thread.run_sync(self._disconnect, conn, limiter=self._limiter)
        self._tail.clear()

    def _disconnect(self, conn: sqlite3.Connection) -> None:
        self._conn = None  # under the limiter: a read queued before us has finished
        try:
            conn.close()
        except sqlite3.Error as exc:
            raise SpoolError(f"closing spool {self.path!r}: {exc}") from exc

    def _check_open(self) -> None:
        if self._conn is None or self._closing:
            raise StateError(f"spool {self.path!r} is not open")

    # -- mutations: queued for the group commit ---------------------------------------

    async def put_many(self, messages: Sequence[NewMessage]) -> list[int]:
        self._check_open()
        encoded = validate_messages(messages)
        if not messages:
            await checkpoint_if_cancelled()
            return []
        # No checkpoint here: _submit withdraws the put if the caller is cancelled.
        rows, refs, delta, ids, persistent = self._new_rows(messages, encoded)
        ticket = _Ticket(_PUT, "", (rows, refs), len(rows), self._full and persistent)
        ticket.delta = delta
        await self._submit(ticket)  # a failed or withdrawn put forgets its marks there
        return ids

    async def put_and_ack(
        self, messages: Sequence[NewMessage], endpoint: str, message_ids: Iterable[int]
    ) -> list[int]:
        self._check_open()
        acked, encoded = validate_put_and_ack(messages, endpoint, message_ids)
        await checkpoint_if_cancelled()
        self._check_open()
        rows, refs, delta, ids, persistent = self._new_rows(messages, encoded)
        # One ticket, so one transaction: the put and the ack commit together or not at all.
        gone = [(endpoint, i) for i in acked]
        records = len(rows) + len(gone)
        ticket = _Ticket(_PUT_ACK, endpoint, (rows, refs, gone), records, self._full and persistent)
        ticket.delta = delta
        await self._submit(ticket)
        self._premarked.difference_update(gone)
        return ids

    def _new_rows(
        self, messages: Sequence[NewMessage], encoded: list[str]
    ) -> tuple[list[Any], list[Any], dict[str, list[int]], list[int], bool]:
        """The rows a put inserts, its references, what it adds per endpoint, its ids."""
        # Ids are taken now, in call order, so that ids (and so every endpoint's
        # order) follow the order of the calls even when they share a commit.
        rows = []
        refs = []
        delta: dict[str, list[int]] = {}
        ids = []
        persistent = False
        message_id = self._next_id
        for message, headers in zip(messages, encoded, strict=True):
            endpoints = message.endpoints
            payload = message.payload
            rows.append(
                (
                    message_id,
                    message.topic,
                    payload,
                    headers,
                    bool(message.persistent),
                    message.expires_at,
                    message.published_at,
                    len(endpoints),
                )
            )
            size = len(payload)
            marked = message.marked
            for name in endpoints:
                if marked and name in marked:
                    refs.append((name, message_id, 1))
                    self._premarked.add((name, message_id))
                else:
                    refs.append((name, message_id, 0))
                figures = delta.get(name)
                if figures is None:
                    delta[name] = [1, size]
                else:
                    figures[0] += 1
                    figures[1] += size
            persistent = persistent or message.persistent
            ids.append(message_id)
            message_id += 1
        self._next_id = message_id
        return rows, refs, delta, ids, persistent

    async def ack(self, endpoint: str, message_ids: Iterable[int]) -> int:
        return await self._submit_refs(_ACK, endpoint, message_ids, sync=False)

    async def mark_delivered(self, endpoint: str, message_ids: Iterable[int]) -> int:
        return await self._submit_refs(_MARK, endpoint, message_ids, sync=self._full)

    async def _submit_refs(
        self, kind: int, endpoint: str, message_ids: Iterable[int], sync: bool
    ) -> int:
        self._check_open()
        validate_endpoint(endpoint)
        ids = validate_ids(message_ids)
        await checkpoint_if_cancelled()
        if not ids:
            return 0
        self._check_open()
        premarked = self._premarked
        settled: list[tuple[str, int]] = []  # references whose mark is on disk already
        if premarked:
            settled = [(endpoint, i) for i in ids if (endpoint, i) in premarked]
            if settled and kind == _MARK:  # their put wrote the mark: nothing to commit
                ids = [i for i in ids if (endpoint, i) not in premarked]
                if not ids:
                    await checkpoint()
                    premarked.difference_update(settled)
                    return len(settled)
        ticket = _Ticket(kind, endpoint, [(endpoint, i) for i in ids], len(ids), sync)
        await self._submit(ticket)
        # Only now: had the call been withdrawn, the references would still be premarked.
        premarked.difference_update(settled)
        return ticket.result + (len(settled) if kind == _MARK else 0)

    async def drop_endpoint(self, endpoint: str) -> int:
        self._check_open()
        validate_endpoint(endpoint)
        await checkpoint_if_cancelled()
        self._check_open()
        ticket = _Ticket(_DROP, endpoint, (endpoint,), 1, self._full)
        await self._submit(ticket)
        if self._premarked:
            self._premarked = {ref for ref in self._premarked if ref[0] != endpoint}
        return ticket.result

    async def _submit(self, ticket: _Ticket) -> None:
        """Queue ``ticket`` and return once its batch is committed (or raise why not).

        A cancelled caller withdraws its operation unless its commit has started, so
        the callers need no checkpoint of their own before this.
        """
        batch = self._pending
        tickets = batch.tickets
        tickets.append(ticket)
        ticket.batch = batch
        if ticket.delta is not None:
            _merge(batch.delta, ticket.delta)
        if self._busy:
            if len(tickets) == 1:
                ticket.event = anyio.Event()  # first in line: the lead may come to it
            elif batch.shared is None:
                batch.shared = anyio.Event()
            while True:
                event = ticket.event or batch.shared
                assert event is not None
                try:
                    await event.wait()
                except BaseException as exc:  # cancelled
                    withdrawn = self._abandon(ticket, leading=ticket.lead and not ticket.done)
                    if withdrawn or not isinstance(exc, anyio.get_cancelled_exc_class()):
                        raise
                    # Its commit has started: the operation counts, so it returns as
                    # usual once committed, and its caller does what follows it (the
                    # direct copies of a guaranteed publish, a retained value) before it
                    # meets the cancellation, still pending, at its next checkpoint.
                    with anyio.CancelScope(shield=True):
                        while not ticket.done:
                            await (ticket.event or batch.shared or event).wait()
                if ticket.done:
                    if ticket.error is not None:
                        raise ticket.error
                    return
                if ticket.lead:
                    break
                # The shared event woke everyone to reach a new first caller: not us.
        else:
            self._busy = True  # the lead is ours
        # Yield once before taking the batch: callers that are ready to run (typically
        # the publishers the last commit just woke) join this commit instead of leaving
        # it to a lone caller, which would make commits alternate between 1 and N.
        try:
            await checkpoint()
        except BaseException:
            self._abandon(ticket, leading=True)
            raise
        await self._lead()
        if ticket.error is not None:
            raise ticket.error

    def _abandon(self, ticket: _Ticket, leading: bool) -> bool:
        """A caller was cancelled: withdraw its operation if its commit has not started;
        whether it did."""
        batch = self._pending
        if ticket.done or ticket.batch is not batch:
            return False  # committed already, or being committed: it counts
        batch.tickets.remove(ticket)
        if ticket.delta is not None:
            _merge(batch.delta, ticket.delta, -1)
            self._forget_marks(ticket)
        if leading:
            self._hand_off()  # pass the lead on, or go idle
        return True

    async def _lead(self) -> None:
        """Commit the pending batch as one transaction, wake its callers, pass the lead on.

        Shielded: the callers of the batch (and those queued behind it) depend on this
        task finishing the commit and handing over, whatever happens to its own caller.
        """
        batch = self._pending
        self._pending = _Batch()
        self._inflight = batch
        tickets = batch.tickets
        sync = self._full and any(ticket.sync for ticket in tickets)
        self._commit_number += 1
        number = self._commit_number
        outcome: _Outcome | None = None
        error: SpoolError | None = None
        try:
            with anyio.CancelScope(shield=True):
                outcome = await anyio.to_thread.run_sync(
                    self._apply, tickets, sync, number, limiter=self._limiter
                )
        except SpoolError as exc:
            error = exc
        except Exception as exc:
            error = SpoolError(f"spool {self.path!r}: commit failed: {exc!r}")
            error.__cause__ = exc
        finally:
            self._inflight = None
            self._cached = number
            if outcome is None:
                self._tail.clear()  # an interrupted commit may be on disk all the same
                if error is None:  # interrupted (KeyboardInterrupt...): state unknown
                    error = SpoolError(f"spool {self.path!r}: commit interrupted")
            else:
                counts, figures = outcome
                for ticket, count in zip(tickets, counts, strict=True):
                    ticket.result = count
                    self._cache(ticket)
                for name, (messages, size) in figures.items():
                    if messages:
                        self._committed[name] = (messages, size)
                    else:
                        self._committed.pop(name, None)
                self._commits += 1
                self._syncs += sync
                self._records += sum(ticket.records for ticket in tickets)
            for ticket in tickets:
                ticket.done = True
                ticket.error = error
                if error is not None and ticket.delta is not None:
                    self._forget_marks(ticket)
                if ticket.event is not None:
                    ticket.event.set()
            if batch.shared is not None:
                batch.shared.set()
            self._hand_off()

    def _cache(self, ticket: _Ticket) -> None:
        """Tell the tail cache what a committed ticket changed (in commit order)."""
        kind, tail = ticket.kind, self._tail
        if kind in (_PUT, _PUT_ACK):
            tail.put(ticket.args[0], ticket.args[1])
            if kind == _PUT_ACK:
                tail.ack(ticket.endpoint, [i for _, i in ticket.args[2]])
        elif kind == _ACK:
            tail.ack(ticket.endpoint, [i for _, i in ticket.args])
        elif kind == _MARK:
            tail.mark(ticket.endpoint, [i for _, i in ticket.args])
        else:
            tail.drop(ticket.endpoint)

    def _forget_marks(self, ticket: _Ticket) -> None:
        """A put that will not be stored: its references are not premarked after all."""
        for name, message_id, count in ticket.args[1]:
            if count:
                self._premarked.discard((name, message_id))

    def _hand_off(self) -> None:
        """Give the lead to the first caller waiting in the pending batch, or go idle."""
        batch = self._pending
        if batch.tickets:
            first = batch.tickets[0]
            first.lead = True
            if first.event is not None:
                first.event.set()
            else:
                # The caller with the event withdrew: wake the batch's callers (only
                # the first leads; the others wait again, on a fresh shared event).
                shared = batch.shared
                assert shared is not None  # a waiting caller without an event uses it
                batch.shared = anyio.Event()
                shared.set()
        else:
            self._busy = False
            if self._idle is not None:
                self._idle.set()
                self._idle = None

    # -- worker thread ----------------------------------------------------------------

    def _apply(self, tickets: list[_Ticket], sync: bool, number: int) -> _Outcome:
        """Run ``tickets`` in one transaction (worker thread, under the limiter)."""
        self._ran = number
        conn = self._conn
        assert conn is not None  # close() waits for the leaders
        counts: list[int] = []
        touched: dict[str, None] = {}
        rows: list[Any] = []
        refs: list[Any] = []
        delta: dict[str, list[int]] = {}
        top = 0
        try:
            if self._full and sync != self._synced:
                # Only commits that need it pay for the fsync (see the module docs).
                conn.execute(f"PRAGMA synchronous = {'FULL' if sync else 'NORMAL'}")
                self._synced = sync
            conn.execute("BEGIN")
            for ticket in tickets:
                kind = ticket.kind
                if kind == _PUT:
                    # Consecutive puts become one executemany per table.
                    put_rows, put_refs = ticket.args
                    rows += put_rows
                    refs += put_refs
                    assert ticket.delta is not None
                    _merge(delta, ticket.delta)
                    top = put_rows[-1][0]
                    counts.append(len(put_rows))
                    continue
                if kind == _PUT_ACK:  # a put, then an ack, in this same transaction
                    put_rows, put_refs, gone = ticket.args
                    rows += put_rows
                    refs += put_refs
                    assert ticket.delta is not None
                    _merge(delta, ticket.delta)
                    top = put_rows[-1][0] if put_rows else top
                    _insert(conn, rows, refs, delta, touched)
                    rows, refs, delta = [], [], {}
                    counts.append(conn.executemany(_DELETE_REF, gone).rowcount)
                    touched[ticket.endpoint] = None
                    continue
                if rows:
                    _insert(conn, rows, refs, delta, touched)
                    rows, refs, delta = [], [], {}
                if kind == _ACK:
                    counts.append(conn.executemany(_DELETE_REF, ticket.args).rowcount)
                    touched[ticket.endpoint] = None
                elif kind == _MARK:
                    counts.append(conn.executemany(_MARK_REF, ticket.args).rowcount)
                else:
                    counts.append(conn.execute(_DROP_REFS, ticket.args).rowcount)
                    conn.execute(_DROP_ENDPOINT, ticket.args)
                    touched[ticket.endpoint] = None
            if rows:
                _insert(conn, rows, refs, delta, touched)
            if top:
                conn.execute(_SET_NEXT_ID, (top + 1,))
            figures: dict[str, tuple[int, int]] = {}
            for name in touched:
                row = conn.execute(_ENDPOINT_FIGURES, (name,)).fetchone()
                figures[name] = (row[0], row[1]) if row is not None else (0, 0)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):  # report the original error
                    conn.execute("ROLLBACK")
            raise SpoolError(f"spool {self.path!r}: commit failed: {exc}") from exc
        return counts, figures

    def _read_numbered(
        self, endpoint: str, after_id: int, limit: int, max_bytes: int | None
    ) -> tuple[list[SpoolEntry], int]:
        """:meth:`_read`, and the number of the last commit run before it."""
        return self._read(endpoint, after_id, limit, max_bytes), self._ran

    def _read(
        self, endpoint: str, after_id: int, limit: int, max_bytes: int | None
    ) -> list[SpoolEntry]:
        return self._select(endpoint, _READ, (endpoint, after_id, limit), max_bytes)

    def _read_expired(
        self, endpoint: str, after_id: int, now: float, limit: int
    ) -> list[SpoolEntry]:
        return self._select(endpoint, _READ_EXPIRED, (endpoint, now, after_id, limit), None)

    def _select(
        self, endpoint: str, query: str, parameters: tuple[Any, ...], max_bytes: int | None
    ) -> list[SpoolEntry]:
        conn = self._conn
        if conn is None:
            raise StateError(f"spool {self.path!r} is not open")
        page: list[SpoolEntry] = []
        total = 0
        try:
            # Rows are stepped one by one, so a page cut short by max_bytes never
            # loads the payloads after it; closing the cursor ends the statement.
            cursor = conn.execute(query, parameters)
            try:
                for row in cursor:
                    payload = row[2]
                    message = StoredMessage(
                        row[0],
                        row[1],
                        payload,
                        decode_headers(row[3]),
                        bool(row[4]),
                        row[5],
                        row[6],
                    )
                    count = row[7]
                    if count and (endpoint, row[0]) in self._premarked:
                        count -= 1  # marked by its put, not yet by mark_delivered
                    page.append(SpoolEntry(message, count))
                    if max_bytes is not None:
                        total += len(payload)
                        if total >= max_bytes:
                            break
            finally:
                cursor.close()
        except (sqlite3.Error, ValueError) as exc:  # orjson.JSONDecodeError is a ValueError
            raise SpoolError(f"spool {self.path!r}: cannot read {endpoint!r}: {exc}") from exc
        return page

    def _check(self) -> dict[str, tuple[int, int]]:
        conn = self._conn
        if conn is None:
            raise StateError(f"spool {self.path!r} is not open")
        try:
            result = [row[0] for row in conn.execute("PRAGMA integrity_check")]
            if result != ["ok"]:
                raise SpoolError(f"spool {self.path!r} is corrupt: {'; '.join(result[:5])}")
            for problem, query in _CHECKS:
                row = conn.execute(query).fetchone()
                if row is not None:
                    raise SpoolError(f"spool {self.path!r}: " + problem.format(*row))
            for message_id, headers in conn.execute("SELECT id, headers FROM messages"):
                try:
                    decode_headers(headers)
                except (ValueError, TypeError) as exc:
                    raise SpoolError(
                        f"spool {self.path!r}: message {message_id} has bad headers: {exc}"
                    ) from exc
            return {
                name: (messages, size)
                for name, messages, size in conn.execute(
                    "SELECT name, messages, bytes FROM endpoints WHERE messages > 0"
                )
            }
        except sqlite3.Error as exc:
            raise SpoolError(f"spool {self.path!r}: check failed: {exc}") from exc

    # -- reads ------------------------------------------------------------------------

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
        cached = self._tail.read(endpoint, after_id, limit, max_bytes, self._premarked)
        if cached is not None:
            return cached
        page, ran = await anyio.to_thread.run_sync(
            self._read_numbered, endpoint, after_id, limit, max_bytes, limiter=self._limiter
        )
        if len(page) < limit and max_bytes is None and ran == self._cached:
            # All of it, and the cache took in just the commits before the read: it
            # follows the endpoint from here (see _tail.py).
            self._tail.follow(endpoint, page[-1].message.id if page else after_id)
        return page

    async def read_expired(
        self, endpoint: str, after_id: int, now: float, limit: int = DEFAULT_PAGE
    ) -> list[SpoolEntry]:
        self._check_open()
        validate_endpoint(endpoint)
        validate_expired_read(after_id, now, limit)
        return await anyio.to_thread.run_sync(
            self._read_expired, endpoint, after_id, now, limit, limiter=self._limiter
        )

    def stats(self, endpoint: str) -> EndpointStats:
        messages, size = self._committed.get(endpoint, (0, 0))
        for batch in (self._inflight, self._pending):
            if batch is not None:
                figures = batch.delta.get(endpoint)
                if figures is not None:
                    messages += figures[0]
                    size += figures[1]
        return EndpointStats(messages, size)

    def endpoints(self) -> list[str]:
        names = set(self._committed)
        for batch in (self._inflight, self._pending):
            if batch is not None:
                names.update(batch.delta)
        return sorted(name for name in names if self.stats(name).messages)

    def statistics(self) -> SpoolStatistics:
        return SpoolStatistics(commits=self._commits, syncs=self._syncs, records=self._records)

    async def check(self) -> None:
        self._check_open()
        await self._wait_idle()
        self._check_open()
        # Take the lead without a batch: callers queue meanwhile, so the figures in
        # memory and on disk are compared with no commit between them.
        self._busy = True
        try:
            with anyio.CancelScope(shield=True):
                on_disk = await anyio.to_thread.run_sync(self._check, limiter=self._limiter)
            if on_disk != self._committed:
                raise SpoolError(
                    f"spool {self.path!r}: endpoint figures in memory {self._committed}"
                    f" differ from the file's {on_disk}"
                )
        finally:
            self._hand_off()

    async def _wait_idle(self) -> None:
        """Until no caller holds the lead (all queued operations are committed)."""
        while self._busy:
            if self._idle is None:
                self._idle = anyio.Event()
            await self._idle.wait()


def _merge(into: dict[str, list[int]], delta: dict[str, list[int]], sign: int = 1) -> None:
    """Add (or with ``sign=-1`` take back) a put's per-endpoint [messages, bytes]."""
    for name, (messages, size) in delta.items():
        figures = into.get(name)
        if figures is None:
            into[name] = [sign * messages, sign * size]
        else:
            figures[0] += sign * messages
            figures[1] += sign * size
