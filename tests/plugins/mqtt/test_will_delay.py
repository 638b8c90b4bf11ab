"""MQTT 5 will delay (3.1.2.5, 3.1.3.2): a will waits for its delay or for the end of
its session, whichever comes first; a client back within the delay cancels it; the
session's expiry counts from the disconnect, not from the will; and a will still
waiting is part of the session, so it outlives a restart of a node with a data
directory (the node publishes it when its time comes, unless the client came back).

Times run on a virtual clock; the clients are real paho clients on real sockets."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from meshbus import Node
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener
from meshbus.plugins.mqtt._listener import REGISTRY
from meshbus.plugins.mqtt._sessions import MqttSession
from meshbus.plugins.retained import retained_store
from meshbus.testing import ManualClock

from ._clients import V5, V311, Paho, eventually

pytestmark = pytest.mark.anyio

WILL = ("status/device", b"offline", 0, False)


@contextlib.asynccontextmanager
async def edge(clock: ManualClock, data_dir: Path | None = None) -> AsyncIterator[MqttListener]:
    async with Node(name="edge", clock=clock, data_dir=data_dir) as node:
        yield await start_mqtt_listener(node, MqttListenerSettings(port=0))


def delayed(seconds: int) -> Properties:
    properties = Properties(PacketTypes.WILLMESSAGE)
    properties.WillDelayInterval = seconds
    return properties


def session_of(listener: MqttListener, client_id: str) -> MqttSession | None:
    registry = listener.node.stash[REGISTRY]
    session: MqttSession | None = registry.get("default", client_id)
    return session


def mqtt_figures(listener: MqttListener) -> dict[str, Any]:
    node = listener.node
    figures = node.plugins.hook.meshbus_vpn_statistics(vpn=node.vpn())
    found: dict[str, Any] = next(f["mqtt"] for f in figures if f and "mqtt" in f)
    return found


async def with_will(
    listener: MqttListener, expiry: int, delay: int, will: tuple[str, bytes, int, bool] = WILL
) -> Paho:
    """Client ``device`` connected (MQTT 5, no clean start) with ``will`` and its delay."""
    device = Paho(listener.port, "device", V5)
    await device.connect(
        clean_start=False, session_expiry=expiry, will=will, will_properties=delayed(delay)
    )
    return device


async def retained_status(listener: MqttListener) -> tuple[bytes, bool, int]:
    """What a new QoS 1 subscriber gets of ``status/device``: payload, retain, QoS."""
    late = Paho(listener.port, "late", V5)
    await late.connect()
    await late.subscribe(("status/device", 1))
    kept = await late.receive()
    await late.disconnect()
    return bytes(kept.payload), bool(kept.retain), int(kept.qos)


async def watching(listener: MqttListener) -> Paho:
    watcher = Paho(listener.port, "watcher", V5)
    await watcher.connect()
    await watcher.subscribe(("status/#", 0))
    return watcher


async def next_status(listener: MqttListener, watcher: Paho) -> bytes:
    """What the watcher gets next on ``status/#``, after whatever the node published
    so far: a marker published now comes after it, so nothing that was due is missed."""
    marker = Paho(listener.port, "marker", V5)
    await marker.connect()
    await marker.publish("status/marker", b"marker")
    await marker.disconnect()
    message = await watcher.receive()
    if message.payload != b"marker":
        assert (await watcher.receive()).payload == b"marker"
    return bytes(message.payload)


async def gone(listener: MqttListener, device: Paho, client_id: str = "device") -> None:
    """Cut ``device``'s connection and wait until the node has noticed."""
    await device.drop()
    await eventually(lambda: getattr(session_of(listener, client_id), "connection", 1) is None)


async def test_a_will_waits_for_its_delay() -> None:
    clock = ManualClock()
    async with edge(clock) as listener:
        watcher = await watching(listener)
        device = await with_will(listener, 600, 30)
        await gone(listener, device)
        await clock.run(29)
        assert await next_status(listener, watcher) == b"marker"
        assert mqtt_figures(listener)["waiting_wills"] == 1
        await clock.run(1)
        assert await next_status(listener, watcher) == b"offline"
        figures = mqtt_figures(listener)
        assert (figures["waiting_wills"], figures["delayed_wills"]) == (0, 1)
        (counts,) = figures["listeners"].values()
        assert counts["wills"] == 0  # those published as their connection ended
        await watcher.disconnect()


async def test_a_client_back_within_the_delay_cancels_its_will() -> None:
    clock = ManualClock()
    async with edge(clock) as listener:
        watcher = await watching(listener)
        device = await with_will(listener, 600, 30)
        await gone(listener, device)
        await clock.run(10)
        again = Paho(listener.port, "device", V5)
        await again.connect(clean_start=False, session_expiry=600)
        assert again.connack[0].session_present
        await clock.run(60)
        assert await next_status(listener, watcher) == b"marker"
        assert listener.node.stash[REGISTRY].delayed_wills == 0
        await again.disconnect()
        await watcher.disconnect()


async def test_the_session_expiry_counts_from_the_disconnect_not_from_the_will() -> None:
    # Expiry 60 s, will delay 30 s: the will goes at 30 s, the session ends at 60 s.
    clock = ManualClock()
    async with edge(clock) as listener:
        watcher = await watching(listener)
        device = await with_will(listener, 60, 30)
        await device.subscribe(("orders/#", 1))
        await gone(listener, device)
        await clock.run(30)
        assert await next_status(listener, watcher) == b"offline"
        await clock.run(31)
        assert session_of(listener, "device") is None
        again = Paho(listener.port, "device", V5)
        await again.connect(clean_start=False, session_expiry=60)
        assert not again.connack[0].session_present
        await again.disconnect()
        await watcher.disconnect()


async def test_a_will_cancelled_by_a_return_leaves_no_timer_that_ends_the_session_early() -> None:
    # The first connection's will delay ran on after the client came back; when it was
    # up, it set up the session's expiry as if the client were still away, so the
    # session ended 100 s after that instead of 100 s after the second disconnect.
    clock = ManualClock()
    async with edge(clock) as listener:
        device = await with_will(listener, 100, 30)
        await device.subscribe(("orders/#", 1))
        await gone(listener, device)
        await clock.run(10)
        again = Paho(listener.port, "device", V5)
        await again.connect(clean_start=False, session_expiry=100)
        await clock.run(75)  # t = 85; the first will delay ended at t = 30
        await gone(listener, again)
        await clock.run(60)  # t = 145: the session has 40 s left
        state = session_of(listener, "device")
        assert state is not None
        assert state.connection is None
        back = Paho(listener.port, "device", V5)
        await back.connect(clean_start=False, session_expiry=100)
        assert back.connack[0].session_present
        await back.disconnect()


async def test_a_clean_start_ends_the_old_session_and_publishes_its_waiting_will() -> None:
    clock = ManualClock()
    async with edge(clock) as listener:
        watcher = await watching(listener)
        device = await with_will(listener, 600, 30)
        await gone(listener, device)
        fresh = Paho(listener.port, "device", V5)
        await fresh.connect(clean_start=True, session_expiry=600)
        assert not fresh.connack[0].session_present
        assert await next_status(listener, watcher) == b"offline"
        await clock.run(60)  # the old delay's end publishes nothing more
        assert await next_status(listener, watcher) == b"marker"
        assert listener.node.stash[REGISTRY].delayed_wills == 1
        await fresh.disconnect()
        await watcher.disconnect()


async def test_a_node_stops_at_once_while_a_will_waits() -> None:
    # The will delay ran in the end of the connection, which the node's stop waited
    # for: an hour's delay held the stop for an hour.
    node = Node(name="edge")
    with anyio.fail_after(10):
        async with node:
            listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
            device = await with_will(listener, 7200, 3600)
            await gone(listener, device)


async def test_a_waiting_will_outlives_a_restart_and_goes_when_its_delay_is_up(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with edge(clock, tmp_path) as listener:
        device = await with_will(listener, 3600, 30, will=("status/device", b"offline", 1, True))
        await gone(listener, device)
        await clock.run(10)
    # Down for 5 s; 15 s of the delay are left when the node is back.
    later = ManualClock(start=0.0, epoch=clock.time() + 5)
    async with edge(later, tmp_path) as listener:
        watcher = await watching(listener)
        await later.run(14)
        assert await next_status(listener, watcher) == b"marker"
        await later.run(1)
        assert await next_status(listener, watcher) == b"offline"
        await watcher.disconnect()
        # It was published retained, at QoS 1.
        assert await retained_status(listener) == (b"offline", True, 1)
        state = session_of(listener, "device")
        assert state is not None
        assert state.will is None
    async with edge(ManualClock(start=0.0, epoch=later.time() + 1), tmp_path) as listener:
        state = session_of(listener, "device")
        assert state is not None
        assert state.will is None  # it went once only


async def test_a_will_of_a_client_connected_at_a_stop_goes_after_the_restart(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with edge(clock, tmp_path) as listener:
        await with_will(listener, 3600, 30)  # connected as the node stops
    later = ManualClock(start=0.0, epoch=clock.time() + 10)
    async with edge(later, tmp_path) as listener:
        watcher = await watching(listener)
        await later.run(19)
        assert await next_status(listener, watcher) == b"marker"
        await later.run(1)
        assert await next_status(listener, watcher) == b"offline"
        await watcher.disconnect()


async def test_a_client_back_after_a_restart_within_the_delay_cancels_its_will(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with edge(clock, tmp_path) as listener:
        device = await with_will(listener, 3600, 30)
        await gone(listener, device)
    later = ManualClock(start=0.0, epoch=clock.time() + 5)
    async with edge(later, tmp_path) as listener:
        watcher = await watching(listener)
        again = Paho(listener.port, "device", V5)
        await again.connect(clean_start=False, session_expiry=3600)
        assert again.connack[0].session_present
        await later.run(60)
        assert await next_status(listener, watcher) == b"marker"
        await again.disconnect()
        await watcher.disconnect()


async def test_a_will_overdue_at_the_restart_goes_at_once_even_if_the_session_expired(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    async with edge(clock, tmp_path) as listener:
        device = await with_will(listener, 20, 300, will=("status/device", b"offline", 1, True))
        await gone(listener, device)
        await clock.run(5)
    # Down for an hour: the session ended at 20 s, and its will was due then.
    later = ManualClock(start=0.0, epoch=clock.time() + 3600)
    async with edge(later, tmp_path) as listener:
        assert session_of(listener, "device") is None
        assert await retained_status(listener) == (b"offline", True, 1)


async def test_the_will_of_a_session_that_expired_while_down_outlives_a_stop_before_the_listener(
    tmp_path: Path,
) -> None:
    # The restart finds the session expired and its will due; the node stops (or
    # crashes) before its MQTT listener opens, so the will did not go yet: the next
    # start still has it, publishes it once, and the one after has nothing left.
    clock = ManualClock()
    async with edge(clock, tmp_path) as listener:
        device = await with_will(listener, 20, 300, will=("status/device", b"offline", 1, True))
        await gone(listener, device)
    epoch = clock.time() + 3600  # down for an hour: the session ended at 20 s
    async with Node(name="edge", clock=ManualClock(epoch=epoch), data_dir=tmp_path) as node:
        await anyio.wait_all_tasks_blocked()
        assert not list(retained_store(node.vpn()).matching("status/>"))  # not yet
    async with edge(ManualClock(epoch=epoch + 1), tmp_path) as listener:
        assert session_of(listener, "device") is None
        assert listener.node.stash[REGISTRY].expired == 1
        assert await retained_status(listener) == (b"offline", True, 1)
        await eventually(lambda: mqtt_figures(listener)["delayed_wills"] == 1)
    async with edge(ManualClock(epoch=epoch + 2), tmp_path) as listener:
        assert listener.node.stash[REGISTRY].expired == 0  # its file went with the will


async def test_a_will_without_delay_at_a_stop_is_published_as_the_connection_ends(
    tmp_path: Path,
) -> None:
    # MQTT 3.1.1 has no will delay: a node that stops ends the connection, and its will
    # goes then (retained here, so a subscriber after the restart sees it).
    async with edge(ManualClock(), tmp_path) as listener:
        device = Paho(listener.port, "device", V311, clean_session=False)
        await device.connect(will=("status/device", b"offline", 1, True))
    async with edge(ManualClock(), tmp_path) as listener:
        assert await retained_status(listener) == (b"offline", True, 1)


async def test_a_restored_will_waits_for_the_listener_so_it_reaches_every_subscriber(
    tmp_path: Path,
) -> None:
    # A restarted node publishes the wills it brought back once it serves MQTT again:
    # by then the queues its configuration makes exist, and the persistent sessions it
    # restored, so none of them misses a will that was due at the restart.
    async with edge(ManualClock(), tmp_path) as listener:
        monitor = Paho(listener.port, "monitor", V5)
        await monitor.connect(clean_start=False, session_expiry=3600)
        await monitor.subscribe(("status/#", 1))
        await monitor.disconnect()
        device = Paho(listener.port, "device", V311, clean_session=False)
        await device.connect(will=("status/device", b"offline", 1, False))
    async with Node(name="edge", clock=ManualClock(), data_dir=tmp_path) as node:
        audit = node.guaranteed.create_queue("audit", subscriptions=["status/>"])
        await anyio.wait_all_tasks_blocked()  # what the restart started has run
        assert audit.usage()[0] == 0  # held until the listener opens
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        await eventually(lambda: audit.usage()[0] == 1)
        monitor = Paho(listener.port, "monitor", V5)
        await monitor.connect(clean_start=False, session_expiry=3600)
        got = await monitor.receive()
        assert (got.topic, got.payload) == ("status/device", b"offline")
        await monitor.disconnect()
