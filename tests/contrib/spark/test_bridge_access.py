"""Who may use a node's Spark bridge, and how streams split into partitions.

Spark's processes reach the bridge as clients of the node (no Spark here): they log in
with the VPN's credentials, over TLS when the listener has it, and the caller's ACL
decides which streams it may read and which topics it may write.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pyarrow as pa
import pytest

from meshbus import (
    DEFAULT_PLUGINS,
    AccessDeniedError,
    AclAction,
    AclProfile,
    AuthenticationError,
    ConfigurationError,
    Node,
)
from meshbus.contrib.spark import BridgeError, BridgeUnavailableError, SparkBridge
from meshbus.contrib.spark._client import NodeClient, NodeTarget
from meshbus.contrib.spark._options import parse_urls
from meshbus.contrib.spark._service import FETCH_BYTES
from meshbus.contrib.spark._streams import partition_of
from meshbus.transports import ListenerSettings, TlsSettings
from meshbus.transports.certs import make_ca, make_server_certificate

pytestmark = pytest.mark.anyio


def plant_node(**options: Any) -> Node:
    """A node whose VPN ``plant`` checks passwords; ``reader`` may read ``meters/>`` only."""
    node = Node(plugins=[*DEFAULT_PLUGINS, *options.pop("plugins", ())], **options)
    vpn = node.create_vpn("plant", authentication="basic")
    vpn.add_acl_profile(
        AclProfile(
            "meters-only",
            publish_default=AclAction.DENY,
            publish_exceptions=["reports/>"],
            subscribe_default=AclAction.DENY,
            subscribe_exceptions=["meters/>"],
        )
    )
    vpn.add_user("spark", password="bridge-pw")
    vpn.add_user("reader", password="reader-pw", acl_profile="meters-only")
    return node


@asynccontextmanager
async def plant(**bridge_options: Any) -> AsyncIterator[tuple[Node, SparkBridge]]:
    bridge = SparkBridge(vpn="plant", username="spark", password="bridge-pw", **bridge_options)
    async with plant_node(plugins=[bridge]) as node:
        yield node, bridge


async def call(target: NodeTarget, op: str, body: bytes = b"", **fields: Any) -> Any:
    """The answer's fields of one request."""
    client = NodeClient(target, f"test-{id(target)}")
    try:
        request = functools.partial(client.request, op, body, **fields)
        return (await anyio.to_thread.run_sync(request))[0]
    finally:
        await anyio.to_thread.run_sync(client.close)


def target(bridge: SparkBridge, **fields: Any) -> NodeTarget:
    return NodeTarget(parse_urls(bridge.address), **fields)


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


# --- logging in ------------------------------------------------------------------------


async def test_a_wrong_password_is_refused_with_a_message_naming_the_node_and_user() -> None:
    async with plant() as (_, bridge):
        wrong = target(bridge, vpn="plant", username="reader", password="nope")
        with pytest.raises(AuthenticationError, match="refused the login of 'reader'"):
            await call(wrong, "stats")


async def test_a_caller_of_another_vpn_is_told_which_vpn_the_bridge_serves() -> None:
    async with plant() as (_, bridge):
        with pytest.raises(BridgeError, match="serves VPN 'plant'"):
            await call(target(bridge), "latest", stream={"subscribe": ["meters/>"]})


async def test_an_untrusted_server_certificate_fails_at_connect_naming_the_address(
    tmp_path: Path,
) -> None:
    ca = make_ca(tmp_path / "pki")
    server = make_server_certificate(tmp_path / "pki")
    other_ca = make_ca(tmp_path / "other", name="another CA")
    listener = ListenerSettings(
        port=0, tls=TlsSettings(certificate=server.certificate, private_key=server.private_key)
    )
    async with plant(listen=listener) as (_, bridge):
        assert bridge.address.startswith("tls://127.0.0.1:")
        good = target(bridge, vpn="plant", username="reader", password="reader-pw")
        trusted = NodeTarget(good.urls, "plant", "reader", "reader-pw", tls_ca=str(ca.certificate))
        assert "streams" in await call(trusted, "stats")
        untrusted = NodeTarget(
            good.urls, "plant", "reader", "reader-pw", tls_ca=str(other_ca.certificate)
        )
        with pytest.raises(
            BridgeUnavailableError, match=f"cannot reach the meshbus node at {bridge.address}"
        ) as info:
            await call(untrusted, "stats")
        assert "certificate not trusted" in str(info.value)
        assert "'tlsCa'" in str(info.value)


# --- the caller's ACL ------------------------------------------------------------------


async def test_a_stream_needs_the_right_to_subscribe_to_each_filter() -> None:
    async with plant() as (_node, bridge):
        reader = target(bridge, vpn="plant", username="reader", password="reader-pw")
        opened = await call(reader, "open", stream={"subscribe": ["meters/>"]}, consumer="c")
        assert opened["start"] == {"0": 0}
        with pytest.raises(AccessDeniedError, match="secrets/>"):
            await call(
                reader, "open", stream={"subscribe": ["meters/>", "secrets/>"]}, consumer="c"
            )
        with pytest.raises(AccessDeniedError):
            await call(reader, "fetch", stream={"subscribe": ["secrets/>"]}, start=0, end=1)


async def test_a_write_needs_the_right_to_publish_to_every_row_topic() -> None:
    async with plant() as (_node, bridge):
        reader = target(bridge, vpn="plant", username="reader", password="reader-pw")
        allowed = pa.table({"topic": ["reports/1"], "value": [b"ok"]})
        token = (await call(reader, "stage", ipc(allowed)))["token"]
        assert (await call(reader, "publish", tokens=[token]))["status"] == "published"
        mixed = pa.table({"topic": ["reports/2", "meters/9"], "value": [b"ok", b"no"]})
        token = (await call(reader, "stage", ipc(mixed)))["token"]
        with pytest.raises(AccessDeniedError, match="meters/9"):
            await call(reader, "publish", tokens=[token])
        assert bridge.statistics()["published"] == 1  # nothing of the refused write


# --- listeners and advertised addresses -----------------------------------------------


async def test_a_bridge_on_all_interfaces_needs_an_advertised_address() -> None:
    bridge = SparkBridge(listen="0.0.0.0:0")
    with pytest.raises(ConfigurationError, match="advertise="):
        async with Node(plugins=[*DEFAULT_PLUGINS, bridge]):
            pass
    bridge = SparkBridge(listen="0.0.0.0:0", advertise="tcp://spark-gw.example:7000")
    async with Node(plugins=[*DEFAULT_PLUGINS, bridge]):
        assert bridge.address == "tcp://spark-gw.example:7000"


async def test_without_a_listener_of_its_own_the_bridge_gives_the_nodes() -> None:
    from meshbus.transports import ListenerSettings, start_server

    bridge = SparkBridge(listen=None)
    async with Node(plugins=[*DEFAULT_PLUGINS, bridge]) as node:
        with pytest.raises(ConfigurationError, match="no listener"):
            _ = bridge.address
        server = await start_server(node, ListenerSettings(port=0))
        assert bridge.address == server.url
        assert (await call(NodeTarget((server.url,)), "stats"))["streams"] == {}


# --- partitions ------------------------------------------------------------------------


async def test_a_stream_splits_into_partitions_by_key_else_topic() -> None:
    async with Node(plugins=[*DEFAULT_PLUGINS, SparkBridge(listen="127.0.0.1:0")]) as node:
        bridge = next(p for p in node.plugins.plugins() if isinstance(p, SparkBridge))
        anyone = NodeTarget(parse_urls(bridge.address))
        spec = {"subscribe": ["m/>"], "partitions": 3}
        assert (await call(anyone, "open", stream=spec, consumer="c"))["start"] == {
            "0": 0,
            "1": 0,
            "2": 0,
        }
        async with node.connect() as producer:
            sent = []
            for i in range(60):
                key = f"k{i % 7}" if i % 2 else None
                producer.publish(f"m/{i % 5}", str(i).encode(), correlation_id=key)
                sent.append((f"m/{i % 5}", str(i).encode(), key))
        latest = await call(anyone, "latest", stream=spec)
        assert latest["stream"] == "m/>#3"
        counts = latest["next"]
        assert sum(counts.values()) == 60
        assert all(counts[p] > 0 for p in "012")
        seen: dict[int, list[tuple[str, bytes, str | None]]] = {}
        for p in range(3):
            _answer, body = await anyio.to_thread.run_sync(
                functools.partial(
                    NodeClient(anyone, "test-partitions").request,
                    "fetch",
                    stream=spec,
                    partition=p,
                    start=0,
                    end=counts[str(p)],
                )
            )
            table = pa.ipc.open_stream(body).read_all()
            assert table.column("partition").to_pylist() == [p] * table.num_rows
            assert table.column("offset").to_pylist() == list(range(table.num_rows))
            keys = [None if k is None else k.decode() for k in table.column("key").to_pylist()]
            seen[p] = list(
                zip(
                    table.column("topic").to_pylist(),
                    table.column("value").to_pylist(),
                    keys,
                    strict=True,
                )
            )
        for p, rows in seen.items():
            for topic, _value, key in rows:
                assert partition_of_row(topic, key, 3) == p
        # Each partition keeps the publish order of its messages.
        for rows in seen.values():
            assert rows == [r for r in sent if r in rows]


def partition_of_row(topic: str, key: str | None, partitions: int) -> int:
    from meshbus import Message

    return partition_of(Message(topic, b"", correlation_id=key), partitions)


async def test_a_large_fetch_comes_in_answers_of_a_few_megabytes() -> None:
    payload = b"x" * 100_000
    rows = FETCH_BYTES * 3 // len(payload)
    async with Node(
        plugins=[*DEFAULT_PLUGINS, SparkBridge(listen="127.0.0.1:0", subscribe=["big/>"])]
    ) as node:
        bridge = next(p for p in node.plugins.plugins() if isinstance(p, SparkBridge))
        anyone = NodeTarget(parse_urls(bridge.address))
        async with node.connect() as producer:
            for _ in range(rows):
                producer.publish("big/1", payload)
        spec = {"subscribe": ["big/>"]}
        end = (await call(anyone, "latest", stream=spec))["next"]["0"]
        assert end == rows
        client = NodeClient(anyone, "test-big")
        start, answers, got = 0, 0, 0
        while start < end:
            answer, body = await anyio.to_thread.run_sync(
                functools.partial(client.request, "fetch", stream=spec, start=start, end=end)
            )
            assert len(body) <= FETCH_BYTES + 2 * len(payload)
            got += pa.ipc.open_stream(body).read_all().num_rows
            start = answer["until"]
            answers += 1
        assert got == rows
        assert answers >= 3


async def test_a_fetch_cut_to_its_budget_returns_contiguous_rows() -> None:
    payload = b"y" * 70_001  # sizes that do not divide the budget evenly
    bridge = SparkBridge(listen="127.0.0.1:0", subscribe=["seg/>"])
    async with Node(plugins=[*DEFAULT_PLUGINS, bridge]) as node:
        anyone = NodeTarget(parse_urls(bridge.address))
        spec = {"subscribe": ["seg/>"]}
        async with node.connect() as producer:
            for _ in range(5):  # five sealed segments of 60 rows (about 4 MB) each
                for _ in range(60):
                    producer.publish("seg/1", payload)
                await anyio.wait_all_tasks_blocked()
                bridge.stream(subscribe=["seg/>"]).seal()
        end = (await call(anyone, "latest", stream=spec))["next"]["0"]
        client = NodeClient(anyone, "test-segments")
        start, offsets = 0, []
        while start < end:
            answer, body = await anyio.to_thread.run_sync(
                functools.partial(client.request, "fetch", stream=spec, start=start, end=end)
            )
            got = pa.ipc.open_stream(body).read_all().column("offset").to_pylist()
            assert got == list(range(start, start + len(got)))  # no row skipped
            offsets += got
            start = answer["until"]
        assert offsets == list(range(end))
