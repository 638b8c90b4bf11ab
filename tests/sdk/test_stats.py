"""Statistics of sessions, VPNs and the node: exact numbers in small scenarios."""

from __future__ import annotations

import attrs
import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    AuthenticationError,
    ClientProfile,
    Message,
    Node,
    NodeStatistics,
    SessionStatistics,
    VpnStatistics,
)


async def test_a_fresh_node_counts_nothing(meshbus_node: Node) -> None:
    assert meshbus_node.statistics() == NodeStatistics(
        node_id=meshbus_node.node_id,
        cluster=None,
        vpns=1,
        sessions=0,
        published=0,
        delivered=0,
        discarded=0,
        denied=0,
        unmatched=0,
        login_failures=0,
    )


async def test_session_statistics(meshbus_node: Node) -> None:
    vpn = meshbus_node.vpn()
    vpn.add_client_profile(ClientProfile("small", egress_max_messages=2))
    vpn.add_acl_profile(AclProfile("acl", publish_exceptions=["no"], subscribe_exceptions=["no"]))
    vpn.add_user("u", client_profile="small", acl_profile="acl")
    s = meshbus_node.connect(username="u")
    s.subscribe("a")
    s.subscribe("b/>")
    with pytest.raises(AccessDeniedError):
        s.subscribe("no")
    with pytest.raises(AccessDeniedError):
        s.publish("no")
    s.publish("a", b"12345")  # delivered to itself
    s.publish("b/1", b"1")
    s.publish("b/2", b"22")  # egress holds 2: the first is discarded
    s.publish("c")  # unmatched
    assert s.statistics() == SessionStatistics(
        published=4,
        delivered=0,
        discarded=1,
        denied=2,
        handler_errors=0,
        egress_messages=2,
        egress_bytes=3,
        subscriptions=2,
    )
    assert s.receive_nowait() is not None
    stats = s.statistics()
    assert (stats.delivered, stats.egress_messages, stats.egress_bytes) == (1, 1, 2)


async def test_vpn_and_node_totals_include_closed_sessions(meshbus_node: Node) -> None:
    node = meshbus_node
    vpn = node.vpn()
    vpn.add_client_profile(ClientProfile("one", egress_max_messages=1))
    vpn.add_acl_profile(AclProfile("ro", publish_default="deny"))
    vpn.add_user("slow", client_profile="one")
    vpn.add_user("ro", acl_profile="ro")
    vpn.add_acl_profile(AclProfile("locked", connect_default="deny"))
    vpn.add_user("locked", acl_profile="locked")

    seen: list[Message] = []
    handler = node.connect(on_message=seen.append)
    handler.subscribe("t/>")
    slow = node.connect(username="slow")
    slow.subscribe("t/>")
    reader = node.connect(username="ro")
    reader.subscribe("t/1")
    publisher = node.connect()

    publisher.publish("t/1")  # handler, slow (egress), reader (egress)
    publisher.publish("t/2")  # handler, slow: 't/1' discarded from its egress
    publisher.publish("u")  # unmatched
    with pytest.raises(AccessDeniedError):
        reader.publish("t/1")
    with pytest.raises(AccessDeniedError):
        node.connect(username="locked")
    assert reader.receive_nowait() is not None

    expected = VpnStatistics(
        sessions=4,
        published=3,
        delivered=3,  # two to the handler, one received by the reader
        discarded=1,
        denied=1,
        unmatched=1,
        login_failures=1,
    )
    assert vpn.statistics() == expected

    # Closing sessions keeps their counts in the VPN's totals ...
    for session in (handler, slow, reader, publisher):
        session.close()
    assert vpn.statistics() == attrs.evolve(expected, sessions=0)

    # ... and the node adds up every VPN.
    other = node.create_vpn("other", authentication="basic")
    with pytest.raises(AuthenticationError):
        node.connect("other", username="nobody")
    assert node.statistics() == NodeStatistics(
        node_id=node.node_id,
        cluster=None,
        vpns=2,
        sessions=0,
        published=3,
        delivered=3,
        discarded=1,
        denied=1,
        unmatched=1,
        login_failures=2,
    )
    assert other.statistics().login_failures == 1


async def test_delivery_counts_once_per_receiving_session(meshbus_node: Node) -> None:
    subs = [meshbus_node.connect(on_message=lambda m: None) for _ in range(3)]
    for s in subs:
        s.subscribe("t")
        s.subscribe("#noexport/t")  # same filter again: still one delivery each
        s.subscribe("t*")
    no_local = meshbus_node.connect(no_local=True, on_message=lambda m: None)
    no_local.subscribe("t")
    no_local.publish("t")
    stats = meshbus_node.vpn().statistics()
    assert (stats.published, stats.delivered, stats.unmatched) == (1, 3, 0)
    # A no-local session alone on a topic: nothing delivered, the message was unmatched.
    only_me = meshbus_node.connect(no_local=True)
    only_me.subscribe("mine")
    only_me.publish("mine")
    stats = meshbus_node.vpn().statistics()
    assert (stats.published, stats.delivered, stats.unmatched) == (2, 3, 1)
    assert only_me.receive_nowait() is None


async def test_handler_errors_are_counted_per_session(meshbus_node: Node) -> None:
    def broken(message: Message) -> None:
        raise RuntimeError("x")

    bad = meshbus_node.connect(on_message=broken)
    bad.subscribe("t")
    for _ in range(4):
        bad.publish("t")
    stats = bad.statistics()
    assert (stats.handler_errors, stats.delivered, stats.published) == (4, 4, 4)


async def test_removing_a_vpn_removes_its_counts_from_the_node(meshbus_node: Node) -> None:
    meshbus_node.create_vpn("temp")
    meshbus_node.connect("temp").publish("t")
    meshbus_node.connect().publish("t")
    assert meshbus_node.statistics().published == 2
    meshbus_node.remove_vpn("temp")
    stats = meshbus_node.statistics()
    assert (stats.vpns, stats.published, stats.unmatched, stats.sessions) == (1, 1, 1, 1)


def test_statistics_are_frozen_snapshots() -> None:
    node = Node()
    stats = node.vpn().statistics()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        stats.published = 5  # type: ignore[misc]
    assert node.statistics().vpns == 1
