"""A bridge between two ``meshbus run`` processes, configured in the file (SPEC 7).

Node A is a plain node with queue ``Q``; node B's file has queue ``L`` (100 messages at
most) and a bridge to A asking for ``a/>`` and binding a flow to ``Q``, over TCP, or
over TLS logging in with a client certificate. The tests publish on A with one remote
session and read on B with another: direct messages, and guaranteed ones that wait
in ``Q`` while ``L`` is full. Every wait is for
a printed line or for a message, within generous limits; until the bridge is in sync,
probes are published on A (a bridge carries nothing before it is).
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from meshbus.transports import RemoteSession, TlsSettings, connect
from meshbus.transports.certs import make_ca, make_client_certificate, make_server_certificate
from tests.processes import WAIT, Child

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(180)]

NODE_A = """
[node]
name = "node-a"
data_dir = "data-a"

[[listeners]]
port = 0

[vpns.default.client_profiles.default]
allow_bridge_connections = true

[vpns.default.queues.Q]
subscriptions = ["g/>"]
"""

NODE_B = """
[node]
name = "node-b"
data_dir = "data-b"

[[listeners]]
port = 0

[vpns.default.queues.L]
subscriptions = ["g/>"]
max_messages = 100

[[vpns.default.bridges]]
name = "to-a"
remotes = ["{url}"]
subscriptions = ["a/>"]
queues = ["Q"]
"""


NODE_A_TLS = """
[node]
name = "node-a"
data_dir = "data-a"

[[listeners]]
port = 0
[listeners.tls]
certificate = "certs/server.pem"
private_key = "certs/server-key.pem"
ca = "certs/ca.pem"
require_client_certificate = true

[vpns.default]
authentication = "client-certificate"
[vpns.default.users.node-b]
[vpns.default.users.pub]
[vpns.default.client_profiles.default]
allow_bridge_connections = true

[vpns.default.queues.Q]
subscriptions = ["g/>"]
"""

NODE_B_TLS = (
    NODE_B
    + """
[vpns.default.bridges.tls]
ca = "certs/ca.pem"
certificate = "certs/node-b.pem"
private_key = "certs/node-b-key.pem"
"""
)


def url_of(node: Child) -> str:
    """The URL a ``meshbus run`` process says it listens on."""
    (line,) = node.wait_for("meshbus run: node ")
    return line.rsplit(" ", 1)[1]


@pytest.fixture
def urls(tmp_path: Path, anyio_backend: str) -> Iterator[tuple[str, str]]:
    """Start node A, then node B bridged to it; the URLs of their listeners: plain TCP
    on asyncio, TLS on trio (both are covered without running every scenario four
    times; TLS on either loop is the transports tests' business)."""
    started: list[Child] = []
    tls = anyio_backend == "trio"
    if tls:
        certs = tmp_path / "certs"
        make_ca(certs)
        make_server_certificate(certs)
        make_client_certificate(certs, "node-b")
        make_client_certificate(certs, "pub")

    def run(name: str, text: str) -> str:
        (tmp_path / f"{name}.toml").write_text(text, encoding="utf-8")
        args = [sys.executable, "-m", "meshbus", "run", f"{name}.toml", "--loop", anyio_backend]
        started.append(Child(args, tmp_path))
        return url_of(started[-1])

    try:
        a = run("node-a", NODE_A_TLS if tls else NODE_A)
        yield a, run("node-b", (NODE_B_TLS if tls else NODE_B).format(url=a))
    finally:
        for child in started:
            child.close()


async def until_bridged(
    publisher: RemoteSession, reader: RemoteSession, topic: str = "a/probe"
) -> None:
    """Publish probes on A until one reaches B."""
    with anyio.fail_after(WAIT):
        while True:
            publisher.publish(topic, b"?")
            with anyio.move_on_after(0.1):
                await reader.receive()
                return


async def test_a_bridge_in_the_file_brings_what_it_asks_for_across_processes(
    urls: tuple[str, str], tmp_path: Path
) -> None:
    a_url, b_url = urls
    certs = tmp_path / "certs"
    tls = TlsSettings(
        ca=certs / "ca.pem", certificate=certs / "pub.pem", private_key=certs / "pub-key.pem"
    )
    async with (
        connect(
            a_url, client_name="pub", reconnect=False, tls=tls if a_url.startswith("tls") else None
        ) as publisher,
        connect(b_url, client_name="reader", reconnect=False) as reader,
    ):
        reader.subscribe(">")
        await until_bridged(publisher, reader)
        for i in range(100):
            publisher.publish("a/x", b"%d" % i)
            publisher.publish("b/x", b"%d" % i)
        publisher.publish("a/end", b"")
        await publisher.confirm()
        got = []
        with anyio.fail_after(WAIT):
            while (message := await reader.receive()).topic != "a/end":
                if message.topic != "a/probe":
                    got.append(message)
    assert [m.topic for m in got] == ["a/x"] * 100
    assert [m.payload for m in got] == [b"%d" % i for i in range(100)]
    assert {(m.sender, m.hop_count) for m in got} == {("pub", 1)}


async def test_guaranteed_messages_wait_on_a_until_b_has_room_across_processes(
    urls: tuple[str, str], tmp_path: Path
) -> None:
    # B's queue L takes 100; A's queue Q holds the rest, and the bridge offers the
    # refused one again each second while direct messages keep coming.
    a_url, b_url = urls
    certs = tmp_path / "certs"
    tls = TlsSettings(
        ca=certs / "ca.pem", certificate=certs / "pub.pem", private_key=certs / "pub-key.pem"
    )
    on_a = {"tls": tls} if a_url.startswith("tls") else {}
    async with (
        connect(a_url, client_name="pub", reconnect=False, **on_a) as shop,  # type: ignore[arg-type]
        connect(b_url, client_name="reader", reconnect=False) as reader,
    ):
        reader.subscribe("a/>")
        await until_bridged(shop, reader)
        results = await shop.send_many((f"g/{i}", b"%d" % i) for i in range(1000))
        assert results == [None] * 1000
        with anyio.fail_after(WAIT):
            while True:  # until the 101st was refused at least once
                link = (await reader.node_statistics())["links"]["default"]["bridge/to-a"]
                if link["receive_failures"]:
                    break
                await anyio.sleep(0.05)
        await until_bridged(shop, reader)  # direct messages still cross
        flow = await reader.bind("L")
        got = []
        with anyio.fail_after(WAIT * 2):
            while len(got) < 1000:
                message = await flow.receive()
                got.append(message)
                flow.ack(message)
    assert [m.payload for m in got] == [b"%d" % i for i in range(1000)]
    assert not any(m.redelivered for m in got)
    assert {m.hop_count for m in got} == {1}


async def test_sighup_changes_the_bridge_s_subscriptions_across_processes(
    tmp_path: Path, anyio_backend: str
) -> None:
    # Node B's file first asks A for a/>; a SIGHUP after the file asks for b/> moves
    # the bridge over. A file changing a listener is refused and changes nothing.
    started: list[Child] = []

    def run(name: str, text: str) -> Child:
        (tmp_path / f"{name}.toml").write_text(text, encoding="utf-8")
        args = [sys.executable, "-m", "meshbus", "run", f"{name}.toml", "--loop", anyio_backend]
        started.append(Child(args, tmp_path))
        return started[-1]

    def rewrite(text: str) -> None:
        (tmp_path / "node-b.toml").write_text(text, encoding="utf-8")
        node_b.process.send_signal(signal.SIGHUP)

    try:
        a_url = url_of(run("node-a", NODE_A))
        b_text = NODE_B.format(url=a_url).replace('queues = ["Q"]\n', "")
        node_b = run("node-b", b_text)
        b_url = url_of(node_b)
        async with (
            connect(a_url, client_name="pub", reconnect=False) as publisher,
            connect(b_url, client_name="reader", reconnect=False) as reader,
        ):
            reader.subscribe(">")
            await until_bridged(publisher, reader)

            rewrite(b_text.replace("port = 0", "port = 1", 1))
            with anyio.fail_after(WAIT):
                while not any("refused" in line for line in node_b.stderr_lines):
                    await anyio.sleep(0.05)
            await until_bridged(publisher, reader)  # as before

            rewrite(b_text.replace('subscriptions = ["a/>"]', 'subscriptions = ["b/>"]'))
            (line,) = await anyio.to_thread.run_sync(node_b.wait_for, "meshbus run: reloaded")
            await until_bridged(publisher, reader, "b/probe")
            publisher.publish("a/x", b"")
            publisher.publish("b/x", b"")
            publisher.publish("b/end", b"")
            got = []
            with anyio.fail_after(WAIT):
                while (message := await reader.receive()).topic != "b/end":
                    got.append(message.topic)
        assert line == "meshbus run: reloaded node-b.toml: 1 change"
        assert [topic for topic in got if not topic.endswith("probe")] == ["b/x"]
        printed = [line for line in node_b.stderr_lines if not line.startswith("20")]  # no logs
        assert printed == [
            "meshbus run: reload of node-b.toml refused, nothing changed: 1 problem:",
            "  node-b.toml: listeners: changed, and that takes a restart of the node",
        ]
        assert await anyio.to_thread.run_sync(node_b.finish, signal.SIGTERM) == 0
    finally:
        for child in started:
            child.close()
