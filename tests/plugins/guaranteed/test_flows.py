"""Consumer flows on queues (SPEC 4): window, acks, order, access types, redelivery,
dead message queues, TTL and restarts.

Each test runs on the MemoryStore and on the SqliteStore where storage matters; the
restart tests need a durable store and use SQLite only. TTL tests move a ManualClock
instead of sleeping.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from anyio.lowlevel import checkpoint

from meshbus import (
    DeliveryMode,
    ManualClock,
    Message,
    Node,
    PublishRejectedError,
    Session,
    StateError,
)

from ._helpers import PLUGINS, nothing_for, receive, service


def held(node: Node, queue: str) -> int:
    """Messages the store holds for ``queue``."""
    return service(node).store.stats(f"default/{queue}").messages


async def fill(session: Session, queue: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        await session.send_to_queue(queue, str(i).encode())


def numbers(messages: list[Message]) -> list[int]:
    return [int(m.payload) for m in messages]


# --- window, acks, order ---------------------------------------------------------------------


async def test_window_limits_unacked_messages_and_an_ack_frees_room(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        s = node.connect()
        await fill(s, "q", 5)
        flow = await s.bind("q", window=2)
        first = [await receive(flow), await receive(flow)]
        assert numbers(first) == [0, 1]
        got: list[Message] = []
        async with anyio.create_task_group() as tg:

            async def third() -> None:
                got.append(await flow.receive())

            tg.start_soon(third)
            await anyio.sleep(0.02)
            assert got == []  # two unacked: the window is full
            flow.ack(first[0])  # wakes the waiting receive
            with anyio.fail_after(2):
                while not got:
                    await anyio.sleep(0.001)
        assert numbers(got) == [2]
        await nothing_for(flow, 0.02)  # still two unacked (1 and 2)
        flow.ack(first[1])
        flow.ack(got[0])
        assert numbers([await receive(flow), await receive(flow)]) == [3, 4]
        await flow.unbind()


async def test_ack_deletes_the_message_once_flushed(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q")
        s = node.connect()
        await fill(s, "q", 2)
        assert held(node, "q") == 2
        async with await s.bind("q") as flow:
            a, b = await receive(flow), await receive(flow)
            flow.ack(a)
            flow.ack(b)
            with pytest.raises(StateError):
                flow.ack(b)  # twice
            with pytest.raises(StateError):
                flow.ack(Message("t", b"x"))  # not from a queue
            # Waiting with nothing to hand out, the flow commits its acks.
            await nothing_for(flow, 0.02)
            assert held(node, "q") == 0
            await fill(s, "q", 2, start=2)
            c, d = await receive(flow), await receive(flow)
            flow.ack(c)
        # unbind commits the ack; the unacked message stays for redelivery
        assert held(node, "q") == 1
        await svc.store.check()
        async with await s.bind("q") as flow:
            again = await receive(flow)
            assert (again.payload, again.redelivered) == (d.payload, True)
            flow.ack(again)
        assert held(node, "q") == 0
        assert svc.store.endpoints() == []
        await svc.store.check()


async def test_acks_from_another_task_are_committed_while_receive_waits(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        s = node.connect()
        await fill(s, "q", 1)
        async with await s.bind("q") as flow:
            m = await receive(flow)
            async with anyio.create_task_group() as tg:
                tg.start_soon(nothing_for, flow, 0.1)  # a receive waiting for more
                await anyio.sleep(0.01)
                flow.ack(m)
                with anyio.fail_after(2):
                    while held(node, "q"):
                        await anyio.sleep(0.001)
                tg.cancel_scope.cancel()


async def test_an_ack_from_another_flow_is_refused(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("a")
        service(node).create_queue("b")
        s = node.connect()
        await s.send_to_queue("a", b"x")
        async with await s.bind("a") as fa, await s.bind("b") as fb:
            m = await receive(fa)
            with pytest.raises(StateError):
                fb.ack(m)
            fa.ack(m)


async def test_each_queue_delivers_in_publish_order(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"])
        svc.create_queue("odd", subscriptions=["t/odd/>"])
        s = node.connect()
        n = 0
        for _ in range(3):  # mixed single sends, batches and sends by name
            await s.send(f"t/{'odd' if n % 2 else 'even'}/{n}", str(n).encode())
            n += 1
            batch = [
                (f"t/{'odd' if i % 2 else 'even'}/{i}", str(i).encode()) for i in range(n, n + 5)
            ]
            await s.send_many(batch)
            n += 5
        async with await s.bind("q", window=4) as flow:
            got = []
            for _ in range(n):
                m = await receive(flow)
                flow.ack(m)
                got.append(m)
        assert numbers(got) == list(range(n))
        async with await s.bind("odd", window=1) as flow:
            odd = []
            for _ in range(n // 2):
                m = await receive(flow)
                flow.ack(m)
                odd.append(m)
        assert numbers(odd) == list(range(1, n, 2))


async def test_flow_is_an_async_iterator_that_ends_on_unbind(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        s = node.connect()
        await fill(s, "q", 3)
        flow = await s.bind("q")
        got: list[Message] = []
        with anyio.fail_after(2):
            async for m in flow:
                got.append(m)
                flow.ack(m)
                if len(got) == 3:
                    await flow.unbind()
        assert numbers(got) == [0, 1, 2]
        with pytest.raises(StateError):
            await flow.receive()
        await flow.unbind()  # idempotent


@pytest.mark.parametrize("checkpoints", [1, 2, 3, 5])
async def test_unbind_ends_a_receive_that_is_in_progress(
    data_dir: Path | None, checkpoints: int
) -> None:
    # The receive may be anywhere in its loop (committing acks, reading the store)
    # when another task unbinds the flow: it must end, not wait for a next message.
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        s = node.connect()
        await s.send_to_queue("q", b"x")
        flow = await s.bind("q")
        flow.ack(await receive(flow))  # an ack to commit on the next receive
        ended: list[str] = []

        async def consume() -> None:
            async for _ in flow:
                ended.append("message")
            ended.append("ended")

        with anyio.fail_after(2):
            async with anyio.create_task_group() as tg:
                tg.start_soon(consume)
                for _ in range(checkpoints):
                    await checkpoint()
                await flow.unbind()
        assert ended == ["ended"]
        assert held(node, "q") == 0


async def test_closing_the_session_ends_its_flows(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        s = node.connect()
        flow = await s.bind("q")
        done = anyio.Event()

        async def consume() -> None:
            async for _ in flow:
                pass
            done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.sleep(0.01)
            s.close()
            with anyio.fail_after(2):
                await done.wait()
        assert service(node).queue("q").flows == []


# --- exclusive and non-exclusive access -------------------------------------------------------


async def test_exclusive_queue_standby_takes_over_with_the_unacked_messages_first(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")  # exclusive is the default
        s1 = node.connect()
        s2 = node.connect()
        await fill(s1, "q", 6)
        active = await s1.bind("q", window=4)
        standby = await s2.bind("q", window=10)
        got = [await receive(active) for _ in range(3)]
        assert numbers(got) == [0, 1, 2]
        active.ack(got[0])
        await nothing_for(standby, 0.02)  # it stands by while the active flow is bound
        taken: list[Message] = []
        async with anyio.create_task_group() as tg:

            async def take_over() -> None:
                for _ in range(5):
                    m = await standby.receive()
                    taken.append(m)
                    standby.ack(m)

            tg.start_soon(take_over)
            await anyio.sleep(0.01)
            assert taken == []
            await active.unbind()
            with anyio.fail_after(2):
                while len(taken) < 5:
                    await anyio.sleep(0.001)
        # 1 and 2 were delivered to the old flow and not acked: first, flagged, in order.
        # 3 was prefetched by the old flow but never handed out: not flagged.
        assert [(int(m.payload), m.redelivered) for m in taken] == [
            (1, True),
            (2, True),
            (3, False),
            (4, False),
            (5, False),
        ]
        await standby.unbind()
        assert held(node, "q") == 0


async def test_exclusive_standby_takes_over_when_the_active_session_closes(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q", access_type="exclusive")
        s1 = node.connect()
        s2 = node.connect()
        await fill(s1, "q", 2)
        active = await s1.bind("q")
        standby = await s2.bind("q")
        assert numbers([await receive(active)]) == [0]
        await nothing_for(standby, 0.01)
        s1.close()
        m = await receive(standby)
        assert (m.payload, m.redelivered) == (b"0", True)
        m2 = await receive(standby)
        assert (m2.payload, m2.redelivered) == (b"1", False)


async def test_non_exclusive_queue_round_robins_across_waiting_flows(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q", subscriptions=["t/>"], access_type="non-exclusive")
        pub = node.connect()
        s = node.connect()
        flows = {"a": await s.bind("q", window=5), "b": await s.bind("q", window=5)}
        got: list[tuple[str, int]] = []

        async def consume(name: str) -> None:
            flow = flows[name]
            async for m in flow:
                got.append((name, int(m.payload)))
                flow.ack(m)

        async with anyio.create_task_group() as tg:
            for name in flows:
                tg.start_soon(consume, name)
            await anyio.sleep(0.01)  # both flows are waiting
            for i in range(8):
                await pub.send("t/x", str(i).encode())
                with anyio.fail_after(2):
                    while len(got) <= i:
                        await anyio.sleep(0.001)
            for flow in flows.values():
                await flow.unbind()
        assert [n for _, n in got] == list(range(8))
        names = [name for name, _ in got]
        assert names in (["a", "b"] * 4, ["b", "a"] * 4), names


async def test_non_exclusive_queue_shares_a_backlog_round_robin(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q", access_type="non-exclusive")
        s = node.connect()
        await fill(s, "q", 8)
        a = await s.bind("q", window=3)
        b = await s.bind("q", window=3)
        got_a = [await receive(a), await receive(a), await receive(a)]
        await nothing_for(a, 0.01)  # a's window is full...
        got_b = [await receive(b)]  # ...b gets the next one
        for m in got_a:
            a.ack(m)
        assert numbers(got_a) == [0, 1, 2]
        assert numbers(got_b) == [3]
        # A flow that unbinds hands its unacked messages to the other, flagged.
        await b.unbind()
        m = await receive(a)
        assert (m.payload, m.redelivered) == (b"3", True)
        assert numbers([await receive(a), await receive(a)]) == [4, 5]


# --- redelivery, max redelivery, dead message queue --------------------------------------------


async def test_unacked_messages_are_redelivered_flagged_after_unbind(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        s = node.connect()
        await fill(s, "q", 3)
        async with await s.bind("q", window=2) as flow:
            first = [await receive(flow), await receive(flow)]
        assert [m.redelivered for m in first] == [False, False]
        async with await s.bind("q") as flow:
            again = [await receive(flow) for _ in range(3)]
        assert [(int(m.payload), m.redelivered) for m in again] == [
            (0, True),
            (1, True),
            (2, False),
        ]
        assert [m.message_id for m in again[:2]] == [m.message_id for m in first]


async def test_unacked_messages_are_redelivered_flagged_after_the_session_closes(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        consumer = node.connect()
        await fill(consumer, "q", 2)
        flow = await consumer.bind("q", window=1)
        assert (await receive(flow)).payload == b"0"
        consumer.close()
        with pytest.raises(StateError):
            await flow.receive()
        async with await node.connect().bind("q") as flow2:
            m = await receive(flow2)
            assert (m.payload, m.redelivered) == (b"0", True)
            m = await receive(flow2)
            assert (m.payload, m.redelivered) == (b"1", False)


async def bounce(session: Session, queue: str, times: int) -> list[Message]:
    """Bind, receive one message without acking it, unbind; ``times`` times."""
    got = []
    for _ in range(times):
        async with await session.bind(queue, window=1) as flow:
            got.append(await receive(flow))
    return got


async def test_max_redelivery_moves_the_message_to_the_dead_message_queue(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        q = svc.create_queue("q", max_redelivery=2, dead_message_queue="dmq")
        svc.create_queue("dmq")
        s = node.connect()
        await s.send_to_queue("q", b"poison", headers={"h": 1})
        await s.send_to_queue("q", b"next")
        got = await bounce(s, "q", 3)  # the first delivery and 2 redeliveries
        assert [(m.payload, m.redelivered) for m in got] == [
            (b"poison", False),
            (b"poison", True),
            (b"poison", True),
        ]
        async with await s.bind("q") as flow:
            m = await receive(flow)  # the poison message is gone from q
            assert (m.payload, m.redelivered) == (b"next", False)
            flow.ack(m)
        assert (q.dead_lettered, q.discarded) == (1, 0)
        assert held(node, "q") == 0
        async with await s.bind("dmq") as flow:
            dead = await receive(flow)
            flow.ack(dead)
        assert (dead.topic, dead.payload, dead.headers) == ("#P2P/QUE/q", b"poison", {"h": 1})
        assert not dead.redelivered
        assert dead.destination == "dmq"
        assert dead.delivery_mode is DeliveryMode.PERSISTENT
        assert held(node, "dmq") == 0
        await svc.store.check()


async def test_max_redelivery_without_a_dead_message_queue_discards(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        q = svc.create_queue("q", max_redelivery=1)
        gone = svc.create_queue("gone", max_redelivery=1, dead_message_queue="missing")
        s = node.connect()
        for name in ("q", "gone"):
            await s.send_to_queue(name, b"poison")
            assert len(await bounce(s, name, 2)) == 2
            async with await s.bind(name) as flow:
                await nothing_for(flow, 0.01)
            assert held(node, name) == 0
        assert (q.discarded, q.dead_lettered) == (1, 0)
        assert (gone.discarded, gone.dead_lettered) == (1, 0)
        await svc.store.check()


async def test_dead_message_queue_that_is_full_discards(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        q = svc.create_queue("q", max_redelivery=1, dead_message_queue="dmq")
        svc.create_queue("dmq", max_messages=0)
        s = node.connect()
        await s.send_to_queue("q", b"poison")
        await bounce(s, "q", 2)
        async with await s.bind("q") as flow:
            await nothing_for(flow, 0.01)
        assert (q.discarded, q.dead_lettered) == (1, 0)
        assert held(node, "q") == held(node, "dmq") == 0


async def test_max_redelivery_zero_redelivers_forever(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q", dead_message_queue="dmq")
        service(node).create_queue("dmq")
        s = node.connect()
        await s.send_to_queue("q", b"x")
        got = await bounce(s, "q", 6)
        assert [m.redelivered for m in got] == [False] + [True] * 5
        assert held(node, "q") == 1
        assert held(node, "dmq") == 0


# --- TTL -------------------------------------------------------------------------------------


async def test_expired_messages_go_to_the_dead_message_queue_when_ttl_is_respected(
    data_dir: Path | None,
) -> None:
    clock = ManualClock()
    async with Node(plugins=PLUGINS, data_dir=data_dir, clock=clock) as node:
        svc = service(node)
        q = svc.create_queue("q", respect_ttl=True, dead_message_queue="dmq")
        svc.create_queue("dmq", respect_ttl=True)
        s = node.connect()
        await s.send_to_queue("q", b"short", ttl=10)
        await s.send_to_queue("q", b"long", ttl=100)
        await s.send_to_queue("q", b"forever")
        clock.advance(10)  # exactly at its expiry: expired
        async with await s.bind("q") as flow:
            got = [await receive(flow), await receive(flow)]
            for m in got:
                flow.ack(m)
            await nothing_for(flow, 0.01)
        assert [m.payload for m in got] == [b"long", b"forever"]
        assert (q.expired, q.dead_lettered, q.discarded) == (1, 1, 0)
        clock.advance(1000)  # the dead copy does not expire again
        async with await s.bind("dmq") as flow:
            dead = await receive(flow)
            flow.ack(dead)
        assert dead.payload == b"short"
        assert held(node, "q") == held(node, "dmq") == 0


async def test_expired_messages_are_discarded_without_a_dead_message_queue(
    data_dir: Path | None,
) -> None:
    clock = ManualClock()
    async with Node(plugins=PLUGINS, data_dir=data_dir, clock=clock) as node:
        svc = service(node)
        q = svc.create_queue("q", subscriptions=["t/>"], respect_ttl=True)
        s = node.connect()
        await s.send("t/1", b"a", ttl=5)
        await s.send_many([("t/2", b"b"), ("t/3", b"c")], ttl=5)
        await s.send("t/4", b"d", ttl=6)
        clock.advance(5.5)
        async with await s.bind("q") as flow:
            m = await receive(flow)
            flow.ack(m)
            await nothing_for(flow, 0.01)
        assert m.payload == b"d"
        assert (q.expired, q.discarded, q.dead_lettered) == (3, 3, 0)
        assert held(node, "q") == 0
        await svc.store.check()


async def test_ttl_is_ignored_when_the_queue_does_not_respect_it(data_dir: Path | None) -> None:
    clock = ManualClock()
    async with Node(plugins=PLUGINS, data_dir=data_dir, clock=clock) as node:
        q = service(node).create_queue("q", dead_message_queue="dmq")  # respect_ttl=False
        service(node).create_queue("dmq")
        s = node.connect()
        await s.send_to_queue("q", b"old", ttl=1)
        clock.advance(3600)
        async with await s.bind("q") as flow:
            m = await receive(flow)
            flow.ack(m)
        assert m.payload == b"old"
        assert (q.expired, q.dead_lettered) == (0, 0)


async def test_unexpired_messages_are_delivered_and_a_zero_ttl_never_expires(
    data_dir: Path | None,
) -> None:
    clock = ManualClock()
    async with Node(plugins=PLUGINS, data_dir=data_dir, clock=clock) as node:
        q = service(node).create_queue("q", respect_ttl=True)
        s = node.connect()
        await s.send_to_queue("q", b"a", ttl=10)
        await s.send_to_queue("q", b"zero", ttl=0)  # Solace: 0 means no expiry
        clock.advance(9.9)
        async with await s.bind("q") as flow:
            got = [await receive(flow), await receive(flow)]
        assert [m.payload for m in got] == [b"a", b"zero"]
        assert q.expired == 0


# --- restart (durable store) ------------------------------------------------------------------


async def test_messages_survive_a_restart_and_unacked_ones_come_back_flagged(
    tmp_path: Path,
) -> None:
    settings = {"subscriptions": ["t/>"], "max_messages": 100}
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        service(node).create_queue("q", **settings)
        s = node.connect()
        for i in range(3):
            await s.send(f"t/{i}", str(i).encode(), headers={"i": i})
        await s.send_many([(f"t/{i}", str(i).encode()) for i in range(3, 6)])
        await s.send("t/6", b"6", persistent=False)
        flow = await s.bind("q", window=3)
        got = [await receive(flow) for _ in range(3)]
        flow.ack(got[0])  # acked, the commit left to the node's shutdown
        ids = [m.message_id for m in got]
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        svc = service(node)
        q = svc.create_queue("q", **settings)
        assert held(node, "q") == 6
        s = node.connect()
        async with await s.bind("q", window=10) as flow:
            back = [await receive(flow) for _ in range(6)]
            await nothing_for(flow, 0.02)
            for m in back[:4]:
                flow.ack(m)
        assert [(int(m.payload), m.redelivered) for m in back] == [
            (1, True),
            (2, True),
            (3, False),
            (4, False),
            (5, False),
            (6, False),
        ]
        assert [m.message_id for m in back[:2]] == ids[1:]
        assert back[0].headers == {"i": 1}
        assert back[0].topic == "t/1"
        assert back[-1].delivery_mode is DeliveryMode.NON_PERSISTENT
        assert q.settings.max_messages == 100
        await svc.store.check()
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        service(node).create_queue("q", **settings)
        async with await node.connect().bind("q") as flow:
            last = [await receive(flow), await receive(flow)]
            await nothing_for(flow, 0.02)
        assert [(int(m.payload), m.redelivered) for m in last] == [(5, True), (6, True)]


async def test_restart_keeps_counting_against_the_quota(tmp_path: Path) -> None:
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        service(node).create_queue("q", max_messages=2)
        s = node.connect()
        await fill(s, "q", 2)
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        service(node).create_queue("q", max_messages=2)
        with pytest.raises(PublishRejectedError) as info:
            await node.connect().send_to_queue("q", b"x")
        assert (info.value.reason, info.value.limit, info.value.size) == ("over-quota", 2, 3)


async def test_expired_messages_leave_the_queue_without_a_consumer() -> None:
    clock = ManualClock()
    async with Node(plugins=PLUGINS, clock=clock) as node:
        svc = service(node)
        svc.create_queue("q", respect_ttl=True, dead_message_queue="dmq")
        svc.create_queue("dmq")
        await node.connect().send_to_queue("q", b"x", ttl=1)
        clock.advance(2)
        with anyio.move_on_after(0.2):
            while held(node, "dmq") == 0:
                await anyio.sleep(0.005)
        assert (held(node, "q"), held(node, "dmq")) == (0, 1)


async def wait_held(node: Node, queue: str, count: int) -> None:
    with anyio.fail_after(2):
        while held(node, queue) != count:
            await anyio.sleep(0.005)


async def test_the_ttl_sweep_takes_only_expired_messages_and_keeps_the_order() -> None:
    clock = ManualClock()
    async with Node(plugins=PLUGINS, clock=clock) as node:
        svc = service(node)
        queue = svc.create_queue("q", respect_ttl=True, dead_message_queue="dmq")
        svc.create_queue("dmq")
        s = node.connect()
        for i, ttl in enumerate([1, None, 1, 50, 1]):
            await s.send_to_queue("q", f"m{i}", ttl=ttl)
        clock.advance(2)
        await wait_held(node, "dmq", 3)
        assert held(node, "q") == 2
        assert queue.expired == 3
        async with await s.bind("q") as flow:
            got = [await flow.receive() for _ in range(2)]
            for message in got:
                flow.ack(message)
        assert [m.payload for m in got] == [b"m1", b"m3"]
        async with await s.bind("dmq") as dead:
            assert sorted([(await dead.receive()).payload for _ in range(3)]) == [
                b"m0",
                b"m2",
                b"m4",
            ]


async def test_the_ttl_sweep_leaves_what_a_flow_holds_to_the_flow() -> None:
    clock = ManualClock()
    async with Node(plugins=PLUGINS, clock=clock) as node:
        svc = service(node)
        svc.create_queue("q", respect_ttl=True, dead_message_queue="dmq")
        svc.create_queue("dmq")
        s = node.connect()
        await s.send_to_queue("q", b"held", ttl=1)
        await s.send_to_queue("q", b"waiting", ttl=1)
        async with await s.bind("q", window=1) as flow:
            message = await flow.receive()  # handed out before it expired
            clock.advance(2)
            await wait_held(node, "dmq", 1)  # the one still in the queue
            flow.ack(message)  # the held one is the application's: acked, not expired
        assert message.payload == b"held"
        await wait_held(node, "q", 0)
        assert held(node, "dmq") == 1


async def test_a_queue_that_ignores_ttl_keeps_expired_messages() -> None:
    clock = ManualClock()
    async with Node(plugins=PLUGINS, clock=clock) as node:
        svc = service(node)
        svc.create_queue("q", dead_message_queue="dmq")  # respect_ttl is off by default
        svc.create_queue("dmq")
        await node.connect().send_to_queue("q", b"x", ttl=1)
        clock.advance(5)
        for _ in range(20):
            await anyio.sleep(0.005)
        assert (held(node, "q"), held(node, "dmq")) == (1, 0)
