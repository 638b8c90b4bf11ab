"""Nothing a client sends makes a node hold more memory than its limits say (SPEC 10).

A ``meshbus run`` node in its own process, configured with small limits, is fed each
class of input a client controls, one after the other: frames before login, message
headers and payloads for a subscriber that never reads, and subscriptions. While
each attack holds what it took, the node's resident memory (``VmRSS`` in
``/proc/PID/status``) may grow by no more than the bound its limits give for that
class (the bounds are worked out next to the limits below). Meanwhile a healthy
publisher and subscriber on the same node exchange messages, and the subscriber must
get every one, in order, without a discard.

The sizes are scaled down from the issue's probe (32 MiB frames, 2,000 messages) so
the test takes a few seconds; the bounds scale with them. One event loop suffices
here: the node under test runs in its own process, whatever the test's backend.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from meshbus import LimitExceededError, Message
from meshbus.transports import ConnectionState, FrameKind, LinkProtocol, Role, connect
from meshbus.transports._connection import READ_SIZE
from meshbus.transports._framing import HEADER_LIMIT, encode_frame

from .test_e2e import Process

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads resident memory from /proc (Linux)"
)

K = FrameKind
KiB = 1024
MiB = 1024 * KiB
FRAME = 8 * MiB  # max_frame_size: the largest frame after login
LOGIN = 64 * KiB  # login_frame_size
UNAUTHENTICATED = 16  # max_unauthenticated
EGRESS = 4 * MiB  # egress_max_bytes of every session
SUBSCRIPTIONS = 400  # max_subscriptions of every session
SUBSCRIPTION_COST = 40 * KiB  # a 250-byte, 125-level filter holds ~33 KiB of the index
PARSED = 24  # JSON parsed by orjson takes at most 24 times its length (empty objects)
SLACK = 16 * MiB  # the allocator, the event loop, buffers freed but kept by the process
BOUNDS = {
    # Each connection logging in holds at most one small frame and one read.
    "frames before login": UNAUTHENTICATED * (LOGIN + READ_SIZE) + SLACK,
    # A stalled subscriber holds its egress; the node also holds one frame it is
    # reading, and the headers of that frame while it publishes them.
    "headers": EGRESS + FRAME + PARSED * HEADER_LIMIT + SLACK,
    "payloads": EGRESS + 2 * FRAME + SLACK,
    "subscriptions": SUBSCRIPTIONS * SUBSCRIPTION_COST + SLACK,
}
PREFIX = struct.Struct("!IBI")
LISTENING = "meshbus run: node memory listening on "
CONFIG = f"""
[node]
name = "memory"
data_dir = "spool"

[[listeners]]
port = 0
max_frame_size = {FRAME}
login_frame_size = {LOGIN}
max_unauthenticated = {UNAUTHENTICATED}
handshake_timeout = 60

[vpns.default.client_profiles.default]
egress_max_bytes = {EGRESS}
max_subscriptions = {SUBSCRIPTIONS}
"""


def resident(pid: int) -> int:
    """Bytes of memory the process ``pid`` has resident now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * KiB
    raise AssertionError(f"no VmRSS for process {pid}")


@pytest.mark.parametrize("phase", ["frames before login", "headers", "payloads", "subscriptions"])
def test_a_node_holds_no_more_memory_than_its_limits_say(phase: str, tmp_path: Path) -> None:
    # A node of its own for each class of input: memory one phase freed and the process
    # kept would hide what the next one takes.
    (tmp_path / "node.toml").write_text(CONFIG, encoding="utf-8")
    node = Process(["run", "node.toml"], tmp_path, dict(os.environ))
    try:
        url = node.wait_for("stdout", LISTENING).removeprefix(LISTENING)
        grew, sent, received = anyio.run(attack, url, node.popen.pid, PHASES[phase])
    finally:
        node.close()
    assert grew <= BOUNDS[phase], f"{phase}: the node grew by {grew} bytes, over {BOUNDS[phase]}"
    assert sent > 20
    assert [m.payload for m in received] == [b"%d" % i for i in range(sent)]
    assert not any(m.discard_indication for m in received)


Phase = Callable[[str, tuple[str, int], int], Awaitable[int]]


async def attack(url: str, pid: int, phase: Phase) -> tuple[int, int, list[Message]]:
    """Run ``phase`` beside a healthy pair: how much the node grew, what the healthy
    publisher sent and what its subscriber received."""
    host, port = url.removeprefix("tcp://").rsplit(":", 1)
    async with (
        connect(url, client_name="healthy-sub") as subscriber,
        connect(url, client_name="healthy-pub") as publisher,
    ):
        subscriber.subscribe("healthy/>")
        await subscriber.confirm()
        received: list[Message] = []
        done = anyio.Event()
        sent = 0

        async def keep_publishing() -> None:
            nonlocal sent
            while not done.is_set():
                publisher.publish("healthy/seq", b"%d" % sent)
                sent += 1
                await anyio.sleep(0.01)

        async def keep_receiving() -> None:
            async for message in subscriber:
                received.append(message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(keep_publishing)
            tg.start_soon(keep_receiving)
            await anyio.sleep(0.5)  # warm: the healthy pair's paths have all run
            before = resident(pid)
            grew = await phase(url, (host, int(port)), pid) - before
            done.set()
            await publisher.confirm()
            with anyio.fail_after(10):
                while len(received) < sent:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    return grew, sent, received


# --- the phases: each returns the node's resident memory while it holds the most ----------


async def frames_before_login(url: str, address: tuple[str, int], pid: int) -> int:
    """Connections that never log in: as many as may log in at once send most of a login
    frame and wait; more send most of a frame as large as logged-in sessions may."""
    streams: list[anyio.abc.SocketStream] = []
    try:
        for n in range(UNAUTHENTICATED + 24):
            stream = await anyio.connect_tcp(*address)
            streams.append(stream)
            size = LOGIN - 100 if n < UNAUTHENTICATED else 6 * MiB
            try:
                with anyio.fail_after(10):
                    await stream.send(PREFIX.pack(size, K.HELLO, 50) + bytes(size - 1000))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                pass  # the node closed it: what we hoped for
        await anyio.sleep(1)  # the node has read what it would
        return resident(pid)
    finally:
        for stream in streams:
            await stream.aclose()


async def stalled_subscriber(address: tuple[str, int], subscription: str) -> anyio.abc.SocketStream:
    """A logged-in connection subscribed to ``subscription`` that then reads nothing."""
    protocol = LinkProtocol(Role.CLIENT, max_frame_size=2 * FRAME)
    stream = await anyio.connect_tcp(*address)
    protocol.hello({"client_name": "stalled-" + subscription.split("/")[1]})
    await stream.send(protocol.data_to_send())
    with anyio.fail_after(10):
        while protocol.state is ConnectionState.HANDSHAKE:
            protocol.receive_data(await stream.receive())
        await stream.send(encode_frame(K.SUBSCRIBE, {"id": 1, "subscription": subscription}))
        answers: list[Any] = []
        while not any(kind == K.OK for kind, _, _ in answers):
            answers += protocol.receive_data(await stream.receive())
    return stream


async def flood(url: str, publish: Any, count: int) -> None:
    async with connect(url, client_name="flooder") as flooder:
        for i in range(count):
            publish(flooder, i)
            if i % 10 == 9:
                await flooder.flush()
        await flooder.confirm()


async def headers(url: str, address: tuple[str, int], pid: int) -> int:
    """Messages with the costliest headers a session may publish (60 KB of empty objects,
    1.4 MB once parsed), for a subscriber that never reads."""
    costly = {"k": [{} for _ in range(20_000)]}
    stalled = await stalled_subscriber(address, "sink/headers/>")
    try:
        await flood(url, lambda s, i: s.publish(f"sink/headers/{i}", b"", headers=costly), 150)
        await anyio.sleep(0.5)
        return resident(pid)
    finally:
        await stalled.aclose()


async def payloads(url: str, address: tuple[str, int], pid: int) -> int:
    """Large payloads for a subscriber that never reads."""
    stalled = await stalled_subscriber(address, "sink/payloads/>")
    try:
        await flood(url, lambda s, i: s.publish(f"sink/payloads/{i}", bytes(MiB)), 60)
        await anyio.sleep(0.5)
        return resident(pid)
    finally:
        await stalled.aclose()


async def subscriptions(url: str, address: tuple[str, int], pid: int) -> int:
    """As many of the costliest subscriptions as a session may hold, and more."""
    deep = "/".join(["a"] * 120 + ["*"])
    async with connect(url, client_name="subscriber") as session:
        refused = 0
        for i in range(SUBSCRIPTIONS + 200):
            session.subscribe(f"x{i}/{deep}")
            if i % 50 == 49:
                try:
                    await session.confirm()
                except LimitExceededError:
                    refused += 1
        assert refused > 0  # the limit was reached
        return resident(pid)


PHASES = {
    "frames before login": frames_before_login,
    "headers": headers,
    "payloads": payloads,
    "subscriptions": subscriptions,
}
