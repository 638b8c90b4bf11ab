"""The management API: its views and queue actions, in process and over the transport,
and its access check (the management role, counted when refused)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

import meshbus
from meshbus import LocalLink, ManualClock, Node
from meshbus.errors import AccessDeniedError, ConfigurationError, StateError
from meshbus.transports import (
    MANAGEMENT_SERVICE,
    Management,
    MemoryNetwork,
    RemoteManagement,
    RemoteSession,
    connect,
    start_server,
)

pytestmark = pytest.mark.anyio


def management_node(**options: Any) -> Node:
    """A node whose VPN ``shop`` has ``ops`` (the management role) and ``clerk``."""
    node = Node(name="mgmt", **options)
    shop = node.create_vpn("shop")
    shop.add_user("ops", management=True)
    shop.add_user("clerk")
    return node


def login(network: MemoryNetwork, username: str, **options: Any) -> RemoteSession:
    """A session of ``username`` in VPN ``shop`` (log in with ``async with``)."""
    return connect(network.connectable("mgmt"), vpn="shop", username=username, **options)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Node, MemoryNetwork]]:
    network = MemoryNetwork()
    async with management_node() as node:
        await start_server(node, listener=network.listen("mgmt"))
        yield node, network


# --- the views, in process --------------------------------------------------------------


async def test_the_node_view_names_the_node_and_measures_rates_on_its_clock() -> None:
    clock = ManualClock()
    async with management_node(clock=clock, cluster="c1") as node:
        manage = Management(node)
        session = node.connect("shop")
        session.subscribe("a/>")
        clock.advance(5)
        for _ in range(10):
            session.publish("a/b", b"x")
        while session.receive_nowait() is not None:  # delivered once taken
            pass
        first = manage.node()
        assert (first["name"], first["node_id"], first["cluster"]) == ("mgmt", node.node_id, "c1")
        assert first["version"] == meshbus.__version__
        assert first["uptime"] == 5
        assert first["vpns"] == ["default", "shop"]
        assert first["totals"]["published"] == 10
        assert first["totals"]["delivered"] == 10
        assert first["rates"] == {  # the first call: since the node started
            "window": 5,
            "published_per_second": 2,
            "delivered_per_second": 2,
        }
        clock.advance(4)
        for _ in range(8):
            session.publish("a/b", b"x")
        while session.receive_nowait() is not None:
            pass
        second = manage.node()["rates"]
        assert second == {"window": 4, "published_per_second": 2, "delivered_per_second": 2}
        clock.advance(30)  # long after: the rate since the last call, nothing since
        assert manage.node()["rates"]["window"] == 30
        assert manage.node()["rates"]["published_per_second"] == 0
        assert manage.node()["cpu"]["user_seconds"] >= 0
        memory = manage.node()["memory"]
        assert set(memory) == {"rss_bytes", "peak_rss_bytes"}
        assert memory["rss_bytes"] is None or memory["rss_bytes"] > 1_000_000
        orjson.dumps(manage.node())  # plain data


async def test_connections_list_sessions_with_their_transport_and_counters(
    served: tuple[Node, MemoryNetwork],
) -> None:
    node, network = served
    local = node.connect("shop", client_name="local-app")
    local.subscribe("x/>")
    node.connect(client_name="elsewhere")
    async with login(network, "clerk", client_name="remote-app") as remote:
        remote.subscribe("a/>")
        remote.subscribe("b/>")
        await remote.confirm()
        rows = Management(node).connections("shop")["connections"]
        assert [row["client_name"] for row in rows] == ["local-app", "remote-app"]
        mine, theirs = rows
        assert mine["transport"] is None
        assert mine["address"] is mine["connected_since"] is mine["bytes_sent"] is None
        assert mine["subscriptions"] == 1
        assert theirs["transport"] == "meshbus"
        assert (theirs["vpn"], theirs["username"], theirs["subscriptions"]) == ("shop", "clerk", 2)
        assert theirs["address"] == "client"  # what a MemoryNetwork calls its clients
        assert theirs["bytes_received"] > 0
        assert theirs["bytes_sent"] > 0
        assert theirs["connected_since"] == pytest.approx(node.clock.time(), abs=60)
        everyone = Management(node).connections()["connections"]
        assert [(row["vpn"], row["client_name"]) for row in everyone] == [
            ("default", "elsewhere"),
            ("shop", "local-app"),
            ("shop", "remote-app"),
        ]
        with pytest.raises(StateError, match="no VPN named 'nowhere'"):
            Management(node).connections("nowhere")


async def test_subscriptions_filter_by_vpn_client_and_topic_and_are_bounded() -> None:
    async with management_node() as node:
        first = node.connect("shop", client_name="a")
        second = node.connect("shop", client_name="b")
        node.connect(client_name="c").subscribe("orders/x")
        for n in range(5):
            first.subscribe(f"orders/{n}")
        second.subscribe("stock/>")
        manage = Management(node)
        everything = manage.subscriptions()
        assert everything["total"] == 7
        assert everything["truncated"] is False
        assert everything["subscriptions"][0] == {
            "vpn": "default",
            "client_name": "c",
            "subscription": "orders/x",
        }
        shop = manage.subscriptions("shop", topic="orders", limit=3)
        assert [row["subscription"] for row in shop["subscriptions"]] == [
            "orders/0",
            "orders/1",
            "orders/2",
        ]
        assert (shop["total"], shop["truncated"]) == (5, True)
        only_b = manage.subscriptions("shop", client="b")["subscriptions"]
        assert only_b == [{"vpn": "shop", "client_name": "b", "subscription": "stock/>"}]
        for limit in (0, -1, 100_001, True, "10"):
            with pytest.raises(ConfigurationError, match="limit"):
                manage.subscriptions(limit=limit)  # type: ignore[arg-type]


async def test_queues_view_and_its_answer_without_the_guaranteed_plugin() -> None:
    async with management_node() as node:
        node.guaranteed.create_queue("orders", vpn="shop", subscriptions=["orders/>"])
        node.guaranteed.create_queue("other")
        await node.connect("shop").send("orders/1", b"12345")
        rows = Management(node).queues("shop")["queues"]
        assert [(row["vpn"], row["name"], row["kind"]) for row in rows] == [
            ("shop", "orders", "queue")
        ]
        assert (rows[0]["messages"], rows[0]["bytes"], rows[0]["subscriptions"]) == (
            1,
            5,
            ["orders/>"],
        )
        assert len(Management(node).queues()["queues"]) == 2
    async with Node(plugins=["direct"]) as bare:
        answer = Management(bare).queues()
        assert answer["available"] is False
        assert "'guaranteed' plugin" in answer["reason"]
        assert answer["queues"] == []
        with pytest.raises(ConfigurationError, match="'guaranteed' plugin"):
            await Management(bare).purge_queue("q")


async def test_links_and_listeners_views(served: tuple[Node, MemoryNetwork]) -> None:
    node, _ = served
    near, far = LocalLink.pair(node.vpn("default"), node.vpn("shop"), "to-shop", far_name="in")
    node.vpn("default").links.attach(near)
    node.vpn("shop").links.attach(far)
    manage = Management(node)
    links = manage.links()
    assert [(row["vpn"], row["name"], row["kind"], row["state"]) for row in links["links"]] == [
        ("default", "to-shop", "bridge", "in-sync"),
        ("shop", "in", "bridge", "in-sync"),
    ]
    assert [row["name"] for row in manage.links("shop")["links"]] == ["in"]
    (listener,) = manage.listeners()["listeners"]
    assert listener["url"] == "memory://mgmt"
    assert {"accepted", "open", "logins", "refused", "bytes_received"} <= set(listener)
    orjson.dumps(links)


# --- over the transport ------------------------------------------------------------------


async def test_a_remote_management_user_sees_what_the_node_sees(
    served: tuple[Node, MemoryNetwork],
) -> None:
    node, network = served
    node.guaranteed.create_queue("orders", vpn="shop")
    node.connect("shop", client_name="app").subscribe("orders/>")
    async with login(network, "ops") as ops:
        manage = RemoteManagement(ops)
        local = Management(node)
        assert await manage.subscriptions("shop") == local.subscriptions("shop")
        assert await manage.queues() == local.queues()
        assert await manage.links() == local.links()
        shown = await manage.node()
        assert (shown["name"], shown["version"]) == ("mgmt", meshbus.__version__)
        assert shown["management"]["calls"] >= 3
        rows = (await manage.connections("shop"))["connections"]
        assert [row["client_name"] for row in rows] == ["app", ops.client_name]
        assert (await manage.listeners())["listeners"][0]["url"] == "memory://mgmt"


async def test_queue_actions_act_in_the_callers_vpn(served: tuple[Node, MemoryNetwork]) -> None:
    node, network = served
    async with login(network, "ops") as ops:
        manage = RemoteManagement(ops)
        created = await manage.create_queue("orders", subscriptions=["orders/>"], max_messages=9)
        assert (created["vpn"], created["name"], created["max_messages"]) == ("shop", "orders", 9)
        for n in range(3):
            await ops.send("orders/x", b"%d" % n)
        assert await manage.purge_queue("orders") == {"purged": 3}
        off = await manage.enable_queue("orders", ingress=False, egress=False)
        assert (off["ingress_enabled"], off["egress_enabled"]) == (False, False)
        on = await manage.enable_queue("orders", egress=True)
        assert (on["ingress_enabled"], on["egress_enabled"]) == (False, True)
        assert await manage.delete_queue("orders") == {"deleted": "orders"}
        assert (await manage.queues("shop"))["queues"] == []
        with pytest.raises(StateError, match="no queue 'orders' in VPN 'shop'"):
            await manage.purge_queue("orders")
        with pytest.raises(ConfigurationError, match="max_messages"):
            await manage.create_queue("bad", max_messages=-1)
        node.guaranteed.create_queue("theirs")  # in VPN default
        with pytest.raises(AccessDeniedError, match="managed from a session of it"):
            await ops.call(
                MANAGEMENT_SERVICE, {"op": "purge_queue", "name": "theirs", "vpn": "default"}
            )
        with pytest.raises(ConfigurationError, match="unknown management operation"):
            await ops.call(MANAGEMENT_SERVICE, {"op": "reboot"})
        with pytest.raises(ConfigurationError, match="ingress must be"):
            await ops.call(MANAGEMENT_SERVICE, {"op": "enable_queue", "name": "x", "ingress": 1})
        with pytest.raises(ConfigurationError, match="'vpn' must be a string"):
            await ops.call(MANAGEMENT_SERVICE, {"op": "queues", "vpn": 5})


REFUSED_CALLS = [
    ("node", {}),
    ("connections", {}),
    ("subscriptions", {"limit": 5}),
    ("queues", {}),
    ("links", {}),
    ("listeners", {}),
    ("create_queue", {"name": "q"}),
    ("delete_queue", {"name": "q"}),
    ("purge_queue", {"name": "q"}),
    ("enable_queue", {"name": "q", "ingress": False}),
]


async def test_a_user_without_the_management_role_is_refused_and_counted(
    served: tuple[Node, MemoryNetwork],
) -> None:
    node, network = served
    node.guaranteed.create_queue("q", vpn="shop")
    async with login(network, "clerk") as clerk:
        for op, args in REFUSED_CALLS:
            with pytest.raises(AccessDeniedError, match="manage denied for user 'clerk'"):
                await clerk.call(MANAGEMENT_SERVICE, {"op": op, **args})
        with pytest.raises(AccessDeniedError):
            await RemoteManagement(clerk).node()
        # What the clerk sees of its own VPN counts the refusals...
        stats = await clerk.node_statistics()
        assert stats["vpns"]["shop"]["denied"] == len(REFUSED_CALLS) + 1
    # ...and the node view counts them apart from the calls it served.
    shown = Management(node).node()
    assert shown["management"] == {"calls": 0, "refused": len(REFUSED_CALLS) + 1}
    assert shown["totals"]["denied"] == len(REFUSED_CALLS) + 1
    assert Management(node).queues("shop")["queues"][0]["ingress_enabled"] is True  # unchanged


async def test_every_listener_of_a_node_serves_the_one_service() -> None:
    network = MemoryNetwork()
    async with management_node() as node:
        await start_server(node, listener=network.listen("mgmt"))
        await start_server(node, listener=network.listen("second"))
        handler = node.find_service(MANAGEMENT_SERVICE)
        assert handler is not None
        async with connect(network.connectable("second"), vpn="shop", username="ops") as ops:
            listeners = (await RemoteManagement(ops).listeners())["listeners"]
        assert [row["url"] for row in listeners] == ["memory://mgmt", "memory://second"]
