"""Bridges (SPEC 7) on the in-memory mesh and between two VPNs of one node."""

from __future__ import annotations

import logging

import anyio
import pytest

from meshbus import ClientProfile, ConfigurationError, DeliveryMode, LinkState, Message, Node
from meshbus.abc import Flow
from meshbus.plugins import hopcount
from meshbus.plugins.bridge import BridgeSettings, TopicMapping, bridges, open_bridge, totals
from meshbus.plugins.hopcount import HopCountSettings
from meshbus.transports import Remote, TlsSettings, connect
from meshbus.transports._compression import ALGORITHMS
from meshbus.transports.testing import Mesh, allow_bridges

pytestmark = pytest.mark.anyio


def bridgeable(vpn):  # type: ignore[no-untyped-def]
    """``vpn``, whose default client profile lets bridges log in (SPEC 7)."""
    allow_bridges(vpn)
    return vpn


def reader(node: Node, vpn: str = "default", topic_filter: str = ">"):  # type: ignore[no-untyped-def]
    session = node.vpn(vpn).open_session(client_name=f"reader-{vpn}")
    session.subscribe(topic_filter)
    return session


def drain(session) -> list[Message]:  # type: ignore[no-untyped-def]
    return list(iter(session.receive_nowait, None))


async def start_pair(mesh: Mesh) -> tuple[Node, Node]:
    return await mesh.start("local"), await mesh.start("remote")


async def asking_for_a(mesh: Mesh):  # type: ignore[no-untyped-def]
    """Node ``local`` bridged to ``remote`` for ``a/>``, in sync: the far node, the
    bridge, a reader of everything on ``local`` and a publisher on ``remote``."""
    local, far = await start_pair(mesh)
    bridge = open_bridge(local.vpn(), remote_bridge(mesh, subscriptions=["a/>"]))
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    return far, bridge, reader(local), far.connect(client_name="pub")


async def test_a_one_way_bridge_brings_what_its_subscriptions_ask_for(mesh: Mesh) -> None:
    far, bridge, everything, publisher = await asking_for_a(mesh)
    for i in range(100):
        publisher.publish("a/x", b"%d" % i)
        publisher.publish("b/x", b"%d" % i)
    await mesh.clock.settle()
    got = drain(everything)
    assert [m.topic for m in got] == ["a/x"] * 100
    assert [m.payload for m in got] == [b"%d" % i for i in range(100)]
    assert {m.sender for m in got} == {"pub"}
    (accepted,) = far.vpn().links
    assert (accepted.statistics().forwarded, bridge.link.statistics().received) == (100, 100)

    bridge.add_subscription("b/>")
    bridge.remove_subscription("a/>")
    assert bridge.subscriptions == ("b/>",)
    await mesh.clock.settle()
    publisher.publish("a/x", b"no longer")
    publisher.publish("b/x", b"now")
    await mesh.clock.settle()
    assert [(m.topic, m.payload) for m in drain(everything)] == [("b/x", b"now")]


async def consume(mesh: Mesh, flow: Flow, count: int) -> list[Message]:
    """Receive and ack ``count`` messages of ``flow`` (within 10 minutes of clock time)."""
    got: list[Message] = []

    async def receive() -> None:
        while True:
            message = await flow.receive()
            got.append(message)
            flow.ack(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(receive)
        await mesh.clock.wait_for(lambda: len(got) == count, within=600)
        tg.cancel_scope.cancel()
    return got


def remote_bridge(mesh: Mesh, name: str = "to-remote", **options: object) -> BridgeSettings:
    """A bridge from node ``local`` dialling node ``remote`` over the mesh's network."""
    target = mesh.network.connectable("remote", source="local")
    return BridgeSettings(name, remotes=[target], **options)  # type: ignore[arg-type]


async def test_what_was_published_before_the_remote_stops_still_arrives(mesh: Mesh) -> None:
    # The remote's link had written the messages when its node stopped: they come.
    # On the in-memory network they were lost, on asyncio, before its writes took
    # the bytes ahead of their yield (test_memory_network.py).
    _, _, everything, publisher = await asking_for_a(mesh)
    for i in range(100):
        publisher.publish("a/x", b"%d" % i)
    await mesh.stop("remote")
    await mesh.clock.settle()
    assert [m.payload for m in drain(everything)] == [b"%d" % i for i in range(100)]


async def test_topics_are_mapped_both_ways(mesh: Mesh) -> None:
    local, far = await start_pair(mesh)
    mappings = [
        TopicMapping("plant/*/temp", mode="SUB", destination="site/${site}/{2}"),
        TopicMapping(
            "cmd/>", mode="PUB", destination="to/${bridge.name}/{2-#}", excludes=["cmd/debug/>"]
        ),
        TopicMapping("deep/>", mode="SUB", destination="x/{4}"),
    ]
    bridge = open_bridge(
        local.vpn(), remote_bridge(mesh, topics=mappings, variables={"site": "s1"})
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    await mesh.clock.settle()
    here, there = reader(local), reader(far)

    far.connect().publish("plant/press/temp", b"21")
    far.connect().publish("deep/a", b"too short for {4}")
    local.connect().publish("cmd/start/now", b"go")
    local.connect().publish("cmd/debug/x", b"stays here")
    await mesh.clock.settle()

    assert sorted((m.topic, m.payload) for m in drain(here)) == [
        ("cmd/debug/x", b"stays here"),
        ("cmd/start/now", b"go"),
        ("site/s1/press", b"21"),
    ]
    assert [(m.topic, m.payload) for m in drain(there)][-1] == ("to/to-remote/start/now", b"go")
    dropped = bridge.link.statistics().dropped
    assert (dropped["excluded"], dropped["topic_too_short"]) == (1, 1)


async def test_two_vpns_of_one_node_are_bridged_in_process() -> None:
    async with Node(node_id="n1") as node:
        office = bridgeable(node.create_vpn("office"))
        bridge = open_bridge(
            node.vpn(),
            BridgeSettings(
                "to-office",
                remote_vpn="office",
                subscriptions=["orders/>"],
                topics=[TopicMapping("alarms/>", mode="PUB", destination="plant/{#}")],
            ),
        )
        assert bridge.state is LinkState.IN_SYNC
        here, there = reader(node), reader(node, "office")
        office.open_session(client_name="clerk").publish("orders/7", b"7 chairs")
        node.vpn().open_session(client_name="press").publish("alarms/fire", b"!")
        assert [(m.topic, m.sender, m.hop_count) for m in drain(here)] == [
            ("orders/7", "clerk", 1),
            ("alarms/fire", "press", 0),
        ]
        assert [m.topic for m in drain(there)] == ["orders/7", "plant/alarms/fire"]

        bridge.add_subscription("invoices/>")
        office.open_session().publish("invoices/1", b"$")
        assert [m.topic for m in drain(here)] == ["invoices/1"]
        bridge.stop()
        assert bridge.state is LinkState.DISABLED
        assert len(office.links) == len(node.vpn().links) == 0


async def test_two_bridges_both_ways_deliver_each_publish_once(mesh: Mesh) -> None:
    a, b = await mesh.start("a"), await mesh.start("b")
    net = mesh.network
    to_b = open_bridge(
        a.vpn(),
        BridgeSettings("to-b", remotes=[net.connectable("b", source="a")], subscriptions=[">"]),
    )
    to_a = open_bridge(
        b.vpn(),
        BridgeSettings("to-a", remotes=[net.connectable("a", source="b")], subscriptions=[">"]),
    )
    await mesh.clock.wait_for(lambda: to_a.state is to_b.state is LinkState.IN_SYNC, within=10)
    on_a, on_b = reader(a), reader(b)
    a.connect().publish("t", b"once")
    await mesh.clock.settle()
    assert (len(drain(on_a)), len(drain(on_b))) == (1, 1)
    # b sends it back as its second crossing; a's bridge, which judges it, drops it.
    assert to_b.statistics().dropped == {"hop_limit": 1}
    assert to_a.statistics().dropped == {}


async def test_a_bad_bridge_is_refused_with_every_problem(mesh: Mesh) -> None:
    local = await mesh.start("local")
    settings = remote_bridge(
        mesh,
        topics=[
            TopicMapping("*/*", destination="{3}/${who}"),
            TopicMapping("a/>", mode="PUB", destination="{1-#}x"),
        ],
    )
    with pytest.raises(ConfigurationError) as caught:
        open_bridge(local.vpn(), settings)
    text = str(caught.value)
    assert "{3} reaches level 3" in text
    assert "unknown variable ${who}" in text
    assert "stands for whole levels" in text
    assert len(local.vpn().links) == 0  # nothing half-started

    with pytest.raises(ConfigurationError, match="no other VPN 'nowhere'"):
        open_bridge(local.vpn(), BridgeSettings("x", remote_vpn="nowhere"))
    with pytest.raises(ValueError, match="without '/'"):
        BridgeSettings("a/b")


async def test_a_same_node_bridge_logs_in_as_a_bridge_on_the_other_vpn() -> None:
    # Before, a bridge between two VPNs of a node logged in nowhere: the other VPN's
    # client profile was never asked whether it allows bridge connections.
    async with Node() as node:
        office = node.create_vpn("office")
        with pytest.raises(ConfigurationError) as caught:
            open_bridge(node.vpn(), BridgeSettings("x", remote_vpn="office"))
        assert str(caught.value) == (
            "bridge 'x': VPN 'office' refuses bridges: the client profile 'default' of "
            "username 'default' does not allow bridge connections"
        )
        locked = node.create_vpn("locked", authentication="basic")
        with pytest.raises(ConfigurationError, match="no username 'bridger'"):
            open_bridge(node.vpn(), BridgeSettings("y", remote_vpn="locked", username="bridger"))
        office.add_client_profile(ClientProfile("bridges", allow_bridge_connections=True))
        office.add_user("bridger", client_profile="bridges", enabled=False)
        with pytest.raises(ConfigurationError, match="'bridger' of VPN 'office' is disabled"):
            open_bridge(node.vpn(), BridgeSettings("z", remote_vpn="office", username="bridger"))
        office.add_user("bridger", client_profile="bridges")
        bridge = open_bridge(
            node.vpn(), BridgeSettings("z", remote_vpn="office", username="bridger")
        )
        assert bridge.state is LinkState.IN_SYNC
        assert len(node.vpn().links) == 1  # nothing half-started
        assert len(locked.links) == 0


async def test_the_plugin_must_be_loaded() -> None:
    async with Node(plugins=["direct"]) as node:
        node.create_vpn("b")
        with pytest.raises(ConfigurationError, match="does not load plugin 'bridge'"):
            open_bridge(node.vpn(), BridgeSettings("x", remote_vpn="b"))


async def test_guaranteed_messages_wait_on_the_remote_until_the_local_queue_has_room(
    mesh: Mesh,
) -> None:
    local, far = await start_pair(mesh)
    far.guaranteed.create_queue("Q", subscriptions=["g/>"])
    local.guaranteed.create_queue("L", subscriptions=["g/>"], max_messages=100)
    bridge = open_bridge(
        local.vpn(), remote_bridge(mesh, queues=["Q"], window=10, subscriptions=["d/>"])
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    watcher = reader(local, topic_filter="d/>")
    sender = far.connect(client_name="shop")
    for i in range(300):
        await sender.send(f"g/{i}", b"%d" % i)
    await mesh.clock.run(5)  # retries of the refused 101st, each second

    held = local.guaranteed.queue("L").usage()[0]
    waiting = far.guaranteed.queue("Q").usage()[0]
    assert held == 100
    assert 300 - 100 - 10 <= waiting <= 300 - 100  # at most a window in flight
    assert bridge.link.statistics().receive_failures >= 1  # refused, and tried again
    far.connect().publish("d/1", b"direct keeps flowing")
    await mesh.clock.settle()
    assert [m.payload for m in drain(watcher)] == [b"direct keeps flowing"]

    flow = await local.connect(client_name="warehouse").bind("L")
    got = await consume(mesh, flow, 300)
    assert [m.payload for m in got] == [b"%d" % i for i in range(300)]
    assert not any(m.redelivered for m in got)
    await mesh.clock.settle()
    assert far.guaranteed.queue("Q").usage()[0] == 0


async def test_a_bridge_that_subscribes_and_pulls_a_queue_takes_each_message_once(
    mesh: Mesh,
) -> None:
    # Its direct subscription matches the queue's messages too: their direct copies
    # do not cross beside them (the far end's link has Q as its endpoint), and L,
    # refusing at first, gets each message itself, once, not a direct copy of it.
    local, far = await start_pair(mesh)
    far.guaranteed.create_queue("Q", subscriptions=["g/>"])
    local.guaranteed.create_queue("L", subscriptions=["g/>"])
    local.guaranteed.enable_queue("L", ingress=False)
    bridge = open_bridge(
        local.vpn(), remote_bridge(mesh, queues=["Q"], window=10, subscriptions=[">"])
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    watcher = reader(local, topic_filter="g/>")
    sender = far.connect(client_name="shop")
    for i in range(20):
        await sender.send(f"g/{i}", b"%d" % i)
    await mesh.clock.run(3)  # refused, and offered again
    assert local.guaranteed.queue("L").usage()[0] == 0
    local.guaranteed.enable_queue("L", ingress=True)
    flow = await local.connect(client_name="warehouse").bind("L")
    got = await consume(mesh, flow, 20)
    assert [(m.payload, m.delivery_mode, m.redelivered) for m in got] == [
        (b"%d" % i, DeliveryMode.PERSISTENT, False) for i in range(20)
    ]
    await mesh.clock.settle()
    assert far.guaranteed.queue("Q").usage()[0] == 0
    assert [m.payload for m in drain(watcher)] == [b"%d" % i for i in range(20)]
    assert bridge.link.statistics().dropped.get("duplicate", 0) == 0


async def test_a_same_node_bridge_moves_guaranteed_messages_between_its_vpns(
    mesh: Mesh,
) -> None:
    node = await mesh.start("solo")
    bridgeable(node.create_vpn("office"))
    node.guaranteed.create_queue("Q", vpn="office", subscriptions=["g/>"])
    node.guaranteed.create_queue("L", subscriptions=["g/>"], max_messages=50)
    bridge = open_bridge(
        node.vpn(), BridgeSettings("x", remote_vpn="office", queues=["Q"], window=20)
    )
    assert bridge.state is LinkState.IN_SYNC
    sender = node.connect("office")
    for i in range(120):
        await sender.send(f"g/{i}", b"%d" % i)
    await mesh.clock.run(5)  # the 51st is refused, and offered again each second
    assert node.guaranteed.queue("L").usage()[0] == 50
    assert 120 - 50 - 20 <= node.guaranteed.queue("Q", vpn="office").usage()[0] <= 70
    assert bridge.statistics().receive_failures >= 1

    flow = await node.connect(client_name="clerk").bind("L")
    got = await consume(mesh, flow, 120)
    assert [m.payload for m in got] == [b"%d" % i for i in range(120)]
    assert {(m.redelivered, m.hop_count) for m in got} == {(False, 1)}
    await mesh.clock.settle()
    assert node.guaranteed.queue("Q", vpn="office").usage()[0] == 0
    bridge.stop()
    await mesh.clock.settle()
    assert len(node.vpn("office").links) == 0


async def test_a_same_node_bridge_drains_a_queue_of_a_vpn_with_passwords(mesh: Mesh) -> None:
    # The flow was bound by a session logged in as 'default' without a password: a
    # VPN with basic authentication refused it, and the error ended the node.
    node = await mesh.start("solo")
    office = bridgeable(node.create_vpn("office", authentication="basic"))
    node.guaranteed.create_queue("Q", vpn="office", subscriptions=["g/>"])
    node.guaranteed.create_queue("L", subscriptions=["g/>"])
    open_bridge(node.vpn(), BridgeSettings("x", remote_vpn="office", queues=["Q"]))
    sender = office.open_internal_session("sender")  # stands for a client with a password
    await sender.send("g/1", b"across")
    await mesh.clock.settle()
    assert node.guaranteed.queue("L").usage()[0] == 1
    assert node.running


async def test_a_two_way_exchange_is_counted_exactly(mesh: Mesh) -> None:
    local, far = await start_pair(mesh)
    bridge = open_bridge(
        local.vpn(),
        remote_bridge(
            mesh, subscriptions=["to-local/>"], topics=[TopicMapping("to-remote/>", mode="PUB")]
        ),
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    await mesh.clock.settle()
    here, there = reader(local, topic_filter="to-local/>"), reader(far, topic_filter="to-remote/>")
    for i in range(100):
        far.connect().publish("to-local/x", b"%d" % i)
    for i in range(50):
        local.connect().publish("to-remote/x", b"%d" % i)
    await mesh.clock.settle()
    assert (len(drain(here)), len(drain(there))) == (100, 50)

    stats = bridge.statistics()
    assert (stats.connects, stats.connect_failures, stats.disconnects) == (1, 0, 0)
    assert (stats.forwarded, stats.forward_failures) == (50, 0)
    assert (stats.received, stats.receive_failures) == (100, 0)
    assert stats.dropped == {}
    total = totals(local)
    latency = {k: total.pop(k) for k in list(total) if k.startswith("forward_latency.")}
    assert sum(latency.values()) == 50  # each forwarded message timed once
    assert total == {
        "connects": 1,
        "connect_failures": 0,
        "disconnects": 0,
        "forwarded": 50,
        "forward_failures": 0,
        "received": 100,
        "receive_failures": 0,
    }
    assert bridges(local.vpn()) == [bridge]


async def test_a_same_node_bridge_counts_both_directions() -> None:
    async with Node() as node:
        office = bridgeable(node.create_vpn("office"))
        bridge = open_bridge(
            node.vpn(),
            BridgeSettings(
                "to-office",
                remote_vpn="office",
                subscriptions=["in/>"],
                topics=[TopicMapping("out/>", mode="PUB", excludes=["out/secret"])],
            ),
        )
        for _ in range(3):
            office.open_session().publish("in/x", b"")
        node.vpn().open_session().publish("out/x", b"")
        node.vpn().open_session().publish("out/secret", b"")
        stats = bridge.statistics()
        assert (stats.forwarded, stats.received) == (4, 3)  # 3 in, 1 out
        assert stats.dropped == {"excluded": 1}


@pytest.mark.parametrize("hidden", [False, True], ids=["shown", "hidden-from-clients"])
async def test_guaranteed_messages_pulled_over_a_bridge_count_their_hops(
    mesh: Mesh, hidden: bool
) -> None:
    # edge -> middle -> local, each step a bridge pulling a queue (limit 1 on the last).
    edge, middle, local = [await mesh.start(n) for n in ("edge", "middle", "local")]
    # Hiding the hop count from client sessions must not hide it from links.
    hopcount.configure(middle, HopCountSettings(hide_from_clients=hidden))
    edge.guaranteed.create_queue("E", subscriptions=["g/>"])
    middle.guaranteed.create_queue("M", subscriptions=["g/>"])
    local.guaranteed.create_queue("L", subscriptions=["g/>"])
    first = open_bridge(
        middle.vpn(),
        BridgeSettings(
            "from-edge",
            remotes=[mesh.network.connectable("edge", source="middle")],
            queues=["E"],
            hop_count_limit=2,
        ),
    )
    second = open_bridge(
        local.vpn(),
        BridgeSettings(
            "from-middle",
            remotes=[mesh.network.connectable("middle", source="local")],
            queues=["M"],
        ),
    )
    await mesh.clock.wait_for(lambda: first.state is second.state is LinkState.IN_SYNC, within=10)
    await edge.connect().send("g/far", b"two bridges away")
    await middle.connect().send("g/near", b"one bridge away")
    await mesh.clock.settle()

    assert local.guaranteed.queue("L").usage()[0] == 1
    flow = await local.connect().bind("L")
    message = await flow.receive()
    assert (message.payload, message.hop_count) == (b"one bridge away", 1)
    # The other crossed its second bridge above the limit: dropped, counted, and
    # let go of on the middle node, not left in its queue.
    assert second.statistics().dropped == {"hop_limit": 1}
    assert middle.guaranteed.queue("M").usage()[0] == 0
    assert edge.guaranteed.queue("E").usage()[0] == 0


async def test_a_bridge_fails_over_in_connect_order_and_back(mesh: Mesh) -> None:
    local, first, second = [await mesh.start(n) for n in ("local", "first", "second")]
    network = mesh.network
    mesh.network.partition("local", "first")
    bridge = open_bridge(
        local.vpn(),
        BridgeSettings(
            "replicas",
            remotes=[network.connectable(n, source="local") for n in ("first", "second")],
            subscriptions=["a/>"],
            fail_back_interval=30.0,
        ),
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    assert bridge.link.peer_node == "second"  # the first did not answer: the next one
    everything = reader(local)

    network.heal("local", "first")
    await mesh.clock.run(25)
    assert bridge.link.peer_node == "second"  # not before the interval
    await mesh.clock.wait_for(
        lambda: bridge.link.peer_node == "first" and bridge.state is LinkState.IN_SYNC,
        within=10,
    )
    await mesh.clock.settle()
    assert len(second.vpn().links) == 0  # the connection to the second is closed
    assert network.connections("local", "second") == 0
    first.connect().publish("a/1", b"from the first again")
    second.connect().publish("a/2", b"not from the second")
    await mesh.clock.settle()
    assert [m.payload for m in drain(everything)] == [b"from the first again"]

    network.partition("local", "first")  # and over again when the first goes
    await mesh.clock.wait_for(
        lambda: bridge.link.peer_node == "second" and bridge.state is LinkState.IN_SYNC,
        within=60,
    )
    stats = bridge.statistics()
    assert (stats.connects, stats.disconnects) == (3, 2)


async def test_a_bridge_told_not_to_fail_back_stays(mesh: Mesh) -> None:
    local, _, _ = [await mesh.start(n) for n in ("local", "first", "second")]
    mesh.network.partition("local", "first")
    bridge = open_bridge(
        local.vpn(),
        BridgeSettings(
            "replicas",
            remotes=[mesh.network.connectable(n, source="local") for n in ("first", "second")],
            fail_back=False,
        ),
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    mesh.network.heal("local", "first")
    await mesh.clock.run(600)
    assert (bridge.link.peer_node, bridge.statistics().connects) == ("second", 1)


async def test_meshbus_stats_shows_each_bridge_with_its_forward_latency(mesh: Mesh) -> None:
    local, far = await start_pair(mesh)
    local.vpn().add_user("ops", management=True)
    bridge = open_bridge(
        local.vpn(),
        remote_bridge(mesh, subscriptions=["a/>"], topics=[TopicMapping("up/>", mode="PUB")]),
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    await mesh.clock.settle()
    for _ in range(3):
        far.connect().publish("a/1", b"x")
    local.connect().publish("up/1", b"y")
    await mesh.clock.settle()
    target = mesh.network.connectable("local", source="ops")
    async with connect(target, username="ops", clock=mesh.clock) as ops:
        stats = await ops.node_statistics()
    shown = stats["links"]["default"]["bridge/to-remote"]
    assert (shown["kind"], shown["state"], shown["peer_node"]) == ("bridge", "in-sync", "remote")
    assert (shown["received"], shown["forwarded"], shown["connects"]) == (3, 1, 1)
    # On the clock of the mesh no time passes between a send and its write.
    assert shown["forward_latency"]["0.0001"] == 1
    assert sum(shown["forward_latency"].values()) == 1
    (accepted,) = far.vpn().links
    assert sum(accepted.statistics().forward_latency.values()) == 3
    assert totals(local)["forward_latency.0.0001"] == 1


async def test_pulled_messages_that_arrive_together_are_spooled_in_one_commit(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, far = await start_pair(mesh)
    far.guaranteed.create_queue("Q", subscriptions=["g/>"])
    local.guaranteed.create_queue("L", subscriptions=["g/>"])
    sender = far.connect()
    for i in range(200):
        await sender.send(f"g/{i}", b"%d" % i)
    puts: list[int] = []
    store = local.guaranteed.store  # type: ignore[attr-defined]
    put_many = store.put_many

    async def counted(messages):  # type: ignore[no-untyped-def]
        puts.append(len(messages))
        await mesh.clock.sleep_until(mesh.clock.monotonic() + 0.005)  # a commit to disk
        return await put_many(messages)

    monkeypatch.setattr(store, "put_many", counted)
    bridge = open_bridge(local.vpn(), remote_bridge(mesh, queues=["Q"], window=50))
    await mesh.clock.wait_for(lambda: local.guaranteed.queue("L").usage()[0] == 200, within=60)
    assert sum(puts) == 200
    assert len(puts) <= 200 // 50 * 2  # about a window a commit
    assert bridge.link.statistics().received == 200
    flow = await local.connect().bind("L")
    got = [await flow.receive() for _ in range(200)]
    assert [m.payload for m in got] == [b"%d" % i for i in range(200)]


async def test_a_batch_of_pulled_messages_stops_at_the_first_an_endpoint_refuses(
    mesh: Mesh, monkeypatch: pytest.MonkeyPatch
) -> None:
    local, far = await start_pair(mesh)
    far.guaranteed.create_queue("Q", subscriptions=["g/>"])
    local.guaranteed.create_queue("L", subscriptions=["g/>"], max_messages=120)
    local.guaranteed.create_queue("all", subscriptions=["g/>"])
    sender = far.connect()
    for i in range(200):
        await sender.send(f"g/{i}", b"%d" % i)
    store = local.guaranteed.store  # type: ignore[attr-defined]
    put_many = store.put_many

    async def slow(messages):  # type: ignore[no-untyped-def]
        await mesh.clock.sleep_until(mesh.clock.monotonic() + 0.005)
        return await put_many(messages)

    monkeypatch.setattr(store, "put_many", slow)
    bridge = open_bridge(local.vpn(), remote_bridge(mesh, queues=["Q"], window=50))
    await mesh.clock.run(10)
    # The quota counts the messages of the same batch before each one; the 121st is
    # refused whole: the queue without a quota does not get it either.
    assert local.guaranteed.queue("L").usage()[0] == 120
    assert local.guaranteed.queue("all").usage()[0] == 120
    assert bridge.link.statistics().receive_failures >= 1
    assert far.guaranteed.queue("Q").usage()[0] == 80


def pair_settings(mesh: Mesh, here: str, there: str, **options: object) -> BridgeSettings:
    """Bridge ``pair`` from node ``here`` to node ``there``, asking for everything."""
    target = mesh.network.connectable(there, source=here)
    return BridgeSettings("pair", remotes=[target], subscriptions=[">"], **options)  # type: ignore[arg-type]


async def test_the_two_bridges_of_a_pair_share_one_connection(mesh: Mesh) -> None:
    a, b = await mesh.start("a"), await mesh.start("b")
    on_a = open_bridge(a.vpn(), pair_settings(mesh, "a", "b"))
    on_b = open_bridge(b.vpn(), pair_settings(mesh, "b", "a"))
    await mesh.clock.wait_for(
        lambda: (on_a.state, on_b.state) == (LinkState.IN_SYNC, LinkState.REUSING), within=30
    )
    await mesh.clock.settle()
    assert mesh.network.connections("a", "b") == 1  # the one node a (the smaller id) opened
    assert on_b.carrier is not None
    assert on_b.carrier.peer_node == "a"
    readers = {node.name: reader(node) for node in (a, b)}
    a.connect().publish("from/a", b"1")
    b.connect().publish("from/b", b"2")
    await mesh.clock.settle()
    got = {name: sorted(m.payload for m in drain(r)) for name, r in readers.items()}
    assert got == {"a": [b"1", b"2"], "b": [b"1", b"2"]}  # each once: no echo
    # Each message came back to where it came from as an echo, not sent: no-local.
    (carried,) = [link for link in b.vpn().links if link is not on_b.link]
    assert carried.statistics().dropped == {"no_local": 1}
    assert on_a.link.statistics().dropped == {"no_local": 1}
    assert (on_a.statistics().received, on_b.statistics().received) == (1, 1)

    mesh.network.cut("a", "b")  # the shared connection goes: b dials again, then rides again
    await mesh.clock.wait_for(lambda: mesh.network.connections("a", "b") == 1, within=60)
    await mesh.clock.wait_for(
        lambda: (
            {on_a.state, on_b.state} <= {LinkState.IN_SYNC, LinkState.REUSING}
            and LinkState.IN_SYNC in {on_a.state, on_b.state}
        ),
        within=60,
    )
    await mesh.clock.run(30)
    assert mesh.network.connections("a", "b") == 1
    a.connect().publish("again/a", b"3")
    await mesh.clock.settle()
    assert [m.payload for m in drain(readers["b"])] == [b"3"]


async def test_a_bridge_that_rode_its_pair_s_connection_takes_its_wants_when_it_stops(
    mesh: Mesh,
) -> None:
    # b's bridge rode the connection a opened; stopping it left its subscriptions on
    # that connection, so a went on sending b everything, bridge or no bridge.
    a, b = await mesh.start("a"), await mesh.start("b")
    on_a = open_bridge(a.vpn(), pair_settings(mesh, "a", "b"))
    on_b = open_bridge(b.vpn(), pair_settings(mesh, "b", "a"))
    await mesh.clock.wait_for(lambda: on_b.state is LinkState.REUSING, within=30)
    on_b.stop()
    await mesh.clock.wait_for(lambda: on_a.state is LinkState.IN_SYNC, within=60)
    await mesh.clock.settle()
    readers = {node.name: reader(node) for node in (a, b)}
    a.connect().publish("from/a", b"1")
    b.connect().publish("from/b", b"2")
    await mesh.clock.settle()
    got = {name: sorted(m.payload for m in drain(r)) for name, r in readers.items()}
    assert got == {"a": [b"1", b"2"], "b": [b"2"]}  # a's bridge still brings b's


async def test_a_pair_whose_tls_settings_differ_keeps_two_connections(mesh: Mesh) -> None:
    a, b = await mesh.start("a"), await mesh.start("b")
    on_a = open_bridge(a.vpn(), pair_settings(mesh, "a", "b"))
    on_b = open_bridge(b.vpn(), pair_settings(mesh, "b", "a", tls=TlsSettings()))
    await mesh.clock.wait_for(lambda: on_a.state is on_b.state is LinkState.IN_SYNC, within=30)
    await mesh.clock.run(10)
    assert mesh.network.connections("a", "b") == 2
    assert on_a.pairing == (
        "two connections: this bridge does not use TLS and the one of node b does"
    )
    assert on_b.pairing == "two connections: this bridge uses TLS and the one of node a does not"
    readers = {node.name: reader(node) for node in (a, b)}
    a.connect().publish("from/a", b"1")
    await mesh.clock.settle()
    assert [m.payload for m in drain(readers["b"])] == [b"1"]  # the second copy: a duplicate
    assert [m.payload for m in drain(readers["a"])] == [b"1"]


async def test_a_bridge_riding_its_partner_s_connection_drains_a_queue_across_it(
    mesh: Mesh,
) -> None:
    a, b = await mesh.start("a"), await mesh.start("b")
    a.guaranteed.create_queue("Q", subscriptions=["g/>"])
    b.guaranteed.create_queue("L", subscriptions=["g/>"])
    await a.connect().send("g/1", b"across the shared connection")
    on_a = open_bridge(a.vpn(), pair_settings(mesh, "a", "b"))
    on_b = open_bridge(b.vpn(), pair_settings(mesh, "b", "a", queues=["Q"]))
    await mesh.clock.wait_for(
        lambda: (on_a.state, on_b.state) == (LinkState.IN_SYNC, LinkState.REUSING), within=30
    )
    # b rides the connection a opened, so b's flow is bound over a's dialling link.
    await mesh.clock.wait_for(lambda: b.guaranteed.queue("L").usage()[0] == 1, within=30)
    assert a.guaranteed.queue("Q").usage()[0] == 0
    assert mesh.network.connections("a", "b") == 1


async def test_each_remote_logs_in_with_its_own_credentials(mesh: Mesh) -> None:
    local, first, second = [await mesh.start(n) for n in ("local", "first", "second")]
    for node, user in ((first, "bridge-1"), (second, "bridge-2")):
        # Only that user may open links there (its client profile allows bridges).
        vpn = node.create_vpn("secure")
        vpn.add_client_profile(ClientProfile("bridges", allow_bridge_connections=True))
        vpn.add_user(user, client_profile="bridges")
    mesh.network.partition("local", "first")
    remotes = [
        Remote(mesh.network.connectable(n, source="local"), username=u)
        for n, u in (("first", "bridge-1"), ("second", "bridge-2"))
    ]
    bridge = open_bridge(
        local.vpn(),
        BridgeSettings("replicas", remote_vpn="secure", remotes=remotes, username="nobody"),
    )
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    assert bridge.link.peer_node == "second"  # logged in there as bridge-2
    mesh.network.heal("local", "first")
    await mesh.clock.wait_for(
        lambda: bridge.link.peer_node == "first" and bridge.state is LinkState.IN_SYNC,
        within=60,
    )
    # As "nobody" (the bridge's own username) either node refuses the link.
    plain = open_bridge(
        local.vpn(),
        BridgeSettings(
            "as-nobody",
            remote_vpn="secure",
            remotes=[mesh.network.connectable("first", source="local")],
            username="nobody",
        ),
    )
    await mesh.clock.wait_for(lambda: plain.statistics().connect_failures >= 1, within=10)
    assert plain.state is LinkState.BACKOFF


async def test_each_remote_may_have_its_own_window(mesh: Mesh) -> None:
    local, near, far = [await mesh.start(n) for n in ("local", "near", "far")]
    for node in (near, far):
        node.guaranteed.create_queue("Q")  # type: ignore[union-attr]
    remotes = [
        Remote(mesh.network.connectable("near", source="local"), window=3),
        mesh.network.connectable("far", source="local"),  # the bridge's own window
    ]
    bridge = open_bridge(local.vpn(), BridgeSettings("w", remotes=remotes, queues=["Q"], window=50))
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    (flow,) = near.guaranteed.queue("Q").flows  # type: ignore[union-attr]
    assert flow.window == 3
    mesh.network.partition("local", "near")
    await mesh.clock.wait_for(
        lambda: bridge.link.peer_node == "far" and bridge.state is LinkState.IN_SYNC, within=60
    )
    (flow,) = far.guaranteed.queue("Q").flows  # type: ignore[union-attr]
    assert flow.window == 50
    with pytest.raises(ConfigurationError, match="window must be an int from 1 to 65535"):
        Remote("tcp://x:1", window=0)


async def test_a_same_node_bridge_drains_several_queues_and_stops(mesh: Mesh) -> None:
    node = await mesh.start("solo")
    bridgeable(node.create_vpn("office"))
    for queue in ("Q1", "Q2"):
        node.guaranteed.create_queue(queue, vpn="office", subscriptions=[f"{queue}/>"])
    node.guaranteed.create_queue("L", subscriptions=[">"])
    bridge = open_bridge(node.vpn(), BridgeSettings("x", remote_vpn="office", queues=["Q1", "Q2"]))
    sender = node.connect("office")
    await sender.send("Q1/a", b"one")
    await sender.send("Q2/b", b"two")
    await mesh.clock.settle()
    assert node.guaranteed.queue("L").usage()[0] == 2
    bridge.stop()
    await mesh.clock.settle()
    await sender.send("Q1/c", b"stays")
    await mesh.clock.settle()
    assert node.guaranteed.queue("Q1", vpn="office").usage()[0] == 1  # no flow takes it now


@pytest.mark.parametrize("algorithm", ["zlib", True])
async def test_a_bridge_compresses_with_the_algorithm_it_names(
    mesh: Mesh, caplog: pytest.LogCaptureFixture, algorithm: bool | str
) -> None:
    caplog.set_level(logging.INFO)
    local, far = await start_pair(mesh)
    settings = remote_bridge(mesh, subscriptions=["a/>"], compression=algorithm)
    bridge = open_bridge(local.vpn(), settings)
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    everything = reader(local)
    publisher = far.connect(client_name="pub")
    for i in range(50):
        publisher.publish("a/x", b"%d" % i * 100)
    await mesh.clock.settle()
    assert [m.payload for m in drain(everything)] == [b"%d" % i * 100 for i in range(50)]
    logins = [r.getMessage() for r in caplog.records if r.getMessage().startswith("link from")]
    expected = "zlib" if algorithm == "zlib" else ALGORITHMS[0]
    assert any(line.endswith(f"({expected})") for line in logins), logins


@pytest.mark.parametrize(
    ("field", "text"),
    [
        ("subscriptions", "orders/>"),
        ("queues", "Q"),
        ("topics", "orders/>"),
    ],
)
def test_a_string_where_a_list_belongs_is_refused(field: str, text: str) -> None:
    # tuple("orders/>") would have made eight one-character subscriptions.
    with pytest.raises(ValueError, match=f"{field} must be a list"):
        BridgeSettings("b", **{field: text})  # type: ignore[arg-type]


def test_one_url_alone_is_one_remote() -> None:
    assert BridgeSettings("b", remotes="tcp://office:55555").remotes == ("tcp://office:55555",)


def test_variables_that_are_not_a_mapping_and_a_string_of_excludes_are_refused() -> None:
    with pytest.raises(ValueError, match="variables must be a mapping"):
        BridgeSettings("b", variables=[("site", "7")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="excludes must be a list"):
        TopicMapping("a/>", excludes="a/b")
