"""Two nodes in two processes, linked over real TCP (SPEC 7, 10).

``test_wire_link.py`` links two nodes in one process on a manual clock. Here node A is
``meshbus run`` with a configuration file, and node B a small script in a second
process that opens a link to A's listener and prints what its local subscriber and its
local queue get, one JSON line each. The test publishes on A with a remote session and
reads B's output. Both nodes and the test's client run on the backend under test (A with
``--loop``). Real processes: every wait is for a printed line, within generous limits,
never a fixed sleep.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.to_thread
import orjson
import pytest

from meshbus._node import NODE_ID_FILE
from meshbus.transports import connect

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

WAIT = 30.0  # seconds any one step may take before the test gives up
LISTENING = "meshbus run: node node-a listening on "

NODE_A = """
[node]
name = "node-a"
data_dir = "spool"

[[listeners]]
port = 0

[vpns.default.client_profiles.default]
allow_bridge_connections = true

[vpns.default.queues.to-b]
subscriptions = ["ship/>"]
"""

NODE_B = '''
"""Node B: link to node A, print what arrives (one JSON line each) until stdin closes."""

import json
import sys

import anyio
import anyio.to_thread

from meshbus import LinkState, Node
from meshbus.transports import ConnectSettings, open_link


def show(kind, message):
    fields = {
        "topic": message.topic,
        "payload": message.payload.decode(),
        "sender": message.sender,
        "timestamp": message.timestamp,
        "headers": dict(message.headers),
        "reply_to": message.reply_to,
        "correlation_id": message.correlation_id,
        "origin": message.origin,
        "hop_count": message.hop_count,
        "mode": message.delivery_mode.value,
    }
    print(kind, json.dumps(fields), flush=True)


async def main(url):
    async with Node(name="node-b", node_id="node-b") as node:
        node.guaranteed.create_queue("from-a", subscriptions=["ship/>"])
        subscriber = node.connect(client_name="b-subscriber")
        subscriber.subscribe("orders/>")
        link = open_link(
            node.vpn(), "to-a", ConnectSettings(url), wants=["orders/>"], pulls=["to-b"]
        )
        await link.wait_for(LinkState.IN_SYNC)
        print("in-sync", json.dumps({"peer_node": link.peer_node}), flush=True)
        flow = await node.connect(client_name="b-consumer").bind("from-a")

        async def direct():
            while True:
                show("direct", await subscriber.receive())

        async def guaranteed():
            while True:
                message = await flow.receive()
                show("guaranteed", message)
                flow.ack(message)

        async with anyio.create_task_group() as tg:
            tg.start_soon(direct)
            tg.start_soon(guaranteed)
            await anyio.to_thread.run_sync(sys.stdin.read)  # until the test closes it
            tg.cancel_scope.cancel()
        link.stop()
    print("stopped", flush=True)


anyio.run(main, sys.argv[1], backend=sys.argv[2])
'''


class Child:
    """A child process, its standard output read line by line (as ``tests/app/test_run.py``
    reads ``meshbus run``)."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.process = subprocess.Popen(
            args,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stderr is not None
        self.stdout: queue.Queue[str | None] = queue.Queue()
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.process.stdout, self.stdout.put)),
            threading.Thread(target=self._read, args=(self.process.stderr, self._stderr)),
        ]
        for reader in self._readers:
            reader.start()

    def _stderr(self, line: str | None) -> None:
        if line is not None:
            self.stderr_lines.append(line)

    @staticmethod
    def _read(stream: IO[str], put: Callable[[str | None], object]) -> None:
        try:
            for line in stream:
                put(line.rstrip("\n"))
        except (OSError, ValueError):  # closed under us when the test gives up
            pass
        finally:
            put(None)

    def wait_for(self, prefix: str) -> str:
        """Read standard output until a line starting with ``prefix``; return the rest."""
        deadline = time.monotonic() + WAIT
        while True:
            try:
                line = self.stdout.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(
                    f"no {prefix!r} within {WAIT} s; stdout: {self.stdout_lines}, "
                    f"stderr: {self.stderr_lines}"
                ) from None
            if line is None:
                raise AssertionError(
                    f"exited ({self.process.wait(WAIT)}) before {prefix!r}: "
                    f"stdout {self.stdout_lines}, stderr {self.stderr_lines}"
                )
            self.stdout_lines.append(line)
            if line.startswith(prefix):
                return line.removeprefix(prefix)

    async def line(self, prefix: str) -> str:
        return await anyio.to_thread.run_sync(self.wait_for, prefix)

    async def message(self, kind: str) -> dict[str, Any]:
        """The next message node B printed as ``kind`` (``direct`` or ``guaranteed``)."""
        fields: dict[str, Any] = json.loads(await self.line(f"{kind} "))
        return fields

    def finish(self, signum: int | None = None) -> int:
        """Send ``signum`` (``meshbus run`` stops on SIGTERM), else close standard input
        (node B stops on that); wait and return the exit status."""
        assert self.process.stdin is not None
        if signum is None:
            self.process.stdin.close()
        else:
            self.process.send_signal(signum)
        status = self.process.wait(WAIT)
        for reader in self._readers:
            reader.join(WAIT)
        while (line := self.stdout.get_nowait()) is not None:  # what was not waited for
            self.stdout_lines.append(line)
        return status

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(WAIT)
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        for reader in self._readers:
            reader.join(WAIT)


@pytest.fixture
def children() -> Iterator[Callable[[list[str], Path], Child]]:
    """Start processes with ``children(args, cwd)``; each is killed if still running."""
    started: list[Child] = []

    def start(args: list[str], cwd: Path) -> Child:
        started.append(Child(args, cwd))
        return started[-1]

    yield start
    for child in started:
        child.close()


async def test_a_subscription_on_b_attracts_a_publish_on_a_across_processes(
    children: Callable[[list[str], Path], Child], tmp_path: Path, anyio_backend: str
) -> None:
    (tmp_path / "node-a.toml").write_text(NODE_A, encoding="utf-8")
    a = children(
        [sys.executable, "-m", "meshbus", "run", "node-a.toml", "--loop", anyio_backend],
        tmp_path,
    )
    url = await a.line(LISTENING)
    assert url.startswith("tcp://127.0.0.1:")
    a_id = orjson.loads((tmp_path / "spool" / NODE_ID_FILE).read_bytes())

    (tmp_path / "node_b.py").write_text(NODE_B, encoding="utf-8")
    b = children([sys.executable, "node_b.py", url, anyio_backend], tmp_path)
    in_sync = json.loads(await b.line("in-sync "))
    assert in_sync == {"peer_node": a_id}

    async with connect(url, client_name="pub", timestamps=True, reconnect=False) as session:
        session.publish("invoices/1", b"not wanted by B")
        session.publish(
            "orders/1",
            b"one",
            headers={"k": "v", "n": [1, 2]},
            reply_to="replies/pub",
            correlation_id="c1",
        )
        await session.confirm()
        await session.send("ship/1", b"box", correlation_id="g1", headers={"w": 3})

        direct = await b.message("direct")
        assert (direct["topic"], direct["payload"], direct["sender"]) == ("orders/1", "one", "pub")
        assert direct["headers"] == {"k": "v", "n": [1, 2]}
        assert (direct["reply_to"], direct["correlation_id"]) == ("replies/pub", "c1")
        assert isinstance(direct["timestamp"], float)  # stamped on A, kept across
        assert abs(direct["timestamp"] - time.time()) < WAIT
        assert direct["mode"] == "direct"
        origin, number = direct["origin"]
        assert origin == a_id  # where it entered the mesh: A, not B
        assert isinstance(number, int)
        assert direct["hop_count"] == 0

        guaranteed = await b.message("guaranteed")
        assert (guaranteed["topic"], guaranteed["payload"]) == ("ship/1", "box")
        assert (guaranteed["sender"], guaranteed["correlation_id"]) == ("pub", "g1")
        assert guaranteed["headers"] == {"w": 3}
        assert guaranteed["mode"] == "persistent"
        assert guaranteed["origin"][0] == a_id
        assert guaranteed["origin"] != direct["origin"]

    assert b.finish() == 0, b.stderr_lines
    # Only what B wanted crossed: no invoice, and each message once.
    kinds = [line.split(" ", 1)[0] for line in b.stdout_lines]
    assert kinds == ["in-sync", "direct", "guaranteed", "stopped"], b.stdout_lines
    assert a.finish(signal.SIGTERM) == 0, a.stderr_lines
    for child in (a, b):
        assert not [line for line in child.stderr_lines if "Traceback" in line or " ERROR " in line]
