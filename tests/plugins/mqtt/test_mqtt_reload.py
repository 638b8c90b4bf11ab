"""Reloading the configuration file changes a running node's MQTT listeners: a new
one opens, a removed one closes (its MQTT 5 clients told why), a changed one does
both, and the others keep their clients; a port that is taken refuses the reload
with nothing changed."""

from __future__ import annotations

import socket
import tomllib
from pathlib import Path

import mqtt5
import pytest

from meshbus import ConfigurationError
from meshbus.app._config import NodeConfig, parse_config
from meshbus.app._config_reload import reload_node
from meshbus.plugins.mqtt import MqttListenerSettings, listeners_of, start_mqtt_listener

from ._clients import V5, Paho
from ._raw import login

pytestmark = pytest.mark.anyio


def config(tmp_path: Path, text: str) -> NodeConfig:
    text = "listeners = []\n" + text  # MQTT alone: no node listener on 55555
    return parse_config(tomllib.loads(text), source="edge.toml", environ={}, base_dir=tmp_path)


def free_ports(count: int) -> list[int]:
    probes = [socket.socket() for _ in range(count)]
    try:
        for probe in probes:
            probe.bind(("127.0.0.1", 0))
        return [probe.getsockname()[1] for probe in probes]
    finally:
        for probe in probes:
            probe.close()


async def test_listeners_open_close_and_reopen_on_a_reload(tmp_path: Path) -> None:
    kept, changed, gone, added = free_ports(4)
    running = config(
        tmp_path,
        f"[[mqtt.listeners]]\nport = {kept}\n"
        f"[[mqtt.listeners]]\nport = {changed}\n"
        f"[[mqtt.listeners]]\nport = {gone}\n",
    )
    new = config(
        tmp_path,
        f"[[mqtt.listeners]]\nport = {kept}\n"
        f"[[mqtt.listeners]]\nport = {changed}\nmax_packet_size = 4096\n"
        f"[[mqtt.listeners]]\nport = {added}\nwebsocket = true\n",
    )
    node = running.build_node()
    async with node:
        await running.provision(node)
        # One opened through the API, which no file names: it stays.
        own = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        staying = Paho(kept, "staying", V5)
        await staying.connect()
        await staying.subscribe(("news/#", 1))
        moved = await login(changed, mqtt5.ConnectPacket("moved", clean_start=True).write())
        dropped = await login(gone, mqtt5.ConnectPacket("dropped", clean_start=True).write())

        assert await reload_node(node, running, new) == ["mqtt: changed"]

        for client in (moved, dropped):
            packets = await client.to_the_end()
            assert [(type(p), p.reason_code) for p in packets] == [  # type: ignore[attr-defined]
                (mqtt5.DisconnectPacket, 0x8B)
            ]
        urls = sorted(x.url for x in listeners_of(node))
        assert urls == sorted(
            [
                f"mqtt://127.0.0.1:{kept}",
                f"mqtt://127.0.0.1:{changed}",
                f"ws://127.0.0.1:{added}/mqtt",
                own.url,
            ]
        )
        reopened = next(x for x in listeners_of(node) if x.port == changed)
        assert reopened.settings.max_packet_size == 4096
        browser = Paho(added, "browser", V5, transport="websockets")
        await browser.connect()
        await browser.publish("news/1", b"through the new listener", qos=1)
        assert (await staying.receive()).payload == b"through the new listener"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", gone), timeout=5).close()
        for client in (browser, staying):
            await client.disconnect()


async def test_a_taken_port_refuses_the_reload_and_changes_nothing(tmp_path: Path) -> None:
    kept, taken = free_ports(2)
    running = config(tmp_path, f"[[mqtt.listeners]]\nport = {kept}\n")
    new = config(
        tmp_path,
        f'[[mqtt.listeners]]\nport = {kept}\nvpn = "default"\nname = "renamed"\n'
        f"[[mqtt.listeners]]\nport = {taken}\n",
    )
    node = running.build_node()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        async with node:
            await running.provision(node)
            before = listeners_of(node)
            with pytest.raises(ConfigurationError) as caught:
                await reload_node(node, running, new)
            assert listeners_of(node) == before
    (problem,) = caught.value.problems
    assert problem.startswith(f"edge.toml: mqtt.listeners[1].port: 127.0.0.1:{taken}: ")
    assert "in use" in problem


async def test_equal_listeners_are_counted_one_by_one(tmp_path: Path) -> None:
    # Two listeners with the same settings (a free port each), then one: one closes.
    twice = "[[mqtt.listeners]]\nport = 0\n" * 2
    running, new = config(tmp_path, twice), config(tmp_path, "[[mqtt.listeners]]\nport = 0\n")
    node = running.build_node()
    async with node:
        await running.provision(node)
        assert len(listeners_of(node)) == 2
        assert await reload_node(node, running, new) == ["mqtt: changed"]
        assert len(listeners_of(node)) == 1
        assert await reload_node(node, new, running) == ["mqtt: changed"]
        assert len(listeners_of(node)) == 2
