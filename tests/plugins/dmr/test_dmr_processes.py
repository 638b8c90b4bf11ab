"""Dynamic routing between ``meshbus run`` processes over TCP and TLS (SPEC 8).

Three nodes of cluster ``c1`` configured in their files, on ports picked before they
start (each file names the others'). The tests read what the nodes did through
``meshbus stats`` over a remote session (the ``dmr`` figures under ``plugins``), and
move messages with remote sessions. Every wait is for a printed line, a message or a
figure, within generous limits; polling the statistics is the one place that sleeps.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

from meshbus.transports import RemoteSession, TlsSettings, connect
from meshbus.transports.certs import make_ca, make_server_certificate
from tests.processes import WAIT, Child, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

NAMES = ("n1", "n2", "n3")

NODE = """
[node]
name = "{name}"
cluster = "c1"
data_dir = "data-{name}"

[[listeners]]
port = {port}
{listener_tls}

[vpns.default.client_profiles.default]
allow_bridge_connections = true

{queues}

[dmr]
peers = {{ {peers} }}
backoff = {{ initial = 0.2, maximum = 1.0 }}
{dmr_tls}
"""


class Cluster:
    """Three ``meshbus run`` processes; (re)start, stop or kill each by name."""

    def __init__(self, tmp_path: Path, scheme: str, backend: str) -> None:
        self.path = tmp_path
        self.scheme = scheme
        self.backend = backend
        self.names = list(NAMES)
        self.ports = {name: free_port() for name in NAMES}
        self.children: dict[str, Child] = {}
        self.tls = None
        if scheme == "tls":
            certs = tmp_path / "certs"
            make_ca(certs)
            make_server_certificate(certs)
            self.tls = TlsSettings(ca=certs / "ca.pem")
        for name in NAMES:
            (tmp_path / f"{name}.toml").write_text(self.config(name), encoding="utf-8")

    def url(self, name: str) -> str:
        return f"{self.scheme}://127.0.0.1:{self.ports[name]}"

    def config(self, name: str) -> str:
        peers = ", ".join(f'{other} = "{self.url(other)}"' for other in self.names if other != name)
        tls = self.scheme == "tls"
        return NODE.format(
            name=name,
            port=self.ports[name],
            peers=peers,
            listener_tls=(
                '[listeners.tls]\ncertificate = "certs/server.pem"\n'
                'private_key = "certs/server-key.pem"'
                if tls
                else ""
            ),
            dmr_tls='tls = { ca = "certs/ca.pem" }' if tls else "",
            queues='[vpns.default.queues.orders]\nsubscriptions = ["g/>"]' if name == "n3" else "",
        )

    def join(self, name: str) -> None:
        """Add node ``name`` to every file, send the running nodes SIGHUP (they add it
        as a peer while they run), and start it."""
        self.names.append(name)
        self.ports[name] = free_port()
        for each in self.names:
            (self.path / f"{each}.toml").write_text(self.config(each), encoding="utf-8")
        for child in self.children.values():
            child.process.send_signal(signal.SIGHUP)
        for child in self.children.values():
            child.wait_for("meshbus run: reloaded")
        self.start(name)

    def start(self, name: str) -> None:
        args = [sys.executable, "-m", "meshbus", "run", f"{name}.toml", "--loop", self.backend]
        self.children[name] = Child(args, self.path)
        self.children[name].wait_for("meshbus run: node ")

    def stop(self, name: str, signum: int = signal.SIGTERM) -> None:
        child = self.children.pop(name)
        child.finish(signum)
        child.close()

    def close(self) -> None:
        for child in self.children.values():
            child.close()

    def session(self, name: str, client_name: str) -> RemoteSession:
        return connect(self.url(name), client_name=client_name, reconnect=False, tls=self.tls)


#: The scheme of the links on each event loop: both are covered without running every
#: scenario four times (TLS on either loop is the transports tests' business).
SCHEMES = {"asyncio": "tcp", "trio": "tls"}


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> Iterator[Cluster]:
    scheme = getattr(request, "param", None) or SCHEMES[anyio_backend]
    running = Cluster(tmp_path, scheme, anyio_backend)
    try:
        for name in NAMES:
            running.start(name)
        yield running
    finally:
        running.close()


async def dmr_stats(session: RemoteSession) -> dict[str, Any]:
    return (await session.node_statistics())["plugins"]["default"]["dmr"]  # type: ignore[no-any-return]


async def until(session: RemoteSession, check: Any) -> dict[str, Any]:
    """Poll ``session``'s node's dmr figures until ``check(figures)`` holds."""
    with anyio.fail_after(WAIT):
        while True:
            figures = await dmr_stats(session)
            if check(figures):
                return figures
            await anyio.sleep(0.05)


def all_in_sync(figures: dict[str, Any]) -> bool:
    neighbours = figures["neighbours"].values()
    return all(n["state"] == "in-sync" and n.get("in", {}).get("state") for n in neighbours)


def adverts_from(figures: dict[str, Any], name: str) -> int:
    return figures["neighbours"][name]["control"]["adverts_in"]  # type: ignore[no-any-return]


def sent_to(figures: dict[str, Any], name: str) -> int:
    return figures["neighbours"][name]["out"]["messages"]  # type: ignore[no-any-return]


async def test_a_cluster_of_three_processes(cluster: Cluster) -> None:
    watch = {name: cluster.session(name, f"watch-{name}") for name in NAMES}
    async with AsyncExitStack() as sessions:
        for session in watch.values():
            await sessions.enter_async_context(session)
        for name in NAMES:
            await until(watch[name], all_in_sync)
        # Three clients subscribe the same topic on n1: one advertisement per link.
        before = {n: adverts_from(await dmr_stats(watch[n]), "n1") for n in ("n2", "n3")}
        between = adverts_from(await dmr_stats(watch["n3"]), "n2")
        clients = [cluster.session("n1", f"c{i}") for i in range(3)]
        for client in clients:
            await sessions.enter_async_context(client)
            client.subscribe("payments")
            await client.confirm()
        for n in ("n2", "n3"):
            await until(watch[n], lambda f: adverts_from(f, "n1") > before[n])  # noqa: B023
        for client in clients[:2]:
            client.unsubscribe("payments")
            await client.confirm()
        clients[2].subscribe("marker")  # the next change: everything before it arrived
        await clients[2].confirm()
        for n in ("n2", "n3"):
            figures = await until(watch[n], lambda f: adverts_from(f, "n1") >= before[n] + 2)  # noqa: B023
            assert adverts_from(figures, "n1") == before[n] + 2  # payments, then marker
        clients[2].unsubscribe("payments")
        await clients[2].confirm()
        for n in ("n2", "n3"):
            await until(watch[n], lambda f: adverts_from(f, "n1") == before[n] + 3)  # noqa: B023
        assert adverts_from(await dmr_stats(watch["n3"]), "n2") == between

        # One copy per link: ten subscribers on n2, one on n3.
        readers = [cluster.session("n2", f"r{i}") for i in range(10)] + [
            cluster.session("n3", "r-n3")
        ]
        for reader in readers:
            await sessions.enter_async_context(reader)
            reader.subscribe("t")
            await reader.confirm()
        with anyio.fail_after(WAIT):
            # Until n1 knows both: a probe reaches the subscriber on n3 and one on n2.
            while True:
                clients[0].publish("t", b"probe")
                with anyio.move_on_after(0.2):
                    await readers[-1].receive()
                    await readers[0].receive()
                    break
        for reader in readers:
            while (await _receive_quick(reader)) is not None:
                pass
        sent = await dmr_stats(watch["n1"])
        base = {n: sent_to(sent, n) for n in ("n2", "n3")}
        clients[0].publish("t", b"once")
        await clients[0].confirm()
        for reader in readers:
            with anyio.fail_after(WAIT):
                assert (await reader.receive()).payload == b"once"
        sent = await dmr_stats(watch["n1"])
        assert {n: sent_to(sent, n) - base[n] for n in ("n2", "n3")} == {"n2": 1, "n3": 1}


async def _receive_quick(session: RemoteSession) -> Any:
    with anyio.move_on_after(0.1):
        return await session.receive()
    return None


async def test_guaranteed_messages_wait_for_a_stopped_node_across_processes(
    cluster: Cluster,
) -> None:
    async with cluster.session("n1", "watch") as watch:
        await until(watch, all_in_sync)
        await until(watch, lambda f: "g" in f["neighbours"]["n3"]["interest"])
        cluster.stop("n3")
        await until(watch, lambda f: f["neighbours"]["n3"]["state"] != "in-sync")
        async with cluster.session("n1", "publisher") as publisher:
            for i in range(1000):
                await publisher.send("g/x", b"%d" % i)
                publisher.publish("g/x", b"direct")
            await publisher.confirm()
        figures = await dmr_stats(watch)
        assert figures["neighbours"]["n3"]["out"]["dropped"].get("unreachable") == 1000
    cluster.start("n3")
    async with cluster.session("n3", "consumer") as consumer:
        flow = await consumer.bind("orders")
        got = []
        with anyio.fail_after(WAIT * 2):
            while len(got) < 1000:
                message = await flow.receive()
                got.append(message.payload)
                flow.ack(message)
    assert got == [b"%d" % i for i in range(1000)]


@pytest.mark.parametrize("cluster", ["tcp"], indirect=True)
async def test_a_node_killed_and_restarted_serves_with_its_neighbours_interest(
    cluster: Cluster,
) -> None:
    async with cluster.session("n1", "far") as far:
        await until(far, all_in_sync)
        for i in range(50_000):
            far.subscribe(f"s/{i}")
        await far.confirm()
        async with cluster.session("n2", "watch") as watch:
            await until(watch, lambda f: f["neighbours"]["n1"]["interest"].get("d", 0) >= 50_000)
        cluster.stop("n2", signal.SIGKILL)
        cluster.start("n2")  # listening: it is in sync, or gave up waiting
        async with cluster.session("n2", "publisher") as publisher:
            publisher.publish("s/49999", b"first")
            await publisher.confirm()
            with anyio.fail_after(WAIT):
                message = await far.receive()
            assert message.payload == b"first"
            figures = await dmr_stats(publisher)
        assert figures["state"] == "in-sync"
        assert figures["synced_after"] is not None
        assert figures["synced_after"] <= 2.0


@pytest.mark.parametrize("cluster", ["tcp"], indirect=True)
async def test_a_node_joins_the_running_cluster_on_sighup(cluster: Cluster) -> None:
    await anyio.to_thread.run_sync(cluster.join, "n4")
    async with cluster.session("n1", "watch") as watch, cluster.session("n4", "r") as reader:
        figures = await until(watch, lambda f: "n4" in f["neighbours"] and all_in_sync(f))
        assert sorted(figures["neighbours"]) == ["n2", "n3", "n4"]
        reader.subscribe("to-n4")
        await reader.confirm()
        async with cluster.session("n1", "publisher") as publisher:
            with anyio.fail_after(WAIT):
                while True:  # until n1 has n4's interest
                    publisher.publish("to-n4", b"hello")
                    with anyio.move_on_after(0.2):
                        message = await reader.receive()
                        break
    assert message.payload == b"hello"
    lines = [c.stdout_lines[-1] for n, c in cluster.children.items() if n != "n4"]
    assert lines == [f"meshbus run: reloaded {n}.toml: 1 change" for n in ("n1", "n2", "n3")]


PASSWORDS = """
[node]
name = "{name}"
cluster = "c1"
data_dir = "data-{name}"

[[listeners]]
port = {port}

[vpns.default]
authentication = "basic"
[vpns.default.client_profiles.mesh]
allow_bridge_connections = true
[vpns.default.users.mesh]
password = "mesh-secret"
client_profile = "mesh"
[vpns.default.users.app]
password = "app-secret"
{queues}

[dmr]
peers = {{ {peer} = "tcp://127.0.0.1:{peer_port}" }}
username = "mesh"
password = "mesh-secret"
backoff = {{ initial = 0.2, maximum = 1.0 }}
"""


async def test_guaranteed_messages_cross_a_cluster_whose_vpn_checks_passwords(
    tmp_path: Path, anyio_backend: str
) -> None:
    # Each node binds its waiting queue on the other over the connection the other
    # dialled; that side served the bind with a session that logged in as 'default'
    # without a password, which the VPN refused: nothing guaranteed ever crossed.
    ports = {"p1": free_port(), "p2": free_port()}
    children = []
    try:
        for name, peer in (("p1", "p2"), ("p2", "p1")):
            text = PASSWORDS.format(
                name=name,
                port=ports[name],
                peer=peer,
                peer_port=ports[peer],
                queues='[vpns.default.queues.orders]\nsubscriptions = ["g/>"]'
                if name == "p2"
                else "",
            )
            (tmp_path / f"{name}.toml").write_text(text, encoding="utf-8")
            args = [sys.executable, "-m", "meshbus", "run", f"{name}.toml", "--loop", anyio_backend]
            children.append(Child(args, tmp_path))
        for child in children:
            await anyio.to_thread.run_sync(child.wait_for, "meshbus run: node ")
        login = {"username": "app", "password": "app-secret", "reconnect": False}
        url = "tcp://127.0.0.1:{}".format
        async with (
            connect(url(ports["p1"]), client_name="shop", **login) as shop,  # type: ignore[arg-type]
            connect(url(ports["p2"]), client_name="clerk", **login) as clerk,  # type: ignore[arg-type]
        ):
            await until(shop, lambda f: "g" in f["neighbours"]["p2"]["interest"])
            await shop.send("g/1", b"across")
            flow = await clerk.bind("orders")
            with anyio.fail_after(WAIT):
                message = await flow.receive()
            flow.ack(message)
        assert message.payload == b"across"
    finally:
        for child in children:
            child.close()
