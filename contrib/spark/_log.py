"""One stream's messages, numbered for Spark: the offsets a query checkpoints.

A :class:`StreamLog` is filled by the bridge's capture (in the node's event loop) and
read by the control server's threads, so every method is thread-safe. New messages
go to a tail list, one ``append`` each; the tail becomes an Arrow record batch (a
sealed segment) only when a reader asks how far the log goes, so a batch is built
once per message and is as large as the traffic between two triggers allows.

Retention is per consumer: a segment is released once every consumer registered on
the stream has committed past it. A stream fed by a queue also hands back, at that
point, the queue messages to acknowledge; a stream fed by subscriptions is further
bounded by ``max_bytes`` and drops its oldest segments (counted) when over it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ._columns import CREATE_TIME, FIELDS, LOG_APPEND_TIME, captured_to_batch
from ._durable import ids_in
from ._errors import OffsetsUnavailableError

if TYPE_CHECKING:
    from meshbus import Message

    from ._durable import LogFiles

__all__ = ["Sealer", "StreamLog"]

#: A tail this long is sealed by the appender, bounding the Python objects it holds.
SEAL_ROWS = 65_536


class StreamLog:
    """The offset-numbered messages of one partition of a stream.

    :param name: the stream's id, as it appears in checkpointed offsets.
    :param partition: which partition of the stream it holds (the ``partition`` column).
    :param keep_handles: keep each message to acknowledge it later (queue streams).
    :param max_bytes: for streams without handles, the most Arrow bytes retained.
    :param clock: what stamps a message that arrives without a timestamp.
    :param files: where the log is kept on disk (with a data directory): it starts from
        what they hold, and every segment and commit goes there.
    """

    def __init__(
        self,
        name: str,
        *,
        partition: int = 0,
        keep_handles: bool = False,
        max_bytes: int = 256 << 20,
        sealer: Sealer | None = None,
        clock: Callable[[], float] = time.time,
        files: LogFiles | None = None,
    ):
        self.name = name
        self.partition = partition
        self._clock = clock
        self._sealer = sealer
        self.keep_handles = keep_handles
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._seal_lock = threading.RLock()  # read() holds it while it seals
        self._segments: deque[tuple[int, pa.RecordBatch]] = deque()
        # The captured messages not yet sealed, FIELDS entries each (see append()). One
        # extend per message and the sealer's slice copy and slice delete are each
        # atomic, so a stream without handles appends without taking the lock.
        self._tail: list[Any] = []
        self._base = 0  # first retained offset
        self._tail_start = 0  # offset of _tail[0] (= next offset when the tail is empty)
        self._handles: deque[tuple[int, Message]] = deque()
        self._release_floor = 0
        self.consumers: dict[str, int] = {}
        self.served = False
        self.retained_bytes = 0
        self.captured = 0
        self.dropped = 0
        self._files = files
        #: Queue messages numbered before a restart, by spool id (see _durable.Restored).
        self._numbered: dict[int, int] = {}
        self._released: deque[int] = deque()
        self._released_set: set[int] = set()
        if files is not None:
            self._restore(files)

    def _restore(self, files: LogFiles) -> None:
        restored = files.load()
        self._segments = deque(restored.segments)
        self.retained_bytes = sum(batch.nbytes for _, batch in restored.segments)
        self._base = restored.base
        self._release_floor = max(min(restored.consumers.values(), default=0), restored.base)
        self._tail_start = restored.next_offset
        self.consumers = restored.consumers
        self._numbered = restored.numbered
        self._released = restored.released
        self._released_set = set(restored.released)
        # Offsets handed out before the restart keep their meaning: never renumber.
        self.served = restored.next_offset > 0

    def __repr__(self) -> str:
        where = f"{self.name!r}/{self.partition}"
        return f"<StreamLog {where} [{self._base}, {self.next_offset})>"

    # --- writing (the node's event loop) ---------------------------------------------

    def append(self, message: Message) -> None:
        """Add one message at the next offset (called from one thread: the node's loop)."""
        tail = self._tail
        # The FIELDS entries of the message, in one extend: atomic for the sealer's
        # thread, which so sees whole messages only. The last is the timestampType of
        # the row: the publisher's stamp, or one made here.
        stamp = message.timestamp
        if stamp is None:
            entry = (
                message.topic,
                message.payload,
                self._clock(),
                message.options,
                LOG_APPEND_TIME,
            )
        else:
            entry = (message.topic, message.payload, stamp, message.options, CREATE_TIME)
        if self.keep_handles:
            with self._lock:  # the handle's offset must agree with the tail's numbering
                if self._numbered or self._released_set:
                    known = self._known(message)
                    if known is not None:  # delivered again after a restart: numbered
                        self._handles.append((known, message))
                        return
                self._handles.append((self._tail_start + len(tail) // FIELDS, message))
                tail.extend(entry)
        else:
            tail.extend(entry)
        self.captured += 1
        if len(tail) == SEAL_ROWS * FIELDS:
            if self._sealer is not None:
                self._sealer.request(self)  # off the publisher's path
            else:
                self.seal()

    def _known(self, message: Message) -> int | None:
        """The offset a message delivered again after a restart had (-1: released, to be
        acknowledged at once), or ``None`` for a message the log has not seen."""
        spool_id = message.message_id
        offset = self._numbered.pop(spool_id, None) if spool_id is not None else None
        if offset is None and spool_id in self._released_set:
            return -1
        return offset

    # --- positions ----------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        """The offset the next message will get."""
        with self._lock:
            return self._tail_start + len(self._tail) // FIELDS

    @property
    def unacknowledged(self) -> int:
        """Kept messages not yet released for acknowledgement."""
        with self._lock:
            return len(self._handles)

    @property
    def earliest(self) -> int:
        """The first offset still retained."""
        with self._lock:
            return self._base

    def seal(self) -> int:
        """Turn the tail into a segment; return the next offset (all below it readable)."""
        with self._seal_lock:
            with self._lock:
                # Exactly the messages there now; later appends stay for the next seal.
                taken = len(self._tail)
                tail = self._tail[:taken]
                del self._tail[:taken]
                rows = taken // FIELDS
                start = self._tail_start
                self._tail_start += rows
            if rows:
                batch = captured_to_batch(tail, start, self.partition)
                if self._files is not None:  # on disk before any reader learns its offsets
                    with self._lock:
                        handles = list(self._handles) if self.keep_handles else None
                    ids = ids_in(handles, start, start + rows) if handles is not None else None
                    self._files.write_segment(start, batch, ids)
                with self._lock:
                    self._segments.append((start, batch))
                    self.retained_bytes += batch.nbytes
                    self._enforce_size()
            return start + rows

    def advance_to(self, offset: int) -> None:
        """Number the next message ``offset`` or later (a gap; nothing is renumbered).

        A read promised rows ``[start, offset)`` that the log cannot hold any more
        (after a restart: direct messages are gone, queue messages expired). Spark
        commits the whole range anyway, so messages captured later must not take
        offsets inside it, where no query would ever read them.
        """
        with self._seal_lock:
            self.seal()
            with self._lock:
                if self._tail_start < offset:
                    self._tail_start = offset
                    if not self._segments:
                        self._base = offset
                    self.served = True
                    if self._files is not None:
                        self._save()

    def adopt(self, offset: int) -> None:
        """Renumber a log nothing was read from yet so that it starts at ``offset``.

        After the app restarts, a query resumes from offsets its checkpoint holds,
        which a new log would otherwise number again from 0: the messages captured
        since (for a queue, the ones it redelivers first) take the offsets the query
        expects next. A log that has answered any reader is left as it is.
        """
        with self._seal_lock, self._lock:
            if self.served or offset <= self._base:
                return
            shift = offset - self._base
            segments: deque[tuple[int, Any]] = deque()
            for start, batch in self._segments:
                numbers = pa.array(range(start + shift, start + shift + batch.num_rows), pa.int64())
                segments.append((start + shift, batch.set_column(4, "offset", numbers)))
            self._segments = segments
            self._handles = deque((o + shift, m) for o, m in self._handles)
            self._base += shift
            self._tail_start += shift
            self._release_floor += shift
            self.consumers = {c: p + shift for c, p in self.consumers.items()}

    # --- consumers ----------------------------------------------------------------------

    def bounds(
        self, consumer: str, starting: str | int, *, fail_on_data_loss: bool = False
    ) -> tuple[int, int]:
        """Seal, and return ``(start, end)``: what a read of ``consumer`` starting at
        ``starting`` would cover now. ``starting`` is ``earliest``, ``latest``,
        ``committed``, an offset, -2 (earliest) or -1 (latest), or ``"@MS"`` for the
        first message published at or after ``MS`` milliseconds since the epoch.

        :raises OffsetsUnavailableError: ``fail_on_data_loss`` and the offset asked for
            was released already.
        """
        end = self.seal()
        at_time = isinstance(starting, str) and starting.startswith("@")
        start = self.offset_at_time(int(str(starting)[1:])) if at_time else None
        with self._lock:
            self.served = True
            base = self._base
            if start is not None:
                return start, end
            if starting in ("latest", -1):
                return end, end
            if starting in ("earliest", -2):
                return base, end
            if starting == "committed":
                committed = self.consumers.get(consumer)
                return (max(committed, base) if committed is not None else base), end
            assert isinstance(starting, int)
            if starting < base and fail_on_data_loss:
                raise OffsetsUnavailableError(
                    f"stream {self.name!r} partition {self.partition}: offset {starting} was "
                    f"released (earliest retained is {base}); set failOnDataLoss=false to "
                    "start from there instead"
                )
            return min(max(starting, base), end), end

    def offset_at_time(self, millis: int) -> int:
        """The first offset whose ``timestamp`` is at or after ``millis`` (ms since the
        epoch), or the next offset when none is."""
        wanted = pa.scalar(millis * 1000, pa.timestamp("us", tz="UTC"))
        with self._lock:
            segments = list(self._segments)
            end = self._tail_start
        for start, batch in segments:
            later = pc.greater_equal(batch.column("timestamp"), wanted)
            index = pc.index(later, True).as_py()
            if index >= 0:
                return start + int(index)
        return end

    def register(self, consumer: str, starting: str | int, **checks: bool) -> int:
        """Register ``consumer`` (idempotent) and return where a new query of it starts."""
        start, _ = self.bounds(consumer, starting, **checks)
        with self._lock:
            known = self.consumers.get(consumer)
            self.consumers[consumer] = start if known is None else min(known, start)
            return start

    def touch(self, consumer: str, position: int) -> None:
        """Keep data from ``position`` for a consumer seen again (after a restart)."""
        with self._lock:
            if consumer not in self.consumers:
                self.consumers[consumer] = max(position, self._base)

    def commit(self, consumer: str, next_offset: int) -> None:
        """``consumer`` has everything below ``next_offset``; release what all have."""
        with self._lock:
            known = self.consumers.get(consumer)
            if known is not None and next_offset <= known:
                return
            self.consumers[consumer] = next_offset
            floor = min(self.consumers.values())
            dropped: list[int] = []
            if floor > self._release_floor:
                self._release_floor = floor
                self._remember_released(floor)
                while self._segments:
                    start, batch = self._segments[0]
                    if start + batch.num_rows > floor:
                        break
                    self._segments.popleft()
                    dropped.append(start)
                    self.retained_bytes -= batch.nbytes
                    self._base = start + batch.num_rows
            if self._files is not None:
                self._save()
        if self._files is not None:
            for start in dropped:
                self._files.drop(start)

    def _remember_released(self, floor: int) -> None:
        """Keep the spool ids of the messages released below ``floor`` (lock held)."""
        if not self._files or not self.keep_handles:
            return
        for offset, message in self._handles:
            if offset >= floor:
                break
            if message.message_id is not None and offset >= 0:
                if len(self._released) == self._released.maxlen:
                    self._released_set.discard(self._released[0])
                self._released.append(message.message_id)
                self._released_set.add(message.message_id)

    def _save(self) -> None:
        assert self._files is not None
        next_offset = self._tail_start  # sealed or promised: offsets Spark may know
        self._files.save_state(dict(self.consumers), self._base, next_offset, self._released)

    def forget(self, consumer: str) -> bool:
        """Stop retaining for ``consumer``; return whether it was registered."""
        with self._lock:
            return self.consumers.pop(consumer, None) is not None

    def take_releasable(self) -> list[Message]:
        """The kept messages every consumer has committed (to acknowledge now)."""
        with self._lock:
            released: list[Message] = []
            while self._handles and self._handles[0][0] < self._release_floor:
                released.append(self._handles.popleft()[1])
            return released

    def _enforce_size(self) -> None:
        if self.keep_handles:
            return  # a queue's window bounds it; never drop what is not acknowledged
        while self.retained_bytes > self.max_bytes and len(self._segments) > 1:
            start, batch = self._segments.popleft()
            self.retained_bytes -= batch.nbytes
            self.dropped += batch.num_rows
            self._base = start + batch.num_rows
            if self._files is not None:
                self._files.drop(start)

    # --- reading (control server threads) --------------------------------------------

    def mark_served(self) -> None:
        with self._lock:
            self.served = True

    def read(self, start: int, end: int) -> list[pa.RecordBatch]:
        """The rows ``[start, end)`` as zero-copy slices of sealed segments.

        :raises OffsetsUnavailableError: ``start`` was released already.
        """
        # Holding the seal lock: a seal under way elsewhere has moved the tail's start
        # but not yet appended its segment, and rows in that gap must not go missing.
        with self._seal_lock:
            if end > self._sealed_end():
                self.seal()
            return self._slices(start, end)

    def _slices(self, start: int, end: int) -> list[pa.RecordBatch]:
        with self._lock:
            self.served = True
            if start < self._base:
                raise OffsetsUnavailableError(
                    f"stream {self.name!r}: offsets from {start} were released "
                    f"(earliest retained is {self._base}; dropped by the size limit: "
                    f"{self.dropped})"
                )
            pieces = []
            for seg_start, batch in self._segments:
                seg_end = seg_start + batch.num_rows
                if seg_end <= start:
                    continue
                if seg_start >= end:
                    break
                lo = max(start, seg_start) - seg_start
                hi = min(end, seg_end) - seg_start
                pieces.append(batch.slice(lo, hi - lo))
            return pieces

    def _sealed_end(self) -> int:
        with self._lock:
            return self._tail_start

    def statistics(self) -> dict[str, Any]:
        """A snapshot: positions, retained size and per-consumer commits."""
        with self._lock:
            return {
                "stream": self.name,
                "partition": self.partition,
                "earliest": self._base,
                "next": self._tail_start + len(self._tail) // FIELDS,
                "captured": self.captured,
                "retained_bytes": self.retained_bytes,
                "dropped": self.dropped,
                "unacknowledged": len(self._handles),
                "consumers": dict(self.consumers),
            }


class Sealer:
    """A thread that seals logs whose tail filled up, so publishers never wait for it."""

    def __init__(self) -> None:
        self._wanted: set[StreamLog] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="meshbus-spark-sealer", daemon=True)
        self._thread.start()

    def request(self, log: StreamLog) -> None:
        with self._lock:
            self._wanted.add(log)
        self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                wanted, self._wanted = self._wanted, set()
            for log in wanted:
                log.seal()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout=5)
