"""Shared subscriptions at QoS 1 (``$share/<name>/<filter>``): the group is a queue of
its own that each connected member reads from, so each message reaches one member at
least once, waits while no member is connected, and goes to another member when the
one it was sent to goes away without acknowledging it."""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import mqtt5
import pytest
from mqtt5 import QoS, TopicFilter

from meshbus import ClientProfile, Node, StateError
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener
from meshbus.plugins.mqtt._listener import REGISTRY

from ._clients import V5, V311, Paho, eventually
from ._raw import Raw, login

pytestmark = pytest.mark.anyio

QUEUE = "mqtt-share/g/jobs/#"


@pytest.fixture
async def listener() -> AsyncIterator[MqttListener]:
    async with Node(name="edge") as node:
        yield await start_mqtt_listener(node, MqttListenerSettings(port=0))


@contextlib.asynccontextmanager
async def edge(data_dir: Path, **settings: Any) -> AsyncIterator[MqttListener]:
    async with Node(name="edge", data_dir=data_dir) as node:
        yield await start_mqtt_listener(node, MqttListenerSettings(port=0, **settings))


def connect(client_id: str, *, clean: bool = True, **options: Any) -> bytes:
    return mqtt5.ConnectPacket(client_id, clean_start=clean, **options).write()


def subscribe(packet_id: int, *filters: tuple[str, int]) -> bytes:
    chosen = [TopicFilter(f, max_qos=QoS(q), retain_as_published=False) for f, q in filters]
    return mqtt5.SubscribePacket(packet_id, chosen).write()


async def member(listener: MqttListener, client_id: str, qos: int = 1, **options: Any) -> Raw:
    """A client of the group ``$share/g/jobs/#``, subscribed at ``qos``."""
    client = await login(listener.port, connect(client_id, **options))
    await client.stream.send(subscribe(1, ("$share/g/jobs/#", qos)))
    suback = await client.take(mqtt5.SubAckPacket)
    assert [int(code) for code in suback.reason_codes] == [qos]
    return client


@contextlib.asynccontextmanager
async def reading(*clients: Raw) -> AsyncIterator[None]:
    """Read what the node writes to ``clients`` in the background (into their
    ``packets``) while the block runs."""

    async def read(client: Raw) -> None:
        with contextlib.suppress(anyio.EndOfStream, anyio.ClosedResourceError):
            await client.read_until(lambda: False, timeout=60)

    async with anyio.create_task_group() as tg:
        for client in clients:
            tg.start_soon(read, client)
        yield
        tg.cancel_scope.cancel()


def published(client: Raw) -> list[Any]:
    return [p for p in client.packets if type(p) is mqtt5.PublishPacket]


async def ack(client: Raw, packets: list[Any]) -> None:
    await client.stream.send(b"".join(mqtt5.PubAckPacket(p.packet_id).write() for p in packets))


def groups(node: Node) -> tuple[int, int]:
    """The share groups of the default VPN, and how many of them are queues, as its
    statistics say."""
    every = node.plugins.hook.meshbus_vpn_statistics(vpn=node.vpn())
    (figures,) = [f["mqtt"] for f in every if f and "mqtt" in f]
    return figures["share_groups"], figures["queued_share_groups"]


async def send_jobs(node: Node, count: int, start: int = 0) -> None:
    producer = node.connect()
    try:
        for i in range(start, start + count):
            await producer.send(f"jobs/{i}", b"%d" % i)
    finally:
        producer.close()


async def test_a_group_at_qos1_splits_the_messages_each_once(listener: MqttListener) -> None:
    first = await member(listener, "w1")
    second = await member(listener, "w2")
    async with first.stream, second.stream, reading(first, second):
        await send_jobs(listener.node, 20)
        await eventually(lambda: len(published(first)) + len(published(second)) >= 20)
        for client in (first, second):
            assert all(int(p.qos) == 1 for p in published(client))
            assert published(client), "each connected member has its share"
            await ack(client, published(client))
        payloads = sorted(int(p.payload) for c in (first, second) for p in published(c))
        assert payloads == list(range(20))  # each message to one member, none twice
        queue = listener.node.guaranteed.queue(QUEUE)
        await eventually(lambda: queue.usage()[0] == 0)


async def test_what_a_member_left_unacknowledged_goes_to_another(listener: MqttListener) -> None:
    leaving = await member(listener, "leaving")
    staying = await member(listener, "staying")
    async with staying.stream, reading(staying):
        async with leaving.stream, reading(leaving):
            await send_jobs(listener.node, 10)
            await eventually(lambda: len(published(leaving)) + len(published(staying)) >= 10)
            dropped = {int(p.payload) for p in published(leaving)}
            assert dropped
        # Gone without a PUBACK: its messages go back to the queue, for the other.
        await ack(staying, published(staying))
        await eventually(lambda: len(published(staying)) >= 10)
        got = published(staying)
        assert sorted(int(p.payload) for p in got) == list(range(10))
        again = [p for p in got if int(p.payload) in dropped]
        assert again
        assert all(p.duplicate for p in again)
        await ack(staying, got)


async def test_messages_wait_for_a_member_while_none_is_connected(
    listener: MqttListener,
) -> None:
    options = {"clean": False, "session_expiry_interval": 3600}
    away = await member(listener, "sleepy", **options)
    await away.stream.aclose()
    await eventually(lambda: listener.registry.get("default", "sleepy").connection is None)
    await send_jobs(listener.node, 5)
    back = await login(listener.port, connect("sleepy", **options))
    async with back.stream, reading(back):
        # Its session is still a member: it reads the group's queue again, unasked.
        await eventually(lambda: len(published(back)) >= 5)
        assert [p.payload for p in published(back)] == [b"%d" % i for i in range(5)]
        await ack(back, published(back))


async def test_the_group_and_its_queue_end_with_the_last_member(listener: MqttListener) -> None:
    node = listener.node
    first = await member(listener, "w1")
    second = await member(listener, "w2")
    async with first.stream, second.stream, reading(first, second):
        await first.stream.send(mqtt5.UnsubscribePacket(2, ["$share/g/jobs/#"]).write())
        await eventually(lambda: any(type(p) is mqtt5.UnsubAckPacket for p in first.packets))
        node.guaranteed.queue(QUEUE)  # the other member still has it
        assert groups(node) == (1, 1)
        await send_jobs(node, 3)
        await eventually(lambda: len(published(second)) >= 3)
        assert not published(first)
        await ack(second, published(second))
    # The second member's session ended with its connection (clean start, no expiry).
    await eventually(lambda: not node.stash[REGISTRY].shares)
    assert groups(node) == (0, 0)
    with pytest.raises(StateError):
        node.guaranteed.queue(QUEUE)


async def test_a_group_that_started_at_qos0_grants_qos0(listener: MqttListener) -> None:
    """The first member decides what the group is: each message goes to one member,
    whatever QoS later members ask for (MQTT-3.8.4-8: no more than it delivers)."""
    direct = await member(listener, "fast", qos=0)
    async with direct.stream, reading(direct):
        late = await login(listener.port, connect("late"))
        async with late.stream:
            await late.stream.send(subscribe(1, ("$share/g/jobs/#", 1)))
            suback = await late.take(mqtt5.SubAckPacket)
            assert [int(code) for code in suback.reason_codes] == [0]
            async with reading(late):
                await send_jobs(listener.node, 10)
                await eventually(lambda: len(published(direct)) + len(published(late)) >= 10)
            got = published(direct) + published(late)
            assert sorted(int(p.payload) for p in got) == list(range(10))
            assert all(int(p.qos) == 0 for p in got)
            assert groups(listener.node) == (1, 0)  # a group, of direct messages
    with pytest.raises(StateError):
        listener.node.guaranteed.queue(QUEUE)


async def test_a_qos0_member_of_a_qos1_group_reads_its_queue_at_qos0(
    listener: MqttListener,
) -> None:
    steady = await member(listener, "steady", qos=1)
    casual = await member(listener, "casual", qos=0)
    async with steady.stream, casual.stream, reading(steady, casual):
        await send_jobs(listener.node, 10)
        await eventually(lambda: len(published(steady)) + len(published(casual)) >= 10)
        assert published(casual), "the queue hands the QoS 0 member its share"
        assert all(int(p.qos) == 0 for p in published(casual))
        assert all(int(p.qos) == 1 for p in published(steady))
        got = published(steady) + published(casual)
        assert sorted(int(p.payload) for p in got) == list(range(10))
        await ack(steady, published(steady))


async def test_the_receive_maximum_counts_the_groups_and_the_own_queue(
    listener: MqttListener,
) -> None:
    client = await login(listener.port, connect("small", receive_max=4))
    async with client.stream:
        await client.stream.send(
            subscribe(1, ("own/#", 1), ("$share/g/jobs/#", 1), ("$share/h/jobs/#", 1))
        )
        await client.take(mqtt5.SubAckPacket)
        await stay_within_the_window(listener, client)


async def stay_within_the_window(listener: MqttListener, client: Raw) -> None:
    async with reading(client):
        producer = listener.node.connect()
        for i in range(6):
            await producer.send(f"own/{i}", b"o")
        await send_jobs(listener.node, 6)
        await eventually(lambda: len(published(client)) >= 4)
        await anyio.sleep(0.2)  # nothing more may come: four are in flight
        assert len(published(client)) == 4
        seen = 0
        while seen < 18:  # 6 own, 6 for each of the two groups
            batch = published(client)[seen:]
            seen += len(batch)
            assert len(batch) <= 4
            await ack(client, batch)
            if seen < 18:
                await eventually(lambda n=seen: len(published(client)) > n)
        topics = sorted(p.topic for p in published(client))
        assert topics == sorted(
            [f"own/{i}" for i in range(6)] + [f"jobs/{i}" for i in range(6)] * 2
        )


async def test_a_profile_without_shared_subscriptions_refuses_the_group() -> None:
    async with Node(name="edge") as node:
        vpn = node.vpn("default")
        vpn.add_client_profile(ClientProfile("noshare", allow_shared_subscriptions=False))
        vpn.add_user("plain", password="p", client_profile="noshare")
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        client = await login(listener.port, connect("nope", username="plain", password=b"p"))
        async with client.stream:
            await client.stream.send(subscribe(1, ("$share/g/jobs/#", 1)))
            suback = await client.take(mqtt5.SubAckPacket)
            assert [int(code) for code in suback.reason_codes] == [0x87]  # not authorized
        assert not node.stash[REGISTRY].shares
        with pytest.raises(StateError):
            node.guaranteed.queue(QUEUE)


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
async def test_paho_members_share_a_group_at_qos1(listener: MqttListener, protocol: int) -> None:
    workers = [Paho(listener.port, f"worker-{i}", protocol) for i in range(2)]
    for worker in workers:
        await worker.connect()
        assert await worker.subscribe(("$share/pool/tasks/#", 1)) == [1]
    boss = Paho(listener.port, "boss", protocol)
    await boss.connect()
    for i in range(10):
        await boss.publish(f"tasks/{i}", b"%d" % i, qos=1)
    got = []
    with anyio.fail_after(10):
        while len(got) < 10:
            for worker in workers:
                while not worker.nothing_more():
                    got.append(await worker.receive())
            await anyio.sleep(0.01)
    assert sorted(int(m.payload) for m in got) == list(range(10))
    assert all(m.qos == 1 for m in got)
    for client in (*workers, boss):
        await client.disconnect()


async def test_a_group_outlives_a_node_restart_with_what_waits_in_it(tmp_path: Path) -> None:
    options = {"clean": False, "session_expiry_interval": 3600}
    async with edge(tmp_path, max_queued_messages=50) as listener:
        away = await member(listener, "sleepy", **options)
        await away.stream.aclose()
        registry = listener.registry
        await eventually(lambda: registry.get("default", "sleepy").connection is None)
        await send_jobs(listener.node, 3)
    async with edge(tmp_path) as listener:
        assert listener.registry.share_group("default", "$share/g/jobs/#") is not None
        # Made again with the limit of the listener its first member came through.
        assert listener.node.guaranteed.queue(QUEUE).settings.max_messages == 50
        await send_jobs(listener.node, 2, start=3)
        back = await login(listener.port, connect("sleepy", **options))
        async with back.stream, reading(back):
            await eventually(lambda: len(published(back)) >= 5)
            assert [p.payload for p in published(back)] == [b"%d" % i for i in range(5)]
            await ack(back, published(back))


class Churn:
    """Members of one QoS 1 group that come, acknowledge, unsubscribe and vanish at
    random while jobs are sent; an offline persistent member keeps the group alive."""

    def __init__(self, listener: MqttListener, seed: int) -> None:
        self.listener = listener
        self.random = random.Random(seed)
        self.live: dict[str, tuple[Raw, anyio.CancelScope]] = {}
        self.acked: set[int] = set()
        self.seen: set[int] = set()
        self.unflagged_again: list[int] = []  # sent again without DUP: must stay empty

    async def join(self, tg: anyio.abc.TaskGroup, client_id: str) -> None:
        client = await member(self.listener, client_id)
        scope = anyio.CancelScope()
        self.live[client_id] = (client, scope)

        async def read() -> None:
            closed = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError)
            with scope, contextlib.suppress(*closed):
                await client.read_until(lambda: False, timeout=120)

        tg.start_soon(read)

    async def ack_all(self, client_id: str) -> None:
        client, _ = self.live[client_id]
        packets = published(client)
        for p in packets:
            if int(p.payload) in self.seen and not p.duplicate:
                self.unflagged_again.append(int(p.payload))
            self.seen.add(int(p.payload))
        client.packets.clear()
        await ack(client, packets)
        self.acked.update(int(p.payload) for p in packets)

    async def vanish(self, client_id: str) -> None:
        """Gone without acknowledging what it holds: the group gets that back."""
        client, scope = self.live.pop(client_id)
        self.seen.update(int(p.payload) for p in published(client))
        scope.cancel()
        await client.stream.aclose()

    async def leave(self, client_id: str) -> None:
        await self.ack_all(client_id)
        client, scope = self.live.pop(client_id)
        await client.stream.send(mqtt5.UnsubscribePacket(9, ["$share/g/jobs/#"]).write())
        await eventually(lambda: any(type(p) is mqtt5.UnsubAckPacket for p in client.packets))
        await self.ack_all_unlisted(client)
        scope.cancel()
        await client.stream.aclose()

    async def ack_all_unlisted(self, client: Raw) -> None:
        """What came between the last ack and the UNSUBACK: acknowledged too."""
        packets = published(client)
        for p in packets:
            self.seen.add(int(p.payload))
        await ack(client, packets)
        self.acked.update(int(p.payload) for p in packets)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_members_that_come_and_go_lose_no_message(listener: MqttListener, seed: int) -> None:
    anchor = {"clean": False, "session_expiry_interval": 3600}
    keeper = await member(listener, "keeper", **anchor)  # offline: the group lives on
    await keeper.stream.aclose()
    churn = Churn(listener, seed)
    jobs = 0
    async with anyio.create_task_group() as tg:
        for step in range(40):
            action = churn.random.choice(["join", "join", "ack", "ack", "vanish", "leave"])
            if action == "join" and len(churn.live) < 3:
                await churn.join(tg, f"w{step}")
            elif action != "join" and churn.live:
                client_id = churn.random.choice(sorted(churn.live))
                await getattr(churn, {"ack": "ack_all"}.get(action, action))(client_id)
            await send_jobs(listener.node, 3, start=jobs)
            jobs += 3
            await anyio.sleep(0.005)
        for client_id in sorted(churn.live):
            await churn.ack_all(client_id)
            await churn.vanish(client_id)
        # The kept session comes back and takes what nobody acknowledged.
        back = await login(listener.port, connect("keeper", **anchor))
        churn.live["keeper"] = (back, anyio.CancelScope())
        async with reading(back):
            while len(churn.acked) < jobs:
                await eventually(lambda: bool(published(back)))
                await churn.ack_all("keeper")
        await back.stream.aclose()
    assert churn.acked == set(range(jobs))
    assert churn.unflagged_again == []


async def test_a_native_session_joins_a_qos1_group_by_binding_its_queue(
    listener: MqttListener,
) -> None:
    device = await member(listener, "device-worker")
    native = listener.node.connect(client_name="native-worker")
    flow = await native.bind(QUEUE)
    async with device.stream, reading(device):
        await send_jobs(listener.node, 20)
        taken: list[int] = []
        with anyio.fail_after(10):
            while len(taken) + len(published(device)) < 20:
                message = flow.receive_nowait()
                if message is None:
                    await anyio.sleep(0.01)
                    continue
                taken.append(int(message.payload))
                flow.ack(message)
        assert taken, "the native flow has its share"
        assert published(device), "and so has the MQTT member"
        everything = taken + [int(p.payload) for p in published(device)]
        assert sorted(everything) == list(range(20))
        await ack(device, published(device))
    await flow.unbind()


async def test_every_subscription_counts_against_the_client_profile_s_limit() -> None:
    """Share groups and QoS 1 filters are held by the node (queues, their indexes), not
    by the connection's session: they count against max_subscriptions all the same."""
    async with Node(name="edge") as node:
        vpn = node.vpn("default")
        vpn.add_client_profile(ClientProfile("small", max_subscriptions=3))
        vpn.add_user("dev", password="p", client_profile="small")
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        client = await login(listener.port, connect("greedy", username="dev", password=b"p"))
        async with client.stream:
            wanted = [("own/#", 1), ("$share/g/jobs/#", 1), ("plain", 0), ("$share/h/jobs/#", 1)]
            await client.stream.send(subscribe(1, *wanted))
            suback = await client.take(mqtt5.SubAckPacket)
            assert [int(code) for code in suback.reason_codes] == [1, 1, 0, 0x97]  # quota
            assert groups(node) == (1, 1)  # no queue was made for the refused group
            await client.stream.send(subscribe(2, ("own/#", 0)))  # held already: replaced
            suback = await client.take(mqtt5.SubAckPacket)
            assert [int(code) for code in suback.reason_codes] == [0]
            await client.stream.send(mqtt5.UnsubscribePacket(3, ["plain"]).write())
            await client.take(mqtt5.UnsubAckPacket)
            await client.stream.send(subscribe(4, ("$share/h/jobs/#", 1)))
            suback = await client.take(mqtt5.SubAckPacket)
            assert [int(code) for code in suback.reason_codes] == [1]
            assert groups(node) == (2, 2)


async def test_every_wildcard_subscription_counts_against_the_profile_s_levels() -> None:
    """QoS 1 filters and share groups count against max_wildcard_levels as the session's
    own wildcard subscriptions do: one client may not make every publish step through
    wildcard filters without bound by subscribing at QoS 1."""
    async with Node(name="edge") as node:
        vpn = node.vpn("default")
        vpn.add_client_profile(ClientProfile("narrow", max_wildcard_levels=6))
        vpn.add_user("dev", password="p", client_profile="narrow")
        listener = await start_mqtt_listener(node, MqttListenerSettings(port=0))
        client = await login(listener.port, connect("wild", username="dev", password=b"p"))
        async with client.stream:
            wanted = [("a/b/#", 1), ("$share/g/c/+", 1), ("exact/topic", 1), ("d/+/e", 1)]
            await client.stream.send(subscribe(1, *wanted))
            suback = await client.take(mqtt5.SubAckPacket)
            # 3 + 2 levels, an exact filter costs none, then 3 more would make 8 > 6
            assert [int(code) for code in suback.reason_codes] == [1, 1, 1, 0x97]
            await client.stream.send(subscribe(2, ("a/b/#", 0)))  # replaced: counted once
            suback = await client.take(mqtt5.SubAckPacket)
            assert [int(code) for code in suback.reason_codes] == [0]
            await client.stream.send(mqtt5.UnsubscribePacket(3, ["$share/g/c/+"]).write())
            await client.take(mqtt5.UnsubAckPacket)
            await client.stream.send(subscribe(4, ("d/+/e", 1)))
            suback = await client.take(mqtt5.SubAckPacket)
            assert [int(code) for code in suback.reason_codes] == [1]
