"""Loops of bridges (SPEC 7, 9): rings of nodes, each with a '>' bridge to both neighbours.

Between two neighbours there are two bridges, one each way, so a message can also go
straight back over the other one. With origin de-duplication on, every subscriber within
the hop limit gets each publish exactly once (one beyond it gets none: hop counting
stops the message first). With it off, hop counting alone bounds the copies: a node
gets one per walk along the ring from the publisher of at most ``limit`` crossings,
which :func:`walks` counts from that model rather than from the code under test.
"""

from __future__ import annotations

import anyio
import pytest

from meshbus import LinkState, Node
from meshbus.plugins.bridge import BridgeSettings, TopicMapping, open_bridge
from meshbus.transports.testing import Mesh

pytestmark = pytest.mark.anyio


async def ring(mesh: Mesh, n: int, limit: int, dedup: bool) -> list[Node]:
    """``n`` nodes, each with a '>' bridge to the next and to the one before."""
    nodes = [await mesh.start(f"n{i}") for i in range(n)]
    opened = []
    for i, node in enumerate(nodes):
        for j in {(i + 1) % n, (i - 1) % n}:
            target = mesh.network.connectable(f"n{j}", source=node.name)
            settings = BridgeSettings(
                f"to-n{j}",
                remotes=[target],
                subscriptions=[">"],
                hop_count_limit=limit,
                dedup=dedup,
            )
            opened.append(open_bridge(node.vpn(), settings))
    await mesh.clock.wait_for(lambda: all(b.state is LinkState.IN_SYNC for b in opened), within=30)
    for node in nodes:  # what the far ends accepted de-duplicate as their bridges do
        for link in node.vpn().links:
            link.dedup = dedup
    return nodes


async def copies(mesh: Mesh, nodes: list[Node]) -> list[int]:
    readers = []
    for node in nodes:
        session = node.connect(client_name=f"r-{node.name}")
        session.subscribe(">")
        readers.append(session)
    await mesh.clock.settle()
    nodes[0].connect(client_name="pub").publish("t", b"x")
    await mesh.clock.settle()
    return [len(list(iter(r.receive_nowait, None))) for r in readers]


def walks(n: int, limit: int) -> list[int]:
    """Copies per node of a publish on node 0 of a ring of ``n``: its own delivery, plus
    one for each walk of 1 to ``limit`` steps to each neighbour, from node 0."""
    at = [1] + [0] * (n - 1)  # walks of the current length ending at each node
    copies = list(at)
    for _ in range(limit):
        at = [at[(i - 1) % n] + at[(i + 1) % n] for i in range(n)]
        copies = [c + w for c, w in zip(copies, at, strict=True)]
    return copies


def within(n: int, limit: int) -> list[int]:
    """1 for a node at most ``limit`` crossings from node 0 of a ring of ``n``, else 0."""
    return [int(min(d, n - d) <= limit) for d in range(n)]


@pytest.mark.parametrize("n", [3, 4])
@pytest.mark.parametrize("limit", [1, 2, 3, 8])
async def test_with_de_duplication_every_subscriber_gets_each_publish_once(
    mesh: Mesh, n: int, limit: int
) -> None:
    nodes = await ring(mesh, n, limit, dedup=True)
    assert await copies(mesh, nodes) == within(n, limit)


@pytest.mark.parametrize(("n", "limit"), [(3, 1), (3, 2), (4, 1), (4, 2), (4, 3)])
async def test_without_it_hop_counting_bounds_the_copies(mesh: Mesh, n: int, limit: int) -> None:
    nodes = await ring(mesh, n, limit, dedup=False)
    assert await copies(mesh, nodes) == walks(n, limit)


def test_the_model_counts_walks() -> None:
    assert walks(4, 1) == [1, 1, 0, 1]
    assert walks(4, 2) == [3, 1, 2, 1]  # back to the publisher twice; the far node twice
    assert within(4, 1) == [1, 1, 0, 1]


async def test_a_mapped_topic_keeps_its_origin_so_a_loop_through_mappings_stops(
    mesh: Mesh,
) -> None:
    # Two nodes pull each other's topics under another name: a/x on a becomes b/x on b,
    # which a pulls back as a/x. Only the origin, kept through each mapping, tells a
    # that it has seen the message (the hop limit alone would let it go round).
    a, b = await mesh.start("a"), await mesh.start("b")
    opened = []
    for here, there, mine, theirs in ((a, b, "a", "b"), (b, a, "b", "a")):
        settings = BridgeSettings(
            f"from-{there.name}",
            remotes=[mesh.network.connectable(there.name, source=here.name)],
            subscriptions=[f"{theirs}/>"],
            topics=[TopicMapping(f"{theirs}/>", mode="SUB", destination=mine + "/{2-#}")],
            hop_count_limit=8,
        )
        opened.append(open_bridge(here.vpn(), settings))
    await mesh.clock.wait_for(lambda: all(o.state is LinkState.IN_SYNC for o in opened), within=30)
    for node in (a, b):  # the ends each bridge opened on its peer de-duplicate too
        for link in node.vpn().links:
            link.dedup = True
    readers = []
    for node in (a, b):
        session = node.connect(client_name=f"r-{node.name}")
        session.subscribe(">")
        readers.append(session)
    await mesh.clock.settle()
    a.connect(client_name="pub").publish("a/x", b"once")
    with anyio.fail_after(10):  # a copy that lost its origin and hop count never stops
        await mesh.clock.settle()
    got = [[(m.topic, m.hop_count) for m in iter(r.receive_nowait, None)] for r in readers]
    assert got == [[("a/x", 0)], [("b/x", 1)]]
    dropped = opened[0].link.statistics().dropped
    assert dropped.get("duplicate") == 1


async def test_a_message_passed_on_down_a_chain_of_queues_is_known_when_it_comes_back(
    mesh: Mesh,
) -> None:
    # x's queue is pulled by y, y's by z, whose full queue refuses the message for far
    # longer than the origin window; z's subscribers' copy then goes back to x over a
    # '>' bridge. x passed the message on long before: it must still know it.
    x, y, z = [await mesh.start(n) for n in ("x", "y", "z")]
    x.guaranteed.create_queue("QX", subscriptions=["g/>"])
    y.guaranteed.create_queue("QY", subscriptions=["g/>"])
    z.guaranteed.create_queue("QZ", subscriptions=["g/>"], max_messages=1)
    bridges = [
        open_bridge(
            node.vpn(),
            BridgeSettings(
                name,
                remotes=[mesh.network.connectable(peer, source=node.name)],
                hop_count_limit=8,
                **options,  # type: ignore[arg-type]
            ),
        )
        for node, name, peer, options in (
            (y, "pull-x", "x", {"queues": ["QX"]}),
            (z, "pull-y", "y", {"queues": ["QY"]}),
            (x, "all-of-z", "z", {"subscriptions": [">"]}),
        )
    ]
    await mesh.clock.wait_for(lambda: all(b.state is LinkState.IN_SYNC for b in bridges), within=30)
    watcher = x.connect()
    watcher.subscribe("g/>")

    def drain() -> list[bytes]:
        return [m.payload for m in iter(watcher.receive_nowait, None)]

    await z.connect().send("g/first", b"fills QZ")
    await mesh.clock.settle()
    assert drain() == [b"fills QZ"]  # z's copy, over the bridge
    await x.connect().send("g/second", b"from x")
    chatter = z.connect()
    for n in range(12):  # QZ is full: z refuses it, and y offers it again and again,
        chatter.publish("other/news", b"%d" % n)  # while other messages cross to x
        await mesh.clock.run(5)
    assert drain() == [b"from x"]
    assert x.guaranteed.queue("QX").usage()[0] == 0  # y took it from x at once
    assert y.guaranteed.queue("QY").usage()[0] == 1
    flow = await z.connect().bind("QZ")
    first = await flow.receive()
    flow.ack(first)
    await mesh.clock.run(5)  # QZ has room: z takes it, and its copy goes back to x
    assert z.guaranteed.queue("QZ").usage()[0] == 1
    assert drain() == []  # x's subscriber had it already
    assert bridges[2].statistics().dropped == {"duplicate": 1}
