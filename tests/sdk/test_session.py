"""Sessions and direct delivery (SPEC 2): fan-out, order, no retention, egress, no-local,
handlers, receiving, limits and invalid input."""

from __future__ import annotations

import logging

import anyio
import pytest

from meshbus import (
    ClientProfile,
    InvalidTopicError,
    LimitExceededError,
    ManualClock,
    Message,
    Node,
    Session,
    StateError,
)


def drain(session: Session) -> list[Message]:
    """Every message waiting for ``session``, without waiting."""
    out = []
    while (message := session.receive_nowait()) is not None:
        out.append(message)
    return out


def payloads(messages: list[Message]) -> list[bytes]:
    return [m.payload for m in messages]


def small_egress_user(node: Node, name: str, **limits: int) -> None:
    node.vpn().add_client_profile(ClientProfile(name, **limits))
    node.vpn().add_user(name, client_profile=name)


# --- fan-out -------------------------------------------------------------------------------


async def test_delivered_to_every_session_with_a_matching_subscription(meshbus_node: Node) -> None:
    publisher = meshbus_node.connect(client_name="pub")
    exact = meshbus_node.connect()
    exact.subscribe("a/b/c")
    star = meshbus_node.connect()
    star.subscribe("a/*/c")
    prefix = meshbus_node.connect()
    prefix.subscribe("a/b*/c")
    rest = meshbus_node.connect()
    rest.subscribe("a/>")
    other = meshbus_node.connect()
    other.subscribe("a/b")  # one level short
    other.subscribe("a/c*/c")  # prefix does not match 'b'
    other.subscribe("x/>")

    publisher.publish("a/b/c", b"hello")

    for session in (exact, star, prefix, rest):
        got = drain(session)
        assert [(m.topic, m.payload, m.sender) for m in got] == [("a/b/c", b"hello", "pub")]
    assert drain(other) == []
    assert drain(publisher) == []  # it subscribed to nothing


async def test_greater_than_needs_at_least_one_more_level(meshbus_node: Node) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("a/>")
    sub.publish("a", b"parent")
    sub.publish("a/b", b"child")
    sub.publish("a/b/c", b"grandchild")
    assert payloads(drain(sub)) == [b"child", b"grandchild"]


async def test_message_fields_come_from_the_publish(
    meshbus_node: Node, meshbus_clock: ManualClock
) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("t")
    pub = meshbus_node.connect(client_name="sender-1", timestamps=True)
    meshbus_clock.advance(5)
    pub.publish("t", "text payload", headers={"k": 1}, reply_to="replies/1", correlation_id="c-1")
    pub.publish("t", bytearray(b"ba"))
    pub.publish("t", memoryview(b"mv"))
    first, second, third = drain(sub)
    assert first.payload == b"text payload"
    assert first.headers == {"k": 1}
    assert first.reply_to == "replies/1"
    assert first.correlation_id == "c-1"
    assert first.sender == "sender-1"
    assert first.timestamp == meshbus_clock.time() == 1_700_000_005.0
    assert first.discard_indication is False
    assert (second.payload, third.payload) == (b"ba", b"mv")
    assert type(second.payload) is bytes
    assert type(third.payload) is bytes


async def test_direct_messages_carry_no_timestamp_unless_the_session_asks(
    meshbus_node: Node, meshbus_clock: ManualClock
) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("t")
    plain = meshbus_node.connect(client_name="plain")
    stamping = meshbus_node.connect(client_name="stamping", timestamps=True)
    assert (plain.timestamps, stamping.timestamps) == (False, True)
    plain.publish("t", b"1")
    meshbus_clock.advance(3)
    stamping.publish("t", b"2", headers={"k": 1})  # the path with options, too
    plain.publish("t", b"3", correlation_id="c")
    first, second, third = drain(sub)
    assert (first.timestamp, third.timestamp) == (None, None)
    assert second.timestamp == meshbus_clock.time()


async def test_payload_of_another_type_is_a_type_error_and_publishes_nothing(
    meshbus_node: Node,
) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("t")
    with pytest.raises(TypeError):
        sub.publish("t", 42)  # type: ignore[arg-type]
    assert drain(sub) == []
    assert sub.statistics().published == 0


async def test_publish_order_is_kept_per_publisher(meshbus_node: Node) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("orders/>")
    p1 = meshbus_node.connect(client_name="p1")
    p2 = meshbus_node.connect(client_name="p2")
    for i in range(50):
        p1.publish(f"orders/{i % 3}", str(i))
        p2.publish("orders/x", str(i))
    got = drain(sub)
    for name in ("p1", "p2"):
        assert [int(m.payload) for m in got if m.sender == name] == list(range(50))


async def test_nested_publish_from_an_inline_handler_is_queued_behind_the_current_one(
    meshbus_node: Node,
) -> None:
    publisher = meshbus_node.connect(client_name="pub")
    # The relay subscribes first, so it is called before `watcher` for each message.
    relay = meshbus_node.connect(
        client_name="relay", on_message=lambda m: publisher.publish("second", b"2")
    )
    relay.subscribe("first")
    watcher = meshbus_node.connect()
    watcher.subscribe("first")
    watcher.subscribe("second")

    publisher.publish("first", b"1")

    # Delivered inline, 'second' would reach the watcher before 'first'; both come from
    # the same publisher, so the order must be kept.
    assert [(m.topic, m.sender) for m in drain(watcher)] == [
        ("first", "pub"),
        ("second", "pub"),
    ]


async def test_recursive_publishes_from_a_handler_keep_their_order(meshbus_node: Node) -> None:
    def count_up(message: Message) -> None:
        n = int(message.payload)
        if n < 4:
            counter.publish("n", str(n + 1))

    counter = meshbus_node.connect(on_message=count_up)
    counter.subscribe("n")
    watcher = meshbus_node.connect()
    watcher.subscribe("n")
    counter.publish("n", b"0")
    assert payloads(drain(watcher)) == [b"0", b"1", b"2", b"3", b"4"]
    assert not meshbus_node.vpn()._pending
    assert not meshbus_node.vpn()._busy


async def test_at_most_once_per_session_when_several_subscriptions_match(
    meshbus_node: Node,
) -> None:
    sub = meshbus_node.connect()
    for f in ("a/b", "a/*", "a/b*", "*/b", "a/>", ">", "#noexport/a/b"):
        sub.subscribe(f)
    other = meshbus_node.connect()
    other.subscribe(">")
    other.publish("a/b", b"once")
    assert payloads(drain(sub)) == [b"once"]
    assert sub.statistics().delivered == 1
    assert payloads(drain(other)) == [b"once"]


async def test_unsubscribe_stops_delivery_and_resubscribe_is_idempotent(
    meshbus_node: Node,
) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("a/>")
    sub.subscribe("a/>")  # same text again: no-op
    assert sub.subscriptions == ("a/>",)
    sub.publish("a/1", b"1")
    sub.unsubscribe("a/>")  # one unsubscribe removes it
    sub.unsubscribe("a/>")  # not held: no-op
    sub.unsubscribe("never/held")
    sub.publish("a/2", b"2")
    assert payloads(drain(sub)) == [b"1"]
    assert sub.subscriptions == ()


# --- no acks, no retention --------------------------------------------------------------------


async def test_a_later_subscriber_does_not_get_earlier_messages(meshbus_node: Node) -> None:
    pub = meshbus_node.connect()
    pub.publish("news", b"old")
    sub = meshbus_node.connect()
    sub.subscribe("news")
    assert drain(sub) == []
    pub.publish("news", b"new")
    assert payloads(drain(sub)) == [b"new"]


async def test_a_closed_session_gets_nothing_and_refuses_calls(meshbus_node: Node) -> None:
    pub = meshbus_node.connect()
    sub = meshbus_node.connect()
    sub.subscribe("t")
    pub.publish("t", b"buffered")
    sub.close()
    sub.close()  # idempotent
    assert sub.closed
    pub.publish("t", b"after close")
    with pytest.raises(StateError):
        sub.receive_nowait()  # buffered messages were dropped with the session
    with pytest.raises(StateError):
        await sub.receive()
    with pytest.raises(StateError):
        sub.publish("t", b"x")
    with pytest.raises(StateError):
        sub.subscribe("u")
    with pytest.raises(StateError):
        sub.unsubscribe("t")
    assert sub.subscriptions == ()
    assert meshbus_node.vpn().statistics().unmatched == 1  # 'after close' found nobody


async def test_a_session_closed_while_a_message_is_routed_does_not_get_it(
    meshbus_node: Node,
) -> None:
    # `victim` is already among the targets of the message when the handler closes it.
    victim = meshbus_node.connect()
    closer = meshbus_node.connect(on_message=lambda m: victim.close())
    closer.subscribe("t")
    victim.subscribe("t")
    closer.publish("t", b"x")
    assert victim.closed
    with pytest.raises(StateError):
        victim.receive_nowait()
    assert victim.statistics().delivered == 0
    assert victim.statistics().egress_messages == 0


async def test_subscriptions_vanish_on_close(meshbus_node: Node) -> None:
    async with meshbus_node.connect(client_name="worker") as first:
        first.subscribe("jobs/>")
        first.subscribe("#noexport/other")
    assert first.closed
    second = meshbus_node.connect(client_name="worker")  # same client name, fresh session
    assert second.subscriptions == ()
    pub = meshbus_node.connect()
    pub.publish("jobs/1", b"x")
    pub.publish("other", b"y")
    assert drain(second) == []
    assert meshbus_node.vpn().statistics().unmatched == 2


# --- bounded egress ---------------------------------------------------------------------------


async def test_egress_over_message_limit_discards_the_oldest(meshbus_node: Node) -> None:
    small_egress_user(meshbus_node, "slow", egress_max_messages=3)
    slow = meshbus_node.connect(username="slow")
    slow.subscribe("ticks")
    fast = meshbus_node.connect()
    fast.subscribe("ticks")
    pub = meshbus_node.connect()
    for i in range(5):
        pub.publish("ticks", str(i))  # never blocks, never raises
    stats = slow.statistics()
    assert (stats.discarded, stats.egress_messages, stats.egress_bytes) == (2, 3, 3)
    got = drain(slow)
    assert payloads(got) == [b"2", b"3", b"4"]
    assert [m.discard_indication for m in got] == [True, False, False]
    # The fast consumer lost nothing and saw no flag.
    got_fast = drain(fast)
    assert payloads(got_fast) == [b"0", b"1", b"2", b"3", b"4"]
    assert not any(m.discard_indication for m in got_fast)
    assert meshbus_node.vpn().statistics().discarded == 2
    assert meshbus_node.statistics().discarded == 2


async def test_egress_over_byte_limit_discards_the_oldest(meshbus_node: Node) -> None:
    small_egress_user(meshbus_node, "slow", egress_max_bytes=10)
    slow = meshbus_node.connect(username="slow")
    slow.subscribe("t")
    pub = meshbus_node.connect()
    for payload in (b"aaaa", b"bbbb", b"cccc", b"dd"):
        pub.publish("t", payload)
    # 4+4+4 = 12 > 10 drops 'aaaa'; 4+4+2 = 10 fits.
    stats = slow.statistics()
    assert (stats.discarded, stats.egress_messages, stats.egress_bytes) == (1, 3, 10)
    got = drain(slow)
    assert payloads(got) == [b"bbbb", b"cccc", b"dd"]
    assert [m.discard_indication for m in got] == [True, False, False]
    assert slow.statistics().egress_bytes == 0


async def test_discard_indication_is_set_again_after_a_new_loss(meshbus_node: Node) -> None:
    small_egress_user(meshbus_node, "slow", egress_max_messages=1)
    slow = meshbus_node.connect(username="slow")
    slow.subscribe("t")
    slow.publish("t", b"1")
    assert drain(slow)[0].discard_indication is False
    slow.publish("t", b"2")
    slow.publish("t", b"3")  # '2' discarded
    slow.publish("t", b"4")  # '3' discarded
    [flagged] = drain(slow)
    assert (flagged.payload, flagged.discard_indication) == (b"4", True)
    slow.publish("t", b"5")
    assert drain(slow)[0].discard_indication is False
    slow.publish("t", b"6")
    slow.publish("t", b"7")
    assert [(m.payload, m.discard_indication) for m in drain(slow)] == [(b"7", True)]
    assert slow.statistics().discarded == 3


async def test_a_message_larger_than_the_byte_limit_reaches_a_consumer_that_keeps_up(
    meshbus_node: Node,
) -> None:
    small_egress_user(meshbus_node, "slow", egress_max_bytes=10)
    slow = meshbus_node.connect(username="slow")
    slow.subscribe("t")
    pub = meshbus_node.connect()
    big = b"x" * 25
    # A consumer already waiting gets it ...
    received: list[Message] = []

    async def consume() -> None:
        with anyio.move_on_after(1):
            received.append(await slow.receive())

    async with anyio.create_task_group() as tg:
        tg.start_soon(consume)
        await anyio.wait_all_tasks_blocked()
        pub.publish("t", big)
    assert [(m.payload, m.discard_indication) for m in received] == [(big, False)]
    # ... and so does one that polls before the next message arrives.
    pub.publish("t", big)
    assert slow.statistics().egress_bytes == 25
    assert payloads(drain(slow)) == [big]
    assert slow.statistics().discarded == 0
    # Behind it, it is the oldest and goes first; the next message is flagged.
    pub.publish("t", b"small")
    pub.publish("t", big)
    pub.publish("t", b"tail")
    got = drain(slow)
    assert [(m.payload, m.discard_indication) for m in got] == [(b"tail", True)]
    assert slow.statistics().discarded == 2


async def test_discards_with_an_async_handler(meshbus_node: Node) -> None:
    small_egress_user(meshbus_node, "slow", egress_max_messages=2)
    release = anyio.Event()
    seen: list[tuple[bytes, bool]] = []
    done = anyio.Event()

    async def handler(message: Message) -> None:
        await release.wait()
        seen.append((message.payload, message.discard_indication))
        if message.payload == b"9":
            done.set()

    slow = meshbus_node.connect(username="slow", on_message=handler)
    slow.subscribe("t")
    pub = meshbus_node.connect()
    pub.publish("t", b"0")
    await anyio.wait_all_tasks_blocked()  # the pump holds '0' in the handler
    for i in range(1, 10):
        pub.publish("t", str(i))
    release.set()
    with anyio.fail_after(2):
        await done.wait()
    assert seen == [(b"0", False), (b"8", True), (b"9", False)]
    assert slow.statistics().discarded == 7
    assert slow.statistics().delivered == 3


# --- no-local ----------------------------------------------------------------------------------


async def test_no_local_session_gets_others_messages_but_not_its_own(meshbus_node: Node) -> None:
    quiet = meshbus_node.connect(client_name="quiet", no_local=True)
    quiet.subscribe("chat/>")
    chatty = meshbus_node.connect(client_name="chatty")
    chatty.subscribe("chat/>")
    quiet.publish("chat/1", b"from quiet")
    chatty.publish("chat/1", b"from chatty")
    assert [(m.payload, m.sender) for m in drain(quiet)] == [(b"from chatty", "chatty")]
    # Without no-local a session does get its own messages.
    assert payloads(drain(chatty)) == [b"from quiet", b"from chatty"]


async def test_no_local_with_an_inline_handler(meshbus_node: Node) -> None:
    seen: list[str | None] = []
    me = meshbus_node.connect(
        client_name="me", no_local=True, on_message=lambda m: seen.append(m.sender)
    )
    me.subscribe("t")
    other = meshbus_node.connect(client_name="other")
    me.publish("t")
    other.publish("t")
    assert seen == ["other"]


# --- handlers -----------------------------------------------------------------------------------


async def test_sync_handler_is_called_inline(meshbus_node: Node) -> None:
    seen: list[bytes] = []
    sub = meshbus_node.connect(on_message=lambda m: seen.append(m.payload))
    sub.subscribe("t")
    pub = meshbus_node.connect()
    pub.publish("t", b"1")
    assert seen == [b"1"]  # before any checkpoint
    pub.publish("t", b"2")
    assert seen == [b"1", b"2"]
    assert sub.statistics().delivered == 2
    assert sub.statistics().egress_messages == 0


async def test_sync_handler_errors_are_counted_logged_once_and_not_propagated(
    meshbus_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(message: Message) -> None:
        raise RuntimeError(f"boom {message.payload.decode()}")

    bad = meshbus_node.connect(client_name="bad", on_message=broken)
    bad.subscribe("t")
    good = meshbus_node.connect()
    good.subscribe("t")
    pub = meshbus_node.connect()
    with caplog.at_level(logging.ERROR, logger="meshbus.session"):
        pub.publish("t", b"1")  # does not raise
        pub.publish("t", b"2")
        pub.publish("t", b"3")
    assert bad.statistics().handler_errors == 3
    assert bad.statistics().delivered == 3
    assert payloads(drain(good)) == [b"1", b"2", b"3"]  # others are not affected
    records = [r for r in caplog.records if r.name == "meshbus.session"]
    assert len(records) == 1
    assert "'bad'" in records[0].getMessage()
    assert records[0].exc_info is not None
    assert str(records[0].exc_info[1]) == "boom 1"


async def test_async_handler_runs_in_one_task_in_order(meshbus_node: Node) -> None:
    seen: list[bytes] = []
    tasks: set[object] = set()
    done = anyio.Event()

    async def handler(message: Message) -> None:
        tasks.add(anyio.get_current_task().id)
        await anyio.lowlevel.checkpoint()
        seen.append(message.payload)
        if len(seen) == 5:
            done.set()

    sub = meshbus_node.connect(on_message=handler)
    sub.subscribe("t")
    pub = meshbus_node.connect()
    for i in range(5):
        pub.publish("t", str(i))
    assert seen == []  # not inline: the pump runs later
    with anyio.fail_after(2):
        await done.wait()
    assert seen == [b"0", b"1", b"2", b"3", b"4"]
    assert len(tasks) == 1
    assert sub.statistics().delivered == 5


async def test_async_handler_errors_are_counted_and_the_pump_keeps_going(
    meshbus_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[bytes] = []
    done = anyio.Event()

    async def handler(message: Message) -> None:
        if message.payload == b"last":
            done.set()
            return
        seen.append(message.payload)
        raise ValueError("bad message")

    sub = meshbus_node.connect(on_message=handler)
    sub.subscribe("t")
    pub = meshbus_node.connect()
    with caplog.at_level(logging.ERROR, logger="meshbus.session"):
        pub.publish("t", b"1")
        pub.publish("t", b"2")
        pub.publish("t", b"last")
        with anyio.fail_after(2):
            await done.wait()
    assert seen == [b"1", b"2"]
    assert sub.statistics().handler_errors == 2
    assert len([r for r in caplog.records if r.name == "meshbus.session"]) == 1


async def test_an_object_with_async_call_is_an_async_handler(meshbus_node: Node) -> None:
    class Collector:
        def __init__(self) -> None:
            self.seen: list[bytes] = []
            self.done = anyio.Event()

        async def __call__(self, message: Message) -> None:
            self.seen.append(message.payload)
            self.done.set()

    collector = Collector()
    sub = meshbus_node.connect(on_message=collector)
    sub.subscribe("t")
    sub.publish("t", b"x")
    with anyio.fail_after(2):
        await collector.done.wait()
    assert collector.seen == [b"x"]
    assert sub.statistics().handler_errors == 0


async def test_on_message_must_be_callable(meshbus_node: Node) -> None:
    with pytest.raises(TypeError, match="callable"):
        meshbus_node.connect(client_name="c", on_message=42)  # type: ignore[arg-type]
    assert "c" not in meshbus_node.vpn().sessions


async def test_receive_on_a_handler_session_is_a_state_error(meshbus_node: Node) -> None:
    async def handler(message: Message) -> None:
        pass

    for on_message in (lambda m: None, handler):
        sub = meshbus_node.connect(on_message=on_message)
        with pytest.raises(StateError):
            await sub.receive()
        with pytest.raises(StateError):
            sub.receive_nowait()
        with pytest.raises(StateError):
            await sub.__anext__()  # async for raises too, the session is open


# --- receiving -------------------------------------------------------------------------------


async def test_receive_waits_for_a_message(meshbus_node: Node) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("t")
    pub = meshbus_node.connect()
    assert sub.receive_nowait() is None
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(_publish_later, pub)
            message = await sub.receive()
    assert message.payload == b"later"
    assert sub.statistics().delivered == 1


async def test_a_cancelled_receive_leaves_the_next_one_working(meshbus_node: Node) -> None:
    """A consumer that gave up waiting (a timeout) is no longer counted as waiting, and
    the next receive waits afresh: cancelling a wait must not spoil the buffer's waiter."""
    sub = meshbus_node.connect()
    sub.subscribe("t")
    pub = meshbus_node.connect()
    for attempt in range(3):
        with anyio.move_on_after(0.01):
            await sub.receive()
        assert not sub.egress.consumer_waiting
        with anyio.fail_after(2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(_publish_later, pub)
                message = await sub.receive()
        assert message.payload == b"later", attempt


async def _publish_later(pub: Session) -> None:
    await anyio.wait_all_tasks_blocked()
    pub.publish("t", b"later")


async def test_async_for_ends_when_the_session_closes(meshbus_node: Node) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("t")
    pub = meshbus_node.connect()
    got: list[bytes] = []
    ended = anyio.Event()

    async def consume() -> None:
        async for message in sub:
            got.append(message.payload)
        ended.set()

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            pub.publish("t", b"1")
            pub.publish("t", b"2")
            await anyio.wait_all_tasks_blocked()  # consumer drained and waits again
            assert got == [b"1", b"2"]
            assert not ended.is_set()
            sub.close()
            await ended.wait()
    assert got == [b"1", b"2"]


async def test_receive_waiting_when_the_session_closes_raises_state_error(
    meshbus_node: Node,
) -> None:
    sub = meshbus_node.connect()
    errors: list[BaseException] = []

    async def consume() -> None:
        try:
            await sub.receive()
        except StateError as exc:
            errors.append(exc)

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            sub.close()
    assert len(errors) == 1


# --- limits and invalid input -------------------------------------------------------------------


async def test_max_subscriptions_is_enforced_at_exactly_the_limit(meshbus_node: Node) -> None:
    meshbus_node.vpn().add_client_profile(ClientProfile("two", max_subscriptions=2))
    meshbus_node.vpn().add_user("two", client_profile="two")
    sub = meshbus_node.connect(username="two")
    sub.subscribe("a")
    sub.subscribe("b")
    with pytest.raises(LimitExceededError) as info:
        sub.subscribe("c")
    assert info.value.limit == 2
    assert sub.subscriptions == ("a", "b")
    sub.subscribe("a")  # already held: not a new subscription
    sub.publish("c", b"x")
    assert drain(sub) == []
    sub.unsubscribe("a")
    sub.subscribe("c")
    assert sub.subscriptions == ("b", "c")


async def test_wildcard_levels_are_limited_per_session(meshbus_node: Node) -> None:
    """Each wildcard subscription, plain or shared, counts its filter's levels; exact
    ones count nothing. Going over refuses the subscription and changes nothing."""
    vpn = meshbus_node.vpn()
    vpn.add_client_profile(ClientProfile("ten", max_wildcard_levels=10))
    vpn.add_user("ten", client_profile="ten")
    sub = meshbus_node.connect(username="ten")
    sub.subscribe("a/*")  # 2
    sub.subscribe("a/b/c/>")  # 4
    sub.subscribe("#share/g/x/*")  # 2
    sub.subscribe("#noexport/q*")  # 1: 9 in all
    sub.subscribe("a/b/c/d/e/f/g/h/i/j/k")  # exact: not counted
    held = sub.subscriptions
    with pytest.raises(LimitExceededError) as info:
        sub.subscribe("z/y/*")  # 3 more would make 12
    assert info.value.limit == 10
    assert "max_wildcard_levels" in str(info.value)
    assert sub.subscriptions == held
    sub.publish("z/y/x", b"not subscribed")
    assert drain(sub) == []
    sub.subscribe("a/*")  # already held: not a new subscription
    sub.subscribe("r*")  # 1 more: exactly at the limit
    sub.unsubscribe("a/b/c/>")  # gives back 4
    sub.subscribe("z/y/*")
    sub.publish("z/y/x", b"now")
    assert [m.payload for m in drain(sub)] == [b"now"]


async def test_by_default_a_session_cannot_pile_up_overlapping_wildcard_filters(
    meshbus_node: Node,
) -> None:
    """Issue 13, defect 5: the default profile let one session hold 100,000 wildcard filters
    that a publish to a topic none of them matches may have to walk one by one."""
    from tests.sdk.test_index import overlapping_filters

    sub = meshbus_node.connect()
    filters = overlapping_filters(4)  # 10,000 filters of 4 levels

    def subscribe_all() -> None:
        for f in filters:
            sub.subscribe(f)

    with pytest.raises(LimitExceededError) as info:
        subscribe_all()
    limit = ClientProfile("p").max_wildcard_levels
    assert info.value.limit == limit
    # The first filter is the exact topic (it counts nothing); the rest have 4 levels.
    assert sub.subscriptions[0] == filters[0] == "/".join([filters[0].split("/")[0]] * 4)
    assert len(sub.subscriptions) == 1 + limit // 4
    assert sub.statistics().subscriptions == 1 + limit // 4


@pytest.mark.parametrize(
    "topic",
    ["", "a\x00b", "#reserved", "#share/g/a", "x" * 251, "a" + "/" * 128, "\ud800"],
)
async def test_invalid_topic_is_refused_and_publishes_nothing(
    meshbus_node: Node, topic: str
) -> None:
    sub = meshbus_node.connect()
    sub.subscribe(">")
    with pytest.raises(InvalidTopicError):
        sub.publish(topic, b"x")
    assert drain(sub) == []
    stats = meshbus_node.vpn().statistics()
    assert (stats.published, stats.unmatched) == (0, 0)


async def test_topic_at_the_size_limits_is_accepted(meshbus_node: Node) -> None:
    sub = meshbus_node.connect()
    sub.subscribe(">")
    long_topic = "x" * 250
    deep_topic = "a" + "/" * 127  # 128 levels, all but the first empty
    sub.publish(long_topic)
    sub.publish(deep_topic)
    sub.publish("a//b")  # empty levels are allowed
    assert [m.topic for m in drain(sub)] == [long_topic, deep_topic, "a//b"]


@pytest.mark.parametrize(
    "subscription",
    ["", "a\x00", "#reserved/a", "#share//a", "#share/g*/a", "#share/g", "a" + "/" * 128],
)
async def test_invalid_subscription_is_refused_and_changes_nothing(
    meshbus_node: Node, subscription: str
) -> None:
    sub = meshbus_node.connect()
    sub.subscribe("kept")
    with pytest.raises(InvalidTopicError):
        sub.subscribe(subscription)
    assert sub.subscriptions == ("kept",)
    assert sub.statistics().subscriptions == 1


async def test_a_sink_a_plugin_puts_in_place_gets_the_direct_deliveries() -> None:
    # A protocol plugin may replace the end of a session's delivery path (the MQTT
    # listener writes idle connections' messages from the publisher's call): the
    # direct router must then call it, not append to the buffer behind its back.
    async with Node() as node:
        session = node.connect()
        session.subscribe("t")
        seen: list[bytes] = []
        session.sink = lambda message: seen.append(message.payload)
        session.deliver = session.sink
        node.connect().publish("t", b"x")
        assert seen == [b"x"]
        assert session.receive_nowait() is None
