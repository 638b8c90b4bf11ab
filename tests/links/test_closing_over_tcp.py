"""A node that stops while its link's socket is full, over real TCP: the link writes
what it had taken before the connection closes (the in-memory network's tests of this
are in test_wire_link.py). On trio a write cut short leaves part of a frame behind, so
this is where a cut would show."""

from __future__ import annotations

import anyio
import anyio.abc
import pytest

from meshbus import LinkState, Node
from meshbus.plugins.bridge import BridgeSettings, open_bridge
from meshbus.transports import ListenerSettings, start_server
from meshbus.transports.testing import allow_bridges

pytestmark = pytest.mark.anyio

RATE = 10_000_000  # bytes a second the proxy passes towards the bridge's node


async def slow_proxy(target: int, *, task_status: anyio.abc.TaskStatus[int]) -> None:
    """Listen on a free port and pass connections on to port ``target``, slowly on the
    way back: the far node's socket fills up, as it would on a slow network."""
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    task_status.started(listener.extra(anyio.abc.SocketAttribute.local_port))

    async def handle(client: anyio.abc.SocketStream) -> None:
        try:
            server = await anyio.connect_tcp("127.0.0.1", target)
        except OSError:  # the far node has stopped
            await client.aclose()
            return

        async def upstream() -> None:
            async for chunk in client:
                await server.send(chunk)

        async with client, server, anyio.create_task_group() as tg:
            tg.start_soon(upstream)
            try:
                while True:
                    chunk = await server.receive(4096)
                    await client.send(chunk)
                    await anyio.sleep(len(chunk) / RATE)
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
            tg.cancel_scope.cancel()

    async with listener:
        await listener.serve(handle)  # type: ignore[arg-type]


async def test_a_node_stopping_behind_a_slow_network_first_writes_what_its_link_took() -> None:
    # 12 MB at 10 MB/s: the far node stops with most of it still to write. Before, the
    # stop cut the connection at once: nothing arrived, all counted as forwarded.
    count = 1200
    received: list[int] = []
    async with anyio.create_task_group() as outer, Node(node_id="near") as near:
        everything = near.connect(client_name="reader")
        everything.subscribe("a/>")
        async with Node(node_id="far") as far:
            allow_bridges(far.vpn())
            server = await start_server(far, ListenerSettings(port=0))
            port = await outer.start(slow_proxy, server.port)
            bridge = open_bridge(
                near.vpn(),
                BridgeSettings(
                    "to-far", remotes=[f"tcp://127.0.0.1:{port}"], subscriptions=["a/>"]
                ),
            )
            with anyio.fail_after(10):
                await bridge.wait_for(LinkState.IN_SYNC)
                while not len(far.vpn().links) or not far.vpn().links.index.match("a/x"):
                    await anyio.sleep(0.01)
            (sending,) = far.vpn().links
            publisher = far.connect(client_name="publisher")
            for i in range(count):
                publisher.publish("a/x", b"%d " % i + bytes(10_000))
            await anyio.sleep(0.1)  # the link is writing, its socket full
        with anyio.fail_after(10):
            while len(received) < count:
                received.append(int((await everything.receive()).payload.split()[0]))
        outer.cancel_scope.cancel()
    assert received == list(range(count))
    statistics = sending.statistics()
    assert (statistics.forwarded, statistics.forward_failures) == (count, 0)
    assert bridge.link.error is None  # it ended on the peer's CLOSE, not a broken frame
