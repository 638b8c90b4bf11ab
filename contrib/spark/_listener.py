"""Acknowledge what a query committed, from Spark's own progress events.

Spark reports a micro-batch's progress after it wrote the batch to its commit log,
in the driver: the app's process, where the bridge is. That is the earliest safe
moment to release the batch's messages (the reader's ``commit`` runs only when the
next batch is planned, and not at all after the last one of an ``availableNow`` run).
"""

from __future__ import annotations

import json
import logging
import weakref
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming.listener import StreamingQueryListener

if TYPE_CHECKING:
    from ._bridge import SparkBridge

__all__ = ["CommitListener", "partition_offsets"]

log = logging.getLogger("meshbus.contrib.spark")


def committed_offsets(progress: Any) -> list[tuple[str, str, dict[str, int]]]:
    """``(stream, consumer, next)`` for each ``meshbus`` source of a progress event;
    ``next`` maps each partition (as a string) to its next offset."""
    found = []
    for source in progress.sources:
        try:
            end = json.loads(source.endOffset) if source.endOffset else None
        except (TypeError, ValueError):
            continue
        if isinstance(end, dict) and "meshbusStream" in end:
            found.append((str(end["meshbusStream"]), str(end["consumer"]), partition_offsets(end)))
    return found


def partition_offsets(offset: dict[str, Any]) -> dict[str, int]:
    """The ``next`` offsets of a checkpointed ``meshbus`` offset, by partition. A plain
    number (offsets written before streams had partitions) is partition 0's."""
    value = offset["next"]
    if isinstance(value, dict):
        return {str(k): int(v) for k, v in value.items()}
    return {"0": int(value)}


class CommitListener(StreamingQueryListener):
    """Passes each committed ``meshbus`` offset to the bridge."""

    def __init__(self, bridge: SparkBridge) -> None:
        # Weak: py4j keeps listeners alive after removeListener, and a stopped bridge
        # must not stay in memory with its retained batches.
        self._bridge = weakref.ref(bridge)

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        bridge = self._bridge()
        if bridge is None:
            return
        try:
            for stream, consumer, next_offset in committed_offsets(event.progress):
                bridge.commit(stream, consumer, next_offset)
        except Exception:  # a listener must never take Spark's listener bus down
            log.exception("spark bridge: could not record a committed batch")

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass
