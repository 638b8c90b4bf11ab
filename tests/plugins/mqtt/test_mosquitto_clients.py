"""The real ``mosquitto_pub`` and ``mosquitto_sub`` (Debian's mosquitto-clients) against a
node's MQTT listener, on MQTT 3.1.1 and 5 (SPEC 13).

Each client is its own process, started with ``anyio.open_process`` or
``anyio.run_process`` so the node keeps running meanwhile. A ``mosquitto_sub`` always
gets a client id (``-i``), and the tests wait for its subscription to show in the
listener's session registry before anything is published: no fixed sleeps. Every wait
is bounded, and a process still running when its test ends is killed.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from subprocess import CompletedProcess

import anyio
import anyio.abc
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from meshbus import Message, Node, Session
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener

from ._clients import WAIT, eventually, needs

pytestmark = [pytest.mark.anyio, needs("mosquitto_sub"), needs("mosquitto_pub")]

VERSIONS = pytest.mark.parametrize("version", ["mqttv311", "mqttv5"], ids=["3.1.1", "5"])


class Sub:
    """A running ``mosquitto_sub``: its standard output read line by line."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        assert process.stdout is not None
        self.stdout = BufferedByteReceiveStream(process.stdout)

    async def line(self) -> str:
        """The next line it prints (fails the test after :data:`WAIT` seconds)."""
        with anyio.fail_after(WAIT):
            return (await self.stdout.receive_until(b"\n", 1 << 20)).decode()

    async def finished(self) -> tuple[int, list[str]]:
        """Wait for it to exit; its status and the lines it printed that were not read."""
        with anyio.fail_after(WAIT):
            status = await self.process.wait()
            chunks = []
            while True:
                try:
                    chunks.append(await self.stdout.receive())
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    break
        return status, b"".join(chunks).decode().splitlines()


def command(program: str, listener: MqttListener, version: str, *args: str) -> list[str]:
    return [program, "-h", "127.0.0.1", "-p", str(listener.port), "-V", version, *args]


@asynccontextmanager
async def mosquitto_sub(listener: MqttListener, version: str, *args: str) -> AsyncIterator[Sub]:
    """``mosquitto_sub ARGS`` running; killed (if it still runs) when the block ends."""
    process = await anyio.open_process(command("mosquitto_sub", listener, version, *args))
    try:
        yield Sub(process)
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
            await process.aclose()


async def mosquitto_pub(
    listener: MqttListener, version: str, *args: str, check: bool = True
) -> CompletedProcess[bytes]:
    """Run ``mosquitto_pub ARGS`` to its end (bounded)."""
    with anyio.fail_after(WAIT):
        return await anyio.run_process(
            command("mosquitto_pub", listener, version, *args), check=check
        )


async def subscribed(
    listener: MqttListener, client_id: str, mqtt_filter: str, vpn: str = "default"
) -> None:
    """Wait until client ``client_id`` holds ``mqtt_filter`` (routing is in place then)."""

    def holds() -> bool:
        state = listener.registry.get(vpn, client_id)
        return state is not None and mqtt_filter in state.subscriptions

    await eventually(holds)


def drain(session: Session) -> list[Message]:
    return list(iter(session.receive_nowait, None))


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    async with Node(name="edge") as running:
        yield running


@pytest.fixture
async def listener(node: Node) -> MqttListener:
    return await start_mqtt_listener(node, MqttListenerSettings(port=0))


# --- publish and subscribe --------------------------------------------------------------


@VERSIONS
async def test_a_wildcard_subscription_gets_what_mosquitto_pub_publishes(
    listener: MqttListener, version: str
) -> None:
    args = ("-i", "watcher", "-t", "plant/+/temp", "-t", "alarms/#", "-v", "-C", "4")
    async with mosquitto_sub(listener, version, *args) as sub:
        await subscribed(listener, "watcher", "plant/+/temp")
        await subscribed(listener, "watcher", "alarms/#")
        await mosquitto_pub(listener, version, "-t", "plant/boiler/temp", "-m", "71")
        await mosquitto_pub(listener, version, "-t", "plant/boiler/pressure", "-m", "no")
        await mosquitto_pub(listener, version, "-t", "alarms", "-m", "parent", "-q", "1")
        await mosquitto_pub(listener, version, "-t", "alarms/fire/1", "-m", "hot", "-q", "1")
        await mosquitto_pub(listener, version, "-t", "plant/pump/temp", "-m", "40", "-q", "2")
        status, lines = await sub.finished()
    assert status == 0
    assert lines == [
        "plant/boiler/temp 71",
        "alarms parent",  # '#' matches its parent level too
        "alarms/fire/1 hot",
        "plant/pump/temp 40",
    ]
    assert listener.statistics().received == 5


@VERSIONS
async def test_a_retained_message_reaches_a_later_subscriber(
    listener: MqttListener, version: str
) -> None:
    await mosquitto_pub(listener, version, "-t", "state/boiler", "-m", "on", "-r", "-q", "1")
    await mosquitto_pub(listener, version, "-t", "state/pump", "-m", "off", "-r")
    await mosquitto_pub(listener, version, "-t", "state/pump", "-n", "-r")  # cleared
    args = ("-i", "late", "-t", "state/#", "-F", "%t %p %r", "-C", "2")
    async with mosquitto_sub(listener, version, *args) as sub:
        assert await sub.line() == "state/boiler on 1"  # given at once, flagged retained
        await subscribed(listener, "late", "state/#")
        await mosquitto_pub(listener, version, "-t", "state/boiler", "-m", "off", "-r")
        status, lines = await sub.finished()
    assert status == 0
    assert lines == ["state/boiler off 0"]  # a live message is not flagged


@VERSIONS
async def test_a_shared_subscription_splits_the_messages(
    listener: MqttListener, version: str
) -> None:
    got: list[tuple[str, str]] = []

    async def collect(sub: Sub, member: str) -> None:
        while True:
            got.append((member, await sub.line()))

    share = "$share/workers/jobs/#"
    async with (
        mosquitto_sub(listener, version, "-i", "w1", "-t", share, "-v") as first,
        mosquitto_sub(listener, version, "-i", "w2", "-t", share, "-v") as second,
        anyio.create_task_group() as tg,
    ):
        await subscribed(listener, "w1", share)
        await subscribed(listener, "w2", share)
        tg.start_soon(collect, first, "w1")
        tg.start_soon(collect, second, "w2")
        lines = "".join(f"{i}\n" for i in range(20)).encode()
        with anyio.fail_after(WAIT):
            await anyio.run_process(
                command("mosquitto_pub", listener, version, "-t", "jobs/x", "-q", "1", "-l"),
                input=lines,
            )
        await eventually(lambda: len(got) >= 20)
        await anyio.sleep(0.2)  # a copy too many would come now
        tg.cancel_scope.cancel()
    assert sorted(int(line.removeprefix("jobs/x ")) for _, line in got) == list(range(20))
    assert {member for member, _ in got} == {"w1", "w2"}  # each took some, none twice


@VERSIONS
async def test_a_persistent_qos1_session_gets_what_was_published_while_it_was_away(
    listener: MqttListener, version: str
) -> None:
    args = ("-c", "-i", "sleepy", "-q", "1", "-t", "orders/#", "-v")
    async with mosquitto_sub(listener, version, *args) as sub:
        await subscribed(listener, "sleepy", "orders/#")
        sub.process.send_signal(signal.SIGKILL)  # gone without a DISCONNECT
        await sub.finished()

    def away() -> bool:
        state = listener.registry.get("default", "sleepy")
        return state is not None and state.connection is None

    await eventually(away)
    for i in range(3):
        await mosquitto_pub(listener, version, "-t", f"orders/{i}", "-m", f"#{i}", "-q", "1")
    async with mosquitto_sub(listener, version, *args, "-C", "4") as sub:
        assert [await sub.line() for _ in range(3)] == [
            "orders/0 #0",
            "orders/1 #1",
            "orders/2 #2",
        ]
        await subscribed(listener, "sleepy", "orders/#")
        await mosquitto_pub(listener, version, "-t", "orders/live", "-m", "now", "-q", "1")
        status, lines = await sub.finished()
    assert status == 0
    assert lines == ["orders/live now"]


# --- MQTT 5 properties and native sessions ------------------------------------------------


async def test_user_properties_from_mosquitto_pub_are_headers_of_native_sessions(
    node: Node, listener: MqttListener
) -> None:
    native = node.connect(client_name="native")
    native.subscribe("t/>")
    await mosquitto_pub(
        listener,
        "mqttv5",
        *("-t", "t/reading", "-m", "42", "-q", "1"),
        *("-D", "publish", "user-property", "unit", "bar"),
        *("-D", "publish", "user-property", "site", "north"),
    )
    await eventually(lambda: len(native.egress) >= 1)
    (message,) = drain(native)
    assert (message.topic, message.payload) == ("t/reading", b"42")
    assert message.headers == {"unit": "bar", "site": "north"}


@VERSIONS
async def test_headers_of_native_publishes_reach_mosquitto_sub(
    node: Node, listener: MqttListener, version: str
) -> None:
    native = node.connect(client_name="native")
    args = ("-i", "reader", "-t", "t/#", "-F", "%t|%p|%P", "-C", "1")
    async with mosquitto_sub(listener, version, *args) as sub:
        await subscribed(listener, "reader", "t/#")
        native.publish("t/x", b"pay", headers={"unit": "bar", "n": 1})
        status, lines = await sub.finished()
    assert status == 0
    # MQTT 3.1.1 has no properties: the message comes without them.
    assert lines == ["t/x|pay|unit:bar n:1" if version == "mqttv5" else "t/x|pay|"]


# --- logins -------------------------------------------------------------------------------


@VERSIONS
async def test_a_username_and_password_log_in_to_a_basic_vpn(node: Node, version: str) -> None:
    vpn = node.create_vpn("v", authentication="basic")
    vpn.add_user("u", password="p")
    listener = await start_mqtt_listener(node, MqttListenerSettings(port=0, vpn="v"))
    login = ("-u", "u", "-P", "p")
    async with mosquitto_sub(listener, version, *login, "-i", "in", "-t", "t/#", "-C", "1") as sub:
        await subscribed(listener, "in", "t/#", vpn="v")
        await mosquitto_pub(listener, version, *login, "-t", "t/1", "-m", "hello", "-q", "1")
        status, lines = await sub.finished()
    assert (status, lines) == (0, ["hello"])
    assert listener.statistics().logins == 2
    assert "in" not in node.vpn().sessions  # it logged in to "v", not to the default VPN


@VERSIONS
@pytest.mark.parametrize(
    "login",
    [("-u", "u", "-P", "wrong"), ("-u", "nobody", "-P", "p"), ()],
    ids=["wrong password", "unknown user", "anonymous"],
)
async def test_a_refused_login_makes_mosquitto_sub_exit_non_zero(
    node: Node, version: str, login: tuple[str, ...]
) -> None:
    vpn = node.create_vpn("v", authentication="basic")
    vpn.add_user("u", password="p")
    listener = await start_mqtt_listener(node, MqttListenerSettings(port=0, vpn="v"))
    async with mosquitto_sub(listener, version, *login, "-i", "x", "-t", "t/#", "-C", "1") as sub:
        status, lines = await sub.finished()
    assert status != 0
    assert lines == []
    published = await mosquitto_pub(listener, version, *login, "-t", "t/1", "-m", "x", check=False)
    assert published.returncode != 0
    stats = listener.statistics()
    assert (stats.logins, stats.refused, stats.received) == (0, 2, 0)
    assert not vpn.sessions
