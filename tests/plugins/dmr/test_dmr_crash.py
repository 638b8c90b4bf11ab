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
import sys
from pathlib import Path

import anyio
import pytest

from meshbus.transports import RemoteSession, connect
from tests.kill9 import Nodes, drain_numbers, publish_numbered
from tests.processes import free_port

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


def write_configs(folder: Path, ports: dict[str, int]) -> None:
    for name in NAMES:
        peers = ", ".join(f'{o} = "tcp://127.0.0.1:{ports[o]}"' for o in NAMES if o != name)
        queues = '[vpns.default.queues.orders]\nsubscriptions = ["g/>"]'
        text = NODE.format(
            name=name, port=ports[name], peers=peers, queues=queues if name == "n3" else ""
        )
        (folder / f"{name}.toml").write_text(text, encoding="utf-8")


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
    cluster = Nodes(tmp_path, {name: free_port() for name in NAMES})
    write_configs(tmp_path, cluster.ports)
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
            tg.start_soon(publish_numbered, cluster.url("n1"), acked, stop, 0.01)
            for trial in range(TRIALS):
                await anyio.sleep(rng.uniform(0.3, 1.2))
                victim = ("n1", "n3", "n2")[trial % 3]
                await cluster.kill(victim)
                await cluster.start(victim)
            await anyio.sleep(0.5)
            stop.set()
        assert len(acked) > 50 * TRIALS  # the publishing went on between the kills

        received = await drain_numbers(cluster.url("n3"), "orders", acked)
        lost = sorted(acked - received)
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged messages lost: {ranges(lost)}"
    finally:
        cluster.close()
