"""The asyncio TCP stream that keeps reading on: order, splitting, flow control both
ways, and the errors anyio's own stream gives (end of stream, broken, closed)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest

from meshbus.transports._asyncio_tcp import READ_HIGH_WATER, AsyncioTcpStream, adopt_tcp_stream

pytestmark = pytest.mark.parametrize("anyio_backend", ["asyncio"])


@pytest.fixture
async def pair() -> AsyncIterator[tuple[AsyncioTcpStream, AsyncioTcpStream]]:
    """Two adopted ends of one loopback TCP connection."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener:
        client = adopt_tcp_stream(await anyio.connect_tcp("127.0.0.1", port))
        server = adopt_tcp_stream(await listener.listeners[0].accept())
        assert isinstance(client, AsyncioTcpStream)
        assert isinstance(server, AsyncioTcpStream)
        try:
            yield client, server
        finally:
            await client.aclose()
            await server.aclose()


def block(n: int) -> bytes:
    return hashlib.sha256(b"%d" % n).digest() * 2048  # 64 KiB, different per n


async def read_exactly(stream: AsyncioTcpStream, size: int) -> bytes:
    data = bytearray()
    with anyio.fail_after(10):
        while len(data) < size:
            data += await stream.receive(size - len(data))
    return bytes(data)


async def test_bytes_arrive_in_order_and_reads_honour_max_bytes(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    client, server = pair
    await client.send(b"hello world")
    with anyio.fail_after(5):
        assert await server.receive(5) == b"hello"
        assert await server.receive(100) == b" world"
    payload = b"".join(block(n) for n in range(8))
    await client.send(payload)
    assert await read_exactly(server, len(payload)) == payload


async def test_a_reader_that_does_not_read_stops_the_transport_reading(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    """Memory stays bounded: past the high-water mark the transport stops reading and
    TCP pushes back on the sender; reading again resumes it, nothing lost."""
    client, server = pair
    total = 320  # 20 MiB: more than the high-water mark plus the kernel's buffers take
    sent = 0

    async def send_all() -> None:
        nonlocal sent
        for n in range(total):
            await client.send(block(n))
            sent += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(send_all)
        with anyio.fail_after(10):
            while not server._protocol.reading_paused:
                await anyio.sleep(0.01)
        await anyio.sleep(0.1)
        assert server._protocol.buffered <= READ_HIGH_WATER + 256 * 1024
        assert sent < total  # the sender waits: TCP pushed back
        received = await read_exactly(server, total * len(block(0)))
    assert received == b"".join(block(n) for n in range(total))
    assert not server._protocol.reading_paused


async def test_end_of_stream_after_the_data(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    client, server = pair
    await client.send(b"last words")
    await client.send_eof()
    assert await read_exactly(server, 10) == b"last words"
    with anyio.fail_after(5), pytest.raises(anyio.EndOfStream):
        await server.receive()
    await server.send(b"still writable")  # half-closed: the other way still works
    assert await read_exactly(client, 14) == b"still writable"


async def test_a_peer_that_goes_away_breaks_the_stream(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    client, server = pair
    await client.aclose()  # an abort: no orderly end of stream
    with anyio.fail_after(5), pytest.raises((anyio.BrokenResourceError, anyio.EndOfStream)):
        await server.receive()

    async def write_until_it_fails() -> None:
        for _ in range(100):  # the failure may surface on a later write
            await server.send(b"x" * 65536)

    with anyio.fail_after(5), pytest.raises(anyio.BrokenResourceError):
        await write_until_it_fails()
    assert not server.writable_now()


async def test_a_closed_stream_refuses_reads_and_writes(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    _, server = pair

    async def close_soon() -> None:
        await anyio.sleep(0.05)
        await server.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(close_soon)
        with anyio.fail_after(5), pytest.raises(anyio.ClosedResourceError):
            await server.receive()  # woken by the close
    with pytest.raises(anyio.ClosedResourceError):
        await server.send(b"x")
    assert not server.writable_now()


async def test_data_anyio_had_already_received_is_kept(anyio_backend: str) -> None:
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    async with listener:
        client = await anyio.connect_tcp("127.0.0.1", port)
        accepted = await listener.listeners[0].accept()
        await client.send(b"early bytes")
        await anyio.sleep(0.1)  # anyio's protocol takes them before the adoption
        server = adopt_tcp_stream(accepted)
        assert isinstance(server, AsyncioTcpStream)
        try:
            assert await read_exactly(server, 11) == b"early bytes"
        finally:
            await client.aclose()
            await server.aclose()


# --- handing what arrives to a receiver (reads in the transport's callback) -------------------


async def wait_for_bytes(got: list[bytes], size: int) -> bytes:
    with anyio.fail_after(10):
        while sum(map(len, got)) < size:
            await anyio.sleep(0.001)
    return b"".join(got)


async def test_a_receiver_gets_what_was_queued_first_then_what_arrives(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    client, server = pair
    await client.send(b"queued ")
    with anyio.fail_after(5):
        while not server._protocol.chunks:
            await anyio.sleep(0.001)
    got: list[bytes] = []
    server.set_receiver(got.append)
    assert got == [b"queued "]  # handed over at once, not left behind newer bytes
    await client.send(b"then more")
    assert await wait_for_bytes(got, 16) == b"queued then more"
    server.set_receiver(None)  # back to reads: nothing goes to the receiver any more
    await client.send(b"read")
    assert await read_exactly(server, 4) == b"read"
    assert b"".join(got) == b"queued then more"


async def test_a_receiver_set_while_reading_was_paused_resumes_it(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    client, server = pair
    total = 320  # more than the high-water mark plus the kernel's buffers take
    got: list[bytes] = []

    async def send_all() -> None:
        for n in range(total):
            await client.send(block(n))

    async with anyio.create_task_group() as tg:
        tg.start_soon(send_all)
        with anyio.fail_after(10):
            while not server._protocol.reading_paused:
                await anyio.sleep(0.01)
        server.set_receiver(got.append)
        assert not server._protocol.reading_paused
        received = await wait_for_bytes(got, total * len(block(0)))
    assert received == b"".join(block(n) for n in range(total))


async def test_waiting_on_a_receiver_ends_when_it_is_taken_away(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    client, server = pair

    def take_away_on_stop(data: bytes) -> None:
        if data.endswith(b"stop"):
            server.set_receiver(None)

    server.set_receiver(take_away_on_stop)
    await client.send(b"go on")
    await client.send(b"stop")
    with anyio.fail_after(5):
        await server.wait_receiver()  # returns: taken away, the stream still open
    await client.send(b"!")
    assert await read_exactly(server, 1) == b"!"


async def test_waiting_on_a_receiver_raises_when_the_stream_ends(
    pair: tuple[AsyncioTcpStream, AsyncioTcpStream],
) -> None:
    client, server = pair
    got: list[bytes] = []
    server.set_receiver(got.append)
    await client.send(b"last words")
    await client.send_eof()
    with anyio.fail_after(5), pytest.raises(anyio.EndOfStream):
        await server.wait_receiver()
    assert b"".join(got) == b"last words"  # everything before the end was handed over
