"""LocalLink: two VPNs of one process joined without a connection."""

from __future__ import annotations

import pytest

from meshbus import LinkState, LocalLink, Message, Node, Vpn

pytestmark = pytest.mark.anyio


def join(near: Vpn, far: Vpn, name: str = "x", **options: object) -> tuple[LocalLink, LocalLink]:
    a, b = LocalLink.pair(near, far, name, **options)  # type: ignore[arg-type]
    near.links.attach(a)
    assert a.state is LinkState.CONNECTING  # until both ends are attached
    far.links.attach(b)
    return a, b


def drain(session) -> list[Message]:  # type: ignore[no-untyped-def]
    return list(iter(session.receive_nowait, None))


async def test_two_vpns_of_one_node_exchange_what_each_side_wants() -> None:
    async with Node(node_id="n1") as node:
        plant, office = node.vpn(), node.create_vpn("office")
        a, b = join(plant, office, kind="internal")
        assert (a.state, b.state) == (LinkState.IN_SYNC, LinkState.IN_SYNC)
        assert (a.peer_node, b.peer) == ("n1", a)
        a.add_interest("sensors/>")  # office wants plant's sensors
        reader = office.open_session(client_name="reader")
        reader.subscribe(">")
        publisher = plant.open_session(client_name="press", timestamps=True)
        publisher.publish("sensors/t1", b"21.5", headers={"unit": "C"})
        publisher.publish("other/t1", b"not wanted")

        (got,) = drain(reader)
        assert (got.topic, got.payload, got.sender) == ("sensors/t1", b"21.5", "press")
        assert got.headers == {"unit": "C"}
        assert got.timestamp is not None
        assert got.origin is not None
        assert got.origin[0] == "n1"
        assert (a.statistics().forwarded, b.statistics().received) == (1, 1)


async def test_a_message_never_goes_back_and_a_ring_delivers_once() -> None:
    async with Node(node_id="n1") as node:
        vpns = [node.vpn(), node.create_vpn("b"), node.create_vpn("c")]
        for i, near in enumerate(vpns):
            for far in vpns[i + 1 :]:
                x, y = join(near, far, f"{near.name}-{far.name}", kind="internal")
                x.add_interest(">")
                y.add_interest(">")
        readers = []
        for vpn in vpns:
            reader = vpn.open_session(client_name=f"r-{vpn.name}")
            reader.subscribe(">")
            readers.append(reader)
        vpns[0].open_session().publish("t", b"once")
        assert [len(drain(r)) for r in readers] == [1, 1, 1]
        dropped = {}
        for vpn in vpns:
            for link in vpn.links:
                for reason, n in link.statistics().dropped.items():
                    dropped[reason] = dropped.get(reason, 0) + n
        assert dropped["duplicate"] >= 1  # the triangle's loops, cut by the origin filter


async def test_a_bridge_pair_counts_hops() -> None:
    async with Node(node_id="n1") as node:
        a, b = join(node.vpn(), node.create_vpn("b"))  # kind "bridge": plugin hopcount counts
        a.add_interest(">")
        reader = b.vpn.open_session()
        reader.subscribe(">")
        node.vpn().open_session().publish("t", b"x")
        (got,) = drain(reader)
        assert got.hop_count == 1


async def test_stopping_takes_both_ends_out() -> None:
    async with Node() as node:
        a, b = join(node.vpn(), node.create_vpn("b"))
        a.add_interest(">")
        a.stop("done")
        assert (a.state, b.state) == (LinkState.DISABLED, LinkState.DISABLED)
        assert (a.reason, len(node.vpn().links), len(b.vpn.links)) == ("done", 0, 0)
        node.vpn().open_session().publish("t", b"x")  # no link, nothing to do


def test_a_pair_joins_two_different_vpns() -> None:
    node = Node()
    with pytest.raises(ValueError, match="two different VPNs"):
        LocalLink.pair(node.vpn(), node.vpn(), "x")
