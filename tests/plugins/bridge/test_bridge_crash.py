"""kill -9 under guaranteed bridge load loses no acknowledged message (SPEC 7, issue 15).

Two ``meshbus run`` processes, each with a data directory: node A holds queue ``Q``
(``g/>``), node B holds queue ``L`` (``g/>``) and a bridge from the configuration file
that binds a flow to ``Q``. This test publishes numbered guaranteed messages to A
without pause (``send_many``, a new connection after each failure) and records every
number whose send was acknowledged. Five times, at a random moment, it kills one of
the nodes with SIGKILL (A and B in turn) and starts it again on the same data
directory and port, while the publishing and the bridge go on. It runs once with the
nodes on asyncio and once with them on trio: ten kills in all. Then it drains ``L`` on B: every
acknowledged number must arrive (a copy more is allowed: B may have spooled a message
whose ack to A the kill cut short).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import anyio
import pytest

from tests.kill9 import Nodes, drain_numbers, publish_numbered
from tests.processes import free_port

TRIALS = 5  # per event loop
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


async def test_kill_9_of_either_node_loses_no_acknowledged_message(
    tmp_path: Path, anyio_backend: str
) -> None:
    rng = random.Random(15 if anyio_backend == "asyncio" else 16)
    nodes = Nodes(tmp_path, {"a": free_port(), "b": free_port()}, loop=anyio_backend)
    (tmp_path / "a.toml").write_text(NODE_A.format(port=nodes.ports["a"]), encoding="utf-8")
    text = NODE_B.format(port=nodes.ports["b"], a_port=nodes.ports["a"])
    (tmp_path / "b.toml").write_text(text, encoding="utf-8")
    try:
        await nodes.start("a")
        await nodes.start("b")
        acked: set[int] = set()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(publish_numbered, nodes.url("a"), acked, stop)
            for trial in range(TRIALS):
                await anyio.sleep(rng.uniform(0.3, 1.2))
                victim = "ab"[trial % 2]
                await nodes.kill(victim)
                await nodes.start(victim)
            await anyio.sleep(0.5)
            stop.set()
        assert len(acked) > 50 * TRIALS  # the publishing went on between the kills

        received = await drain_numbers(nodes.url("b"), "L", acked)
        lost = sorted(acked - received)
        assert not lost, f"{len(lost)} acknowledged messages lost, e.g. {lost[:10]}"
    finally:
        nodes.close()
