"""The model of the MQTT chaos test (``test_mqtt_chaos.py``): what was published and
acknowledged, what each session may and must get, and the run's steps; its checks are
in :mod:`._chaos_check`."""

from __future__ import annotations

import contextlib
import random
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import attrs

from meshbus import Node, Session
from meshbus.plugins.mqtt import MqttListener, MqttListenerSettings, start_mqtt_listener

from ._chaos_clients import (
    ACTIONS,
    AUDIT,
    DUE,
    FILTERS,
    IDENTITIES,
    MARK_D,
    MARK_Q,
    MAX_INFLIGHT,
    STEPS,
    TOPICS,
    WAIT,
    WEIGHTS,
    WILLS,
    Action,
    Conn,
    Ended,
    Got,
    In,
    Kind,
    _mid,
    matches,
)

WILL_QUEUE = "chaos-wills"  # where every connection's will goes (see start_node)


@attrs.define
class Sub:
    qos: int
    no_local: bool
    token: int  # stays while the subscription goes on (a new one at another QoS: new)


@attrs.define
class Ident:
    """What the node should know of a client id."""

    name: str
    kind: Kind
    conn: Conn | None = None
    session: bool = False  # the node has a session for it
    durable: bool = False  # that session outlives its connection
    incarnation: int = 0
    subs: dict[str, Sub] = attrs.Factory(dict)

    @property
    def connected(self) -> bool:
        return self.conn is not None


@attrs.define
class Msg:
    mid: int
    publisher: str
    topic: str
    qos: int
    retain: bool
    payload: bytes
    status: str  # acked, unknown (its connection dropped first), refused
    step: int


@attrs.define
class Expect:
    """What a session may get of a message, as it was when the message was published."""

    incarnation: int
    serial: int | None  # the session's connection then
    q1: bool  # a QoS 1 copy (published at 1, a QoS 1 subscription matched)
    q0: int  # QoS 0 copies at most
    q1_tokens: frozenset[int]
    tokens: frozenset[int]
    no_local: bool  # its own message, and a no-local subscription of it matched


@attrs.define
class Window:
    """A subscribe step: what retained values it must bring, and what came."""

    step: int
    name: str
    serial: int
    mqtt_filter: str
    qos: int
    expected: dict[str, int]  # topic -> message
    optional: set[int]  # own values under no-local: either way
    got: list[Got] = attrs.Factory(list)
    incarnation: int = 0  # the session the subscription was made in
    durable: bool = True  # whether that session outlives its connection


class Chaos:
    """The node, the clients, what was published, what arrived, and the steps taken."""

    def __init__(self, data_dir: Path, seed: int) -> None:
        self.data_dir = data_dir
        self.rng = random.Random(seed)
        self.node: Node | None = None
        self.listener: MqttListener | None = None
        self.stack: contextlib.AsyncExitStack | None = None
        self.tg: anyio.abc.TaskGroup = None  # type: ignore[assignment]
        self.idents = {name: Ident(name, kind) for name, kind in IDENTITIES.items()}
        self.serial = 0
        self.msgs: dict[int, Msg] = {}
        self.expects: dict[tuple[str, int], Expect] = {}
        self.retained: dict[str, int] = {}  # topic -> message, as the node should keep
        self.tokens = 0
        self.received_list: list[Got] = []
        self.windows: list[Window] = []
        #: Connections the client ended with DISCONNECT, and the step it did so in.
        self.polite: dict[int, int] = {}
        #: By connection: the last of its writes the node surely read (a PINGRESP
        #: answered a later one); a PUBACK in those is settled.
        self.read_upto: dict[int, int] = {}
        #: Each accepted connection's will: "open" while it lasts, then "one" (it ended
        #: without DISCONNECT: its will must come once), "none" (DISCONNECT), "maybe"
        #: (a session that did not outlive it ended as the node stopped).
        self.wills: dict[int, tuple[str, str, str]] = {}  # serial -> (client id, due, how)
        self.wills_got: list[bytes] = []  # the will payloads the node published
        self.client_acked: set[tuple[str, int, int]] = set()  # (name, incarnation, mid)
        self.last_pid: dict[tuple[str, int, int], tuple[int, int]] = {}  # -> (serial, pid)
        self.problems: dict[str, list[str]] = defaultdict(list)
        self.steps: list[str] = []
        self.actions: list[Action] = []
        self.step = 0
        self.restarts = 0
        self.conns: list[Conn] = []
        self._arrived = anyio.Event()

    # --- the node ---------------------------------------------------------------------

    async def start_node(self) -> None:
        stack = contextlib.AsyncExitStack()
        self.node = await stack.enter_async_context(Node(name="edge", data_dir=self.data_dir))
        # The wills go to a queue (kept across restarts), made before the listener opens
        # as a configuration's would be: a restarted node publishes the wills it brought
        # back then.
        self.node.guaranteed.create_queue(WILL_QUEUE, subscriptions=[WILLS + ">"])
        self.listener = await start_mqtt_listener(
            self.node, MqttListenerSettings(port=0, max_inflight=MAX_INFLIGHT)
        )
        self.stack = stack

    async def stop_node(self) -> None:
        if self.stack is not None:
            stack, self.stack = self.stack, None
            await stack.aclose()

    def fail(self, kind: str, why: str) -> None:
        self.problems[kind].append(f"step {self.step}: {why}")

    def ended(self, conn: Conn, due: str, how: str) -> None:
        """``conn`` ended (``how``): what of its will is due."""
        if self.wills.get(conn.serial, ("", "", ""))[1] == "open":
            self.wills[conn.serial] = (conn.name, due, how)

    def arrived(self) -> None:
        self._arrived.set()
        self._arrived = anyio.Event()

    async def wait_arrivals(self, done: Callable[[], bool], timeout: float = WAIT) -> bool:
        with anyio.move_on_after(timeout):
            while not done():
                event = self._arrived
                await event.wait()
            return True
        return False

    # --- what clients get -------------------------------------------------------------

    async def received(self, conn: Conn, got: In) -> None:
        payload = got.payload
        if payload in (b"zq", b"zd"):
            conn.markers.add(payload)
            self.arrived()
            return
        record = Got(
            conn.name,
            conn.serial,
            conn.incarnation,
            _mid(payload),
            got.topic,
            payload,
            got.qos,
            got.dup,
            got.retain,
            got.pid,
            len(self.received_list),
            self.step,
            conn.window,
        )
        self.received_list.append(record)
        if got.retain and conn.window is not None:
            self.windows[conn.window].got.append(record)
        if got.qos == 1 and record.mid is not None and not got.retain:
            key = (conn.name, conn.incarnation, record.mid)
            before = self.last_pid.get(key)
            again = before is not None and before[0] != conn.serial
            # MQTT-4.4.0-1: an unacknowledged PUBLISH is sent again with its packet id.
            if again and key not in self.client_acked and before[1] != got.pid:
                self.fail(
                    "packet id",
                    f"{conn!r} got m{record.mid} again with packet id {got.pid}, "
                    f"unacknowledged on #{before[0]} with packet id {before[1]}",
                )
            if before is not None and before[0] == conn.serial and conn.v5:
                self.fail("resent", f"{conn!r} got m{record.mid} twice on one connection")
            self.last_pid[key] = (conn.serial, got.pid or 0)
            self.client_acked.discard(key)
        self.arrived()

    def acked_by_client(self, conn: Conn, mid: int, pid: int) -> Got | None:
        self.client_acked.add((conn.name, conn.incarnation, mid))
        for got in reversed(self.received_list):
            if got.name == conn.name and got.serial == conn.serial and got.pid == pid:
                got.acked = True
                return got
        return None

    # --- the steps --------------------------------------------------------------------

    def choose(self) -> Action:
        """The next step, drawn from the seed."""
        rng = self.rng
        names = list(IDENTITIES)
        online = [n for n in names if self.idents[n].connected]
        offline = [n for n in names if not self.idents[n].connected]
        kind = rng.choices(ACTIONS, WEIGHTS)[0]
        if kind == "connect" or not online:
            if not offline:
                kind = "publish"
            else:
                name = rng.choice(offline)
                clean = not IDENTITIES[name].persistent or rng.random() < 0.15
                return ("connect", (name, clean))
        name = rng.choice(online)
        if kind in ("disconnect", "drop", "hold", "release", "publish-drop"):
            if kind == "publish-drop":
                return (kind, (name, rng.choice(TOPICS), rng.choice([0, 1, 1])))
            return (kind, (name,))
        if kind == "takeover":
            clean = not IDENTITIES[name].persistent or rng.random() < 0.15
            return (kind, (name, clean))
        if kind == "subscribe":
            v5 = IDENTITIES[name].v5
            no_local = v5 and rng.random() < 0.2
            rh = rng.choice([0, 0, 1, 2]) if v5 else 0
            return (kind, (name, rng.choice(FILTERS), rng.choice([0, 1, 1]), no_local, rh))
        if kind == "unsubscribe":
            subs = sorted(self.idents[name].subs)
            return (kind, (name, rng.choice(subs) if subs and rng.random() < 0.9 else "t/b/x"))
        if kind == "burst":
            count = rng.randint(2, 6)
            return (
                kind,
                (name, tuple((rng.choice(TOPICS), rng.choice([0, 1, 1])) for _ in range(count))),
            )
        if kind in ("restart", "settle"):
            return (kind, ())
        retain = rng.random() < 0.3
        empty = retain and rng.random() < 0.3
        return ("publish", (name, rng.choice(TOPICS), rng.choice([0, 1, 1]), retain, empty))

    def _applies(self, kind: str, args: tuple[Any, ...]) -> bool:
        if kind in ("restart", "settle"):
            return True
        ident = self.idents[args[0]]
        if kind == "connect":
            return not ident.connected
        return ident.connected

    async def do(self, action: Action) -> None:
        """Take one step (one that does not apply now, when replayed, does nothing)."""
        kind, args = action
        self.step = len(self.steps)
        if not self._applies(kind, args):
            self.steps.append(f"({kind} {args} does not apply)")
            return
        try:
            await self._act(kind, args)
        except (Ended, TimeoutError) as exc:
            why = str(exc) or "no answer in time"
            self.steps[-1] += f" -- {why}"
            self.fail("closed", f"{why} in {kind} {args}")
            if kind not in ("restart", "settle"):
                ident = self.idents[args[0]]
                if ident.conn is not None:
                    await self.lost(ident, ident.conn, polite=False)

    async def _act(self, kind: str, args: tuple[Any, ...]) -> None:
        if kind == "connect":
            self.steps.append(f"connect {args[0]}" + (" clean" if args[1] else ""))
            await self.connect(self.idents[args[0]], clean=args[1])
        elif kind == "takeover":
            self.steps.append(f"takeover {args[0]}" + (" clean" if args[1] else ""))
            await self.connect(self.idents[args[0]], clean=args[1])
        elif kind in ("disconnect", "drop"):
            self.steps.append(f"{kind} {args[0]}")
            ident = self.idents[args[0]]
            assert ident.conn is not None
            await self.lost(ident, ident.conn, polite=kind == "disconnect")
        elif kind == "subscribe":
            name, mqtt_filter, qos, no_local, rh = args
            self.steps.append(
                f"subscribe {name} {mqtt_filter} q{qos}"
                + (" no-local" if no_local else "")
                + (f" rh{rh}" if rh else "")
            )
            await self.subscribe(self.idents[name], mqtt_filter, qos, no_local, rh)
        elif kind == "unsubscribe":
            self.steps.append(f"unsubscribe {args[0]} {args[1]}")
            await self.unsubscribe(self.idents[args[0]], args[1])
        elif kind == "publish":
            name, topic, qos, retain, empty = args
            await self.publish(self.idents[name], [(topic, qos, retain, empty)])
        elif kind == "burst":
            name, items = args
            await self.publish(self.idents[name], [(t, q, False, False) for t, q in items])
        elif kind == "publish-drop":
            await self.publish_drop(self.idents[args[0]], args[1], args[2])
        elif kind == "hold":
            self.steps.append(f"hold {args[0]}")
            conn = self.idents[args[0]].conn
            assert conn is not None
            conn.hold = True
        elif kind == "release":
            conn = self.idents[args[0]].conn
            assert conn is not None
            self.steps.append(f"release {args[0]} ({len(conn.held)} PUBACKs)")
            await conn.release()
        elif kind == "restart":
            self.steps.append("restart the node")
            await self.restart()
        elif kind == "settle":
            self.steps.append("settle")
            if not await self.wait_arrivals(lambda: not self.unsettled(), DUE):
                late = [
                    f"{name} m{mid}" + (" at QoS 1" if q1 else "")
                    for name, mid, q1 in self.missing()
                ]
                self.fail("stalled", f"due to connected clients {DUE} s on, not there: {late}")
        else:
            raise AssertionError(kind)

    async def connect(self, ident: Ident, *, clean: bool) -> None:
        assert self.listener is not None
        self.serial += 1
        old = ident.conn
        if old is not None:
            old.expected_close = True  # taken over
            self.ended(old, "one", "taken over")
            if not ident.durable:
                # A session that lasts as long as its network connection (MQTT 3.1.1
                # clean session 1, MQTT 5 expiry 0) ends with it: the new connection
                # finds none (MQTT-3.1.2-6; MQTT 5 3.1.2.11.2).
                ident.session = False
                ident.subs = {}
        conn = Conn(self, ident.name, self.serial)
        conn.clean = clean
        self.conns.append(conn)
        try:
            connack = await conn.open(self.listener.port)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conn.close(polite=False)
            raise
        if connack.codes != [0]:
            await conn.close(polite=False)
            return
        self.steps[-1] += f" (#{conn.serial}, present {connack.present})"
        if old is not None:
            with anyio.fail_after(WAIT):
                while not old.closed:  # the node closes it as the new one logs in
                    await anyio.sleep(0.005)
            await old.close(polite=False)

    def on_connack(self, conn: Conn, connack: In) -> None:
        """What the node should know of ``conn``'s session, and what it says."""
        ident = self.idents[conn.name]
        if connack.codes != [0]:
            self.fail("connect", f"{conn!r} refused: {connack.codes}")
            return
        clean = conn.clean
        expected = ident.session and not clean
        if connack.present != expected:
            self.fail(
                "session present",
                f"{conn!r}: CONNACK says session present {connack.present}, expected {expected}",
            )
        if clean or not ident.session or not connack.present:
            ident.incarnation += 1
            ident.subs = {}
        ident.session = True
        ident.durable = ident.kind.persistent and (ident.kind.v5 or not clean)
        conn.incarnation = ident.incarnation
        ident.conn = conn
        self.wills[conn.serial] = (conn.name, "open", "still open")

    async def lost(self, ident: Ident, conn: Conn, *, polite: bool) -> None:
        """The connection ends (DISCONNECT or not); wait until the node is done with it."""
        await conn.close(polite=polite)
        self.ended(conn, "none" if polite else "one", "by DISCONNECT" if polite else "by a drop")
        if polite:  # the node read every PUBACK sent before the DISCONNECT
            self.polite[conn.serial] = self.step
        ident.conn = None
        if not ident.durable:
            ident.session = False
            ident.subs = {}
        await self.gone(ident.name)

    async def gone(self, name: str) -> None:
        listener = self.listener
        assert listener is not None
        with anyio.fail_after(WAIT):
            while any(c.client_id == name for c in listener.connections):
                await anyio.sleep(0.005)

    async def subscribe(
        self, ident: Ident, mqtt_filter: str, qos: int, no_local: bool, rh: int
    ) -> None:
        conn = ident.conn
        assert conn is not None
        existed = mqtt_filter in ident.subs
        send = rh == 0 or (rh == 1 and not existed)
        expected = (
            {t: m for t, m in self.retained.items() if matches(mqtt_filter, t)} if send else {}
        )
        optional = {
            m for m in expected.values() if no_local and self.msgs[m].publisher == ident.name
        }
        window = Window(self.step, ident.name, conn.serial, mqtt_filter, qos, expected, optional)
        window.incarnation = ident.incarnation
        window.durable = ident.durable
        self.windows.append(window)
        conn.window = len(self.windows) - 1
        pid = conn.pid()
        await conn.send(conn.subscribe_bytes(pid, mqtt_filter, qos, no_local, rh))
        suback = await conn.until(lambda: conn._first("suback", pid), "SUBACK")
        await conn.ping()  # the retained values come before it
        conn.window = None
        conn.got.remove(suback)
        if suback.codes != [qos]:
            self.fail("subscribe", f"{conn!r} {mqtt_filter} q{qos}: SUBACK {suback.codes}")
            window.expected, window.optional = {}, set()
            return
        old = ident.subs.get(mqtt_filter)
        if old is not None and old.qos == qos:
            token = old.token  # replaced, its flow of messages not interrupted
        else:
            self.tokens += 1
            token = self.tokens
        ident.subs[mqtt_filter] = Sub(qos, no_local, token)

    async def unsubscribe(self, ident: Ident, mqtt_filter: str) -> None:
        conn = ident.conn
        assert conn is not None
        pid = conn.pid()
        await conn.send(conn.unsubscribe_bytes(pid, mqtt_filter))
        unsuback = await conn.until(lambda: conn._first("unsuback", pid), "UNSUBACK")
        conn.got.remove(unsuback)
        had = ident.subs.pop(mqtt_filter, None)
        if conn.v5 and unsuback.codes != [0 if had else 0x11]:
            self.fail("unsubscribe", f"{conn!r} {mqtt_filter}: UNSUBACK {unsuback.codes}")

    def new_message(self, name: str, topic: str, qos: int, retain: bool, empty: bool) -> Msg:
        mid = len(self.msgs) + 1
        msg = Msg(mid, name, topic, qos, retain, b"" if empty else b"m%d" % mid, "sent", self.step)
        self.msgs[mid] = msg
        return msg

    async def publish(self, ident: Ident, items: list[tuple[str, int, bool, bool]]) -> None:
        """Publish in one write, wait for the PUBACKs (and a PINGRESP), then note what
        each message may and must reach, in order."""
        conn = ident.conn
        assert conn is not None
        sent: list[tuple[Msg, int | None]] = []
        data = b""
        for topic, qos, retain, empty in items:
            msg = self.new_message(ident.name, topic, qos, retain, empty)
            pid = conn.pid() if qos else None
            sent.append((msg, pid))
            data += conn.publish_bytes(pid, topic, msg.payload, qos, retain)
        label = ", ".join(
            f"m{m.mid} q{m.qos} {m.topic}"
            + (" retain" if m.retain else "")
            + (" empty" if not m.payload else "")
            for m, _ in sent
        )
        self.steps.append(f"{'publish' if len(sent) == 1 else 'burst'} {ident.name} {label}")
        await conn.send(data)
        for msg, pid in sent:
            if pid is not None:
                ack = await conn.until(lambda pid=pid: conn._first("puback", pid), "PUBACK")
                conn.got.remove(ack)
                msg.status = "acked" if ack.codes[0] < 0x80 else "refused"
                if msg.status == "refused":
                    self.fail("refused", f"m{msg.mid} refused: {ack.codes}")
        await conn.ping()
        for msg, _ in sent:
            if msg.status == "sent":
                msg.status = "acked"  # QoS 0: the node has acted on it
            if msg.status == "acked":
                self.published(msg)

    async def publish_drop(self, ident: Ident, topic: str, qos: int) -> None:
        """Publish and close the socket at once (a QoS 1 one: before its PUBACK)."""
        conn = ident.conn
        assert conn is not None
        msg = self.new_message(ident.name, topic, qos, False, False)
        msg.status = "unknown"
        self.steps.append(f"publish-drop {ident.name} m{msg.mid} q{qos} {topic}")
        self.published(msg)
        pid = conn.pid() if qos else None
        await conn.send(conn.publish_bytes(pid, topic, msg.payload, qos, False))
        await self.lost(ident, conn, polite=False)

    def published(self, msg: Msg) -> None:
        """What each session may get of ``msg``, by its subscriptions now."""
        if msg.retain:
            if msg.payload:
                self.retained[msg.topic] = msg.mid
            else:
                self.retained.pop(msg.topic, None)
        for ident in self.idents.values():
            if not ident.session:
                continue
            own = ident.name == msg.publisher
            matching = [s for f, s in ident.subs.items() if matches(f, msg.topic)]
            eligible = [s for s in matching if not (own and s.no_local)]
            if not matching:
                continue
            q1_tokens = frozenset(s.token for s in eligible if s.qos == 1)
            direct = ident.connected and any(s.qos == 0 for s in eligible)
            queued0 = msg.qos == 0 and bool(q1_tokens)
            self.expects[ident.name, msg.mid] = Expect(
                ident.incarnation,
                ident.conn.serial if ident.conn is not None else None,
                msg.qos == 1 and bool(q1_tokens),
                int(direct) + int(queued0),
                q1_tokens,
                frozenset(s.token for s in eligible),
                len(eligible) < len(matching),
            )

    async def restart(self) -> None:
        for ident in self.idents.values():
            if ident.conn is not None:
                ident.conn.expected_close = True
                # The node keeps the will with a session that outlives the stop.
                how = "by a restart" if ident.durable else "with its session, at a restart"
                self.ended(ident.conn, "one" if ident.durable else "maybe", how)
                ident.conn = None
            if not ident.durable:
                ident.session = False
                ident.subs = {}
            # A durable session outlives the restart: the node keeps it in its data
            # directory, with its queue.
        await self.stop_node()
        for conn in self.conns:  # the node closed them: our ends too
            await conn.close(polite=False)
        await self.start_node()
        self.restarts += 1

    # --- the end ----------------------------------------------------------------------

    def must(self) -> list[tuple[str, int, bool]]:
        """(client id, message, whether at QoS 1) of what must have arrived by now."""
        due = []
        for (name, mid), expect in self.expects.items():
            msg, ident = self.msgs[mid], self.idents[name]
            if msg.status != "acked" or not msg.payload or not ident.session:
                continue
            if ident.incarnation != expect.incarnation or ident.conn is None:
                continue
            live = {s.token for s in ident.subs.values()}
            if expect.q1 and expect.q1_tokens & live:
                due.append((name, mid, True))
            elif expect.serial == ident.conn.serial and expect.tokens & live:
                due.append((name, mid, False))
        return due

    def late_window(self, got: Got, before: Window | None = None) -> Window | None:
        """The QoS 1 subscribe step of ``got``'s session, before it (and ``before``),
        that was due the retained value ``got`` is and has not had it yet, if any (the
        latest)."""
        for window in reversed(self.windows):
            if window.step > got.step or window.name != got.name:
                continue
            if before is not None and window.step >= before.step:
                continue
            if window.incarnation != got.incarnation or window.qos != 1:
                continue
            if got.dup and window.serial == got.serial:
                # A copy with DUP was handed out before, on an earlier connection (the
                # connection may have ended before it was written): not this one's.
                continue
            if got.mid in window.expected.values() and got.mid not in {g.mid for g in window.got}:
                return window
        return None

    def missing(self) -> list[tuple[str, int, bool]]:
        have: set[tuple[str, int, int]] = set()
        for got in self.received_list:
            if got.mid is not None and not got.retain:
                have.add((got.name, got.incarnation, got.mid))
                if got.qos == 1:
                    have.add((got.name, -got.incarnation, got.mid))
        out = []
        for name, mid, q1 in self.must():
            inc = self.idents[name].incarnation
            if (name, -inc if q1 else inc, mid) not in have:
                out.append((name, mid, q1))
        return out

    def unsettled(self) -> bool:
        """Whether something due to a connected client has yet to come (to one holding
        its PUBACKs, only what its receive maximum lets through)."""
        due: dict[str, list[bool]] = defaultdict(list)
        for name, _, q1 in self.missing():
            due[name].append(q1)
        for name, flags in due.items():
            conn = self.idents[name].conn
            if conn is None or conn.closed:
                continue
            if not conn.hold:
                return True
            limit = conn.kind.receive_max if conn.v5 else MAX_INFLIGHT
            if any(flags) and len(conn.unacked) < limit:
                return True
        return False

    async def finish(self) -> None:
        """Release every held PUBACK, bring every persistent client back, wait for what
        must arrive, then for markers sent after everything (so nothing more is on its
        way), and read the retained values with a new client."""
        self.step = len(self.steps)
        self.steps.append("the end: release, reconnect, drain")
        for ident in self.idents.values():
            if ident.conn is not None and ident.conn.closed:  # and no step noticed
                self.fail("closed", f"the node closed {ident.conn!r}")
                await self.lost(ident, ident.conn, polite=False)
            if ident.conn is not None:
                await ident.conn.release()
        for name, ident in self.idents.items():
            if ident.conn is None and ident.kind.persistent:
                self.steps.append(f"connect {name}")
                await self.connect(ident, clean=False)
        await self.wait_arrivals(lambda: not self.missing(), DUE)  # check() tells what not
        assert self.node is not None
        marker: Session = self.node.connect(client_name="marker")
        online = [i for i in self.idents.values() if i.conn is not None]
        for ident in online:
            self.steps.append(f"markers for {ident.name}")
            await self.subscribe(ident, MARK_Q + ident.name, 1, False, 0)
            await self.subscribe(ident, MARK_D + ident.name, 0, False, 0)
            await marker.send(MARK_Q + ident.name, b"zq")
            marker.publish(MARK_D + ident.name, b"zd")

        def marked() -> bool:
            return all(i.conn is None or i.conn.markers == {b"zq", b"zd"} for i in online)

        if not await self.wait_arrivals(marked):
            late = [i.name for i in online if i.conn is not None and len(i.conn.markers) < 2]
            self.fail("markers", f"the end's markers did not reach {late}")
        self.step = len(self.steps)
        self.steps.append("read the wills")
        await self.read_wills()
        self.step = len(self.steps)
        self.steps.append("audit the retained values")
        audit = self.idents[AUDIT] = Ident(AUDIT, Kind(v5=True, persistent=False))
        await self.connect(audit, clean=True)
        for mqtt_filter in ("t/#", "u/#"):
            await self.subscribe(audit, mqtt_filter, 1, False, 0)

    async def read_wills(self) -> None:
        """What the wills queue holds, once every will that is due has come (or
        :data:`DUE` s on): ``check`` says what is missing."""
        assert self.node is not None
        queue = self.node.guaranteed.queue(WILL_QUEUE)
        due = sum(1 for _, what, _ in self.wills.values() if what == "one")
        reader = self.node.connect(client_name="wills-reader")
        async with await reader.bind(WILL_QUEUE, window=max(due, 1)) as flow:
            with anyio.move_on_after(DUE):  # each as it comes; none is acknowledged
                for _ in range(due):
                    await flow.receive()
        reader.close()
        store = self.node.guaranteed.store  # all it holds, any beyond those due too
        after = 0
        while page := await store.read(queue.endpoint, after):
            self.wills_got += [entry.message.payload for entry in page]
            after = page[-1].message.id


async def run_chaos(
    data_dir: Path, seed: int, steps: int = STEPS, script: list[Action] | None = None
) -> Chaos:
    """Run ``steps`` steps drawn from ``seed`` (or the steps of ``script``), then the end."""
    chaos = Chaos(data_dir, seed)
    async with anyio.create_task_group() as tg:
        chaos.tg = tg
        await chaos.start_node()
        try:
            for i in range(steps if script is None else len(script)):
                action = chaos.choose() if script is None else script[i]
                chaos.actions.append(action)
                await chaos.do(action)
            await chaos.finish()
        finally:
            for ident in chaos.idents.values():
                if ident.conn is not None:
                    ident.conn.expected_close = True
            await chaos.stop_node()  # (a node's scopes nest: not under a shield here)
            for conn in chaos.conns:
                await conn.close(polite=False)
            tg.cancel_scope.cancel()
    return chaos
