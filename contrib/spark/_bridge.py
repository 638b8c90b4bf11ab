"""The ``spark`` plugin: a node's messages, numbered and served to Spark's workers.

:class:`SparkBridge` is registered on a :class:`meshbus.Node` like any plugin. While
the node runs it captures streams (topic filters through a session of its own, or a
queue through a flow) into :class:`StreamLog` objects and serves the ``meshbus``
data source's requests from a loopback server. Writes from Spark are staged by the
executors and published by the bridge when Spark commits the batch, once per
``(sink id, batch id)``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pyarrow as pa

from meshbus import hookimpl, parse_subscription, write_json_atomically
from meshbus.errors import ConfigurationError, MeshbusError, StateError

from ._columns import arrow_schema
from ._errors import BridgeError
from ._log import Sealer, StreamLog
from ._options import DEFAULT_ADDRESS, parse_address
from ._pipelines import Pipelines
from ._rows import publishable_rows
from ._server import ControlServer
from ._streams import Stream, StreamSpec
from ._wire import Body

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from meshbus import Node

__all__ = ["SparkBridge"]

log = logging.getLogger("meshbus.contrib.spark")

_ACK_INTERVAL = 0.02
_STAGE_EXPIRY = 600.0


class SparkBridge(Pipelines):
    """Serve a node's messages to Spark, and publish what Spark writes.

    Register it as a plugin: ``Node(plugins=[*DEFAULT_PLUGINS, SparkBridge(...)])``.

    :param subscribe: topic filters captured from the moment the node starts, as one
        stream (readers name it with the same filters). Other filters and queues
        become streams when a query first asks for them.
    :param queues: queues captured as soon as they exist; each is a stream. One created
        later is bound as it is created, which the guaranteed plugin announces with
        :func:`~meshbus.hookspecs.meshbus_endpoint_interest`. A queue message is
        acknowledged only once every consumer of its stream committed it.
    :param address: ``host:port`` of the loopback server for Spark's workers
        (port 0 picks a free one; see :attr:`address`).
    :param vpn: the Message VPN it logs in to, with ``username``/``password``.
    :param queue_window: most queue messages held for Spark and not yet acknowledged.
    :param max_bytes: per topic-filter stream, the most Arrow bytes retained; the
        oldest are dropped (and counted) beyond it.
    :param fetch_wait: seconds a read of a queue stream waits for offsets it was
        promised but the log does not hold yet (redeliveries after a restart).
    :param catch_up: seconds a query's question "how far does a queue stream go"
        waits for the flow to take what the queue holds.
    """

    def __init__(
        self,
        *,
        subscribe: Iterable[str] = (),
        queues: Iterable[str] = (),
        address: str = DEFAULT_ADDRESS,
        vpn: str = "default",
        username: str = "default",
        password: str | None = None,
        queue_window: int = 10_000,
        max_bytes: int = 256 << 20,
        fetch_wait: float = 10.0,
        catch_up: float = 1.0,
    ) -> None:
        filters = tuple(subscribe) if not isinstance(subscribe, str) else (subscribe,)
        for topic_filter in filters:
            parse_subscription(topic_filter)
        self._declared = [StreamSpec(subscribe=tuple(sorted(set(filters))))] if filters else []
        self._declared += [
            StreamSpec(queue=q) for q in ([queues] if isinstance(queues, str) else queues)
        ]
        self._host, self._port = parse_address(address)
        if not isinstance(queue_window, int) or queue_window < 1:
            raise ConfigurationError(f"queue_window must be a positive int, got {queue_window!r}")
        self.vpn = vpn
        self._username = username
        self._password = password
        self.queue_window = queue_window
        self.max_bytes = max_bytes
        self.fetch_wait = fetch_wait
        self.catch_up = catch_up
        self._streams: dict[str, Stream] = {}
        self._lock = threading.Lock()
        self._staged: dict[str, tuple[float, pa.Table]] = {}
        self._sinks: dict[str, int] = {}
        self._sinks_file: Path | None = None
        self._node: Node | None = None
        self._token: Any = None
        self._server: ControlServer | None = None
        self._scopes: list[anyio.CancelScope] = []
        self._listeners: list[tuple[Any, Any]] = []
        self._open_lock: anyio.Lock | None = None
        # Declared queues not created yet, by endpoint name: each event is set when the
        # guaranteed plugin announces that endpoint (meshbus_endpoint_interest).
        self._awaited: dict[str, anyio.Event] = {}
        self._published = 0

    def __repr__(self) -> str:
        where = self._server.address if self._server is not None else "not running"
        return f"<SparkBridge {where} streams={list(self._streams)}>"

    # --- plugin hooks --------------------------------------------------------------

    @hookimpl
    def meshbus_lifespan(self, node: Node) -> Any:
        return self._running(node)

    @hookimpl
    def meshbus_endpoint_interest(self, endpoint: str) -> None:
        # The guaranteed plugin calls it when it creates, changes or deletes a queue:
        # a declared queue becomes a stream as it is created, without polling for it.
        created = self._awaited.pop(endpoint, None)
        if created is not None:
            created.set()

    @asynccontextmanager
    async def _running(self, node: Node) -> AsyncIterator[None]:
        self._node = node
        self._token = anyio.lowlevel.current_token()
        self._open_lock = anyio.Lock()
        # A bridge can serve a node again after it stopped: nothing carries over.
        self._streams.clear()
        self._scopes.clear()
        self._staged.clear()
        self._awaited.clear()
        self._in_flight: set[tuple[str, int]] = set()
        # login(), not connect(): a password is checked off the event loop (SPEC 6).
        self._session = await node.login(
            self.vpn,
            username=self._username,
            password=self._password,
            client_name=f"{node.name}-spark-bridge",
            timestamps=True,  # rows Spark writes carry the time they reached the bus
        )
        if node.data_dir is not None:
            self._sinks_file = node.data_dir / "spark-sinks.json"
            self._sinks = _load_sinks(self._sinks_file)
        self._sealer = Sealer()
        await node.task_group.start(self._background)
        for spec in self._declared:
            if spec.queue is None:
                await self._open(spec)
            else:
                node.task_group.start_soon(self._open_when_created, spec)
        self._server = ControlServer(self._host, self._port, self._dispatch)
        self._server.start()
        log.info("spark bridge serving on %s", self._server.address)
        try:
            yield
        finally:
            self._server.close()
            self._server = None
            for scope in self._scopes:
                scope.cancel()
            self._release_acks()
            for stream in self._streams.values():
                if stream.session is not None:
                    stream.session.close()
            self._session.close()
            self._node = None
            self._forget_listeners()
            self._sealer.stop()

    def _forget_listeners(self) -> None:
        for spark, listener in self._listeners:
            try:
                spark.streams.removeListener(listener)
            except Exception:  # the SparkSession may have stopped first; nothing to undo
                log.debug("spark bridge: listener already gone", exc_info=True)
        self._listeners.clear()

    def _task_scope(self) -> anyio.CancelScope:
        """A scope for one background task, cancelled when the bridge stops."""
        scope = anyio.CancelScope()
        self._scopes.append(scope)
        return scope

    async def _background(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        with self._task_scope():
            task_status.started()
            while True:
                await anyio.sleep(_ACK_INTERVAL)
                self._release_acks()

    def _release_acks(self) -> None:
        for stream in list(self._streams.values()):
            if stream.flow is not None:
                for message in stream.log.take_releasable():
                    stream.flow.ack(message)

    # --- public ------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """Where Spark's workers reach the bridge (``host:port``), once the node runs."""
        if self._server is None:
            raise StateError("the Spark bridge serves only while its node runs")
        return self._server.address

    def attach(self, spark: SparkSession) -> None:
        """Register the ``meshbus`` data source and the commit listener on ``spark``.

        The listener acknowledges what a query committed as soon as Spark's commit
        log has it (without it, acknowledgements lag one micro-batch behind). Each
        call also makes ``spark`` the calling thread's active session: Spark looks up
        a Python data source for ``df.write`` in the active session of the thread
        that writes, so call it in a thread before writing from there (the bridge's
        shortcuts do). Registering happens once per session.
        """
        from ._listener import CommitListener
        from ._source import MeshbusDataSource

        spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        if any(known._jsparkSession == spark._jsparkSession for known, _ in self._listeners):
            return
        spark.dataSource.register(MeshbusDataSource)
        listener = CommitListener(self)
        spark.streams.addListener(listener)
        self._listeners.append((spark, listener))

    def statistics(self) -> dict[str, Any]:
        """Per stream: positions, retained bytes, drops, consumers; and the sinks."""
        return {
            "streams": {name: s.log.statistics() for name, s in list(self._streams.items())},
            "sinks": dict(self._sinks),
            "published": self._published,
            "staged": len(self._staged),
        }

    def stream(self, *, subscribe: Iterable[str] = (), queue: str | None = None) -> StreamLog:
        """The log of a running stream (for inspection and tests)."""
        spec = (
            StreamSpec(queue=queue)
            if queue
            else StreamSpec(subscribe=tuple(sorted(set(subscribe))))
        )
        return self._streams[spec.id].log

    def commit(self, stream: str, consumer: str, next_offset: int) -> None:
        """Record that ``consumer`` has ``stream`` below ``next_offset`` (thread-safe)."""
        found = self._streams.get(stream)
        if found is not None:
            found.log.commit(consumer, next_offset)

    # --- streams -------------------------------------------------------------------

    async def _open(self, spec: StreamSpec) -> Stream:
        assert self._open_lock is not None
        async with self._open_lock:  # two workers asking at once open one stream
            return self._streams.get(spec.id) or await self._open_new(spec)

    async def _open_new(self, spec: StreamSpec) -> Stream:
        node = self._node
        if node is None:
            raise StateError("the Spark bridge's node is not running")
        stream = Stream(
            spec,
            StreamLog(
                spec.id,
                keep_handles=spec.queue is not None,
                max_bytes=self.max_bytes,
                sealer=self._sealer,
                clock=node.clock.time,
            ),
        )
        if spec.queue is None:
            session = await node.login(
                self.vpn,
                username=self._username,
                password=self._password,
                client_name=f"{node.name}-spark-{uuid.uuid4().hex[:8]}",
                on_message=stream.log.append,
            )
            try:
                for topic_filter in spec.subscribe:
                    session.subscribe(topic_filter)
            except BaseException:
                session.close()
                raise
            stream.session = session
        else:
            stream.flow = await self._session.bind(spec.queue, window=self.queue_window)
            node.task_group.start_soon(self._capture_queue, stream)
        self._streams[spec.id] = stream
        log.info("spark bridge captures stream %r", spec.id)
        return stream

    async def _open_when_created(self, spec: StreamSpec) -> None:
        assert self._node is not None
        assert spec.queue is not None
        endpoint = f"{self.vpn}/{spec.queue}"  # how the guaranteed plugin names it
        with self._task_scope():
            # Looked up again after each wake: the hook also reports a deletion.
            while self._node.guaranteed.find_queue(self.vpn, spec.queue) is None:
                await self._awaited.setdefault(endpoint, anyio.Event()).wait()
            await self._open(spec)

    async def _capture_queue(self, stream: Stream) -> None:
        assert stream.flow is not None
        with self._task_scope():
            try:
                async for message in stream.flow:
                    stream.log.append(message)
            except MeshbusError as exc:
                stream.failure = f"queue {stream.spec.queue!r} stopped delivering: {exc}"
                log.warning("spark bridge: %s", stream.failure)

    def _ensure(self, spec_wire: Any) -> Stream:
        spec = StreamSpec.from_wire(spec_wire)
        stream = self._streams.get(spec.id)
        if stream is None:
            stream = anyio.from_thread.run(self._open, spec, token=self._token)
        if stream.failure is not None:
            raise BridgeError(stream.failure)
        return stream

    # --- requests from Spark's workers (control-server threads) ----------------------

    def _dispatch(self, header: dict[str, Any], body: Body) -> tuple[dict[str, Any], Body]:
        if self._node is None:
            raise BridgeError("the Spark bridge is stopping")
        op = header.get("op")
        handler = _OPS.get(op) if isinstance(op, str) else None
        if handler is None:
            raise BridgeError(f"unknown request {op!r}")
        return handler(self, header, body)

    def _op_open(self, h: dict[str, Any], _: Body) -> tuple[dict[str, Any], Body]:
        stream = self._ensure(h.get("stream"))
        self._catch_up(stream)
        start = stream.log.register(str(h["consumer"]), str(h.get("starting", "earliest")))
        return {"stream": stream.spec.id, "start": start}, b""

    def _catch_up(self, stream: Stream) -> None:
        """Give a queue stream's flow a moment to take what the queue holds.

        A query asking how far a queue stream goes means what the queue holds now,
        not only what its flow happened to deliver so far (an ``availableNow`` run
        fixes its end at this answer). Waits at most ``catch_up`` seconds.
        """
        if stream.spec.queue is None:
            return
        deadline = time.monotonic() + self.catch_up
        while time.monotonic() < deadline:
            held = anyio.from_thread.run_sync(self._queue_depth, stream, token=self._token)
            if stream.log.unacknowledged >= min(held, self.queue_window):
                return
            time.sleep(0.005)

    def _queue_depth(self, stream: Stream) -> int:
        assert self._node is not None
        assert stream.spec.queue is not None
        queue = self._node.guaranteed.find_queue(self.vpn, stream.spec.queue)
        return 0 if queue is None else int(queue.usage()[0])

    def _op_latest(self, h: dict[str, Any], _: Body) -> tuple[dict[str, Any], Body]:
        stream = self._ensure(h.get("stream"))
        self._catch_up(stream)
        position = h.get("position")
        if isinstance(position, int):
            stream.log.adopt(position)
            stream.log.touch(str(h.get("consumer", "default")), position)
        end = stream.log.seal()
        stream.log.mark_served()
        if isinstance(position, int):
            end = max(end, position)
        return {"stream": stream.spec.id, "next": end, "earliest": stream.log.earliest}, b""

    def _op_bounds(self, h: dict[str, Any], _: Body) -> tuple[dict[str, Any], Body]:
        stream = self._ensure(h.get("stream"))
        self._catch_up(stream)
        start, end = stream.log.bounds(
            str(h.get("consumer", "default")), str(h.get("starting", "earliest"))
        )
        return {"stream": stream.spec.id, "start": start, "end": end}, b""

    def _op_fetch(self, h: dict[str, Any], _: Body) -> tuple[dict[str, Any], Body]:
        stream = self._ensure(h.get("stream"))
        start, end = int(h["start"]), int(h["end"])
        stream.log.adopt(start)
        if stream.spec.queue is not None:  # a replayed batch after a restart: redeliveries
            deadline = time.monotonic() + self.fetch_wait
            while stream.log.next_offset < end and time.monotonic() < deadline:
                time.sleep(0.01)
        pieces = stream.log.read(start, end)
        if sum(p.num_rows for p in pieces) < end - start:
            # Spark will commit [start, end) whatever we return: later messages must
            # not be numbered inside it.
            log.warning(
                "spark bridge: stream %r lost offsets below %d (the app restarted or they "
                "expired); the query skips them",
                stream.spec.id,
                end,
            )
            stream.log.advance_to(end)
        include = bool(h.get("headers"))
        schema = arrow_schema(include)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as writer:
            for piece in pieces:
                writer.write_batch(piece if include else piece.drop_columns(["headers"]))
        return {"rows": sum(p.num_rows for p in pieces)}, sink.getvalue()

    def _op_commit(self, h: dict[str, Any], _: Body) -> tuple[dict[str, Any], Body]:
        self.commit(str(h["stream"]), str(h["consumer"]), int(h["next"]))
        return {}, b""

    def _op_stage(self, _: dict[str, Any], body: Body) -> tuple[dict[str, Any], Body]:
        table = pa.ipc.open_stream(body).read_all()
        token = uuid.uuid4().hex
        now = time.monotonic()
        with self._lock:
            for old in [t for t, (at, _) in self._staged.items() if now - at > _STAGE_EXPIRY]:
                del self._staged[old]
            self._staged[token] = (now, table)
        return {"token": token, "rows": table.num_rows}, b""

    def _op_discard(self, h: dict[str, Any], _: Body) -> tuple[dict[str, Any], Body]:
        with self._lock:
            for token in h.get("tokens", []):
                self._staged.pop(token, None)
        return {}, b""

    def _op_publish(self, h: dict[str, Any], _: Body) -> tuple[dict[str, Any], Body]:
        sink, batch = h.get("sink"), h.get("batch")
        tokens = list(h.get("tokens", []))
        key = (sink, batch) if sink is not None and batch is not None else None
        with self._lock:
            if key is not None and (
                key[1] <= self._sinks.get(key[0], -1) or key in self._in_flight
            ):
                for token in tokens:
                    self._staged.pop(token, None)
                return {"status": "duplicate", "rows": 0}, b""
            missing = [t for t in tokens if t not in self._staged]
            if missing:
                raise BridgeError(
                    f"{len(missing)} staged part(s) of this write are gone (the bridge restarted "
                    "or they expired); Spark will retry the batch"
                )
            tables = [self._staged.pop(t)[1] for t in tokens]
            if key is not None:
                self._in_flight.add(key)
        try:
            rows = publishable_rows(tables, h.get("topic"))
            anyio.from_thread.run(
                self._publish, rows, str(h.get("mode", "direct")), token=self._token
            )
            if key is not None:
                with self._lock:
                    self._sinks[key[0]] = max(key[1], self._sinks.get(key[0], -1))
                    if self._sinks_file is not None:
                        write_json_atomically(self._sinks_file, self._sinks)
        finally:
            if key is not None:
                with self._lock:
                    self._in_flight.discard(key)
        return {"status": "published", "rows": len(rows)}, b""

    def _op_stats(self, _: dict[str, Any], __: Body) -> tuple[dict[str, Any], Body]:
        return self.statistics(), b""

    async def _publish(
        self, rows: list[tuple[str, bytes, str | None, dict[str, Any] | None]], mode: str
    ) -> None:
        session = self._session
        if mode == "direct":
            for i, (topic, payload, key, headers) in enumerate(rows, 1):
                session.publish(topic, payload, headers=headers, correlation_id=key)
                if i % 5000 == 0:
                    await anyio.sleep(0)  # a large batch must not stall the node
        else:
            persistent = mode == "persistent"
            if all(key is None and headers is None for _, _, key, headers in rows):
                results = await session.send_many(
                    ((t, p) for t, p, _, _ in rows), persistent=persistent
                )
                failed = [r for r in results if r is not None]
                if failed:
                    raise BridgeError(
                        f"{len(failed)} of {len(rows)} rows were rejected: {failed[0]}"
                    )
            else:
                for topic, payload, key, headers in rows:
                    await session.send(
                        topic, payload, persistent=persistent, headers=headers, correlation_id=key
                    )
        self._published += len(rows)


_OPS = {
    "open": SparkBridge._op_open,
    "latest": SparkBridge._op_latest,
    "bounds": SparkBridge._op_bounds,
    "fetch": SparkBridge._op_fetch,
    "commit": SparkBridge._op_commit,
    "stage": SparkBridge._op_stage,
    "discard": SparkBridge._op_discard,
    "publish": SparkBridge._op_publish,
    "stats": SparkBridge._op_stats,
}


def _load_sinks(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{path}: unreadable Spark sink state: {exc}") from None
    return {str(k): int(v) for k, v in data.items()}
