"""The checks of the MQTT chaos test: :func:`check` tells every problem of a run at
once, with the steps taken (the model and the run are in :mod:`._chaos`)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import TYPE_CHECKING

from ._chaos_clients import Got

if TYPE_CHECKING:
    from ._chaos import Chaos

__all__ = ["check"]


def check(chaos: Chaos, open_kinds: set[str] | frozenset[str] = frozenset()) -> None:
    """Every property the run must have; all failures at once, with the steps. Problems
    of ``open_kinds`` (defects known and not fixed yet) are left out."""
    problems = chaos.problems
    msgs = chaos.msgs

    def fail(kind: str, why: str) -> None:
        problems[kind].append(why)

    # What must have arrived.
    for name, mid, q1 in chaos.missing():
        msg = msgs[mid]
        fail(
            "lost",
            f"{name} never got m{mid} ({msg.topic}, published q{msg.qos} at step {msg.step})"
            + (" at QoS 1" if q1 else ""),
        )

    # Wills: once for each connection that ended without DISCONNECT (by a drop, a
    # takeover, or a restart of the node while its session outlived it), never for
    # one the client ended with DISCONNECT or one still open, never twice.
    wills = Counter(chaos.wills_got)
    for serial, (name, due, how) in sorted(chaos.wills.items()):
        count = wills.pop(b"w%d" % serial, 0)
        if (due == "one" and count != 1) or (due in ("none", "open") and count) or count > 1:
            fail("will", f"{name}#{serial} (ended {how}) had its will published {count} times")
    for payload in wills:
        fail("will", f"a will of no connection was published: {payload!r}")

    # Retained values a new subscription gets. A QoS 1 subscription's come through the
    # session's queue: behind what the queue held already, one may come after the
    # SUBSCRIBE's PINGRESP, during a later subscription, or on a later connection of
    # the session; and one sent but not acknowledged comes again on a later connection,
    # with DUP (MQTT-4.4.0-1). Each goes back to the subscription it was for.
    # 1. Copies sent again: DUP, each for a copy of the same value to the same session
    #    on an earlier connection, under the same packet id (a resend keeps it:
    #    MQTT-4.4.0-1), that may not have been settled: not acknowledged, or
    #    acknowledged where the node may not have read the PUBACK (no PINGRESP or
    #    DISCONNECT after it on its connection). A DUP copy with no such copy is a
    #    first copy whose earlier sending the client never read (it went with its
    #    connection), or that the queue flags redelivered for having handed it out.
    unsettled: dict[tuple[str, int, int | None], list[tuple[int, int | None]]] = defaultdict(list)
    for got in chaos.received_list:
        if not (got.retain and got.qos == 1):
            continue
        key = (got.name, got.incarnation, got.mid)
        earlier = [(s, pid) for s, pid in unsettled[key] if s != got.serial and pid == got.pid]
        if got.dup and earlier:
            unsettled[key].remove(earlier[0])
            if got.window is not None and got in chaos.windows[got.window].got:
                chaos.windows[got.window].got.remove(got)
            got.resent = True
        if not settled(chaos, got):  # may come again
            unsettled[key].append((got.serial, got.pid))
    # A first copy with DUP was handed out on an earlier connection, which ended before
    # it was written (or read): it is not for the subscription going on as it came.
    for got in chaos.received_list:
        if got.retain and got.dup and not got.resent and got.window is not None:
            window = chaos.windows[got.window]
            if window.serial == got.serial and got in window.got:
                window.got.remove(got)
                got.window = None
    # 2. First copies that came when no subscription was going on.
    for got in chaos.received_list:
        if got.retain and got.window is None and got.qos == 1 and not got.resent:
            late = chaos.late_window(got)
            if late is not None:
                late.got.append(got)
                got.window = chaos.windows.index(late)
    # 3. First copies that came during a later subscription than theirs.
    for window in chaos.windows:
        mids = [g.mid for g in window.got]
        due = set(window.expected.values())
        for got in list(window.got):
            if got.qos == 1 and (mids.count(got.mid) > 1 or got.mid not in due):
                earlier = chaos.late_window(got, before=window)
                if earlier is not None:
                    window.got.remove(got)
                    earlier.got.append(got)
                    mids.remove(got.mid)
    # Every copy: allowed, at the right QoS, with the right flags, not too often.
    copies: dict[tuple[str, int], list[Got]] = defaultdict(list)
    retained_q1: set[tuple[str, int, int | None]] = set()  # at QoS 1 on a subscribe
    for got in chaos.received_list:
        where = f"{got.name}#{got.serial} (step {got.step})"
        if got.retain:
            key = (got.name, got.incarnation, got.mid)
            if got.window is not None:
                if got.qos == 1:
                    retained_q1.add(key)
            elif not (got.qos == 1 and got.dup and key in retained_q1):
                # Only a retained value sent at QoS 1 and not acknowledged comes again
                # so, on a later connection of the session (MQTT-4.4.0-1).
                fail("retain flag", f"{where} got {got.payload!r} on {got.topic} flagged retain")
            continue
        if got.qos == 0 and got.dup:
            fail("dup", f"{where} got {got.payload!r} at QoS 0 with DUP")
        if got.mid is None:
            continue
        copies[got.name, got.mid].append(got)
    for (name, mid), gots in copies.items():
        msg = msgs[mid]
        what = f"m{mid} ({msg.publisher} q{msg.qos} {msg.topic}, step {msg.step})"
        expect = chaos.expects.get((name, mid))
        if msg.status == "refused":
            fail("refused", f"{name} got {what}, refused to its publisher")
            continue
        if expect is None:
            own = " (its own)" if name == msg.publisher else ""
            fail("unexpected", f"{name} got {what}{own}: no subscription of it matched then")
            continue
        other = [g for g in gots if g.incarnation != expect.incarnation]
        if other:
            fail(
                "old session",
                f"{name}#{other[0].serial} (session {other[0].incarnation}, step "
                f"{other[0].step}) got {what}, published in its session {expect.incarnation}",
            )
        q1 = [g for g in gots if g.qos == 1]
        q0 = [g for g in gots if g.qos == 0]
        # MQTT-3.8.3-3: a no-local subscription never forwards the client's own message.
        label = "no-local" if expect.no_local else None
        if q1 and not expect.q1:
            fail(
                label or "qos",
                f"{name} got {what} at QoS 1, only QoS 0 or nothing was due"
                + (" (its own; a no-local subscription matched)" if label else ""),
            )
        if any(not g.dup for g in q1[1:]):
            fail(
                "duplicate",
                f"{name} got {what} {len(q1)} times at QoS 1, DUP "
                f"{[g.dup for g in q1]} on #{[g.serial for g in q1]}",
            )
        if len(q0) > expect.q0:
            fail(
                label or "duplicate",
                f"{name} got {what} {len(q0)} times at QoS 0 (at most {expect.q0}) on "
                f"#{[g.serial for g in q0]}"
                + (" (its own; a no-local subscription matched)" if label else ""),
            )

    # QoS 1: first copies in each publisher's order, per topic (MQTT 4.6).
    firsts: dict[tuple[str, int, str, str], list[int]] = defaultdict(list)
    seen: set[tuple[str, int, int]] = set()
    for got in chaos.received_list:
        if got.mid is None or got.retain or got.qos != 1 or msgs[got.mid].status != "acked":
            continue
        if (got.name, got.incarnation, got.mid) not in seen:
            seen.add((got.name, got.incarnation, got.mid))
            msg = msgs[got.mid]
            firsts[got.name, got.incarnation, msg.publisher, msg.topic].append(got.mid)
    for (name, inc, publisher, topic), mids in firsts.items():
        if mids != sorted(mids):
            fail(
                "order",
                f"{name} (session {inc}) got {publisher}'s QoS 1 messages on {topic} out of "
                f"order: {mids}",
            )

    for window in chaos.windows:
        where = (
            f"step {window.step}: {window.name}#{window.serial} subscribing "
            f"{window.mqtt_filter} q{window.qos}"
        )
        got_mids = [g.mid for g in window.got]
        if None in got_mids:
            fail("retained", f"{where} got a cleared value (an empty payload) flagged retain")
        wanted = set(window.expected.values())
        extra = set(m for m in got_mids if m is not None) - wanted
        short = wanted - set(got_mids) - window.optional
        ident = chaos.idents[window.name]
        if window.qos == 1 and ident.incarnation != window.incarnation:
            # Queued for the session (behind what the queue held), and the session was
            # discarded (a clean start) before the client had them: nothing is due.
            short = set()
        ended = ident.conn is None or ident.conn.serial != window.serial
        if window.qos == 1 and not window.durable and ended:
            # Queued behind what the queue held, for a session that ended with its
            # connection before they came (MQTT 3.1.1 clean session, MQTT 5 expiry 0).
            short = set()
        if extra or short or len(got_mids) != len(set(got_mids)):
            fail(
                "retained",
                f"{where} got retained {sorted(m for m in got_mids if m is not None)}, "
                f"expected {sorted(wanted)}",
            )
        for got in window.got:
            if got.mid is None or got.mid not in wanted:
                continue
            msg = msgs[got.mid]
            due = min(msg.qos, window.qos)
            resent = got.dup and got.serial != window.serial  # on a later connection
            if got.qos != due or (got.dup and not resent) or got.topic != msg.topic:
                fail(
                    "retained qos",
                    f"{where} got retained m{got.mid} (published q{msg.qos}) at QoS {got.qos}"
                    f"{' with DUP' if got.dup else ''}: MQTT says QoS {due}",
                )

    problems = {kind: found for kind, found in problems.items() if kind not in open_kinds}
    if problems:
        lines = []
        for kind, found in sorted(problems.items()):
            lines.append(f"{kind}: {len(found)}")
            lines += [f"  {each}" for each in found[:8]]
        trace = "\n".join(f"{i:4d} {s}" for i, s in enumerate(chaos.steps))
        raise AssertionError("\n".join(lines) + "\n--- steps:\n" + trace)


def settled(chaos: Chaos, got: Got) -> bool:
    """Whether the node surely read the client's PUBACK of ``got``, so will not send it
    again: the node reads a connection's packets in order, and it answered a PINGREQ
    written after the PUBACK, or a DISCONNECT came after it in a later step."""
    if not got.acked:
        return False
    if got.step < chaos.polite.get(got.serial, -1):
        return True
    return got.acked_in is not None and got.acked_in <= chaos.read_upto.get(got.serial, 0)
