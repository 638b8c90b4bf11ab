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
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import orjson
import pytest

from meshbus._node import NODE_ID_FILE
from meshbus.transports import connect
from tests.processes import WAIT, Child

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

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


class NodeProcess(Child):
    """A node in a process of its own, whose output the test reads line by line."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        super().__init__(args, cwd, stdin=True)  # node B stops when its stdin closes

    def rest(self, prefix: str) -> str:
        """Read until a line starting with ``prefix``; return the rest of it."""
        (line,) = self.wait_for(prefix)
        return line.removeprefix(prefix)

    async def line(self, prefix: str) -> str:
        return await anyio.to_thread.run_sync(self.rest, prefix)

    async def message(self, kind: str) -> dict[str, Any]:
        """The next message node B printed as ``kind`` (``direct`` or ``guaranteed``)."""
        fields: dict[str, Any] = json.loads(await self.line(f"{kind} "))
        return fields


@pytest.fixture
def children() -> Iterator[Callable[[list[str], Path], NodeProcess]]:
    """Start processes with ``children(args, cwd)``; each is killed if still running."""
    started: list[NodeProcess] = []

    def start(args: list[str], cwd: Path) -> NodeProcess:
        started.append(NodeProcess(args, cwd))
        return started[-1]

    yield start
    for child in started:
        child.close()


async def test_a_subscription_on_b_attracts_a_publish_on_a_across_processes(
    children: Callable[[list[str], Path], NodeProcess], tmp_path: Path, anyio_backend: str
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
        assert direct["hop_count"] == 1  # it crossed one bridge (plugin hopcount)

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
