"""``meshbus run``: serve a node from a configuration file until SIGINT or SIGTERM.

The serving tests run the real command in a subprocess (it owns its event loop and
its signal handlers); the configuration paths are also checked in-process.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anyio
import anyio.to_thread
import pytest

from meshbus import AuthenticationError, available_plugins
from meshbus.app._run import add_parser, main, parse_address, run
from meshbus.transports import connect
from meshbus.transports.certs import make_ca, make_server_certificate
from tests.processes import WAIT, Child

#: What the unknown-plugin problems list as installed (every plugin entry point).
INSTALLED = ", ".join(sorted(available_plugins()))

LISTENING = "meshbus run: node {name} listening on "


class Command(Child):
    """``python -m meshbus run ARGS`` in ``cwd``, its output read line by line."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        super().__init__([sys.executable, "-m", "meshbus", "run", *args], cwd)


Start = Callable[[list[str], Path], Command]


@pytest.fixture
def command() -> Iterator[Start]:
    """Start commands with ``command(args, cwd)``; each is killed if still running."""
    started: list[Command] = []

    def start(args: list[str], cwd: Path) -> Command:
        started.append(Command(args, cwd))
        return started[-1]

    yield start
    for cmd in started:
        cmd.close()


def write_config(folder: Path, text: str) -> Path:
    path = folder / "edge.toml"
    path.write_text(text, encoding="utf-8")
    return path


BAD_CONFIG = """
[node]
plugins = ["direct", "guaranted"]
[[listeners]]
port = 70000
[vpns.default.users.alice]
client_profile = "gold"
"""

BAD_PROBLEMS = [
    "meshbus run: invalid configuration edge.toml:",
    "  edge.toml: node.plugins[1]: unknown plugin 'guaranted' (did you mean 'guaranteed'?); "
    f"installed: {INSTALLED}",
    "  edge.toml: listeners[0].port: must be an integer from 0 to 65535, got 70000",
    "  edge.toml: vpns.default.users.alice.client_profile: "
    "no client profile named 'gold' in VPN 'default'",
]


# --- the command, in a subprocess ----------------------------------------------------------


def test_serves_the_configuration_until_sigterm(command: Start, tmp_path: Path) -> None:
    write_config(
        tmp_path,
        """
        [node]
        name = "edge-test"
        data_dir = "spool"
        [[listeners]]
        port = 0
        [vpns.default.queues.orders]
        subscriptions = ["orders/>"]
        """,
    )
    cmd = command(["edge.toml"], tmp_path)
    (line,) = cmd.wait_for(LISTENING.format(name="edge-test"))
    address = line.removeprefix(LISTENING.format(name="edge-test"))
    assert address.startswith("tcp://127.0.0.1:")
    port = int(address.rpartition(":")[2])
    assert port > 0
    socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()
    assert (tmp_path / "spool").is_dir()

    assert cmd.finish(signal.SIGTERM) == 0
    assert cmd.stdout_lines[-1] == "meshbus run: stopping (SIGTERM)"
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()


async def test_remote_clients_log_in_as_the_configuration_says(
    command: Start, tmp_path: Path
) -> None:
    write_config(
        tmp_path,
        """
        [[listeners]]
        port = 0
        [vpns.plant]
        authentication = "basic"
        [vpns.plant.users.sensor]
        password = "${ENV:HOME}-secret"
        [vpns.plant.queues.alarms]
        subscriptions = ["alarms/>"]
        """,
    )
    cmd = command(["edge.toml"], tmp_path)
    (line,) = await anyio.to_thread.run_sync(cmd.wait_for, LISTENING.format(name="meshbus"))
    url = line.removeprefix(LISTENING.format(name="meshbus"))
    password = f"{os.environ['HOME']}-secret"

    with pytest.raises(AuthenticationError):
        async with connect(url, vpn="plant", username="sensor", password="guess", reconnect=False):
            pass
    async with connect(url, vpn="plant", username="sensor", password=password) as session:
        await session.send("alarms/boiler", b"too hot")
        flow = await session.bind("alarms")
        with anyio.fail_after(WAIT):
            message = await flow.receive()
        assert message.payload == b"too hot"
        flow.ack(message)
        await flow.unbind()

    assert await anyio.to_thread.run_sync(cmd.finish, signal.SIGTERM) == 0


def test_sigint_stops_it_too(command: Start, tmp_path: Path) -> None:
    cmd = command(["--listen", "127.0.0.1:0"], tmp_path)
    cmd.wait_for(LISTENING.format(name="meshbus"))
    assert cmd.finish(signal.SIGINT) == 0
    assert cmd.stdout_lines[-1] == "meshbus run: stopping (SIGINT)"


def test_a_tls_listener_is_announced_as_tls(command: Start, tmp_path: Path, certs: Path) -> None:
    write_config(
        tmp_path,
        f"""
        [[listeners]]
        port = 0
        [listeners.tls]
        certificate = "{certs}/server.pem"
        private_key = "{certs}/server-key.pem"
        [[listeners]]
        port = 0
        """,
    )
    cmd = command([str(tmp_path / "edge.toml")], tmp_path)
    first, second = cmd.wait_for(LISTENING.format(name="meshbus"), count=2)
    assert first.startswith(LISTENING.format(name="meshbus") + "tls://127.0.0.1:")
    assert second.startswith(LISTENING.format(name="meshbus") + "tcp://127.0.0.1:")
    assert cmd.finish(signal.SIGTERM) == 0


def test_an_invalid_configuration_prints_every_problem_and_starts_nothing(
    command: Start, tmp_path: Path
) -> None:
    write_config(tmp_path, BAD_CONFIG)
    cmd = command(["edge.toml"], tmp_path)
    assert cmd.finish() == 2
    assert cmd.stdout_lines == []
    assert cmd.stderr_lines == BAD_PROBLEMS
    assert not (tmp_path / "meshbus-data").exists()


def test_without_a_file_it_serves_the_defaults_in_the_current_folder(
    command: Start, tmp_path: Path
) -> None:
    cmd = command(["--listen", "127.0.0.1:0"], tmp_path)
    (line,) = cmd.wait_for(LISTENING.format(name="meshbus"))
    assert line.startswith(LISTENING.format(name="meshbus") + "tcp://127.0.0.1:")
    assert (tmp_path / "meshbus-data").is_dir()
    assert cmd.finish(signal.SIGTERM) == 0


def test_listen_replaces_the_configured_listeners(
    command: Start, tmp_path: Path, certs: Path
) -> None:
    write_config(
        tmp_path,
        f"""
        [[listeners]]
        port = 1
        [[listeners]]
        port = 2
        [listeners.tls]
        certificate = "{certs}/server.pem"
        private_key = "{certs}/server-key.pem"
        """,
    )
    cmd = command(["edge.toml", "--listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"], tmp_path)
    lines = cmd.wait_for(LISTENING.format(name="meshbus"), count=2)
    assert all("tcp://127.0.0.1:" in line for line in lines)
    assert cmd.finish(signal.SIGTERM) == 0
    assert sum(line.startswith("meshbus run: node") for line in cmd.stdout_lines) == 2


def test_a_port_in_use_fails_with_status_1(command: Start, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = command(["--listen", f"127.0.0.1:{port}"], tmp_path)
        assert cmd.finish() == 1
    assert any(
        line.startswith("meshbus run: ") and f"127.0.0.1:{port}" in line
        for line in cmd.stderr_lines
    ), cmd.stderr_lines


def test_a_bad_listen_address_is_a_usage_error(command: Start, tmp_path: Path) -> None:
    cmd = command(["--listen", "localhost"], tmp_path)
    assert cmd.finish() == 2
    assert "HOST:PORT" in "\n".join(cmd.stderr_lines)


# --- the same paths, in-process -------------------------------------------------------------


def test_main_prints_every_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    write_config(tmp_path, BAD_CONFIG)
    monkeypatch.chdir(tmp_path)
    assert main("edge.toml", ["127.0.0.1:0"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == BAD_PROBLEMS


def test_main_reports_a_missing_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main("nowhere.toml") == 2
    assert capsys.readouterr().err.splitlines() == [
        "meshbus run: invalid configuration nowhere.toml:",
        "  nowhere.toml: cannot read the file: No such file or directory",
    ]


def test_main_refuses_a_bad_listen_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(None, ["127.0.0.1:99999"]) == 2
    assert capsys.readouterr().err == (
        "meshbus run: --listen: expected HOST:PORT with a port from 0 to 65535, "
        "got '127.0.0.1:99999'\n"
    )


def test_the_parser_feeds_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="meshbus")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["run", "edge.toml", "--listen", "[::1]:0", "--listen", "h:1"])
    assert (args.command, args.config, args.listen) == ("run", "edge.toml", ["[::1]:0", "h:1"])
    assert args.log_level == "info"
    assert parser.parse_args(["run"]).config is None
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["run", "--listen", "nonsense"])
    assert exc.value.code == 2
    assert "--listen: expected HOST:PORT" in capsys.readouterr().err

    configured: list[object] = []
    monkeypatch.setattr("meshbus.app._run.configure_logging", lambda *a: configured.append(a))
    write_config(tmp_path, BAD_CONFIG)
    monkeypatch.chdir(tmp_path)
    assert run(args) == 2
    assert configured == [("info", "text", None)]
    assert capsys.readouterr().err.splitlines() == BAD_PROBLEMS


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1:0", ("127.0.0.1", 0)),
        ("0.0.0.0:55555", ("0.0.0.0", 55555)),
        ("[::1]:80", ("::1", 80)),
        ("edge.local:65535", ("edge.local", 65535)),
    ],
)
def test_parse_address(text: str, address: tuple[str, int]) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["", "host", ":80", "host:", "host:http", "host:65536", "h:-1"])
def test_parse_address_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_address(text)


def test_the_node_process_tunes_its_garbage_collector(command: Start, tmp_path: Path) -> None:
    """A node makes many short-lived objects per message: its process raises the
    collector's first threshold once the listeners are up (app/_collector.py)."""
    cmd = command(["--listen", "127.0.0.1:0", "--log-level", "debug"], tmp_path)
    cmd.wait_for("meshbus run: node ")
    assert cmd.finish(signal.SIGTERM) == 0
    tuned = [line for line in cmd.stderr_lines if "garbage collector: thresholds" in line]
    assert len(tuned) == 1, cmd.stderr_lines
    assert "(50000, 20, 20)" in tuned[0]


async def test_sighup_reloads_the_file_and_refuses_a_broken_one(
    command: Start, tmp_path: Path
) -> None:
    text = """
        [[listeners]]
        port = 0
        [vpns.plant]
        authentication = "basic"
        [vpns.plant.users.sensor]
        password = "first"
        """
    write_config(tmp_path, text)
    cmd = command(["edge.toml"], tmp_path)
    (line,) = await anyio.to_thread.run_sync(cmd.wait_for, LISTENING.format(name="meshbus"))
    url = line.removeprefix(LISTENING.format(name="meshbus"))

    write_config(tmp_path, text + "[vpns.plant.users.other\n")
    cmd.process.send_signal(signal.SIGHUP)
    with anyio.fail_after(WAIT):
        while not any(line.startswith("  edge.toml:") for line in cmd.stderr_lines):
            await anyio.sleep(0.05)
    write_config(tmp_path, text.replace('"first"', '"second"'))
    cmd.process.send_signal(signal.SIGHUP)
    (line,) = await anyio.to_thread.run_sync(cmd.wait_for, "meshbus run: reloaded")
    assert line == "meshbus run: reloaded edge.toml: 1 change"

    with pytest.raises(AuthenticationError):
        async with connect(url, vpn="plant", username="sensor", password="first", reconnect=False):
            pass
    async with connect(url, vpn="plant", username="sensor", password="second", reconnect=False):
        pass
    assert await anyio.to_thread.run_sync(cmd.finish, signal.SIGTERM) == 0
    printed = [line for line in cmd.stderr_lines if line.startswith(("meshbus", "  "))]
    assert printed == [
        "meshbus run: reload of edge.toml refused, nothing changed: invalid configuration "
        "edge.toml: 1 problem:",
        "  edge.toml: line 8, column 32: invalid TOML: Expected ']' at the end of a table "
        "declaration",
    ]


def test_sighup_without_a_file_says_there_is_nothing_to_reload(
    command: Start, tmp_path: Path
) -> None:
    cmd = command(["--listen", "127.0.0.1:0"], tmp_path)
    cmd.wait_for(LISTENING.format(name="meshbus"))
    cmd.process.send_signal(signal.SIGHUP)
    said = "meshbus run: SIGHUP: no configuration file to reload"
    deadline = time.monotonic() + WAIT
    while said not in cmd.stderr_lines:  # before SIGTERM: two signals have no order
        assert time.monotonic() < deadline, cmd.stderr_lines
        time.sleep(0.05)
    assert cmd.finish(signal.SIGTERM) == 0


async def handshake(url: str, ca: Path) -> bool:
    """Whether a TLS handshake with the listener at ``url``, trusting only ``ca``, works."""
    import ssl

    host, _, port = url.partition("://")[2].rpartition(":")
    context = ssl.create_default_context(cafile=str(ca))
    try:
        stream = await anyio.connect_tcp(host, int(port), tls=True, ssl_context=context)
    except (OSError, ssl.SSLError, anyio.BrokenResourceError):
        return False
    await anyio.aclose_forcefully(stream)
    return True


async def test_sighup_reads_rotated_certificates_of_every_tls_listener(
    command: Start, tmp_path: Path
) -> None:
    # Certificates are rotated in place (same paths): the file's text does not change,
    # yet new handshakes must use the new certificate, on the node's and MQTT listeners.
    old, new, live = tmp_path / "old", tmp_path / "new", tmp_path / "live"
    for folder in (old, new):
        make_ca(folder)
        make_server_certificate(folder, hosts=["127.0.0.1"])
    live.mkdir()

    def install(source: Path) -> None:
        for name in ("server.pem", "server-key.pem"):
            (live / name).write_bytes((source / name).read_bytes())

    install(old)
    tls = '[listeners.tls]\ncertificate = "live/server.pem"\nprivate_key = "live/server-key.pem"'
    write_config(
        tmp_path,
        f"[[listeners]]\nport = 0\n{tls}\n[[mqtt.listeners]]\nport = 0\n"
        + tls.replace("[listeners.tls]", "[mqtt.listeners.tls]"),
    )
    cmd = command(["edge.toml"], tmp_path)
    lines = await anyio.to_thread.run_sync(cmd.wait_for, LISTENING.format(name="meshbus"), 2)
    urls = [line.removeprefix(LISTENING.format(name="meshbus")) for line in lines]
    assert [url.partition(":")[0] for url in urls] == ["tls", "mqtts"]
    assert [await handshake(url, old / "ca.pem") for url in urls] == [True, True]

    install(new)
    cmd.process.send_signal(signal.SIGHUP)
    (line,) = await anyio.to_thread.run_sync(cmd.wait_for, "meshbus run: reloaded")
    assert line == (
        "meshbus run: reloaded edge.toml: 0 changes; certificates read again for 2 TLS listener(s)"
    )
    assert [await handshake(url, new / "ca.pem") for url in urls] == [True, True]
    assert [await handshake(url, old / "ca.pem") for url in urls] == [False, False]

    (live / "server-key.pem").write_bytes((old / "server-key.pem").read_bytes())  # wrong key
    cmd.process.send_signal(signal.SIGHUP)
    with anyio.fail_after(WAIT):
        while not any("refused" in line for line in cmd.stderr_lines):
            await anyio.sleep(0.05)
    assert [await handshake(url, new / "ca.pem") for url in urls] == [True, True]
    assert await anyio.to_thread.run_sync(cmd.finish, signal.SIGTERM) == 0


async def test_sighup_opens_and_closes_mqtt_listeners(command: Start, tmp_path: Path) -> None:
    from tests.plugins.mqtt._clients import V5, Paho

    probes = [socket.socket() for _ in range(2)]
    for probe in probes:
        probe.bind(("127.0.0.1", 0))
    first, second = (probe.getsockname()[1] for probe in probes)
    for probe in probes:
        probe.close()
    write_config(tmp_path, f"listeners = []\n[[mqtt.listeners]]\nport = {first}\n")
    cmd = command(["edge.toml"], tmp_path)
    (line,) = await anyio.to_thread.run_sync(cmd.wait_for, LISTENING.format(name="meshbus"))
    assert line.endswith(f"mqtt://127.0.0.1:{first}")

    write_config(
        tmp_path, f"listeners = []\n[[mqtt.listeners]]\nport = {second}\nwebsocket = true\n"
    )
    cmd.process.send_signal(signal.SIGHUP)
    (line,) = await anyio.to_thread.run_sync(cmd.wait_for, "meshbus run: reloaded")
    assert line == "meshbus run: reloaded edge.toml: 1 change"
    said = [line for line in cmd.stdout_lines if "listening on" in line]
    assert said[1:] == [
        f"meshbus run: node meshbus no longer listening on mqtt://127.0.0.1:{first}",
        f"meshbus run: node meshbus listening on ws://127.0.0.1:{second}/mqtt",
    ]
    browser = Paho(second, "browser", V5, transport="websockets")
    await browser.connect()
    await browser.disconnect()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", first), timeout=5).close()
    assert await anyio.to_thread.run_sync(cmd.finish, signal.SIGTERM) == 0
