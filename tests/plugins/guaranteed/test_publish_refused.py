"""Guaranteed messages the node refuses (SPEC 4), and what it stores then (nothing):
a topic publish a queue cannot take, quotas at their boundaries (messages, bytes,
message size), and who may send at all (client profile, ACL, the guaranteed plugin,
an open session).

Where storage matters, a test runs on the MemoryStore (a node without ``data_dir``)
and on the SqliteStore (``Node(data_dir=...)``).
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    ClientProfile,
    ConfigurationError,
    InvalidTopicError,
    Node,
    PublishRejectedError,
    Session,
    StateError,
)
from meshbus.plugins.guaranteed._settings import MAX_MESSAGE_SIZE

from ._helpers import PLUGINS, drain, held, receive, service, spooled

# --- rejection of a topic publish ---------------------------------------------------------


async def test_topic_publish_rejected_when_a_rejecting_queue_cannot_take_it(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        # matched before the rejecting queue: it must not count a discard for nothing
        lenient = svc.create_queue(
            "lenient", subscriptions=["t/>"], max_messages=1, reject_msg_to_sender_on_discard=False
        )
        svc.create_queue("roomy", subscriptions=["t/>"])
        full = svc.create_queue("full", subscriptions=["t/>"], max_messages=1)
        sub = node.connect()
        sub.subscribe("t/>")
        s = node.connect()
        await s.send("t/1", b"first")
        assert await drain(sub) != []
        before = svc.store.statistics()
        with pytest.raises(PublishRejectedError) as info:
            await s.send("t/2", b"second")
        assert info.value.reason == "over-quota"
        assert (info.value.limit, info.value.size) == (1, 2)
        assert "full" in str(info.value)
        # Nothing stored in ANY queue, and no direct copy went out.
        assert svc.store.statistics() == before
        assert held(node, "roomy") == held(node, "full") == held(node, "lenient") == (1, 5)
        assert await drain(sub) == []
        # The sender got it back: no queue counts it as discarded.
        assert full.discarded == lenient.discarded == 0


async def test_topic_publish_over_a_queue_max_message_size_is_rejected() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("small", subscriptions=["t/>"], max_message_size=4)
        svc.create_queue("big", subscriptions=["t/>"])
        s = node.connect()
        with pytest.raises(PublishRejectedError) as info:
            await s.send("t/1", b"12345")
        assert (info.value.reason, info.value.limit, info.value.size) == ("too-large", 4, 5)
        assert held(node, "big") == (0, 0)
        await s.send("t/1", b"1234")
        assert held(node, "big") == held(node, "small") == (1, 4)


async def test_topic_publish_to_a_queue_with_ingress_disabled_is_rejected() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("closed", subscriptions=["t/>"], ingress_enabled=False)
        svc.create_queue("open", subscriptions=["t/>"])
        with pytest.raises(PublishRejectedError) as info:
            await node.connect().send("t/1", b"x")
        assert info.value.reason == "ingress-disabled"
        assert held(node, "open") == (0, 0)


async def test_queues_that_do_not_reject_count_a_discard_and_others_still_get_it(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        quiet = svc.create_queue(
            "quiet", subscriptions=["t/>"], max_messages=1, reject_msg_to_sender_on_discard=False
        )
        small = svc.create_queue(
            "small",
            subscriptions=["t/>"],
            max_message_size=2,
            reject_msg_to_sender_on_discard=False,
        )
        closed = svc.create_queue(
            "closed",
            subscriptions=["t/>"],
            ingress_enabled=False,
            reject_msg_to_sender_on_discard=False,
        )
        svc.create_queue("other", subscriptions=["t/>"])
        s = node.connect()
        await s.send("t/1", b"aa")
        await s.send("t/2", b"bbb")  # quiet is full, small too small: no error
        assert held(node, "other") == (2, 5)
        assert held(node, "quiet") == (1, 2)
        assert held(node, "small") == (1, 2)
        assert held(node, "closed") == (0, 0)
        assert (quiet.discarded, small.discarded, closed.discarded) == (1, 1, 2)
        # Only a queue that does not reject matches: acked, and stored nowhere.
        svc.create_queue(
            "lonely",
            subscriptions=["x/>"],
            ingress_enabled=False,
            reject_msg_to_sender_on_discard=False,
        )
        before = svc.store.statistics()
        await s.send("x/1", b"z")
        assert svc.store.statistics() == before


async def test_message_over_30_mb_is_rejected_even_without_matching_queue() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q")
        s = node.connect()
        sub = node.connect()
        sub.subscribe(">")
        big = bytes(MAX_MESSAGE_SIZE + 1)
        with pytest.raises(PublishRejectedError) as info:
            await s.send("t/1", big)
        assert (info.value.reason, info.value.limit, info.value.size) == (
            "too-large",
            MAX_MESSAGE_SIZE,
            MAX_MESSAGE_SIZE + 1,
        )
        assert await drain(sub) == []
        with pytest.raises(PublishRejectedError) as info:
            await s.send_to_queue("q", big)
        assert info.value.reason == "too-large"
        (result,) = await s.send_many([("t/1", big)])
        assert isinstance(result, PublishRejectedError)
        assert result.reason == "too-large"
        await s.send_to_queue("q", bytes(MAX_MESSAGE_SIZE))  # the limit itself is taken
        assert held(node, "q") == (1, MAX_MESSAGE_SIZE)


# --- quotas ---------------------------------------------------------------------------------


async def test_max_messages_is_enforced_at_the_boundary_and_acks_free_room(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_messages=3)
        s = node.connect()
        for i in range(3):
            await s.send("t/x", str(i).encode())
        for attempt in (s.send("t/x", b"3"), s.send_to_queue("q", b"3")):
            with pytest.raises(PublishRejectedError) as info:
                await attempt
            assert (info.value.reason, info.value.limit, info.value.size) == ("over-quota", 3, 4)
        assert held(node, "q") == (3, 3)
        flow = await s.bind("q", window=3)
        m = await receive(flow)
        with pytest.raises(PublishRejectedError):  # delivered is not acked: still counts
            await s.send("t/x", b"3")
        flow.ack(m)  # acked, commit still pending: the room is free already
        await s.send("t/x", b"3")
        with pytest.raises(PublishRejectedError):
            await s.send_to_queue("q", b"4")
        await flow.unbind()
        assert held(node, "q") == (3, 3)


async def test_max_bytes_is_enforced_at_the_boundary_and_acks_free_room(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_bytes=10)
        s = node.connect()
        await s.send("t/x", b"1234")
        await s.send_to_queue("q", b"567890")  # exactly 10 bytes: taken
        with pytest.raises(PublishRejectedError) as info:
            await s.send("t/x", b"!")
        assert (info.value.reason, info.value.limit, info.value.size) == ("over-quota", 10, 11)
        await s.send("t/x", b"")  # an empty message takes no bytes
        assert held(node, "q") == (3, 10)
        async with await s.bind("q") as flow:
            flow.ack(await receive(flow))  # frees 4 bytes
            with pytest.raises(PublishRejectedError) as info:
                await s.send("t/x", b"12345")
            assert (info.value.limit, info.value.size) == (10, 11)
            await s.send("t/x", b"1234")
        assert held(node, "q") == (3, 10)


async def test_max_message_size_boundary(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_message_size=10)
        s = node.connect()
        await s.send("t/x", bytes(10))
        await s.send_to_queue("q", bytes(10))
        for attempt in (s.send("t/x", bytes(11)), s.send_to_queue("q", bytes(11))):
            with pytest.raises(PublishRejectedError) as info:
                await attempt
            assert (info.value.reason, info.value.limit, info.value.size) == ("too-large", 10, 11)
        assert held(node, "q") == (2, 20)


async def test_concurrent_publishers_cannot_overshoot_a_quota(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_messages=5)
        outcomes: list[str] = []

        async def publish(s: Session) -> None:
            try:
                await s.send("t/x", b"x")
                outcomes.append("ok")
            except PublishRejectedError as exc:
                outcomes.append(exc.reason)

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(publish, node.connect())
        assert sorted(outcomes) == ["ok"] * 5 + ["over-quota"] * 7
        assert held(node, "q") == (5, 5)


# --- who may send ---------------------------------------------------------------------------


async def test_sending_is_denied_when_the_client_profile_disallows_guaranteed_send(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"])
        vpn = node.vpn()
        vpn.add_client_profile(ClientProfile("direct-only", allow_guaranteed_send=False))
        vpn.add_user("dan", client_profile="direct-only")
        s = node.connect(username="dan")
        for attempt in (
            s.send("t/1", b"x"),
            s.send_to_queue("q", b"x"),
            s.send_many([("t/1", b"x")]),
        ):
            with pytest.raises(AccessDeniedError) as info:
                await attempt
            assert info.value.username == "dan"
        assert svc.store.endpoints() == []
        s.publish("t/1", b"direct")  # direct publishing is still allowed (and spooled)
        await spooled(svc.queue("q"), 1)


async def test_acl_denied_topics_are_refused_before_anything_is_stored() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=[">"])
        vpn = node.vpn()
        vpn.add_acl_profile(AclProfile("no-secrets", publish_exceptions=["secret/>"]))
        vpn.add_user("eve", acl_profile="no-secrets")
        s = node.connect(username="eve")
        with pytest.raises(AccessDeniedError):
            await s.send("secret/1", b"x")
        with pytest.raises(InvalidTopicError):
            await s.send("#system", b"x")
        results = await s.send_many([("secret/2", b"x"), ("open/1", b"y")])
        assert isinstance(results[0], AccessDeniedError)
        assert results[1] is None
        assert held(node, "q") == (1, 1)


async def test_send_to_queue_is_judged_by_the_publish_acl_as_its_queue_topic(
    data_dir: Path | None,
) -> None:
    # SPEC 4: a queue addressed by name is the reserved topic #P2P/QUE/<name> for the ACL.
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("alarms")
        svc.create_queue("orders")
        vpn = node.vpn()
        vpn.add_acl_profile(
            AclProfile(
                "plant-only",
                publish_default="deny",
                publish_exceptions=["plant/>"],
            )
        )
        vpn.add_user("sensor", acl_profile="plant-only")
        s = node.connect(username="sensor")
        with pytest.raises(AccessDeniedError) as info:
            await s.send_to_queue("alarms", b"x")
        assert (info.value.username, info.value.action) == ("sensor", "publish")
        assert info.value.topic == "#P2P/QUE/alarms"
        assert "#P2P/QUE/alarms" in str(info.value)
        assert s.statistics().denied == 1
        assert held(node, "alarms") == (0, 0)
        # Denied before the queue is looked up: a denied user learns nothing of the
        # queues there are.
        with pytest.raises(AccessDeniedError):
            await s.send_to_queue("no-such-queue", b"x")
        assert s.statistics().denied == 2
        assert node.vpn().statistics().denied == 2
        await s.send("plant/boiler", b"topics the ACL allows are still taken")
        with pytest.raises(AccessDeniedError):
            await s.send("alarms/x", b"x")
        assert held(node, "orders") == (0, 0)


async def test_a_queue_topic_exception_allows_sending_to_that_queue() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("alarms")
        svc.create_queue("orders")
        vpn = node.vpn()
        vpn.add_acl_profile(
            AclProfile("orders", publish_default="deny", publish_exceptions=["#P2P/QUE/orders"])
        )
        vpn.add_user("clerk", acl_profile="orders")
        s = node.connect(username="clerk")
        await s.send_to_queue("orders", b"allowed by its exception")
        assert held(node, "orders") == (1, 24)
        with pytest.raises(AccessDeniedError):
            await s.send_to_queue("alarms", b"x")
        with pytest.raises(AccessDeniedError):
            s.publish("orders", b"a topic named like the queue is not the queue")


async def test_queue_topic_exceptions_follow_the_default_and_the_variables() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        for name in ("inbox-ann", "inbox-bob", "audit"):
            svc.create_queue(name)
        vpn = node.vpn()
        vpn.add_acl_profile(
            AclProfile(
                "own-inbox",
                publish_exceptions=["#P2P/QUE/inbox-*", "#P2P/QUE/audit"],
                subscribe_default="allow",
            )
        )
        vpn.add_acl_profile(
            AclProfile(
                "inbox-only",
                publish_default="deny",
                publish_exceptions=["#P2P/QUE/inbox-$client-username"],
            )
        )
        vpn.add_user("mallory", acl_profile="own-inbox")
        vpn.add_user("ann", acl_profile="inbox-only")
        mallory = node.connect(username="mallory")
        for queue in ("inbox-ann", "audit"):  # default allow: the exceptions are denied
            with pytest.raises(AccessDeniedError):
                await mallory.send_to_queue(queue, b"x")
        mallory.publish("inbox-ann/x")  # an ordinary topic is not a queue topic
        ann = node.connect(username="ann")
        await ann.send_to_queue("inbox-ann", b"to myself")
        with pytest.raises(AccessDeniedError):
            await ann.send_to_queue("inbox-bob", b"x")
        assert held(node, "inbox-ann") == (1, 9)
        assert held(node, "inbox-bob") == (0, 0)


async def test_send_without_the_guaranteed_plugin_raises_configuration_error() -> None:
    async with Node(plugins=["direct"]) as node:
        s = node.connect()
        for attempt in (
            s.send("t/1", b"x"),
            s.send_to_queue("q", b"x"),
            s.send_many([("t/1", b"x")]),
        ):
            with pytest.raises(ConfigurationError, match="guaranteed"):
                await attempt


async def test_send_on_a_closed_session_raises_state_error(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"])
        s = node.connect()
        await s.send("t/1", b"warm the topic cache")
        s.close()
        for attempt in (s.send("t/1", b"x"), s.send_to_queue("q", b"x"), s.send_many([])):
            with pytest.raises(StateError):
                await attempt
        assert held(node, "q") == (1, 20)
