"""The spool: where guaranteed messages wait for their consumers (SPEC 4).

A :class:`SpoolStore` keeps each message **once**, plus one *reference* per endpoint
(queue or topic endpoint) that must deliver it. A reference carries the number of
times the message was handed to a consumer of that endpoint, so that after a restart
a message that was already sent goes out again flagged ``redelivered=True``. When the
last endpoint holding a message acknowledges it, the message is deleted (refcount).

Everything the guaranteed plugin needs from storage is here, and nothing about
queues, flows or sessions: those live above, and work unchanged over any store.

Contract shared by every store (the tests in ``tests/plugins/guaranteed`` hold both
stores to it):

* Message ids are assigned by the store, in the order the ``put`` calls were made,
  and are strictly increasing, also across restarts of a durable store. An endpoint
  lists its messages in id order, so per-publisher order is kept.
* A mutation (``put_many``, ``ack``, ``mark_delivered``, ``drop_endpoint``) is applied
  whole or not at all, and is visible to ``read`` once its call has returned. What a
  crash can take away is each store's business: see its ``durability`` notes.
* ``read`` pages through an endpoint, so a consumer never needs the whole queue in RAM.
* ``stats`` and ``endpoints`` answer at once, without I/O, so quota checks can sit on
  the publish path; they already count puts that are waiting for their commit, so
  concurrent publishers cannot overshoot a quota together.
* Bad arguments raise ``TypeError``/``ValueError`` before anything is queued (one bad
  call never fails other callers' commit); calls on a store that is not open raise
  :class:`~meshbus.StateError`; storage failures raise :class:`~meshbus.SpoolError`.
* A call that is cancelled before its commit started is not applied, and raises the
  cancellation. One cancelled once its commit has started is applied (the commit is
  shared with other callers), and returns as usual when committed: its caller goes
  on to what follows it (a guaranteed publish's direct copies, a retained value) and
  meets the cancellation at its next checkpoint, so a publish counts whole or not at
  all.
"""

from __future__ import annotations

import abc
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, NamedTuple, Self

import attrs
import orjson

# mypy cannot follow the editable install's import hook (``meshbus`` maps onto sdk/),
# so when these modules are checked on their own the two classes are typed Any.
from meshbus import SpoolError, StateError  # type: ignore[import-not-found, unused-ignore]

__all__ = [
    "DEFAULT_PAGE",
    "EndpointStats",
    "NewMessage",
    "SpoolEntry",
    "SpoolError",
    "SpoolStatistics",
    "SpoolStore",
    "StateError",
    "StoredMessage",
    "decode_headers",
    "encode_headers",
    "validate_endpoint",
    "validate_ids",
    "validate_messages",
    "validate_page",
]

#: Messages per :meth:`SpoolStore.read` page when the caller does not say.
DEFAULT_PAGE = 256


@attrs.frozen
class StoredMessage:
    """One spooled message, as :meth:`SpoolStore.read` returns it."""

    id: int
    """Store-assigned, strictly increasing; the order of delivery."""
    topic: str
    """The topic it was published to."""
    payload: bytes
    """The body, byte for byte."""
    headers: Mapping[str, Any]
    """Application headers, as they came back from JSON (tuples are lists); read-only."""
    persistent: bool
    """Persistent (synced before the publisher's ack) or non-persistent."""
    expires_at: float | None
    """Wall-clock time (``time.time()`` seconds) after which it is stale, or ``None``."""
    published_at: float
    """Wall-clock time of the publish."""


@attrs.frozen
class NewMessage:
    """A message to store, as given to :meth:`SpoolStore.put_many`."""

    topic: str
    """Non-empty topic."""
    payload: bytes
    """The body (``bytes`` only: the store keeps the object, so it must be immutable)."""
    endpoints: Sequence[str]
    """Names of the endpoints that hold a reference; non-empty, no duplicates."""
    headers: Mapping[str, Any] = attrs.field(factory=dict)
    """JSON-serialisable values under ``str`` keys."""
    persistent: bool = True
    """Whether the publisher's ack must wait for the disk (see the store's durability)."""
    expires_at: float | None = None
    """Wall-clock expiry time, or ``None``. Stored, not enforced: TTL is the endpoint's job."""
    published_at: float = attrs.field(factory=time.time)
    """Wall-clock time of the publish."""
    marked: Sequence[str] = ()
    """Endpoints (of ``endpoints``) expected to hand it to a consumer at once.

    A durable store may write their references already marked delivered, in the put's
    own commit, so the :meth:`SpoolStore.mark_delivered` that comes next costs no
    commit (one fsync per message instead of two when one message is in flight).
    Until then, reads in the same open store report it undelivered; after a restart
    it counts as delivered once (``redelivered=True``), whether or not it was. A
    store may ignore it (the memory store does: it has no restart).
    """


class SpoolEntry(NamedTuple):
    """One message an endpoint holds, with its delivery count.

    A tuple rather than an attrs class: ``read`` builds one per message per page, and a
    flow unpacks it (``for message, count in page``) at a fraction of the cost.
    """

    message: StoredMessage
    """The stored message (shared by every endpoint holding it)."""
    delivery_count: int
    """Times :meth:`SpoolStore.mark_delivered` counted it for this endpoint."""

    @property
    def redelivered(self) -> bool:
        """It was handed to a consumer before: deliver it with ``redelivered=True``."""
        return self.delivery_count > 0


@attrs.frozen
class EndpointStats:
    """What one endpoint holds: the figures its quota is checked against."""

    messages: int
    """Messages referenced by the endpoint."""
    bytes: int
    """Sum of their payload sizes (a message held by two endpoints counts for both)."""


@attrs.frozen
class SpoolStatistics:
    """Counters of a store since it was opened."""

    commits: int
    """Transactions committed (a store without transactions counts each mutation)."""
    syncs: int
    """Commits that waited for the disk (fsync); 0 for a store in RAM."""
    records: int
    """Records those commits wrote: one per message stored, per reference acked or
    marked delivered, per endpoint dropped. ``records / commits`` shows group commit."""


class SpoolStore(abc.ABC):
    """Interface of a spool: one stored copy per message, one reference per endpoint.

    Use it as an async context manager (``async with SqliteStore(path) as store``) or
    call :meth:`open` and :meth:`close`. A store is used from one event loop at a time.
    """

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @abc.abstractmethod
    async def open(self) -> None:
        """Make the store usable (a durable store recovers what it held).

        :raises SpoolError: the storage cannot be opened or is not a spool.
        :raises StateError: it is open already.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Finish the commits under way, then release the storage. Idempotent."""

    async def put(
        self,
        topic: str,
        payload: bytes,
        *,
        endpoints: Sequence[str],
        headers: Mapping[str, Any] | None = None,
        persistent: bool = True,
        expires_at: float | None = None,
        published_at: float | None = None,
    ) -> int:
        """Store one message for ``endpoints``; return its id once it is stored.

        ``published_at`` defaults to now. See :meth:`put_many` for what "stored" means.
        """
        message = NewMessage(
            topic,
            payload,
            endpoints,
            {} if headers is None else headers,
            persistent,
            expires_at,
            time.time() if published_at is None else published_at,
        )
        return (await self.put_many((message,)))[0]

    @abc.abstractmethod
    async def put_many(self, messages: Sequence[NewMessage]) -> list[int]:
        """Store ``messages``, each once with one reference per endpoint, atomically.

        Returns their ids, in order, once the whole batch is committed (for a durable
        store, on disk as its durability promises: this is the publisher's ack).
        Concurrent callers share commits (group commit).

        :raises TypeError, ValueError: a message is malformed; nothing was stored.
        :raises SpoolError: the commit failed; nothing was stored.
        """

    @abc.abstractmethod
    async def ack(self, endpoint: str, message_ids: Iterable[int]) -> int:
        """Remove ``endpoint``'s references to ``message_ids``; return how many it held.

        A message is deleted with its last reference. Ids the endpoint does not hold
        are ignored, so acking twice is harmless.
        """

    async def put_and_ack(
        self, messages: Sequence[NewMessage], endpoint: str, message_ids: Iterable[int]
    ) -> list[int]:
        """Store ``messages`` and remove ``endpoint``'s references to ``message_ids`` as
        one change; return the new ids. Moving a message to the dead message queue is
        this: after a crash it is in one queue or the other, never both, never neither.

        This default does :meth:`put_many`, then :meth:`ack`, so a crash between them
        leaves the message in both; a store that commits in transactions should
        override it with one commit.
        """
        ids, _ = validate_put_and_ack(messages, endpoint, message_ids)
        stored = await self.put_many(messages)
        await self.ack(endpoint, ids)
        return stored

    @abc.abstractmethod
    async def mark_delivered(self, endpoint: str, message_ids: Iterable[int]) -> int:
        """Add one to the delivery count of each of ``endpoint``'s ``message_ids``.

        Call it before handing the messages to a consumer: once it has returned, a
        restart delivers them with ``redelivered=True``. Returns how many it held.
        """

    @abc.abstractmethod
    async def read(
        self,
        endpoint: str,
        after_id: int = 0,
        limit: int = DEFAULT_PAGE,
        max_bytes: int | None = None,
    ) -> list[SpoolEntry]:
        """Up to ``limit`` of ``endpoint``'s messages with id > ``after_id``, in id order.

        Page on with ``after_id`` = the last id returned; an empty page means the end.
        With ``max_bytes`` the page also stops at the message that brings its payloads
        to that size (so at least one message comes back): with messages of up to
        30 MB a page bounded by count alone could not be held in RAM.
        """

    async def read_expired(
        self, endpoint: str, after_id: int, now: float, limit: int = DEFAULT_PAGE
    ) -> list[SpoolEntry]:
        """Up to ``limit`` of ``endpoint``'s messages with id > ``after_id`` whose
        ``expires_at`` is at or before ``now``, in id order (the TTL sweep's read).

        Page on as with :meth:`read`. This default pages through :meth:`read` and
        filters, reading every message; a store that can find expired messages
        without that (an index on the expiry time) should override it.
        """
        validate_expired_read(after_id, now, limit)
        found: list[SpoolEntry] = []
        while len(found) < limit:
            page = await self.read(endpoint, after_id, DEFAULT_PAGE)
            if not page:
                break
            after_id = page[-1].message.id
            for entry in page:
                expires = entry.message.expires_at
                if expires is not None and expires <= now:
                    found.append(entry)
        return found[:limit]

    @abc.abstractmethod
    def stats(self, endpoint: str) -> EndpointStats:
        """Messages and payload bytes ``endpoint`` holds (zero for an unknown name)."""

    @abc.abstractmethod
    def endpoints(self) -> list[str]:
        """Names of the endpoints holding at least one message, sorted."""

    @abc.abstractmethod
    async def drop_endpoint(self, endpoint: str) -> int:
        """Remove every reference ``endpoint`` holds (deprovisioning); return how many."""

    @abc.abstractmethod
    def statistics(self) -> SpoolStatistics:
        """Commit counters since :meth:`open`."""

    @abc.abstractmethod
    async def check(self) -> None:
        """Verify the stored data: every refcount, every endpoint figure, every row.

        Reads everything, so it is for tests and operators, not the hot path.

        :raises SpoolError: naming the first inconsistency found.
        """


# -- validation and encoding shared by the stores --------------------------------------
# Checked before anything is queued, so a bad call fails alone and never takes other
# callers' group commit down with it.


_MIN_ID = -(2**63)  # ids travel as SQLite integers: 64-bit signed
_MAX_ID = 2**63 - 1


def _check_text(what: str, text: str) -> None:
    # A lone surrogate cannot be stored as UTF-8: refuse it here rather than fail the
    # whole group commit in the store.
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            raise ValueError(f"{what} {text!r} is not valid Unicode") from None


def validate_endpoint(endpoint: object) -> str:
    """``endpoint`` if it is a non-empty ``str``."""
    if type(endpoint) is not str:
        raise TypeError(f"endpoint name must be a str, not {type(endpoint).__name__}")
    if not endpoint:
        raise ValueError("endpoint name must not be empty")
    _check_text("endpoint name", endpoint)
    return endpoint


def _check_id(message_id: object, what: str = "message id") -> None:
    if type(message_id) is not int:
        raise TypeError(f"{what} must be an int, not {type(message_id).__name__}")
    if not _MIN_ID <= message_id <= _MAX_ID:
        raise ValueError(f"{what} {message_id} is out of range")


def validate_ids(message_ids: Iterable[int]) -> list[int]:
    """``message_ids`` as a list, each an ``int`` in the 64-bit range."""
    if isinstance(message_ids, str | bytes):
        raise TypeError("message_ids must be an iterable of int")
    ids = list(message_ids)
    for message_id in ids:
        _check_id(message_id)
    return ids


def validate_page(after_id: int, limit: int, max_bytes: int | None) -> None:
    """Check the arguments of :meth:`SpoolStore.read`."""
    _check_id(after_id, "after_id")
    if type(limit) is not int:
        raise TypeError(f"limit must be an int, not {type(limit).__name__}")
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    if max_bytes is not None:
        if type(max_bytes) is not int:
            raise TypeError(f"max_bytes must be an int or None, not {type(max_bytes).__name__}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be at least 1, not {max_bytes}")


def validate_put_and_ack(
    messages: Sequence[NewMessage], endpoint: str, message_ids: Iterable[int]
) -> tuple[list[int], list[str]]:
    """Check the arguments of :meth:`SpoolStore.put_and_ack`; return the ids to ack as a
    list and the messages' encoded headers (see :func:`validate_messages`)."""
    validate_endpoint(endpoint)
    ids = validate_ids(message_ids)
    return ids, validate_messages(messages)


def validate_expired_read(after_id: int, now: float, limit: int) -> None:
    """Check the arguments of :meth:`SpoolStore.read_expired`."""
    validate_page(after_id, limit, None)
    _check_time("now", now)


def _check_time(what: str, value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"{what} must be a number of seconds, not {type(value).__name__}")
    if math.isnan(value):  # SQLite would store NaN as NULL
        raise ValueError(f"{what} must not be NaN")


def encode_headers(headers: Mapping[str, Any]) -> str:
    """``headers`` as JSON text (``"{}"`` for none, the common case, without encoding)."""
    if not headers:
        if not isinstance(headers, Mapping):
            raise TypeError(f"headers must be a mapping, not {type(headers).__name__}")
        return "{}"
    if type(headers) is not dict:
        if not isinstance(headers, Mapping):
            raise TypeError(f"headers must be a mapping, not {type(headers).__name__}")
        headers = dict(headers)
    try:
        return orjson.dumps(headers).decode()
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"headers must be JSON-serialisable with str keys: {exc}") from None


def decode_headers(text: str) -> dict[str, Any]:
    """The inverse of :func:`encode_headers` (a fresh dict each time)."""
    if text == "{}":
        return {}
    headers = orjson.loads(text)
    if type(headers) is not dict:
        raise ValueError("headers are not a JSON object")
    return headers


# Endpoint names already found valid: a store sees the same few names over and over.
_valid_endpoints: set[str] = set()
_VALID_ENDPOINTS_KEPT = 4096


def _check_endpoints(endpoints: Sequence[str]) -> None:
    for endpoint in endpoints:
        if type(endpoint) is str and endpoint in _valid_endpoints:
            continue
        validate_endpoint(endpoint)
        if len(_valid_endpoints) < _VALID_ENDPOINTS_KEPT:
            _valid_endpoints.add(endpoint)


def validate_messages(messages: Sequence[NewMessage]) -> list[str]:
    """Check every message; return their headers encoded by :func:`encode_headers`."""
    encoded = []
    for message in messages:
        if type(message) is not NewMessage:
            raise TypeError(f"expected NewMessage, not {type(message).__name__}")
        topic = message.topic
        if type(topic) is not str:
            raise TypeError(f"topic must be a str, not {type(topic).__name__}")
        if not topic:
            raise ValueError("topic must not be empty")
        if not topic.isascii():
            _check_text("topic", topic)
        if type(message.payload) is not bytes:
            raise TypeError(f"payload must be bytes, not {type(message.payload).__name__}")
        endpoints = message.endpoints
        if type(endpoints) is not tuple and (
            isinstance(endpoints, str) or not isinstance(endpoints, Sequence)
        ):
            raise TypeError("endpoints must be a sequence of endpoint names")
        if not endpoints:
            raise ValueError(f"message to {topic!r} has no endpoint to hold it")
        _check_endpoints(endpoints)
        if len(endpoints) > 1 and len(set(endpoints)) != len(endpoints):
            raise ValueError(f"duplicate endpoint in {list(endpoints)!r}")
        marked = message.marked
        if marked:
            if isinstance(marked, str) or not isinstance(marked, Sequence):
                raise TypeError("marked must be a sequence of endpoint names")
            if len(set(marked)) != len(marked) or not set(marked) <= set(endpoints):
                raise ValueError(f"marked {list(marked)!r} must be distinct endpoints it is for")
        expires_at = message.expires_at
        if expires_at is not None and not (type(expires_at) is float and expires_at == expires_at):
            _check_time("expires_at", expires_at)
        published_at = message.published_at
        if not (type(published_at) is float and published_at == published_at):  # NaN != NaN
            _check_time("published_at", published_at)
        encoded.append(encode_headers(message.headers))
    return encoded
