"""Node-to-node links: what one hop adds, two nodes in one process.

Run from the checkout with the dev virtualenv (``pip install -e '.[dev,bench]'``)::

    .venv/bin/python bench/links.py             # N=200,000, M=2,000, 5 rounds
    .venv/bin/python bench/links.py --quick     # N=20,000, M=500, 3 rounds: a smoke run
    .venv/bin/python bench/links.py -v          # also every run's figure

One line per figure; a benchmark, not a test: the exit status is 0 even when a target
is missed.

What is measured:

* ``links memory``: two nodes in this process, A and B, joined by a link over a
  :class:`~meshbus.transports.MemoryNetwork` (B dials A with ``open_link``), on the
  real clock. The link carries both ways: B wants ``bench/>`` from A, and A asks B
  for ``bench/>`` over the link it accepted. Against it, the same clients on one
  node without links.

  - Round trips: a requester session on A publishes with ``reply_to``, a responder
    session on B (a task doing ``async for``) publishes each payload back; the
    requester awaits ``receive()``. Across the link a round trip crosses it twice,
    so the added latency per hop is (p50 linked - p50 one node) / 2. Wall clock.
  - Throughput: a publisher session on A publishes N messages in batches of 100,
    then ``await anyio.sleep(0)``; a subscriber session on B (``async for``, a
    client profile whose egress limits hold a whole run) counts them; the timer
    stops when it has all N. Thread CPU time, as in ``inproc.py`` (one thread,
    nothing blocks; ``--wall`` for ``perf_counter``). Counts and the link's
    forward failures are asserted.

* Rounds: ``--rounds`` (5, quick 3); in each round every contender runs once, in an
  order that rotates between rounds, so a slow spell of the shared machine falls on
  all of them. Figures are medians over the rounds (of each run's p50 and p99 for
  round trips); the added latency per hop is the difference of the medians, halved.

Lines (targets from the issue):

* ``links memory hop latency``: added p50 per hop in one process (target <= 20 us);
* ``links memory throughput``: across the link / on one node (target >= 0.85x).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import _harness
import anyio
import attrs
from _harness import verdict
from _peers import PAYLOAD_SIZE, READY_TIMEOUT
from transport import RoundTrips

from meshbus import ClientProfile, Link, LinkState, Node, Vpn
from meshbus.transports import (
    ConnectSettings,
    ListenerSettings,
    MemoryNetwork,
    WireLink,
    open_link,
    start_server,
)

THIS = Path(__file__).resolve()
BATCH = 100  # memory throughput: publishes between two checkpoints, as in inproc.py
WANTS = ("bench/>",)  # what each side of a meshbus link asks the other for

# Targets from the issue.
MEMORY_HOP_US = 20.0
MIN_THROUGHPUT_RATIO = 0.85


def say(line: str) -> None:
    print(line, flush=True)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "n/a"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# --- meshbus pieces ---------------------------------------------------------------------------


def make_node(name: str) -> Node:
    """A node on the real clock whose ``default`` users may open links, with a ``bench``
    user whose egress limits hold a whole throughput run."""
    node = Node(name=name, node_id=name)
    vpn = node.vpn()
    default = vpn.client_profiles["default"]
    vpn.add_client_profile(attrs.evolve(default, allow_bridge_connections=True))
    vpn.add_client_profile(
        ClientProfile("bench", egress_max_messages=10_000_000, egress_max_bytes=4 * 1024**3)
    )
    vpn.add_user("bench", client_profile="bench")
    return node


async def ask_back(vpn: Vpn) -> Link:
    """Wait for the link ``vpn`` accepts, then ask its peer for ``WANTS`` over it, so that
    the one link carries messages both ways; return once the peer has taken them.

    Asked only once the peer's own SUBSCRIBEs arrived: frames that reach the dialling
    side in the read that brings it the WELCOME are dropped by its link, so anything
    sent before it reads the connection as a link would be lost.
    """
    with anyio.fail_after(READY_TIMEOUT):
        while not len(vpn.links):
            await anyio.sleep(0.01)
        (link,) = vpn.links
        assert isinstance(link, WireLink)
        while not set(WANTS) <= set(link.interest):
            await anyio.sleep(0.01)
        for topic_filter in WANTS:
            link.want(topic_filter)
        await settle()  # the tasks link.want started have queued their SUBSCRIBEs
        await link.request("sync")  # answered once the peer has read them
    if link.refusals:
        raise RuntimeError(f"the peer refused {link.refusals}")
    return link


# --- in one process: a link over a MemoryNetwork ------------------------------------------


@dataclass
class Contender:
    """One way of running a measurement, and what each round gave."""

    label: str
    rtts: list[RoundTrips] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    lost: int = 0  # messages a throughput run did not deliver, over all rounds

    @property
    def p50(self) -> float:
        return statistics.median(r.p50 for r in self.rtts)

    @property
    def p99(self) -> float:
        return statistics.median(r.p99 for r in self.rtts)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


async def memory_rtt(requester_node: Node, responder_node: Node, requests: int) -> RoundTrips:
    """``requests`` timed round trips (after ``requests // 10`` untimed), in microseconds."""
    data = _harness.payloads(requests + max(1, requests // 10), PAYLOAD_SIZE)
    warmup = len(data) - requests
    responder = responder_node.connect(client_name="responder")
    responder.subscribe("bench/req")
    requester = requester_node.connect(client_name="requester")
    requester.subscribe("bench/rep/1")
    samples: list[float] = []

    async def respond() -> None:
        publish = responder.publish
        async for message in responder:
            publish(message.options.reply_to, message.payload)

    clock = time.perf_counter
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(respond)
            await settle()
            publish, receive = requester.publish, requester.receive
            with anyio.fail_after(60 + requests * 0.05):
                for i, p in enumerate(data):
                    t0 = clock()
                    publish("bench/req", p, reply_to="bench/rep/1")
                    reply = await receive()
                    t1 = clock()
                    if reply.payload is not p and bytes(reply.payload) != p:
                        raise AssertionError(f"reply {i} does not echo the request")
                    if i >= warmup:
                        samples.append((t1 - t0) * 1e6)
            tg.cancel_scope.cancel()
    finally:
        responder.close()
        requester.close()
    return RoundTrips(samples)


async def memory_throughput(
    publisher_node: Node, subscriber_node: Node, data: list[bytes]
) -> float:
    """Seconds (``_harness.clock``) to publish ``data`` on one node and have every message
    at a consumer on the other (or the same) node."""
    expected = len(data)
    batches = [data[i : i + BATCH] for i in range(0, expected, BATCH)]
    subscriber = subscriber_node.connect(username="bench", client_name="subscriber")
    subscriber.subscribe("bench/x")
    publisher = publisher_node.connect(client_name="publisher")
    done = anyio.Event()
    received = [0]

    async def consume() -> None:
        n = 0
        async for _message in subscriber:
            n += 1
            if n == expected:
                break
        received[0] = n
        done.set()

    clock = _harness.clock
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await settle()
            publish = publisher.publish
            sleep = anyio.sleep
            gc.collect()
            t0 = clock()
            for batch in batches:
                for p in batch:
                    publish("bench/x", p)
                await sleep(0)
            with anyio.fail_after(120 + expected / 1000):
                await done.wait()
            elapsed = clock() - t0
        stats = subscriber.statistics()
        assert received[0] == expected, received
        assert stats.discarded == 0, stats
        assert stats.delivered == expected, stats
    finally:
        subscriber.close()
        publisher.close()
    return elapsed


async def settle() -> None:
    """Let freshly started tasks reach their first wait."""
    for _ in range(10):
        await anyio.sleep(0)


async def memory_phase(args: argparse.Namespace) -> None:
    network = MemoryNetwork()
    async with (
        make_node("a") as a,
        make_node("b") as b,
        make_node("one") as one,
    ):
        await start_server(a, ListenerSettings(), listener=network.listen("a"))
        settings = ConnectSettings(network.connectable("a", source="b"), clock=b.clock)
        link = open_link(b.vpn(), "to-a", settings, wants=WANTS)
        with anyio.fail_after(READY_TIMEOUT):
            await link.wait_for(LinkState.IN_SYNC)
        accepted = await ask_back(a.vpn())

        pairs = {"one node": (one, one), "link": (a, b)}
        rtt = {name: Contender(name) for name in pairs}
        tput = {name: Contender(name) for name in pairs}
        data = _harness.payloads(args.messages, PAYLOAD_SIZE)
        for near, far in pairs.values():  # warm-up, not recorded
            await memory_rtt(near, far, max(10, args.requests // 10))
            await memory_throughput(near, far, data[: max(BATCH, args.messages // 10)])
        failures = link.forward_failures + accepted.forward_failures
        names = list(pairs)
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                near, far = pairs[name]
                rtt[name].rtts.append(await memory_rtt(near, far, args.requests))
                tput[name].rates.append(len(data) / await memory_throughput(near, far, data))
        failures = link.forward_failures + accepted.forward_failures - failures
        assert failures == 0, f"{failures} messages could not go over the link"

    solo, linked = rtt["one node"], rtt["link"]
    hop = (linked.p50 - solo.p50) / 2
    say(
        f"links memory hop latency: +{hop:,.1f} us per hop (round trip p50 {linked.p50:,.0f} us "
        f"across the link, {solo.p50:,.0f} us on one node; p99 {linked.p99:,.0f} / "
        f"{solo.p99:,.0f} us) (target <= {MEMORY_HOP_US:g} us) {verdict(hop <= MEMORY_HOP_US)}"
    )
    solo, linked = tput["one node"], tput["link"]
    share = linked.rate / solo.rate
    say(
        f"links memory throughput: {linked.rate:,.0f} msg/s across the link = "
        f"{ratio(linked.rate, solo.rate)} one node ({solo.rate:,.0f} msg/s) "
        f"(target >= {MIN_THROUGHPUT_RATIO:g}x) {verdict(share >= MIN_THROUGHPUT_RATIO)}"
    )
    if args.verbose:
        for c in (*rtt.values(), *tput.values()):
            if not c.rtts and not c.rates:
                continue
            figures = [f"{r.p50:,.0f}" for r in c.rtts] or [f"{x:,.0f}" for x in c.rates]
            unit = "us p50" if c.rtts else "msg/s"
            say(f"  memory {c.label}: {' '.join(figures)} {unit}")


# --- main ------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=20,000, M=500, 3 rounds")
    parser.add_argument("--messages", type=int, help="N, messages per throughput run (200,000)")
    parser.add_argument("--requests", type=int, help="M, timed round trips per run (2,000)")
    parser.add_argument("--rounds", type=int, help="interleaved runs per figure (5; quick: 3)")
    parser.add_argument(
        "--wall", action="store_true", help="memory throughput: perf_counter, not CPU time"
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="every run's figure too")
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = 20_000 if args.quick else 200_000
    if args.requests is None:
        args.requests = 500 if args.quick else 2_000
    if args.rounds is None:
        args.rounds = 3 if args.quick else 5
    if args.messages < BATCH or args.requests < 1 or args.rounds < 1:
        parser.error(f"--messages must be at least {BATCH}, --requests and --rounds at least 1")
    return args


def header(args: argparse.Namespace) -> None:
    timing = "wall clock" if args.wall else "thread CPU time"
    say(
        f"# links: round trips M={args.requests:,}, throughput N={args.messages:,} x "
        f"{PAYLOAD_SIZE} B; {args.rounds} interleaved rounds, medians; throughput timed "
        f"with {timing}, round trips wall clock; on the loop `meshbus run` picks; "
        f"meshbus {_version('meshbus')}, Python {platform.python_version()} on "
        f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs"
    )


def main(argv: list[str] | None = None) -> None:
    from meshbus.app._eventloop import run as run_like_meshbus_run

    args = parse(argv)
    if args.wall:
        _harness.clock = time.perf_counter
    header(args)
    started = time.perf_counter()
    run_like_meshbus_run(memory_phase, args)
    say(f"# links: run took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
