"""A stream partition's log on disk: offsets, commits and queue messages across a restart.

Each "restart" here is a new :class:`StreamLog` on the same folder, as a node that was
killed and started again on its data directory builds one; no Spark is involved.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from meshbus import Message
from meshbus.contrib.spark import OffsetsUnavailableError, StreamLog
from meshbus.contrib.spark._durable import LogFiles, log_directory


def files(tmp_path: Path, window: int = 100) -> LogFiles:
    return LogFiles(log_directory(tmp_path, "queue:orders", 0), "queue:orders", 0, window)


def queue_log(tmp_path: Path, window: int = 100) -> StreamLog:
    return StreamLog("queue:orders", keep_handles=True, files=files(tmp_path, window))


def spooled(spool_id: int) -> Message:
    """A queue message as a flow delivers it: the spool's id is its message id."""
    return Message(f"orders/{spool_id}", f"m{spool_id}".encode(), message_id=spool_id)


def values(batches: list[pa.RecordBatch]) -> list[bytes]:
    return [v for b in batches for v in b.column("value").to_pylist()]


def offsets(batches: list[pa.RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


def test_sealed_segments_and_commits_come_back_after_a_restart(tmp_path: Path) -> None:
    log = StreamLog("events/>", files=files(tmp_path))
    for i in range(5):
        log.append(Message(f"events/{i}", str(i).encode()))
    assert log.seal() == 5
    log.register("reports", "earliest")
    log.commit("reports", 2)
    log.append(Message("events/late", b"not sealed"))  # never offered to Spark

    again = StreamLog("events/>", files=files(tmp_path))
    assert again.earliest == 0  # the first segment holds offsets 2..4 still
    assert again.next_offset == 5
    assert again.consumers == {"reports": 2}
    assert values(again.read(2, 5)) == [b"2", b"3", b"4"]
    assert again.read(2, 5)[0].schema == log.read(2, 5)[0].schema
    again.append(Message("events/5", b"5"))
    assert again.seal() == 6  # numbering continues; nothing is reused
    assert offsets(again.read(5, 6)) == [5]


def test_a_released_segment_is_deleted_and_stays_released(tmp_path: Path) -> None:
    log = StreamLog("events/>", files=files(tmp_path))
    log.register("c", "earliest")
    for i in range(3):
        log.append(Message("events/x", str(i).encode()))
    log.seal()
    log.append(Message("events/x", b"3"))
    log.seal()
    log.commit("c", 3)
    folder = log_directory(tmp_path, "queue:orders", 0)
    assert sorted(p.name for p in folder.glob("*.arrow")) == [f"{3:020d}.arrow"]

    again = StreamLog("events/>", files=files(tmp_path))
    assert again.earliest == 3
    with pytest.raises(OffsetsUnavailableError):
        again.read(0, 4)
    assert values(again.read(3, 4)) == [b"3"]


def test_queue_messages_delivered_again_keep_their_offsets(tmp_path: Path) -> None:
    log = queue_log(tmp_path)
    log.register("c", "earliest")
    for spool_id in (11, 12, 13, 14):
        log.append(spooled(spool_id))
    assert log.seal() == 4
    log.commit("c", 2)
    assert [m.message_id for m in log.take_releasable()] == [11, 12]
    # Killed here: 11 and 12 were acknowledged in the log's eyes, but the spool may
    # not have committed it; all four come again, then a new one.
    again = queue_log(tmp_path)
    for spool_id in (11, 12, 13, 14, 15):
        again.append(spooled(spool_id))
    assert again.next_offset == 5  # only 15 is new
    assert [m.message_id for m in again.take_releasable()] == [11, 12]  # acked, not renumbered
    assert again.unacknowledged == 3
    assert again.seal() == 5
    assert values(again.read(2, 5)) == [b"m13", b"m14", b"m15"]
    again.commit("c", 5)
    assert [m.message_id for m in again.take_releasable()] == [13, 14, 15]


def test_the_spool_ids_of_a_queue_segment_stay_out_of_what_readers_see(tmp_path: Path) -> None:
    log = queue_log(tmp_path)
    log.append(spooled(7))
    log.seal()
    again = queue_log(tmp_path)
    (batch,) = again.read(0, 1)
    assert "spoolId" not in batch.schema.names
    assert batch.schema == log.read(0, 1)[0].schema


def test_a_gap_after_the_last_segment_is_not_numbered_again(tmp_path: Path) -> None:
    log = queue_log(tmp_path)
    log.append(spooled(1))
    log.seal()
    log.advance_to(10)  # Spark committed [1, 10) though the log could not hold it
    again = queue_log(tmp_path)
    again.append(spooled(2))
    assert again.seal() == 11
    assert offsets(again.read(10, 11)) == [10]


def test_only_a_window_of_released_ids_is_remembered(tmp_path: Path) -> None:
    log = queue_log(tmp_path, window=2)
    log.register("c", "earliest")
    for spool_id in range(1, 6):
        log.append(spooled(spool_id))
    log.seal()
    log.commit("c", 5)
    log.take_releasable()
    again = queue_log(tmp_path, window=2)
    for spool_id in (4, 5):  # within the window: acknowledged at once
        again.append(spooled(spool_id))
    assert [m.message_id for m in again.take_releasable()] == [4, 5]
    assert again.next_offset == 5


def test_a_log_without_files_starts_empty_every_time() -> None:
    log = StreamLog("events/>")
    log.append(Message("events/1", b"1"))
    assert log.seal() == 1
    assert StreamLog("events/>").next_offset == 0
