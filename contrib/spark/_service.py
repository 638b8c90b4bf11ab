"""The ``spark`` service: what the data source's processes ask a node's Spark bridge.

Every request arrives as a call on the caller's own session (see
:meth:`meshbus.Node.provide_service`), so it was authenticated, over TLS when the
listener has it, and the caller's ACL applies: a stream of topic filters needs the
right to subscribe to each, a queue stream the right to receive guaranteed messages,
a write the right to publish to every row's topic.

Requests are served in worker threads, not in the node's event loop: sealing and
slicing Arrow batches and writing Arrow IPC is work that would delay the routing of
every other message. What needs the loop (opening a stream, publishing a committed
write) is handed to it.

Offsets on the wire are objects from partition number (as a string, JSON's keys) to
offset: ``{"0": 1200, "1": 1187}``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.to_thread
import pyarrow as pa

from meshbus.errors import AccessDeniedError, MeshbusError

from ._columns import arrow_schema
from ._errors import BridgeError, OffsetsUnavailableError
from ._rows import publishable_rows
from ._wire import Body, error_header

if TYPE_CHECKING:
    from meshbus import Session

    from ._bridge import SparkBridge
    from ._streams import Stream

__all__ = ["FETCH_BYTES", "serve"]

logger = logging.getLogger("meshbus.contrib.spark")

#: Arrow bytes one fetch answer carries at most; a reader asks again for the rest.
FETCH_BYTES = 8 << 20
_STAGE_EXPIRY = 600.0

Answer = tuple[dict[str, Any], Body]


async def serve(bridge: SparkBridge, session: Session, args: dict[str, Any], body: bytes) -> Answer:
    """Answer one call of the service (in a worker thread; errors become answer fields)."""
    if session.vpn.name != bridge.vpn:
        return error_header(
            BridgeError(
                f"the Spark bridge serves VPN {bridge.vpn!r}, not {session.vpn.name!r}: "
                f"give the data source the option vpn={bridge.vpn!r}"
            )
        ), b""
    op = args.get("op")
    handler = _OPS.get(op) if isinstance(op, str) else None
    if handler is None:
        return error_header(BridgeError(f"unknown request {op!r}")), b""
    try:
        return await anyio.to_thread.run_sync(
            handler, bridge, session, args, body, limiter=bridge.limiter
        )
    except (MeshbusError, KeyError, TypeError, ValueError) as exc:
        if not isinstance(exc, MeshbusError):
            exc = BridgeError(f"malformed {op!r} request: {exc!r}")
        return error_header(exc), b""


def _offsets(value: Any, stream: Stream, what: str) -> dict[int, int]:
    """Wire offsets as ``{partition: offset}``, one for each partition of ``stream``."""
    if not isinstance(value, dict):
        raise BridgeError(f"{what} must be an object of offsets by partition, got {value!r}")
    found: dict[int, int] = {}
    for key, offset in value.items():
        if not (isinstance(key, str) and key.isdecimal()) or type(offset) is not int or offset < 0:
            raise BridgeError(f"{what}: not a partition and offset: {key!r}: {offset!r}")
        found[int(key)] = offset
    if sorted(found) != list(range(len(stream.logs))):
        raise BridgeError(
            f"{what} names partitions {sorted(found)}, but stream {stream.spec.id!r} has "
            f"{len(stream.logs)}"
        )
    return found


def _wire(offsets: list[int]) -> dict[str, int]:
    return {str(p): n for p, n in enumerate(offsets)}


def _stream(bridge: SparkBridge, session: Session, args: dict[str, Any]) -> Stream:
    stream = bridge.ensure(args.get("stream"))
    spec = stream.spec
    if spec.queue is None:
        for topic_filter in spec.subscribe:
            session.check_subscribe_acl(topic_filter)
    elif not session.client_profile.allow_guaranteed_receive:
        raise AccessDeniedError(
            session.username, "bind", spec.queue, "client profile does not allow guaranteed receive"
        )
    return stream


def _starting(h: dict[str, Any], partition: int, default: str) -> str | int:
    """Where a read starts in ``partition``: ``startingTimestamp`` (as ``"@MS"``),
    else the partition's entry of ``startingOffsets``, else the word it gives."""
    timestamp = h.get("timestamp")
    if timestamp is not None:
        return f"@{int(timestamp)}"
    starting = h.get("starting", default)
    if isinstance(starting, dict):
        return int(starting[str(partition)])
    return str(starting)


def _open(bridge: SparkBridge, session: Session, h: dict[str, Any], _: Body) -> Answer:
    stream = _stream(bridge, session, h)
    bridge.catch_up_queue(stream)
    consumer, fail = str(h["consumer"]), bool(h.get("fail", False))
    start = [
        log.register(consumer, _starting(h, n, "earliest"), fail_on_data_loss=fail)
        for n, log in enumerate(stream.logs)
    ]
    return {"stream": stream.spec.id, "start": _wire(start)}, b""


def _latest(bridge: SparkBridge, session: Session, h: dict[str, Any], _: Body) -> Answer:
    stream = _stream(bridge, session, h)
    bridge.catch_up_queue(stream)
    consumer = str(h.get("consumer", "default"))
    position = h.get("position")
    at = _offsets(position, stream, "position") if position is not None else None
    ends = []
    for number, log in enumerate(stream.logs):
        if at is not None:
            log.adopt(at[number])
            log.touch(consumer, at[number])
        end = log.seal()
        log.mark_served()
        ends.append(max(end, at[number]) if at is not None else end)
    earliest = [log.earliest for log in stream.logs]
    return {"stream": stream.spec.id, "next": _wire(ends), "earliest": _wire(earliest)}, b""


def _bounds(bridge: SparkBridge, session: Session, h: dict[str, Any], _: Body) -> Answer:
    stream = _stream(bridge, session, h)
    bridge.catch_up_queue(stream)
    consumer, fail = str(h.get("consumer", "default")), bool(h.get("fail", False))
    ending = h.get("ending", "latest")
    starts, ends = [], []
    for number, log in enumerate(stream.logs):
        start, end = log.bounds(consumer, _starting(h, number, "earliest"), fail_on_data_loss=fail)
        if isinstance(ending, dict) and int(ending[str(number)]) >= 0:
            end = min(end, int(ending[str(number)]))
        starts.append(start)
        ends.append(max(start, end))
    return {"stream": stream.spec.id, "start": _wire(starts), "end": _wire(ends)}, b""


def _fetch(bridge: SparkBridge, session: Session, h: dict[str, Any], _: Body) -> Answer:
    stream = _stream(bridge, session, h)
    log = stream.partition(h.get("partition", 0))
    start, end = int(h["start"]), int(h["end"])
    fail = bool(h.get("fail", False))
    log.adopt(start)
    if stream.spec.queue is not None:  # a replayed batch after a restart: redeliveries
        deadline = time.monotonic() + bridge.fetch_wait
        while log.next_offset < end and time.monotonic() < deadline:
            time.sleep(0.01)
    if not fail and start < log.earliest < end:  # released: read what is left
        start = log.earliest
    pieces = log.read(start, end)
    include = bool(h.get("headers"))
    schema = arrow_schema(include)
    sink = pa.BufferOutputStream()
    rows = 0
    budget = FETCH_BYTES
    with pa.ipc.new_stream(sink, schema) as writer:
        for piece in pieces:
            piece = piece if include else piece.drop_columns(["headers"])
            cut = piece.nbytes > budget
            if cut:  # at least one row, however large
                fit = max(1, piece.num_rows * budget // max(piece.nbytes, 1))
                piece = piece.slice(0, fit)
            writer.write_batch(piece)
            rows += piece.num_rows
            budget -= piece.nbytes
            if cut or budget <= 0:  # after a cut piece, nothing: the rows stay contiguous
                break
    held = sum(p.num_rows for p in pieces)
    if held < end - start:
        if fail:
            raise OffsetsUnavailableError(
                f"stream {stream.spec.id!r} partition {log.partition} lost offsets "
                f"{start + held} to {end} (the node restarted without them, or they expired); "
                "set failOnDataLoss=false to skip them"
            )
        # Spark will commit [start, end) whatever we return: later messages must
        # not be numbered inside it.
        log_gap(stream, log.partition, end)
        log.advance_to(end)
    until = start + rows if rows < held else end
    bridge.count_served(session.client_name, rows)
    return {"rows": rows, "until": until}, sink.getvalue().to_pybytes()


def log_gap(stream: Stream, partition: int, end: int) -> None:
    logger.warning(
        "spark bridge: stream %r partition %d lost offsets below %d (the node restarted or "
        "they expired); the query skips them",
        stream.spec.id,
        partition,
        end,
    )


def _commit(bridge: SparkBridge, session: Session, h: dict[str, Any], _: Body) -> Answer:
    stream = _stream(bridge, session, h)
    offsets = _offsets(h.get("next"), stream, "next")
    consumer = str(h["consumer"])
    for number, log in enumerate(stream.logs):
        log.commit(consumer, offsets[number])
    return {}, b""


def _stage(bridge: SparkBridge, session: Session, _: dict[str, Any], body: Body) -> Answer:
    table = pa.ipc.open_stream(body).read_all()
    token = uuid.uuid4().hex
    now = time.monotonic()
    with bridge.lock:
        staged = bridge.staged
        for old in [t for t, (at, _) in staged.items() if now - at > _STAGE_EXPIRY]:
            del staged[old]
        held = sum(t.nbytes for _, t in staged.values())
        if held + table.nbytes > bridge.max_staged_bytes:
            raise BridgeError(
                f"staging {table.nbytes} bytes would hold {held + table.nbytes} bytes of "
                f"uncommitted writes, over the bridge's max_staged_bytes "
                f"({bridge.max_staged_bytes}); Spark retries the task"
            )
        staged[token] = (now, table)
    bridge.count_staged(session.client_name, table.num_rows)
    return {"token": token, "rows": table.num_rows}, b""


def _discard(bridge: SparkBridge, session: Session, h: dict[str, Any], _: Body) -> Answer:
    with bridge.lock:
        for token in h.get("tokens", []):
            bridge.staged.pop(token, None)
    return {}, b""


def _publish(bridge: SparkBridge, session: Session, h: dict[str, Any], _: Body) -> Answer:
    sink, batch = h.get("sink"), h.get("batch")
    tokens = list(h.get("tokens", []))
    key = (sink, batch) if sink is not None and batch is not None else None
    mode = str(h.get("mode", "direct"))
    with bridge.lock:
        if key is not None and (key[1] <= bridge.sinks.get(key[0], -1) or key in bridge.in_flight):
            for token in tokens:
                bridge.staged.pop(token, None)
            return {"status": "duplicate", "rows": 0}, b""
        missing = [t for t in tokens if t not in bridge.staged]
        if missing:
            raise BridgeError(
                f"{len(missing)} staged part(s) of this write are gone (the node restarted "
                "or they expired); Spark will retry the batch"
            )
        tables = [bridge.staged.pop(t)[1] for t in tokens]
        if key is not None:
            bridge.in_flight.add(key)
    try:
        rows = publishable_rows(tables, h.get("topic"))
        for topic in {row[0] for row in rows}:
            session.check_publish_acl(topic)
        if mode != "direct" and not session.client_profile.allow_guaranteed_send:
            raise AccessDeniedError(
                session.username, "publish", why="client profile does not allow guaranteed send"
            )
        bridge.publish_rows(rows, mode)
        if key is not None:
            bridge.record_sink(key[0], key[1])
    finally:
        if key is not None:
            with bridge.lock:
                bridge.in_flight.discard(key)
    return {"status": "published", "rows": len(rows)}, b""


def _stats(bridge: SparkBridge, session: Session, _: dict[str, Any], __: Body) -> Answer:
    return bridge.statistics(), b""


_OPS: dict[str, Callable[[SparkBridge, Session, dict[str, Any], Body], Answer]] = {
    "open": _open,
    "latest": _latest,
    "bounds": _bounds,
    "fetch": _fetch,
    "commit": _commit,
    "stage": _stage,
    "discard": _discard,
    "publish": _publish,
    "stats": _stats,
}
