"""StreamLog: offsets, sealed segments, per-consumer retention and queue handles."""

from __future__ import annotations

import gc
import sys
import threading
from typing import Any

import pyarrow as pa
import pytest

from meshbus import Message
from meshbus.contrib.spark import OffsetsUnavailableError, StreamLog
from meshbus.contrib.spark import _log as log_module
from meshbus.contrib.spark._columns import captured_to_batch, messages_to_batch


def msg(i: int) -> Message:
    return Message(f"t/{i}", str(i).encode())


def fill(log: StreamLog, start: int, stop: int) -> None:
    for i in range(start, stop):
        log.append(msg(i))


def offsets(batches: list[pa.RecordBatch]) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


def payloads(batches: list[pa.RecordBatch]) -> list[bytes]:
    return [v for b in batches for v in b.column("value").to_pylist()]


def segmented(
    sizes: list[int], *, keep_handles: bool = False, max_bytes: int = 256 << 20
) -> StreamLog:
    """A log whose segments hold ``sizes`` rows each, offsets from 0."""
    log = StreamLog("s", keep_handles=keep_handles, max_bytes=max_bytes)
    n = 0
    for size in sizes:
        fill(log, n, n + size)
        n += size
        assert log.seal() == n
    return log


def test_append_counts_and_seal_returns_the_next_offset() -> None:
    log = StreamLog("s")
    assert (log.next_offset, log.earliest, log.seal()) == (0, 0, 0)
    fill(log, 0, 3)
    assert log.next_offset == 3
    assert log.captured == 3
    assert log.seal() == 3
    assert log.seal() == 3  # nothing new: an empty seal changes nothing
    fill(log, 3, 5)
    assert log.next_offset == 5
    assert log.earliest == 0
    stats = log.statistics()
    assert (stats["next"], stats["earliest"], stats["captured"]) == (5, 0, 5)


def test_read_gives_exact_slices_across_segments() -> None:
    log = segmented([3, 4, 2, 5])  # segments [0,3) [3,7) [7,9) [9,14)
    for start, end in [(0, 14), (0, 3), (2, 4), (3, 7), (5, 12), (8, 9), (13, 14), (6, 6)]:
        batches = log.read(start, end)
        assert offsets(batches) == list(range(start, end)), (start, end)
        assert payloads(batches) == [str(i).encode() for i in range(start, end)]
        assert all(b.schema == batches[0].schema for b in batches)


def test_read_seals_the_tail_it_needs() -> None:
    log = segmented([2])
    fill(log, 2, 5)  # still in the tail
    assert offsets(log.read(1, 5)) == [1, 2, 3, 4]
    assert log.statistics()["next"] == 5


def test_reading_below_earliest_raises() -> None:
    log = segmented([2, 2, 2])
    log.commit("a", 4)
    assert log.earliest == 4
    with pytest.raises(OffsetsUnavailableError, match="earliest retained is 4"):
        log.read(3, 6)
    assert offsets(log.read(4, 6)) == [4, 5]


def test_commit_releases_only_below_the_slowest_consumer() -> None:
    log = segmented([2, 2, 2])  # [0,2) [2,4) [4,6)
    assert log.register("a", "earliest") == 0
    assert log.register("b", "earliest") == 0
    log.commit("a", 6)
    assert log.earliest == 0  # b still needs everything
    log.commit("b", 3)
    assert log.earliest == 2  # [2,4) holds offset 3, which b has not committed
    log.commit("b", 2)  # going back changes nothing
    assert log.earliest == 2
    log.commit("b", 6)
    assert log.earliest == 6
    assert log.read(6, 6) == []
    assert log.statistics()["consumers"] == {"a": 6, "b": 6}


def test_retained_bytes_follow_segments() -> None:
    log = segmented([3, 3])
    both = log.retained_bytes
    log.commit("a", 3)
    assert both > log.retained_bytes > 0
    log.commit("a", 6)
    assert log.retained_bytes == 0


def test_take_releasable_returns_kept_messages_below_the_floor_in_order() -> None:
    log = StreamLog("queue:q", keep_handles=True)
    messages = [msg(i) for i in range(6)]
    for m in messages:
        log.append(m)
    log.seal()
    assert log.take_releasable() == []
    log.register("a", "earliest")
    log.register("b", "earliest")
    log.commit("a", 5)
    assert log.take_releasable() == []
    log.commit("b", 3)
    released = log.take_releasable()
    assert [m.topic for m in released] == ["t/0", "t/1", "t/2"]
    assert all(r is m for r, m in zip(released, messages, strict=False))
    assert log.take_releasable() == []  # each handed over once
    assert log.statistics()["unacknowledged"] == 3
    log.commit("b", 6)
    assert log.take_releasable() == messages[3:5]  # a has only 5
    log.commit("a", 6)
    assert log.take_releasable() == messages[5:]
    assert log.statistics()["unacknowledged"] == 0


def test_a_log_without_handles_keeps_none() -> None:
    log = segmented([3])
    log.commit("a", 3)
    assert log.take_releasable() == []
    assert log.statistics()["unacknowledged"] == 0


def one_segment_bytes(rows: int) -> int:
    return messages_to_batch([msg(i) for i in range(rows)], 0).nbytes


def test_max_bytes_drops_the_oldest_segments_and_counts_them() -> None:
    size = one_segment_bytes(4)
    log = segmented([4, 4, 4, 4], max_bytes=size * 2 + size // 2)
    assert log.earliest == 8
    assert log.dropped == 8
    assert log.statistics()["dropped"] == 8
    with pytest.raises(OffsetsUnavailableError, match="dropped by the size limit: 8"):
        log.read(0, 16)
    assert offsets(log.read(8, 16)) == list(range(8, 16))


def test_max_bytes_keeps_the_newest_segment_even_when_it_alone_is_too_big() -> None:
    log = segmented([4, 4], max_bytes=1)
    assert (log.earliest, log.dropped) == (4, 4)
    assert offsets(log.read(4, 8)) == [4, 5, 6, 7]


def test_max_bytes_never_drops_what_a_queue_stream_has_not_acknowledged() -> None:
    log = segmented([4, 4, 4], keep_handles=True, max_bytes=1)
    assert (log.earliest, log.dropped) == (0, 0)
    assert offsets(log.read(0, 12)) == list(range(12))


def test_register_earliest_latest_and_committed() -> None:
    log = segmented([2, 2])
    fill(log, 4, 6)  # the tail counts as available for "latest"
    assert log.register("e", "earliest") == 0
    assert log.register("l", "latest") == 6
    assert log.register("c", "committed") == 0  # never committed: from the earliest
    log.commit("c", 3)
    log.commit("e", 5)
    log.commit("l", 6)
    assert log.register("c", "committed") == 3
    assert log.register("e", "committed") == 5
    assert log.register("new", "committed") == 2  # earliest retained after the commits
    assert log.served


def test_register_is_idempotent_and_never_moves_a_consumer_forward() -> None:
    log = segmented([3])
    assert log.register("a", "earliest") == 0
    assert log.register("a", "latest") == 3
    assert log.consumers["a"] == 0  # still retains what it may read
    assert log.forget("a") is True
    assert log.forget("a") is False


def test_adopt_renumbers_an_unserved_log() -> None:
    log = StreamLog("queue:q", keep_handles=True)
    messages = [msg(i) for i in range(5)]
    for m in messages[:3]:
        log.append(m)
    log.seal()
    for m in messages[3:]:
        log.append(m)  # two in the tail
    log.adopt(100)
    assert (log.earliest, log.next_offset) == (100, 105)
    batches = log.read(100, 105)
    assert offsets(batches) == [100, 101, 102, 103, 104]
    assert payloads(batches) == [b"0", b"1", b"2", b"3", b"4"]
    with pytest.raises(OffsetsUnavailableError):
        log.read(0, 5)
    log.commit("a", 102)
    assert log.take_releasable() == messages[:2]  # handles were renumbered too
    log.commit("a", 105)
    assert log.take_releasable() == messages[2:]


def test_adopt_does_nothing_once_served_or_backwards() -> None:
    log = segmented([3])
    log.adopt(2)
    log.adopt(1)  # below the base now: ignored
    assert (log.earliest, log.next_offset) == (2, 5)
    assert offsets(log.read(2, 5)) == [2, 3, 4]  # read marks it served
    log.adopt(50)
    assert (log.earliest, log.next_offset) == (2, 5)
    fresh = segmented([1])
    fresh.register("a", "earliest")
    fresh.adopt(10)
    assert fresh.earliest == 0


def test_adopt_shifts_registered_consumers() -> None:
    log = segmented([2])
    log.touch("a", 1)
    log.adopt(10)
    assert log.consumers == {"a": 11}


def test_touch_registers_an_unknown_consumer_only() -> None:
    log = segmented([4])
    log.commit("a", 2)  # earliest stays 0: the segment [0,4) is not fully committed
    log.touch("a", 0)
    log.touch("b", 1)
    assert log.consumers == {"a": 2, "b": 1}


def test_a_full_tail_is_sealed_by_the_appender(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "SEAL_ROWS", 4)
    log = StreamLog("s", max_bytes=1)  # every sealed segment but the newest is dropped
    fill(log, 0, 9)
    # Two segments were sealed by append ([0,4) then [4,8)); the first was dropped.
    assert (log.earliest, log.dropped) == (4, 4)
    assert log.statistics()["next"] == 9
    assert offsets(log.read(4, 8)) == [4, 5, 6, 7]


def test_appends_and_concurrent_seals_and_reads_lose_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log_module, "SEAL_ROWS", 7)
    log = StreamLog("s")
    total = 3000
    seen: list[int] = []
    done = threading.Event()

    def append_all() -> None:
        try:
            fill(log, 0, total)
        finally:
            done.set()

    writer = threading.Thread(target=append_all)
    writer.start()
    position = 0
    while True:
        finished = done.is_set()
        end = log.seal()
        seen += offsets(log.read(position, end))
        position = end
        if finished:  # the last seal took everything appended
            break
    writer.join(10)
    assert seen == list(range(total))
    assert log.captured == total


def test_a_read_waits_for_a_seal_in_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    building = threading.Event()
    release = threading.Event()

    def slow_batch(flat: list[Any], first: int, partition: int = 0) -> pa.RecordBatch:
        building.set()
        release.wait(5)
        return captured_to_batch(flat, first, partition)

    log = StreamLog("s")
    fill(log, 0, 3)
    monkeypatch.setattr(log_module, "captured_to_batch", slow_batch)
    sealer = threading.Thread(target=log.seal)
    sealer.start()
    assert building.wait(5)
    result: list[list[pa.RecordBatch]] = []
    reader = threading.Thread(target=lambda: result.append(log.read(0, 3)))
    reader.start()
    reader.join(0.2)
    release.set()
    reader.join(5)
    sealer.join(5)
    assert offsets(result[0]) == [0, 1, 2]


def test_messages_without_timestamp_are_stamped_when_captured() -> None:
    now = [100.0]
    log = StreamLog("s", clock=lambda: now[0])
    log.append(Message("t", b"a"))
    now[0] = 101.0
    log.append(Message("t", b"b", timestamp=50.0))
    log.append(Message("t", b"c"))
    now[0] = 200.0  # sealing later does not move the capture times
    (batch,) = log.read(0, 3)
    assert batch.column("timestamp").cast(pa.int64()).to_pylist() == [
        100_000_000,
        50_000_000,
        101_000_000,
    ]
    assert batch.column("timestampType").to_pylist() == [1, 0, 1]


def test_the_log_keeps_no_message_objects_of_a_subscription_stream() -> None:
    # Messages go when their publish returns; the garbage collector has nothing to scan.
    log = StreamLog("s")
    message = Message("t/1", b"x", timestamp=1.0)
    log.append(message)
    log.append(Message("t/2", b"y"))
    assert sys.getrefcount(message) == 2  # the local name and getrefcount's argument
    assert not any(gc.is_tracked(entry) for entry in log._tail[:3] + log._tail[4:8])
    assert payloads(log.read(0, 2)) == [b"x", b"y"]


def test_advance_to_leaves_a_gap_that_later_messages_skip() -> None:
    log = StreamLog("s")
    fill(log, 0, 3)
    log.advance_to(10)  # a read promised [0, 10) but only 3 rows exist
    fill(log, 3, 5)
    assert log.next_offset == 12
    assert offsets(log.read(10, 12)) == [10, 11]
    assert payloads(log.read(0, 12)) == [b"0", b"1", b"2", b"3", b"4"]
    log.advance_to(5)  # never moves backwards
    assert log.next_offset == 12


def test_a_full_tail_is_sealed_by_the_sealer_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(log_module, "SEAL_ROWS", 4)
    sealer = log_module.Sealer()
    sealed = threading.Event()
    log = StreamLog("s", sealer=sealer)
    original = log.seal

    def seal_and_note() -> int:
        result = original()
        if threading.current_thread().name == "meshbus-spark-sealer":
            sealed.set()
        return result

    monkeypatch.setattr(log, "seal", seal_and_note)
    try:
        fill(log, 0, 4)
        assert sealed.wait(5), "the sealer thread never sealed the full tail"
        assert log.statistics()["retained_bytes"] > 0
        assert offsets(log.read(0, 4)) == [0, 1, 2, 3]
    finally:
        sealer.stop()
