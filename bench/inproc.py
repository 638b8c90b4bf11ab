"""In-process publish -> deliver throughput: meshbus against blinker, pypubsub and anyio streams.

Run from the checkout with the dev virtualenv::

    .venv/bin/python bench/inproc.py            # full run on asyncio, about a minute
    .venv/bin/python bench/inproc.py --quick    # smoke run, a few seconds
    .venv/bin/python bench/inproc.py --backend trio
    .venv/bin/python bench/inproc.py -v         # also every round's figure (the noise)
    .venv/bin/python bench/inproc.py --steps    # instead: ns per step of the meshbus paths

One line per figure, each with the ratio to the peer measured in the same run
and, where the issue sets one, the target and ``OK``/``MISS``. A benchmark,
not a test: the exit status is 0 even when a target is missed.

What is measured (the header lines of the output repeat the essentials):

* ``msg/s`` is messages published per second with every message delivered to
  every subscriber (deliveries per second are that times the subscriber count).
* Payloads are 100 bytes, a distinct ``bytes`` object per message taken from a
  list built before timing, so no implementation can benefit from caching a
  payload. Every receiver does the same work: it increments its own counter.
  After each measurement the counts are asserted (and meshbus's own statistics:
  delivered counts, no discards), so nothing is skipped or faked.
* Callback group (synchronous delivery inline with the publish):

  - meshbus: ``Node.connect(on_message=fn)`` with a plain function, so the
    publishing code calls it inline; a separate publisher session publishes to
    the concrete topic ``building/lobby/temperature``. With 1 subscriber it
    subscribes to that exact topic; with 10, six subscribe to the exact topic
    and four use wildcards (see ``FILTERS_10``).
  - blinker: one ``Signal`` held by the publisher (no lookup per send),
    receivers connected with ``weak=False`` (blinker's faster configuration),
    ``signal.send(topic, payload=p)``.
  - pypubsub: ``pub.subscribe(listener, "building.lobby.temperature")`` and
    ``pub.sendMessage(topic, payload=p)`` with its default settings.
  - floor: a plain ``dict`` from topic to a list of callbacks, looped over and
    called; the least any topic dispatch can cost in Python, for context.

* Async-consumer group (each consumer a task doing ``async for`` over its
  source; the publisher publishes a batch of ``BATCH`` messages, then
  ``await anyio.sleep(0)`` so the consumers run; timing stops when every
  consumer has received every message):

  - meshbus: subscriber sessions without a handler, ``async for message in
    session``; their client profile's egress limits hold every message of the
    run, and ``statistics().discarded == 0`` is asserted.
  - anyio: one ``create_memory_object_stream(math.inf)`` pair per consumer, the
    producer calling ``send_nowait`` on each (the peer's fastest way to send).

Each measurement runs ``--rounds`` times; implementations are interleaved
within a round (their order rotates each round) and the best round counts,
because the machine is shared and noisy. Timed sections read the thread's CPU
time (``time.thread_time``; ``--wall`` for ``perf_counter``): nothing in them
blocks, so on a quiet machine the two agree, and on a busy one the time other
processes get is not counted. A warm-up pass precedes the rounds, and a fresh
meshbus ``Node`` is started for every measurement (outside the timed part).
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from time import perf_counter

import anyio
import blinker
from pubsub import pub

from meshbus import ClientProfile, Node
from meshbus._egress import _waiter_factory

TOPIC = "building/lobby/temperature"
PUBSUB_TOPIC = "building.lobby.temperature"
PAYLOAD_SIZE = 100
BATCH = 100  # async group: messages published between two checkpoints

FILTERS_1 = (TOPIC,)
FILTERS_10 = (
    *(TOPIC,) * 6,  # six exact subscriptions
    "building/*/temperature",
    "building/lobby/>",
    "building/>",
    "build*/lobby/temperature",
)
assert len(FILTERS_10) == 10
FILTERS = {1: FILTERS_1, 10: FILTERS_10}

# What the timed sections read: CPU time of this (the only) thread, so the time the
# scheduler gives other processes on a shared machine is not counted; nothing here
# blocks (the event loop always has work), so on a quiet machine it equals wall time.
# --wall switches to time.perf_counter.
clock = time.thread_time

# Bench-only profile for the async group: big enough that nothing is discarded.
BENCH_PROFILE = ClientProfile(
    "bench", egress_max_messages=10_000_000, egress_max_bytes=4 * 1024 * 1024 * 1024
)


class Counter:
    """One receiver: every implementation's callback does exactly ``self.n += 1``."""

    __slots__ = ("__weakref__", "n")  # pypubsub keeps weak references to listeners

    def __init__(self) -> None:
        self.n = 0

    def on_message(self, message: object) -> None:  # meshbus on_message
        self.n += 1

    def on_signal(self, sender: object, payload: bytes) -> None:  # blinker receiver
        self.n += 1

    def on_pubsub(self, payload: bytes) -> None:  # pypubsub listener
        self.n += 1

    def on_payload(self, payload: bytes) -> None:  # dict-of-callbacks floor
        self.n += 1


def check(name: str, counters: list[Counter], expected: int) -> None:
    got = [c.n for c in counters]
    assert got == [expected] * len(counters), f"{name}: receivers got {got}, expected {expected}"


# --- callback group --------------------------------------------------------------------


async def meshbus_callbacks(payloads: list[bytes], nsubs: int) -> float:
    counters = [Counter() for _ in range(nsubs)]
    async with Node(name="bench") as node:
        subscribers = []
        for counter, filter in zip(counters, FILTERS[nsubs], strict=True):
            session = node.connect(on_message=counter.on_message)
            session.subscribe(filter)
            subscribers.append(session)
        publisher = node.connect(client_name="publisher")
        publish = publisher.publish
        topic = TOPIC
        gc.collect()
        t0 = clock()
        for p in payloads:
            publish(topic, p)
        elapsed = clock() - t0
        check("meshbus callbacks", counters, len(payloads))
        for session in subscribers:
            stats = session.statistics()
            assert stats.delivered == len(payloads), stats
            assert stats.handler_errors == 0, stats
        assert publisher.statistics().published == len(payloads)
    return elapsed


async def blinker_callbacks(payloads: list[bytes], nsubs: int) -> float:
    counters = [Counter() for _ in range(nsubs)]
    signal = blinker.Signal()
    for counter in counters:
        signal.connect(counter.on_signal, weak=False)
    send = signal.send
    topic = TOPIC
    gc.collect()
    t0 = clock()
    for p in payloads:
        send(topic, payload=p)
    elapsed = clock() - t0
    check("blinker", counters, len(payloads))
    return elapsed


async def pypubsub_callbacks(payloads: list[bytes], nsubs: int) -> float:
    counters = [Counter() for _ in range(nsubs)]
    for counter in counters:
        pub.subscribe(counter.on_pubsub, PUBSUB_TOPIC)
    try:
        send = pub.sendMessage
        topic = PUBSUB_TOPIC
        gc.collect()
        t0 = clock()
        for p in payloads:
            send(topic, payload=p)
        elapsed = clock() - t0
    finally:
        pub.unsubAll(PUBSUB_TOPIC)
    check("pypubsub", counters, len(payloads))
    return elapsed


async def floor_callbacks(payloads: list[bytes], nsubs: int) -> float:
    counters = [Counter() for _ in range(nsubs)]
    routes = {TOPIC: [counter.on_payload for counter in counters]}

    def publish(topic: str, payload: bytes) -> None:
        for callback in routes[topic]:
            callback(payload)

    topic = TOPIC
    gc.collect()
    t0 = clock()
    for p in payloads:
        publish(topic, p)
    elapsed = clock() - t0
    check("dict-of-callbacks", counters, len(payloads))
    return elapsed


# --- async-consumer group ----------------------------------------------------------------


def batched(payloads: list[bytes]) -> list[list[bytes]]:
    return [payloads[i : i + BATCH] for i in range(0, len(payloads), BATCH)]


async def settle() -> None:
    """Let freshly started consumer tasks reach their first wait."""
    for _ in range(10):
        await anyio.sleep(0)


async def meshbus_async(payloads: list[bytes], nsubs: int) -> float:
    expected = len(payloads)
    batches = batched(payloads)
    received: list[int] = []
    all_done = anyio.Event()

    async with Node(name="bench") as node:
        vpn = node.vpn()
        vpn.add_client_profile(BENCH_PROFILE)
        vpn.add_user("bench", client_profile="bench")
        subscribers = []
        for filter in FILTERS[nsubs]:
            session = node.connect(username="bench")
            session.subscribe(filter)
            subscribers.append(session)
        publisher = node.connect(client_name="publisher")

        async def consume(session: object) -> None:
            n = 0
            async for _message in session:  # type: ignore[attr-defined]
                n += 1
                if n == expected:
                    break
            received.append(n)
            if len(received) == nsubs:
                all_done.set()

        async with anyio.create_task_group() as tg:
            for session in subscribers:
                tg.start_soon(consume, session)
            await settle()
            publish = publisher.publish
            topic = TOPIC
            sleep = anyio.sleep
            gc.collect()
            t0 = clock()
            for batch in batches:
                for p in batch:
                    publish(topic, p)
                await sleep(0)
            await all_done.wait()
            elapsed = clock() - t0
        assert received == [expected] * nsubs, received
        for session in subscribers:
            stats = session.statistics()
            assert stats.discarded == 0, stats
            assert stats.delivered == expected, stats
            assert stats.egress_messages == 0, stats
    return elapsed


async def anyio_async(payloads: list[bytes], nsubs: int) -> float:
    expected = len(payloads)
    batches = batched(payloads)
    received: list[int] = []
    all_done = anyio.Event()
    pairs = [anyio.create_memory_object_stream[bytes](math.inf) for _ in range(nsubs)]

    async def consume(receive_stream: anyio.abc.ObjectReceiveStream[bytes]) -> None:
        n = 0
        async with receive_stream:
            async for _payload in receive_stream:
                n += 1
                if n == expected:
                    break
        received.append(n)
        if len(received) == nsubs:
            all_done.set()

    async with anyio.create_task_group() as tg:
        for _send_stream, receive_stream in pairs:
            tg.start_soon(consume, receive_stream)
        await settle()
        sends = [send_stream.send_nowait for send_stream, _ in pairs]
        sleep = anyio.sleep
        gc.collect()
        t0 = clock()
        if nsubs == 1:  # no fan-out loop: give the peer its best shot
            send = sends[0]
            for batch in batches:
                for p in batch:
                    send(p)
                await sleep(0)
        else:
            for batch in batches:
                for p in batch:
                    for send in sends:
                        send(p)
                await sleep(0)
        await all_done.wait()
        elapsed = clock() - t0
    for send_stream, _ in pairs:
        send_stream.close()
    assert received == [expected] * nsubs, received
    return elapsed


# --- driver -------------------------------------------------------------------------------

Impl = Callable[[list[bytes], int], Awaitable[float]]


@dataclass
class Scenario:
    key: str  # "callbacks" or "async"
    nsubs: int
    messages: int
    impls: dict[str, Impl]
    samples: dict[str, list[float]] = field(default_factory=dict)  # msg/s per round

    @property
    def label(self) -> str:
        if self.key == "callbacks":
            return f"inproc.callbacks {self.nsubs} sub{'s' if self.nsubs > 1 else ''}"
        return f"inproc.async {self.nsubs} consumer{'s' if self.nsubs > 1 else ''}"

    def best(self, impl: str) -> float:
        return max(self.samples[impl])


def make_scenarios(quick: bool) -> list[Scenario]:
    scale = 10 if quick else 1
    callbacks: dict[str, Impl] = {
        "meshbus": meshbus_callbacks,
        "blinker": blinker_callbacks,
        "pypubsub": pypubsub_callbacks,
        "floor": floor_callbacks,
    }
    consumers: dict[str, Impl] = {"meshbus": meshbus_async, "anyio stream": anyio_async}
    return [
        Scenario("callbacks", 1, 100_000 // scale, callbacks),
        Scenario("callbacks", 10, 25_000 // scale, callbacks),
        Scenario("async", 1, 100_000 // scale, consumers),
        Scenario("async", 10, 25_000 // scale, consumers),
    ]


# (scenario key, subscribers, peer) -> minimum meshbus/peer ratio, from the issue
TARGETS = {
    ("callbacks", 1, "blinker"): 2.0,
    ("callbacks", 10, "blinker"): 3.0,
    ("async", 1, "anyio stream"): 4.0,
    ("async", 10, "anyio stream"): 4.0,
}


def fmt_rate(rate: float) -> str:
    return f"{rate / 1e6:.3g} M msg/s"


def fmt_target(target: float) -> str:
    return f"{target:g}x"


async def run(args: argparse.Namespace) -> None:
    # Many short rounds rather than a few long ones: on a shared machine a short run is
    # likelier to land in a quiet moment, and the best round is what counts.
    rounds = args.rounds or (5 if args.quick else 13)
    scenarios = make_scenarios(args.quick)
    most = max(s.messages for s in scenarios)
    blob = os.urandom(PAYLOAD_SIZE * most)
    payloads = [blob[i * PAYLOAD_SIZE : (i + 1) * PAYLOAD_SIZE] for i in range(most)]
    assert len({id(p) for p in payloads}) == most  # distinct objects, one per message
    del blob

    versions = ", ".join(
        f"{dist} {importlib.metadata.version(dist)}"
        for dist in ("meshbus", "blinker", "pypubsub", "anyio", "trio")
    )
    print(
        f"inproc: Python {platform.python_version()} on {args.backend}, {versions}; "
        f"{os.cpu_count()} CPUs; best of {rounds} rounds, implementations interleaved; "
        f"timed with {'wall clock' if clock is perf_counter else 'thread CPU time'}"
        + (" (--quick)" if args.quick else "")
    )
    print(
        f"inproc: {PAYLOAD_SIZE}-byte payloads, a distinct bytes object per message from a "
        "pre-built list; every receiver increments its own counter; all counts asserted"
    )
    print(
        "inproc: msg/s = messages published per second, each delivered to every subscriber; "
        + ", ".join(f"{s.label.split(' ', 1)[1]}: {s.messages} messages" for s in scenarios)
    )
    print(
        f"inproc: meshbus publishes to {TOPIC!r}; 10 subscribers = 6 exact + "
        + ", ".join(repr(f) for f in FILTERS_10[6:])
        + f"; blinker and pypubsub receivers all on one signal/topic; async consumers "
        f"use async for, the publisher sends batches of {BATCH} then anyio.sleep(0); "
        "sessions on defaults (no timestamps)"
    )
    sys.stdout.flush()

    started = perf_counter()  # wall time of the whole run, for the last line
    for scenario in scenarios:  # warm-up pass, not recorded (imports, allocator, CPU clock)
        for impl in scenario.impls.values():
            await impl(payloads[:2000], scenario.nsubs)
    for r in range(rounds):
        for scenario in scenarios:
            names = list(scenario.impls)
            shift = r % len(names)  # rotate the order so no one always runs first
            for name in names[shift:] + names[:shift]:
                elapsed = await scenario.impls[name](payloads[: scenario.messages], scenario.nsubs)
                scenario.samples.setdefault(name, []).append(scenario.messages / elapsed)
        if args.verbose:
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr)

    met = total = 0
    for scenario in scenarios:
        ours = scenario.best("meshbus")
        for peer in scenario.impls:
            if peer in ("meshbus", "floor"):
                continue
            theirs = scenario.best(peer)
            ratio = ours / theirs
            line = (
                f"{scenario.label}: meshbus {fmt_rate(ours)}, {peer} {fmt_rate(theirs)}, "
                f"ratio {ratio:.2f}x"
            )
            target = TARGETS.get((scenario.key, scenario.nsubs, peer))
            if target is not None:
                ok = ratio >= target
                met += ok
                total += 1
                line += f" (target >= {fmt_target(target)}) {'OK' if ok else 'MISS'}"
            print(line)
        if "floor" in scenario.impls:
            floor = scenario.best("floor")
            print(
                f"{scenario.label}: floor dict-of-callbacks {fmt_rate(floor)}, "
                f"meshbus at {ours / floor:.2f}x of the floor (context, no target)"
            )
        if args.verbose:
            for name, samples in scenario.samples.items():
                print(
                    f"  {scenario.label} {name}: "
                    + " ".join(f"{s / 1e6:.2f}" for s in samples)
                    + f" M msg/s (median {statistics.median(samples) / 1e6:.2f})"
                )
    print(f"inproc: targets met {met}/{total}; run took {perf_counter() - started:.0f} s")


# --- --steps: what each step of the meshbus paths costs ----------------------------------
#
# cProfile's per-call overhead is larger than most of these steps, so each one is timed
# on its own in the same loop shape as the benchmark (a loop over the distinct payloads),
# best of several runs. The "loop" row is the cost of that loop with an empty call; the
# other rows include it. This mode reaches into a few private attributes (vpn._route,
# session._egress, session._envelope), so it may need updating when those change.


def _best_ns(run: Callable[[], object], n: int, rounds: int) -> float:
    best = math.inf
    for _ in range(rounds):
        gc.collect()
        t0 = clock()
        run()
        best = min(best, clock() - t0)
    return best / n * 1e9


async def _best_ns_async(run: Callable[[], Awaitable[object]], n: int, rounds: int) -> float:
    best = math.inf
    for _ in range(rounds):
        gc.collect()
        t0 = clock()
        await run()
        best = min(best, clock() - t0)
    return best / n * 1e9


async def steps(args: argparse.Namespace) -> None:
    from meshbus import Message
    from meshbus._messages import _EMPTY_HEADERS, DeliveryMode

    n = 20_000 if args.quick else 100_000
    rounds = args.rounds or (3 if args.quick else 9)
    blob = os.urandom(PAYLOAD_SIZE * n)
    payloads = [blob[i * PAYLOAD_SIZE : (i + 1) * PAYLOAD_SIZE] for i in range(n)]
    topic = TOPIC
    print(
        f"inproc.step: Python {platform.python_version()} on {args.backend}; ns per message, "
        f"best of {rounds} runs of {n}; every row includes the loop of the first row"
    )

    def row(label: str, ns: float) -> None:
        print(f"inproc.step {label}: {ns:.0f} ns")

    def loop(fn: Callable[[str, bytes], object]) -> Callable[[], None]:
        def run() -> None:
            for p in payloads:
                fn(topic, p)

        return run

    def empty(topic: str, payload: bytes) -> None:
        pass

    row("loop calling an empty 2-argument function", _best_ns(loop(empty), n, rounds))

    async with Node(name="bench") as node:
        vpn = node.vpn()
        vpn.add_client_profile(BENCH_PROFILE)
        vpn.add_user("bench", client_profile="bench")
        counter = Counter()
        callback = node.connect(on_message=counter.on_message)
        callback.subscribe(TOPIC)
        publisher = node.connect(client_name="publisher")
        row(
            "Session.publish, 1 callback subscriber (whole path)",
            _best_ns(loop(publisher.publish), n, rounds),
        )
        stamping = node.connect(client_name="stamping", timestamps=True)
        row(
            "  the same from a session with timestamps=True",
            _best_ns(loop(stamping.publish), n, rounds),
        )
        stamping.close()

        clock_time = node.clock.time
        direct, no_headers = DeliveryMode.DIRECT, _EMPTY_HEADERS

        def make(topic: str, payload: bytes) -> None:
            Message(
                topic, payload, direct, no_headers, False, None, None, "publisher", clock_time()
            )

        row(
            "  Message(...) as publish builds it, with clock.time()",
            _best_ns(loop(make), n, rounds),
        )

        def read_clock(topic: str, payload: bytes) -> None:
            clock_time()

        row("  clock.time() alone", _best_ns(loop(read_clock), n, rounds))
        message = Message(TOPIC, payloads[0], sender="publisher")
        envelope = publisher._envelope
        envelope.message = message
        route = vpn._route

        def routed(topic: str, payload: bytes) -> None:
            route(envelope)

        row(
            "  vpn._route(envelope) (DirectRouter.route -> deliver -> handler)",
            _best_ns(loop(routed), n, rounds),
        )
        deliver = callback.deliver

        def delivered(topic: str, payload: bytes) -> None:
            deliver(message)

        row(
            "  session.deliver(message), callback session (_call_handler + handler)",
            _best_ns(loop(delivered), n, rounds),
        )
        handler = counter.on_message

        def handled(topic: str, payload: bytes) -> None:
            handler(message)

        row("  the handler alone (self.n += 1)", _best_ns(loop(handled), n, rounds))
        callback.close()

        # Async-consumer path: the egress is filled untimed, then drained timed (drains
        # never wait: Egress.get only waits on an empty buffer).
        consumer = node.connect(username="bench")
        consumer.subscribe(TOPIC)
        push = consumer.deliver

        def pushed(topic: str, payload: bytes) -> None:
            push(message)

        def fill() -> None:
            for p in payloads:
                publisher.publish(topic, p)

        async def drain_async_for() -> None:
            k = 0
            async for _m in consumer:
                k += 1
                if k == n:
                    break

        async def drain_receive() -> None:
            receive = consumer.receive
            for _ in range(n):
                await receive()

        async def drain_get() -> None:
            get = consumer._egress.get
            for _ in range(n):
                await get()

        async def drain_nowait() -> None:
            receive_nowait = consumer.receive_nowait
            for _ in range(n):
                receive_nowait()

        best = math.inf
        for _ in range(rounds):
            best = min(best, _best_ns(loop(pushed), n, 1))
            await drain_nowait()
        row("  session.deliver(message), receiving session (Egress.push)", best)
        for label, drain in (
            ("consumer: async for message in session", drain_async_for),
            ("consumer: await session.receive()", drain_receive),
            ("consumer: await session._egress.get()", drain_get),
            ("consumer: session.receive_nowait()", drain_nowait),
        ):
            best = math.inf
            for _ in range(rounds):
                fill()
                best = min(best, await _best_ns_async(drain, n, 1))
            assert consumer.statistics().egress_messages == 0
            row(label, best)

        make_waiter = _waiter_factory()  # what Egress.get() makes once per wait here

        def new_waiter(topic: str, payload: bytes) -> None:
            make_waiter()

        row(
            f"consumer wait: {type(make_waiter()).__name__} creation (once per wait)",
            _best_ns(loop(new_waiter), n, rounds),
        )

        def new_event(topic: str, payload: bytes) -> None:
            anyio.Event()

        row(
            "consumer wait: anyio.Event() creation, for comparison",
            _best_ns(loop(new_event), n, rounds),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="10x fewer messages, 5 rounds")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default 13, quick 5)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every sample too")
    parser.add_argument(
        "--wall", action="store_true", help="time with perf_counter instead of thread CPU time"
    )
    parser.add_argument(
        "--steps", action="store_true", help="instead: time each step of the meshbus paths"
    )
    args = parser.parse_args()
    if args.wall:
        global clock
        clock = perf_counter
    anyio.run(steps if args.steps else run, args, backend=args.backend)


if __name__ == "__main__":
    main()
