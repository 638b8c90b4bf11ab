"""Seeded trials of a ``meshbus run`` node killed with SIGKILL while paho-mqtt devices
subscribe, go away, come back and are published to at QoS 1.

Each trial draws its steps from a seed: a device subscribes or unsubscribes a filter,
disconnects or reconnects (persistent sessions: MQTT 3.1.1 ``clean_session=False``,
MQTT 5 a session expiry of an hour), a publisher sends a few QoS 1 messages (some
retained) and waits for each PUBACK, or sends a burst and the node is killed at once,
with what was acknowledged by then known only afterwards. A kill is followed by a
restart on the same data directory; the devices that were connected come back.

At the end every device reconnects and the trial checks what a user of a broker
relies on after a crash:

* every message the node acknowledged reaches each device whose subscription matched
  when it was published and still holds (an unsubscribe in between makes it optional);
* nothing arrives that was not published, or that no subscription asked for;
* a message that comes twice comes flagged DUP the second time (SPEC 4: nothing
  twice without the redelivered flag);
* per device and topic, the first copies come in the order of the publishes;
* a subscriber after the last restart gets each retained topic's last acknowledged
  value (or a later one whose PUBACK the kill cut off).

``CRASH_TRIALS`` (an environment variable) sets the number of seeds per protocol.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
from collections import defaultdict
from pathlib import Path

import attrs
import paho.mqtt.client as mqtt
import pytest

from tests.processes import Child, free_port

from ._chaos_clients import matches
from ._clients import V5, V311, Paho, eventually

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.platform == "win32", reason="no SIGKILL on Windows"),
]

TRIALS = int(os.environ.get("CRASH_TRIALS", "2"))
STEPS = 40
DEVICES = ("d0", "d1", "d2")
FILTERS = ("a/#", "b/+", "c/x")  # disjoint: a topic matches at most one of them
TOPICS = ("a/1", "a/2/z", "b/1", "b/2", "c/x", "d/1")
RETAINED = ("r/1", "r/2")

CONFIG = """
[node]
name = "edge"
data_dir = "data"

[[listeners]]  # its own port, not the default one: trials may run side by side
host = "127.0.0.1"
port = {meshbus_port}

[[mqtt.listeners]]
host = "127.0.0.1"
port = {port}
max_inflight = 20
"""


@attrs.define
class Sent:
    """One QoS 1 publish: ``acked`` once its PUBACK came, ``None`` while unknown."""

    number: int
    topic: str
    payload: bytes
    acked: bool | None = None
    #: The devices it may reach (a subscription matched as it was published), and
    #: those it must reach (no unsubscribe of that filter came later).
    eligible: frozenset[str] = frozenset()
    due: set[str] = attrs.Factory(set)


@attrs.define
class Device:
    name: str
    client: Paho | None = None
    #: filter -> the number of the first publish after its SUBACK (subscribed since)
    subs: dict[str, int] = attrs.Factory(dict)
    got: list[mqtt.MQTTMessage] = attrs.Factory(list)
    old: list[Paho] = attrs.Factory(list)


class Trial:
    def __init__(self, tmp_path: Path, seed: int, protocol: int) -> None:
        self.tmp_path = tmp_path
        self.rng = random.Random(seed)
        self.protocol = protocol
        self.port = free_port()
        config = CONFIG.format(port=self.port, meshbus_port=free_port())
        (tmp_path / "edge.toml").write_text(config)
        self.node: Child | None = None
        self.devices = {name: Device(name) for name in DEVICES}
        self.sent: list[Sent] = []
        self.publisher: Paho | None = None
        self.steps: list[str] = []
        self.kills = 0
        self.pending: list[tuple[Sent, mqtt.MQTTMessageInfo]] = []
        #: topic -> the values it may hold: the last acknowledged (None before one is)
        #: and any later ones whose PUBACK a kill cut off
        self.retained: dict[str, list[bytes | None]] = {}
        self.kept: dict[str, bytes] = {}

    # --- the node and the clients -----------------------------------------------------

    def start(self) -> None:
        self.node = Child([sys.executable, "-m", "meshbus", "run", "edge.toml"], self.tmp_path)
        self.node.wait_for("meshbus run: node edge listening")

    def stop(self) -> None:
        if self.node is not None:
            self.node.close()
            self.node = None

    def device_client(self, name: str) -> Paho:
        options = {"clean_session": False} if self.protocol == V311 else {}
        return self.quick(Paho(self.port, name, self.protocol, **options))

    @staticmethod
    def quick(client: Paho) -> Paho:
        # After a kill paho waits to reconnect in steps of up to a second, and
        # loop_stop() waits for that: a short delay keeps a trial short.
        client.client.reconnect_delay_set(0.05, 0.05)  # type: ignore[arg-type]
        return client

    async def connect(self, device: Device) -> Paho:
        client = self.device_client(device.name)
        await client.connect(clean_start=False, session_expiry=3600)
        device.client = client
        return client

    async def leave(self, device: Device) -> None:
        client, device.client = device.client, None
        assert client is not None
        await client.disconnect()
        device.old.append(client)

    async def publisher_client(self) -> Paho:
        if self.publisher is None:
            self.publisher = self.quick(Paho(self.port, "shop", self.protocol))
            await self.publisher.connect()
        return self.publisher

    # --- the steps ----------------------------------------------------------------------

    async def run(self) -> None:
        self.start()
        for device in self.devices.values():
            client = await self.connect(device)
            mqtt_filter = self.rng.choice(FILTERS)
            self.steps.append(f"{device.name} subscribes {mqtt_filter}")
            await client.subscribe((mqtt_filter, 1))
            device.subs[mqtt_filter] = 0
        for _ in range(STEPS):
            await self.step()
        await self.finish()

    async def step(self) -> None:
        rng = self.rng
        device = self.devices[rng.choice(DEVICES)]
        roll = rng.random()
        if roll < 0.2:
            mqtt_filter = rng.choice(FILTERS)
            client = device.client
            if client is None:
                self.steps.append(f"connect {device.name}")
                client = await self.connect(device)
            if mqtt_filter in device.subs:
                self.steps.append(f"{device.name} unsubscribes {mqtt_filter}")
                await client.unsubscribe(mqtt_filter)
                del device.subs[mqtt_filter]
                self.maybe_after_unsubscribe(device.name, mqtt_filter)
            else:
                self.steps.append(f"{device.name} subscribes {mqtt_filter}")
                await client.subscribe((mqtt_filter, 1))
                device.subs[mqtt_filter] = len(self.sent)
        elif roll < 0.35:
            if device.client is None:
                self.steps.append(f"connect {device.name}")
                await self.connect(device)
            else:
                self.steps.append(f"disconnect {device.name}")
                await self.leave(device)
        elif roll < 0.85:
            await self.publish(rng.randint(1, 8), wait=True)
        else:
            await self.publish(rng.randint(1, 30), wait=False)
            await self.kill()

    def maybe_after_unsubscribe(self, name: str, mqtt_filter: str) -> None:
        for sent in self.sent:
            if name in sent.due and matches(mqtt_filter, sent.topic):
                sent.due.discard(name)

    async def publish(self, count: int, *, wait: bool) -> None:
        publisher = await self.publisher_client()
        infos = []
        retain = self.rng.random() < 0.15
        for _ in range(count):
            number = len(self.sent)
            topic = self.rng.choice(RETAINED if retain else TOPICS)
            sent = Sent(number, topic, b"m%d" % number)
            sent.eligible = frozenset(
                d.name
                for d in self.devices.values()
                if any(matches(f, topic) and since <= number for f, since in d.subs.items())
            )
            sent.due = set(sent.eligible)
            self.sent.append(sent)
            if retain:
                self.retained.setdefault(topic, [None]).append(sent.payload)
            infos.append((sent, publisher.client.publish(topic, sent.payload, 1, retain)))
        self.steps.append(
            f"publish {infos[0][0].number}..{infos[-1][0].number}"
            + (" retained" if retain else "")
            + ("" if wait else ", then kill the node")
        )
        if wait:
            for sent, info in infos:
                await publisher.wait_published(info)
                sent.acked = True
            for sent, _ in infos:
                if sent.topic in self.retained:
                    self.retained[sent.topic] = [sent.payload]  # acked: the older ones are gone
        else:
            self.pending = infos

    async def kill(self) -> None:
        assert self.node is not None
        self.node.finish(signal.SIGKILL)
        self.kills += 1
        for sent, info in self.pending:  # acked before the kill, or unknown
            sent.acked = info.is_published() or None
            if sent.acked and sent.topic in self.retained:
                values = self.retained[sent.topic]
                del values[: values.index(sent.payload)]
        self.pending = []
        online = [d for d in self.devices.values() if d.client is not None]
        for device in online:
            await self.leave(device)
        if self.publisher is not None:
            await self.publisher.disconnect()
            self.publisher = None
        self.stop()
        self.start()
        for device in online:
            await self.connect(device)

    # --- the end ------------------------------------------------------------------------

    async def finish(self) -> None:
        self.steps.append("the end: every device connects")
        for device in self.devices.values():
            if device.client is None:
                await self.connect(device)

        def arrived() -> bool:
            for device in self.devices.values():
                assert device.client is not None
                have = {m.payload for m in self.received(device)}
                if any(device.name in s.due and s.payload not in have for s in self.acked()):
                    return False
            return True

        with contextlib.suppress(TimeoutError):  # problems() says what is missing
            await eventually(arrived, timeout=15)
        audit = Paho(self.port, "audit", V5)
        await audit.connect()
        await audit.subscribe(("r/#", 1))

        def kept_all() -> bool:
            while (message := self.next(audit)) is not None:
                self.kept[message.topic] = bytes(message.payload)
            return all(t in self.kept for t, values in self.retained.items() if None not in values)

        with contextlib.suppress(TimeoutError):
            await eventually(kept_all, timeout=5)
        await audit.disconnect()
        for device in self.devices.values():
            await self.leave(device)
        if self.publisher is not None:
            await self.publisher.disconnect()

    @staticmethod
    def next(client: Paho) -> mqtt.MQTTMessage | None:
        return None if client.messages.empty() else client.messages.get_nowait()

    def acked(self) -> list[Sent]:
        return [s for s in self.sent if s.acked]

    @staticmethod
    def received(device: Device) -> list[mqtt.MQTTMessage]:
        for client in [*device.old, device.client]:
            if client is not None:
                while (message := Trial.next(client)) is not None:
                    device.got.append(message)
        return device.got

    # --- the checks ---------------------------------------------------------------------

    def problems(self) -> list[str]:
        problems: list[str] = []
        by_payload = {s.payload: s for s in self.sent}
        for device in self.devices.values():
            got = self.received(device)
            seen: dict[bytes, int] = defaultdict(int)
            order: dict[str, list[int]] = defaultdict(list)
            for message in got:
                payload = bytes(message.payload)
                sent = by_payload.get(payload)
                if sent is None or sent.topic != message.topic:
                    problems.append(f"{device.name}: {payload!r} was never published")
                    continue
                if device.name not in sent.eligible:
                    problems.append(f"{device.name}: {sent.payload!r} matched no subscription")
                seen[payload] += 1
                if seen[payload] > 1 and not message.dup:
                    problems.append(f"{device.name}: {sent.payload!r} came again without DUP")
                if seen[payload] == 1:
                    order[sent.topic].append(sent.number)
            for sent in self.acked():
                if device.name in sent.due and not seen[sent.payload]:
                    problems.append(f"{device.name}: acknowledged {sent.payload!r} is lost")
            for topic, numbers in order.items():
                due = [n for n in numbers if self.sent[n].acked and device.name in self.sent[n].due]
                if due != sorted(due):
                    problems.append(f"{device.name}: {topic} out of order: {due}")
        for topic, values in self.retained.items():
            kept = self.kept.get(topic)
            if kept not in values:
                problems.append(f"retained {topic}: {kept!r}, expected one of {values}")
        return problems


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the node runs in a process of its own: one loop is enough here


@pytest.mark.parametrize("protocol", [V311, V5], ids=["3.1.1", "5"])
@pytest.mark.parametrize("seed", range(TRIALS))
async def test_sessions_survive_kill_9_trials(tmp_path: Path, seed: int, protocol: int) -> None:
    trial = Trial(tmp_path, seed, protocol)
    try:
        await trial.run()
    finally:
        trial.stop()
    problems = trial.problems()
    assert not problems, "\n".join([*problems, "steps:", *trial.steps])
    # The trial did something: kills, and acknowledged messages that were due.
    assert trial.kills >= 1
    assert sum(1 for s in trial.acked() if s.due) >= 20
