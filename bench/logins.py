"""Logins under a flood of bad passwords: does the node keep serving everybody else?

Run from the checkout with the dev virtualenv::

    .venv/bin/python bench/logins.py             # 5 rounds, 256 attackers: about 3 minutes
    .venv/bin/python bench/logins.py --quick     # 1 round, 64 attackers: a smoke run, ~30 s
    .venv/bin/python bench/logins.py -v          # also every round's figures

One line per figure; a benchmark, not a test: the exit status is 0 even when a
target is missed.

The processes, all on 127.0.0.1 and the machine's cores:

* the node: ``meshbus run`` with a VPN ``bench`` that uses basic authentication,
  one TCP listener, and the node's defaults (its LoginGuard among them);
* a healthy session (user ``healthy``, logged in before anything starts) that
  times round trips: it publishes to a topic it subscribes to and waits for the
  message to come back through the node;
* the attackers: ``--attackers`` connections in one process, spread over
  ``--addresses`` source addresses (127.0.0.2, 127.0.0.3, ...), each logging in
  with a wrong password again as soon as it is answered; half of them name an
  existing user (``victim``), half a new unknown username each time;
* a prober: a correct login (user ``ops``) from 127.0.0.1, an address that
  does not attack, every ``--probe-interval`` seconds while the attack runs,
  and once from an attacking address (context: that address is throttled).

Each round measures the healthy session idle (no attacker process), then under
attack: the attackers start and get ``--warmup`` seconds to reach their steady
state, then the healthy session times its round trips while the prober logs in.
Both phases time round trips back to back for ``--window`` seconds (at least
``--samples`` of them), so both percentiles rest on about as many samples. The figures are the median over
the rounds of each round's percentile, so idle and attack alternate and a slow
spell of the machine lands on both.

Lines:

* ``logins healthy idle``: p50 / p99 round trip (microseconds), no attack;
* ``logins healthy under attack``: the same during the attack, and p99 as a
  ratio of the idle p99 measured in the same run (target: <= 2x);
* ``logins refused``: refusals per second the attackers received, their
  attempts, and how long an answer took them (the node makes repeated
  failures wait for their turn);
* ``logins correct during attack``: the correct logins' time to be logged in,
  p50 and max (target: every one succeeds, max <= 1 s);
* ``logins correct from a flooded address``: context, not a target.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _peers
from _harness import verdict
from _peers import READY_TIMEOUT, Child, PeerError

THIS = Path(__file__).resolve()
HOST = "127.0.0.1"
VPN = "bench"
PASSWORDS = {"healthy": "healthy-secret", "ops": "ops-secret", "victim": "victim-secret"}
ANSWER_TIMEOUT = 60.0  # an attacker gives up on one login after this long
clock = time.perf_counter

CONFIG = """\
# bench/logins.py: the node under test
[node]
name = "bench"
data_dir = "data"

[[listeners]]
host = "127.0.0.1"
port = 0

[vpns.bench]
authentication = "basic"
[vpns.bench.users.healthy]
password = "{healthy}"
[vpns.bench.users.ops]
password = "{ops}"
[vpns.bench.users.victim]
password = "{victim}"
"""


# --- orchestration ---------------------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def role(name: str, workdir: Path, *args: str) -> Child:
    return Child(name, [sys.executable, str(THIS), name, *args], workdir)


@contextlib.contextmanager
def meshbus_node(workdir: Path) -> Iterator[str]:
    """``meshbus run`` on the bench configuration; yields the listener's URL."""
    config = workdir / "node.toml"
    config.write_text(CONFIG.format(**PASSWORDS))
    argv = [sys.executable, "-m", "meshbus", "run", str(config), "--log-level", "warning"]
    with Child("meshbus-run", argv, workdir) as node:
        yield node.expect("listening on", READY_TIMEOUT)


def measure_round(
    workdir: Path, url: str, healthy: Child, args: argparse.Namespace
) -> dict[str, Any]:
    """One round: the healthy session idle, then under attack with the prober."""
    # Both phases sample for the same time, so their p99s rest on as many round trips.
    samples = f"{args.samples} {args.samples // 10} {args.window}"
    healthy.tell(f"measure {samples}")
    idle = healthy.result(120 + args.window)["rtt_us"]
    addresses = [f"127.0.0.{2 + i}" for i in range(args.addresses)]
    attack = ["--url", url, "--clients", str(args.attackers), "--addresses", ",".join(addresses)]
    with role("attackers", workdir, *attack) as attackers:
        attackers.expect("READY", READY_TIMEOUT)
        time.sleep(args.warmup)  # the first wave, then the steady state
        attackers.tell("mark")
        probe = ["--url", url, "--interval", str(args.probe_interval), "--flooded", addresses[0]]
        with role("prober", workdir, *probe) as prober:
            prober.expect("READY", READY_TIMEOUT)
            healthy.tell(f"measure {samples}")
            attacked = healthy.result(120 + args.window)["rtt_us"]
            prober.tell("stop")
            probed = prober.result(120)
        attackers.tell("stop")
        attacked_by = attackers.result(120)
    return {"idle": idle, "attacked": attacked, "attackers": attacked_by, "prober": probed}


def report(rounds: list[dict[str, Any]], args: argparse.Namespace) -> None:
    def median_of(phase: str, p: float) -> float:
        return statistics.median(percentile(r[phase], p) for r in rounds)

    idle50, idle99 = median_of("idle", 50), median_of("idle", 99)
    hit50, hit99 = median_of("attacked", 50), median_of("attacked", 99)
    ratio = hit99 / idle99 if idle99 > 0 else math.inf
    say(f"logins healthy idle: p50 {idle50:,.0f} us p99 {idle99:,.0f} us")
    say(
        f"logins healthy under attack: p50 {hit50:,.0f} us p99 {hit99:,.0f} us = "
        f"{ratio:.2f}x idle p99 (target <= 2x) {verdict(ratio <= 2.0)}"
    )
    rates = [r["attackers"]["refused"] / r["attackers"]["seconds"] for r in rounds]
    attempts = sum(r["attackers"]["attempts"] for r in rounds)
    waits = [w for r in rounds for w in r["attackers"]["answer_s"]]
    other = sum(r["attackers"]["welcomed"] + r["attackers"]["errors"] for r in rounds)
    say(
        f"logins refused: {statistics.median(rates):,.0f}/s to {args.attackers} attackers "
        f"from {args.addresses} addresses ({attempts:,} answered in the windows; answer "
        f"p50 {percentile(waits, 50) if waits else 0:.2f} s, max {max(waits, default=0):.2f} s"
        + (f"; {other} not refused" if other else "")
        + ")"
    )
    logins = [s for r in rounds for s in r["prober"]["seconds"]]
    failures = [f for r in rounds for f in r["prober"]["failures"]]
    if logins:
        worst = max(logins)
        ok = not failures and worst <= 1.0
        say(
            f"logins correct during attack: {len(logins)} of {len(logins) + len(failures)} "
            f"logged in, p50 {percentile(logins, 50) * 1000:,.0f} ms max {worst * 1000:,.0f} ms "
            f"(target: all, max <= 1 s) {verdict(ok)}"
            + (f"; failed: {failures[:3]}" if failures else "")
        )
    else:
        say(f"logins correct during attack: none logged in; failed: {failures[:3]} MISS")
    flooded = [r["prober"]["flooded"] for r in rounds]
    say(f"logins correct from a flooded address: {flooded[0]} (context: that address is throttled)")
    if args.verbose:
        for i, r in enumerate(rounds, start=1):
            a = r["attackers"]
            say(
                f"  round {i}: idle p50/p99 {percentile(r['idle'], 50):,.0f}/"
                f"{percentile(r['idle'], 99):,.0f} us, attacked "
                f"{percentile(r['attacked'], 50):,.0f}/{percentile(r['attacked'], 99):,.0f} us "
                f"max {max(r['attacked']):,.0f} us ({len(r['attacked'])} samples), refused "
                f"{a['refused']} in {a['seconds']:.1f} s, correct logins "
                f"{[round(s * 1000) for s in r['prober']['seconds']]} ms (of which TCP connect "
                f"max {max(r['prober']['connects'], default=0) * 1000:,.0f} ms)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short round: a smoke run")
    parser.add_argument("--rounds", type=int, default=None, help="idle/attack rounds (5)")
    parser.add_argument("--attackers", type=int, default=None, help="connections (256)")
    parser.add_argument("--addresses", type=int, default=8, help="source addresses they use")
    parser.add_argument("--samples", type=int, default=None, help="round trips a phase (2000)")
    parser.add_argument("--warmup", type=float, default=None, help="seconds of attack first (8)")
    parser.add_argument("--window", type=float, default=None, help="attack window, s (10)")
    parser.add_argument("--probe-interval", type=float, default=0.5)
    parser.add_argument("-v", "--verbose", action="store_true", help="every round's figures")
    args = parser.parse_args()
    quick = args.quick
    for name, full, smoke in (
        ("rounds", 5, 1),
        ("attackers", 256, 64),
        ("samples", 2000, 300),
        ("warmup", 8.0, 3.0),
        ("window", 10.0, 4.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, smoke if quick else full)
    say(
        f"# logins: node (meshbus run, basic authentication, default LoginGuard), a healthy "
        f"session, {args.attackers} attackers over {args.addresses} source addresses and a "
        f"prober, every process on 127.0.0.1; {args.rounds} round(s) of idle then attack, "
        f"round trips for {args.window:g} s a phase (>= {args.samples}), medians over "
        f"rounds; Python {platform.python_version()}, {len(os.sched_getaffinity(0))} CPUs"
    )
    with tempfile.TemporaryDirectory(prefix="meshbus-bench-logins-") as tmp:
        workdir = Path(tmp)
        try:
            with meshbus_node(workdir) as url, role("healthy", workdir, "--url", url) as healthy:
                healthy.expect("READY", READY_TIMEOUT)
                rounds = [measure_round(workdir, url, healthy, args) for _ in range(args.rounds)]
                healthy.tell("quit")
        except PeerError as exc:
            say(f"logins: failed ({exc})")
            return
    report(rounds, args)


# --- the roles, each its own process ------------------------------------------------------


def result(**fields: Any) -> None:
    print("RESULT " + json.dumps(fields), flush=True)


class Stdin:
    """Lines from standard input, read by a thread, for a role's event loop."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            self.lines.append(line.strip())
            self._ready.set()
        self.lines.append("quit")
        self._ready.set()

    async def next(self) -> str:
        import anyio

        while not self.lines:
            await anyio.to_thread.run_sync(self._ready.wait, abandon_on_cancel=True)
            self._ready.clear()
        return self.lines.pop(0)


async def healthy_role(url: str) -> None:
    """Log in, then on ``measure N WARMUP SECONDS`` time round trips and print them."""
    from meshbus.transports import connect

    stdin = Stdin()
    async with connect(url, vpn=VPN, username="healthy", password=PASSWORDS["healthy"]) as s:
        topic = f"bench/echo/{s.client_name}"
        s.subscribe(topic)
        await s.confirm()
        print("READY", flush=True)
        payload = os.urandom(100)
        while (line := await stdin.next()) != "quit":
            _, count, warmup, seconds = line.split()
            samples: list[float] = []
            end = clock() + float(seconds)
            for i in range(int(warmup) + int(count)):
                t0 = clock()
                s.publish(topic, payload)
                await s.receive()
                if i >= int(warmup):
                    samples.append((clock() - t0) * 1e6)
            while clock() < end:  # as long as the window lasts
                t0 = clock()
                s.publish(topic, payload)
                await s.receive()
                samples.append((clock() - t0) * 1e6)
            result(rtt_us=samples)


async def attempt(
    host: str, port: int, local: str | None, username: str, password: str, phases: list[float]
) -> str:
    """One login; ``"refused"``, ``"welcomed"`` or the error. A raw client, because the
    source address has to be chosen. Appends the seconds the TCP connect took to ``phases``."""
    import anyio

    from meshbus.errors import AuthenticationError, MeshbusError
    from meshbus.transports._connection import Connection
    from meshbus.transports._protocol import LinkProtocol, Role
    from meshbus.transports._settings import MAX_FRAME_SIZE

    t0 = clock()
    try:
        stream = await anyio.connect_tcp(host, port, local_host=local)
    except OSError as exc:
        return f"connect: {exc}"
    phases.append(clock() - t0)
    connection = Connection(
        stream, LinkProtocol(Role.CLIENT, max_frame_size=MAX_FRAME_SIZE), "bench"
    )
    try:
        connection.protocol.hello({"vpn": VPN, "username": username, "password": password})
        await connection.flush()
        with anyio.fail_after(ANSWER_TIMEOUT):
            await connection.receive_handshake()
        return "welcomed"
    except AuthenticationError:
        return "refused"
    except (MeshbusError, TimeoutError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        with anyio.CancelScope(shield=True):
            await connection.aclose()


async def attackers_role(url: str, clients: int, addresses: list[str]) -> None:
    """Bad logins without pause until ``stop``; counts answers from ``mark`` on."""
    import anyio

    host, port = _peers.host_port(url)
    stdin = Stdin()
    counts = {"attempts": 0, "refused": 0, "welcomed": 0, "errors": 0}
    answers: list[float] = []
    counting = False

    async def attacker(n: int) -> None:
        local = addresses[n % len(addresses)]
        while True:
            username = "victim" if n % 2 else f"nobody-{uuid.uuid4().hex[:8]}"
            t0 = clock()
            outcome = await attempt(host, port, local, username, uuid.uuid4().hex, [])
            if not counting:
                continue
            counts["attempts"] += 1
            if outcome in counts:
                counts[outcome] += 1
                answers.append(clock() - t0)
            else:
                counts["errors"] += 1
                if counts["errors"] == 1:
                    print(f"attacker error: {outcome}", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as tg:
        for n in range(clients):
            tg.start_soon(attacker, n)
        print("READY", flush=True)
        while (line := await stdin.next()) != "mark":
            if line in ("stop", "quit"):
                tg.cancel_scope.cancel()
                return
        counting = True
        started = clock()
        while await stdin.next() not in ("stop", "quit"):
            pass
        seconds = clock() - started
        counting = False
        tg.cancel_scope.cancel()
    result(seconds=seconds, answer_s=answers, **counts)


async def prober_role(url: str, interval: float, flooded: str) -> None:
    """Correct logins from 127.0.0.1 every ``interval`` s until ``stop``, and one from
    the ``flooded`` address."""
    import anyio

    host, port = _peers.host_port(url)
    stdin = Stdin()
    seconds: list[float] = []
    connects: list[float] = []
    failures: list[str] = []
    flooded_outcome: list[str] = []

    async def from_flooded() -> None:
        t0 = clock()
        outcome = await attempt(host, port, flooded, "ops", PASSWORDS["ops"], [])
        flooded_outcome.append(f"{outcome} after {clock() - t0:.1f} s")

    async def probe() -> None:
        while True:
            t0 = clock()
            outcome = await attempt(host, port, HOST, "ops", PASSWORDS["ops"], connects)
            if outcome == "welcomed":
                seconds.append(clock() - t0)
            else:
                failures.append(outcome)
            await anyio.sleep(interval)

    async with anyio.create_task_group() as tg:
        tg.start_soon(probe)
        tg.start_soon(from_flooded)
        print("READY", flush=True)
        while await stdin.next() not in ("stop", "quit"):
            pass
        tg.cancel_scope.cancel()
    result(
        seconds=seconds,
        connects=connects,
        failures=failures,
        flooded=flooded_outcome[0] if flooded_outcome else "no answer in the window",
    )


def role_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description="One process of bench/logins.py.")
    parser.add_argument("role", choices=["healthy", "attackers", "prober"])
    parser.add_argument("--url", required=True)
    parser.add_argument("--clients", type=int, default=0)
    parser.add_argument("--addresses", default="")
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--flooded", default="127.0.0.2")
    a = parser.parse_args(argv)
    import anyio

    # Imported before the timing starts, not on a role's first login.
    import meshbus.transports._connection  # noqa: F401

    run = {
        "healthy": lambda: healthy_role(a.url),
        "attackers": lambda: attackers_role(a.url, a.clients, a.addresses.split(",")),
        "prober": lambda: prober_role(a.url, a.interval, a.flooded),
    }[a.role]
    anyio.run(run)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("healthy", "attackers", "prober"):
        role_main(sys.argv[1:])
    else:
        main()
