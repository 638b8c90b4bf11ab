"""kill -9 under guaranteed bridge load loses no acknowledged message (SPEC 7, issue 15).

Two ``meshbus run`` processes, each with a data directory: node A holds queue ``Q``
(``g/>``), node B holds queue ``L`` (``g/>``) and a bridge from the configuration file
that binds a flow to ``Q``. This test publishes numbered guaranteed messages to A
without pause (``send_many``, a new connection after each failure) and records every
number whose send was acknowledged. Ten times, at a random moment, it kills one of the
nodes with SIGKILL (A and B in turn) and starts it again on the same data directory
and port, while the publishing and the bridge go on. Then it drains ``L`` on B: every
acknowledged number must arrive (a copy more is allowed: B may have spooled a message
whose ack to A the kill cut short).
"""

from __future__ import annotations

import random
import signal
import sys
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from meshbus import MeshbusError
from meshbus.transports import connect
from tests.processes import Child, free_port

TRIALS = 10
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.platform == "win32", reason="no SIGKILL on Windows"),
]

NODE_A = """
[node]
name = "crash-a"
data_dir = "data-a"

[[listeners]]
host = "127.0.0.1"
port = {port}

[vpns.default.client_profiles.default]
allow_bridge_connections = true

[vpns.default.queues.Q]
subscriptions = ["g/>"]
"""

NODE_B = """
[node]
name = "crash-b"
data_dir = "data-b"

[[listeners]]
host = "127.0.0.1"
port = {port}

[vpns.default.queues.L]
subscriptions = ["g/>"]

[[vpns.default.bridges]]
name = "from-a"
remotes = ["tcp://127.0.0.1:{a_port}"]
queues = ["Q"]
backoff = {{ initial = 0.1, maximum = 0.5 }}
"""


class Nodes:
    """The two node processes, started (again) from their files in ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = {"a": free_port(), "b": free_port()}
        (folder / "a.toml").write_text(NODE_A.format(port=self.ports["a"]), encoding="utf-8")
        text = NODE_B.format(port=self.ports["b"], a_port=self.ports["a"])
        (folder / "b.toml").write_text(text, encoding="utf-8")
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
        except (MeshbusError, OSError):
            await anyio.sleep(0.05)  # the node is down: again once it is back


async def test_kill_9_of_either_node_loses_no_acknowledged_message(tmp_path: Path) -> None:
    rng = random.Random(15)
    nodes = Nodes(tmp_path)
    try:
        await nodes.start("a")
        await nodes.start("b")
        acked: set[int] = set()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(publish, nodes.url("a"), acked, stop)
            for trial in range(TRIALS):
                await anyio.sleep(rng.uniform(0.3, 1.2))
                victim = "ab"[trial % 2]
                await nodes.kill(victim)
                await nodes.start(victim)
            await anyio.sleep(0.5)
            stop.set()
        assert len(acked) > 50 * TRIALS  # the publishing went on between the kills

        received: dict[int, int] = {}
        async with connect(nodes.url("b"), reconnect=False) as session:
            flow = await session.bind("L")
            with anyio.move_on_after(120):
                while not acked <= received.keys():
                    message = await flow.receive()
                    number = int(message.payload)
                    received[number] = received.get(number, 0) + 1
                    flow.ack(message)
        lost = sorted(acked - received.keys())
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:10]}"
    finally:
        nodes.close()
