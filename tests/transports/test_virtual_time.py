"""Remote sessions over an in-memory network, on a manual clock: keepalive, half-open
peers, reconnects with backoff and connect order, driven only by moving clock time."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from meshbus import ManualClock, Node, TransportError
from meshbus.transports import Backoff, ListenerSettings, MemoryNetwork, connect, start_server
from meshbus.transports._server import SERVERS
from meshbus.transports._streams import memory_stream_pair

QUICK = ListenerSettings(keepalive=1.0, keepalive_timeout=3.0, handshake_timeout=2.0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def network(clock: ManualClock) -> MemoryNetwork:
    return MemoryNetwork(clock)


@pytest.fixture
async def node(clock: ManualClock, network: MemoryNetwork) -> AsyncIterator[Node]:
    async with Node(name="b", clock=clock) as running:
        await start_server(running, QUICK, listener=network.listen("b"))
        yield running


def steady(initial: float = 1.0, maximum: float = 120.0) -> Backoff:
    """The default backoff without jitter, so a test can count its attempts."""
    return Backoff(initial, maximum, jitter=0.0, rng=random.Random(0))


async def test_a_session_reaches_a_node_over_the_memory_network(
    node: Node, network: MemoryNetwork, clock: ManualClock
) -> None:
    local = node.connect(client_name="local")
    local.subscribe("t")
    async with connect(network.connectable("b", source="a"), clock=clock) as remote:
        assert remote.url == "memory://b"
        assert remote.welcome["node_id"] == node.node_id
        remote.publish("t", b"over the wire")
        await remote.confirm()
        message = local.receive_nowait()
        assert message is not None
        assert (message.payload, message.sender) == (b"over the wire", remote.client_name)
    (server,) = node.stash[SERVERS]
    assert server.url == "memory://b"


async def test_a_half_open_connection_is_found_by_keepalive_and_replaced(
    node: Node, network: MemoryNetwork, clock: ManualClock
) -> None:
    async with connect(
        network.connectable("b", source="a"), clock=clock, backoff=steady()
    ) as remote:
        remote.subscribe("t")
        await remote.confirm()
        network.half_open("a", "b")  # both directions now lose everything, silently
        lost_after = await clock.wait_for(lambda: not remote.connected, within=60)
        # Pings go unanswered: the timeout (3 s) passes, give or take a check interval.
        assert 3.0 <= lost_after <= 4.0
        # The node dropped its side too: no session of that name is left.
        await clock.wait_for(lambda: remote.client_name not in node.vpn().sessions, within=60)
        network.heal("a", "b")
        await clock.wait_for(lambda: remote.connected, within=60)
        assert remote.connects == 2
        node.connect().publish("t", b"after the reconnect")
        await clock.settle()
        message = remote.receive_nowait()
        assert message is not None
        assert message.payload == b"after the reconnect"  # the subscription came back


async def test_reconnect_attempts_follow_the_backoff_on_the_clock(
    node: Node, network: MemoryNetwork, clock: ManualClock
) -> None:
    async with connect(
        network.connectable("b", source="a"), clock=clock, backoff=steady()
    ) as remote:
        network.partition("a", "b")  # cut, and new connections refused
        before = network.connects
        await clock.wait_for(lambda: not remote.connected, within=60)
        await clock.run(600)
        # 1, 2, 4, ... 64 s, then every 120 s: 7 attempts in the first 127 s, 3 more by
        # 600 s (and the wait before the next one has begun).
        assert remote.connect_failures == 10
        assert remote.backoff.attempt == 11
        assert network.connects == before  # every attempt was refused before connecting
        network.heal("a", "b")
        waited = await clock.wait_for(lambda: remote.connected, within=200)
        assert waited <= 120
        assert remote.backoff.attempt == 0  # a login starts the delays over


async def test_targets_are_tried_in_order(
    node: Node, network: MemoryNetwork, clock: ManualClock
) -> None:
    async with Node(name="c", clock=clock) as other:
        await start_server(other, QUICK, listener=network.listen("c"))
        targets = [network.connectable(name, source="a") for name in ("nowhere", "b", "c")]
        async with connect(*targets, clock=clock) as remote:
            assert remote.url == "memory://b"
            assert remote.welcome["node_id"] == node.node_id
        network.partition("a", "b")
        async with connect(*targets, clock=clock) as remote:
            assert remote.url == "memory://c"
            assert remote.welcome["node_id"] == other.node_id
        with pytest.raises(TransportError, match="nothing listens"):
            async with connect(targets[0], clock=clock):
                pass


async def test_a_login_that_never_comes_times_out_on_the_clock(
    network: MemoryNetwork, clock: ManualClock
) -> None:
    silent = network.listen("silent")  # accepts, and never answers
    failures: list[Exception] = []

    async def nothing(stream: Any) -> None:
        await anyio.Event().wait()

    async def log_in() -> None:
        try:
            async with connect(network.connectable("silent"), clock=clock, connect_timeout=5):
                pass
        except TransportError as exc:
            failures.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(silent.serve, nothing, tg)
        tg.start_soon(log_in)
        waited = await clock.wait_for(lambda: bool(failures), within=60)
        tg.cancel_scope.cancel()
    assert waited == 5
    assert "no answer to the login" in str(failures[0])


async def test_every_receive_of_a_memory_stream_lets_other_tasks_run() -> None:
    """As anyio's own streams: a reader taking a long write in pieces gives other tasks
    a turn between pieces (a link reader took its pieces back to back, and trio could
    then act on three steps of a read of large batches without a turn for anyone)."""
    ours, theirs = memory_stream_pair()
    turns: list[int] = []
    pieces: list[int] = []

    async def other() -> None:
        while len(pieces) < 4:
            turns.append(len(pieces))
            await anyio.lowlevel.checkpoint()

    async with ours, theirs, anyio.create_task_group() as tg:
        await ours.send(bytes(4 * 1024))
        tg.start_soon(other)
        await anyio.lowlevel.checkpoint()
        while len(pieces) < 4:
            pieces.append(len(await theirs.receive(1024)))
    assert pieces == [1024] * 4
    # The other task had a turn while the read was part way: it saw a count between
    # the first and the last (pieces taken back to back leave it only 0, then none).
    # Which counts it sees is trio's choice: it picks the order of a turn's tasks at
    # random, and may let the reader take two pieces between two of its turns.
    assert set(turns) & {1, 2, 3}


@pytest.mark.parametrize("to", ["topic", "queue"])
async def test_a_send_whose_answer_was_lost_comes_again_flagged(
    node: Node, network: MemoryNetwork, clock: ManualClock, to: str
) -> None:
    """The node stored a send, and its OK was lost with the connection: the session
    sends it again once back, as it must (at least once), and the node cannot know it
    has it. So the second copy is stored flagged ``redelivered`` (SPEC 4: nothing is
    delivered twice without the flag); a send the node never saw is not flagged."""
    queue = node.guaranteed.create_queue("q", subscriptions=["g/>"])
    async with connect(
        network.connectable("b", source="a"), clock=clock, backoff=steady()
    ) as remote:
        await remote.send("g/1", b"first")
        network.delay("a", "b", 1.0)
        async with anyio.create_task_group() as tg:
            if to == "topic":
                tg.start_soon(remote.send, "g/2", b"answer lost")
            else:
                tg.start_soon(remote.send_to_queue, "q", b"answer lost")
            await clock.run(1.5)  # the node has it; its OK is on the way
            assert queue.usage()[0] == 2
            network.cut("a", "b")
            network.heal("a", "b")
            await clock.run(5.0)  # reconnected, sent again, answered
        await remote.send("g/3", b"after")
    flow = await node.connect(client_name="consumer").bind("q")
    got = [await flow.receive() for _ in range(queue.usage()[0])]
    assert [(m.payload, m.redelivered) for m in got] == [
        (b"first", False),
        (b"answer lost", False),
        (b"answer lost", True),
        (b"after", False),
    ]
