"""Clusters of nodes on the in-memory mesh, for the dynamic routing tests."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from meshbus import Message, Node, Session
from meshbus.plugins.dmr import Dmr, DmrSettings, Peer, start_dmr
from meshbus.transports.testing import Mesh

Layout = Mapping[str, Iterable[str]]
"""Cluster name -> its node names."""


async def start_nodes(mesh: Mesh, layout: Layout, **node_options: Any) -> dict[str, Node]:
    """Start every node of ``layout`` (not routing yet)."""
    nodes = {}
    for cluster, names in layout.items():
        for name in names:
            nodes[name] = await mesh.start(name, cluster=cluster, **node_options)
    return nodes


def settings_for(
    mesh: Mesh,
    layout: Layout,
    name: str,
    external: Iterable[tuple[str, str]] = (),
    source: str | None = None,
    **options: Any,
) -> DmrSettings:
    """The settings of node ``name``: every other node of its cluster, and the far end
    of each of ``external`` (pairs of gateway names) it is in. Its connections are made
    as ``source`` (default: ``name``), for the network's delays and cuts."""
    cluster_of = {n: c for c, names in layout.items() for n in names}
    mine = cluster_of[name]
    source = source or name
    peers = [
        Peer(other, mesh.network.connectable(other, source=source))
        for other in layout[mine]
        if other != name
    ]
    for a, b in external:
        if name in (a, b):
            other = b if name == a else a
            peers.append(
                Peer(
                    other,
                    mesh.network.connectable(other, source=source),
                    cluster=cluster_of[other],
                )
            )
    return DmrSettings(peers, **options)


async def start_mesh(
    mesh: Mesh,
    layout: Layout,
    external: Iterable[tuple[str, str]] = (),
    sources: Mapping[str, str] | None = None,
    **options: Any,
) -> tuple[dict[str, Node], dict[str, Dmr]]:
    """Start the nodes of ``layout``, then routing on each, and let it settle.

    :param sources: the names some nodes make their connections as (see
        :func:`settings_for`)."""
    external = list(external)
    nodes = await start_nodes(mesh, layout)
    routers = {}
    for name, node in nodes.items():
        source = (sources or {}).get(name)
        routers[name] = await start_dmr(
            node, settings_for(mesh, layout, name, external, source, **options), wait=False
        )
    await mesh.clock.wait_for(lambda: all(r.in_sync for r in routers.values()), within=30)
    await mesh.clock.settle()
    return nodes, routers


def drain(session: Session) -> list[Message]:
    return list(iter(session.receive_nowait, None))


def adverts_in(dmr: Dmr, source: str) -> int:
    """Advertisement frames ``dmr``'s node received from node ``source`` (snapshots too)."""
    return dmr.neighbour(source).adverts_in


def data_out(dmr: Dmr, target: str) -> int:
    """Messages ``dmr``'s node sent to node ``target``."""
    out = dmr.neighbour(target).out
    assert out is not None
    return out.statistics().forwarded
