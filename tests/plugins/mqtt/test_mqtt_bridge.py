"""Bridges from a meshbus node to a real mosquitto broker (SPEC 7, 9, 13)."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from meshbus import ConfigurationError, LinkState, Node
from meshbus.plugins.bridge import BridgeSettings, TopicMapping, open_bridge

from ._clients import V5, V311, Paho, eventually, needs, user_properties

pytestmark = [pytest.mark.anyio, needs("mosquitto")]

MOSQUITTO = "/usr/sbin/mosquitto"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Mosquitto:
    """A mosquitto broker on a free port, with persistence in its own folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = _free_port()
        self.config = folder / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
            f"persistence true\npersistence_location {folder}/\nautosave_interval 1\n"
            # Run as root, it would switch to user mosquitto, who may not write here.
            f"user {pwd.getpwuid(os.geteuid()).pw_name}\n"
            f"log_dest file {folder}/mosquitto.log\nlog_type all\n"
        )
        #: What the broker logged (every packet it received, among the rest).
        self.log = folder / "mosquitto.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [MOSQUITTO, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.02)
        raise RuntimeError("mosquitto did not start")

    def stop(self) -> None:
        """Stop it as a service manager does (SIGTERM: it saves its persistence)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(10)
            self.process = None


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path)
    broker.start()
    try:
        yield broker
    finally:
        if broker.process is not None:
            broker.process.kill()
            broker.process.wait()


PROTOCOLS = pytest.mark.parametrize(("level", "paho"), [(5, V5), (4, V311)], ids=["5", "3.1.1"])


async def _open(node: Node, mosquitto: Mosquitto, level: int, **options: object):  # type: ignore[no-untyped-def]
    bridge = open_bridge(
        node.vpn(),
        BridgeSettings(
            "cloud",
            remotes=[mosquitto.url],
            mqtt={"protocol": level},
            backoff=None,
            **options,  # type: ignore[arg-type]
        ),
    )
    with anyio.fail_after(10):
        await bridge.wait_for(LinkState.IN_SYNC)
    return bridge


@PROTOCOLS
async def test_topics_are_mapped_both_ways_as_hivemq_templates_say(
    mosquitto: Mosquitto, level: int, paho: int
) -> None:
    mappings = [
        TopicMapping("plant/*/temp", mode="PUB", destination="site/${site}/{2}"),
        TopicMapping("cmd/>", mode="SUB", destination="local/{2-#}", excludes=["cmd/debug/>"]),
    ]
    async with Node(name="edge") as node:
        bridge = await _open(node, mosquitto, level, topics=mappings, variables={"site": "s7"})
        observer = Paho(mosquitto.port, "observer", paho)
        await observer.connect()
        await observer.subscribe(("site/#", 1))
        local = node.connect(client_name="local")
        local.subscribe("local/>")
        local.publish("plant/boiler/temp", b"71")
        await local.send("plant/pump/temp", b"40")
        local.publish("plant/boiler/pressure", b"not mapped")
        got = sorted((m.topic, m.payload) for m in await observer.receive_many(2))
        assert got == [("site/s7/boiler", b"71"), ("site/s7/pump", b"40")]
        await observer.publish("cmd/valve/open", b"50%", qos=1)
        await observer.publish("cmd/debug/dump", b"no", qos=1)
        await observer.publish("cmd/valve/close", b"now", qos=0)
        await eventually(lambda: len(local.egress) >= 2)
        assert sorted((m.topic, m.payload) for m in iter(local.receive_nowait, None)) == [
            ("local/valve/close", b"now"),
            ("local/valve/open", b"50%"),
        ]
        stats = bridge.statistics()
        assert stats.dropped.get("excluded") == 1
        assert stats.forwarded == 2


@PROTOCOLS
async def test_a_two_way_everything_bridge_does_not_loop(
    mosquitto: Mosquitto, level: int, paho: int
) -> None:
    mappings = [TopicMapping(">", mode="PUB"), TopicMapping(">", mode="SUB")]
    async with Node(name="edge") as node:
        bridge = await _open(node, mosquitto, level, topics=mappings)
        observer = Paho(mosquitto.port, "observer", paho)
        await observer.connect()
        await observer.subscribe(("#", 1))
        local = node.connect(client_name="local")
        local.subscribe(">")
        local.publish("from/edge", b"1")
        await local.send("from/edge", b"2")
        await observer.publish("from/cloud", b"3", qos=1)
        await observer.publish("from/cloud", b"4", qos=0)
        seen_cloud = await observer.receive_many(4)
        await eventually(lambda: len(local.egress) >= 4)
        await anyio.sleep(0.5)  # time enough for a loop to show itself
        assert sorted((m.topic, m.payload) for m in seen_cloud) == [
            ("from/cloud", b"3"),
            ("from/cloud", b"4"),
            ("from/edge", b"1"),
            ("from/edge", b"2"),
        ]
        assert observer.nothing_more()
        seen_local = sorted((m.topic, m.payload) for m in iter(local.receive_nowait, None))
        assert seen_local == [
            ("from/cloud", b"3"),
            ("from/cloud", b"4"),
            ("from/edge", b"1"),
            ("from/edge", b"2"),
        ]
        if level == 4:  # no no-local on 3.1.1: what came back was recognised
            assert bridge.statistics().dropped.get("duplicate") == 2


async def _out_and_in(node: Node, mosquitto: Mosquitto) -> Paho:
    """An MQTT 5 bridge sending ``out/>`` to the broker and taking ``in/>`` from it, and
    a broker client that sees what goes out (and may publish what comes in)."""
    await _open(
        node,
        mosquitto,
        5,
        topics=[TopicMapping("out/>", mode="PUB"), TopicMapping("in/>", mode="SUB")],
    )
    observer = Paho(mosquitto.port, "observer", V5)
    await observer.connect()
    await observer.subscribe(("out/#", 0))
    return observer


async def test_hop_counts_travel_as_the_hivemq_user_property(mosquitto: Mosquitto) -> None:
    async with Node(name="edge") as node:
        observer = await _out_and_in(node, mosquitto)
        node.connect().publish("out/x", b"1")
        message = await observer.receive()
        assert ("hmq-bridge-hop-count", "1") in message.properties.UserProperty
        local = node.connect()
        local.subscribe("in/>")
        # As a HiveMQ bridge would send it: one hop already.
        await observer.publish(
            "in/y",
            b"2",
            qos=1,
            properties=user_properties([("hmq-bridge-hop-count", "1"), ("k", "v")]),
        )
        await eventually(lambda: len(local.egress) >= 1)
        got = local.receive_nowait()
        assert got is not None
        assert (got.hop_count, dict(got.headers)) == (1, {"k": "v"})
        # The hop count taken out of interleaved properties leaves the others' order.
        sent = [("k", "1"), ("hmq-bridge-hop-count", "1"), ("j", "2"), ("k", "3")]
        await observer.publish("in/z", b"3", qos=1, properties=user_properties(sent))
        await eventually(lambda: len(local.egress) >= 1)
        got = local.receive_nowait()
        assert got is not None
        order = ["k", "j", "k"]
        assert dict(got.headers) == {"k": ["1", "3"], "j": "2", "user-property-order": order}
        # ... and that order goes out again, with the hop count after it.
        node.connect().publish("out/z", b"4", headers=got.headers)
        message = await observer.receive()
        assert message.properties.UserProperty == [
            ("k", "1"),
            ("j", "2"),
            ("k", "3"),
            ("hmq-bridge-hop-count", "1"),
        ]


async def test_the_bridge_forwards_expiry_payload_format_and_repeated_properties(
    mosquitto: Mosquitto,
) -> None:
    # Out to the broker as a node's MQTT listener sends them to its clients: what is
    # left of the TTL as the expiry interval, the payload format, a list header as one
    # user property per value; and back the same way.
    async with Node(name="edge") as node:
        observer = await _out_and_in(node, mosquitto)
        await node.connect().send(
            "out/x", b"text", ttl=300, headers={"tag": ["a", "b"], "payload-format": "utf-8"}
        )
        message = await observer.receive()
        properties = message.properties
        assert 290 <= properties.MessageExpiryInterval <= 300
        assert properties.PayloadFormatIndicator == 1
        assert [p for p in properties.UserProperty if p[0] == "tag"] == [("tag", "a"), ("tag", "b")]
        local = node.connect()
        local.subscribe("in/>")
        sent = user_properties([("tag", "c"), ("tag", "d")])
        sent.PayloadFormatIndicator = 1
        await observer.publish("in/y", b"text", qos=1, properties=sent)
        await eventually(lambda: len(local.egress) >= 1)
        got = local.receive_nowait()
        assert got is not None
        assert dict(got.headers) == {"tag": ["c", "d"], "payload-format": "utf-8"}


async def test_qos1_loses_nothing_over_a_broker_restart(mosquitto: Mosquitto) -> None:
    async with Node(name="edge") as node:
        node.guaranteed.create_queue("inbox", subscriptions=["in/>"])
        bridge = await _open(
            node,
            mosquitto,
            5,
            topics=[TopicMapping("out/>", mode="PUB"), TopicMapping("in/>", mode="SUB")],
            fail_back=False,
        )
        # A persistent session at the broker for what the node sends out.
        receiver = Paho(mosquitto.port, "receiver", V5)
        await receiver.connect(clean_start=False, session_expiry=3600)
        await receiver.subscribe(("out/#", 1))
        await receiver.disconnect()
        publisher = node.connect(client_name="app")
        for i in range(50):
            await publisher.send(f"out/{i}", b"%d" % i)
        await anyio.to_thread.run_sync(mosquitto.stop)
        with anyio.fail_after(10):
            await bridge.wait_for(LinkState.BACKOFF)
        for i in range(50, 100):  # the broker is down: these wait in the bridge's queue
            await publisher.send(f"out/{i}", b"%d" % i)
        await anyio.to_thread.run_sync(mosquitto.start)
        with anyio.fail_after(30):
            await bridge.wait_for(LinkState.IN_SYNC)
        receiver = Paho(mosquitto.port, "receiver", V5)
        await receiver.connect(clean_start=False, session_expiry=3600)
        seen: set[int] = set()
        with anyio.fail_after(30):  # QoS 1 is at least once: a resend may come twice
            while len(seen) < 100:
                seen.add(int((await receiver.receive(timeout=20)).payload))
        assert sorted(seen) == list(range(100))  # none lost
        # And the other way: what a broker client publishes at QoS 1 reaches the queue.
        sender = Paho(mosquitto.port, "sender", V5)
        await sender.connect()
        for i in range(20):
            await sender.publish(f"in/{i}", b"%d" % i, qos=1)
        await eventually(lambda: node.guaranteed.queue("inbox").spooled >= 20)  # type: ignore[attr-defined]
        assert bridge.statistics().connects == 2


async def test_a_bridge_from_a_vpn_with_passwords_sends_its_queue_at_qos1(
    mosquitto: Mosquitto,
) -> None:
    # The bridge's queue was read by a session logged in as 'default' without a
    # password, which a basic-authentication VPN refuses: nothing went out at QoS 1.
    async with Node(name="edge") as node:
        vpn = node.create_vpn("plant", authentication="basic")
        bridge = open_bridge(
            vpn,
            BridgeSettings(
                "cloud", remotes=[mosquitto.url], topics=[TopicMapping("out/>", mode="PUB")]
            ),
        )
        with anyio.fail_after(10):
            await bridge.wait_for(LinkState.IN_SYNC)
        receiver = Paho(mosquitto.port, "receiver", V5)
        await receiver.connect()
        await receiver.subscribe(("out/#", 1))
        vpn.add_user("app", password="secret")
        publisher = await node.login("plant", username="app", password="secret")
        await publisher.send("out/1", b"guaranteed")
        message = await receiver.receive(timeout=10)
        assert (message.topic, message.payload, message.qos) == ("out/1", b"guaranteed", 1)


@pytest.mark.parametrize("how", ["stop", "node stops"])
async def test_a_stopping_bridge_writes_what_it_took_and_says_goodbye(
    mosquitto: Mosquitto, how: str
) -> None:
    # Before, a bridge's stop (or its node's) cut the connection: what it had taken for
    # the broker was lost, and without a DISCONNECT the broker saw the bridge fail (as
    # it would publish a will for) rather than leave.
    observer = Paho(mosquitto.port, "observer", V5)
    await observer.connect()
    await observer.subscribe(("site/#", 0))
    mappings = [TopicMapping("plant/>", mode="PUB", destination="site/{2-#}")]
    async with Node(name="edge") as node:
        bridge = await _open(node, mosquitto, 5, topics=mappings)
        local = node.connect(client_name="local")
        for i in range(200):
            local.publish(f"plant/m{i}", b"%d" % i)
        if how == "stop":
            bridge.stop()
            await bridge.link.aclose()
    got = await observer.receive_many(200)
    assert sorted(int(m.payload) for m in got) == list(range(200))
    client_id = bridge.link.client_id  # type: ignore[attr-defined]
    await eventually(lambda: f"Received DISCONNECT from {client_id}" in mosquitto.log.read_text())


async def test_the_broker_refusing_the_login_is_a_connect_failure(mosquitto: Mosquitto) -> None:
    mosquitto.stop()
    mosquitto.config.write_text(
        mosquitto.config.read_text().replace("allow_anonymous true", "allow_anonymous false")
    )
    mosquitto.start()
    async with Node(name="edge") as node:
        bridge = open_bridge(
            node.vpn(),
            BridgeSettings("cloud", remotes=[mosquitto.url], subscriptions=["a/>"]),
        )
        with anyio.fail_after(10):
            await bridge.wait_for(LinkState.BACKOFF)
        assert bridge.statistics().connect_failures >= 1
        assert "refused" in bridge.link.reason


async def test_mixing_mqtt_brokers_and_meshbus_nodes_is_refused() -> None:
    settings = BridgeSettings("x", remotes=["mqtt://127.0.0.1:1883", "tcp://127.0.0.1:55555"])
    async with Node() as node:
        with pytest.raises(ConfigurationError, match="all MQTT brokers or all meshbus nodes"):
            open_bridge(node.vpn(), settings)


def test_a_bridge_to_a_broker_is_configured_in_the_file(tmp_path: Path) -> None:
    from meshbus.app._config import parse_config
    from meshbus.plugins.mqtt import MqttBridgeOptions, MqttRemote

    bridge = {
        "name": "cloud",
        "remotes": ["mqtt://broker-1:1883", {"url": "mqtts://broker-2", "username": "edge"}],
        "mqtt": {"protocol": 4, "client_id": "edge-7", "qos": 0},
        "topics": [{"filter": "plant/>", "mode": "PUB", "destination": "site/{2-#}"}],
    }
    config = parse_config({"vpns": {"default": {"bridges": [bridge]}}}, base_dir=tmp_path)
    ((_, (settings,)),) = config.vpns[0].sections
    assert settings.remotes == ("mqtt://broker-1:1883", MqttRemote("mqtts://broker-2", "edge"))
    assert settings.mqtt == MqttBridgeOptions(protocol=4, client_id="edge-7", qos=0)


def test_a_wrong_mqtt_bridge_table_lists_every_problem(tmp_path: Path) -> None:
    from meshbus.app._config import parse_config

    bridge = {
        "name": "cloud",
        "remotes": ["mqtt://", {"url": "mqtt://b", "window": 5}],
        "mqtt": {"protocol": 3, "qos": 2, "colour": "red"},
    }
    with pytest.raises(ConfigurationError) as failed:
        parse_config({"vpns": {"default": {"bridges": [bridge]}}}, base_dir=tmp_path)
    problems = "\n".join(failed.value.problems)
    assert "remotes[0]" in problems
    assert "remotes[1].url: an MQTT broker takes no compression or window" in problems
    assert "mqtt.protocol: must be 4 (MQTT 3.1.1) or 5, got 3" in problems
    assert "mqtt.qos: must be 0 or 1, got 2" in problems
    assert "mqtt.colour: unknown key" in problems


@pytest.mark.slow  # about 2 s: a broker, a node and clients, each a process of its own
async def test_meshbus_run_bridges_its_mqtt_devices_to_a_broker(
    mosquitto: Mosquitto, tmp_path: Path, anyio_backend: str
) -> None:
    """Devices on the node's MQTT listener and clients of the broker exchange messages
    through a bridge in the node's file, both ways, across three processes."""
    import sys

    from tests.plugins.dmr.test_dmr_processes import free_port
    from tests.processes import Child

    device_port = free_port()
    (tmp_path / "edge.toml").write_text(
        f"""
[node]
name = "edge"
data_dir = "spool"

[[mqtt.listeners]]
port = {device_port}

[[vpns.default.bridges]]
name = "cloud"
remotes = ["{mosquitto.url}"]
mqtt = {{ protocol = 5, client_id = "edge-1" }}
variables = {{ site = "s7" }}

[[vpns.default.bridges.topics]]
filter = "devices/>"
mode = "PUB"
destination = "${{site}}/{{2-#}}"

[[vpns.default.bridges.topics]]
filter = "commands/s7/>"
mode = "SUB"
destination = "commands/{{3-#}}"
""",
        encoding="utf-8",
    )
    # A free port for the node's own listener too: the default (55555) may be taken.
    listen = ["--listen", "127.0.0.1:0"]
    args = [sys.executable, "-m", "meshbus", "run", "edge.toml", "--loop", anyio_backend, *listen]
    child = Child(args, tmp_path)
    try:
        child.wait_for("meshbus run: node edge listening on ")
        cloud = Paho(mosquitto.port, "cloud-app", V5)
        await cloud.connect()
        await cloud.subscribe(("s7/#", 1))
        device = Paho(device_port, "meter-1", V5)
        with anyio.fail_after(15):  # the listener opens once the node runs
            while True:
                try:
                    await device.connect()
                    break
                except OSError:
                    await anyio.sleep(0.05)
        await device.subscribe(("commands/#", 1))
        with anyio.fail_after(15):  # the bridge logs in to the broker meanwhile
            while True:
                await device.publish("devices/meter-1/kwh", b"12", qos=1)
                try:
                    got = await cloud.receive(timeout=0.5)
                    break
                except Exception:  # nothing yet: the bridge was not in sync
                    continue
        assert (got.topic, got.payload) == ("s7/meter-1/kwh", b"12")
        await cloud.publish("commands/s7/meter-1/reset", b"now", qos=1)
        command = await device.receive()
        assert (command.topic, command.payload, command.qos) == (
            "commands/meter-1/reset",
            b"now",
            1,
        )
    finally:
        child.close()
