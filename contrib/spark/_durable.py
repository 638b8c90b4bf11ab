"""A stream partition's log on disk, so that its offsets survive a node restart.

With a data directory, each partition of a stream keeps its sealed segments and its
consumers' positions in a folder of its own under ``<data_dir>/spark/``:

- ``<first offset>.arrow``: one sealed segment, an Arrow IPC file written once (to a
  temporary name, flushed to disk, then renamed), read back memory-mapped. A queue
  stream's segment has one more column, ``spoolId``: the spool's id of each message,
  which is how a message the queue delivers again after a restart is recognised as
  one the log has numbered already.
- ``state.json``: each consumer's committed position, the first offset retained, and
  the spool ids released most recently (see :class:`Restored`), replaced atomically.
- ``stream.json``: which stream and partition the folder holds, for people.

Offsets are never reused: a restarted log continues after the last segment it had,
and messages it had not sealed yet were never offered to Spark.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from pathlib import Path
from typing import Any

import attrs
import orjson
import pyarrow as pa

from meshbus import write_json_atomically

__all__ = ["LogFiles", "Restored", "log_directory"]

_SPOOL_ID = "spoolId"


def log_directory(data_dir: Path, stream_id: str, partition: int) -> Path:
    """Where the log of one partition of ``stream_id`` lives (a name safe on any file
    system, whatever characters the stream's filters have)."""
    digest = hashlib.sha256(stream_id.encode()).hexdigest()[:20]
    return data_dir / "spark" / digest / str(partition)


@attrs.define
class Restored:
    """What a log folder held: segments in order, positions, recent spool ids."""

    segments: list[tuple[int, pa.RecordBatch]] = attrs.Factory(list)
    #: Spool id → offset of each message in the retained segments (queue streams).
    numbered: dict[int, int] = attrs.Factory(dict)
    consumers: dict[str, int] = attrs.Factory(dict)
    base: int = 0
    next_offset: int = 0
    #: Spool ids of messages released (every consumer committed them) most recently:
    #: their acknowledgement may not have reached the spool before a crash, so the
    #: queue may deliver them again, and they must then be acknowledged, not numbered.
    released: deque[int] = attrs.Factory(deque)


class LogFiles:
    """The files of one partition's log.

    :param directory: its folder (created if missing).
    :param stream_id: the stream's id, recorded in ``stream.json``.
    :param keep_released: how many released spool ids to remember (the queue window:
        no more messages than that can be unacknowledged at once).
    """

    def __init__(self, directory: Path, stream_id: str, partition: int, keep_released: int) -> None:
        self.directory = directory
        self.keep_released = keep_released
        directory.mkdir(parents=True, exist_ok=True)
        label = directory / "stream.json"
        if not label.exists():
            write_json_atomically(label, {"stream": stream_id, "partition": partition})

    def _segment(self, start: int) -> Path:
        return self.directory / f"{start:020d}.arrow"

    def load(self) -> Restored:
        """Read the folder back (memory-mapped segments)."""
        restored = Restored()
        state_file = self.directory / "state.json"
        if state_file.exists():
            state = orjson.loads(state_file.read_bytes())
            restored.consumers = {str(k): int(v) for k, v in state.get("consumers", {}).items()}
            restored.base = int(state.get("base", 0))
            restored.next_offset = int(state.get("next", 0))
            restored.released = deque(
                (int(i) for i in state.get("released", [])), maxlen=self.keep_released
            )
        else:
            restored.released = deque(maxlen=self.keep_released)
        for path in sorted(self.directory.glob("*.arrow")):
            start = int(path.stem)
            batch = _read_segment(path)
            end = start + batch.num_rows
            if end <= restored.base:  # released before the crash, not yet deleted
                path.unlink(missing_ok=True)
                continue
            if _SPOOL_ID in batch.schema.names:
                ids = batch.column(_SPOOL_ID).to_pylist()
                restored.numbered.update((i, start + n) for n, i in enumerate(ids))
                batch = batch.drop_columns([_SPOOL_ID])
            restored.segments.append((start, batch))
            restored.next_offset = max(restored.next_offset, end)
        if restored.segments:
            restored.base = max(restored.base, restored.segments[0][0])
        restored.next_offset = max(restored.next_offset, restored.base)
        return restored

    def write_segment(self, start: int, batch: pa.RecordBatch, spool_ids: list[int] | None) -> None:
        """Store a sealed segment; it is on disk when this returns."""
        if spool_ids is not None:
            batch = batch.append_column(_SPOOL_ID, pa.array(spool_ids, pa.int64()))
        final = self._segment(start)
        partial = final.with_suffix(".partial")
        with pa.OSFile(str(partial), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
            writer.write_batch(batch)
        with open(partial, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(partial, final)

    def save_state(
        self, consumers: dict[str, int], base: int, next_offset: int, released: deque[int]
    ) -> None:
        """Record the consumers' positions, the first retained offset, the next offset
        (which a gap may have moved past the last segment) and recent releases."""
        write_json_atomically(
            self.directory / "state.json",
            {
                "consumers": consumers,
                "base": base,
                "next": next_offset,
                "released": list(released),
            },
        )

    def drop(self, start: int) -> None:
        """Delete the segment that starts at ``start`` (released or dropped)."""
        self._segment(start).unlink(missing_ok=True)


def _read_segment(path: Path) -> pa.RecordBatch:
    reader = pa.ipc.open_file(pa.memory_map(str(path)))
    batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
    if len(batches) != 1:
        raise ValueError(f"{path}: not a meshbus Spark log segment (one batch expected)")
    return batches[0]


def ids_in(handles: Any, start: int, end: int) -> list[int]:
    """The spool ids of the kept messages numbered ``[start, end)``."""
    return [m.message_id for offset, m in handles if start <= offset < end]
