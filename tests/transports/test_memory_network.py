"""The in-memory network under multi-node tests: connections by name, and the ways a
test breaks them (cut, partition, half-open, delay), on a manual clock."""

from __future__ import annotations

import anyio
import pytest

from meshbus import ManualClock, TransportError
from meshbus.transports import MemoryNetwork, MemoryStream


async def accept_one(network: MemoryNetwork, name: str) -> tuple[MemoryStream, MemoryStream]:
    """Listen on ``name``, connect to it from ``"a"``, return (client end, server end)."""
    listener = network.listen(name)
    accepted: list[MemoryStream] = []

    async def keep(stream: anyio.abc.ByteStream) -> None:
        assert isinstance(stream, MemoryStream)
        accepted.append(stream)

    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, keep, tg)
        client = await network.connectable(name, source="a").connect()
        await anyio.wait_all_tasks_blocked()
        tg.cancel_scope.cancel()
    assert isinstance(client, MemoryStream)
    return client, accepted[0]


async def test_bytes_cross_both_ways_in_order() -> None:
    network = MemoryNetwork(ManualClock())
    client, server = await accept_one(network, "b")
    assert (client.remote, server.remote) == ("b", "a")
    await client.send(b"hello ")
    await client.send(b"world")
    assert await server.receive(3) == b"hel"
    assert await server.receive() == b"lo "
    assert await server.receive() == b"world"
    await server.send(b"back")
    assert await client.receive() == b"back"
    assert network.connections("a", "b") == 1


async def test_a_write_cancelled_as_it_yields_was_still_sent() -> None:
    # As a TCP socket's: the bytes are taken before the write yields, so a writer
    # cancelled there (its node stopping) has sent them. Before, the yield came
    # first and a cancelled write dropped its bytes, which no real stream does.
    network = MemoryNetwork(ManualClock())
    client, server = await accept_one(network, "b")
    with anyio.CancelScope() as scope:
        scope.cancel()
        await client.send(b"last words")
    with anyio.fail_after(1):
        assert await server.receive() == b"last words"


async def test_connecting_where_nothing_listens_fails() -> None:
    network = MemoryNetwork()
    with pytest.raises(TransportError, match="nothing listens"):
        await network.connect("nowhere")
    network.listen("b")
    with pytest.raises(Exception, match="listens on memory://b already"):
        network.listen("b")


async def test_closing_one_end_is_the_end_of_the_stream_for_the_other() -> None:
    network = MemoryNetwork()
    client, server = await accept_one(network, "b")
    await client.send(b"last words")
    await client.aclose()
    assert await server.receive() == b"last words"
    with pytest.raises(anyio.EndOfStream):
        await server.receive()
    with pytest.raises(anyio.BrokenResourceError):
        await server.send(b"too late")


async def test_what_is_in_flight_when_the_far_end_closes_still_arrives() -> None:
    # As over TCP: the bytes written before the close reach the reader ahead of the
    # end of the stream, even when the reader writes in the meantime. Its writes are
    # lost until the far end's reset could have come back (a round trip), then fail.
    # Before, the close broke the way back at once: the reader's next write failed,
    # and a link that ended on that error never read what was still on its way.
    clock = ManualClock()
    network = MemoryNetwork(clock)
    client, server = await accept_one(network, "b")
    network.delay("a", "b", 0.5)
    await server.send(b"last words")
    await server.aclose()
    await client.send(b"ping")  # no error yet: the reset is not back
    clock.advance(0.5)
    assert await client.receive() == b"last words"
    with pytest.raises(anyio.EndOfStream):
        await client.receive()
    clock.advance(0.5)
    with pytest.raises(anyio.BrokenResourceError):
        await client.send(b"too late")


async def test_a_cut_breaks_both_ends_and_a_partition_refuses_new_connections() -> None:
    network = MemoryNetwork()
    client, server = await accept_one(network, "b")
    await client.send(b"lost in the cut")
    assert network.cut("a", "b") == 1
    with pytest.raises(anyio.BrokenResourceError):
        await server.receive()
    with pytest.raises(anyio.BrokenResourceError):
        await client.send(b"x")
    assert network.connections("a", "b") == 0
    # After a cut a new connection may be made at once; a partition refuses it.
    await network.connect("b", source="a")
    network.partition("a", "b")
    with pytest.raises(TransportError, match="unreachable"):
        await network.connect("b", source="a")
    await network.connect("b", source="c")  # others are not affected
    network.heal("a", "b")
    await network.connect("b", source="a")


async def test_half_open_loses_what_is_written_without_telling_anyone() -> None:
    clock = ManualClock()
    network = MemoryNetwork(clock)
    client, server = await accept_one(network, "b")
    network.half_open("a", "b")
    await client.send(b"into the void")  # no error: the writer cannot tell
    got: list[bytes] = []

    async def reader() -> None:
        got.append(await server.receive())

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await clock.run(3600)
        assert got == []
        network.heal("a", "b")
        await client.send(b"heard again")
        await clock.settle()
    assert got == [b"heard again"]


async def test_a_delay_holds_what_is_written_for_that_long_on_the_clock() -> None:
    clock = ManualClock()
    network = MemoryNetwork(clock)
    client, server = await accept_one(network, "b")
    network.delay("a", "b", 0.25)
    got: list[tuple[float, bytes]] = []

    async def reader() -> None:
        for _ in range(2):
            data = await server.receive()
            got.append((clock.monotonic(), data))

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        await client.send(b"one")
        clock.advance(0.1)
        await client.send(b"two")
        await clock.run(0.1)
        assert got == []
        await clock.run(1)
    assert got == [(0.25, b"one"), (0.35, b"two")]


async def test_a_writer_waits_while_the_reader_is_behind() -> None:
    network = MemoryNetwork()
    client, server = await accept_one(network, "b")
    chunk = b"x" * 600_000
    await client.send(chunk)
    await client.send(chunk)  # 1.2 MB buffered now: the next write waits
    with anyio.move_on_after(0.05) as waited:
        await client.send(chunk)
    assert waited.cancelled_caught
    received = 0
    while received < 2 * len(chunk):
        received += len(await server.receive(1 << 20))
    await client.send(chunk)  # room again
