"""Link mode of the wire protocol against a node, frame by frame (SPEC 7, 10).

A peer made by hand (:class:`~.raw_peer.Peer`) logs in to a node's listener with a HELLO
that names a link, as another node would, and then writes link frames itself; each test
checks what the node makes of them: the login, interest, messages that keep what they
are, guaranteed messages both ways, advertisements, requests, and frames a link must not
carry. ``test_link_fuzz.py`` feeds the node hostile ones.
"""

from __future__ import annotations

import contextlib

import anyio
import anyio.abc
import attrs
import pytest

from meshbus import ClientProfile, LinkState
from meshbus.errors import ProtocolError
from meshbus.transports import (
    Backoff,
    ConnectionState,
    ConnectSettings,
    FrameKind,
    LinkProtocol,
    ListenerSettings,
    MemoryNetwork,
    Role,
    encode_frame,
    open_link,
)
from meshbus.transports import _events as ev
from meshbus.transports.testing import Mesh

from .raw_peer import GONE, LINK, LISTENER, accepted, linked, rig

pytestmark = pytest.mark.anyio

K = FrameKind
EPOCH = 1_700_000_000.0  # what a ManualClock's time() starts at


# --- logging in --------------------------------------------------------------------------------


async def test_a_link_login_is_welcomed_in_link_mode() -> None:
    async with rig() as r:
        peer = r.peer("peer")
        kind, welcome = await peer.login()
        assert kind == K.WELCOME
        assert isinstance(welcome, ev.Welcome)
        assert (welcome.link, welcome.node_id, welcome.vpn) == ("bridge", "node", "default")
        assert peer.protocol.link_mode
        link = accepted(r)
        assert (link.kind, link.peer_node, link.state.value) == ("bridge", "peer", "in-sync")
        assert r.links.opened == ["peer/x"]
        assert r.server.statistics().logins == 1
        await peer.hang_up()
        assert r.node.vpn().links.get("peer/x") is None
        assert r.links.closed == [("peer/x", "reading from peer: connection closed by the peer")]
        assert [s.client_name for s in r.node.vpn().sessions] == []


async def test_a_link_login_needs_a_client_profile_that_allows_bridge_connections() -> None:
    async with rig(allow_links=False) as r:
        vpn = r.node.vpn()
        failures = vpn.login_failures
        peer = r.peer("peer")
        kind, refused = await peer.login()
        assert kind == K.REFUSED
        assert isinstance(refused, ev.Refused)
        assert refused.error == "authentication"
        assert "client profile 'default' does not allow bridge connections" in refused.why
        await r.clock.settle()
        assert peer.ended
        assert peer.served.is_set()
        assert vpn.login_failures == failures + 1
        stats = r.server.statistics()
        assert (stats.refused, stats.logins, stats.open) == (1, 0, 0)
        assert (len(vpn.links), len(vpn.sessions)) == (0, 0)
        assert r.links.opened == []

        # A user whose profile allows them may; the same user in a session still logs in.
        vpn.add_client_profile(ClientProfile("bridges", allow_bridge_connections=True))
        vpn.add_user("bridge", client_profile="bridges")
        bridge = r.peer("bridge")
        assert (await bridge.login(username="bridge"))[0] == K.WELCOME
        session = r.peer("session")
        assert (await session.login(None))[0] == K.WELCOME
        assert not session.protocol.link_mode
        assert [link.name for link in vpn.links] == ["peer/x"]


async def test_a_link_client_refuses_a_welcome_that_does_not_name_a_link() -> None:
    protocol = LinkProtocol(Role.CLIENT, max_frame_size=1 << 20)
    protocol.hello({"link": LINK})
    with pytest.raises(ProtocolError, match="did not accept a link: it logged in a session"):
        protocol.receive_data(encode_frame(K.WELCOME, {"client_name": "c", "vpn": "default"}))
    assert protocol.state is ConnectionState.CLOSED


async def test_a_link_to_a_node_that_answers_with_a_session_backs_off() -> None:
    # A node that does not know link mode logs the HELLO in as a session: the link must
    # not run over that connection.
    async with rig() as r:
        network = MemoryNetwork(r.clock)
        hellos: list[ev.Hello] = []

        async def old_node(stream: anyio.abc.ByteStream) -> None:
            protocol = LinkProtocol(Role.SERVER, max_frame_size=1 << 20)
            [(_, hello, _)] = protocol.receive_data(await stream.receive())
            hellos.append(hello)
            await stream.send(encode_frame(K.WELCOME, {"client_name": "s", "vpn": "default"}))
            with contextlib.suppress(*GONE):
                await stream.receive()  # until the link hangs up

        r.tg.start_soon(network.listen("old").serve, old_node)
        settings = ConnectSettings(
            network.connectable("old"), clock=r.clock, backoff=Backoff(jitter=0.0)
        )
        link = open_link(r.node.vpn(), "to-old", settings, wants=["a/>"])
        await r.clock.wait_for(lambda: link.connect_failures == 1, within=30)
        assert link.state.value == "backoff"
        assert "the node did not accept a link" in link.reason
        assert link.connects == 0
        assert hellos[0].link == ev.LinkLogin("bridge", "to-old", "node", None)
        link.stop()
        await r.clock.settle()


async def test_the_welcome_of_a_link_is_written_at_once() -> None:
    # Not at the next keepalive tick: with a listener keepalive of 20 s or more that came
    # after the dialler's connect_timeout (10 s), and a link to the node never came up.
    async with rig(attrs.evolve(LISTENER, keepalive=30.0, keepalive_timeout=90.0)) as r:
        peer = r.peer("peer")
        peer.protocol.hello({"link": LINK})
        await peer.flush()
        await r.clock.settle()  # no time passes
        assert peer.protocol.state is ConnectionState.OPEN
        [(kind, welcome, _)] = peer.frames
        assert (kind, welcome.link) == (K.WELCOME, "bridge")


async def test_a_link_comes_up_at_once_whatever_the_keepalive_of_the_listener() -> None:
    async with Mesh() as mesh:  # the same end to end
        await mesh.start("a", listener=ListenerSettings(keepalive=30.0, keepalive_timeout=90.0))
        b = await mesh.start("b")
        link = mesh.link(b, "a", wants=["orders/>"])
        took = await mesh.clock.wait_for(lambda: link.state is LinkState.IN_SYNC, within=120)
        assert (took, link.connect_failures) == (0.0, 0)


async def test_a_link_replaced_by_a_new_login_of_its_peer_is_closed() -> None:
    # The peer came back while its old connection still looks alive: the old one goes at
    # once, with what it held, not when its keepalive runs out.
    async with rig() as r:
        r.node.guaranteed.create_queue("to-peer", subscriptions=["out/>"])
        await r.node.connect(client_name="local").send("out/1", b"one")
        old = await linked(r, "old")
        assert isinstance(await old.request(K.BIND, {"id": 1, "queue": "to-peer"}), ev.Ok)
        assert len(old.take(K.FLOW_DELIVER)) == 1
        new = await linked(r, "new")  # the same link: node peer, name x
        await r.clock.settle()
        assert accepted(r).peer_node == "peer"
        assert not new.ended
        assert old.ended
        assert old.served.is_set()
        assert len(r.node.vpn().sessions) == 2  # the new link's, and local
        # What the old connection held goes back to the queue, for the new one to bind.
        bound = await new.request(K.BIND, {"id": 1, "queue": "to-peer"})
        assert isinstance(bound, ev.Ok)
        [(_, message)] = new.take(K.FLOW_DELIVER)
        assert (message.payload, message.redelivered) == (b"one", True)
