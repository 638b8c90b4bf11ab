"""What the metrics endpoint costs a node: ``bench/transport.py``'s meshbus throughput
with the node's ``/metrics`` scraped every second, against the same node without an
endpoint, the runs interleaved.

Run from the checkout with the dev virtualenv (``pip install -e '.[dev,bench]'``)::

    .venv/bin/python bench/metrics_cost.py               # N=1,000,000, 5 rounds: ~2 min
    .venv/bin/python bench/metrics_cost.py --quick       # N=300,000, 3 rounds: a smoke run
    .venv/bin/python bench/metrics_cost.py --interval 0.1 --queues 100

One line per run and per figure; a benchmark, not a test: the exit status is 0 even
when the target is missed.

What is measured: each run is ``transport.py``'s meshbus throughput run (a publisher
process -> a node process with one plain TCP listener -> a subscriber process, N
messages of 100 bytes; msg/s at the subscriber from its first to its last message)
on a fresh node. "on" runs start the node with ``serve_metrics`` on 127.0.0.1 and a
thread of this process GETs ``/metrics`` as soon as the node is up and then every
``--interval`` seconds until the subscriber is done (every answer is checked: 200 and
the node's figures in it); "off" runs start the node without an endpoint. N is large
enough for a run to last a few seconds, so that scrapes fall inside the timed window
(every process reads CLOCK_MONOTONIC, and each "on" line says how many did). The runs
alternate on, off, on, off... (``--rounds`` of each, at least 3), so a slow spell of
the machine falls on both; the figure is the ratio of the medians, and the cost is
1 - on/off (target <= 2%). With ``--queues`` the node also has that many queues (each
one adds 15 series to every scrape), none of them on the benchmark's topic.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import _peers
import anyio
from _harness import verdict
from _peers import READY_TIMEOUT, Child, PeerError
from transport import Throughput, publish_timeout

TARGET = 0.02  # at most this share of the throughput


class Scraper:
    """GETs ``url`` now and then every ``interval`` seconds, in a thread, until stopped."""

    def __init__(self, url: str, interval: float) -> None:
        self.url = url
        self.interval = interval
        self.scrapes = 0
        self.seconds: list[float] = []  # how long each scrape took, end to end
        self.times: list[float] = []  # when each one started (time.monotonic)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self.times.append(time.monotonic())
                started = time.perf_counter()
                with urllib.request.urlopen(self.url, timeout=10) as answer:
                    body = answer.read()
                    if answer.status != 200 or b"meshbus_vpn_published_total" not in body:
                        raise PeerError(f"scrape of {self.url}: {answer.status}, {body[:200]!r}")
                self.seconds.append(time.perf_counter() - started)
                self.scrapes += 1
            except Exception as exc:  # reported with the run's figure
                self.error = exc
                return
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))


@contextlib.contextmanager
def node(work: Path, metrics: bool, queues: int) -> Iterator[tuple[int, str | None]]:
    """The benchmark's node process: its listener's port, and its metrics URL (or None)."""
    args = ["--metrics"] if metrics else []
    if queues:
        args += ["--queues", str(queues)]
    with Child.role("meshbus-broker", work, *args) as child:
        url = None
        if metrics:
            url = f"http://{child.expect('metrics on', READY_TIMEOUT)}/metrics"
        where = child.expect("listening on", READY_TIMEOUT)
        yield int(where.split()[0].rsplit(":", 1)[1]), url


def one_run(
    work: Path, args: argparse.Namespace, metrics: bool
) -> tuple[Throughput, Scraper | None, int]:
    """One run: its throughput, its scraper and how many scrapes began in its window.

    As ``transport.measure_throughput``, also keeping when the window began and ended."""
    with node(work, metrics, args.queues) as (port, url):
        scraper = Scraper(url, args.interval) if url is not None else None
        with scraper or contextlib.nullcontext():
            common = ["--url", f"tcp://127.0.0.1:{port}", "--messages", str(args.messages)]
            with Child.role("meshbus-sub", work, *common) as sub:
                sub.expect("READY", READY_TIMEOUT)
                with Child.role("meshbus-pub", work, *common) as pub:
                    published = pub.result(publish_timeout(args.messages))
                sub.tell("published")
                got = sub.result(publish_timeout(args.messages))
    if got["received"] == 0:
        raise PeerError("the subscriber received nothing")
    if scraper is not None and scraper.error is not None:
        raise PeerError(f"scraping failed: {scraper.error}")
    t = Throughput(
        received=got["received"],
        expected=args.messages,
        window=got["last"] - got["first"],
        total=got["last"] - published["start"],
    )
    inside = sum(got["first"] <= at <= got["last"] for at in scraper.times) if scraper else 0
    return t, scraper, inside


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N=300,000 and 3 rounds")
    parser.add_argument("--messages", type=int, help="N, messages per run (1,000,000)")
    parser.add_argument("--rounds", type=int, help="runs of each kind, interleaved (5; quick 3)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes")
    parser.add_argument("--queues", type=int, default=0, help="queues on the node (0)")
    args = parser.parse_args(argv)
    args.messages = args.messages or (300_000 if args.quick else 1_000_000)
    args.rounds = args.rounds or (3 if args.quick else 5)
    if args.rounds < 3 or args.messages < 1 or not args.interval > 0 or args.queues < 0:
        parser.error("--rounds must be at least 3, --messages and --interval above 0")
    load = " ".join(f"{x:.2f}" for x in _loadavg())
    say(
        f"# metrics cost: transport.py's meshbus throughput (tcp, N={args.messages:,} x 100 B), "
        f"/metrics scraped every {args.interval:g} s on 'on' runs, {args.rounds} on/off pairs "
        f"interleaved; {args.queues} queues; load average {load}"
    )
    rates: dict[bool, list[float]] = {True: [], False: []}
    with _peers.temp_workdir() as tmp:
        work = Path(tmp)
        for round_ in range(1, args.rounds + 1):
            for metrics in (True, False):
                kind = "on " if metrics else "off"
                try:
                    t, scraper, inside = one_run(work, args, metrics)
                except PeerError as exc:
                    say(f"metrics cost run {round_} {kind}: failed ({exc})")
                    continue
                rates[metrics].append(t.rate)
                extra = ""
                if scraper is not None:
                    mean = statistics.fmean(scraper.seconds) * 1000 if scraper.seconds else 0.0
                    extra = (
                        f"; {inside} scrapes in the window, {scraper.scrapes} in all, "
                        f"{mean:.1f} ms each on average"
                    )
                say(f"metrics cost run {round_} {kind}: {t.rate:,.0f} msg/s ({t.details()}{extra})")
    if not rates[True] or not rates[False]:
        say("metrics cost: not enough runs to compare")
        return
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    cost = 1 - on / off
    say(f"metrics cost on: median {on:,.0f} msg/s over {len(rates[True])} runs")
    say(f"metrics cost off: median {off:,.0f} msg/s over {len(rates[False])} runs")
    pairs = [a / b for a, b in zip(rates[True], rates[False], strict=False)]
    say(
        f"metrics cost by pair (context): median of each pair's on/off = "
        f"{statistics.median(pairs):.3f} over {len(pairs)} pairs"
    )
    render = anyio.run(_render_seconds, args.queues)
    series, seconds = render
    say(
        f"metrics render (context): {seconds * 1000:.2f} ms of the node's event loop per "
        f"scrape ({series} series, median of 200, in this process), "
        f"{seconds / args.interval:.3%} of each {args.interval:g} s interval"
    )
    say(
        f"metrics cost: on/off = {on / off:.3f}, cost {cost:+.1%} of throughput "
        f"(target <= {TARGET:.0%}) {verdict(cost <= TARGET)}; "
        f"load average now {' '.join(f'{x:.2f}' for x in _loadavg())}"
    )


async def _render_seconds(queues: int) -> tuple[int, float]:
    """What one scrape costs the node's loop: the collector's read of the node's
    statistics and prometheus_client's rendering, for a node like the benchmark's."""
    from prometheus_client import CollectorRegistry, generate_latest

    from meshbus import Node
    from meshbus.transports import ListenerSettings, NodeCollector, start_server

    async with Node(name="render") as node:
        await start_server(node, ListenerSettings(port=0))
        for i in range(queues):
            node.guaranteed.create_queue(f"idle-{i}", subscriptions=[f"idle/{i}"])
        registry = CollectorRegistry(auto_describe=False)
        registry.register(NodeCollector(node))
        times = []
        for _ in range(200):
            started = time.perf_counter()
            text = generate_latest(registry)
            times.append(time.perf_counter() - started)
        series = sum(1 for line in text.splitlines() if not line.startswith(b"#"))
        return series, statistics.median(times)


def _loadavg() -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ()


if __name__ == "__main__":
    sys.exit(main())
