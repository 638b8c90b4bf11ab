"""End to end: a standalone node and command-line clients, each its own process.

``meshbus run`` serves a configuration file; ``meshbus pub``, ``sub`` and ``stats``
reach it over plain TCP, over TLS with certificates made by ``meshbus certs``, and
over TLS with compression. What is checked is what a user of the commands sees:
exit statuses, standard output and standard error (and the node's log). The last
two tests are in-process regression tests: they pin down, deterministically, two ways
a queue's messages got stuck that a busy machine caused in the end-to-end test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import anyio
import orjson
import pytest

from meshbus import Node
from meshbus.transports import ListenerSettings, connect, start_server
from meshbus.transports._connection import Connection  # patched by the last test

STEP = 15.0  # seconds any one step (a command, a line of output) may take
NODE = "e2e"
LISTENING = f"meshbus run: node {NODE} listening on "
PASSWORD = "boiler-room-secret"
TRANSPORTS = ("tcp", "tls", "tls+compression")


# A test run started in the background by a non-interactive shell ignores SIGINT, and
# so would every process it starts: a CLI that ignores SIGINT never ends on the
# Ctrl-C these tests send. Only then (preexec_fn is best avoided with threads about),
# each child starts with SIGINT back to its default.
_SIGINT_IGNORED = sys.platform != "win32" and signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Process:
    """``python -m meshbus ARGS``, running; both outputs are collected line by line."""

    def __init__(
        self, args: list[str], cwd: Path, env: dict[str, str], node: Process | None = None
    ) -> None:
        self.args = args
        self.node = node  # whose log to show when this process disappoints
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "meshbus", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_interruptible if _SIGINT_IGNORED else None,
        )
        self.output: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._ended: set[str] = set()
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(name, stream), daemon=True)
            for name, stream in (("stdout", self.popen.stdout), ("stderr", self.popen.stderr))
        ]
        for reader in self._readers:
            reader.start()

    @property
    def stdout(self) -> list[str]:
        return self.output["stdout"]

    @property
    def stderr(self) -> list[str]:
        return self.output["stderr"]

    def _read(self, name: str, stream: IO[str] | None) -> None:
        assert stream is not None
        try:
            for line in stream:
                with self._changed:
                    self.output[name].append(line.rstrip("\n"))
                    self._changed.notify_all()
        except (OSError, ValueError):  # closed under us when the test gives up
            pass
        finally:
            with self._changed:
                self._ended.add(name)
                self._changed.notify_all()

    def wait_for(self, name: str, prefix: str) -> str:
        """The first line of ``name`` ("stdout" or "stderr") starting with ``prefix``."""
        deadline = time.monotonic() + STEP
        with self._changed:
            while True:
                for line in self.output[name]:
                    if line.startswith(prefix):
                        return line
                left = deadline - time.monotonic()
                if name in self._ended or left <= 0:
                    why = "it ended" if name in self._ended else f"{STEP} s passed"
                    raise AssertionError(
                        f"meshbus {' '.join(self.args)}: no {name} line {prefix!r} before "
                        f"{why}; {self.outputs()}"
                    )
                self._changed.wait(left)

    def outputs(self) -> str:
        """Both outputs so far, and the node's log, for a failure message."""
        text = f"stdout {self.stdout}, stderr {self.stderr}"
        return text if self.node is None else f"{text}; the node's log: {self.node.stderr}"

    def finish(self, signum: int | None = None) -> int:
        """Send ``signum`` (if any), wait for the exit and all output; the exit status."""
        if signum is not None:
            self.popen.send_signal(signum)
        try:
            status = self.popen.wait(STEP)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"meshbus {' '.join(self.args)}: still running after {STEP} s; {self.outputs()}"
            ) from None
        for reader in self._readers:
            reader.join(STEP)
        return status

    def close(self) -> None:
        """Kill the process if it still runs, and release its pipes."""
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(STEP)
        for reader in self._readers:
            reader.join(STEP)
        for stream in (self.popen.stdout, self.popen.stderr):
            assert stream is not None
            stream.close()


Start = Callable[[list[str]], Process]


class Setup:
    """A node's folder and environment, and how alice reaches its listener."""

    def __init__(self, folder: Path, transport: str) -> None:
        self.folder = folder
        self.transport = transport
        self.tls = transport.startswith("tls")
        self.compression = transport.endswith("+compression")
        self.certs = folder / "certs"
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("MESHBUS_URL", "MESHBUS_PASSWORD")
        }
        self.env["ALICE_PASSWORD"] = PASSWORD
        self.url = ""  # known once the node listens
        self.node: Process | None = None

    def options(self, *, username: str = "alice", certificate: bool = True) -> list[str]:
        """The connection options of ``meshbus pub/sub/stats`` for this transport."""
        options = ["--url", self.url, "--vpn", "plant", "-u", username]
        if self.tls:
            options += ["--ca", str(self.certs / "ca.pem")]
            if certificate:
                options += [
                    "--cert",
                    str(self.certs / "alice.pem"),
                    "--key",
                    str(self.certs / "alice-key.pem"),
                ]
        else:
            options += ["-P", PASSWORD]
        if self.compression:
            options.append("--compression")
        return options

    def command(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``python -m meshbus ARGS`` to its end (bounded); its outputs as text."""
        try:
            return subprocess.run(
                [sys.executable, "-m", "meshbus", *args],
                cwd=self.folder,
                env=self.env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=STEP,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:  # killed by subprocess.run
            raise AssertionError(
                f"meshbus {' '.join(args)}: still running after {STEP} s; "
                f"stdout {exc.stdout!r}, stderr {exc.stderr!r}; "
                f"the node's log: {self.node.stderr if self.node else None}"
            ) from None

    def write_config(self) -> Path:
        text = f"""
            [node]
            name = "{NODE}"
            data_dir = "spool"

            [[listeners]]
            name = "field"
            host = "127.0.0.1"
            port = 0
            compression = {"true" if self.compression else "false"}
        """
        if self.tls:
            text += """
            [listeners.tls]
            certificate = "certs/server.pem"
            private_key = "certs/server-key.pem"
            ca = "certs/ca.pem"
            require_client_certificate = true

            [vpns.plant]
            authentication = "client-certificate"
            [vpns.plant.users.alice]
            management = true  # meshbus stats shows her the listeners' counters
            [vpns.plant.users.bob]
            """
        else:
            text += """
            [vpns.plant]
            authentication = "basic"
            [vpns.plant.users.alice]
            password = "${ENV:ALICE_PASSWORD}"
            management = true  # meshbus stats shows her the listeners' counters
            """
        text += """
            [vpns.plant.queues.alarms]
            subscriptions = ["alarms/>"]
        """
        path = self.folder / "node.toml"
        path.write_text(text, encoding="utf-8")
        return path

    def start_node(self, start: Start) -> Process:
        """Make certificates (TLS), write the configuration and start ``meshbus run``."""
        if self.tls:
            made = self.command("certs", "all", "--dir", str(self.certs), "--client", "alice")
            assert made.returncode == 0, made.stderr
        self.write_config()
        node = self.node = start(["run", "node.toml"])
        line = node.wait_for("stdout", LISTENING)
        self.url = line.removeprefix(LISTENING)
        scheme = "tls" if self.tls else "tcp"
        assert self.url.startswith(f"{scheme}://127.0.0.1:"), line
        return node

    def statistics(self) -> dict[str, Any]:
        """The listener's counters, as ``meshbus stats`` shows them."""
        shown = self.command("stats", *self.options())
        assert shown.returncode == 0, shown.stderr
        stats = orjson.loads(shown.stdout)
        assert stats["node"] == NODE
        assert list(stats["listeners"]) == [self.url]
        return stats["listeners"][self.url]  # type: ignore[no-any-return]


@pytest.fixture
def start(setup: Setup) -> Iterator[Start]:
    """Start ``meshbus`` processes in the node's folder; each is killed if still running."""
    started: list[Process] = []

    def start(args: list[str]) -> Process:
        started.append(Process(args, setup.folder, setup.env, setup.node))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            process.close()


@pytest.fixture(params=TRANSPORTS)
def setup(tmp_path: Path, request: pytest.FixtureRequest) -> Setup:
    return Setup(tmp_path, request.param)


def json_lines(lines: list[str]) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in lines]


@pytest.mark.slow  # 7 to 9 s for the three transports (14 s on a busy machine): 30 processes
def test_pub_sub_queues_and_stats_across_processes(setup: Setup, start: Start) -> None:
    node = setup.start_node(start)
    assert (setup.folder / "spool").is_dir()

    # Direct messages: a subscriber, then a publisher, each its own process.
    sub = start(["sub", *setup.options(), "plant/>", "-C", "5", "-F", "json"])
    sub.wait_for("stderr", "subscribed to plant/>")
    pub = setup.command(
        "pub",
        *setup.options(),
        "--client-name",
        "gauge",
        "--timestamps",
        "plant/boiler/pressure",
        "2.4 bar",
        "-n",
        "5",
    )
    assert pub.returncode == 0, pub.stderr
    assert pub.stderr.splitlines() == ["published 5 message(s) to plant/boiler/pressure"]
    assert sub.finish() == 0, sub.stderr
    received = json_lines(sub.stdout)
    assert len(received) == 5, sub.stdout
    for message in received:
        assert message["topic"] == "plant/boiler/pressure"
        assert message["payload"] == "2.4 bar"
        assert message["sender"] == "gauge"
        assert message["delivery_mode"] == "direct"
        assert abs(message["timestamp"] - time.time()) < 60  # stamped by the node

    # Guaranteed messages: spooled by the queue, then consumed by a later process.
    pub = setup.command("pub", *setup.options(), "-g", "alarms/boiler", "pressure high", "-n", "3")
    assert pub.returncode == 0, pub.stderr
    assert pub.stderr.splitlines() == ["published 3 message(s) to alarms/boiler"]
    queued = setup.command("sub", *setup.options(), "--queue", "alarms", "-C", "3", "-F", "json")
    assert queued.returncode == 0, queued.stderr
    assert queued.stderr.splitlines() == ["bound to queue alarms"]
    received = json_lines(queued.stdout.splitlines())
    assert [(m["topic"], m["payload"], m["delivery_mode"]) for m in received] == [
        ("alarms/boiler", "pressure high", "persistent")
    ] * 3
    assert all(m["sender"] for m in received)
    assert all(abs(m["timestamp"] - time.time()) < 60 for m in received)

    # sub, pub, pub -g, sub --queue and this stats itself: 5 logins.
    stats = setup.statistics()
    assert (stats["logins"], stats["refused"], stats["failed"]) == (5, 0, 0), stats

    # Refused logins exit non-zero and say why on standard error.
    expected = {"refused": 1, "failed": 0}
    if setup.tls:
        # A client without a certificate fails the TLS handshake itself: the listener
        # counts it as "failed", and the client can only guess why (TLS 1.3 tells it late).
        refused = setup.command("sub", *setup.options(certificate=False), "plant/>", "-C", "1")
        assert refused.returncode == 1, refused
        assert refused.stdout == ""
        (error,) = refused.stderr.splitlines()
        assert error.startswith("meshbus sub: error: "), error
        assert "client certificate" in error
        # bob is configured, but the certificate is alice's.
        refused = setup.command("sub", *setup.options(username="bob"), "plant/>", "-C", "1")
        reason = "connect denied for user 'bob': login refused"  # the reason is the node's
        expected["failed"] = 1
    else:
        options = setup.options()
        options[options.index("-P") + 1] = "not-the-password"
        refused = setup.command("sub", *options, "plant/>", "-C", "1")
        reason = "connect denied for user 'alice': login refused"
    assert refused.returncode == 1, refused
    assert refused.stdout == ""
    (error,) = refused.stderr.splitlines()
    assert error.startswith("meshbus sub: error: "), error
    assert reason in error

    stats = setup.statistics()
    assert stats["logins"] == 6, stats
    assert {key: stats[key] for key in expected} == expected, stats

    assert node.finish(signal.SIGTERM) == 0, node.stderr
    assert node.stdout[-1] == "meshbus run: stopping (SIGTERM)"
    # Whether compression was negotiated shows only in the node's log of each login.
    logins = [line for line in node.stderr if " as 'alice' in VPN 'plant'" in line]
    assert len(logins) == 6, node.stderr
    for line in logins:
        assert line.endswith(" (lz4)") is setup.compression, line


async def test_messages_read_with_the_bind_answer_are_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process and deterministic, what `meshbus sub --queue` on a busy machine met:
    the consumer reads late, so the node's BIND answer and the deliveries of the messages
    the queue already held come in one read (they were dropped before the flow was known)."""
    async with Node(name="e2e") as node:
        node.guaranteed.create_queue("alarms", subscriptions=["alarms/>"])
        server = await start_server(node, ListenerSettings(port=0))
        async with connect(server.url) as sender:
            for _ in range(3):
                await sender.send("alarms/boiler", b"pressure high")

        receive_frames = Connection.receive_frames

        async def late_receive_frames(self: Connection) -> list[tuple[int, Any, bytes]]:
            if self.peer == server.url:  # the client's end only
                await anyio.sleep(0.2)
            return await receive_frames(self)

        monkeypatch.setattr(Connection, "receive_frames", late_receive_frames)
        received: list[bytes] = []
        async with connect(server.url) as consumer:
            flow = await consumer.bind("alarms")
            with anyio.move_on_after(1):
                while len(received) < 3:
                    message = await flow.receive()
                    flow.ack(message)
                    received.append(message.payload)
        assert received == [b"pressure high"] * 3


async def test_a_message_stored_while_the_flow_commits_acks_is_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In-process and deterministic, what a bound `meshbus sub --queue` met when the last
    message was committed while its flow was busy with the store: the wake-up was lost
    and the flow waited forever with the message in the queue."""
    async with Node(name="e2e") as node:
        node.guaranteed.create_queue("alarms", subscriptions=["alarms/>"])
        producer, consumer = node.connect(), node.connect()
        flow = await consumer.bind("alarms")
        await producer.send("alarms/boiler", b"first")
        flow.ack(await flow.receive())  # committed by the flow's next receive()

        store = node.guaranteed.store
        ack = store.ack

        async def slow_ack(endpoint: str, message_ids: Iterable[int]) -> int:  # a busy disk
            await anyio.sleep(0.3)
            return await ack(endpoint, message_ids)

        monkeypatch.setattr(store, "ack", slow_ack)
        received: list[bytes] = []

        async def consume() -> None:
            received.append((await flow.receive()).payload)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.sleep(0.05)  # the flow found nothing and now commits the ack
            await producer.send("alarms/boiler", b"second")
            with anyio.move_on_after(1):
                while not received:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        assert received == [b"second"]
