"""Clusters joined by gateways (SPEC 8): interest passes to directly linked clusters
only, and messages cross each external link at most once."""

from __future__ import annotations

import pytest

from meshbus.plugins.dmr import start_dmr
from meshbus.transports.testing import Mesh

from ._helpers import data_out, drain, settings_for, start_mesh, start_nodes

pytestmark = pytest.mark.anyio

ABCD = {"A": ["a1", "a2"], "B": ["b1", "b2"], "C": ["c1"], "D": ["d1"]}
# a2 is A's gateway to B and C; b1 is B's gateway to A and D.
ABCD_LINKS = [("a2", "b1"), ("a2", "c1"), ("b1", "d1")]


async def test_interest_reaches_directly_linked_clusters_and_no_further(mesh: Mesh) -> None:
    nodes, dmr = await start_mesh(mesh, ABCD, ABCD_LINKS)
    subscriber = nodes["a1"].connect()
    subscriber.subscribe("payments")
    await mesh.clock.settle()
    assert "payments" in dmr["a2"].neighbour("a1").learned["d"]
    assert "payments" in dmr["b1"].neighbour("a2").learned["d"]  # B learned it
    assert "payments" in dmr["c1"].neighbour("a2").learned["d"]  # C learned it
    assert "payments" in dmr["b2"].neighbour("b1").learned["fd"]  # ... for all of B
    assert not any(dmr["d1"].neighbour("b1").learned.values())  # D never did

    nodes["b2"].connect().publish("payments", b"from B")
    nodes["d1"].connect().publish("payments", b"from D")
    await mesh.clock.settle()
    assert [m.payload for m in drain(subscriber)] == [b"from B"]
    # b2 -> b1 -> a2 -> a1: one copy over each link on the way, one external link.
    assert data_out(dmr["b2"], "b1") == 1
    assert data_out(dmr["b1"], "a2") == 1
    assert data_out(dmr["a2"], "a1") == 1
    assert data_out(dmr["d1"], "b1") == 0
    assert data_out(dmr["b1"], "d1") == 0


async def test_gateways_send_each_message_once_to_each_side_and_never_back(
    mesh: Mesh,
) -> None:
    layout = {"A": ["a1", "a2"], "B": ["b1", "b2"]}
    nodes, dmr = await start_mesh(mesh, layout, [("a2", "b1")])
    on_a1 = nodes["a1"].connect()
    on_a1.subscribe("t/>")
    on_b2 = nodes["b2"].connect()
    on_b2.subscribe("t/>")
    await mesh.clock.settle()
    nodes["a1"].connect().publish("t/1", b"from a1")
    nodes["b2"].connect().publish("t/2", b"from b2")
    await mesh.clock.settle()
    assert sorted(m.payload for m in drain(on_a1)) == [b"from a1", b"from b2"]
    assert sorted(m.payload for m in drain(on_b2)) == [b"from a1", b"from b2"]
    copies = {
        (source, target): data_out(dmr[source], target)
        for source, target in [
            ("a1", "a2"),
            ("a2", "a1"),
            ("a2", "b1"),
            ("b1", "a2"),
            ("b1", "b2"),
            ("b2", "b1"),
        ]
    }
    assert copies == {
        ("a1", "a2"): 1,  # a1's message to the gateway
        ("a2", "b1"): 1,  # ... across to B
        ("b1", "b2"): 1,  # ... to its subscriber
        ("b2", "b1"): 1,  # b2's message the same way back
        ("b1", "a2"): 1,
        ("a2", "a1"): 1,
    }
    # Nothing went back to the cluster it came from: the gateways' drops say so.
    for gateway, other in (("a2", "b1"), ("b1", "a2")):
        out = dmr[gateway].neighbour(other).out
        assert out is not None
        assert out.statistics().dropped == {"transit": 1}


async def test_a_gateway_passes_the_clusters_interest_not_another_clusters(mesh: Mesh) -> None:
    nodes, dmr = await start_mesh(mesh, ABCD, ABCD_LINKS)
    nodes["c1"].connect().subscribe("c/only")
    await mesh.clock.settle()
    # A learns C's interest (a2 passes it into A as foreign) but never tells B.
    assert "c/only" in dmr["a1"].neighbour("a2").learned["fd"]
    assert "c/only" not in dmr["b1"].neighbour("a2").learned["d"]


async def test_two_external_links_between_two_clusters_leave_one(mesh: Mesh) -> None:
    """Each gateway's settings are valid alone, but A and B are joined twice (a1-b2 and
    a2-b1): the gateways find it out from each other and both clusters drop the same
    link, the one whose gateway names sort last (a2-b1)."""
    layout = {"A": ["a1", "a2"], "B": ["b1", "b2"]}
    nodes, dmr = await start_mesh(mesh, layout, [("a1", "b2"), ("a2", "b1")])
    for name, far in (("a2", "b1"), ("b1", "a2")):
        refused = dmr[name].neighbour(far).refused
        assert refused is not None
        assert "a second external link between clusters" in refused
        assert "only a1-b2 is used" in refused
    for name, far in (("a1", "b2"), ("b2", "a1")):
        assert dmr[name].neighbour(far).refused is None
    assert dmr["a2"].statistics()["vpns"]["default"]["conflicts"]
    subscriber = nodes["b1"].connect()
    subscriber.subscribe("t")
    await mesh.clock.settle()
    nodes["a2"].connect().publish("t", b"once")
    await mesh.clock.settle()
    assert [m.payload for m in drain(subscriber)] == [b"once"]
    assert data_out(dmr["a1"], "b2") == 1


async def test_a_gateway_advertises_what_its_node_wanted_before_routing_started(
    mesh: Mesh,
) -> None:
    # Before, the summary for other clusters was built only from interest that came
    # after routing started: a queue the configuration made first, or a client that
    # subscribed first, never reached the other cluster.
    layout, external = {"A": ["a1"], "B": ["b1"]}, [("a1", "b1")]
    nodes = await start_nodes(mesh, layout)
    early = nodes["a1"].connect(client_name="early")
    early.subscribe("x/>")
    nodes["a1"].guaranteed.create_queue("orders", subscriptions=["orders/>"])  # type: ignore[attr-defined]
    routers = [
        await start_dmr(node, settings_for(mesh, layout, name, external), wait=False)
        for name, node in nodes.items()
    ]
    await mesh.clock.wait_for(lambda: all(r.in_sync for r in routers), within=30)
    await mesh.clock.settle()
    publisher = nodes["b1"].connect()
    publisher.publish("x/1", b"direct")
    await publisher.send("orders/1", b"guaranteed")
    await mesh.clock.settle()
    assert [m.payload for m in drain(early)] == [b"direct"]
    queues = nodes["a1"].guaranteed.queue_statistics()  # type: ignore[attr-defined]
    assert {q.name: q.messages for q in queues} == {"orders": 1, "dmr.b1": 0}
