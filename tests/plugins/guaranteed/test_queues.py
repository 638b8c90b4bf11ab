"""Provisioning queues and binding flows to them (SPEC 4): settings, errors, access."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from meshbus import (
    AccessDeniedError,
    ClientProfile,
    ConfigurationError,
    Node,
    PublishRejectedError,
    StateError,
    TopicLimits,
)
from meshbus.plugins.guaranteed._queue import Queue
from meshbus.plugins.guaranteed._settings import MAX_MESSAGE_SIZE, AccessType, QueueSettings

from ._helpers import PLUGINS, service

# --- settings ---------------------------------------------------------------------------


def test_queue_settings_defaults_follow_spec_4() -> None:
    s = QueueSettings("q")
    assert s.subscriptions == ()
    assert s.access_type is AccessType.EXCLUSIVE
    assert (s.max_messages, s.max_bytes) == (None, None)
    assert s.max_message_size == MAX_MESSAGE_SIZE == 30 * 1024 * 1024
    assert (s.max_redelivery, s.dead_message_queue, s.respect_ttl) == (0, None, False)
    assert (s.ingress_enabled, s.egress_enabled) == (True, True)
    assert s.reject_msg_to_sender_on_discard is True  # default on for queues
    assert QueueSettings("q", access_type="non-exclusive").access_type is AccessType.NON_EXCLUSIVE
    assert QueueSettings("q", subscriptions=["a/>", "b"]).subscriptions == ("a/>", "b")


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"max_messages": -1}, "max_messages"),
        ({"max_messages": 1.5}, "max_messages"),
        ({"max_messages": True}, "max_messages"),
        ({"max_bytes": "10"}, "max_bytes"),
        ({"max_message_size": 0}, "max_message_size"),
        ({"max_message_size": MAX_MESSAGE_SIZE + 1}, "max_message_size"),
        ({"max_message_size": None}, "max_message_size"),
        ({"max_redelivery": -1}, "max_redelivery"),
        ({"max_redelivery": None}, "max_redelivery"),
        ({"respect_ttl": 1}, "respect_ttl"),
        ({"ingress_enabled": "no"}, "ingress_enabled"),
        ({"egress_enabled": None}, "egress_enabled"),
        ({"reject_msg_to_sender_on_discard": 0}, "reject_msg_to_sender_on_discard"),
        ({"access_type": "shared"}, "access_type"),
        ({"subscriptions": "a/>"}, "subscriptions"),
        ({"subscriptions": [""]}, "subscription"),
        ({"subscriptions": ["a\x00b"]}, "subscription"),
        ({"subscriptions": ["#system/x"]}, "subscription"),
        ({"subscriptions": ["x/" * 128 + "y"]}, "subscription"),
        ({"dead_message_queue": "dm*q"}, "dead_message_queue"),
        ({"dead_message_queue": ""}, "dead_message_queue"),
        ({"colour": "red"}, "colour"),
    ],
)
async def test_invalid_settings_raise_configuration_error_naming_the_setting(
    settings: dict[str, Any], named: str
) -> None:
    async with Node(plugins=PLUGINS) as node:
        with pytest.raises(ConfigurationError, match=named):
            service(node).create_queue("q", **settings)
        with pytest.raises(StateError):
            service(node).queue("q")  # nothing was provisioned


@pytest.mark.parametrize("name", ["", "a*b", "a>", "#q", "x" * 201, "a\x00b", 7])
async def test_invalid_queue_names_are_refused(name: Any) -> None:
    async with Node(plugins=PLUGINS) as node:
        with pytest.raises(ConfigurationError, match="queue name"):
            service(node).create_queue(name)
    assert QueueSettings("x" * 200).name == "x" * 200
    assert QueueSettings("orders/eu").name == "orders/eu"


@pytest.mark.parametrize("sub", ["#share/g/orders/>", "#noexport/#share/g/a"])
async def test_shared_subscriptions_on_a_queue_raise_configuration_error(sub: str) -> None:
    async with Node(plugins=PLUGINS) as node:
        with pytest.raises(ConfigurationError, match="shared"):
            service(node).create_queue("q", subscriptions=["ok/>", sub])
        with pytest.raises(StateError):
            service(node).queue("q")


async def test_subscription_over_the_vpn_topic_limits_is_refused_whole() -> None:
    # The settings are valid under the default limits, not under this VPN's.
    async with Node(plugins=PLUGINS, topic_limits=TopicLimits(max_levels=3)) as node:
        with pytest.raises(ConfigurationError, match="a/b/c/d"):
            service(node).create_queue("q", subscriptions=["ok/>", "a/b/c/d"])
        with pytest.raises(StateError):
            service(node).queue("q")  # not half provisioned
        s = node.connect()
        await s.send("ok/1", b"x")  # acked and discarded: no queue holds it
        assert service(node).store.endpoints() == []


# --- create, look up, delete ------------------------------------------------------------


async def test_create_queue_is_idempotent_for_identical_settings() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        q = svc.create_queue("q", subscriptions=["a/>"], max_messages=5)
        assert isinstance(q, Queue)
        assert svc.create_queue("q", subscriptions=["a/>"], max_messages=5) is q
        assert svc.create_queue("q", subscriptions=("a/>",), max_messages=5) is q
        assert svc.queue("q") is q
        with pytest.raises(StateError, match="other settings"):
            svc.create_queue("q", subscriptions=["a/>"], max_messages=6)
        with pytest.raises(StateError, match="other settings"):
            svc.create_queue("q")
        assert svc.queue("q").settings.max_messages == 5  # unchanged
        # The first one still attracts its messages, exactly once.
        await node.connect().send("a/1", b"x")
        assert svc.store.stats(q.endpoint).messages == 1


async def test_queue_lookups_and_provisioning_need_a_running_node_and_a_known_vpn() -> None:
    node = Node(plugins=PLUGINS)
    with pytest.raises(StateError, match="runs"):
        service(node).create_queue("q")
    async with node:
        svc = service(node)
        with pytest.raises(StateError, match="no queue 'nope'"):
            svc.queue("nope")
        with pytest.raises(StateError, match="nope"):
            svc.create_queue("q", vpn="nope")
        with pytest.raises(StateError):
            await svc.delete_queue("nope")


async def test_queues_are_per_vpn() -> None:
    async with Node(plugins=PLUGINS) as node:
        node.create_vpn("other")
        svc = service(node)
        mine = svc.create_queue("q", vpn="other", subscriptions=["a/>"])
        theirs = svc.create_queue("q", subscriptions=["a/>"], max_messages=1)  # same name
        assert mine is not theirs
        assert mine.endpoint != theirs.endpoint
        with pytest.raises(StateError):
            svc.queue("q", vpn="nope")
        s_other = node.connect("other")
        s_default = node.connect()
        await s_other.send("a/1", b"other")
        await s_other.send_to_queue("q", b"other")
        assert svc.store.stats(mine.endpoint).messages == 2
        assert svc.store.stats(theirs.endpoint).messages == 0
        await s_default.send("a/1", b"default")
        assert svc.store.stats(theirs.endpoint).messages == 1
        node.create_vpn("third")
        with pytest.raises(PublishRejectedError) as info:
            await node.connect("third").send_to_queue("q", b"x")
        assert info.value.reason == "no-such-queue"
        with pytest.raises(StateError):
            await node.connect("third").bind("q")


async def test_queue_statistics_show_depth_quota_flows_and_counters(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        node.create_vpn("other")
        svc = node.guaranteed
        svc.create_queue("q", subscriptions=["a/>"], max_messages=10, dead_message_queue="dmq")
        svc.create_queue("dmq")
        svc.create_queue("elsewhere", vpn="other")
        svc.create_topic_endpoint("te")
        s = node.connect()
        for n in range(3):
            await s.send("a/x", b"12345" * (n + 1))
        flow = await s.bind("q", window=1)
        first = await flow.receive()
        flow.ack(first)
        await flow.receive()  # held, not acked

        rows = svc.queue_statistics("default")
        assert [(r.name, r.kind) for r in rows] == [
            ("dmq", "queue"),
            ("q", "queue"),
            ("te", "topic-endpoint"),
        ]
        q = rows[1]
        assert (q.vpn, q.messages, q.bytes) == ("default", 2, 25)
        assert (q.max_messages, q.max_bytes, q.dead_message_queue) == (10, None, "dmq")
        assert (q.flows, q.in_flight, q.subscriptions) == (1, 1, ("a/>",))
        assert (q.spooled, q.delivered, q.acked, q.redelivered) == (3, 2, 1, 0)
        assert (q.ingress_enabled, q.egress_enabled) == (True, True)
        assert [r.name for r in svc.queue_statistics()] == ["dmq", "q", "te", "elsewhere"]
        assert svc.queue("q").statistics() == q


async def test_delete_queue_drops_messages_unbinds_flows_and_stops_attracting(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        q = svc.create_queue("q", subscriptions=["a/>"])
        keep = svc.create_queue("keep", subscriptions=["a/>"])
        s = node.connect()
        await s.send("a/1", b"one")
        await s.send("a/2", b"two")
        flow = await s.bind("q")
        assert (await flow.receive()).payload == b"one"
        stopped = anyio.Event()

        async def consume() -> None:
            async for _ in flow:  # ends when the flow is unbound by the delete
                pass
            stopped.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await svc.delete_queue("q")
            with anyio.fail_after(2):
                await stopped.wait()
        assert q.deleted
        with pytest.raises(StateError):
            await flow.receive()
        with pytest.raises(StateError):
            svc.queue("q")
        assert svc.store.stats(q.endpoint).messages == 0
        assert svc.store.stats(keep.endpoint).messages == 2  # the shared copies stay
        await s.send("a/3", b"three")
        assert svc.store.stats(q.endpoint).messages == 0
        assert svc.store.stats(keep.endpoint).messages == 3
        with pytest.raises(PublishRejectedError) as info:
            await s.send_to_queue("q", b"x")
        assert info.value.reason == "no-such-queue"
        # A new queue of that name starts empty.
        again = svc.create_queue("q", subscriptions=["b/>"])
        assert svc.store.stats(again.endpoint).messages == 0
        await svc.store.check()


async def test_delete_queue_removes_its_subscriptions_from_the_direct_path() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["a/>"])
        assert node.vpn().router_enabled("guaranteed")
        await svc.delete_queue("q")
        assert not node.vpn().router_enabled("guaranteed")  # idle again
        node.connect().publish("a/1", b"x")
        await anyio.sleep(0)
        assert svc.store.endpoints() == []


# --- binding ------------------------------------------------------------------------------


async def test_bind_to_an_unknown_queue_raises_state_error() -> None:
    async with Node(plugins=PLUGINS) as node:
        s = node.connect()
        with pytest.raises(StateError, match="no queue 'nope'"):
            await s.bind("nope")


async def test_bind_to_a_queue_with_egress_disabled_raises_state_error() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q", subscriptions=["a/>"], egress_enabled=False)
        s = node.connect()
        with pytest.raises(StateError, match="egress"):
            await s.bind("q")
        await s.send("a/1", b"x")  # ingress still works: it is stored for later
        assert service(node).store.stats("default/q").messages == 1


@pytest.mark.parametrize("window", [0, -1, True, 2.0, None])
async def test_bind_with_an_invalid_window_raises_configuration_error(window: Any) -> None:
    async with Node(plugins=PLUGINS) as node:
        q = service(node).create_queue("q")
        with pytest.raises(ConfigurationError, match="window"):
            await node.connect().bind("q", window=window)
        assert q.flows == []


async def test_bind_is_denied_when_the_client_profile_disallows_guaranteed_receive() -> None:
    async with Node(plugins=PLUGINS) as node:
        q = service(node).create_queue("q")
        vpn = node.vpn()
        vpn.add_client_profile(ClientProfile("sender-only", allow_guaranteed_receive=False))
        vpn.add_user("pub", client_profile="sender-only")
        s = node.connect(username="pub")
        with pytest.raises(AccessDeniedError) as info:
            await s.bind("q")
        assert info.value.username == "pub"
        assert q.flows == []
        await s.send_to_queue("q", b"sending is still allowed")


async def test_bind_on_a_closed_session_raises_state_error() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q")
        s = node.connect()
        s.close()
        with pytest.raises(StateError):
            await s.bind("q")


async def test_bind_without_the_guaranteed_plugin_raises_configuration_error() -> None:
    async with Node(plugins=["direct"]) as node:
        s = node.connect()
        with pytest.raises(ConfigurationError, match="guaranteed"):
            await s.bind("q")
