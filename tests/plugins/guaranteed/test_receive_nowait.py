"""``Flow.receive_nowait`` on queues: what a flow has fetched, without waiting.

A flow with nothing fetched fetches in the background (the store marks messages
delivered first, which takes an await), so these tests poll, yielding to the
event loop between looks; no wall-clock sleeps.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import anyio
import pytest
from anyio.lowlevel import checkpoint

from meshbus import Message, Node, StateError
from meshbus.abc import Flow

from ._helpers import PLUGINS, receive, service


async def poll(flow: Flow) -> Message:
    """The next message ``receive_nowait`` hands out, looking until one comes."""
    with anyio.fail_after(5):
        while (message := flow.receive_nowait()) is None:
            await checkpoint()
    return message


async def test_a_fresh_flow_has_nothing_at_once_then_fetches_in_order(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        session = node.connect()
        for i in range(5):
            await session.send_to_queue("q", str(i))
        flow = await session.bind("q", window=3)
        assert flow.receive_nowait() is None  # nothing fetched yet: it never waits
        got = [await poll(flow) for _ in range(3)]
        assert [m.payload for m in got] == [b"0", b"1", b"2"]
        assert flow.receive_nowait() is None  # the window is full of unacked messages
        for message in got:
            flow.ack(message)
        rest = [await poll(flow) for _ in range(2)]
        assert [m.payload for m in rest] == [b"3", b"4"]
        assert all(not m.redelivered for m in got + rest)
        stats = service(node).queue("q").statistics()
        assert (stats.delivered, stats.acked) == (5, 3)


async def test_after_receive_the_rest_of_the_window_is_there_at_once() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q")
        session = node.connect()
        for i in range(4):
            await session.send_to_queue("q", str(i))
        flow = await session.bind("q", window=4)
        first = await receive(flow)  # fetched all four, handed out one
        following = [flow.receive_nowait() for _ in range(3)]
        assert [m.payload for m in [first, *following] if m is not None] == [
            b"0",
            b"1",
            b"2",
            b"3",
        ]


async def test_an_empty_queue_is_waited_on_in_the_background() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q")
        session = node.connect()
        flow = await session.bind("q")
        assert flow.receive_nowait() is None
        await session.send_to_queue("q", "late")
        assert (await poll(flow)).payload == b"late"


async def test_acks_of_a_flow_that_only_polls_are_committed(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        session = node.connect()
        for i in range(3):
            await session.send_to_queue("q", str(i))
        flow = await session.bind("q")
        for _ in range(3):
            flow.ack(await poll(flow))
        store = service(node).store
        with anyio.fail_after(5):
            # The next look finds nothing and commits the acks before it waits.
            while flow.receive_nowait() is None and store.stats("default/q").messages:
                await checkpoint()
        assert store.stats("default/q").messages == 0


async def test_unacked_messages_go_back_when_the_flow_unbinds() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q")
        session = node.connect()
        await session.send_to_queue("q", "once")
        flow = await session.bind("q")
        assert (await poll(flow)).payload == b"once"
        await flow.unbind()
        with pytest.raises(StateError, match="unbound"):
            flow.receive_nowait()
        again = await session.bind("q")
        message = await poll(again)
        assert (message.payload, message.redelivered) == (b"once", True)


async def test_a_polling_flow_takes_its_turn_beside_a_waiting_one() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q", access_type="non-exclusive")
        session = node.connect()
        polling = await session.bind("q")
        waiting = await session.bind("q")
        assert polling.receive_nowait() is None  # it waits in the background from now on
        async with anyio.create_task_group() as tg:
            got: list[Message] = []

            async def other() -> None:
                got.append(await receive(waiting))

            tg.start_soon(other)
            for i in range(2):
                await session.send_to_queue("q", str(i))
            mine = await poll(polling)
        assert {mine.payload, got[0].payload} == {b"0", b"1"}


async def test_receive_and_receive_nowait_together_keep_to_the_window(
    data_dir: Path | None,
) -> None:
    # receive_nowait() fetches in the background; a receive() meanwhile must not
    # fetch a second window beside it.
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        session = node.connect()
        for i in range(10):
            await session.send_to_queue("q", str(i))
        flow = await session.bind("q", window=3)
        assert flow.receive_nowait() is None  # the background fetch starts
        got = [await receive(flow)]
        for _ in range(50):  # every fetch that was started has finished by then
            await checkpoint()
            while (message := flow.receive_nowait()) is not None:
                got.append(message)
        assert [m.payload for m in got] == [b"0", b"1", b"2"]
        for message in got:
            flow.ack(message)
        rest = [await receive(flow) for _ in range(3)]
        assert [m.payload for m in rest] == [b"3", b"4", b"5"]


async def test_a_waiting_receive_and_a_background_fetch_on_an_empty_queue_stay_quiet(
    data_dir: Path | None,
) -> None:
    # Neither fetcher may wake the other when it found nothing: they would take turns
    # for ever instead of waiting for a message.
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q")
        session = node.connect()
        flow = await session.bind("q", window=3)
        assert flow.receive_nowait() is None  # the background fetch starts
        queue = service(node).queue("q")
        got: list[Message] = []
        async with anyio.create_task_group() as tg:

            async def wait_for_one() -> None:
                got.append(await flow.receive())

            tg.start_soon(wait_for_one)
            for _ in range(20):
                await checkpoint()
            seen = queue.version
            for _ in range(200):
                await checkpoint()
            assert queue.version == seen
            await session.send_to_queue("q", "late")
        assert [m.payload for m in got] == [b"late"]


async def test_one_fetch_at_a_time_keeps_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # A receive() fetches; an ack frees room and receive_nowait() starts its background
    # fetch. Run beside the first, the second could finish first (here: it does not
    # wait at the gate) and hand out a later message before an earlier one.
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("q")
        session = node.connect()
        for i in range(6):
            await session.send_to_queue("q", str(i))
        flow = await session.bind("q", window=2)
        first = [await receive(flow), await receive(flow)]  # the window is full
        store = svc.store
        mark = store.mark_delivered
        gate = anyio.Event()
        held: list[object] = []

        async def gated(endpoint: str, ids: Iterable[int]) -> int:
            ids = list(ids)
            if not held:  # the first fetch's mark waits until the gate opens
                held.append(ids)
                await gate.wait()
            return await mark(endpoint, ids)

        monkeypatch.setattr(store, "mark_delivered", gated)
        got: list[Message] = []
        async with anyio.create_task_group() as tg:
            flow.ack(first[0])

            async def one() -> None:
                got.append(await flow.receive())

            tg.start_soon(one)
            for _ in range(10):
                await checkpoint()
            assert held  # its fetch waits at the gate
            flow.ack(first[1])  # room for one more
            assert flow.receive_nowait() is None  # the background fetch starts
            for _ in range(10):
                await checkpoint()
            gate.set()
        for _ in range(3):
            flow.ack(got[-1])
            got.append(await receive(flow))
        assert [m.payload for m in got] == [b"2", b"3", b"4", b"5"]


async def test_a_background_fetch_cut_short_by_a_stopping_node_logs_no_error(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A node that stops detaches its flows and then closes the store: a fetch under way
    # meets the closed store. Its flow is unbound, nothing is lost: no ERROR line.
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("q")
        session = node.connect()
        await session.send_to_queue("q", "x")
        flow = await session.bind("q", window=2)
        store = svc.store
        gate = anyio.Event()
        waiting = anyio.Event()

        async def closing(endpoint: str, ids: Iterable[int]) -> int:
            waiting.set()
            await gate.wait()
            raise StateError("spool store is not open")

        monkeypatch.setattr(store, "mark_delivered", closing)
        assert flow.receive_nowait() is None  # the background fetch starts
        with anyio.fail_after(5):
            await waiting.wait()
        flow.detach()  # type: ignore[attr-defined]
        gate.set()
        for _ in range(10):
            await checkpoint()
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


async def test_a_flow_bound_while_another_unbinds_mid_fetch_keeps_the_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An exclusive queue's flow is unbound (an MQTT session taken over) while a fetch
    # of it is marking messages delivered; the flow bound next must still hand them
    # out first (found by the MQTT chaos run: 45, 42, 48, 46 out of order).
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("q")
        session = node.connect()
        for i in range(4):
            await session.send_to_queue("q", str(i))
        store = svc.store
        mark = store.mark_delivered
        gate = anyio.Event()
        waiting = anyio.Event()
        held: list[object] = []

        async def gated(endpoint: str, ids: Iterable[int]) -> int:
            ids = list(ids)
            if not held:  # the first fetch's mark waits at the gate
                held.append(ids)
                waiting.set()
                await gate.wait()
            return await mark(endpoint, ids)

        monkeypatch.setattr(store, "mark_delivered", gated)
        old = await session.bind("q", window=2)
        assert old.receive_nowait() is None  # its background fetch takes 0 and 1
        with anyio.fail_after(5):
            await waiting.wait()
        await old.unbind()  # taken over mid-fetch
        new = await node.connect().bind("q", window=4)
        got = [await poll(new)]
        gate.set()  # the old fetch's mark ends
        got += [await poll(new) for _ in range(3)]
        assert [m.payload for m in got] == [b"0", b"1", b"2", b"3"]
        assert [m.redelivered for m in got] == [True, True, False, False]
