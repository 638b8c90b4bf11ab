"""Remote sessions over real TCP on 127.0.0.1: who they are and what they may do
(SPEC 6): ACL refusals and the errors the node reports with their attributes, client
names requested, generated and refused, and node statistics by role."""

from __future__ import annotations

import pytest

from meshbus import (
    AccessDeniedError,
    AclAction,
    AclProfile,
    AuthenticationError,
    InvalidTopicError,
    Node,
    TopicLimits,
)
from meshbus.transports import Server, connect

from ._remote import receive
from .conftest import wait_until


def _restricted(node: Node) -> None:
    vpn = node.vpn()
    vpn.add_acl_profile(
        AclProfile(
            "restricted",
            publish_exceptions=["secret/>"],
            subscribe_default=AclAction.DENY,
            subscribe_exceptions=["allowed/>"],
        )
    )
    vpn.add_user("carol", acl_profile="restricted")


async def test_acl_denied_subscribe_surfaces_in_confirm(node: Node, server: Server) -> None:
    _restricted(node)
    async with connect(server.url, username="carol") as session:
        session.subscribe("allowed/x")
        session.subscribe("forbidden/x")
        with pytest.raises(AccessDeniedError, match="forbidden/x"):
            await session.confirm()
        assert session.subscriptions == ("allowed/x",)  # the refused one is dropped
        assert session.errors == 1
        await session.confirm()  # reported once
        # A refusal and the confirm's answer often arrive in one read: every confirm
        # must still see the refusal made before it.
        for i in range(20):
            session.subscribe(f"forbidden/{i}")
            with pytest.raises(AccessDeniedError, match=f"forbidden/{i}"):
                await session.confirm()
        assert session.subscriptions == ("allowed/x",)


async def test_acl_denied_publish_surfaces_in_confirm(node: Node, server: Server) -> None:
    _restricted(node)
    watcher = node.connect()
    watcher.subscribe(">")
    async with connect(server.url, username="carol") as session:
        session.publish("secret/plans", b"x")
        session.publish("public/news", b"y")
        with pytest.raises(AccessDeniedError, match="secret/plans"):
            await session.confirm()
        assert session.errors == 1
        await session.confirm()
        # The denied publish changed nothing: only the allowed one was delivered.
        assert [m.topic for m in iter(watcher.receive_nowait, None)] == ["public/news"]
    assert node.vpn().statistics().denied == 1
    watcher.close()


async def test_errors_reported_by_the_node_carry_their_attributes(
    node: Node, server: Server
) -> None:
    _restricted(node)
    node.create_vpn("tight", topic_limits=TopicLimits(max_levels=3))
    async with connect(server.url, username="carol") as session:
        session.publish("secret/plans")
        with pytest.raises(AccessDeniedError) as denied:
            await session.confirm()
        assert (denied.value.action, denied.value.topic) == ("publish", "secret/plans")
        assert denied.value.username == "carol"
        await session.send("allowed/x", b"")
        with pytest.raises(AccessDeniedError) as denied:
            await session.send("secret/plans", b"")
        assert (denied.value.action, denied.value.topic) == ("publish", "secret/plans")
    async with connect(server.url, vpn="tight") as session:
        session.publish("a/b/c/d")  # valid by default, over this VPN's limits
        with pytest.raises(InvalidTopicError) as invalid:
            await session.confirm()
    assert invalid.value.topic == "a/b/c/d"
    assert invalid.value.reason


async def test_acl_denied_guaranteed_send_raises(node: Node, server: Server) -> None:
    _restricted(node)
    async with connect(server.url, username="carol") as session:
        with pytest.raises(AccessDeniedError):
            await session.send("secret/plans", b"x")
        await session.send("public/news", b"y")  # no endpoint: acked and discarded


async def test_client_name_requested_and_generated(node: Node, server: Server) -> None:
    async with connect(server.url, client_name="alpha") as named, connect(server.url) as anon:
        assert named.client_name == "alpha"
        assert named.welcome["client_name"] == "alpha"
        assert anon.client_name is not None
        assert anon.client_name.startswith("node-")
        assert set(node.vpn().sessions) == {"alpha", anon.client_name}
        assert node.vpn().sessions["alpha"].username == "default"
        assert "alpha" in repr(named)
    await wait_until(lambda: not node.vpn().sessions)


async def test_duplicate_client_name_is_refused(node: Node, server: Server) -> None:
    existing = node.connect(client_name="dup")
    with pytest.raises(AuthenticationError, match="already in use"):
        async with connect(server.url, client_name="dup"):
            pytest.fail("logged in with a client name in use")
    assert server.statistics().refused == 1
    assert node.vpn().sessions["dup"] is existing  # the first one is untouched
    async with connect(server.url, client_name="dup2") as remote:
        with pytest.raises(AuthenticationError, match="already in use"):
            async with connect(server.url, client_name="dup2"):
                pass
        remote.subscribe("still")
        await remote.confirm()  # the first remote session still works
    existing.close()


async def test_node_statistics_of_a_management_user(node: Node, server: Server) -> None:
    node.vpn().add_user("ops", management=True)
    async with connect(server.url, username="ops") as a, connect(server.url) as b:
        b.subscribe("s")
        await b.confirm()
        a.publish("s", b"x")
        a.publish("nobody", b"y")
        await receive(b)
        stats = await a.node_statistics()
    assert set(stats) == {"node", "totals", "vpns", "links", "plugins", "listeners"}
    assert stats["links"] == {}  # no VPN has a link
    assert stats["node"] == "node"
    assert set(stats["vpns"]) == {"default"}
    default = stats["vpns"]["default"]
    assert default["sessions"] == 2
    assert default["published"] == 2
    assert default["delivered"] == 1
    assert default["unmatched"] == 1
    assert stats["totals"]["vpns"] == 1
    assert stats["totals"]["sessions"] == 2
    listener = stats["listeners"][server.url]
    assert listener["accepted"] == 2
    assert listener["logins"] == 2
    assert listener["open"] == 2
    assert listener["bytes_received"] > 0
    assert listener["bytes_sent"] > 0
    assert set(listener) == {
        "accepted",
        "open",
        "logins",
        "refused",
        "failed",
        "bytes_received",
        "bytes_sent",
        "turned_away",
    }


async def test_node_statistics_show_a_session_its_own_vpn_only(node: Node, server: Server) -> None:
    # SPEC 6: another tenant's counters (here its login failures) and the listeners'
    # are not a session's business without the management role.
    secret = node.create_vpn("secret", authentication="basic")
    secret.add_user("admin", password="pw")
    with pytest.raises(AuthenticationError):
        node.connect("secret", username="admin")  # no password given
    assert node.statistics().login_failures == 1
    async with connect(server.url, username="anyone") as anonymous:
        anonymous.publish("x", b"y")
        stats = await anonymous.node_statistics()
    assert set(stats) == {"node", "vpns", "links", "plugins"}
    assert stats["plugins"] == {}  # no plugin has figures of its own for this VPN
    assert stats["node"] == "node"
    assert list(stats["vpns"]) == ["default"]
    assert stats["links"] == {"default": {}}
    own = stats["vpns"]["default"]
    assert (own["sessions"], own["published"], own["login_failures"]) == (1, 1, 0)


async def test_node_statistics_of_a_management_user_cover_every_vpn(
    node: Node, server: Server
) -> None:
    secret = node.create_vpn("secret", authentication="basic")
    secret.add_user("admin", password="pw")
    with pytest.raises(AuthenticationError):
        node.connect("secret", username="admin")
    tenant = node.create_vpn("tenant")
    tenant.add_user("ops", management=True)
    async with connect(server.url, vpn="tenant", username="ops") as ops:
        stats = await ops.node_statistics()
    assert list(stats["vpns"]) == ["default", "secret", "tenant"]
    assert stats["vpns"]["secret"]["login_failures"] == 1
    assert stats["totals"]["login_failures"] == 1
    assert stats["totals"]["vpns"] == 3
    assert stats["listeners"][server.url]["logins"] == 1
