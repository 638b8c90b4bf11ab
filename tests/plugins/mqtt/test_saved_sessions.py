"""Persistent MQTT sessions outlive a restart of a node with a data directory: the
session, its subscriptions, its queue and what waits in it, and its expiry."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import mqtt5
import orjson
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from meshbus import ClientUsername, Node
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener
from meshbus.plugins.mqtt._listener import REGISTRY
from meshbus.plugins.mqtt._saved_sessions import SavedSession
from meshbus.plugins.mqtt._wills import PendingWill
from meshbus.testing import ManualClock

from ._clients import V5, V311, Paho, eventually

BOTH = pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])


@contextlib.asynccontextmanager
async def edge(data_dir: Path, clock: ManualClock | None = None) -> AsyncIterator[MqttListener]:
    async with Node(name="edge", data_dir=data_dir, clock=clock) as node:
        yield await start_mqtt_listener(node, MqttListenerSettings(port=0))


def persistent(protocol: int) -> dict[str, bool]:
    return {"clean_session": False} if protocol == V311 else {}


@pytest.mark.anyio
@BOTH
async def test_a_persistent_session_and_its_queue_outlive_a_node_restart(
    tmp_path: Path, protocol: int
) -> None:
    async with edge(tmp_path) as listener:
        device = Paho(listener.port, "sleepy", protocol, **persistent(protocol))
        await device.connect(clean_start=False, session_expiry=3600)
        await device.subscribe(("orders/#", 1))
        await device.subscribe(("news/#", 0))
        await device.disconnect()
        shop = Paho(listener.port, "shop", protocol)
        await shop.connect()
        for i in range(3):
            await shop.publish(f"orders/{i}", b"%d" % i, qos=1)
        await shop.disconnect()
    async with edge(tmp_path) as listener:
        shop = Paho(listener.port, "shop", protocol)
        await shop.connect()
        await shop.publish("orders/3", b"3", qos=1)  # while the device is still away
        again = Paho(listener.port, "sleepy", protocol, **persistent(protocol))
        await again.connect(clean_start=False, session_expiry=3600)
        assert again.connack[0].session_present
        got = await again.receive_many(4)
        assert [(m.topic, m.payload, m.qos) for m in got] == [
            (f"orders/{i}", b"%d" % i, 1) for i in range(4)
        ]
        # Its QoS 0 subscription is back too, without subscribing again.
        await shop.publish("news/today", b"hello", qos=0)
        news = await again.receive()
        assert (news.topic, news.payload) == ("news/today", b"hello")
        await shop.disconnect()
        await again.disconnect()


@pytest.mark.anyio
async def test_a_session_cleaned_or_unsubscribed_before_the_restart_stays_so(
    tmp_path: Path,
) -> None:
    async with edge(tmp_path) as listener:
        kept = Paho(listener.port, "kept", V5)
        await kept.connect(clean_start=False, session_expiry=3600)
        await kept.subscribe(("a/#", 1))
        await kept.subscribe(("b/#", 1))
        await kept.unsubscribe("a/#")
        await kept.disconnect()
        gone = Paho(listener.port, "gone", V5)
        await gone.connect(clean_start=False, session_expiry=3600)
        await gone.subscribe(("a/#", 1))
        await gone.disconnect()
        gone = Paho(listener.port, "gone", V5)
        await gone.connect(clean_start=True, session_expiry=0)  # ends the old session
        await gone.disconnect()
    async with edge(tmp_path) as listener:
        registry = listener.node.stash[REGISTRY]
        assert set(registry.sessions) == {("default", "kept")}
        assert list(registry.sessions["default", "kept"].subscriptions) == ["b/#"]
        shop = Paho(listener.port, "shop", V5)
        await shop.connect()
        await shop.publish("a/1", b"not for kept", qos=1)
        await shop.publish("b/1", b"for kept", qos=1)
        await shop.disconnect()
        kept = Paho(listener.port, "kept", V5)
        await kept.connect(clean_start=False, session_expiry=3600)
        assert (await kept.receive()).payload == b"for kept"
        await kept.disconnect()


@pytest.mark.anyio
async def test_the_expiry_interval_counts_the_time_the_node_was_down(tmp_path: Path) -> None:
    clock = ManualClock()
    async with edge(tmp_path, clock) as listener:
        for name in ("short", "long"):
            device = Paho(listener.port, name, V5)
            await device.connect(clean_start=False, session_expiry=60 if name == "short" else 600)
            await device.subscribe(("t/#", 1))
            await device.disconnect()
        shop = Paho(listener.port, "shop", V5)
        await shop.connect()
        await shop.publish("t/1", b"waits", qos=1)
        await shop.disconnect()
    # The node was down for 100 s: "short" (60 s) ended meanwhile, "long" has 500 s left.
    later = ManualClock(start=0.0, epoch=clock.time() + 100)
    async with edge(tmp_path, later) as listener:
        registry = listener.node.stash[REGISTRY]
        assert set(registry.sessions) == {("default", "long")}
        assert (registry.restored, registry.expired) == (1, 1)
        queues = {q.name for q in listener.node.guaranteed.queue_statistics()}
        assert queues == {"mqtt/long"}
        await later.run(499)
        assert set(registry.sessions) == {("default", "long")}
        await later.run(2)
        assert not registry.sessions
        assert not listener.node.guaranteed.queue_statistics()
        short = Paho(listener.port, "short", V5)
        await short.connect(clean_start=False, session_expiry=60)
        assert not short.connack[0].session_present
        await short.disconnect()


@pytest.mark.anyio
async def test_a_damaged_session_file_is_set_aside_and_the_others_come_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with edge(tmp_path) as listener:
        for name in ("one", "two"):
            device = Paho(listener.port, name, V5)
            await device.connect(clean_start=False, session_expiry=3600)
            await device.subscribe(("t/#", 1))
            await device.disconnect()
    files = sorted((tmp_path / "mqtt-sessions").glob("*.json"))
    assert len(files) == 2
    files[0].write_bytes(files[0].read_bytes()[:20])  # cut short, as by a full disk
    async with edge(tmp_path) as listener:
        registry = listener.node.stash[REGISTRY]
        assert len(registry.sessions) == 1
    assert files[0].with_suffix(".bad").exists()
    assert "not restored" in caplog.text


GOOD_WILL = {
    "topic": "status/c",
    "payload": "b2ZmbGluZQ==",  # b"offline"
    "qos": 1,
    "retain": True,
    "delay": 30,
    "ttl": 600,
    "options": {"headers": {"site": "north"}, "reply_to": "r", "correlation_id": "x"},
    "username": "devices",
}
GOOD = {
    "version": 1,
    "vpn": "default",
    "client_id": "c",
    "expiry": 60,
    "queue": "mqtt/c",
    "queue_limit": 100,
    "offline_since": 1.5,
    "subscriptions": [
        {
            "filter": "t/#",
            "qos": 1,
            "filters": ["t", "t/>"],
            "no_local": False,
            "retain_as_published": True,
            "identifier": 4,
            "share_queue": None,
            "share_limit": None,
        },
        {
            "filter": "$share/g/jobs",
            "qos": 1,
            "filters": ["#share/g/jobs"],
            "no_local": False,
            "retain_as_published": False,
            "identifier": None,
            "share_queue": "mqtt-share/g/jobs",
            "share_limit": 500,
        },
    ],
    "packet_ids": [[7, 1]],
    "will": GOOD_WILL,
    "received": [3, 9],
}


def test_a_session_file_reads_back_what_was_written() -> None:
    saved = SavedSession.from_json(orjson.dumps(GOOD))
    assert saved.to_json() == GOOD
    assert saved.subscriptions == [
        ("t/#", 1, ("t", "t/>"), False, True, 4, None, None),
        ("$share/g/jobs", 1, ("#share/g/jobs",), False, False, None, "mqtt-share/g/jobs", 500),
    ]
    assert saved.packet_ids == {7: 1}
    assert saved.will is not None
    assert (saved.will.payload, saved.will.delay, saved.will.username) == (
        b"offline",
        30,
        "devices",
    )
    # A file from before wills were kept reads as one without a will.
    older = SavedSession.from_json(orjson.dumps({k: v for k, v in GOOD.items() if k != "will"}))
    assert older.will is None
    # ... and one from before subscription identifiers as subscriptions without one.
    sub = GOOD["subscriptions"][0]  # type: ignore[index]
    plain = {k: v for k, v in sub.items() if k not in ("identifier", "share_queue", "share_limit")}
    oldest = SavedSession.from_json(orjson.dumps({**GOOD, "subscriptions": [plain]}))
    # (and one from before QoS 1 share groups as subscriptions of no group's queue)
    assert oldest.subscriptions == [("t/#", 1, ("t", "t/>"), False, True, None, None, None)]
    # ... and one from before taken QoS 2 ids were kept as one with none.
    assert saved.received == [3, 9]
    untaken = SavedSession.from_json(
        orjson.dumps({k: v for k, v in GOOD.items() if k != "received"})
    )
    assert untaken.received == []


def test_a_will_whose_user_property_name_repeats_reads_back() -> None:
    will = mqtt5.Will(
        "status/c", payload=b"gone", user_properties=[("site", "north"), ("site", "dock 4")]
    )
    pending = PendingWill.of(will, True, "devices", ClientUsername("devices"))
    saved = SavedSession.from_json(orjson.dumps({**GOOD, "will": pending.to_json()}))
    assert saved.will is not None
    assert saved.will.options == {"headers": {"site": ["north", "dock 4"]}}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"version": 2}, "version"),
        ({"vpn": 3}, "bad vpn"),
        ({"expiry": 0}, "bad expiry"),
        ({"expiry": True}, "bad expiry"),
        ({"queue": ""}, "bad queue"),
        ({"queue": None}, "no queue"),
        ({"queue_limit": -1}, "bad queue_limit"),
        ({"offline_since": "yesterday"}, "bad offline_since"),
        ({"subscriptions": {}}, "not a list"),
        ({"subscriptions": [{"filter": "t", "qos": 2, "filters": ["t"]}]}, "bad subscription"),
        ({"subscriptions": [{**GOOD["subscriptions"][0], "identifier": 0}]}, "bad subscription"),  # type: ignore[index]
        (
            {"subscriptions": [{**GOOD["subscriptions"][0], "share_queue": "q"}]},  # type: ignore[index]
            "bad subscription",  # a group's queue for a subscription that is not shared
        ),
        (
            {"subscriptions": [{**GOOD["subscriptions"][1], "share_limit": -1}]},  # type: ignore[index]
            "bad subscription",
        ),
        ({"packet_ids": [[7, 0]]}, "bad packet_ids"),
        ({"packet_ids": [[7, 1], [8, 1]]}, "twice"),
        ({"received": [0]}, "bad received"),
        ({"received": [65536]}, "bad received"),
        ({"received": {"7": 1}}, "bad received"),
        ({"will": []}, "bad will"),
        ({"will": {**GOOD_WILL, "topic": ""}}, "bad will topic"),
        ({"will": {**GOOD_WILL, "payload": "%%"}}, "bad will payload"),
        ({"will": {**GOOD_WILL, "qos": 3}}, "bad will qos"),
        ({"will": {**GOOD_WILL, "delay": -1}}, "bad will delay"),
        ({"will": {**GOOD_WILL, "options": {"ttl": 1}}}, "bad will options"),
        ({"will": {**GOOD_WILL, "options": {"headers": {"a": 1}}}}, "bad will headers"),
        ({"will": {**GOOD_WILL, "options": {"headers": {"a": ["1", 2]}}}}, "bad will headers"),
        ({"will": {**GOOD_WILL, "options": {"headers": {"a": ["1"]}}}}, "bad will headers"),
        ({"will": {**GOOD_WILL, "options": {"reply_to": 1}}}, "bad will reply_to"),
    ],
)
def test_a_damaged_session_file_says_what_is_wrong(change: dict[str, object], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        SavedSession.from_json(orjson.dumps({**GOOD, **change}))


@pytest.mark.anyio
async def test_sessions_of_a_removed_vpn_end_with_it_and_an_unknown_vpn_s_are_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with Node(name="edge", data_dir=tmp_path) as node:
        node.create_vpn("site")
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0, vpn="site"))
        registry = node.stash[REGISTRY]
        for name in ("one", "two"):
            device = Paho(listener.port, name, V5)
            await device.connect(clean_start=False, session_expiry=3600)
            await device.subscribe(("t/#", 1))
            if name == "one":
                await device.disconnect()
        assert len(list((tmp_path / "mqtt-sessions").glob("*.json"))) == 2
        node.remove_vpn("site")
        await eventually(lambda: not registry.sessions)
        assert not list((tmp_path / "mqtt-sessions").glob("*.json"))
        # A file whose VPN the node no longer has (its configuration changed).
        node.create_vpn("site")
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0, vpn="site"))
        device = Paho(listener.port, "three", V5)
        await device.connect(clean_start=False, session_expiry=3600)
        await device.disconnect()
        await eventually(lambda: registry.sessions["site", "three"].connection is None)
    async with Node(name="edge", data_dir=tmp_path) as node:  # no VPN "site"
        assert not node.stash[REGISTRY].sessions
    assert "no VPN named 'site'" in caplog.text


@pytest.mark.anyio
async def test_subscription_identifiers_outlive_a_node_restart(tmp_path: Path) -> None:
    properties = Properties(PacketTypes.SUBSCRIBE)
    properties.SubscriptionIdentifier = 11
    async with edge(tmp_path) as listener:
        device = Paho(listener.port, "sleepy", V5)
        await device.connect(clean_start=False, session_expiry=3600)
        await device.subscribe(("orders/#", 1), properties=properties)
        await device.disconnect()
    async with edge(tmp_path) as listener:
        shop = Paho(listener.port, "shop", V5)
        await shop.connect()
        await shop.publish("orders/1", b"1", qos=1)
        again = Paho(listener.port, "sleepy", V5)
        await again.connect(clean_start=False, session_expiry=3600)
        message = await again.receive()
        assert message.properties.SubscriptionIdentifier == [11]
        await shop.disconnect()
        await again.disconnect()
