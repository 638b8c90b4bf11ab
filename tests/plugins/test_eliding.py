"""Plugin ``eliding`` (SPEC 5), driven by a manual clock: no test sleeps."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshbus import ClientProfile, DeliveryMode, ManualClock, Message, Node
from meshbus.plugins.eliding import ELIDER, SCHEDULER, DelayElider

PLUGINS = ["direct", "shared", "eliding"]


class Recorder:
    """An inline handler remembering (clock time, topic, payload) of each delivery."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.got: list[tuple[float, str, bytes]] = []

    def __call__(self, message: Message) -> None:
        self.got.append((self.clock.monotonic(), message.topic, message.payload))

    @property
    def payloads(self) -> list[bytes]:
        return [p for _, _, p in self.got]


@asynccontextmanager
async def start(clock: ManualClock, **profile: object) -> AsyncIterator[Node]:
    async with Node(plugins=PLUGINS, clock=clock, seed=0) as node:
        node.vpn().add_client_profile(ClientProfile("elide", eliding_enabled=True, **profile))
        node.vpn().add_user("viewer", client_profile="elide")
        yield node


async def move_to(clock: ManualClock, ms: int) -> None:
    """Advance to an absolute time in ms (no float drift) and let the scheduler run."""
    clock.advance_to(ms / 1000)
    await anyio.wait_all_tasks_blocked()


async def test_fast_publisher_slow_delay_gives_first_then_latest_every_delay() -> None:
    # SPEC 5 / issue scenario: a publisher every 1 ms, eliding delay 200 ms.
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=200) as node:
        rec = Recorder(clock)
        viewer = node.connect(username="viewer", on_message=rec)
        viewer.subscribe("quotes/ACME")
        publisher = node.connect()
        for i in range(1, 1001):  # message i is published at t = i - 1 ms
            publisher.publish("quotes/ACME", str(i), eliding_eligible=True)
            await move_to(clock, i)
        assert rec.got == [
            (0.0, "quotes/ACME", b"1"),  # the first goes out at once
            (0.2, "quotes/ACME", b"200"),  # then the latest held, once per delay
            (0.4, "quotes/ACME", b"400"),
            (0.6, "quotes/ACME", b"600"),
            (0.8, "quotes/ACME", b"800"),
            (1.0, "quotes/ACME", b"1000"),  # and the last of the burst
        ]
        await move_to(clock, 5000)
        assert len(rec.got) == 6  # nothing more: nothing was held
        publisher.publish("quotes/ACME", b"later", eliding_eligible=True)
        assert rec.payloads[-1] == b"later"  # quiet for longer than the delay: at once


async def test_wildcard_subscriptions_elide_each_concrete_topic_separately() -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=100) as node:
        rec = Recorder(clock)
        node.connect(username="viewer", on_message=rec).subscribe("fx/*")
        publisher = node.connect()
        for i in range(10):
            for pair in ("EURUSD", "USDJPY"):
                publisher.publish(f"fx/{pair}", f"{pair}{i}", eliding_eligible=True)
            await move_to(clock, (i + 1) * 10)
        assert rec.got == [
            (0.0, "fx/EURUSD", b"EURUSD0"),
            (0.0, "fx/USDJPY", b"USDJPY0"),
            (0.1, "fx/EURUSD", b"EURUSD9"),
            (0.1, "fx/USDJPY", b"USDJPY9"),
        ]


async def test_only_eligible_direct_messages_are_elided() -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=100) as node:
        rec = Recorder(clock)
        node.connect(username="viewer", on_message=rec).subscribe("t")
        publisher = node.connect()
        for i in range(5):
            publisher.publish("t", str(i))  # not flagged: every one is delivered
        assert rec.payloads == [b"0", b"1", b"2", b"3", b"4"]


async def test_guaranteed_messages_are_elided_only_when_delivered_as_direct() -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=100) as node:
        rec = Recorder(clock)
        viewer = node.connect(username="viewer", on_message=rec)
        elider = viewer.stash[ELIDER]
        assert isinstance(elider, DelayElider)
        for mode in (DeliveryMode.PERSISTENT, DeliveryMode.NON_PERSISTENT):
            for i in range(3):
                elider.deliver(Message("g", str(i).encode(), mode, eliding_eligible=True))
        assert rec.payloads == [b"0", b"1", b"2"] * 2  # spooled modes pass untouched
        for i in range(3):  # the same message delivered as direct is elided
            elider.deliver(Message("g", str(i).encode(), eliding_eligible=True))
        assert rec.payloads[6:] == [b"0"]
        await move_to(clock, 100)
        assert rec.payloads[6:] == [b"0", b"2"]


async def test_shared_subscription_deliveries_are_never_elided() -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=100) as node:
        rec = Recorder(clock)
        node.connect(username="viewer", on_message=rec).subscribe("#share/g/t")
        publisher = node.connect()
        for i in range(5):
            publisher.publish("t", str(i), eliding_eligible=True)
        assert rec.payloads == [b"0", b"1", b"2", b"3", b"4"]


async def test_topics_beyond_the_maximum_age_out_oldest_first_and_log_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=100, max_eliding_topics=2) as node:
        rec = Recorder(clock)
        viewer = node.connect(username="viewer", client_name="viewer", on_message=rec)
        viewer.subscribe("t/>")
        publisher = node.connect()
        with caplog.at_level(logging.INFO, logger="meshbus.eliding"):
            publisher.publish("t/1", b"1a", eliding_eligible=True)
            publisher.publish("t/2", b"2a", eliding_eligible=True)
            publisher.publish("t/1", b"1b", eliding_eligible=True)  # held
            publisher.publish("t/3", b"3a", eliding_eligible=True)  # ages out t/2 (idle longest)
            publisher.publish("t/2", b"2b", eliding_eligible=True)  # fresh again: at once
            # tracking t/2 again aged out t/1: its held 1b went out rather than being lost
        assert rec.payloads == [b"1a", b"2a", b"3a", b"1b", b"2b"]
        elider = viewer.stash[ELIDER]
        assert isinstance(elider, DelayElider)
        assert list(elider.topics) == ["t/3", "t/2"]
        assert elider.aged_out == 2
        messages = [r.getMessage() for r in caplog.records if r.name == "meshbus.eliding"]
        assert len(messages) == 1
        assert "'viewer'" in messages[0]
        await move_to(clock, 1000)
        assert rec.payloads == [b"1a", b"2a", b"3a", b"1b", b"2b"]  # 1b is not sent twice


async def test_congestion_mode_delivers_all_while_the_consumer_keeps_up() -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=0) as node:
        rec = Recorder(clock)
        node.connect(username="viewer", on_message=rec).subscribe("t")
        publisher = node.connect()
        for i in range(5):
            publisher.publish("t", str(i), eliding_eligible=True)
        assert rec.payloads == [b"0", b"1", b"2", b"3", b"4"]


async def test_congestion_mode_keeps_only_the_latest_per_topic_while_backed_up() -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=0) as node:
        viewer = node.connect(username="viewer")
        viewer.subscribe("t/>")
        publisher = node.connect()
        for i in range(5):
            publisher.publish("t/a", f"a{i}", eliding_eligible=True)
            publisher.publish("t/b", f"b{i}", eliding_eligible=True)
        publisher.publish("t/c", b"plain")  # not eligible: queued as usual
        got = []
        while (msg := viewer.receive_nowait()) is not None:
            got.append(msg.payload)
        # a0 found the buffer empty; then the buffer was backed up until drained,
        # so only the latest of each topic waited and was released at the drain.
        assert got == [b"a0", b"plain", b"b4", b"a4"]  # released in the order they began waiting
        assert viewer.statistics().discarded == 0


async def test_closing_a_session_drops_what_it_held_and_the_scheduler_carries_on() -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=100) as node:
        closing, staying = Recorder(clock), Recorder(clock)
        a = node.connect(username="viewer", on_message=closing)
        b = node.connect(username="viewer", on_message=staying)
        a.subscribe("t")
        b.subscribe("t")
        publisher = node.connect()
        publisher.publish("t", b"1", eliding_eligible=True)
        publisher.publish("t", b"2", eliding_eligible=True)
        a.close()
        await move_to(clock, 100)
        assert closing.payloads == [b"1"]
        assert staying.payloads == [b"1", b"2"]
        assert len(node.stash[SCHEDULER]) == 0


async def test_sessions_without_eliding_are_untouched() -> None:
    clock = ManualClock()
    async with start(clock, eliding_delay_ms=100) as node:
        rec = Recorder(clock)
        session = node.connect(on_message=rec)
        session.subscribe("t")
        for i in range(3):
            node.connect().publish("t", str(i), eliding_eligible=True)
        assert rec.payloads == [b"0", b"1", b"2"]
        assert ELIDER not in session.stash


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 60), st.sampled_from(["x", "y", "z"])), min_size=1, max_size=40
    ),
    delay=st.sampled_from([10, 25, 50]),
)
def test_property_last_update_always_arrives_and_gaps_respect_the_delay(
    steps: list[tuple[int, str]], delay: int, anyio_backend: str
) -> None:
    """For any publish schedule: per topic, deliveries are spaced by at least the delay,
    each delivery is the newest message at that moment, and the last one always arrives."""

    async def scenario() -> None:
        clock = ManualClock()
        async with start(clock, eliding_delay_ms=delay) as node:
            sent: list[tuple[str, int]] = []  # (topic, n) in publish order
            # each delivery: (time, topic, n, how many messages were published by then)
            got: list[tuple[float, str, int, int]] = []

            def on_message(message: Message) -> None:
                n = int(message.payload)
                got.append((clock.monotonic(), message.topic, n, len(sent)))

            node.connect(username="viewer", on_message=on_message).subscribe(">")
            publisher = node.connect()
            now = 0
            for n, (gap, topic) in enumerate(steps):
                now += gap
                await move_to(clock, now)
                sent.append((topic, n))
                publisher.publish(topic, str(n), eliding_eligible=True)
            await move_to(clock, now + delay)
            for topic in {t for t, _ in sent}:
                mine = [(t, n, seen) for t, tp, n, seen in got if tp == topic]
                published = [n for tp, n in sent if tp == topic]
                assert mine[-1][1] == published[-1]  # the last update arrived
                for (t1, _, _), (t2, _, _) in itertools.pairwise(mine):
                    assert t2 - t1 >= delay / 1000 - 1e-9  # at most one per delay
                for _, n, seen in mine:  # each delivery is the newest of its topic by then
                    assert n == [m for tp, m in sent[:seen] if tp == topic][-1]

    anyio.run(scenario, backend=anyio_backend)
