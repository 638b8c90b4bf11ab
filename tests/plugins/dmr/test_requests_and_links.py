"""Replies routed to the requester's node, what is (not) advertised, and which links a
node accepts (SPEC 8)."""

from __future__ import annotations

import anyio
import pytest

from meshbus import ConfigurationError, LinkState, PublishRejectedError
from meshbus.plugins.dmr import DmrSettings, Peer, link_name, start_dmr
from meshbus.transports import ConnectSettings, WireLink, open_link
from meshbus.transports.testing import Mesh

from ._helpers import drain, settings_for, start_mesh, start_nodes

pytestmark = pytest.mark.anyio

THREE = {"c1": ["n1", "n2", "n3"]}


async def serve_requests(session, count: int) -> None:  # type: ignore[no-untyped-def]
    """Answer ``count`` requests of ``session`` on their reply-to topic."""
    for _ in range(count):
        request = await session.receive()
        session.publish(request.reply_to, b"re: " + request.payload)


async def test_a_thousand_requests_right_after_subscribing_their_reply_topics(
    mesh: Mesh,
) -> None:
    # What n1 tells n2 (over the connection n2 made) takes 20 ms, its messages to n2
    # (over its own) none: each reply is published before its subscription arrives.
    nodes, _ = await start_mesh(mesh, THREE, sources={"n2": "n2-slow"})
    mesh.network.delay("n2-slow", "n1", 0.02)
    responder = nodes["n2"].connect(client_name="responder")
    responder.subscribe("service")
    await mesh.clock.settle()
    requester = nodes["n1"].connect(client_name="requester")
    replies: list = []  # type: ignore[type-arg]

    async def collect() -> None:
        while True:
            replies.append(await requester.receive())

    timeouts = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(serve_requests, responder, 1000)
        tg.start_soon(collect)
        for i in range(1000):
            reply_to = f"reply/requester/{i}"
            requester.subscribe(reply_to)
            requester.publish("service", b"%d" % i, reply_to=reply_to)
            try:
                await mesh.clock.wait_for(lambda: len(replies) > 0, within=5)
            except TimeoutError:
                timeouts += 1
                continue
            reply = replies.pop()
            assert (reply.topic, reply.payload) == (reply_to, b"re: %d" % i)
            requester.unsubscribe(reply_to)
        tg.cancel_scope.cancel()
    assert timeouts == 0


async def test_a_reply_reaches_the_requester_even_when_its_subscription_is_not_exported(
    mesh: Mesh,
) -> None:
    nodes, dmr = await start_mesh(mesh, THREE)
    responder = nodes["n2"].connect()
    responder.subscribe("service")
    requester = nodes["n1"].connect()
    requester.subscribe("#noexport/inbox/1")
    await mesh.clock.settle()
    assert "inbox/1" not in dmr["n2"].neighbour("n1").learned["d"]
    requester.publish("service", b"ping", reply_to="inbox/1")
    await mesh.clock.settle()
    request = responder.receive_nowait()
    assert request is not None
    responder.publish(request.reply_to, b"pong")
    await mesh.clock.settle()
    assert [m.payload for m in drain(requester)] == [b"pong"]
    # Routed to the requester's node only, once.
    assert dmr["n2"].neighbour("n3").out.statistics().forwarded == 0  # type: ignore[union-attr]


async def test_shared_groups_are_exported_and_noexport_is_not(mesh: Mesh) -> None:
    nodes, dmr = await start_mesh(mesh, THREE)
    session = nodes["n1"].connect()
    session.subscribe("#share/workers/jobs/>")
    session.subscribe("#noexport/private/>")
    nodes["n1"].guaranteed.create_queue("q", subscriptions=["orders/>"])  # type: ignore[union-attr]
    await mesh.clock.settle()
    learned = dmr["n2"].neighbour("n1").learned
    assert learned["d"] == {"jobs/>"}
    assert learned["g"] == {"orders/>", "#P2P/QUE/q"}  # and the queue's name


async def test_links_from_unknown_peers_other_clusters_or_for_other_nodes_are_refused(
    mesh: Mesh,
) -> None:
    await start_mesh(mesh, {"c1": ["n1", "n2"]})
    stranger = await mesh.start("x9", cluster="c1")
    other_cluster = await mesh.start("n3", cluster="c2")

    def dial(node, name: str, kind: str = "internal") -> WireLink:  # type: ignore[no-untyped-def]
        settings = ConnectSettings(
            mesh.network.connectable("n1", source=node.name), clock=mesh.clock
        )
        return open_link(node.vpn(), name, settings, kind=kind)

    refused = {
        "unknown peer": dial(stranger, link_name("x9", "n1")),
        "meant for another node": dial(stranger, link_name("n2", "n7")),
        "cluster name mismatch": dial(other_cluster, link_name("n2", "n1")),
        "not a routing link's name": dial(stranger, "to-n1"),
        "wrong kind": dial(stranger, link_name("n2", "n1"), kind="external"),
    }
    await mesh.clock.wait_for(
        lambda: all(link.connect_failures for link in refused.values()), within=30
    )
    reasons = {what: link.reason for what, link in refused.items()}
    assert "unknown peer 'x9'" in reasons["unknown peer"]
    assert "the link is for node 'n7'" in reasons["meant for another node"]
    assert "cluster name mismatch" in reasons["cluster name mismatch"]
    assert "is not the name of a routing link" in reasons["not a routing link's name"]
    assert "configured for an internal link" in reasons["wrong kind"]
    for link in refused.values():
        assert link.state is LinkState.BACKOFF


async def test_bad_settings_are_refused_with_a_clear_error(mesh: Mesh) -> None:
    target = mesh.network.connectable("b1")
    with pytest.raises(ConfigurationError, match="a second external link to cluster 'B'"):
        DmrSettings([Peer("b1", target, cluster="B"), Peer("b2", target, cluster="B")])
    with pytest.raises(ConfigurationError, match="listed twice"):
        DmrSettings([Peer("n2", target), Peer("n2", target)])
    nodes = await start_nodes(mesh, {"A": ["a1"]})
    with pytest.raises(ConfigurationError, match="is this node"):
        await start_dmr(nodes["a1"], DmrSettings([Peer("a1", target)]))
    with pytest.raises(ConfigurationError, match="the node's own cluster"):
        await start_dmr(nodes["a1"], DmrSettings([Peer("a2", target, cluster="A")]))
    lonely = await mesh.start("lonely")
    with pytest.raises(ConfigurationError, match="needs the node's cluster"):
        await start_dmr(lonely, DmrSettings([Peer("a1", target)]))


async def test_a_peer_that_comes_back_under_a_new_identity_replaces_its_old_link(
    mesh: Mesh,
) -> None:
    layout = {"c1": ["n1", "n2"]}
    _, dmr = await start_mesh(mesh, layout)
    old = dmr["n1"].neighbour("n2").into
    assert old is not None
    # n1 never hears that n2 went away; the connections n2 makes next work.
    mesh.network.half_open("n1", "n2", new_connections=False)
    await mesh.stop("n2")
    n2 = await mesh.start("n2", cluster="c1", node_id="n2-reborn")
    reborn = await start_dmr(n2, settings_for(mesh, layout, "n2"), wait=False)
    await mesh.clock.wait_for(lambda: reborn.in_sync, within=30)
    await mesh.clock.wait_for(lambda: dmr["n1"].neighbour("n2").node_id == "n2-reborn", within=30)
    assert old.state is LinkState.DISABLED
    assert "replaced" in old.reason


async def test_a_send_to_a_queue_name_reaches_the_queues_of_that_name_on_other_nodes(
    mesh: Mesh,
) -> None:
    nodes, dmr = await start_mesh(mesh, THREE)
    services = {name: nodes[name].guaranteed for name in ("n1", "n2")}
    for service in services.values():
        service.create_queue("orders")  # type: ignore[union-attr]
    nodes["n1"].guaranteed.create_queue("everything", subscriptions=[">"])  # type: ignore[union-attr]
    await mesh.clock.settle()
    assert "#P2P/QUE/orders" in dmr["n3"].neighbour("n1").learned["g"]
    sender = nodes["n3"].connect()  # n3 has no queue of that name
    for i in range(10):
        await sender.send_to_queue("orders", b"%d" % i)
    await mesh.clock.settle()
    for name, service in services.items():
        queue = service.queue("orders")  # type: ignore[union-attr]
        await mesh.clock.wait_for(lambda q=queue: q.usage()[0] == 10, within=30)  # type: ignore[misc]
        assert queue.usage()[0] == 10, name
    # A wildcard queue is not a queue of that name: it takes nothing sent by name.
    assert nodes["n1"].guaranteed.queue("everything").usage()[0] == 0  # type: ignore[union-attr]
    # Not passed on from n1 to n2 (each got its copy from n3 itself).
    assert dmr["n1"].neighbour("n2").out.statistics().forwarded == 0  # type: ignore[union-attr]
    with pytest.raises(PublishRejectedError, match="no-such-queue"):
        await sender.send_to_queue("nowhere", b"x")


async def test_the_links_a_node_dials_drain_for_its_drain_timeout(mesh: Mesh) -> None:
    nodes, _ = await start_mesh(mesh, {"A": ["a1", "a2"]}, drain_timeout=12.5)
    (link,) = (x for x in nodes["a1"].vpn().links if isinstance(x, WireLink) and x.settings)
    assert link.drain_timeout == 12.5
    with pytest.raises(ConfigurationError, match="drain_timeout"):
        DmrSettings(drain_timeout=0)
