"""Dynamic routing inside one cluster (SPEC 8), on the in-memory mesh's virtual clock."""

from __future__ import annotations

import orjson
import pytest

from meshbus.app._clients import links_table
from meshbus.transports._serving import node_statistics
from meshbus.transports.testing import Mesh

from ._helpers import adverts_in, data_out, drain, start_mesh

pytestmark = pytest.mark.anyio

THREE = {"c1": ["n1", "n2", "n3"]}


async def test_refcounted_advertisement_reaches_each_neighbour_once(mesh: Mesh) -> None:
    nodes, dmr = await start_mesh(mesh, THREE)
    before = {n: adverts_in(dmr[n], "n1") for n in ("n2", "n3")}
    between = adverts_in(dmr["n3"], "n2")
    clients = [nodes["n1"].connect(client_name=f"c{i}") for i in range(3)]
    for client in clients:
        client.subscribe("payments")
    await mesh.clock.settle()
    assert {n: adverts_in(dmr[n], "n1") - before[n] for n in ("n2", "n3")} == {"n2": 1, "n3": 1}
    for n in ("n2", "n3"):
        assert "payments" in dmr[n].neighbour("n1").learned["d"]
    clients[0].unsubscribe("payments")
    clients[1].unsubscribe("payments")
    await mesh.clock.settle()
    assert {n: adverts_in(dmr[n], "n1") - before[n] for n in ("n2", "n3")} == {"n2": 1, "n3": 1}
    clients[2].unsubscribe("payments")
    await mesh.clock.settle()
    assert {n: adverts_in(dmr[n], "n1") - before[n] for n in ("n2", "n3")} == {"n2": 2, "n3": 2}
    for n in ("n2", "n3"):
        assert "payments" not in dmr[n].neighbour("n1").learned["d"]
    # n2 learned it and never told n3.
    assert adverts_in(dmr["n3"], "n2") == between
    assert "payments" not in dmr["n3"].neighbour("n2").learned["d"]


async def test_a_covered_filter_is_not_advertised_until_its_cover_goes(mesh: Mesh) -> None:
    nodes, dmr = await start_mesh(mesh, THREE)
    before = adverts_in(dmr["n2"], "n1")
    client = nodes["n1"].connect()
    client.subscribe("a/>")
    client.subscribe("a/b")
    await mesh.clock.settle()
    assert adverts_in(dmr["n2"], "n1") - before == 1
    assert dmr["n2"].neighbour("n1").learned["d"] == {"a/>"}
    client.unsubscribe("a/>")
    await mesh.clock.settle()
    assert dmr["n2"].neighbour("n1").learned["d"] == {"a/b"}
    assert dmr["n2"].neighbour("n1").out.interest == ("a/b",)  # type: ignore[union-attr]


async def test_one_copy_per_link_and_only_publisher_to_consumer(mesh: Mesh) -> None:
    layout = {"c1": ["n1", "n2", "n3", "n4"]}
    nodes, dmr = await start_mesh(mesh, layout)
    on_n2 = [nodes["n2"].connect(client_name=f"s{i}") for i in range(10)]
    for session in on_n2:
        session.subscribe("t")
    on_n3 = nodes["n3"].connect()
    on_n3.subscribe("t")
    await mesh.clock.settle()
    nodes["n1"].connect().publish("t", b"once")
    await mesh.clock.settle()
    assert [data_out(dmr["n1"], n) for n in ("n2", "n3", "n4")] == [1, 1, 0]
    assert data_out(dmr["n2"], "n3") == 0
    assert data_out(dmr["n3"], "n2") == 0
    assert sum(len(drain(s)) for s in on_n2) == 10
    assert [m.payload for m in drain(on_n3)] == [b"once"]


async def test_interest_from_another_node_is_not_used_for_transit(mesh: Mesh) -> None:
    """A message that came from n1 is never sent on from n2, even when n3 wants it."""
    nodes, dmr = await start_mesh(mesh, THREE)
    on_n2 = nodes["n2"].connect()
    on_n2.subscribe("x/>")
    on_n3 = nodes["n3"].connect()
    on_n3.subscribe("x/>")
    await mesh.clock.settle()
    nodes["n1"].connect().publish("x/1", b"hi")
    await mesh.clock.settle()
    assert [m.payload for m in drain(on_n2)] == [b"hi"]
    assert [m.payload for m in drain(on_n3)] == [b"hi"]
    assert data_out(dmr["n2"], "n3") == 0
    out = dmr["n2"].neighbour("n3").out
    assert out is not None
    assert out.statistics().dropped == {"transit": 1}


async def test_stats_links_shows_the_links_and_the_neighbours(mesh: Mesh) -> None:
    nodes, _ = await start_mesh(mesh, THREE)
    session = nodes["n1"].connect()
    session.subscribe("x")
    await mesh.clock.settle()
    # As the CLI gets them: through JSON.
    lines = links_table(orjson.loads(orjson.dumps(node_statistics(nodes["n2"].connect()))))
    text = "\n".join(lines)
    assert lines[0].split() == ["VPN", "LINK", "KIND", "STATE", "PEER", "OUT", "IN", "DROPPED"]
    assert "dmr:n2:n1" in text
    assert "routing in VPN default: node n2 of cluster c1, in-sync" in text
    (row,) = [line for line in lines if line.startswith("n1 ")]
    assert row.split() == ["n1", "internal", "in-sync", "1", "0", "0"]


async def test_a_filter_the_link_refuses_is_forgotten_and_counted(mesh: Mesh) -> None:
    _, dmr = await start_mesh(mesh, THREE)
    into = dmr["n1"].neighbour("n2").into
    assert into is not None
    into.advertise(["ok/>", "bad\x00nul", "#reserved"])  # as a peer gone wrong might
    await mesh.clock.settle()
    assert dmr["n2"].neighbour("n1").learned["d"] == {"ok/>"}
    out = dmr["n2"].neighbour("n1").out
    assert out is not None
    assert out.interest == ("ok/>",)
    assert dmr["n2"].statistics()["vpns"]["default"]["bad_advertisements"] == 2


async def test_each_link_counts_the_bytes_both_ways(mesh: Mesh) -> None:
    nodes, dmr = await start_mesh(mesh, THREE)
    reader = nodes["n2"].connect()
    reader.subscribe("big")
    await mesh.clock.settle()
    out = dmr["n1"].neighbour("n2").statistics()["out"]
    before = out["bytes_out"]
    nodes["n1"].connect().publish("big", b"x" * 10_000)
    await mesh.clock.settle()
    after = dmr["n1"].neighbour("n2").statistics()
    assert after["out"]["bytes_out"] - before >= 10_000
    assert after["out"]["bytes_in"] > 0  # n2's advertisements
    into = dmr["n2"].neighbour("n1").statistics()["in"]
    assert into["bytes_in"] >= 10_000
