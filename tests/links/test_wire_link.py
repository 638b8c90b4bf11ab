"""Two and three nodes in one process, linked over the in-memory network, on one clock."""

from __future__ import annotations

import attrs
import pytest

from meshbus import (
    DEFAULT_PLUGINS,
    AclProfile,
    DeliveryMode,
    Link,
    LinkState,
    Message,
    Node,
    PublishRejectedError,
)
from meshbus.hookspecs import hookimpl
from meshbus.plugins import hopcount
from meshbus.plugins.hopcount import HopCountSettings
from meshbus.transports import Backoff, WireLink
from meshbus.transports.testing import QUICK_LISTENER, Mesh

pytestmark = pytest.mark.anyio


async def test_a_subscription_on_b_attracts_a_publish_on_a(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=["orders/>"])
    await mesh.in_sync(link)
    assert link.peer_node == "a"
    (accepted,) = a.vpn().links
    assert accepted.interest == ("orders/>",)

    subscriber = b.connect(client_name="sub")
    subscriber.subscribe("orders/>")
    publisher = a.connect(client_name="pub", timestamps=True)
    publisher.publish("orders/1", b"one", headers={"k": "v"}, correlation_id="c1")
    publisher.publish("invoices/1", b"not wanted")
    await mesh.clock.settle()

    message = subscriber.receive_nowait()
    assert message is not None
    assert (message.topic, message.payload, message.sender) == ("orders/1", b"one", "pub")
    assert message.headers == {"k": "v"}
    assert message.correlation_id == "c1"
    assert message.timestamp is not None
    assert message.origin is not None
    assert message.origin[0] == "a"
    assert subscriber.receive_nowait() is None
    assert accepted.statistics().forwarded == 1
    assert link.statistics().received == 1


def queue_depth(node: Node, name: str) -> int:
    return node.guaranteed.queue(name).usage()[0]  # type: ignore[attr-defined]


async def test_a_guaranteed_message_is_spooled_on_b_before_a_lets_it_go(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    a.guaranteed.create_queue("to-b", subscriptions=["orders/>"])
    b.guaranteed.create_queue("orders", subscriptions=["orders/>"], max_messages=1)
    sender_b = b.connect(client_name="local")
    await sender_b.send("orders/0", b"fills B's queue")
    link = mesh.link(b, "a", pulls=["to-b"])
    await mesh.in_sync(link)

    await a.connect(client_name="pub").send("orders/1", b"one", correlation_id="c1")
    await mesh.clock.settle()
    # B's queue is full: the message stays on A, unacknowledged, and is tried again.
    assert queue_depth(a, "to-b") == 1
    assert link.statistics().receive_failures >= 1

    consumer = await b.connect(client_name="consumer").bind("orders")
    first = await consumer.receive()
    assert first.payload == b"fills B's queue"
    consumer.ack(first)
    await mesh.clock.run(link.retry_interval)
    assert queue_depth(a, "to-b") == 0  # acknowledged once B held it
    second = await consumer.receive()
    assert (second.topic, second.payload, second.sender) == ("orders/1", b"one", "pub")
    assert second.correlation_id == "c1"
    assert second.origin is not None
    assert second.origin[0] == "a"
    assert link.pulled == 1


async def test_a_half_open_link_is_found_by_keepalive_and_comes_back(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=["t/>"])
    await mesh.in_sync(link)
    subscriber = b.connect(client_name="sub")
    subscriber.subscribe("t/>")

    mesh.network.half_open("b", "a")  # both directions lose everything, silently
    lost_after = await mesh.clock.wait_for(lambda: link.state is LinkState.BACKOFF, within=60)
    assert 3.0 <= lost_after <= 4.0  # the keepalive timeout (3 s), give or take a check
    assert link.statistics().disconnects == 1
    # The node's side found it too: its link left the VPN with the interest.
    await mesh.clock.wait_for(lambda: not len(a.vpn().links), within=60)
    assert not a.vpn().links.index.match("t/1")

    mesh.network.heal("b", "a")
    await mesh.in_sync(link, within=60)
    assert link.statistics().connects == 2
    a.connect().publish("t/1", b"after the reconnect")
    await mesh.clock.settle()
    message = subscriber.receive_nowait()
    assert message is not None
    assert message.payload == b"after the reconnect"  # the interest came back


async def test_reconnects_back_off_on_the_clock(mesh: Mesh) -> None:
    await mesh.start("a")
    b = await mesh.start("b")
    mesh.network.partition("b", "a")  # nothing gets through: every attempt fails
    link = mesh.link(b, "a", backoff=Backoff(1.0, 120.0, jitter=0.0))
    await mesh.clock.run(600)
    # 1 + 2 + 4 + ... + 64 = 127 s, then every 120 s: 7 + 4 waits in 10 minutes.
    assert 10 <= link.statistics().connect_failures <= 13
    assert link.state is LinkState.BACKOFF
    assert "memory://a" in link.reason or link.reason
    mesh.network.heal("b", "a")
    await mesh.in_sync(link, within=121)


async def test_a_link_is_refused_without_bridge_permission(mesh: Mesh) -> None:
    a = await mesh.start("a", allow_links=False)
    b = await mesh.start("b")
    link = mesh.link(b, "a")
    await mesh.clock.wait_for(lambda: link.connect_failures >= 1, within=30)
    assert link.state is LinkState.BACKOFF
    assert "login refused" in link.reason or "bridge" in link.reason
    assert not len(a.vpn().links)


@pytest.mark.parametrize(
    ("hops", "cut_by"), [(True, "hop_limit"), (False, "duplicate")], ids=["hop-count", "origin"]
)
async def test_three_nodes_in_a_triangle_deliver_each_publish_once(
    mesh: Mesh, hops: bool, cut_by: str
) -> None:
    nodes = [await mesh.start(name) for name in ("a", "b", "c")]
    for node in nodes:
        hopcount.configure(node, HopCountSettings(enabled=hops))
    links = [
        mesh.link(source, target.name, wants=[">"])
        for source in nodes
        for target in nodes
        if source is not target
    ]
    await mesh.in_sync(*links)
    subscribers = []
    for node in nodes:
        session = node.connect(client_name=f"sub-{node.name}")
        session.subscribe("news/>")
        subscribers.append(session)

    nodes[0].connect(client_name="pub").publish("news/1", b"once")
    await mesh.clock.settle()
    for session in subscribers:
        got = [m.payload for m in iter(session.receive_nowait, None)]
        assert got == [b"once"], session.client_name
    cut = sum(link.dropped.get(cut_by, 0) for node in nodes for link in node.vpn().links)
    assert cut >= 1  # the loops were cut by the hop limit or the origin filter, not by luck


async def test_a_link_the_peer_may_not_subscribe_to_is_told_why(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    vpn = a.vpn()
    vpn.add_acl_profile(AclProfile("no-secrets", subscribe_exceptions=("secret/>",)))
    allow = attrs.evolve(vpn.client_profiles["default"], name="bridges")
    vpn.add_client_profile(allow)
    vpn.add_user("peer", client_profile="bridges", acl_profile="no-secrets")
    link = mesh.link(b, "a", wants=["secret/>", "public/>"], username="peer")
    await mesh.in_sync(link)
    assert set(link.refusals) == {"secret/>"}
    (accepted,) = vpn.links
    assert accepted.interest == ("public/>",)


async def test_a_guaranteed_send_over_a_link_is_answered_once_spooled(mesh: Mesh) -> None:
    await mesh.start("a")
    b = await mesh.start("b")
    a = mesh.nodes["a"]
    a.guaranteed.create_queue("in", subscriptions=["in/>"], max_message_size=1000)
    link = mesh.link(b, "a")
    await mesh.in_sync(link)
    message = Message(
        "in/1",
        b"pushed",
        DeliveryMode.PERSISTENT,
        {"k": 1},
        correlation_id="c",
        sender="someone",
        timestamp=12.5,
        origin=("b", 7),
    )
    await link.send_guaranteed(message)
    assert queue_depth(a, "in") == 1
    flow = await a.connect().bind("in")
    got = await flow.receive()
    assert (got.payload, got.sender, got.timestamp) == (b"pushed", "someone", 12.5)
    assert (got.headers, got.correlation_id, got.origin) == ({"k": 1}, "c", ("b", 7))
    too_large = Message("in/2", b"x" * 1001, DeliveryMode.PERSISTENT, origin=("b", 8))
    with pytest.raises(PublishRejectedError):
        await link.send_guaranteed(too_large)
    assert queue_depth(a, "in") == 1
    # A message flagged redelivered (it may be there already) keeps the flag.
    again = Message("in/3", b"again", DeliveryMode.PERSISTENT, origin=("b", 9), redelivered=True)
    await link.send_guaranteed(again)
    flow.ack(got)
    got = await flow.receive()
    assert (got.payload, got.redelivered) == (b"again", True)


async def test_a_stopped_link_leaves_its_vpn(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=["t"])
    await mesh.in_sync(link)
    link.stop("no longer needed")
    await mesh.clock.settle()
    assert link.state is LinkState.DISABLED
    assert not len(b.vpn().links)
    await mesh.clock.wait_for(lambda: not len(a.vpn().links), within=10)


async def test_advertisements_reach_the_handler_in_order_and_a_gap_asks_for_a_resync(
    mesh: Mesh,
) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a")
    await mesh.in_sync(link)
    (accepted,) = a.vpn().links
    seen: list[tuple[bool, tuple[str, ...], bool]] = []
    accepted.on_advertise = lambda _, event: seen.append((event.snapshot, event.add, event.resync))
    asked: list[bool] = []
    link.on_advertise = lambda _, event: asked.append(event.resync)

    assert link.advertise(["x/>"], snapshot=True)
    assert link.advertise(["y/>"])
    await mesh.clock.settle()
    assert seen == [(True, ("x/>",), False), (False, ("y/>",), False)]

    link._my_seq += 1  # one advertisement lost on the way
    link.advertise(["z/>"])
    link.advertise(["w/>"])
    await mesh.clock.settle()
    assert len(seen) == 2  # neither is applied over the gap
    assert asked == [True]  # one resync request, not one per frame
    assert accepted.dropped["advertise_gap"] == 2
    link.advertise(["x/>", "y/>", "z/>", "w/>"], snapshot=True)
    await mesh.clock.settle()
    assert seen[-1] == (True, ("x/>", "y/>", "z/>", "w/>"), False)


async def test_a_flapping_link_keeps_backing_off_and_a_stable_one_starts_over(
    mesh: Mesh,
) -> None:
    await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", backoff=Backoff(1.0, 120.0, jitter=0.0))
    await mesh.in_sync(link)
    waits = []
    for _ in range(3):  # up for a moment, then cut: the waits grow 1, 2, 4 s
        mesh.network.cut("b", "a")
        await mesh.clock.wait_for(lambda: link.state is LinkState.BACKOFF, within=5)
        waits.append(await mesh.clock.wait_for(lambda: link.state is LinkState.IN_SYNC, within=60))
    assert waits == [1.0, 2.0, 4.0]
    await mesh.clock.run(link.stable_period)
    mesh.network.cut("b", "a")
    await mesh.clock.wait_for(lambda: link.state is LinkState.BACKOFF, within=5)
    assert await mesh.clock.wait_for(lambda: link.state is LinkState.IN_SYNC, within=60) == 1.0


async def test_a_new_login_replaces_a_half_open_link_of_the_same_peer(mesh: Mesh) -> None:
    a = await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=["t"])
    await mesh.in_sync(link)
    (old,) = a.vpn().links
    # b comes back (same node id, same link name) while a still trusts the old connection.
    again = await mesh.start("b-again", node_id="b")
    new = mesh.link(again, "a", name=link.name, wants=["u"])
    await mesh.in_sync(new)
    (current,) = a.vpn().links
    assert current is not old
    assert old.state is LinkState.DISABLED
    assert "replaced" in old.reason
    assert current.interest == ("u",)


async def test_an_idle_link_stays_up_on_its_pings_before_and_after_a_reconnect(
    mesh: Mesh,
) -> None:
    await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a")
    await mesh.in_sync(link)
    await mesh.clock.run(600)
    assert link.statistics().disconnects == 0
    mesh.network.cut("b", "a")
    await mesh.clock.wait_for(lambda: link.state is LinkState.BACKOFF, within=5)
    await mesh.in_sync(link)
    await mesh.clock.run(600)
    assert link.statistics().disconnects == 1
    assert link.state is LinkState.IN_SYNC


class LinkEvents:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    @hookimpl
    def meshbus_link_opened(self, link: Link) -> None:
        self.events.append(("opened", link.vpn.node.name, link.name))

    @hookimpl
    def meshbus_link_closed(self, link: Link, reason: str) -> None:
        self.events.append(("closed", link.vpn.node.name, link.name))


async def test_plugins_hear_of_links_opening_and_closing_on_both_sides(mesh: Mesh) -> None:
    watcher = LinkEvents()
    await mesh.start("a", plugins=[*DEFAULT_PLUGINS, watcher])
    b = await mesh.start("b", plugins=[*DEFAULT_PLUGINS, watcher])
    link = mesh.link(b, "a")
    await mesh.in_sync(link)
    assert sorted(watcher.events) == [
        ("opened", "a", "b/default-to-a"),
        ("opened", "b", "default-to-a"),
    ]
    watcher.events.clear()
    link.stop()
    await mesh.clock.settle()
    assert sorted(watcher.events) == [
        ("closed", "a", "b/default-to-a"),
        ("closed", "b", "default-to-a"),
    ]


class WantsBack:
    """On every link a node accepts, ask the dialling side for ``orders/>`` at once."""

    @hookimpl
    def meshbus_link_opened(self, link: Link) -> None:
        if isinstance(link, WireLink) and link.settings is None:
            link.want("orders/>")


async def test_what_the_accepting_side_asks_for_as_the_link_opens_arrives(mesh: Mesh) -> None:
    # Its SUBSCRIBE goes out with the WELCOME, in the same write: the dialling side must
    # read the frames that came with the WELCOME too.
    a = await mesh.start("a", plugins=[*DEFAULT_PLUGINS, WantsBack()])
    b = await mesh.start("b")
    link = mesh.link(b, "a")
    await mesh.in_sync(link)
    (accepted,) = a.vpn().links
    await mesh.clock.wait_for(lambda: accepted.state is LinkState.IN_SYNC, within=5)
    assert link.interest == ("orders/>",)
    subscriber = a.connect(client_name="sub")
    subscriber.subscribe("orders/>")
    b.connect().publish("orders/1", b"from b")
    await mesh.clock.settle()
    message = subscriber.receive_nowait()
    assert message is not None
    assert message.payload == b"from b"


async def test_a_dialling_link_closes_its_connection_when_it_stops(mesh: Mesh) -> None:
    await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=["t/>"])
    await mesh.in_sync(link)
    connection = link._connection
    assert connection is not None
    link.stop()
    await mesh.clock.settle()
    assert connection.closed  # not left for the garbage collector (an unclosed socket)


async def linked_for_u(mesh: Mesh) -> tuple[Node, WireLink, Link]:
    """Node ``b`` linked to ``a``, which asks for ``u/>`` over it: a subscriber on ``a``
    (returned), ``b``'s dialling link and ``a``'s end of it."""
    a = await mesh.start("a")
    b = await mesh.start("b")
    link = mesh.link(b, "a")
    await mesh.in_sync(link)
    (accepted,) = a.vpn().links
    assert isinstance(accepted, WireLink)
    accepted.want("u/>")
    await mesh.clock.settle()
    return a, link, accepted


def publish_numbered(node: Node, numbers: range) -> None:
    publisher = node.connect(client_name=f"pub-{numbers.start}")
    for i in numbers:  # 10 kB each: 100 are a megabyte, what a connection holds in flight
        publisher.publish("u/x", b"%d " % i + bytes(10_000))


@pytest.mark.parametrize("how", ["stop", "dialling node stops", "listening node stops"])
async def test_a_closing_link_first_writes_what_it_had_taken(mesh: Mesh, how: str) -> None:
    # Before, a stop (and a node stopping) cut the connection at once: the messages the
    # link had taken and not yet written were lost, though counted as forwarded.
    a, link, accepted = await linked_for_u(mesh)
    b = mesh.nodes["b"]
    sender, receiver, sending = (b, a, link)
    if how == "listening node stops":  # the other way: a's end of the link sends
        link.want("u/>")
        await mesh.clock.settle()
        sender, receiver, sending = (a, b, accepted)
    subscriber = receiver.connect(client_name="sub")
    subscriber.subscribe("u/>")
    mesh.network.delay("a", "b", 0.5)
    publish_numbered(sender, range(150))
    await mesh.clock.settle()  # written: the connection holds it, in flight
    publish_numbered(sender, range(150, 300))  # its write waits for room
    if how == "stop":
        link.stop("done")
    else:
        await mesh.stop(sender.name)
    await mesh.clock.run(5)
    received = [int(m.payload.split()[0]) for m in iter(subscriber.receive_nowait, None)]
    assert received == list(range(300))
    statistics = sending.statistics()
    assert (statistics.forwarded, statistics.forward_failures) == (300, 0)


async def test_a_peer_that_reads_nothing_holds_a_closing_link_for_its_drain_timeout(
    mesh: Mesh,
) -> None:
    _, link, _ = await linked_for_u(mesh)
    link.drain_timeout = 2.0
    mesh.network.delay("a", "b", 100)  # nothing is read for 100 s
    b = mesh.nodes["b"]
    publish_numbered(b, range(150))
    await mesh.clock.settle()  # written: the connection holds it, in flight
    publish_numbered(b, range(150, 300))  # its write waits for room
    connection = link._connection
    assert connection is not None
    link.stop("done")
    await mesh.clock.run(1.9)
    assert not connection.closed
    await mesh.clock.run(0.2)
    assert connection.closed
    # The cut write is not known to have reached the peer: not counted as forwarded.
    statistics = link.statistics()
    assert (statistics.forwarded, statistics.forward_failures) == (150, 150)


async def test_a_link_a_listener_accepted_drains_for_the_listener_s_drain_timeout(
    mesh: Mesh,
) -> None:
    # Node a accepts b's link on a listener whose drain_timeout is 2 s; b reads nothing.
    a = await mesh.start("a", listener=attrs.evolve(QUICK_LISTENER, drain_timeout=2.0))
    b = await mesh.start("b")
    link = mesh.link(b, "a", wants=["u/>"])
    await mesh.in_sync(link)
    (accepted,) = a.vpn().links
    assert isinstance(accepted, WireLink)
    assert accepted.drain_timeout == 2.0
    mesh.network.delay("a", "b", 100)  # nothing is read for 100 s
    publish_numbered(a, range(150))
    await mesh.clock.settle()  # written: the connection holds it, in flight
    publish_numbered(a, range(150, 300))  # its write waits for room
    connection = accepted._connection
    assert connection is not None
    accepted.stop("done")
    await mesh.clock.run(1.9)
    assert not connection.closed
    await mesh.clock.run(0.2)
    assert connection.closed  # not after the default 5 s


@pytest.mark.parametrize("how", ["while connected", "while cut off"])
async def test_a_stopped_dialling_link_leaves_no_session_behind(mesh: Mesh, how: str) -> None:
    # The session that holds the flows the peer binds on the dialling side stayed in
    # the VPN after the link stopped: a new link of the same name (a reopened bridge,
    # a re-added routing peer) had every bind refused, its client name in use.
    a = await mesh.start("a")
    b = await mesh.start("b")
    b.guaranteed.create_queue("q", subscriptions=["g/>"])  # type: ignore[union-attr]
    link = mesh.link(b, "a", name="to-a")
    await mesh.in_sync(link)
    (accepted,) = a.vpn().links
    assert isinstance(accepted, WireLink)
    accepted.pull("q")
    await mesh.clock.settle()
    assert "link:to-a" in b.vpn().sessions
    if how == "while cut off":
        mesh.network.partition("a", "b")
        await mesh.clock.wait_for(lambda: link.state is LinkState.BACKOFF, within=30)
    await link.aclose()
    await mesh.clock.settle()
    assert "link:to-a" not in b.vpn().sessions

    mesh.network.heal("a", "b")
    again = mesh.link(b, "a", name="to-a")
    await mesh.in_sync(again)
    await mesh.clock.settle()
    (accepted,) = a.vpn().links
    assert isinstance(accepted, WireLink)
    subscriber = a.connect(client_name="sub")
    subscriber.subscribe("g/>")
    accepted.pull("q")
    await b.connect().send("g/1", b"bound")
    await mesh.clock.settle()
    assert accepted.refusals == {}
    assert b.vpn().sessions["link:to-a"].closed is False


async def test_a_mesh_node_stops_and_starts_again_and_retry_now_cuts_the_backoff(
    mesh: Mesh,
) -> None:
    a = await mesh.start("a")
    await mesh.start("b")
    link = mesh.link(a, "b", wants=["t"], backoff=Backoff(initial=100.0, jitter=0.0))
    await mesh.in_sync(link)
    await mesh.stop("b")
    assert "b" not in mesh.nodes
    await mesh.clock.wait_for(lambda: link.state is LinkState.BACKOFF, within=10)
    b = await mesh.start("b")  # the same name, listening again
    with pytest.raises(TimeoutError):
        await mesh.in_sync(link, within=50)  # still waiting out its backoff
    assert link.retry_now()
    await mesh.in_sync(link, within=1)
    assert link.peer_node == b.node_id
    assert not link.retry_now()  # connected: nothing to cut short
