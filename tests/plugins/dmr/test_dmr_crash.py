"""kill -9 under guaranteed load across a cluster loses no acknowledged message (SPEC 8).

Three ``meshbus run`` processes of one cluster, each with a data directory; queue
``orders`` (``g/>``) is on ``n3``. This test publishes numbered guaranteed messages to
``n1`` without pause (``send_many``, a new connection after each failure) and records
every number whose send was acknowledged: ``n1`` holds each in its waiting queue for
``n3`` until ``n3`` has spooled it. At random moments it kills the publisher's node,
the consumer's node or the third one with SIGKILL, in turn, and starts it again on the
same data directory and port, while the publishing goes on. Then it drains ``orders``
on ``n3``: every acknowledged number must arrive (a copy more is allowed: ``n3`` may
have spooled a message whose acknowledgement to ``n1`` the kill cut short).
``CRASH_SEED`` (an environment variable) picks other moments.
"""

from __future__ import annotations

import os
import random
import signal
import sys
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from meshbus import MeshbusError
from meshbus.transports import RemoteSession, connect
from tests.processes import Child, free_port

TRIALS = 6
NAMES = ("n1", "n2", "n3")
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.platform == "win32", reason="no SIGKILL on Windows"),
]

NODE = """
[node]
name = "{name}"
cluster = "c1"
data_dir = "data-{name}"

[[listeners]]
host = "127.0.0.1"
port = {port}

[vpns.default.client_profiles.default]
allow_bridge_connections = true

{queues}

[dmr]
peers = {{ {peers} }}
backoff = {{ initial = 0.1, maximum = 0.5 }}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the nodes run in processes of their own: one loop is enough here


class Cluster:
    """The three node processes, started (again) from their files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = {name: free_port() for name in NAMES}
        for name in NAMES:
            peers = ", ".join(f'{o} = "{self.url(o)}"' for o in NAMES if o != name)
            queues = '[vpns.default.queues.orders]\nsubscriptions = ["g/>"]'
            text = NODE.format(
                name=name,
                port=self.ports[name],
                peers=peers,
                queues=queues if name == "n3" else "",
            )
            (folder / f"{name}.toml").write_text(text, encoding="utf-8")
        self.children: dict[str, Child] = {}

    def url(self, name: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[name]}"

    async def start(self, name: str) -> None:
        args = [sys.executable, "-m", "meshbus", "run", f"{name}.toml"]
        child = self.children[name] = Child(args, self.folder)
        await anyio.to_thread.run_sync(child.wait_for, "meshbus run: node ")

    async def kill(self, name: str) -> None:
        child = self.children.pop(name)
        child.process.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(child.close)

    def close(self) -> None:
        for child in self.children.values():
            child.close()


async def publish(url: str, acked: set[int], stop: anyio.Event) -> None:
    """Send numbered messages until ``stop``; add each acknowledged number to ``acked``."""
    next_number = 0
    while not stop.is_set():
        try:
            async with connect(url, reconnect=False, connect_timeout=2.0) as session:
                while not stop.is_set():
                    numbers = range(next_number, next_number + 50)
                    next_number += 50
                    results = await session.send_many((f"g/{n}", b"%d" % n) for n in numbers)
                    done = zip(numbers, results, strict=True)
                    acked.update(n for n, result in done if result is None)
                    await anyio.sleep(0.01)  # a steady stream, not a flood the drain waits on
        except (MeshbusError, OSError):
            await anyio.sleep(0.05)  # the node is down: again once it is back


async def interest(session: RemoteSession, neighbour: str) -> dict[str, int]:
    """What ``session``'s node knows of ``neighbour``'s interest, by kind."""
    figures = (await session.node_statistics())["plugins"]["default"]["dmr"]
    return figures["neighbours"].get(neighbour, {}).get("interest", {})  # type: ignore[no-any-return]


def ranges(numbers: list[int]) -> str:
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in spans[:20])


async def test_kill_9_of_any_cluster_node_loses_no_acknowledged_message(tmp_path: Path) -> None:
    rng = random.Random(int(os.environ.get("CRASH_SEED", "16")))
    cluster = Cluster(tmp_path)
    try:
        for name in NAMES:
            await cluster.start(name)
        # A message published before n1 has heard of the queue on n3 has nowhere to go
        # (acknowledged and discarded, SPEC 4): publish once n1 knows of it.
        async with connect(cluster.url("n1"), reconnect=False) as watch:
            with anyio.fail_after(30):
                while not (await interest(watch, "n3")).get("g"):
                    await anyio.sleep(0.05)
        acked: set[int] = set()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(publish, cluster.url("n1"), acked, stop)
            for trial in range(TRIALS):
                await anyio.sleep(rng.uniform(0.3, 1.2))
                victim = ("n1", "n3", "n2")[trial % 3]
                await cluster.kill(victim)
                await cluster.start(victim)
            await anyio.sleep(0.5)
            stop.set()
        assert len(acked) > 50 * TRIALS  # the publishing went on between the kills

        received: dict[int, int] = {}
        async with connect(cluster.url("n3"), reconnect=False) as session:
            flow = await session.bind("orders")
            with anyio.move_on_after(120):
                while not acked <= received.keys():
                    message = await flow.receive()
                    number = int(message.payload)
                    received[number] = received.get(number, 0) + 1
                    flow.ack(message)
        lost = sorted(acked - received.keys())
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost: {ranges(lost)}"
    finally:
        cluster.close()
