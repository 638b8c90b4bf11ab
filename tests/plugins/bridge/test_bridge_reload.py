"""Bridges changed by a reload of the configuration file (SPEC 7: remote subscriptions
change from the API and from a config reload), on the in-memory mesh.

The files name a placeholder remote; the tests put node ``remote``'s address on the
mesh's network in its place (a file cannot name one).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import attrs
import pytest

from meshbus import ConfigurationError, LinkState, Message, Node
from meshbus.app._config import NodeConfig, parse_config
from meshbus.app._config_reload import reload_node
from meshbus.plugins.bridge import BridgeSettings, bridges, open_bridge
from meshbus.plugins.bridge._reload import reload_bridges
from meshbus.transports.testing import Mesh

pytestmark = pytest.mark.anyio

BRIDGE = """
[[vpns.default.bridges]]
name = "to-remote"
remotes = ["tcp://placeholder:1"]
subscriptions = ["a/>"]
"""


def on_mesh(mesh: Mesh, text: str, target: Any) -> NodeConfig:
    """The file ``text`` with each bridge's remotes replaced by ``target``."""
    config = parse_config(tomllib.loads(text), source="edge.toml", environ={})

    def placed(section: Any, value: Any) -> Any:
        if section.name != "bridges":
            return value
        return tuple(attrs.evolve(each, remotes=[target]) for each in value)

    vpns = tuple(
        attrs.evolve(vpn, sections=tuple((s, placed(s, v)) for s, v in vpn.sections))
        for vpn in config.vpns
    )
    return attrs.evolve(config, vpns=vpns)


def drain(session: Any) -> list[Message]:
    return list(iter(session.receive_nowait, None))


async def started(mesh: Mesh) -> tuple[Node, Node, Any]:
    local, far = await mesh.start("local"), await mesh.start("remote")
    return local, far, mesh.network.connectable("remote", source="local")


async def test_a_reload_changes_the_remote_subscriptions_without_reconnecting(
    mesh: Mesh,
) -> None:
    local, far, target = await started(mesh)
    running = on_mesh(mesh, BRIDGE, target)
    await running.provision(local)
    (bridge,) = bridges(local.vpn())
    await mesh.clock.wait_for(lambda: bridge.state is LinkState.IN_SYNC, within=10)
    bridge.add_subscription("api/>")  # through the API: a reload leaves it
    everything = local.vpn().open_session()
    everything.subscribe(">")
    publisher = far.connect()

    new = on_mesh(mesh, BRIDGE.replace('["a/>"]', '["b/>", "c/>"]'), target)
    assert await reload_node(local, running, new) == ["vpns.default.bridges: changed"]
    await mesh.clock.settle()
    for topic in ("a/x", "b/x", "c/x", "api/x"):
        publisher.publish(topic, b"")
    await mesh.clock.settle()
    assert [m.topic for m in drain(everything)] == ["b/x", "c/x", "api/x"]
    assert bridges(local.vpn()) == [bridge]
    assert bridge.subscriptions == ("api/>", "b/>", "c/>")
    assert bridge.link.statistics().connects == 1  # the same connection all along


async def test_a_reload_adds_removes_and_reopens_bridges(mesh: Mesh) -> None:
    local, far, target = await started(mesh)
    two = BRIDGE + BRIDGE.replace("to-remote", "second").replace("a/>", "s/>")
    running = on_mesh(mesh, two, target)
    await running.provision(local)
    first, second = bridges(local.vpn())
    await mesh.clock.wait_for(lambda: first.state is second.state is LinkState.IN_SYNC, within=10)
    # "second" goes, "third" comes, "to-remote" counts two hops from now on.
    new = on_mesh(
        mesh,
        BRIDGE.replace('subscriptions = ["a/>"]', 'subscriptions = ["a/>"]\nhop_count_limit = 2')
        + BRIDGE.replace("to-remote", "third").replace("a/>", "t/>"),
        target,
    )
    await reload_node(local, running, new)
    assert (first.state, second.state) == (LinkState.DISABLED, LinkState.DISABLED)
    now = {b.settings.name: b for b in bridges(local.vpn())}
    assert sorted(now) == ["third", "to-remote"]
    assert now["to-remote"] is not first
    assert now["to-remote"].settings.hop_count_limit == 2
    await mesh.clock.wait_for(
        lambda: all(b.state is LinkState.IN_SYNC for b in now.values()), within=10
    )
    await mesh.clock.settle()
    assert sorted(link.name for link in far.vpn().links) == [
        "local/bridge/third",
        "local/bridge/to-remote",
    ]
    everything = local.vpn().open_session()
    everything.subscribe(">")
    publisher = far.connect()
    for topic in ("a/x", "s/x", "t/x"):
        publisher.publish(topic, b"")
    await mesh.clock.settle()
    assert sorted(m.topic for m in drain(everything)) == ["a/x", "t/x"]


async def test_a_bridge_a_reload_cannot_open_refuses_the_reload(mesh: Mesh, tmp_path: Path) -> None:
    local, _, target = await started(mesh)
    running = on_mesh(mesh, BRIDGE, target)
    await running.provision(local)
    same_node = BRIDGE.replace('remotes = ["tcp://placeholder:1"]\n', 'remote_vpn = "nowhere"\n')
    new = parse_config(tomllib.loads(same_node.replace("to-remote", "inside")), source="edge.toml")
    with pytest.raises(ConfigurationError) as caught:
        await reload_node(local, running, new)
    assert caught.value.problems == [
        "edge.toml: vpns.default.bridges.inside: the node has no other VPN 'nowhere' (a bridge "
        "without remotes joins two VPNs of this node)"
    ]
    assert [b.settings.name for b in bridges(local.vpn())] == ["to-remote"]


@pytest.mark.parametrize("reopened", ["a", "b", "both"])
async def test_a_pair_reopened_by_a_reload_shares_one_connection_again(
    mesh: Mesh, reopened: str
) -> None:
    # b (the larger node id) rides the connection a opened. Reopened, b's bridge used
    # to dial a second connection and never rode the first again.
    a, b = await mesh.start("a"), await mesh.start("b")
    settings = {
        name: BridgeSettings(
            "pair",
            remotes=[mesh.network.connectable(other, source=name)],
            subscriptions=[">"],
        )
        for name, other in (("a", "b"), ("b", "a"))
    }
    nodes = {"a": a, "b": b}
    for name, node in nodes.items():
        open_bridge(node.vpn(), settings[name])
    await mesh.clock.wait_for(lambda: mesh.network.connections("a", "b") == 1, within=30)
    for name, node in nodes.items():
        if reopened in (name, "both"):
            new = attrs.evolve(settings[name], hop_count_limit=2)
            await reload_bridges(node.vpn(), [settings[name]], [new])()
    await mesh.clock.run(60)
    assert mesh.network.connections("a", "b") == 1
    readers = {}
    for name, node in nodes.items():
        readers[name] = node.vpn().open_session(client_name=f"reader-{name}")
        readers[name].subscribe(">")
    a.connect().publish("from/a", b"1")
    b.connect().publish("from/b", b"2")
    await mesh.clock.settle()
    got = {name: sorted(m.payload for m in drain(r)) for name, r in readers.items()}
    assert got == {"a": [b"1", b"2"], "b": [b"1", b"2"]}
