"""What the kill -9 tests under guaranteed load share: ``meshbus run`` nodes started
(again) by name from their files, killed with SIGKILL, and a publisher that sends
numbered guaranteed messages without pause, recording each acknowledged number."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import anyio.to_thread

from meshbus import MeshbusError
from meshbus.transports import connect

from .processes import Child


class Nodes:
    """``meshbus run NAME.toml`` processes in ``folder``, each started, killed with
    SIGKILL and started again by name on its data directory and port."""

    def __init__(self, folder: Path, ports: dict[str, int], loop: str | None = None) -> None:
        self.folder = folder
        self.ports = ports
        self.loop = loop  # the event loop the nodes run on (``--loop``), or their default
        self.children: dict[str, Child] = {}

    def url(self, name: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[name]}"

    async def start(self, name: str) -> None:
        args = [sys.executable, "-m", "meshbus", "run", f"{name}.toml"]
        if self.loop is not None:
            args += ["--loop", self.loop]
        child = self.children[name] = Child(args, self.folder)
        await anyio.to_thread.run_sync(child.wait_for, "meshbus run: node ")

    async def kill(self, name: str) -> None:
        child = self.children.pop(name)
        child.process.send_signal(signal.SIGKILL)
        await anyio.to_thread.run_sync(child.close)

    def close(self) -> None:
        for child in self.children.values():
            child.close()


async def publish_numbered(
    url: str, acked: set[int], stop: anyio.Event, pause: float = 0.0
) -> None:
    """Send numbered messages to ``g/<number>`` in batches of 50 until ``stop``, a new
    connection after each failure; add each acknowledged number to ``acked``."""
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
                    if pause:
                        await anyio.sleep(pause)
        except (MeshbusError, OSError):
            await anyio.sleep(0.05)  # the node is down: again once it is back


async def drain_numbers(url: str, queue: str, acked: set[int], timeout: float = 120) -> set[int]:
    """Bind ``queue`` at ``url`` and take (acknowledging) messages until every number of
    ``acked`` came or ``timeout`` s passed; the numbers that came."""
    received: set[int] = set()
    async with connect(url, reconnect=False) as session:
        flow = await session.bind(queue)
        with anyio.move_on_after(timeout):
            while not acked <= received:
                message = await flow.receive()
                received.add(int(message.payload))
                flow.ack(message)
    return received
