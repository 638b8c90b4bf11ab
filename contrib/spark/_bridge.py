"""The Spark bridge: a node's messages, numbered and served to Spark's processes.

:class:`SparkBridge` is registered on a :class:`meshbus.Node` like any plugin. While
the node runs it captures streams (topic filters through a session of its own, or a
queue through a flow) into :class:`StreamLog` objects, one per partition, and
provides the node's ``spark`` service, which the ``meshbus`` data source calls over
the transport like any client (see :mod:`._service`). Writes from Spark are staged by
the executors and published by the bridge when Spark commits the batch, once per
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

from ._client import SERVICE
from ._durable import LogFiles, log_directory
from ._errors import BridgeError
from ._log import Sealer, StreamLog
from ._options import parse_address, parse_urls
from ._pipelines import Pipelines
from ._service import serve
from ._streams import Stream, StreamSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from meshbus import Node
    from meshbus.transports import ListenerSettings

__all__ = ["SparkBridge"]

log = logging.getLogger("meshbus.contrib.spark")

_ACK_INTERVAL = 0.02


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
    :param partitions: how many partitions the declared streams are split into (by
        message key, else topic); readers name the same count.
    :param listen: a listener the bridge starts for Spark's processes when the node
        runs (``host:port``, port 0 picks a free one, or
        :class:`~meshbus.transports.ListenerSettings` for TLS and limits); ``None``
        serves on the node's own listeners only. Spark's processes log in there like
        any client, with the VPN's credentials.
    :param advertise: the node's URL(s) as Spark's executors must dial them
        (``tls://gateway.example:55443``), when that is not the listener's own
        address: a listener bound to all interfaces or behind NAT.
    :param vpn: the Message VPN it serves and logs in to, with ``username``/``password``
        (also the defaults its shortcuts give the data source).
    :param queue_window: most queue messages held for Spark and not yet acknowledged.
    :param max_bytes: per topic-filter stream, the most Arrow bytes retained; the
        oldest are dropped (and counted) beyond it.
    :param max_staged_bytes: the most Arrow bytes Spark's writes may hold staged and
        not yet committed, all writers together; a stage beyond it is refused (the
        task fails and Spark retries it).
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
        partitions: int = 1,
        listen: str | ListenerSettings | None = "127.0.0.1:0",
        advertise: str | None = None,
        vpn: str = "default",
        username: str = "default",
        password: str | None = None,
        queue_window: int = 10_000,
        max_bytes: int = 256 << 20,
        max_staged_bytes: int = 1 << 30,
        fetch_wait: float = 10.0,
        catch_up: float = 1.0,
    ) -> None:
        filters = tuple(subscribe) if not isinstance(subscribe, str) else (subscribe,)
        for topic_filter in filters:
            parse_subscription(topic_filter)
        if not isinstance(partitions, int) or not 1 <= partitions <= 256:
            raise ConfigurationError(f"partitions must be from 1 to 256, got {partitions!r}")
        self._declared = (
            [StreamSpec(subscribe=tuple(sorted(set(filters))), partitions=partitions)]
            if filters
            else []
        )
        self._declared += [
            StreamSpec(queue=q, partitions=partitions)
            for q in ([queues] if isinstance(queues, str) else queues)
        ]
        self._listen = _listener_settings(listen)
        self._advertise = parse_urls(advertise, "advertise") if advertise is not None else None
        if not isinstance(queue_window, int) or queue_window < 1:
            raise ConfigurationError(f"queue_window must be a positive int, got {queue_window!r}")
        self.vpn = vpn
        self._username = username
        self._password = password
        self.queue_window = queue_window
        self.max_bytes = max_bytes
        self.max_staged_bytes = max_staged_bytes
        self.fetch_wait = fetch_wait
        self.catch_up = catch_up
        self._streams: dict[str, Stream] = {}
        self.lock = threading.Lock()
        #: Rows Spark's tasks staged, by token, until their write commits.
        self.staged: dict[str, tuple[float, pa.Table]] = {}
        #: The last batch published per sink id, and the batches publishing now.
        self.sinks: dict[str, int] = {}
        self.in_flight: set[tuple[str, int]] = set()
        self._sinks_file: Path | None = None
        self._node: Node | None = None
        self._token: Any = None
        self._urls: tuple[str, ...] | None = None
        #: Rows served to and staged by each client (by client name): who read and
        #: wrote what, which shows that rows went to executors and not the driver.
        self.served: dict[str, int] = {}
        self.staged_by: dict[str, int] = {}
        self.limiter = anyio.CapacityLimiter(16)
        self._scopes: list[anyio.CancelScope] = []
        self._listeners: list[tuple[Any, Any]] = []
        self._open_lock: anyio.Lock | None = None
        # Declared queues not created yet, by endpoint name: each event is set when the
        # guaranteed plugin announces that endpoint (meshbus_endpoint_interest).
        self._awaited: dict[str, anyio.Event] = {}
        self._published = 0

    def __repr__(self) -> str:
        where = ",".join(self._urls) if self._urls is not None else "not running"
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
        self.staged.clear()
        self._awaited.clear()
        self.in_flight.clear()
        self.served.clear()
        self.staged_by.clear()
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
            self.sinks = _load_sinks(self._sinks_file)
        self._sealer = Sealer()
        await node.task_group.start(self._background)
        for spec in self._declared:
            if spec.queue is None:
                await self._open(spec)
            else:
                node.task_group.start_soon(self._open_when_created, spec)
        node.provide_service(SERVICE, self._serve)
        try:
            self._urls = await self._serving_urls(node)
            where = ", ".join(self._urls) if self._urls else "the node's listeners"
            log.info("spark bridge serving on %s", where)
            yield
        finally:
            node.withdraw_service(SERVICE)
            self._urls = None
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
                for log_ in stream.logs:
                    for message in log_.take_releasable():
                        stream.flow.ack(message)

    # --- public ------------------------------------------------------------------------

    async def _serve(self, session: Any, args: dict[str, Any], body: bytes) -> Any:
        return await serve(self, session, args, body)

    async def _serving_urls(self, node: Node) -> tuple[str, ...] | None:
        """Where Spark's processes dial: the advertised URLs, else the bridge's own
        listener; ``None`` when the bridge uses the node's listeners (looked up when
        :attr:`address` is asked, as they may start after the bridge)."""
        from meshbus.transports import start_server

        if self._listen is not None:
            server = await start_server(node, self._listen)
            return self._advertise or _reachable(server.url, "listen")
        return self._advertise

    @property
    def address(self) -> str:
        """The node's URL(s) for Spark's processes (the data source's ``address``
        option), once the node runs.

        :raises StateError: the node is not running.
        :raises ConfigurationError: the bridge has no listener of its own, no
            ``advertise``, and the node serves no listener either.
        """
        from meshbus.transports import servers_of

        if self._node is None:
            raise StateError("the Spark bridge serves only while its node runs")
        if self._urls is None:
            servers = [s for s in servers_of(self._node) if not s.url.startswith("memory:")]
            if not servers:
                raise ConfigurationError(
                    "the Spark bridge has no listener to give Spark's processes: pass "
                    "listen= or advertise=, or start a listener on the node"
                )
            return _reachable(servers[0].url, "advertise")[0]
        return ",".join(self._urls)

    @property
    def connect_options(self) -> dict[str, str]:
        """The data source options that reach this bridge: ``address``, ``vpn``,
        ``username`` and, when the bridge has one, ``password``."""
        options = {"address": self.address, "vpn": self.vpn, "username": self._username}
        if self._password is not None:
            options["password"] = self._password
        return options

    def count_served(self, client_name: str, rows: int) -> None:
        """Count ``rows`` served to ``client_name`` (any thread)."""
        with self.lock:
            self.served[client_name] = self.served.get(client_name, 0) + rows

    def count_staged(self, client_name: str, rows: int) -> None:
        """Count ``rows`` staged by ``client_name`` (any thread)."""
        with self.lock:
            self.staged_by[client_name] = self.staged_by.get(client_name, 0) + rows

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

        jvm = spark._jvm
        assert jvm is not None  # a session on the driver has its JVM
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
        if any(known._jsparkSession == spark._jsparkSession for known, _ in self._listeners):
            return
        spark.dataSource.register(MeshbusDataSource)
        listener = CommitListener(self)
        spark.streams.addListener(listener)
        self._listeners.append((spark, listener))

    def statistics(self) -> dict[str, Any]:
        """Per stream: positions, retained bytes, drops, consumers; and the sinks."""
        with self.lock:
            served = dict(self.served)
            staged_by = dict(self.staged_by)
        return {
            "streams": {
                name: [log.statistics() for log in s.logs]
                for name, s in list(self._streams.items())
            },
            "sinks": dict(self.sinks),
            "published": self._published,
            "staged": len(self.staged),
            "served": served,
            "staged_by": staged_by,
        }

    def stream(
        self,
        *,
        subscribe: Iterable[str] = (),
        queue: str | None = None,
        partitions: int = 1,
        partition: int = 0,
    ) -> StreamLog:
        """The log of one partition of a running stream (for inspection and tests)."""
        spec = (
            StreamSpec(queue=queue, partitions=partitions)
            if queue
            else StreamSpec(subscribe=tuple(sorted(set(subscribe))), partitions=partitions)
        )
        return self._streams[spec.id].logs[partition]

    def commit(self, stream: str, consumer: str, next_offsets: dict[str, int]) -> None:
        """Record that ``consumer`` has each partition of ``stream`` below its offset in
        ``next_offsets`` (``{"0": n, ...}``; thread-safe)."""
        found = self._streams.get(stream)
        if found is not None:
            for key, offset in next_offsets.items():
                number = int(key)
                if 0 <= number < len(found.logs):
                    found.logs[number].commit(consumer, int(offset))

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
            [
                StreamLog(
                    spec.id,
                    partition=number,
                    keep_handles=spec.queue is not None,
                    max_bytes=self.max_bytes,
                    sealer=self._sealer,
                    clock=node.clock.time,
                    files=self._files(node, spec, number),
                )
                for number in range(spec.partitions)
            ],
        )
        if spec.queue is None:
            session = await node.login(
                self.vpn,
                username=self._username,
                password=self._password,
                client_name=f"{node.name}-spark-{uuid.uuid4().hex[:8]}",
                on_message=stream.append,
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

    def _files(self, node: Node, spec: StreamSpec, partition: int) -> LogFiles | None:
        """Where a partition's log is kept: on disk when the node has a data directory."""
        if node.data_dir is None:
            return None
        directory = log_directory(node.data_dir, spec.id, partition)
        return LogFiles(directory, spec.id, partition, keep_released=self.queue_window)

    async def _open_when_created(self, spec: StreamSpec) -> None:
        assert self._node is not None
        assert spec.queue is not None
        endpoint = f"{self.vpn}/{spec.queue}"  # how the guaranteed plugin names it
        with self._task_scope():
            # Looked up again after each wake: the hook also reports a deletion.
            while self._service().find_queue(self.vpn, spec.queue) is None:
                await self._awaited.setdefault(endpoint, anyio.Event()).wait()
            await self._open(spec)

    async def _capture_queue(self, stream: Stream) -> None:
        assert stream.flow is not None
        with self._task_scope():
            try:
                async for message in stream.flow:
                    stream.append(message)
            except MeshbusError as exc:
                stream.failure = f"queue {stream.spec.queue!r} stopped delivering: {exc}"
                log.warning("spark bridge: %s", stream.failure)

    def ensure(self, spec_wire: Any) -> Stream:
        """The running stream a request names, opened now if it is new (worker threads)."""
        spec = StreamSpec.from_wire(spec_wire)
        stream = self._streams.get(spec.id)
        if stream is None:
            stream = anyio.from_thread.run(self._open, spec, token=self._token)
        if stream.failure is not None:
            raise BridgeError(stream.failure)
        return stream

    # --- serving (worker threads of the spark service) --------------------------------

    def catch_up_queue(self, stream: Stream) -> None:
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
            if sum(p.unacknowledged for p in stream.logs) >= min(held, self.queue_window):
                return
            time.sleep(0.005)

    def _service(self) -> Any:
        """The node's guaranteed service (the plugin's, with its queue lookups)."""
        assert self._node is not None
        return self._node.guaranteed

    def _queue_depth(self, stream: Stream) -> int:
        assert self._node is not None
        assert stream.spec.queue is not None
        queue = self._service().find_queue(self.vpn, stream.spec.queue)
        return 0 if queue is None else int(queue.usage()[0])

    def publish_rows(
        self, rows: list[tuple[str, bytes, str | None, dict[str, Any] | None]], mode: str
    ) -> None:
        """Publish a committed write's rows from the node's loop (worker threads)."""
        anyio.from_thread.run(self._publish, rows, mode, token=self._token)

    def record_sink(self, sink: str, batch: int) -> None:
        """Remember that ``sink`` published ``batch`` (durably with a data directory)."""
        with self.lock:
            self.sinks[sink] = max(batch, self.sinks.get(sink, -1))
            if self._sinks_file is not None:
                write_json_atomically(self._sinks_file, self.sinks)

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


def _listener_settings(listen: str | ListenerSettings | None) -> ListenerSettings | None:
    from meshbus.transports import ListenerSettings

    if listen is None or isinstance(listen, ListenerSettings):
        return listen
    host, port = parse_address(listen, "listen")
    return ListenerSettings(host=host, port=port, name="spark")


def _reachable(url: str, option: str) -> tuple[str, ...]:
    """``url`` of a listener, refused when it is a wildcard no machine can dial."""
    host = url.partition("://")[2].rpartition(":")[0].strip("[]")
    if host in ("0.0.0.0", "::"):
        raise ConfigurationError(
            f"the Spark bridge's listener {url} is bound to all interfaces, which Spark's "
            f"executors cannot dial: pass advertise='tls://HOST:PORT' (or tcp://) with an "
            f"address they can reach"
        )
    return (url,)


def _load_sinks(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{path}: unreadable Spark sink state: {exc}") from None
    return {str(k): int(v) for k, v in data.items()}
