"""A neighbour that cannot be reached (SPEC 8): guaranteed messages wait, direct ones are
counted as dropped; a restarted node is in sync before it serves."""

from __future__ import annotations

import anyio
import pytest

from meshbus import ClientProfile, LinkState
from meshbus._profiles import hash_password
from meshbus.plugins.dmr import start_dmr
from meshbus.transports.testing import Mesh

from ._helpers import drain, settings_for, start_mesh

pytestmark = pytest.mark.anyio

FOUR = {"c1": ["n1", "n2", "n3", "n4"]}


async def test_guaranteed_messages_wait_for_a_stopped_node_and_arrive_in_order(
    mesh: Mesh,
) -> None:
    nodes, dmr = await start_mesh(mesh, FOUR)
    await mesh.stop("n4")
    n4 = await mesh.start("n4", cluster="c1")
    # n4 with a queue on g/>, routed from here on (the spools are in memory: the
    # mesh's clock does not wait for a database's thread).
    n4.guaranteed.create_queue("orders", subscriptions=["g/>"])  # type: ignore[union-attr]
    await start_dmr(n4, settings_for(mesh, FOUR, "n4"), wait=False)
    await mesh.clock.wait_for(lambda: "g/>" in dmr["n1"].neighbour("n4").learned["g"], within=30)
    await mesh.stop("n4")
    out = dmr["n1"].neighbour("n4").out
    assert out is not None
    await mesh.clock.wait_for(lambda: out.state is LinkState.BACKOFF, within=30)

    publisher = nodes["n1"].connect()
    for i in range(1000):
        await publisher.send("g/x", b"%d" % i)
        publisher.publish("g/x", b"direct %d" % i)
    await mesh.clock.settle()
    waiting = nodes["n1"].guaranteed.queue("dmr.n4")  # type: ignore[union-attr]
    assert waiting.usage()[0] == 1000
    assert out.statistics().dropped.get("unreachable") == 1000

    n4 = await mesh.start("n4", cluster="c1")
    n4.guaranteed.create_queue("orders", subscriptions=["g/>"])  # type: ignore[union-attr]
    await start_dmr(n4, settings_for(mesh, FOUR, "n4"), wait=False)
    session = n4.connect()
    flow = await session.bind("orders")
    got: list[bytes] = []

    async def consume() -> None:
        while True:
            message = await flow.receive()
            got.append(message.payload)
            flow.ack(message)

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await mesh.clock.wait_for(lambda: len(got) >= 1000, within=120)
        await mesh.clock.settle()
        tg.cancel_scope.cancel()
    assert got == [b"%d" % i for i in range(1000)]
    await mesh.clock.wait_for(lambda: waiting.usage()[0] == 0, within=30)


async def test_a_restarted_node_has_its_neighbours_interest_before_start_returns(
    mesh: Mesh,
) -> None:
    layout = {"c1": ["n1", "n2"]}
    nodes, _ = await start_mesh(mesh, layout)
    far = nodes["n1"].connect()
    for i in range(2000):
        far.subscribe(f"s/{i}")
    await mesh.clock.settle()
    await mesh.stop("n2")
    n2 = await mesh.start("n2", cluster="c1")
    restarted = await start_dmr(n2, settings_for(mesh, layout, "n2", chunk=500))
    assert restarted.in_sync
    assert len(restarted.neighbour("n1").learned["d"]) == 2000
    # The first publish after start reaches the far subscriber.
    n2.connect().publish("s/1999", b"first")
    await mesh.clock.settle()
    assert [m.payload for m in drain(far)] == [b"first"]


async def test_a_gap_in_advertisements_brings_a_fresh_snapshot(mesh: Mesh) -> None:
    nodes, dmr = await start_mesh(mesh, {"c1": ["n1", "n2"]})
    neighbour = dmr["n2"].neighbour("n1")
    into = dmr["n1"].neighbour("n2").into
    assert into is not None
    snapshots = dmr["n1"].neighbour("n2").snapshots_out
    client = nodes["n1"].connect()
    client.subscribe("kept")
    await mesh.clock.settle()
    into._my_seq += 1  # one change "lost" on the way
    client.subscribe("after-gap")
    await mesh.clock.settle()
    assert dmr["n1"].neighbour("n2").snapshots_out == snapshots + 1
    assert neighbour.learned["d"] == {"kept", "after-gap"}
    assert dmr["n1"].neighbour("n2").resyncs_asked == 1


async def test_guaranteed_messages_cross_into_a_vpn_with_passwords(mesh: Mesh) -> None:
    # a2 binds its waiting queue on a1 over the link a1 dialled; a1 served that bind
    # with a session logged in as 'default' without a password, which a1's VPN, with
    # basic authentication, refused: nothing guaranteed ever moved.
    layout = {"A": ["a1", "a2"]}
    a1, a2 = await mesh.start("a1", cluster="A"), await mesh.start("a2", cluster="A")
    for node, authentication in ((a1, "basic"), (a2, "none")):
        vpn = node.create_vpn("secure", authentication=authentication)
        vpn.add_client_profile(ClientProfile("mesh", allow_bridge_connections=True))
        vpn.add_user("mesh", password_hash=hash_password("pw"), client_profile="mesh")
    a2.guaranteed.create_queue("orders", vpn="secure", subscriptions=["g/>"])  # type: ignore[union-attr]
    for name, node in (("a1", a1), ("a2", a2)):
        settings = settings_for(mesh, layout, name, vpns=["secure"], username="mesh", password="pw")
        await start_dmr(node, settings, wait=False)
    await mesh.clock.run(10)  # a1's link to a2 is up (a2's to a1 waits on a password check)
    sender = a1.vpn("secure").open_internal_session("sender")  # a client with a password
    await sender.send("g/1", b"across")
    await mesh.clock.run(5)
    assert a2.guaranteed.queue("orders", vpn="secure").usage()[0] == 1  # type: ignore[union-attr]
