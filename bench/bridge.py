"""VPN bridges: what one bridge costs, between two `meshbus run` nodes, with a mosquitto
bridge and a NATS leaf node measured in the same run.

Run from the checkout with the dev virtualenv (``pip install -e '.[dev,bench]'``, and
``bash scripts/bench-peers`` once for mosquitto)::

    .venv/bin/python bench/bridge.py            # N=200,000, M=2,000, G=20,000, 5 rounds
    .venv/bin/python bench/bridge.py --quick    # N=20,000, M=500, G=5,000, 3 rounds
    .venv/bin/python bench/bridge.py --only stages,guaranteed
    .venv/bin/python bench/bridge.py -v         # also every run's figure

One line per figure; a benchmark, not a test: the exit status is 0 even when a target
is missed or a peer is missing.

What is measured:

* ``bridge direct``: every process on 127.0.0.1, brokers started afresh for each run.

  - meshbus: two ``meshbus run`` processes from configuration files; node B has a
    ``[[vpns.default.bridges]]`` table to node A that asks for ``bench/>`` and maps
    ``bench/>`` the other way (``PUB``), so one bridge carries both directions, as a
    mosquitto ``both`` bridge does. A run starts once B's bridge shows ``in-sync`` in
    the node's statistics. Against it: one ``meshbus run`` node, same clients.
  - mosquitto: two brokers, the first with a ``connection`` bridge (``topic bench/#
    both 0``) to the second, vs one broker (paho-mqtt QoS 0 clients).
  - NATS: a hub nats-server and a second one joined to it as a leaf node, vs one
    nats-server (nats-py clients); a run starts once the hub lists the leaf's
    subscription.

  Round trips (requester on the first broker, responder on the second: a round trip
  crosses the bridge twice, so the added latency per hop is half the difference of
  the p50s) and throughput (publisher on the first, subscriber on the second, msg/s at
  the subscriber), as bench/links.py measures them.

* ``bridge guaranteed``: a producer sends G guaranteed messages (``send_many``, batches
  of 100) and a consumer on a flow (window 255) acks each; msg/s from the producer's
  first send to the consumer's last message. One node: both on the node, queue ``L``.
  Bridged: the producer on node A (queue ``Q``), the consumer on node B (queue ``L``)
  whose bridge binds a flow to ``Q`` (window 255) and spools each message to ``L``
  before it acks it to ``A``. Both nodes keep their spool in a data directory (fsync
  before each ack). Counts, order and redelivered flags are checked.

* ``bridge stages``: in this process, a session publishes N messages that cross a
  bridge to a callback subscriber: a bridge between two VPNs of one node (a
  ``LocalLink`` pair, ``PUB`` mapping), and a bridge from node B to node A over an
  in-memory network (both nodes here; B asks for ``bench/>``). Thread CPU time with
  hop counting and origin de-duplication on, and with both off; the difference per
  message is their cost. Over the local link a changed hop count means a new
  message object (the far VPN gets the object itself); over a wire it rides in the
  batch.

Rounds: ``--rounds`` (5, quick 3); every contender runs once per round, in an order that
rotates between rounds; figures are medians over the rounds.

Lines (targets from the issue):

* ``bridge direct throughput``: bridged / one node (target >= 0.85x), and bridged
  meshbus / bridged mosquitto and / NATS leaf (target >= 1x each);
* ``bridge hop latency``: added p50 per bridge hop (target <= the mosquitto bridge's
  and <= the NATS leaf node's);
* ``bridge guaranteed throughput``: bridged / one node (target >= 0.8x);
* ``bridge stages``: hop counting + de-duplication per forwarded message (target <= 1 us).
* ``bridge direct broker cpu``: the brokers' CPU time (user + system, from ``/proc``) per
  message delivered in the throughput runs, joined and alone, for each product
  (context, no target: what a hop costs in CPU, apart from what the clients cost).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _harness
import _peers
import anyio
from _clusters import (
    Setup,
    mosquitto_bridge,
    mosquitto_single,
    nats_leaf,
    nats_single,
    nothing,
)
from _harness import verdict
from _pairs import (
    Pair,
    available_pairs,
    exit_on_sigterm,
    measure_pairs,
    need_mosquitto,
    need_nats,
    peers_line,
    say_cpu,
    say_runs,
)
from _peers import HOST, PAYLOAD_SIZE, READY_TIMEOUT, Child, PeerError, say_result
from transport import failure, say

from meshbus import LinkState, Node
from meshbus.plugins.bridge import BridgeSettings, TopicMapping, open_bridge
from meshbus.transports import ListenerSettings, MemoryNetwork, start_server
from meshbus.transports.testing import allow_bridges

THIS = Path(__file__).resolve()

# Targets from the issue.
MIN_THROUGHPUT_RATIO = 0.85
MIN_PEER_RATIO = 1.0
MIN_GUARANTEED_RATIO = 0.8
MAX_STAGE_US = 1.0

BATCH = 100  # guaranteed: messages per send_many; stages: publishes between checkpoints
_runs = itertools.count()  # a data directory of its own for every node started

NODE_A = """
[node]
name = "bench-a"
data_dir = "data-{run}-a"

[[listeners]]
host = "{host}"
port = 0

[vpns.default.client_profiles.default]
allow_bridge_connections = true
{queue}
"""

NODE_B = """
[node]
name = "bench-b"
data_dir = "data-{run}-b"

[[listeners]]
host = "{host}"
port = 0
{queue}
[[vpns.default.bridges]]
name = "bench"
remotes = ["{remote}"]
{bridge}
"""

DIRECT_BRIDGE = """subscriptions = ["bench/>"]

[[vpns.default.bridges.topics]]
filter = "bench/>"
mode = "PUB"
"""

GUARANTEED_BRIDGE = 'queues = ["Q"]\nwindow = 255\n'


def queue(name: str) -> str:
    return f'[vpns.default.queues.{name}]\nsubscriptions = ["bench/g/>"]\n'


# --- meshbus run nodes ------------------------------------------------------------------------


def meshbus_run(work: Path, name: str, text: str) -> Child:
    """A ``meshbus run`` process of the configuration ``text``."""
    path = work / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return Child(name, [sys.executable, "-m", "meshbus", "run", str(path)], work)


def wait_in_sync(url: str) -> None:
    """Until the bridge of the node at ``url`` says ``in-sync`` in its statistics."""

    async def poll() -> None:
        from meshbus.transports import connect

        async with connect(url, reconnect=False) as session:
            with anyio.fail_after(READY_TIMEOUT):
                while True:
                    stats = await session.node_statistics()
                    link = stats["links"]["default"].get("bridge/bench")
                    if link is not None and link["state"] == "in-sync":
                        return
                    await anyio.sleep(0.02)

    try:
        anyio.run(poll)
    except TimeoutError:
        raise PeerError(f"the bridge of {url} was not in sync after {READY_TIMEOUT} s") from None


@contextlib.contextmanager
def meshbus_one(work: Path, guaranteed: bool = False) -> Iterator[Setup]:
    run = next(_runs)
    text = NODE_A.format(run=run, host=HOST, queue=queue("L") if guaranteed else "")
    with meshbus_run(work, f"meshbus-one-{run}", text) as node:
        url = node.expect("listening on", READY_TIMEOUT)
        yield Setup(url, url, nothing)


@contextlib.contextmanager
def meshbus_bridged(work: Path, guaranteed: bool = False) -> Iterator[Setup]:
    run = next(_runs)
    a_text = NODE_A.format(run=run, host=HOST, queue=queue("Q") if guaranteed else "")
    with meshbus_run(work, f"meshbus-a-{run}", a_text) as a:
        near = a.expect("listening on", READY_TIMEOUT)
        b_text = NODE_B.format(
            run=run,
            host=HOST,
            remote=near,
            queue=queue("L") if guaranteed else "",
            bridge=GUARANTEED_BRIDGE if guaranteed else DIRECT_BRIDGE,
        )
        with meshbus_run(work, f"meshbus-b-{run}", b_text) as b:
            far = b.expect("listening on", READY_TIMEOUT)
            wait_in_sync(far)
            yield Setup(near, far, nothing)


# --- direct messages: the pairs ---------------------------------------------------------------

PAIRS = [
    Pair(
        "meshbus",
        "meshbus",
        "bridge",
        meshbus_one,
        meshbus_bridged,
        "meshbus remote sessions",
        lambda: None,
    ),
    Pair(
        "mosquitto",
        "mqtt",
        "bridge",
        mosquitto_single,
        mosquitto_bridge,
        "paho-mqtt QoS 0",
        need_mosquitto,
    ),
    Pair("nats", "nats", "leaf node", nats_single, nats_leaf, "nats-py", need_nats),
]


def direct_phase(work: Path, args: argparse.Namespace) -> None:
    pairs = available_pairs(PAIRS, args.only, "bridge direct")
    if not pairs:
        return
    found = measure_pairs(work, pairs, args, say, "bridge direct")
    rtt, tput, ok = found.rtt, found.tput, found.ok
    hops, rates, shares = found.hops, found.rates, found.shares
    label = {p.name: f"{p.name} {p.hop}" for p in ok}
    for pair in ok:
        name = pair.name
        line = f"bridge direct throughput {label[name]}: {rates[name]:,.0f} msg/s bridged = "
        line += f"{shares[name]:.2f}x one broker ({tput[name, 'single'].rate:,.0f} msg/s)"
        if name == "meshbus":
            line += f" (target >= {MIN_THROUGHPUT_RATIO:g}x) "
            line += verdict(shares[name] >= MIN_THROUGHPUT_RATIO)
            for peer in (p for p in rates if p != "meshbus"):
                versus = rates["meshbus"] / rates[peer]
                line += f"; {versus:.2f}x the {label[peer]} (target >= {MIN_PEER_RATIO:g}x) "
                line += verdict(versus >= MIN_PEER_RATIO)
        lost = tput[name, "linked"].lost
        say(
            f"{line} ({pair.clients}; {args.messages:,} x {PAYLOAD_SIZE} B"
            + (f"; {lost:,} lost" if lost else "")
            + ")"
        )
    for pair in ok:
        name = pair.name
        single, linked = rtt[name, "single"], rtt[name, "linked"]
        line = f"bridge hop latency {label[name]}: +{hops[name]:,.0f} us per hop"
        if name == "meshbus":
            for peer in (p for p in hops if p != "meshbus"):
                line += f"; the {label[peer]} +{hops[peer]:,.0f} us (target <= it) "
                line += verdict(hops["meshbus"] <= hops[peer])
        say(
            f"{line} (round trip p50 {linked.p50:,.0f} us bridged, {single.p50:,.0f} us on one "
            f"broker; p99 {linked.p99:,.0f} / {single.p99:,.0f} us; {pair.clients})"
        )
    say_cpu(say, "bridge direct", ok, tput)
    if args.verbose:
        say_runs(say, "direct", rtt, tput)


# --- guaranteed messages ---------------------------------------------------------------------


def measure_guaranteed(work: Path, setup: Setup, messages: int) -> float:
    """One run: the consumer bound on the far node, then the producer on the near one."""
    count = ["--messages", str(messages)]
    with role("g-consumer", work, "--url", setup.far, *count) as consumer:
        consumer.expect("READY", READY_TIMEOUT)
        with role("g-producer", work, "--url", setup.near, *count) as producer:
            sent = producer.result(60 + messages / 500)
        got = consumer.result(60 + messages / 500)
    if (got["received"], got["in_order"], got["redelivered"]) != (messages, True, 0):
        raise PeerError(
            f"the consumer got {got['received']:,} of {messages:,} (in order: "
            f"{got['in_order']}, redelivered: {got['redelivered']})"
        )
    return float(messages / (got["last"] - sent["start"]))


def guaranteed_phase(work: Path, args: argparse.Namespace) -> None:
    contenders = {"one node": meshbus_one, "bridged": meshbus_bridged}
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    names = list(contenders)
    try:
        for r in range(args.rounds):
            shift = r % len(names)
            for name in names[shift:] + names[:shift]:
                with contenders[name](work, guaranteed=True) as setup:
                    rates[name].append(measure_guaranteed(work, setup, args.guaranteed))
    except PeerError as exc:
        say(f"bridge guaranteed: {failure(exc)}")
        return
    one, bridged = (statistics.median(rates[n]) for n in names)
    share = bridged / one
    say(
        f"bridge guaranteed throughput: {bridged:,.0f} msg/s bridged (window 255) = "
        f"{share:.2f}x one node ({one:,.0f} msg/s) (target >= {MIN_GUARANTEED_RATIO:g}x) "
        f"{verdict(share >= MIN_GUARANTEED_RATIO)} ({args.guaranteed:,} x {PAYLOAD_SIZE} B, "
        "send_many batches of 100, spool fsync on both nodes)"
    )
    if args.verbose:
        for name in names:
            say(f"  guaranteed {name}: {' '.join(f'{x:,.0f}' for x in rates[name])} msg/s")


def role(name: str, work: Path, *args: str) -> Child:
    """A client role of this script (see :func:`role_main`)."""
    return Child(name, [sys.executable, str(THIS), name, *args], work)


async def producer_role(url: str, messages: int) -> None:
    from meshbus.transports import connect

    data = _peers.payloads(messages)
    async with connect(url, reconnect=False) as session:
        start = _peers.clock()
        for i in range(0, messages, BATCH):
            results = await session.send_many(("bench/g/x", p) for p in data[i : i + BATCH])
            failed = [r for r in results if r is not None]
            if failed:
                raise PeerError(f"send refused: {failed[0]}")
        say_result(start=start, end=_peers.clock(), sent=messages)


async def consumer_role(url: str, messages: int) -> None:
    from meshbus.transports import connect

    expected = _peers.payloads(messages)  # what the producer sends, in its order
    async with connect(url, reconnect=False) as session:
        flow = await session.bind("L", window=255)
        _peers.say("READY")
        received = redelivered = 0
        in_order = True
        first = 0.0
        with anyio.fail_after(60 + messages / 500):
            async for message in flow:
                if received == 0:
                    first = _peers.clock()
                received += 1
                redelivered += message.redelivered
                flow.ack(message)
                if bytes(message.payload) != expected[received - 1]:
                    in_order = False
                if received == messages:
                    break
        say_result(
            first=first,
            last=_peers.clock(),
            received=received,
            redelivered=redelivered,
            in_order=in_order,
        )


# --- the stages' cost, in one process ----------------------------------------------------------


async def stage_run(messages: int, on: bool, wire: bool) -> float:
    """CPU seconds for ``messages`` publishes crossing a bridge to a callback subscriber:
    between two VPNs of one node, or (``wire``) from node B's bridge to node A over an
    in-memory network, both nodes in this process."""
    data = _harness.payloads(messages, PAYLOAD_SIZE)
    count = 0

    def on_message(message: object) -> None:
        nonlocal count
        count += 1

    options: dict[str, Any] = {"loop_prevention": on, "dedup": on}
    async with contextlib.AsyncExitStack() as stack:
        near = await stack.enter_async_context(Node(name="near", node_id="near"))
        if wire:
            network = MemoryNetwork()
            await start_server(near, ListenerSettings(), listener=network.listen("near"))
            allow_bridges(near.vpn())
            far = await stack.enter_async_context(Node(name="far", node_id="far"))
            reader = far.connect(on_message=on_message)
            settings = BridgeSettings(
                "stages",
                remotes=[network.connectable("near", source="far")],
                subscriptions=["bench/>"],
                **options,
            )
            bridge = open_bridge(far.vpn(), settings)
        else:
            allow_bridges(near.create_vpn("far"))
            reader = near.connect("far", on_message=on_message)
            pub = [TopicMapping("bench/>", mode="PUB")]
            bridge = open_bridge(
                near.vpn(), BridgeSettings("stages", remote_vpn="far", topics=pub, **options)
            )
        reader.subscribe("bench/>")
        with anyio.fail_after(READY_TIMEOUT):
            await bridge.wait_for(LinkState.IN_SYNC)
        publish = near.connect().publish
        t0 = _harness.clock()
        for i in range(0, messages, BATCH):
            for payload in data[i : i + BATCH]:
                publish("bench/x", payload)
            while count < i:  # a shallow pipeline: nothing waits long enough to be dropped
                await anyio.sleep(0)
        with anyio.fail_after(READY_TIMEOUT):
            while count < messages:
                await anyio.sleep(0)
        elapsed = _harness.clock() - t0
    return elapsed


async def stages_phase(args: argparse.Namespace) -> None:
    for wire in (False, True):
        times: dict[bool, list[float]] = {True: [], False: []}
        await stage_run(args.messages // 10, True, wire)  # warm-up
        for r in range(args.rounds * 2):
            for on in (True, False) if r % 2 == 0 else (False, True):
                times[on].append(await stage_run(args.messages, on, wire))
        on_us, off_us = (statistics.median(times[x]) / args.messages * 1e6 for x in (True, False))
        cost = on_us - off_us
        where = "over a wire link (two nodes, one process)" if wire else "same-node bridge"
        say(
            f"bridge stages {'wire' if wire else 'local'}: hop counting + de-duplication "
            f"{cost:+.2f} us per forwarded message (target <= {MAX_STAGE_US:g} us) "
            f"{verdict(cost <= MAX_STAGE_US)} ({off_us:.2f} us a message with both off, "
            f"{on_us:.2f} us on; {where}, thread CPU time, {args.messages:,} messages, "
            f"{args.rounds * 2} runs each, medians)"
        )


# --- main ------------------------------------------------------------------------------------

PHASES = ("direct", "guaranteed", "stages")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=20,000, M=500, G=5,000, 3 rounds")
    parser.add_argument("--messages", type=int, help="N, direct messages per run (200,000)")
    parser.add_argument("--requests", type=int, help="M, timed round trips per run (2,000)")
    parser.add_argument("--guaranteed", type=int, help="G, guaranteed messages per run (20,000)")
    parser.add_argument("--rounds", type=int, help="interleaved runs per figure (5; quick: 3)")
    parser.add_argument(
        "--only",
        default="direct,guaranteed,stages,meshbus,mosquitto,nats",
        help="comma-separated phases (direct, guaranteed, stages) and direct pairs "
        "(meshbus, mosquitto, nats); default: all",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="every run's figure too")
    args = parser.parse_args(argv)
    quick = args.quick
    args.messages = args.messages or (20_000 if quick else 200_000)
    args.requests = args.requests or (500 if quick else 2_000)
    args.guaranteed = args.guaranteed or (5_000 if quick else 20_000)
    args.rounds = args.rounds or (3 if quick else 5)
    if args.messages < BATCH or args.guaranteed < BATCH or args.requests < 1 or args.rounds < 1:
        parser.error(f"--messages and --guaranteed must be at least {BATCH}")
    args.only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = args.only - {*PHASES, *(p.name for p in PAIRS)}
    if unknown:
        parser.error(f"--only: unknown names {', '.join(sorted(unknown))}")
    if not args.only & set(PHASES):  # pairs alone: the direct phase
        args.only.add("direct")
    if "direct" in args.only and not args.only & {p.name for p in PAIRS}:
        args.only |= {p.name for p in PAIRS}
    return args


def header(args: argparse.Namespace) -> None:
    say(
        f"# bridge: direct round trips M={args.requests:,}, throughput N={args.messages:,}, "
        f"guaranteed G={args.guaranteed:,}, x {PAYLOAD_SIZE} B; {args.rounds} interleaved "
        "rounds, medians; wall clock across processes, thread CPU time for the stages"
    )
    say(peers_line())


def main(argv: list[str] | None = None) -> None:
    from meshbus.app._eventloop import run as run_like_meshbus_run

    args = parse(argv)
    exit_on_sigterm()
    header(args)
    started = time.perf_counter()
    if "stages" in args.only:
        run_like_meshbus_run(stages_phase, args)
    with _peers.temp_workdir() as tmp:
        if "direct" in args.only:
            direct_phase(Path(tmp), args)
        if "guaranteed" in args.only:
            guaranteed_phase(Path(tmp), args)
    say(f"# bridge: run took {time.perf_counter() - started:.0f} s")


def role_main(argv: list[str]) -> None:
    from meshbus.app._eventloop import run as run_like_meshbus_run

    parser = argparse.ArgumentParser(description="A client of bench/bridge.py.")
    parser.add_argument("role", choices=["g-producer", "g-consumer"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--messages", type=int, required=True)
    a = parser.parse_args(argv)
    fn = producer_role if a.role == "g-producer" else consumer_role
    run_like_meshbus_run(fn, a.url, a.messages)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("g-producer", "g-consumer"):
        role_main(sys.argv[1:])
    else:
        sys.exit(main())
