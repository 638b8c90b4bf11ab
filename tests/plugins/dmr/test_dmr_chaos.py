"""Dynamic routing under chaos (SPEC 8): a seeded random run of guaranteed and direct
publishes, cut, slowed, half-open and partitioned links, and stopped and restarted nodes,
on the in-memory mesh's virtual clock; then everything heals and what arrived is checked:

* a guaranteed message whose ``send`` returned, from a node that knew the queue's interest
  and was not stopped before the queue held it (the spools are in memory), reaches the
  queue; a copy beyond the first only with ``redelivered=True`` (SPEC 4); first copies in
  each publisher's order; a refused one never;
* a direct message may be lost while a link is down, never duplicated nor reordered per
  publisher (SPEC 2, 7); a direct copy of a guaranteed message may come twice only with
  the second flagged ``redelivered``, as the queue's copy (SPEC 4);
* once healed, every routing link is in sync, every waiting queue is empty, and a last
  round of publishes reaches every subscriber and the queue.

A failure's message ends with the steps taken. ``run_chaos`` also replays a list of
steps (``script``): the last test is a failing seed's run cut down that way.
``CHAOS_STEPS`` (an environment variable) sets the number of steps of a seeded run.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from meshbus import LinkState, Node, Session
from meshbus.abc import Flow
from meshbus.plugins.dmr import Dmr, start_dmr
from meshbus.transports import Backoff
from meshbus.transports.testing import Mesh
from tests.network_faults import KINDS as FAULTS
from tests.network_faults import LinkFaults

from ._helpers import settings_for

pytestmark = pytest.mark.anyio

Q = "n1"  # the node with the queue; never stopped
QUEUE = "orders"
STEPS = int(os.environ.get("CHAOS_STEPS", "250"))
# How often each kind of step is drawn.
ACTIONS, WEIGHTS = zip(
    *{
        "send": 22,
        "burst": 8,
        "publish": 15,
        "cut": 8,
        "partition": 5,
        "half-open": 3,
        "delay": 6,
        "heal": 7,
        "stop": 4,
        "restart": 5,
        "run": 17,
    }.items(),
    strict=True,
)
# Backoff without jitter: a seed gives the same run every time.
OPTIONS: dict[str, Any] = {"backoff": Backoff(initial=0.5, maximum=5.0, jitter=0.0)}


Action = tuple[str, tuple[Any, ...], bool]
"""A step: what (``"send"``, ``"cut"`` ...), to what, and whether to settle after it."""


def _layout(size: int) -> dict[str, list[str]]:
    return {"c1": [f"n{i}" for i in range(1, size + 1)]}


class Chaos:
    """The cluster, what was published, what arrived, and the steps taken."""

    def __init__(self, mesh: Mesh, seed: int, size: int) -> None:
        self.mesh = mesh
        self.rng = random.Random(seed)
        self.layout = _layout(size)
        self.names = self.layout["c1"]
        self.nodes: dict[str, Node] = {}
        self.dmr: dict[str, Dmr] = {}
        self.publishers: dict[str, Session] = {}
        self.readers: dict[str, Session] = {}  # direct subscribers, this incarnation
        self.incarnation: dict[str, int] = defaultdict(int)
        self.seq: dict[str, int] = defaultdict(int)
        # Guaranteed messages by payload: sent and acked (the publisher knew the queue's
        # interest), sent while it did not know it, refused, and at risk (their node
        # stopped before they arrived: the spools are in memory).
        self.expected: dict[bytes, tuple[str, int]] = {}
        self.unknown: set[bytes] = set()
        self.refused: set[bytes] = set()
        self.at_risk: set[bytes] = set()
        self.sent_by: dict[str, list[bytes]] = defaultdict(list)
        self.arrived: list[tuple[bytes, bool]] = []  # (payload, redelivered) at the queue
        # Direct messages each reader got: (reader incarnation) -> payloads in order, and
        # those of them flagged redelivered (direct copies of guaranteed messages may be).
        self.got: dict[tuple[str, int], list[bytes]] = defaultdict(list)
        self.flagged: dict[tuple[str, int], list[bytes]] = defaultdict(list)
        self.faults = LinkFaults(mesh.network)
        self.steps: list[str] = []
        self.actions: list[Action] = []
        self.last_direct: list[bytes] = []  # published once everything healed
        self.problems: list[str] = []  # found while running
        self.flow: Flow | None = None

    # --- the cluster -----------------------------------------------------------------------

    async def start(self) -> None:
        mesh = self.mesh
        for name in self.names:
            self.nodes[name] = await mesh.start(name, cluster="c1")
        self.nodes[Q].guaranteed.create_queue(QUEUE, subscriptions=["g/>"])  # type: ignore[union-attr]
        for name, node in self.nodes.items():
            self.dmr[name] = await start_dmr(node, self._settings(name), wait=False)
        await mesh.clock.wait_for(lambda: all(d.in_sync for d in self.dmr.values()), within=30)
        for name in self.names:
            self._sessions(name)
        self.flow = await self.nodes[Q].connect(client_name="consumer").bind(QUEUE)
        await mesh.clock.settle()

    def _settings(self, name: str) -> Any:
        return settings_for(self.mesh, self.layout, name, **OPTIONS)

    def _sessions(self, name: str) -> None:
        node = self.nodes[name]
        self.incarnation[name] += 1
        self.publishers[name] = node.connect(client_name=f"pub-{name}")
        reader = node.connect(client_name=f"read-{name}")
        reader.subscribe("d/>")
        if name in (Q, self.names[1]):
            reader.subscribe("g/>")  # the direct copies of guaranteed messages
        self.readers[name] = reader

    @property
    def live(self) -> list[str]:
        return [n for n in self.names if n in self.mesh.nodes]

    async def consume(self) -> None:
        flow = self.flow
        assert flow is not None
        while True:
            message = await flow.receive()
            self.arrived.append((message.payload, message.redelivered))
            flow.ack(message)

    def read_direct(self) -> None:
        for name, reader in self.readers.items():
            if name in self.mesh.nodes:
                key = (name, self.incarnation[name])
                for message in iter(reader.receive_nowait, None):
                    self.got[key].append(message.payload)
                    if message.redelivered:
                        self.flagged[key].append(message.payload)

    # --- the steps ------------------------------------------------------------------------

    def _pair(self) -> tuple[str, str]:
        a, b = self.rng.sample(self.names, 2)
        return (min(a, b), max(a, b))

    def _payload(self, kind: str, name: str) -> bytes:
        self.seq[name] += 1
        return f"{kind}:{name}:{self.seq[name]}".encode()

    async def send(self, name: str) -> None:
        """A guaranteed message from ``name``, noted by what the sender knew."""
        payload = self._payload("g", name)
        knows = name == Q or "g/>" in self.dmr[name].neighbour(Q).learned["g"]
        self.steps.append(f"send {payload.decode()}" + ("" if knows else " (no interest)"))
        try:
            await self.publishers[name].send(f"g/{name}", payload)
        except Exception as exc:  # refused: it must never arrive
            self.steps[-1] += f" refused: {exc!r}"
            self.refused.add(payload)
            return
        if knows:
            self.expected[payload] = (name, self.seq[name])
            self.sent_by[name].append(payload)
        else:
            self.unknown.add(payload)

    def choose(self) -> Action:
        """The next step, drawn from the seed: what to do, to what, and whether to let
        everything settle after it (else the next step finds messages on their way)."""
        rng = self.rng
        kind = rng.choices(ACTIONS, WEIGHTS)[0]
        args: tuple[Any, ...] = ()
        if kind in ("send", "publish"):
            args = (rng.choice(self.live),)
        elif kind == "burst":
            args = (rng.choice(self.live), rng.randint(2, 8))
        elif kind in ("cut", "partition", "half-open"):
            args = self._pair()
        elif kind == "delay":
            args = (*self._pair(), rng.choice([0.05, 0.3, 1.5]))
        elif kind == "heal":
            broken = self.faults.broken()
            args = rng.choice(broken) if broken else ()
        elif kind == "stop":
            stoppable = [n for n in self.live if n != Q]
            args = (rng.choice(stoppable),) if len(stoppable) > 1 else ()
        elif kind == "restart":
            stopped = [n for n in self.names if n not in self.mesh.nodes]
            args = (rng.choice(stopped),) if stopped else ()
        else:
            args = (rng.choice([0.0, 0.02, 0.1, 0.2, 0.5, 1.0, 2.0, 3.5, 6.0, 12.0]),)
        return (kind, args, rng.random() < 0.5)

    async def do(self, action: Action) -> None:
        """Take one step (one that does not apply now, when replayed, does nothing)."""
        kind, args, settle = action
        before = len(self.steps)
        if self._applies(kind, args):
            await self._act(kind, args)
        if settle:
            await self.mesh.clock.settle()
        elif len(self.steps) > before:
            self.steps[-1] += " (no settle)"
        self.read_direct()

    def _applies(self, kind: str, args: tuple[Any, ...]) -> bool:
        live = self.live
        if kind in ("heal", "stop", "restart") and not args:
            return False
        if kind in ("send", "burst", "publish", "stop"):
            return bool(args[0] in live)
        return not (kind == "restart" and args[0] in live)

    async def _act(self, kind: str, args: tuple[Any, ...]) -> None:
        if kind == "send":
            await self.send(args[0])
        elif kind == "burst":  # several on their way at once
            for _ in range(args[1]):
                await self.send(args[0])
        elif kind == "publish":
            payload = self._payload("d", args[0])
            self.steps.append(f"publish {payload.decode()}")
            self.publishers[args[0]].publish(f"d/{args[0]}", payload)
        elif kind in FAULTS:
            self.steps.append(self.faults.apply(kind, args))
        elif kind == "heal":
            self.steps.append("heal {} {}".format(*args))
            self.faults.heal(*args)
        elif kind == "stop":
            self.steps.append(f"stop {args[0]}")
            await self.stop(args[0])
        elif kind == "restart":
            self.steps.append(f"restart {args[0]}")
            await self.restart(args[0])
        else:
            self.steps.append(f"run {args[0]}")
            await self.mesh.clock.run(args[0])

    async def stop(self, name: str) -> None:
        await self.mesh.clock.settle()
        self.read_direct()
        # What it sent and the queue does not hold yet was in its memory only.
        arrived = {p for p, _ in self.arrived}
        self.at_risk.update(p for p in self.sent_by[name] if p not in arrived)
        await self.mesh.stop(name)

    async def restart(self, name: str) -> None:
        node = self.nodes[name] = await self.mesh.start(name, cluster="c1")
        dmr = self.dmr[name] = await start_dmr(node, self._settings(name), wait=False)
        # As start_dmr(wait=True) would: serve once in sync, or after sync_timeout.
        try:
            await self.mesh.clock.wait_for(lambda: dmr.in_sync, within=dmr.settings.sync_timeout)
        except TimeoutError:
            self.steps[-1] += " (not in sync)"
        self._sessions(name)

    async def heal_everything(self) -> None:
        self.faults.heal_all()
        for name in self.names:
            if name not in self.mesh.nodes:
                await self.restart(name)

    def all_in_sync(self) -> bool:
        for name in self.names:
            dmr = self.dmr[name]
            if not dmr.in_sync:
                return False
            for other in self.names:
                if other == name:
                    continue
                neighbour = dmr.neighbour(other)
                out, into = neighbour.out, neighbour.into
                if neighbour.state != "in-sync" or out is None or into is None:
                    return False
                if out.state is not LinkState.IN_SYNC or into.state is not LinkState.IN_SYNC:
                    return False
        return True

    def waiting(self) -> dict[str, int]:
        """Messages in each node's waiting queues (``dmr.<neighbour>``)."""
        counts = {}
        for name in self.names:
            service = self.nodes[name].guaranteed
            assert service is not None
            for other in self.names:
                if other != name:
                    counts[f"{name}:dmr.{other}"] = service.queue(f"dmr.{other}").usage()[0]
        return counts

    def trace(self) -> str:
        return "\n".join(f"{i:4d} {s}" for i, s in enumerate(self.steps))


async def run_chaos(
    mesh: Mesh, seed: int, size: int, steps: int = STEPS, script: list[Action] | None = None
) -> Chaos:
    """Run ``steps`` steps drawn from ``seed`` (or the steps of ``script``), heal, and
    publish a last round; the actions taken are in ``chaos.actions``."""
    chaos = Chaos(mesh, seed, size)
    await chaos.start()
    async with anyio.create_task_group() as tg:
        tg.start_soon(chaos.consume)
        for i in range(steps if script is None else len(script)):
            action = chaos.choose() if script is None else script[i]
            chaos.actions.append(action)
            await chaos.do(action)
        chaos.steps.append("heal everything")
        await chaos.heal_everything()
        try:
            await mesh.clock.wait_for(chaos.all_in_sync, within=120)
            await mesh.clock.wait_for(lambda: not any(chaos.waiting().values()), within=120)
        except TimeoutError:
            chaos.problems.append("not in sync, or waiting queues not empty, 120 s after healing")
        # Whatever may still come does so now.
        await mesh.clock.run(30)
        await mesh.clock.settle()
        chaos.read_direct()
        # A last round from every node reaches every reader and the queue, once.
        chaos.steps.append("last round")
        last_guaranteed = []
        for name in chaos.names:
            payload = chaos._payload("d", name)
            chaos.publishers[name].publish(f"d/{name}", payload)
            chaos.last_direct.append(payload)
            payload = chaos._payload("g", name)
            await chaos.publishers[name].send(f"g/{name}", payload)
            chaos.expected[payload] = (name, chaos.seq[name])
            chaos.sent_by[name].append(payload)
            last_guaranteed.append(payload)

        def arrived() -> bool:
            return {p for p, _ in chaos.arrived} >= set(last_guaranteed)

        with contextlib.suppress(TimeoutError):  # what did not arrive is told by check()
            await mesh.clock.wait_for(arrived, within=30)
        await mesh.clock.settle()
        chaos.read_direct()
        tg.cancel_scope.cancel()
    return chaos


def check(chaos: Chaos) -> None:
    """Every property the run must have; all failures at once, with the steps."""
    problems = list(chaos.problems)
    fail: Callable[[str], None] = problems.append

    # Guaranteed: at the queue.
    copies: dict[bytes, list[bool]] = defaultdict(list)
    for payload, redelivered in chaos.arrived:
        copies[payload].append(redelivered)
    for payload, flags in copies.items():
        if payload in chaos.refused:
            fail(f"{payload!r} was refused to its publisher and arrived")
        elif payload not in chaos.expected and payload not in chaos.unknown:
            fail(f"{payload!r} arrived and was never sent")
        if len(flags) > 1 and not all(flags[1:]):
            fail(f"{payload!r} arrived {len(flags)} times, flags {flags}")
    missing = [p for p in chaos.expected if p not in copies and p not in chaos.at_risk]
    if missing:
        fail(f"{len(missing)} acked guaranteed messages never arrived: {missing[:10]}")
    firsts: dict[str, list[int]] = defaultdict(list)
    seen: set[bytes] = set()
    for payload, _ in chaos.arrived:
        if payload not in seen:
            seen.add(payload)
            _, name, number = payload.decode().split(":")
            firsts[name].append(int(number))
    for name, numbers in firsts.items():
        if numbers != sorted(numbers):
            fail(f"guaranteed messages from {name} arrived out of order: {numbers}")

    # Direct: never twice (but for a direct copy of a guaranteed message a link brought
    # again, flagged: SPEC 4), never out of order per publisher; the last round everywhere.
    for (reader, incarnation), payloads in chaos.got.items():
        flagged = chaos.flagged[reader, incarnation]
        twice = sorted(
            p
            for p in set(payloads)
            if payloads.count(p) > 1
            and not (p.startswith(b"g:") and flagged.count(p) >= payloads.count(p) - 1)
        )
        if twice:
            fail(f"reader on {reader} (#{incarnation}) got duplicates: {twice[:10]}")
        by_publisher: dict[tuple[str, str], list[int]] = defaultdict(list)
        for payload in dict.fromkeys(payloads):  # (duplicates are told above)
            kind, name, number = payload.decode().split(":")
            by_publisher[kind, name].append(int(number))
        for (kind, name), numbers in by_publisher.items():
            if numbers != sorted(numbers):
                fail(f"reader on {reader} got {kind} from {name} out of order: {numbers}")
    for reader in chaos.names:
        payloads = chaos.got[reader, chaos.incarnation[reader]]
        lost = [p for p in chaos.last_direct if p not in payloads]
        if lost:
            fail(f"after healing, reader on {reader} did not get {lost}")

    # The waiting queues are empty again, and the queue itself.
    waiting = {k: v for k, v in chaos.waiting().items() if v}
    if waiting:
        fail(f"waiting queues not empty: {waiting}")
    usage = chaos.nodes[Q].guaranteed.queue(QUEUE).usage()[0]  # type: ignore[union-attr]
    if usage:
        fail(f"queue {QUEUE} still holds {usage} messages")

    assert not problems, "\n".join(problems) + "\n--- steps:\n" + chaos.trace()


@pytest.mark.parametrize(("seed", "size"), [(1, 3), (2, 4), (3, 4), (4, 3), (59, 3)])
async def test_dmr_under_chaos(mesh: Mesh, seed: int, size: int) -> None:
    chaos = await run_chaos(mesh, seed, size)
    # The run did something (the assertions below are not about an idle cluster).
    assert len(chaos.expected) >= 20
    assert len(chaos.arrived) >= 20
    check(chaos)


# Found by seed 59 and cut down to this (SPEC 4: nothing is delivered twice without the
# redelivered flag). n1 spools n2's message; its acknowledgement, delayed, is lost with
# the connection; the partition outlasts n1's origin de-duplication window (10 s, which
# n3's message then moves on), so n2's redelivery is spooled at n1 a second time.
ACK_LOST_THEN_A_LONG_PARTITION: list[Action] = [
    ("delay", ("n1", "n2", 0.3), True),
    ("send", ("n2",), True),
    ("run", (0.2,), True),
    ("run", (0.2,), True),  # n1 holds it now; its ack is on its way
    ("partition", ("n1", "n2"), True),
    ("run", (12.0,), True),
    ("run", (12.0,), True),
    ("send", ("n3",), True),
]


async def test_a_redelivery_after_a_long_partition_is_not_a_silent_duplicate(
    mesh: Mesh,
) -> None:
    chaos = await run_chaos(mesh, 0, 3, script=ACK_LOST_THEN_A_LONG_PARTITION)
    assert b"g:n2:1" in chaos.expected
    check(chaos)
