"""Node-to-node links: what one hop adds, in one process and between processes, with a
NATS route and a mosquitto bridge measured in the same run.

Run from the checkout with the dev virtualenv (``pip install -e '.[dev,bench]'``, and
``bash scripts/bench-peers`` once for mosquitto)::

    .venv/bin/python bench/links.py             # N=200,000, M=2,000, 5 rounds: ~5 min
    .venv/bin/python bench/links.py --quick     # N=20,000, M=500, 3 rounds: a smoke run
    .venv/bin/python bench/links.py --only memory,meshbus
    .venv/bin/python bench/links.py -v          # also every run's figure

One line per figure; a benchmark, not a test: the exit status is 0 even when a target
is missed or a peer is missing.

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

* ``links tcp``: every process on 127.0.0.1. For each of meshbus, NATS and
  mosquitto, a linked pair of brokers and a single broker:

  - meshbus: two node processes (``python bench/links.py node``, on the loop
    ``meshbus run`` picks), B dialling A with ``open_link`` over
    ``tcp://127.0.0.1:PORT``; one link carries both directions: B wants
    ``bench/>`` from A, and A asks B for ``bench/>`` over the link it accepted, as a
    mosquitto ``both`` bridge does. The single broker is a third node process of the
    same kind, without links. Each node, once started, tunes its garbage collector as
    ``meshbus run`` does (``tune_collector``).
  - NATS: two nats-server processes clustered with routes (the default pool), vs
    one nats-server.
  - mosquitto: two brokers, the first with a ``connection`` bridge section
    (``topic bench/# both 0``) to the second, vs one broker.

  Clients are bench/_peers.py's roles, as in ``transport.py`` (meshbus remote
  sessions, nats-py, paho-mqtt QoS 0); on a linked pair the publisher or requester
  uses the first broker and the subscriber or responder the second. Round trips
  and throughput are measured as ``transport.py`` does (M round trips after M/10
  not counted; N messages of 100 B, msg/s at the subscriber from its first to its
  last message). Before a run the subscriber's interest is known to have reached the
  first broker: meshbus links are in sync both ways before any client starts (their
  wants are static), NATS's route carries the subscription (the first server's
  ``/routez?subs=1`` lists it) and the mosquitto bridge reports itself connected
  and carried a probe each way.

* Rounds: ``--rounds`` (5, quick 3); in each round every contender runs once, in an
  order that rotates between rounds, so a slow spell of the shared machine falls on
  all of them. Across processes each run starts its brokers afresh and measures
  round trips, then throughput, on them. Figures are medians over the rounds (of
  each run's p50 and p99 for round trips); the added latency per hop is the
  difference of the medians, halved.

Lines (targets from the issue):

* ``links memory hop latency``: added p50 per hop in one process (target <= 20 us);
* ``links memory throughput``: across the link / on one node (target >= 0.85x);
* ``links tcp hop latency meshbus link``: added p50 per hop between processes (target
  <= 120 us), with the NATS route's and the mosquitto bridge's in parentheses, and
  a line of its own for each of them;
* ``links tcp throughput meshbus link``: linked / one broker (target >= 0.85x), with
  the same ratio for the NATS route and the mosquitto bridge.
* ``links tcp broker cpu``: the brokers' CPU time (user + system, from ``/proc``) per
  message delivered in the throughput runs, joined and alone, for each product
  (context, no target: what a hop costs in CPU, apart from what the clients cost).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import _harness
import _peers
import anyio
import attrs
from _clusters import Setup, mosquitto_bridge, mosquitto_single, nats_route, nats_single, nothing
from _harness import verdict
from _pairs import (
    Contender,
    Pair,
    available_pairs,
    exit_on_sigterm,
    need_mosquitto,
    need_nats,
    peers_line,
    run_pairs,
    say_cpu,
    say_runs,
)
from _peers import HOST, PAYLOAD_SIZE, READY_TIMEOUT, Child
from transport import (
    RoundTrips,
    ratio,
    say,
)

from meshbus import ClientProfile, Link, LinkState, LocalLink, Node, Vpn
from meshbus.app._collector import tune_collector
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
TCP_HOP_US = 120.0
MIN_THROUGHPUT_RATIO = 0.85


# --- meshbus pieces shared by the memory phase and the node role --------------------------


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
        make_node("c") as c,
        make_node("d") as d,
        make_node("one") as one,
    ):
        await start_server(a, ListenerSettings(), listener=network.listen("a"))
        settings = ConnectSettings(network.connectable("a", source="b"), clock=b.clock)
        link = open_link(b.vpn(), "to-a", settings, wants=WANTS)
        with anyio.fail_after(READY_TIMEOUT):
            await link.wait_for(LinkState.IN_SYNC)
        accepted = await ask_back(a.vpn())
        near, far = LocalLink.pair(c.vpn(), d.vpn(), "c-d")
        c.vpn().links.attach(near)
        d.vpn().links.attach(far)
        for end in (near, far):
            for topic_filter in WANTS:
                end.add_interest(topic_filter)
        links = (link, accepted, near, far)

        pairs = {"one node": (one, one), "wire link": (a, b), "local link": (c, d)}
        rtt = {name: Contender(name) for name in pairs}
        tput = {name: Contender(name) for name in pairs}
        data = _harness.payloads(args.messages, PAYLOAD_SIZE)
        for first, second in pairs.values():  # warm-up, not recorded
            await memory_rtt(first, second, max(10, args.requests // 10))
            await memory_throughput(first, second, data[: max(BATCH, args.messages // 10)])
        failures = sum(x.forward_failures for x in links)
        names = list(pairs)
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                first, second = pairs[name]
                rtt[name].rtts.append(await memory_rtt(first, second, args.requests))
                tput[name].rates.append(len(data) / await memory_throughput(first, second, data))
        failures = sum(x.forward_failures for x in links) - failures
        assert failures == 0, f"{failures} messages could not go over the links"

    solo = rtt["one node"]
    for name, what in (("local link", "LocalLink"), ("wire link", "WireLink over memory")):
        linked = rtt[name]
        hop = (linked.p50 - solo.p50) / 2
        say(
            f"links memory hop latency {name}: +{hop:,.1f} us per hop ({what}; round trip "
            f"p50 {linked.p50:,.0f} us across the link, {solo.p50:,.0f} us on one node; p99 "
            f"{linked.p99:,.0f} / {solo.p99:,.0f} us) (target <= {MEMORY_HOP_US:g} us) "
            f"{verdict(hop <= MEMORY_HOP_US)}"
        )
    solo = tput["one node"]
    for name, what in (("local link", "LocalLink"), ("wire link", "WireLink over memory")):
        linked = tput[name]
        share = linked.rate / solo.rate
        say(
            f"links memory throughput {name}: {linked.rate:,.0f} msg/s across the link "
            f"({what}) = {ratio(linked.rate, solo.rate)} one node ({solo.rate:,.0f} msg/s) "
            f"(target >= {MIN_THROUGHPUT_RATIO:g}x) {verdict(share >= MIN_THROUGHPUT_RATIO)}"
        )
    if args.verbose:
        for contender in (*rtt.values(), *tput.values()):
            if not contender.rtts and not contender.rates:
                continue
            figures = [f"{x.p50:,.0f}" for x in contender.rtts] or [
                f"{x:,.0f}" for x in contender.rates
            ]
            unit = "us p50" if contender.rtts else "msg/s"
            say(f"  memory {contender.label}: {' '.join(figures)} {unit}")


# --- across processes: brokers --------------------------------------------------------------


def node_process(work: Path, *args: str) -> Child:
    """A meshbus node of this script's ``node`` role (see :func:`node_role`)."""
    return Child(f"node-{args[1]}", [sys.executable, str(THIS), "node", *args], work)


@contextlib.contextmanager
def meshbus_single(work: Path) -> Iterator[Setup]:
    with node_process(work, "--name", "one") as node:
        url = node.expect("listening on", READY_TIMEOUT)
        yield Setup(url, url, nothing)


@contextlib.contextmanager
def meshbus_linked(work: Path) -> Iterator[Setup]:
    with node_process(work, "--name", "a", "--want-back") as a:
        near = a.expect("listening on", READY_TIMEOUT)
        with node_process(work, "--name", "b", "--link-to", near) as b:
            far = b.expect("listening on", READY_TIMEOUT)
            b.expect("LINKED", READY_TIMEOUT)
            a.expect("LINKED", READY_TIMEOUT)
            yield Setup(near, far, nothing)


# --- across processes: the measurements ------------------------------------------------------


PAIRS = [
    Pair(
        "meshbus",
        "meshbus",
        "link",
        meshbus_single,
        meshbus_linked,
        "meshbus remote sessions",
        lambda: None,
    ),
    Pair("nats", "nats", "route", nats_single, nats_route, "nats-py", need_nats),
    Pair(
        "mosquitto",
        "mqtt",
        "bridge",
        mosquitto_single,
        mosquitto_bridge,
        "paho-mqtt QoS 0",
        need_mosquitto,
    ),
]


def tcp_phase(work: Path, args: argparse.Namespace) -> None:
    pairs = available_pairs(PAIRS, args.only, "links tcp")
    if not pairs:
        return
    # Brokers start afresh for every run, so every run measures a pair just joined: a
    # meshbus link that reconnected while the others ran would come back without the
    # direction node A asked for (ask_back asks once, on the link it accepted).
    rtt, tput, failed = run_pairs(work, pairs, args.rounds, args.requests, args.messages)
    report_tcp(pairs, rtt, tput, failed, args)


def report_tcp(
    pairs: list[Pair],
    rtt: dict[tuple[str, str], Contender],
    tput: dict[tuple[str, str], Contender],
    failed: dict[str, str],
    args: argparse.Namespace,
) -> None:
    hops: dict[str, float] = {}
    shares: dict[str, float] = {}
    for pair in pairs:
        if pair.name in failed:
            continue
        single, linked = rtt[pair.name, "single"], rtt[pair.name, "linked"]
        hops[pair.name] = (linked.p50 - single.p50) / 2
        shares[pair.name] = tput[pair.name, "linked"].rate / tput[pair.name, "single"].rate
    for pair in pairs:
        if pair.name in failed:
            say(f"links tcp {pair.name}: {failed[pair.name]}")
            continue
        single, linked = rtt[pair.name, "single"], rtt[pair.name, "linked"]
        hop = hops[pair.name]
        line = f"links tcp hop latency {pair.name} {pair.hop}: +{hop:,.0f} us per hop"
        if pair.name == "meshbus":
            versus = [f"{p} {PAIR_HOPS[p]} +{hops[p]:,.0f} us" for p in hops if p != "meshbus"]
            if versus:
                line += f" ({', '.join(versus)})"
            line += f" (target <= {TCP_HOP_US:g} us) {verdict(hop <= TCP_HOP_US)}"
        say(
            f"{line} (round trip p50 {linked.p50:,.0f} us linked, {single.p50:,.0f} us on one "
            f"broker; p99 {linked.p99:,.0f} / {single.p99:,.0f} us; {pair.clients})"
        )
    for pair in pairs:
        if pair.name in failed:
            continue
        single, linked = tput[pair.name, "single"], tput[pair.name, "linked"]
        share = shares[pair.name]
        line = (
            f"links tcp throughput {pair.name} {pair.hop}: {linked.rate:,.0f} msg/s linked = "
            f"{share:.2f}x one broker ({single.rate:,.0f} msg/s)"
        )
        if pair.name == "meshbus":
            versus = [f"{p} {PAIR_HOPS[p]} {shares[p]:.2f}x" for p in shares if p != "meshbus"]
            if versus:
                line += f" ({', '.join(versus)})"
            line += (
                f" (target >= {MIN_THROUGHPUT_RATIO:g}x) {verdict(share >= MIN_THROUGHPUT_RATIO)}"
            )
        lost = [f"{c.lost:,} lost {c.label.split()[1]}" for c in (linked, single) if c.lost]
        say(
            f"{line} ({pair.clients}; {args.messages:,} x {PAYLOAD_SIZE} B"
            + "".join(f"; {text}" for text in lost)
            + ")"
        )
    say_cpu(say, "links tcp", [p for p in pairs if p.name not in failed], tput)
    if args.verbose:
        say_runs(say, "tcp", rtt, tput)


PAIR_HOPS = {pair.name: pair.hop for pair in PAIRS}


# --- the node role: one meshbus node in its own process ------------------------------------


async def node_role(name: str, link_to: str | None, want_back: bool) -> None:
    """A node listening on TCP; with ``link_to``, it dials that node's VPN with a link
    (wanting ``WANTS``). Says ``listening on URL``, then ``LINKED`` once its link is in
    sync (with ``want_back``: once it accepted one and asked its peer for ``WANTS``)."""
    async with make_node(name) as node:
        server = await start_server(node, ListenerSettings(host=HOST, port=0))
        say(f"listening on tcp://{HOST}:{server.port}")
        if link_to is not None:
            settings = ConnectSettings(link_to, clock=node.clock)
            link = open_link(node.vpn(), "bench", settings, wants=WANTS)
            with anyio.fail_after(READY_TIMEOUT):
                await link.wait_for(LinkState.IN_SYNC)
            say("LINKED")
        elif want_back:
            await ask_back(node.vpn())
            say("LINKED")
        tune_collector()  # as `meshbus run` does once started
        await anyio.sleep_forever()  # until the orchestrator terminates it


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
    parser.add_argument(
        "--only",
        default="memory,meshbus,nats,mosquitto",
        help="comma-separated: memory (in one process) and the TCP pairs (default: all)",
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
    args.only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = args.only - {"memory", *PAIR_HOPS}
    if unknown:
        parser.error(f"--only: unknown names {', '.join(sorted(unknown))}")
    return args


def header(args: argparse.Namespace) -> None:
    timing = "wall clock" if args.wall else "thread CPU time"
    say(
        f"# links: round trips M={args.requests:,}, throughput N={args.messages:,} x "
        f"{PAYLOAD_SIZE} B; {args.rounds} interleaved rounds, medians; memory throughput "
        f"timed with {timing}, everything else wall clock; nodes on the loop `meshbus run` "
        "picks, asyncio clients on asyncio"
    )
    say(peers_line())


def main(argv: list[str] | None = None) -> None:
    from meshbus.app._eventloop import run as run_like_meshbus_run

    args = parse(argv)
    if args.wall:
        _harness.clock = time.perf_counter
    exit_on_sigterm()
    header(args)
    started = time.perf_counter()
    if "memory" in args.only:
        run_like_meshbus_run(memory_phase, args)
    with _peers.temp_workdir() as tmp:
        tcp_phase(Path(tmp), args)
    say(f"# links: run took {time.perf_counter() - started:.0f} s")


def role_main(argv: list[str]) -> None:
    from meshbus.app._eventloop import run as run_like_meshbus_run

    parser = argparse.ArgumentParser(description="A meshbus node of bench/links.py.")
    parser.add_argument("role", choices=["node"])
    parser.add_argument("--name", required=True)
    parser.add_argument("--link-to", default=None, help="URL of the node to link to")
    parser.add_argument("--want-back", action="store_true", help="ask accepted links' peers")
    a = parser.parse_args(argv)
    run_like_meshbus_run(node_role, a.name, a.link_to, a.want_back)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "node":
        role_main(sys.argv[1:])
    else:
        sys.exit(main())
