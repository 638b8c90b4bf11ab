"""The bridge on a running node, called over TCP as Spark's processes do (no Spark, no Java).

NodeClient is blocking and the bridge hands some requests to the event loop, so every
request runs in a worker thread (``anyio.to_thread``), never in the loop itself.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest

from meshbus import DEFAULT_PLUGINS, ManualClock, Message, Node, Session, StateError
from meshbus.contrib.spark import (
    BridgeError,
    BridgeUnavailableError,
    OffsetsUnavailableError,
    SparkBridge,
    SparkOptionError,
    arrow_schema,
)
from meshbus.contrib.spark._client import NodeClient, NodeTarget
from meshbus.contrib.spark._options import parse_urls
from tests.processes import free_port

EVENTS = {"subscribe": ["events/>"]}
ORDERS = {"queue": "orders"}
HEADERS = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


_OFFSET_FIELDS = ("next", "start", "end", "earliest", "position")


def _one_partition(header: dict[str, Any]) -> dict[str, Any]:
    """Offsets of a one-partition stream as plain numbers: ``{"0": 3}`` is ``3``."""
    return {
        k: v["0"] if k in _OFFSET_FIELDS and isinstance(v, dict) and list(v) == ["0"] else v
        for k, v in header.items()
    }


class Worker:
    """A Spark process's client; each request runs in a thread. The tests here read
    streams of one partition, so offsets go and come as plain numbers."""

    def __init__(self, address: str) -> None:
        self.client = NodeClient(NodeTarget(parse_urls(address)), f"test-{id(self)}")

    async def __call__(self, op: str, body: bytes = b"", **fields: Any) -> dict[str, Any]:
        header, _ = await self.raw(op, body, **fields)
        return header

    async def raw(self, op: str, body: bytes = b"", **fields: Any) -> tuple[dict[str, Any], bytes]:
        for name in ("next", "position"):
            if isinstance(fields.get(name), int):
                fields[name] = {"0": fields[name]}
        call = functools.partial(self.client.request, op, body, **fields)
        header, answer = await anyio.to_thread.run_sync(call)
        return _one_partition(header), answer

    async def fetch(self, stream: dict[str, Any], start: int, end: int, **kw: Any) -> pa.Table:
        header, body = await self.raw("fetch", stream=stream, start=start, end=end, **kw)
        table = pa.ipc.open_stream(body).read_all()
        assert header["rows"] == table.num_rows
        return table

    async def stage(self, table: pa.Table) -> str:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        header = await self("stage", sink.getvalue().to_pybytes())
        assert header["rows"] == table.num_rows
        return str(header["token"])

    async def write(self, table: pa.Table, **fields: Any) -> dict[str, Any]:
        """Stage ``table`` and publish it, as a Spark commit does."""
        return await self("publish", tokens=[await self.stage(table)], **fields)


@asynccontextmanager
async def running(
    bridge: SparkBridge | None = None, **node_options: Any
) -> AsyncIterator[tuple[Node, SparkBridge, Worker]]:
    bridge = bridge or SparkBridge(subscribe=["events/>"], listen="127.0.0.1:0")
    async with Node(plugins=[*DEFAULT_PLUGINS, bridge], **node_options) as node:
        worker = Worker(bridge.address)
        try:
            yield node, bridge, worker
        finally:
            await anyio.to_thread.run_sync(worker.client.close)


async def until(check: Callable[[], bool], timeout: float = 5.0) -> None:
    with anyio.fail_after(timeout):
        while not check():
            await anyio.sleep(0.01)


async def receive(session: Session) -> Message:
    with anyio.fail_after(5):
        return await session.receive()


def rows(table: pa.Table, *columns: str) -> list[tuple[Any, ...]]:
    return list(zip(*(table.column(c).to_pylist() for c in columns), strict=True))


def queue_stats(bridge: SparkBridge) -> dict[str, Any]:
    stats: dict[str, Any] = bridge.statistics()["streams"].get("queue:orders", [{}])[0]
    return stats


# --- reading ---------------------------------------------------------------------------


async def test_latest_open_and_bounds_describe_the_declared_stream() -> None:
    async with running() as (node, _, worker):
        async with node.connect() as producer:
            for i in range(3):
                producer.publish(f"events/{i}", b"x")
            producer.publish("other/1", b"not captured")
        assert await worker("latest", stream=EVENTS) == {
            "stream": "events/>",
            "next": 3,
            "earliest": 0,
        }
        assert await worker("open", stream=EVENTS, consumer="a") == {
            "stream": "events/>",
            "start": 0,
        }
        opened = await worker("open", stream=EVENTS, consumer="b", starting="latest")
        assert opened["start"] == 3
        bounds = await worker("bounds", stream=EVENTS)
        assert (bounds["start"], bounds["end"]) == (0, 3)
        bounds = await worker("bounds", stream=EVENTS, starting="latest")
        assert (bounds["start"], bounds["end"]) == (3, 3)


async def test_fetch_returns_the_rows_without_headers_by_default() -> None:
    async with running() as (node, _, worker):
        async with node.connect() as producer:
            producer.publish("events/a", b"1", correlation_id="k", headers={"h": "v"})
            producer.publish("other/x", b"skip")
            producer.publish("events/b", b"2")
            producer.publish("events/c", b"3")
        await worker("latest", stream=EVENTS)
        table = await worker.fetch(EVENTS, 0, 3)
        assert table.schema == arrow_schema(False)
        assert rows(table, "offset", "topic", "value", "key") == [
            (0, "events/a", b"1", b"k"),
            (1, "events/b", b"2", None),
            (2, "events/c", b"3", None),
        ]
        assert (await worker.fetch(EVENTS, 1, 2)).column("topic").to_pylist() == ["events/b"]


async def test_fetch_with_headers_adds_the_headers_column() -> None:
    async with running() as (node, _, worker):
        async with node.connect() as producer:
            producer.publish("events/a", b"1", headers={"user": "ada", "n": 7})
            producer.publish("events/b", b"2")
        table = await worker.fetch(EVENTS, 0, 2, headers=True)
        assert table.schema == arrow_schema(True)
        assert table.column("headers").to_pylist() == [
            [{"key": "user", "value": b"ada"}, {"key": "n", "value": b"7"}],
            [],
        ]


async def test_commit_releases_data_and_moves_earliest() -> None:
    async with running() as (node, bridge, worker):
        await worker("open", stream=EVENTS, consumer="a")
        async with node.connect() as producer:
            producer.publish("events/1", b"1")
            producer.publish("events/2", b"2")
            assert (await worker("latest", stream=EVENTS))["next"] == 2  # sealed [0,2)
            producer.publish("events/3", b"3")
            assert (await worker("latest", stream=EVENTS))["next"] == 3  # sealed [2,3)
        await worker("commit", stream=EVENTS, consumer="a", next=2)
        assert (await worker("latest", stream=EVENTS))["earliest"] == 2
        assert bridge.statistics()["streams"]["events/>"][0]["consumers"] == {"a": 2}
        with pytest.raises(OffsetsUnavailableError, match="earliest retained is 2"):
            await worker.fetch(EVENTS, 0, 3, fail=True)  # failOnDataLoss, Kafka's default
        skipped = await worker.fetch(EVENTS, 0, 3)  # failOnDataLoss=false: what is left
        assert skipped.column("offset").to_pylist() == [2]
        assert (await worker.fetch(EVENTS, 2, 3)).column("value").to_pylist() == [b"3"]
        await worker("commit", stream=EVENTS, consumer="a", next=3)
        assert (await worker("bounds", stream=EVENTS))["start"] == 3


async def test_a_request_for_new_filters_creates_a_stream_from_then_on() -> None:
    async with running() as (node, bridge, worker):
        stream = {"subscribe": ["logs/>", "audit/*"]}
        async with node.connect() as producer:
            producer.publish("logs/early", b"before")
            latest = await worker("latest", stream=stream)
            assert latest == {"stream": "audit/*,logs/>", "next": 0, "earliest": 0}
            producer.publish("logs/late", b"after")
            producer.publish("audit/x", b"audit")
            producer.publish("audit/x/y", b"not matched")
        assert (await worker("latest", stream={"subscribe": ["audit/*", "logs/>"]}))["next"] == 2
        table = await worker.fetch(stream, 0, 2)
        assert rows(table, "topic", "value") == [("logs/late", b"after"), ("audit/x", b"audit")]
        assert set(bridge.statistics()["streams"]) == {"events/>", "audit/*,logs/>"}
        assert bridge.stream(subscribe=["logs/>", "audit/*"]).next_offset == 2


async def test_a_request_without_a_valid_stream_is_refused() -> None:
    async with running() as (_, _, worker):
        with pytest.raises(BridgeError, match="not a stream spec"):
            await worker("latest", stream={"subscribe": []})
        with pytest.raises(BridgeError, match="not a stream spec"):
            await worker("bounds")
        with pytest.raises(BridgeError, match="no queue 'missing'"):
            await worker("latest", stream={"queue": "missing"})


# --- queues ----------------------------------------------------------------------------


async def test_queue_messages_stay_unacknowledged_until_committed() -> None:
    async with running() as (node, bridge, worker):
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        async with node.connect() as producer:
            for i in range(3):
                await producer.send(f"orders/{i}", str(i).encode())
        assert (await worker("open", stream=ORDERS, consumer="a"))["start"] == 0
        await until(lambda: bridge.stream(queue="orders").next_offset == 3)
        table = await worker.fetch(ORDERS, 0, 3)
        assert table.column("value").to_pylist() == [b"0", b"1", b"2"]
        await anyio.sleep(0.1)  # five ack rounds: fetching alone acknowledges nothing
        assert queue.usage()[0] == 3
        assert queue_stats(bridge)["unacknowledged"] == 3

        await worker("commit", stream=ORDERS, consumer="a", next=2)
        await until(lambda: queue.usage()[0] == 1)
        assert queue_stats(bridge)["unacknowledged"] == 1
        await worker("commit", stream=ORDERS, consumer="a", next=3)
        await until(lambda: queue.usage()[0] == 0)
        assert queue_stats(bridge)["unacknowledged"] == 0


async def test_a_queue_message_is_acknowledged_only_when_every_consumer_committed() -> None:
    async with running() as (node, bridge, worker):
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        await worker("open", stream=ORDERS, consumer="a")
        await worker("open", stream=ORDERS, consumer="b")
        async with node.connect() as producer:
            await producer.send("orders/1", b"1")
        await until(lambda: bridge.stream(queue="orders").next_offset == 1)
        await worker("commit", stream=ORDERS, consumer="a", next=1)
        await anyio.sleep(0.1)
        assert queue.usage()[0] == 1
        await worker("commit", stream=ORDERS, consumer="b", next=1)
        await until(lambda: queue.usage()[0] == 0)


async def test_a_new_queue_stream_answers_with_what_the_queue_holds() -> None:
    async with running() as (node, _, worker):
        node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        async with node.connect() as producer:
            for i in range(3):
                await producer.send(f"orders/{i}", b"x")
        assert (await worker("latest", stream=ORDERS))["next"] == 3  # no polling needed


async def test_the_queue_window_bounds_what_is_held_for_spark() -> None:
    bridge = SparkBridge(listen="127.0.0.1:0", queue_window=2)
    async with running(bridge) as (node, _, worker):
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        async with node.connect() as producer:
            for i in range(3):
                await producer.send(f"orders/{i}", str(i).encode())
        assert (await worker("latest", stream=ORDERS))["next"] == 2
        assert queue_stats(bridge)["unacknowledged"] == 2
        await worker("commit", stream=ORDERS, consumer="a", next=2)
        await until(lambda: bridge.stream(queue="orders").next_offset == 3)
        assert queue.usage()[0] == 1
        assert (await worker.fetch(ORDERS, 2, 3)).column("value").to_pylist() == [b"2"]


async def test_a_declared_queue_is_captured_once_created() -> None:
    bridge = SparkBridge(queues=["orders"], listen="127.0.0.1:0")
    async with running(bridge) as (node, _, _):
        await anyio.sleep(0.1)
        assert bridge.statistics()["streams"] == {}
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        async with node.connect() as producer:
            await producer.send("orders/1", b"first")
        await until(lambda: queue_stats(bridge).get("captured") == 1)
        assert queue.usage()[0] == 1  # held for Spark, not acknowledged


async def test_a_declared_queue_is_captured_as_it_is_created_with_no_time_passing() -> None:
    # The guaranteed plugin announces each endpoint it creates (meshbus_endpoint_interest):
    # the bridge binds then, instead of looking again after a while.
    clock = ManualClock()
    bridge = SparkBridge(queues=["orders"], listen="127.0.0.1:0")
    async with running(bridge, clock=clock) as (node, _, _):
        await clock.settle()
        node.guaranteed.create_queue("other", subscriptions=["other/>"])
        await clock.settle()
        assert bridge.statistics()["streams"] == {}
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        await clock.settle()
        assert list(bridge.statistics()["streams"]) == ["queue:orders"]
        assert len(queue.flows) == 1
        assert clock.monotonic() == 0


async def test_a_declared_queue_never_created_does_not_hold_the_node_up() -> None:
    bridge = SparkBridge(queues=["never"], listen="127.0.0.1:0")
    with anyio.fail_after(5):
        async with running(bridge) as (node, _, _):
            await anyio.wait_all_tasks_blocked()
            node.guaranteed.create_queue("other")
            await node.guaranteed.delete_queue("other")
    assert bridge.statistics()["streams"] == {}


# --- writing ---------------------------------------------------------------------------


async def test_staged_rows_are_published_directly_with_key_and_headers() -> None:
    async with running() as (node, bridge, worker):
        async with node.connect() as consumer:
            consumer.subscribe("out/>")
            table = pa.table(
                {
                    "topic": ["out/1", "out/2"],
                    "value": [b"one", b"two"],
                    "key": ["k1", None],
                    "headers": pa.array([[{"key": "h", "value": b"v"}], []], HEADERS),
                }
            )
            assert await worker.write(table) == {"status": "published", "rows": 2}
            first, second = await receive(consumer), await receive(consumer)
        assert (first.topic, first.payload, first.correlation_id) == ("out/1", b"one", "k1")
        assert dict(first.headers) == {"h": "v"}
        assert (second.topic, second.payload, second.correlation_id) == ("out/2", b"two", None)
        assert not second.headers
        assert bridge.statistics()["published"] == 2
        assert bridge.statistics()["staged"] == 0


async def test_the_topic_field_of_publish_overrides_the_column() -> None:
    async with running() as (node, _, worker):
        async with node.connect() as consumer:
            consumer.subscribe("fixed/>")
            await worker.write(pa.table({"value": ["v"]}), topic="fixed/t")
            message = await receive(consumer)
        assert (message.topic, message.payload) == ("fixed/t", b"v")


async def test_a_batch_is_published_once_per_sink() -> None:
    async with running() as (node, bridge, worker):
        async with node.connect() as consumer:
            consumer.subscribe("out/>")
            batch0 = pa.table({"topic": ["out/b0"], "value": [b"0"]})
            assert (await worker.write(batch0, sink="s", batch=0))["status"] == "published"
            assert await worker.write(batch0, sink="s", batch=0) == {
                "status": "duplicate",
                "rows": 0,
            }
            assert bridge.statistics()["staged"] == 0  # the duplicate's rows are dropped
            other = pa.table({"topic": ["out/other"], "value": [b"x"]})
            assert (await worker.write(other, sink="t", batch=0))["status"] == "published"
            batch1 = pa.table({"topic": ["out/b1"], "value": [b"1"]})
            assert (await worker.write(batch1, sink="s", batch=1))["status"] == "published"
            assert (await worker.write(batch0, sink="s", batch=0))["status"] == "duplicate"
            topics = [(await receive(consumer)).topic for _ in range(3)]
            with anyio.move_on_after(0.05):
                topics.append((await consumer.receive()).topic)
        assert topics == ["out/b0", "out/other", "out/b1"]
        assert bridge.statistics()["sinks"] == {"s": 1, "t": 0}


async def test_without_a_batch_id_nothing_is_deduplicated() -> None:
    async with running() as (node, bridge, worker):
        async with node.connect() as consumer:
            consumer.subscribe("out/>")
            table = pa.table({"topic": ["out/1"], "value": [b"1"]})
            for _ in range(2):
                answer = await worker.write(table, sink="s", batch=None)
                assert answer["status"] == "published"
            assert [(await receive(consumer)).topic for _ in range(2)] == ["out/1", "out/1"]
        assert bridge.statistics()["sinks"] == {}


async def test_publishing_a_missing_token_is_refused() -> None:
    async with running() as (_, bridge, worker):
        token = await worker.stage(pa.table({"topic": ["out/1"], "value": [b"1"]}))
        with pytest.raises(BridgeError, match="1 staged part"):
            await worker("publish", tokens=[token, "no-such-token"], sink="s", batch=0)
        assert bridge.statistics()["sinks"] == {}
        await worker("discard", tokens=[token])
        assert bridge.statistics()["staged"] == 0
        with pytest.raises(BridgeError, match="gone"):
            await worker("publish", tokens=[token])
        assert bridge.statistics()["published"] == 0


async def test_a_bad_row_fails_the_batch_and_publishes_nothing() -> None:
    async with running() as (node, bridge, worker):
        async with node.connect() as consumer:
            consumer.subscribe("out/>")
            good = await worker.stage(pa.table({"topic": ["out/1"], "value": [b"1"]}))
            bad = await worker.stage(
                pa.table({"topic": ["out/2", None], "value": [b"2", b"3"]}),
            )
            with pytest.raises(BridgeError, match="row 2: topic is null"):
                await worker("publish", tokens=[good, bad], sink="s", batch=0)
            await worker.write(pa.table({"topic": ["out/marker"], "value": [b"m"]}))
            assert (await receive(consumer)).topic == "out/marker"
        assert bridge.statistics()["sinks"] == {}  # Spark's retry is not a duplicate
        assert bridge.statistics()["published"] == 1


async def test_a_table_the_sink_cannot_publish_answers_a_typed_option_error() -> None:
    async with running() as (_, _, worker):
        with pytest.raises(SparkOptionError) as info:
            await worker.write(pa.table({"topic": ["out/1"], "data": [b"1"]}))
        assert info.value.option == "value"


@pytest.mark.parametrize("mode", ["persistent", "non-persistent"])
async def test_guaranteed_modes_land_in_a_queue(mode: str) -> None:
    async with running() as (node, _, worker):
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        plain = pa.table({"topic": ["orders/1", "orders/2"], "value": [b"1", b"2"]})
        keyed = pa.table({"topic": ["orders/3"], "value": [b"3"], "key": ["k3"]})
        assert (await worker.write(plain, mode=mode))["rows"] == 2  # send_many
        assert (await worker.write(keyed, mode=mode))["rows"] == 1  # send, one by one
        assert queue.usage()[0] == 3
        got = []
        async with node.connect() as consumer, await consumer.bind("orders") as flow:
            for _ in range(3):
                with anyio.fail_after(5):
                    message = await flow.receive()
                flow.ack(message)
                got.append((message.topic, message.payload, message.correlation_id))
        assert got == [("orders/1", b"1", None), ("orders/2", b"2", None), ("orders/3", b"3", "k3")]


async def test_sink_state_survives_a_node_restart(tmp_path: Path) -> None:
    table = pa.table({"topic": ["out/1"], "value": [b"1"]})
    async with running(SparkBridge(listen="127.0.0.1:0"), data_dir=tmp_path) as (_, _, worker):
        assert (await worker.write(table, sink="s", batch=4))["status"] == "published"
    assert json.loads((tmp_path / "spark-sinks.json").read_text()) == {"s": 4}
    bridge = SparkBridge(listen="127.0.0.1:0")
    async with running(bridge, data_dir=tmp_path) as (node, _, worker):
        assert bridge.statistics()["sinks"] == {"s": 4}
        async with node.connect() as consumer:
            consumer.subscribe("out/>")
            assert (await worker.write(table, sink="s", batch=4))["status"] == "duplicate"
            assert (await worker.write(table, sink="s", batch=5))["status"] == "published"
            assert (await receive(consumer)).topic == "out/1"
    assert json.loads((tmp_path / "spark-sinks.json").read_text()) == {"s": 5}


async def test_a_bridge_reused_for_a_second_node_run_captures_again() -> None:
    bridge = SparkBridge(subscribe=["events/>"], listen="127.0.0.1:0")
    for run in (1, 2):
        async with running(bridge) as (node, _, worker):
            async with node.connect() as producer:
                for i in range(run):
                    producer.publish(f"events/{i}", b"x")
            latest = await worker("latest", stream=EVENTS)
            assert latest["next"] == run  # each run's stream starts afresh


async def test_without_a_data_dir_no_sink_file_is_written(tmp_path: Path) -> None:
    async with running() as (node, _, worker):
        assert node.data_dir is None
        await worker.write(pa.table({"topic": ["out/1"], "value": [b"1"]}), sink="s", batch=0)
    assert list(tmp_path.iterdir()) == []


# --- errors and lifecycle --------------------------------------------------------------


async def test_an_unknown_op_is_refused_and_the_connection_still_serves() -> None:
    async with running() as (_, bridge, worker):
        with pytest.raises(BridgeError, match="unknown request 'explode'"):
            await worker("explode")
        assert await worker("stats") == json.loads(json.dumps(bridge.statistics()))


def test_a_client_to_a_closed_port_is_unavailable_and_names_the_address() -> None:
    address = f"127.0.0.1:{free_port()}"
    client = NodeClient(NodeTarget(parse_urls(address)), "test")
    with pytest.raises(
        BridgeUnavailableError, match=f"cannot reach the meshbus node at tcp://{address}"
    ):
        client.request("stats")
    assert isinstance(BridgeUnavailableError("x"), BridgeError)


async def test_a_client_of_a_stopped_node_is_unavailable() -> None:
    async with running() as (_, bridge, _):
        connected = Worker(bridge.address)
        await connected("stats")
        address = bridge.address
    try:
        with pytest.raises(BridgeUnavailableError):
            await connected("stats")
        with pytest.raises(BridgeUnavailableError, match="cannot reach the meshbus node"):
            await Worker(address)("stats")
    finally:
        await anyio.to_thread.run_sync(connected.client.close)


async def test_a_node_without_a_bridge_says_so() -> None:
    from meshbus.transports import ListenerSettings, start_server

    async with Node() as node:
        server = await start_server(node, ListenerSettings(port=0))
        with pytest.raises(BridgeUnavailableError, match="serves no Spark connector"):
            await Worker(server.url)("stats")


def test_the_address_is_unknown_before_the_node_runs() -> None:
    with pytest.raises(StateError):
        _ = SparkBridge(listen="127.0.0.1:0").address


async def test_the_address_is_unknown_after_the_node_stops() -> None:
    async with running() as (_, bridge, _):
        assert bridge.address.startswith("tcp://127.0.0.1:")
    with pytest.raises(StateError):
        _ = bridge.address


# --- restarts --------------------------------------------------------------------------


async def test_a_queue_stream_keeps_its_offsets_across_a_node_restart(tmp_path: Path) -> None:
    async with running(SparkBridge(queues=["orders"], listen="127.0.0.1:0"), data_dir=tmp_path) as (
        node,
        bridge,
        worker,
    ):
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        async with node.connect() as producer:
            for i in range(4):
                await producer.send(f"orders/{i}", f"before-{i}".encode())
        await worker("open", stream=ORDERS, consumer="a")
        await until(lambda: bridge.stream(queue="orders").next_offset == 4)
        assert (await worker("latest", stream=ORDERS))["next"] == 4
        await worker("commit", stream=ORDERS, consumer="a", next=2)
        await until(lambda: queue.usage()[0] == 2)

    # The same data directory: the spool still holds two messages, the log four.
    async with running(SparkBridge(queues=["orders"], listen="127.0.0.1:0"), data_dir=tmp_path) as (
        node,
        bridge,
        worker,
    ):
        queue = node.guaranteed.create_queue("orders", subscriptions=["orders/>"])
        async with node.connect() as producer:
            await producer.send("orders/new", b"after")
        await until(lambda: bridge.stream(queue="orders").unacknowledged == 3)
        latest = await worker("latest", stream=ORDERS, position=2, consumer="a")
        assert (latest["earliest"], latest["next"]) == (0, 5)
        table = await worker.fetch(ORDERS, 2, 5)
        assert rows(table, "offset", "value") == [(2, b"before-2"), (3, b"before-3"), (4, b"after")]
        await worker("commit", stream=ORDERS, consumer="a", next=5)
        await until(lambda: queue.usage()[0] == 0)


async def test_staged_writes_are_bounded_in_bytes() -> None:
    table = pa.table({"topic": ["out/1"] * 100, "value": [b"x" * 1000] * 100})
    async with running(SparkBridge(listen="127.0.0.1:0", max_staged_bytes=250_000)) as (
        _,
        bridge,
        worker,
    ):
        tokens = [await worker.stage(table), await worker.stage(table)]
        with pytest.raises(BridgeError, match="max_staged_bytes"):
            await worker.stage(table)
        assert bridge.statistics()["staged"] == 2
        await worker("discard", tokens=tokens)
        await worker.stage(table)  # room again
