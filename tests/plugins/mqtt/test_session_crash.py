"""A ``meshbus run`` node killed with SIGKILL and started again on its data directory
still has its persistent MQTT sessions: paho-mqtt devices, one away and one connected
at the kill, get every QoS 1 message the node acknowledged for them."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.processes import Child, free_port

from ._clients import V5, V311, Paho

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform == "win32", reason="no SIGKILL on Windows"),
]

CONFIG = """
[node]
name = "edge"
data_dir = "data"

[[mqtt.listeners]]
host = "127.0.0.1"
port = {port}
"""


#: Each protocol level on one event loop, the nodes on that loop too: both levels and
#: both loops are covered without running every scenario four times.
PAIRED = pytest.mark.parametrize(
    ("anyio_backend", "protocol"),
    [("asyncio", V311), ("trio", V5)],
    ids=["asyncio-3.1.1", "trio-5"],
)


@contextmanager
def meshbus_run(tmp_path: Path, loop: str) -> Iterator[Child]:
    """A node on the event loop the test runs on."""
    args = [sys.executable, "-m", "meshbus", "run", "edge.toml", "--loop", loop]
    child = Child(args, tmp_path)
    try:
        child.wait_for("meshbus run: node edge listening")
        yield child
    finally:
        child.close()


@PAIRED
async def test_persistent_sessions_survive_a_kill_9(
    tmp_path: Path, anyio_backend: str, protocol: int
) -> None:
    port = free_port()
    (tmp_path / "edge.toml").write_text(CONFIG.format(port=port))
    options = {"clean_session": False} if protocol == V311 else {}
    with meshbus_run(tmp_path, anyio_backend) as node:
        away = Paho(port, "away", protocol, **options)
        await away.connect(clean_start=False, session_expiry=3600)
        await away.subscribe(("orders/#", 1))
        await away.disconnect()
        online = Paho(port, "online", protocol, **options)
        online.client.manual_ack_set(True)  # it takes them and acknowledges none
        await online.connect(clean_start=False, session_expiry=3600)
        await online.subscribe(("orders/#", 1))
        shop = Paho(port, "shop", protocol)
        await shop.connect()
        for i in range(20):
            await shop.publish(f"orders/{i}", b"%d" % i, qos=1)  # acknowledged by the node
        assert len(await online.receive_many(20)) == 20  # sent, not acknowledged
        node.finish(signal.SIGKILL)
        await shop.disconnect()
        await online.disconnect()
    with meshbus_run(tmp_path, anyio_backend):
        for name in ("away", "online"):
            device = Paho(port, name, protocol, **options)
            await device.connect(clean_start=False, session_expiry=3600)
            assert device.connack[0].session_present, name
            got = await device.receive_many(20)
            assert sorted(int(m.payload) for m in got) == list(range(20)), name
            assert [int(m.payload) for m in got] == list(range(20)), name  # in order
            # Which went out before the kill is not known after it: the ones the
            # queue had handed out come flagged DUP; the away device's come first.
            assert all(m.dup == (name == "online") for m in got), name
            await device.disconnect()


async def test_a_qos1_share_group_survives_a_kill_9(tmp_path: Path, anyio_backend: str) -> None:
    """The group's queue and its members' sessions come back: what the node took for
    the group, including what a member held unacknowledged at the kill, reaches a
    member after the restart."""
    port = free_port()
    (tmp_path / "edge.toml").write_text(CONFIG.format(port=port))
    with meshbus_run(tmp_path, anyio_backend) as node:
        workers = []
        for name in ("w1", "w2"):
            worker = Paho(port, name, V5)
            worker.client.manual_ack_set(True)  # takes its share, acknowledges none
            await worker.connect(clean_start=False, session_expiry=3600)
            assert await worker.subscribe(("$share/pool/jobs/#", 1)) == [1]
            workers.append(worker)
        shop = Paho(port, "shop", V5)
        await shop.connect()
        for i in range(20):
            await shop.publish(f"jobs/{i}", b"%d" % i, qos=1)  # acknowledged by the node
        await workers[0].receive()  # one at least is out to w1, unacknowledged
        node.finish(signal.SIGKILL)
        for client in (shop, *workers):
            await client.disconnect()
    with meshbus_run(tmp_path, anyio_backend):
        worker = Paho(port, "w2", V5)
        await worker.connect(clean_start=False, session_expiry=3600)
        assert worker.connack[0].session_present
        # Its session is a member still (no SUBSCRIBE), and w1 is away: all 20 come.
        got = await worker.receive_many(20)
        assert sorted(int(m.payload) for m in got) == list(range(20))
        await worker.disconnect()


async def test_the_will_of_a_device_connected_at_a_kill_9_goes_after_the_restart(
    tmp_path: Path, anyio_backend: str
) -> None:
    # The node's crash ended the device's connection: its will (retained here, so a
    # subscriber after the restart can see it) is published once the node is back.
    port = free_port()
    (tmp_path / "edge.toml").write_text(CONFIG.format(port=port))
    with meshbus_run(tmp_path, anyio_backend) as node:
        device = Paho(port, "device", V311, clean_session=False)
        await device.connect(will=("status/device", b"offline", 1, True))
        node.finish(signal.SIGKILL)
        await device.disconnect()
    with meshbus_run(tmp_path, anyio_backend):
        late = Paho(port, "late", V5)
        await late.connect()
        await late.subscribe(("status/#", 1))
        kept = await late.receive()
        assert (kept.topic, kept.payload, kept.retain) == ("status/device", b"offline", True)
        await late.disconnect()


@PAIRED
async def test_unacknowledged_messages_keep_their_packet_ids_over_a_kill_9(
    tmp_path: Path, anyio_backend: str, protocol: int
) -> None:
    # MQTT-4.4.0-1: a session that comes back gets its unacknowledged messages again
    # under their packet ids. The ids that were in flight at a crash are not on disk,
    # so the node derives them from what is: each message's place in the spool.
    port = free_port()
    (tmp_path / "edge.toml").write_text(CONFIG.format(port=port))
    options = {"clean_session": False} if protocol == V311 else {}
    with meshbus_run(tmp_path, anyio_backend) as node:
        device = Paho(port, "meter", protocol, **options)
        device.client.manual_ack_set(True)
        await device.connect(clean_start=False, session_expiry=3600)
        await device.subscribe(("orders/#", 1))
        shop = Paho(port, "shop", protocol)
        await shop.connect()
        for i in range(5):
            await shop.publish(f"orders/{i}", b"%d" % i, qos=1)
        for message in await device.receive_many(5):
            device.client.ack(message.mid, message.qos)  # taken: the ids are free again
        for i in range(5, 25):
            await shop.publish(f"orders/{i}", b"%d" % i, qos=1)
        held = await device.receive_many(20)  # sent, not acknowledged
        node.finish(signal.SIGKILL)
        await shop.disconnect()
        await device.disconnect()
    with meshbus_run(tmp_path, anyio_backend):
        again = Paho(port, "meter", protocol, **options)
        await again.connect(clean_start=False, session_expiry=3600)
        got = await again.receive_many(20)
        assert [(m.payload, m.mid) for m in got] == [(m.payload, m.mid) for m in held]
        assert all(m.dup for m in got)
        await again.disconnect()
