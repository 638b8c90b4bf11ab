"""Peers changed by a reload of the configuration file (``[dmr] peers`` on SIGHUP):
a node joins a running cluster, and one leaves it, without restarting the others."""

from __future__ import annotations

from typing import Any

import anyio
import attrs
import pytest

from meshbus import ConfigurationError, LinkState, Node
from meshbus.plugins.dmr import Dmr, DmrSettings, Peer, start_dmr
from meshbus.plugins.dmr._config import SECTIONS
from meshbus.transports.testing import Mesh

from ._helpers import drain, settings_for, start_mesh

pytestmark = pytest.mark.anyio

(DMR_TABLE,) = SECTIONS


async def reload(node: Node, old: Any, new: Any) -> None:
    """What a reload of the file does to the ``[dmr]`` table."""
    assert DMR_TABLE.reload is not None
    await DMR_TABLE.reload(node, old, new)()


def plus(mesh: Mesh, dmr: Dmr, name: str) -> DmrSettings:
    """``dmr``'s settings with node ``name`` of its cluster as one more peer."""
    peer = Peer(name, mesh.network.connectable(name, source=dmr.node_name))
    return attrs.evolve(dmr.settings, peers=(*dmr.settings.peers, peer))


def minus(dmr: Dmr, name: str) -> DmrSettings:
    return attrs.evolve(dmr.settings, peers=[p for p in dmr.settings.peers if p.name != name])


async def test_a_node_joins_a_running_cluster(mesh: Mesh) -> None:
    nodes, routers = await start_mesh(mesh, {"A": ["a1", "a2"]})
    a1_hears = nodes["a1"].connect(client_name="a1-reader")
    a1_hears.subscribe("to-a1/>")
    await mesh.clock.settle()
    a3 = await mesh.start("a3", cluster="A")
    a3_hears = a3.connect(client_name="a3-reader")
    a3_hears.subscribe("to-a3/>")
    three = {"A": ["a1", "a2", "a3"]}
    routers["a3"] = await start_dmr(a3, settings_for(mesh, three, "a3"), wait=False)
    for name in ("a1", "a2"):
        await reload(nodes[name], routers[name].settings, plus(mesh, routers[name], "a3"))
    await mesh.clock.wait_for(lambda: all(r.in_sync for r in routers.values()), within=30)
    await mesh.clock.settle()

    nodes["a2"].connect().publish("to-a3/x", b"from a2")
    a3.connect().publish("to-a1/x", b"from a3")
    await mesh.clock.settle()
    assert [m.payload for m in drain(a3_hears)] == [b"from a2"]
    assert [m.payload for m in drain(a1_hears)] == [b"from a3"]
    assert [p.name for p in routers["a1"].settings.peers] == ["a2", "a3"]
    assert sorted(link.name for link in nodes["a1"].vpn().links) == [
        "a2/dmr:a2:a1",
        "a3/dmr:a3:a1",
        "dmr:a1:a2",
        "dmr:a1:a3",
    ]


async def test_a_node_that_leaves_keeps_its_waiting_messages_for_its_return(
    mesh: Mesh,
) -> None:
    nodes, routers = await start_mesh(mesh, {"A": ["a1", "a2"]})
    nodes["a2"].guaranteed.create_queue("orders", subscriptions=["g/>"])  # type: ignore[union-attr]
    a2_hears = nodes["a2"].connect(client_name="a2-reader")
    a2_hears.subscribe("d/>")
    await mesh.clock.wait_for(
        lambda: "g/>" in routers["a1"].neighbour("a2").learned["g"], within=30
    )
    mesh.network.partition("a1", "a2")
    out = routers["a1"].neighbour("a2").out
    assert out is not None
    await mesh.clock.wait_for(lambda: out.state is LinkState.BACKOFF, within=30)
    publisher = nodes["a1"].connect()
    await publisher.send("g/1", b"waits")

    with_a2 = routers["a1"].settings
    await reload(nodes["a1"], with_a2, minus(routers["a1"], "a2"))
    assert [link.name for link in nodes["a1"].vpn().links] == []
    assert out.state is LinkState.DISABLED
    waiting = nodes["a1"].guaranteed.queue("dmr.a2")  # type: ignore[union-attr]
    assert waiting.usage()[0] == 1  # kept ...
    assert waiting.settings.subscriptions == ()  # ... but it attracts nothing more
    with pytest.raises(KeyError):
        routers["a1"].neighbour("a2")

    mesh.network.heal("a1", "a2")
    await mesh.clock.run(30)  # a2 dials a1 again, and is refused: not a peer
    into = routers["a2"].neighbour("a1").out
    assert into is not None
    assert into.state is LinkState.BACKOFF
    assert "unknown peer 'a2'" in into.reason
    publisher.publish("d/1", b"not for a2 now")

    await reload(nodes["a1"], routers["a1"].settings, with_a2)  # it comes back
    await mesh.clock.wait_for(lambda: all(r.in_sync for r in routers.values()), within=60)
    flow = await nodes["a2"].connect().bind("orders")
    got: list[bytes] = []

    async def consume() -> None:
        while True:
            message = await flow.receive()
            got.append(message.payload)
            flow.ack(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await mesh.clock.wait_for(lambda: bool(got), within=60)
        tg.cancel_scope.cancel()
    assert got == [b"waits"]
    assert drain(a2_hears) == []


async def test_what_a_reload_cannot_change_in_dmr_is_refused(mesh: Mesh) -> None:
    nodes, routers = await start_mesh(mesh, {"A": ["a1", "a2"]})
    settings = routers["a1"].settings
    self_peer = Peer("a1", mesh.network.connectable("a1", source="a1"))
    worse = attrs.evolve(settings, username="other", window=7, peers=(*settings.peers, self_peer))
    with pytest.raises(ConfigurationError) as caught:
        DMR_TABLE.reload(nodes["a1"], settings, worse)  # type: ignore[misc]
    assert caught.value.problems == [
        "username: changed, and that takes a restart of the node",
        "window: changed, and that takes a restart of the node",
        "peers: peer 'a1' is this node",
    ]
    with pytest.raises(ConfigurationError) as caught:
        DMR_TABLE.reload(nodes["a1"], settings, None)  # type: ignore[misc]
    assert caught.value.problems == [
        "peers: starting or stopping dynamic routing takes a restart of the node"
    ]
    assert routers["a1"].settings is settings
