"""The direct copy of a guaranteed message on links (SPEC 4, 7): client subscriptions get
it, endpoints get the message itself; a node spools a message once and delivers it to
each subscriber once, whichever comes first, the copy or the message, and however long
the message took."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from meshbus import (
    DeliveryMode,
    LocalLink,
    ManualClock,
    Message,
    Node,
    OriginFilter,
)
from meshbus._origins import COPY_SEEN, NEW, SEEN
from tests.sdk.list_link import attached

pytestmark = pytest.mark.anyio


@pytest.fixture
async def node() -> Any:
    async with Node(node_id="n1", clock=ManualClock()) as running:
        yield running


def persistent(topic: str, origin: tuple[str, int], **options: Any) -> Message:
    return Message(topic, b"g", DeliveryMode.PERSISTENT, origin=origin, **options)


def direct_copy(topic: str, origin: tuple[str, int]) -> Message:
    """The direct copy of a guaranteed message, as a wire link carries it: with the
    message's own mode."""
    return persistent(topic, origin)


# --- the origin filter ------------------------------------------------------------------


def test_a_copy_seen_first_leaves_its_message_to_be_spooled_once() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=100)
    assert not seen.check_copy(("a", 1))
    assert seen.check_copy(("a", 1))  # the copy again: a duplicate
    assert seen.check(("a", 1))
    clock.advance(60)  # the message waited in a queue far longer than the window
    assert seen.check_guaranteed(("a", 1)) == COPY_SEEN
    assert seen.check_guaranteed(("a", 1)) == SEEN
    assert seen.check_copy(("a", 1))
    assert seen.check_guaranteed(("b", 1)) == NEW
    assert seen.check_copy(("b", 1))  # its copy after it: a duplicate


def test_a_refused_message_whose_copy_came_first_is_still_known_by_its_copy() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=100)
    seen.check_copy(("a", 1))
    assert seen.check_guaranteed(("a", 1)) == COPY_SEEN
    seen.forget(("a", 1), copy_seen=True)  # refused: nothing kept
    assert seen.check_guaranteed(("a", 1)) == COPY_SEEN
    assert seen.check_guaranteed(("b", 1)) == NEW
    seen.forget(("b", 1))
    assert seen.check_guaranteed(("b", 1)) == NEW


def test_copies_are_kept_for_room_not_for_time() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=8)
    for n in range(20):
        seen.check_copy(("a", n))
        clock.advance(1)
    assert seen.check_guaranteed(("a", 19)) == COPY_SEEN
    assert seen.check_guaranteed(("a", 0)) == NEW  # the oldest made room


def test_a_held_origin_is_seen_until_released_and_a_window_after() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=8)
    seen.hold(("a", 1))
    for n in range(20):  # generations come and go, and other holds
        clock.advance(3)
        seen.check(("x", n))
    assert seen.check(("a", 1))
    seen.release(("a", 1))
    clock.advance(9)
    assert seen.check_copy(("a", 1))
    for n in range(2, 7):  # more holds than there is room for: the oldest is let go
        seen.hold(("a", n))
    assert not seen.check(("a", 2))


def test_a_message_taken_whole_or_passed_on_is_kept_for_room_not_time() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=8)
    assert seen.check_guaranteed(("a", 1)) == NEW  # spooled here from a link
    seen.hold(("a", 2))  # sent on over a link...
    seen.release(("a", 2))  # ...and taken there at once
    for n in range(20):  # generations come and go
        clock.advance(3)
        seen.check(("x", n))
    assert seen.check_copy(("a", 1))  # its copy, back from a node that held it long
    assert seen.check_copy(("a", 2))
    for n in range(3, 8):  # more than there is room for: the oldest are let go
        seen.check_guaranteed(("a", n))
    clock.advance(30)
    seen.check(("x", 99))
    assert not seen.check(("a", 1))


def test_a_refused_message_is_forgotten_for_room_too() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=100)
    assert seen.check_guaranteed(("a", 1)) == NEW
    seen.forget(("a", 1))  # the local queue refused it: the sender tries again
    assert seen.check_guaranteed(("a", 1)) == NEW


def test_remember_keeps_an_origin_for_a_window_from_now() -> None:
    clock = ManualClock()
    seen = OriginFilter(clock.monotonic, window=10, max_entries=100)
    seen.check(("a", 1))
    clock.advance(9)
    seen.remember(("a", 1))  # the message leaves, long after it came
    for n in range(2, 5):  # other origins, and generations, come and go
        clock.advance(5)
        seen.check(("a", n))
    assert seen.check(("a", 1))


# --- links ------------------------------------------------------------------------------


async def test_a_copy_from_a_link_goes_to_subscribers_and_its_message_to_queues(
    node: Node,
) -> None:
    service: Any = node.guaranteed
    queue = service.create_queue("q", subscriptions=["g/>"])  # takes direct messages too
    subscriber = node.connect()
    subscriber.subscribe("g/>")
    onward = attached(node.vpn(), "onward", ">")
    link = attached(node.vpn(), "in")
    assert link.receive(direct_copy("g/1", ("far", 1)))
    got = subscriber.receive_nowait()
    assert got is not None
    assert got.delivery_mode is DeliveryMode.DIRECT
    assert got.origin == ("far", 1)
    # Not spooled as a direct message: the queue is for the message itself.
    assert queue.usage()[0] == 0
    # It goes on as a copy, its mode with it.
    [(_, _, message)] = onward.sent
    assert message.delivery_mode is DeliveryMode.DIRECT
    assert onward.modes == [DeliveryMode.PERSISTENT]
    # The message comes later, over a flow: spooled, not delivered to the subscriber again.
    assert await link.receive_guaranteed(persistent("g/1", ("far", 1)))
    assert queue.usage()[0] == 1
    assert subscriber.receive_nowait() is None
    assert len(onward.sent) == 1
    # A second copy of either is a duplicate.
    assert not link.receive(direct_copy("g/1", ("far", 1)))
    assert not await link.receive_guaranteed(persistent("g/1", ("far", 1)))
    assert link.statistics().dropped == {"duplicate": 2}


async def test_a_local_links_pair_carries_the_copys_mode(node: Node) -> None:
    node.create_vpn("other")
    service: Any = node.guaranteed
    near, far = LocalLink.pair(node.vpn(), node.vpn("other"), "pair")
    node.vpn().links.attach(near)
    node.vpn("other").links.attach(far)
    near.add_interest("g/>")
    queue = service.create_queue("q", vpn="other", subscriptions=["g/>"])
    subscriber = node.connect("other")
    subscriber.subscribe("g/>")
    publisher = node.connect()
    await publisher.send("g/1", b"x")
    assert subscriber.receive_nowait() is not None
    assert queue.usage()[0] == 0  # the copy was not spooled as a direct message


async def test_a_direct_message_from_a_link_keeps_its_origin_in_a_queue(node: Node) -> None:
    service: Any = node.guaranteed
    service.create_queue("q", subscriptions=["d/>"])
    link = attached(node.vpn(), "in")
    assert link.receive(Message("d/1", b"x", origin=("far", 7), hop_count=1))
    async with await node.connect().bind("q") as flow:
        with anyio.fail_after(5):
            got = await flow.receive()
    assert got.delivery_mode is DeliveryMode.NON_PERSISTENT
    assert (got.origin, got.hop_count) == (("far", 7), 1)


async def test_a_direct_publish_spooled_and_sent_over_a_link_has_one_origin(node: Node) -> None:
    service: Any = node.guaranteed
    service.create_queue("q", subscriptions=["d/>"])
    link = attached(node.vpn(), "out", ">")
    node.connect().publish("d/1", b"x")
    [(_, _, sent)] = link.sent
    async with await node.connect().bind("q") as flow:
        with anyio.fail_after(5):
            spooled = await flow.receive()
    assert sent.origin is not None
    assert spooled.origin == sent.origin


async def test_a_message_out_over_a_flow_is_known_while_the_peer_holds_it_and_after(
    node: Node,
) -> None:
    clock: Any = node.clock
    link = attached(node.vpn(), "flow")
    back = attached(node.vpn(), "back")
    subscriber = node.connect()
    subscriber.subscribe("g/>")
    origins = node.vpn().links.origins
    origins.check(("n1", 1))  # published here...
    clock.advance(15)  # ...and held in a queue longer than the window
    message = persistent("g/1", ("n1", 1))
    assert link.outgoing(message) is not None  # it leaves now
    # The peer holds it (its queue is full) for long, while other origins come and go.
    for n in range(1, 9):
        clock.advance(5)
        origins.check(("x", n))
    assert not back.receive(direct_copy("g/1", ("n1", 1)))
    link.settled(message)  # taken at last: its copy may come back a little later
    for step, n in ((1, 11), (11, 12), (1, 13)):
        clock.advance(step)
        origins.check(("x", n))
    assert not back.receive(direct_copy("g/1", ("n1", 1)))
    assert subscriber.receive_nowait() is None
    assert back.statistics().dropped == {"duplicate": 2}
