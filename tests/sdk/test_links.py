"""The core of links (SPEC 7): the link router, stages, origin de-duplication, state,
and guaranteed messages coming in over a link. Links here keep what they are given;
links over connections are tested with the transports."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    ConfigurationError,
    DeliveryMode,
    Envelope,
    Link,
    LinkPipeline,
    LinkState,
    ManualClock,
    Message,
    Node,
    OriginFilter,
    PublishRejectedError,
    StateError,
    hookimpl,
)
from meshbus._acl import AclChecker
from tests.sdk.list_link import ListLink, attached


@pytest.fixture
async def node() -> Any:
    async with Node(name="n", node_id="n1", clock=ManualClock()) as running:
        yield running


async def test_the_link_router_runs_only_while_some_link_has_interest(node: Node) -> None:
    vpn = node.vpn()
    assert "links" in vpn.routers
    assert not vpn.router_enabled("links")
    link = attached(vpn, "a")
    assert not vpn.router_enabled("links")
    link.add_interest("t/>")
    assert vpn.router_enabled("links")
    link.remove_interest("t/>")
    assert not vpn.router_enabled("links")
    link.add_interest("t/>")
    vpn.links.detach(link)
    assert not vpn.router_enabled("links")
    assert link.state is LinkState.DISABLED


async def test_one_copy_per_link_however_many_of_its_filters_match(node: Node) -> None:
    vpn = node.vpn()
    a = attached(vpn, "a", "t/>", "t/*", "t/x")
    b = attached(vpn, "b", ">")
    c = attached(vpn, "c", "other")
    publisher = node.connect()
    publisher.publish("t/x", b"1")
    assert (a.topics, b.topics, c.topics) == (["t/x"], ["t/x"], [])
    assert (a.forwarded, b.forwarded, c.forwarded) == (1, 1, 0)


async def test_a_message_never_goes_back_over_the_link_it_came_in_on(node: Node) -> None:
    vpn = node.vpn()
    a = attached(vpn, "a", ">")
    b = attached(vpn, "b", ">")
    subscriber = node.connect()
    subscriber.subscribe(">")
    assert a.receive(Message("t", b"x", origin=("n0", 1)))
    assert a.topics == []
    assert b.topics == ["t"]
    assert a.statistics().dropped == {"no_local": 1}
    assert a.statistics().received == 1
    message = subscriber.receive_nowait()
    assert message is not None
    assert message.payload == b"x"


async def test_the_origin_is_given_once_and_kept_on_later_hops(node: Node) -> None:
    vpn = node.vpn()
    a = attached(vpn, "a", ">")
    b = attached(vpn, "b", ">")
    publisher = node.connect()
    publisher.publish("t", b"1")
    publisher.publish("t", b"2")
    first, second = a.sent[0][2], a.sent[1][2]
    assert first.origin is not None
    assert first.origin[0] == "n1"
    assert second.origin is not None
    assert second.origin[1] == first.origin[1] + 1
    assert b.sent[0][2].origin == first.origin  # the same origin on every link
    # A message from elsewhere keeps its origin when it goes on.
    c = attached(vpn, "c")
    c.receive(Message("t", b"3", origin=("far", 7), hop_count=2))
    assert a.sent[-1][2].origin == ("far", 7)
    assert a.sent[-1][1] == 2  # the hop count a link is given starts from the message's


async def test_a_duplicate_origin_is_dropped_and_counted(node: Node) -> None:
    vpn = node.vpn()
    a = attached(vpn, "a")
    b = attached(vpn, "b")
    no_dedup = attached(vpn, "plain", dedup=False)
    subscriber = node.connect()
    subscriber.subscribe("t")
    assert a.receive(Message("t", b"x", origin=("far", 1)))
    assert not b.receive(Message("t", b"x", origin=("far", 1)))  # round the other way
    assert b.statistics().dropped == {"duplicate": 1}
    assert no_dedup.receive(Message("t", b"x", origin=("far", 1)))  # does not look
    # Without an origin there is nothing to compare: it is taken.
    assert a.receive(Message("t", b"y"))
    assert a.receive(Message("t", b"y"))
    assert [m.payload for m in iter(subscriber.receive_nowait, None)] == [b"x", b"x", b"y", b"y"]


async def test_stages_filter_and_change_what_goes_out_and_count_their_drops() -> None:
    class Mapper:
        @hookimpl
        def meshbus_link_pipeline(self, link: Link, pipeline: LinkPipeline) -> None:
            if link.name != "mapped":
                return

            def hop(envelope: Envelope) -> bool:
                envelope.hop_count += 1
                return envelope.hop_count <= 1

            def rename(envelope: Envelope) -> bool:
                message = envelope.message
                if message.topic.startswith("private/"):
                    return False
                envelope.message = message.evolve(topic="remote/" + message.topic)
                return True

            pipeline.add_egress("hopcount", hop, reason="hop_limit")
            pipeline.add_egress("mapping", rename, reason="excluded")

    async with Node(plugins=["direct", Mapper()], node_id="n1") as node:
        vpn = node.vpn()
        mapped = attached(vpn, "mapped", ">")
        plain = attached(vpn, "plain", ">")
        source = attached(vpn, "source")
        publisher = node.connect()
        publisher.publish("a", b"1")
        publisher.publish("private/b", b"2")
        source.receive(Message("c", b"3", origin=("far", 1), hop_count=1))
        assert [(t, h) for t, h, _ in mapped.sent] == [("remote/a", 1)]
        # The other link sees the messages as they were.
        assert [(t, h) for t, h, _ in plain.sent] == [("a", 0), ("private/b", 0), ("c", 1)]
        assert mapped.statistics().dropped == {"excluded": 1, "hop_limit": 1}
        assert mapped.forwarded == 1


async def test_a_link_that_cannot_send_counts_a_forward_failure(node: Node) -> None:
    link = attached(node.vpn(), "a", ">")
    link.up = False
    node.connect().publish("t", b"x")
    stats = link.statistics()
    assert (stats.forwarded, stats.forward_failures) == (0, 1)


async def test_a_link_that_keeps_interest_still_counts_what_it_could_not_send(
    node: Node,
) -> None:
    forgets = attached(node.vpn(), "forgets", "t")
    keeps = attached(node.vpn(), "keeps", "t")
    keeps.keeps_interest = True
    for link in (forgets, keeps):
        link.opened("peer")
        link.up = False
        link.closed("cut")
    assert (forgets.interest, keeps.interest) == ((), ("t",))
    node.connect().publish("t", b"x")
    assert (forgets.forward_failures, keeps.forward_failures) == (0, 1)


async def test_link_names_are_unique_per_vpn_and_the_link_belongs_to_it(node: Node) -> None:
    attached(node.vpn(), "a")
    with pytest.raises(ConfigurationError, match="already has a link"):
        attached(node.vpn(), "a")
    other = node.create_vpn("other")
    with pytest.raises(ConfigurationError, match="belongs to VPN"):
        other.links.attach(ListLink(node.vpn(), "b"))
    with pytest.raises(StateError, match="not attached"):
        ListLink(node.vpn(), "loose").opened("x")


async def test_waiting_for_a_state(node: Node) -> None:
    link = attached(node.vpn(), "a")
    reached: list[LinkState] = []

    async def waiter() -> None:
        reached.append(await link.wait_for(LinkState.IN_SYNC, LinkState.REUSING))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        link.opened("peer")
        await anyio.wait_all_tasks_blocked()
        assert reached == []
        link.set_state(LinkState.IN_SYNC)
    assert reached == [LinkState.IN_SYNC]
    assert link.peer_node == "peer"
    node.vpn().links.detach(link)
    with pytest.raises(StateError, match="disabled"):
        await link.wait_for(LinkState.IN_SYNC)


async def test_a_peer_link_obeys_the_acl_of_the_identity_it_logged_in_as(node: Node) -> None:
    acl = AclChecker(
        AclProfile(
            "peer",
            publish_default="deny",
            publish_exceptions=["in/>"],
            subscribe_default="deny",
            subscribe_exceptions=["out/>"],
        ),
        "peer",
        "peer",
    )
    link = attached(node.vpn(), "a", acl=acl)
    link.add_interest("out/x")
    with pytest.raises(AccessDeniedError, match="subscribe"):
        link.add_interest("secret/>")
    subscriber = node.connect()
    subscriber.subscribe(">")
    assert link.receive(Message("in/1", b"ok"))
    assert not link.receive(Message("secret/1", b"no"))
    assert link.statistics().dropped == {"denied": 1}
    assert [m.topic for m in iter(subscriber.receive_nowait, None)] == ["in/1"]


async def test_a_copy_a_peer_may_not_publish_does_not_hide_one_that_may(node: Node) -> None:
    # The same message over two links: the first link's peer may not publish it, the
    # second's may. The refused copy must not be remembered as seen.
    deny = AclChecker(AclProfile("strict", publish_default="deny"), "strict", "strict")
    strict, open_ = attached(node.vpn(), "strict", acl=deny), attached(node.vpn(), "open")
    subscriber = node.connect()
    subscriber.subscribe(">")
    assert not strict.receive(Message("t", b"refused", origin=("x", 1)))
    assert open_.receive(Message("t", b"taken", origin=("x", 1)))
    assert [m.payload for m in iter(subscriber.receive_nowait, None)] == [b"taken"]
    assert (strict.statistics().dropped, open_.statistics().dropped) == ({"denied": 1}, {})


def test_the_origin_filter_keeps_an_origin_for_its_window_and_forgets_it_later() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=100)
    assert not seen.check(("a", 1))
    assert seen.check(("a", 1))
    clock.advance(5)
    assert not seen.check(("a", 2))
    clock.advance(4.9)  # ("a", 1) is 9.9 s old: within the window
    assert seen.check(("a", 1))
    clock.advance(0.1)  # a new generation starts with the next new origin
    assert not seen.check(("a", 3))
    assert seen.check(("a", 1))  # kept: for at most about two windows
    assert seen.check(("a", 2))
    clock.advance(10)
    assert not seen.check(("a", 4))  # and the generation of ("a", 1) and ("a", 2) goes
    assert not seen.check(("a", 1))
    assert seen.check(("a", 3))
    clock.advance(25)  # quiet for over two windows: everything is forgotten
    assert not seen.check(("a", 5))
    assert len(seen) == 1
    assert not seen.check(("a", 3))


def test_the_origin_filter_holds_at_most_max_entries() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=4)
    for n in range(100):
        assert not seen.check(("a", n))
        assert len(seen) <= 4
        assert seen.check(("a", n))
    assert seen.check(("a", 98))  # the newest are kept
    assert not seen.check(("a", 0))
    seen.forget(("a", 99))
    assert not seen.check(("a", 99))
    with pytest.raises(ConfigurationError):
        OriginFilter(clock.monotonic, window=0)


# --- guaranteed messages over links ---------------------------------------------------------


@pytest.fixture
async def spooling() -> Any:
    async with Node(node_id="n1", clock=ManualClock()) as running:
        yield running


def guaranteed(topic: str, payload: bytes = b"g", **options: Any) -> Message:
    return Message(topic, payload, DeliveryMode.PERSISTENT, sender="far-client", **options)


async def test_a_guaranteed_message_from_a_link_is_spooled_to_every_matching_queue(
    spooling: Node,
) -> None:
    service: Any = spooling.guaranteed
    service.create_queue("q1", subscriptions=["g/>"])
    service.create_queue("q2", subscriptions=["g/1"])
    link = attached(spooling.vpn(), "a")
    subscriber = spooling.connect()
    subscriber.subscribe("g/>")
    assert await link.receive_guaranteed(guaranteed("g/1", origin=("far", 5), hop_count=1))
    for name in ("q1", "q2"):
        async with await spooling.connect().bind(name) as flow:
            message = await flow.receive()
            assert (message.topic, message.sender) == ("g/1", "far-client")
            assert message.delivery_mode is DeliveryMode.PERSISTENT
            assert (message.origin, message.hop_count) == (("far", 5), 1)  # kept in the spool
            flow.ack(message)
    direct = subscriber.receive_nowait()
    assert direct is not None
    assert direct.delivery_mode is DeliveryMode.DIRECT
    assert direct.origin == ("far", 5)


async def test_a_guaranteed_message_one_queue_refuses_is_kept_nowhere(spooling: Node) -> None:
    service: Any = spooling.guaranteed
    service.create_queue("roomy", subscriptions=["g/>"])
    # A queue that discards rather than rejects for its publishers (topic endpoints do
    # by default) still refuses a link's message: the peer keeps it and sends it again.
    service.create_queue(
        "full", subscriptions=["g/>"], max_messages=0, reject_msg_to_sender_on_discard=False
    )
    link = attached(spooling.vpn(), "a")
    with pytest.raises(PublishRejectedError, match="over-quota"):
        await link.receive_guaranteed(guaranteed("g/1"))
    assert service.queue("roomy").usage() == (0, 0)
    assert link.statistics().receive_failures == 1
    assert link.statistics().received == 0


async def test_a_guaranteed_message_without_a_matching_endpoint_is_counted_and_goes_direct(
    spooling: Node,
) -> None:
    link = attached(spooling.vpn(), "a")
    subscriber = spooling.connect()
    subscriber.subscribe("g/>")
    assert await link.receive_guaranteed(guaranteed("g/1"))
    assert link.statistics().dropped == {"no_eligible_destination": 1}
    message = subscriber.receive_nowait()
    assert message is not None
    assert message.delivery_mode is DeliveryMode.DIRECT


async def test_a_duplicate_guaranteed_message_is_acknowledged_but_not_spooled_again(
    spooling: Node,
) -> None:
    service: Any = spooling.guaranteed
    service.create_queue("q", subscriptions=["g/>"])
    link = attached(spooling.vpn(), "a")
    assert await link.receive_guaranteed(guaranteed("g/1", origin=("far", 9)))
    assert not await link.receive_guaranteed(guaranteed("g/1", origin=("far", 9)))
    assert service.queue("q").usage()[0] == 1
    assert link.statistics().dropped == {"duplicate": 1}


async def test_the_links_queue_does_not_take_back_what_came_in_over_the_link(
    spooling: Node,
) -> None:
    service: Any = spooling.guaranteed
    feeder = service.create_queue("to-peer", subscriptions=["g/>"])
    local = service.create_queue("local", subscriptions=["g/>"])
    link = attached(spooling.vpn(), "a", endpoint=feeder.endpoint)
    assert await link.receive_guaranteed(guaranteed("g/1"))
    assert feeder.usage()[0] == 0
    assert local.usage()[0] == 1


async def test_a_message_sent_to_a_queue_by_name_crosses_a_link_to_that_queue(
    spooling: Node,
) -> None:
    service: Any = spooling.guaranteed
    orders = service.create_queue("orders")
    wildcard = service.create_queue("all", subscriptions=[">"])
    link = attached(spooling.vpn(), "a")
    assert await link.receive_guaranteed(guaranteed("#P2P/QUE/orders"))
    assert not await link.receive_guaranteed(guaranteed("#P2P/QUE/or>ders"))  # not a name
    assert (orders.usage()[0], wildcard.usage()[0]) == (1, 0)
    assert link.statistics().dropped == {"bad_topic": 1}


async def test_a_link_keeps_out_the_endpoints_it_is_told_to(spooling: Node) -> None:
    service: Any = spooling.guaranteed
    onward = service.create_queue("onward", subscriptions=["g/>"])
    local = service.create_queue("local", subscriptions=["g/>"])
    link = attached(spooling.vpn(), "a")
    link.keeps_out = {onward.endpoint}.__contains__
    assert link.spools_to(local.endpoint)
    assert not link.spools_to(onward.endpoint)
    assert await link.receive_guaranteed(guaranteed("g/1"))
    assert (onward.usage()[0], local.usage()[0]) == (0, 1)


async def test_a_guaranteed_publish_does_not_also_go_direct_over_the_link_its_queue_feeds(
    spooling: Node,
) -> None:
    service: Any = spooling.guaranteed
    feeder = service.create_queue("to-peer", subscriptions=["g/>"])
    fed = attached(spooling.vpn(), "fed", "g/>", endpoint=feeder.endpoint)
    other = attached(spooling.vpn(), "other", "g/>")
    await spooling.connect().send("g/1", b"x")
    assert fed.sent == []  # its copy travels as a guaranteed message through the queue
    assert other.topics == ["g/1"]
    forwarded = other.sent[0][2]
    assert forwarded.delivery_mode is DeliveryMode.DIRECT
    assert forwarded.origin is not None
    # The queue's copy has the same origin: a peer that gets both keeps one.
    async with await spooling.connect().bind("to-peer") as flow:
        spooled = await flow.receive()
    assert spooled.origin == forwarded.origin


async def test_queue_subscriptions_change_while_the_node_runs(spooling: Node) -> None:
    service: Any = spooling.guaranteed
    queue = service.create_queue("q", subscriptions=["a"])
    publisher = spooling.connect()
    service.add_subscription("q", "b/>")
    service.add_subscription("q", "b/>")  # already there: nothing changes
    await publisher.send("b/1", b"1")
    service.remove_subscription("q", "a")
    await publisher.send("a", b"2")
    assert queue.settings.subscriptions == ("b/>",)
    assert queue.usage()[0] == 1
    with pytest.raises(StateError):
        service.add_subscription("nope", "x")
