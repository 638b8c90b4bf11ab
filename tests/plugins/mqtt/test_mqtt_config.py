"""MQTT listeners in the node configuration file: ``[[mqtt.listeners]]`` (SPEC 13).

A valid table builds the listeners' settings (a ``tls`` table makes the default port
8883) and a provisioned node serves them; every mistake is reported at its key path,
all at once. The last test starts ``meshbus run`` as a process of its own and moves
messages between an MQTT client and native sessions through it.
"""

from __future__ import annotations

import signal
import ssl
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import attrs
import orjson
import pytest

from meshbus import ConfigurationError
from meshbus.app._config import load_config
from meshbus.plugins.mqtt import (
    DEFAULT_MQTT_PORT,
    DEFAULT_MQTTS_PORT,
    MqttListenerSettings,
    listeners_of,
)
from meshbus.transports import connect
from tests.processes import Child, free_port

from ._clients import V5, V311, Paho

Problems = Callable[[str], list[str]]

CONNECT_311 = bytes.fromhex("100c00044d5154540402003c0000")  # clean session, empty id


@pytest.fixture
def problems(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Problems:
    """Write ``edge.toml`` in a fresh current folder, load it and build its node; the
    problems reported (none: the file is valid)."""
    monkeypatch.chdir(tmp_path)

    def check(text: str) -> list[str]:
        Path("edge.toml").write_text(text, encoding="utf-8")
        try:
            load_config("edge.toml", environ={}).build_node()
        except ConfigurationError as exc:
            return list(exc.problems)
        return []

    return check


def tls_table(certs: Path) -> str:
    return (
        "[mqtt.listeners.tls]\n"
        f'certificate = "{certs / "server.pem"}"\n'
        f'private_key = "{certs / "server-key.pem"}"\n'
    )


# --- a valid table ---------------------------------------------------------------------------


def test_listeners_in_the_file(tmp_path: Path, certs: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text(
        f"""
[[mqtt.listeners]]
port = 1884

[[mqtt.listeners]]
host = "0.0.0.0"
vpn = "plant"
name = "devices"
max_packet_size = 4096
connect_timeout = 2.5
receive_maximum = 10
{tls_table(certs)}
[[mqtt.listeners]]
port = 8884
vpn = "plant"
{tls_table(certs)}
[vpns.default]
[vpns.plant]
authentication = "basic"
""",
        encoding="utf-8",
    )
    config = load_config(path, environ={})
    plain, secure, explicit = config.section("mqtt")
    assert plain == MqttListenerSettings(port=1884)
    assert secure.port == DEFAULT_MQTTS_PORT  # a tls table makes 8883 the default
    assert secure.tls is not None
    assert secure.tls.certificate == certs / "server.pem"
    assert secure.tls.private_key == certs / "server-key.pem"
    assert attrs.evolve(secure, tls=None) == MqttListenerSettings(
        host="0.0.0.0",
        port=DEFAULT_MQTTS_PORT,
        vpn="plant",
        name="devices",
        max_packet_size=4096,
        connect_timeout=2.5,
        receive_maximum=10,
    )
    assert (explicit.port, explicit.tls) == (8884, secure.tls)
    assert secure.label == "devices"
    assert explicit.label == "mqtts://127.0.0.1:8884"
    config.build_node()  # every listener names a VPN the node has


def test_no_mqtt_table_is_no_listener(tmp_path: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text("[node]\nname = 'quiet'\n", encoding="utf-8")
    assert load_config(path, environ={}).section("mqtt") is None
    path.write_text("[mqtt]\nlisteners = []\n", encoding="utf-8")
    assert load_config(path, environ={}).section("mqtt") == ()
    assert MqttListenerSettings().port == DEFAULT_MQTT_PORT


async def test_a_provisioned_node_serves_its_listeners(tmp_path: Path, certs: Path) -> None:
    path = tmp_path / "edge.toml"
    path.write_text(
        f"[[mqtt.listeners]]\nport = 0\n\n[[mqtt.listeners]]\nport = 0\n{tls_table(certs)}",
        encoding="utf-8",
    )
    config = attrs.evolve(load_config(path, environ={}), data_dir=tmp_path / "data")
    node = config.build_node()
    async with node:
        await config.provision(node)
        plain, secure = listeners_of(node)
        assert plain.url.startswith("mqtt://127.0.0.1:")
        assert secure.url.startswith("mqtts://127.0.0.1:")
        native = node.connect(client_name="native")
        native.subscribe("cfg/>")
        client = Paho(plain.port, "plain-client", V5)
        await client.connect()
        await client.publish("cfg/plain", b"1", qos=1)
        await client.disconnect()
        # The TLS listener: a handshake with the CA's trust, then a 3.1.1 login.
        context = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        with anyio.fail_after(10):
            stream = await anyio.connect_tcp(
                "127.0.0.1",
                secure.port,
                tls=True,
                ssl_context=context,
                tls_hostname="localhost",
                tls_standard_compatible=False,  # as the listener: no close_notify
            )
            async with stream:
                await stream.send(CONNECT_311)
                assert await stream.receive() == b"\x20\x02\x00\x00"  # accepted
                await stream.send(b"\xe0\x00")  # DISCONNECT
        assert secure.statistics().logins == 1
        message = native.receive_nowait()
        assert message is not None
        assert (message.topic, message.sender) == ("cfg/plain", "plain-client")


# --- mistakes, each at its key --------------------------------------------------------------


def test_an_unknown_key_is_named_with_a_suggestion(problems: Problems) -> None:
    assert problems("[mqtt]\nlistener = []\n") == [
        "edge.toml: mqtt.listener: unknown key (did you mean 'listeners'?)"
    ]
    prot, backlog = problems("[[mqtt.listeners]]\nprot = 1884\nbacklog = 5\n")
    assert prot == "edge.toml: mqtt.listeners[0].prot: unknown key (did you mean 'port'?)"
    assert backlog.startswith(
        "edge.toml: mqtt.listeners[0].backlog: unknown key (expected one of: host, port, vpn, "
    )


def test_bad_values(problems: Problems) -> None:
    found = problems(
        """
[[mqtt.listeners]]
port = 70000

[[mqtt.listeners]]
port = -1
max_packet_size = 10
connect_packet_size = 100
connect_timeout = 0
max_unauthenticated = 0
receive_maximum = 65536
"""
    )
    assert found == [
        "edge.toml: mqtt.listeners[0].port: must be an integer from 0 to 65535, got 70000",
        "edge.toml: mqtt.listeners[1].port: must be an integer from 0 to 65535, got -1",
        "edge.toml: mqtt.listeners[1].max_packet_size: must be an integer >= 1024, got 10",
        "edge.toml: mqtt.listeners[1].connect_packet_size: must be an integer >= 128, got 100",
        "edge.toml: mqtt.listeners[1].connect_timeout: must be a positive number, got 0",
        "edge.toml: mqtt.listeners[1].max_unauthenticated: must be an integer >= 1, got 0",
        "edge.toml: mqtt.listeners[1].receive_maximum: "
        "must be an integer from 1 to 65535, got 65536",
    ]


def test_wrong_types(problems: Problems) -> None:
    assert problems("mqtt = 3\n") == ["edge.toml: mqtt: expected a table, got integer 3"]
    assert problems("[mqtt]\nlisteners = { port = 1 }\n") == [
        "edge.toml: mqtt.listeners: expected an array of tables ([[mqtt.listeners]])"
    ]
    assert problems("[mqtt]\nlisteners = [1, 'x']\n") == [
        "edge.toml: mqtt.listeners[0]: expected a table, got integer 1",
        "edge.toml: mqtt.listeners[1]: expected a table, got string 'x'",
    ]
    assert problems('[[mqtt.listeners]]\nport = "1883"\nhost = 1\nvpn = true\n') == [
        "edge.toml: mqtt.listeners[0].port: expected an integer, got string '1883'",
        "edge.toml: mqtt.listeners[0].host: expected a string, got integer 1",
        "edge.toml: mqtt.listeners[0].vpn: expected a string, got boolean true",
    ]


def test_a_vpn_that_is_not_configured(problems: Problems) -> None:
    assert problems('[[mqtt.listeners]]\nvpn = "plant"\n') == [
        "edge.toml: mqtt.listeners: no VPN named 'plant'"
    ]
    # Listed VPNs replace the open default one: a listener must name one of them.
    assert problems("[[mqtt.listeners]]\nport = 1884\n\n[vpns.plant]\n") == [
        "edge.toml: mqtt.listeners: no VPN named 'default'"
    ]


def test_two_listeners_on_one_host_and_port(problems: Problems) -> None:
    found = problems(
        """
[[mqtt.listeners]]
port = 1884
[[mqtt.listeners]]
port = 1884
[[mqtt.listeners]]
host = "10.0.0.1"
port = 1884
[[mqtt.listeners]]
port = 0
[[mqtt.listeners]]
port = 0
"""
    )
    assert found == [
        "edge.toml: mqtt.listeners[1].port: "
        "127.0.0.1:1884 is used twice (an MQTT listener listens there too)"
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (
            '[[mqtt.listeners]]\nhost = "0.0.0.0"\nport = 1884\n[[mqtt.listeners]]\nport = 1884\n',
            "mqtt.listeners[1].port: "
            "127.0.0.1:1884 is used twice (an MQTT listener listens there too)",
        ),
        (
            "[[listeners]]\nport = 1884\n[[mqtt.listeners]]\nport = 1884\n",
            "mqtt.listeners[0].port: "
            "127.0.0.1:1884 is used twice (a node listener listens there too)",
        ),
        (
            "[[mqtt.listeners]]\nport = 55555\n",  # no [[listeners]]: the default one
            "mqtt.listeners[0].port: "
            "127.0.0.1:55555 is used twice (the node's listener listens there too)",
        ),
    ],
    ids=["wildcard overlap", "a node listener's port", "the default node listener's port"],
)
def test_a_port_used_twice_across_hosts_or_listener_kinds(
    problems: Problems, text: str, problem: str
) -> None:
    """Found failing only when ``meshbus run`` bound the second listener; reported by
    the file's check since c17c86b."""
    assert problems(text) == [f"edge.toml: {problem}"]


def test_tls_problems(problems: Problems, tmp_path: Path, certs: Path) -> None:
    (tmp_path / "junk.pem").write_text("not a certificate", encoding="utf-8")
    found = problems(
        f"""
[[mqtt.listeners]]
[mqtt.listeners.tls]
certificate = "{certs / "server.pem"}"

[[mqtt.listeners]]
port = 8884
[mqtt.listeners.tls]
certificate = "missing.pem"
private_key = "{certs / "server-key.pem"}"

[[mqtt.listeners]]
port = 8885
[mqtt.listeners.tls]
certificate = "junk.pem"
private_key = "junk.pem"
"""
    )
    assert found[:2] == [
        "edge.toml: mqtt.listeners[0].tls: missing required key 'private_key'",
        f"edge.toml: mqtt.listeners[1].tls.certificate: no such file: {tmp_path}/missing.pem",
    ]
    assert len(found) == 3, found
    assert found[2].startswith("edge.toml: mqtt.listeners[2].tls: TLS settings are not usable")


def test_every_mistake_is_reported_at_once(problems: Problems) -> None:
    found = problems(
        """
[[mqtt.listeners]]
port = 99999
[[mqtt.listeners]]
max_keepalive = "long"
[[mqtt.listeners]]
tls = 1
"""
    )
    assert found == [
        "edge.toml: mqtt.listeners[0].port: must be an integer from 0 to 65535, got 99999",
        "edge.toml: mqtt.listeners[1].max_keepalive: expected an integer, got string 'long'",
        "edge.toml: mqtt.listeners[2].tls: expected a table, got integer 1",
    ]


def test_an_unknown_key_does_not_hide_the_listeners_problems(problems: Problems) -> None:
    """It did, before c17c86b: the table was not read on after an unknown key."""
    found = problems('[mqtt]\ncolour = "blue"\n[[mqtt.listeners]]\nport = 99999\n')
    assert found == [
        "edge.toml: mqtt.colour: unknown key (expected one of: listeners)",
        "edge.toml: mqtt.listeners[0].port: must be an integer from 0 to 65535, got 99999",
    ]


# --- meshbus run ------------------------------------------------------------------------------

RUNNING = "meshbus run: node mq listening on "


@attrs.frozen
class Running:
    child: Child
    url: str
    """The node's own listener, for native clients."""
    mqtt_port: int


@pytest.fixture
def running(tmp_path: Path, anyio_backend: str) -> Iterator[Running]:
    """``meshbus run`` serving a file with one node listener and one MQTT listener."""
    mqtt_port = free_port()
    (tmp_path / "node.toml").write_text(
        f"""
[node]
name = "mq"
data_dir = "spool"

[[listeners]]
port = 0

[[mqtt.listeners]]
port = {mqtt_port}
""",
        encoding="utf-8",
    )
    args = [sys.executable, "-m", "meshbus", "run", "node.toml", "--loop", anyio_backend]
    child = Child(args, tmp_path)
    try:
        (line,) = child.wait_for(RUNNING)
        yield Running(child, line.removeprefix(RUNNING), mqtt_port)
    finally:
        child.close()


@pytest.mark.slow  # about 1 s: a node and a meshbus sub, each its own process
@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
async def test_meshbus_run_serves_mqtt_clients_beside_native_ones(
    running: Running, protocol: int
) -> None:
    options = ["--url", running.url, "--client-name", "cli", "-C", "2", "-F", "json"]
    sub = await anyio.open_process([sys.executable, "-m", "meshbus", "sub", *options, "devices/>"])
    try:
        async with connect(running.url, client_name="remote", reconnect=False) as remote:
            remote.subscribe("devices/>")
            await remote.confirm()
            assert sub.stderr is not None
            with anyio.fail_after(15):  # "subscribed to devices/>" on its standard error
                said = b""
                while b"subscribed to devices/>" not in said:
                    said += await sub.stderr.receive()
            device = Paho(running.mqtt_port, "meter-1", protocol)
            await device.connect()
            await device.subscribe(("devices/#", 1))
            await device.publish("devices/meter-1/kwh", b"12", qos=0)
            await device.publish("devices/meter-1/alarm", b"high", qos=1)
            with anyio.fail_after(15):
                got = [await remote.receive() for _ in range(2)]
            assert [(m.topic, m.payload, m.sender) for m in got] == [
                ("devices/meter-1/kwh", b"12", "meter-1"),
                ("devices/meter-1/alarm", b"high", "meter-1"),
            ]
            mine = await device.receive_many(2)  # its own subscription matches them too
            assert sorted((m.topic, m.payload) for m in mine) == [
                ("devices/meter-1/alarm", b"high"),
                ("devices/meter-1/kwh", b"12"),
            ]
            remote.publish("devices/meter-1/set", b"off")  # and the other way
            reply = await device.receive()
            assert (reply.topic, reply.payload) == ("devices/meter-1/set", b"off")
            figures = (await remote.node_statistics())["plugins"]["default"]["mqtt"]
            (counts,) = figures["listeners"].values()
            assert (counts["logins"], counts["received"]) == (1, 2)
            await device.disconnect()
        with anyio.fail_after(15):
            assert await sub.wait() == 0
        assert sub.stdout is not None
        out = b""
        with anyio.fail_after(15):
            while True:
                try:
                    out += await sub.stdout.receive()
                except anyio.EndOfStream:
                    break
        lines = [orjson.loads(line) for line in out.splitlines()]
        assert [(m["topic"], m["payload"], m["sender"]) for m in lines] == [
            ("devices/meter-1/kwh", "12", "meter-1"),
            ("devices/meter-1/alarm", "high", "meter-1"),
        ]
    finally:
        with anyio.CancelScope(shield=True):
            if sub.returncode is None:
                sub.kill()
            await sub.aclose()
    status = await anyio.to_thread.run_sync(running.child.finish, signal.SIGTERM)
    assert status == 0, running.child.stderr_lines  # it stops cleanly
    assert running.child.stdout_lines[-1] == "meshbus run: stopping (SIGTERM)"


@pytest.mark.slow  # about 1 s: a node in a process of its own
async def test_meshbus_run_of_an_mqtt_only_node_prints_its_mqtt_listener(
    tmp_path: Path, anyio_backend: str
) -> None:
    # `listeners = []`: no native listener (none on the default port either). The
    # MQTT listener has its line like the native ones, and nothing warns that only
    # in-process sessions can reach the node. Before, such a node printed no line.
    (tmp_path / "node.toml").write_text(
        'listeners = []\n[node]\nname = "mq"\ndata_dir = "spool"\n'
        '[[mqtt.listeners]]\nhost = "127.0.0.1"\nport = 0\n',
        encoding="utf-8",
    )
    args = [sys.executable, "-m", "meshbus", "run", "node.toml", "--loop", anyio_backend]
    child = Child(args, tmp_path)
    try:
        (line,) = await anyio.to_thread.run_sync(child.wait_for, RUNNING)
        url = line.removeprefix(RUNNING)
        assert url.startswith("mqtt://127.0.0.1:"), url
        device = Paho(int(url.rsplit(":", 1)[1]), "meter-1", V5)
        await device.connect()
        await device.disconnect()
        status = await anyio.to_thread.run_sync(child.finish, signal.SIGTERM)
    finally:
        child.close()
    assert status == 0, child.stderr_lines
    assert child.stdout_lines == [RUNNING + url, "meshbus run: stopping (SIGTERM)"]
    assert not [x for x in child.stderr_lines if "no listeners" in x], child.stderr_lines
