"""Guaranteed messages survive kill -9 (SPEC 4), tested on two levels.

**Node** (the acceptance test of issue 4): a child process (``crash_child.py``) runs a
Node with a ``data_dir``; two publishers send sequence-numbered messages (``send_many``
and ``send``) to a queue while a consumer receives and acks them, logging every step.
The parent kills it with SIGKILL at a random moment, restarts it on the same data
directory (recovery after recovery), over and over, then drains the queue with a clean
run, and checks the whole history: see :func:`check_history`.

**Store**: a child process (``_crash_child.py``) puts from several tasks, marks and acks
from another, and logs each call right after it returned. The parent kills it with
SIGKILL at a random moment, reopens the file and checks it against the log, then does
it again on the same file.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._store import SpoolEntry

from ._crash_child import payload_for

NODE_CHILD = Path(__file__).with_name("crash_child.py")
NODE_TRIALS = 24
SINGLE_TRIALS = 12
STORE_CHILD = Path(__file__).with_name("_crash_child.py")
STORE_TRIALS = 32
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="no SIGKILL on Windows"),
]

# --- node: publish, consume, ack, kill -9, restart ------------------------------------

Line = tuple[str, int, int]  # kind, seq (or first seq), last seq or redelivered flag


def parse_node_log(text: str) -> list[Line]:
    """The child's lines, up to a torn last one (the kill can cut a write short)."""
    lines: list[Line] = []
    for raw in text.splitlines(keepends=True):
        if not raw.endswith("\n"):
            break
        kind, *fields = raw.split(maxsplit=2)
        if kind in ("SEND", "GOT"):
            lines.append((kind, int(fields[0]), int(fields[1])))
        elif kind in ("PUB", "ACK"):
            lines.append((kind, int(fields[0]), 0))
        elif kind == "BAD":
            raise AssertionError(f"the child received a mangled message: {raw.strip()}")
        elif kind not in ("READY", "LEFT", "CHECK", "DONE"):
            raise AssertionError(f"unexpected line from the child: {raw!r}")
    return lines


class History:
    """What the checks found, for the test to judge whether it tested anything."""

    def __init__(self) -> None:
        self.attempted: set[int] = set()  # seqs some publisher called send/send_many for
        self.published: set[int] = set()  # seqs whose publisher ack returned
        self.receipts: dict[int, int] = {}  # seq -> times received
        self.acked: set[int] = set()  # seqs whose flow.ack() returned at least once
        self.redelivered = 0  # receipts flagged redelivered


def check_history(runs: Sequence[Sequence[Line]]) -> History:
    """Check the logs of every run, in order, as one history. Per SPEC 4:

    * nothing is received that was never published: every received seq was sent
      (``SEND``; a message the kill caught between its commit and the publisher's ack
      may arrive although it has no ``PUB``);
    * a seq received again (in the same run or a later one) is flagged redelivered on
      every receipt after its first (the first may be flagged too: the kill may come
      between its delivery being recorded and the child's ``GOT``);
    * per-queue order, per publisher: the *first* receipts of a publisher's seqs come in
      increasing seq order; only redeliveries may repeat an earlier seq;
    * a seq is acked only after it was received;
    * nothing acked by the bus is lost: every ``PUB`` seq is received at some point
      (the caller makes the last runs drain the queue).

    When the bus commits a consumer's ack is its own business (SPEC 4 says nothing of
    it): an acked message the kill caught before that may come back, flagged.
    """
    history = History()
    first_of = {0: -1, 1: -1}  # per publisher: the last seq received for the first time
    for run, lines in enumerate(runs):
        for number, (kind, seq, value) in enumerate(lines):
            where = f"run {run} line {number + 1} ({kind} {seq})"
            if kind == "SEND":
                history.attempted.update(range(seq, value + 1, 2))
            elif kind == "PUB":
                assert seq in history.attempted, f"{where}: acked but never sent"
                history.published.add(seq)
            elif kind == "GOT":
                assert seq in history.attempted, f"{where}: received but never published"
                count = history.receipts.get(seq, 0)
                if count:
                    assert value == 1, f"{where}: received {count + 1} times, not redelivered"
                else:
                    publisher = seq % 2
                    last = first_of[publisher]
                    assert seq > last, f"{where}: first received after {last} (out of order)"
                    first_of[publisher] = seq
                history.receipts[seq] = count + 1
                history.redelivered += value
            elif kind == "ACK":
                assert seq in history.receipts, f"{where}: acked before it was received"
                history.acked.add(seq)
    lost = sorted(history.published - history.receipts.keys())
    assert not lost, f"publisher-acked messages never received: {lost[:10]} (of {len(lost)})"
    return history


def start_node_child(data_dir: Path, log: Path, trial: int, *mode: str) -> subprocess.Popen[bytes]:
    backend = ("asyncio", "trio")[trial % 2]
    command = [sys.executable, str(NODE_CHILD), str(data_dir), backend, str(trial), *mode]
    with log.open("wb") as out:  # the child has its own descriptor: a pipe could fill up
        return subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE
        )


def kill_node_child(data_dir: Path, log: Path, trial: int, rng: random.Random, *mode: str) -> bool:
    """Run a child and SIGKILL it at a random moment; return whether it got READY first."""
    with start_node_child(data_dir, log, trial, *mode) as child:
        if trial % 4 == 3:
            time.sleep(rng.uniform(0.0, 0.3))  # anywhere, also while it recovers the spool
        else:
            deadline = time.monotonic() + 10
            while not log.read_bytes().startswith(b"READY\n") and child.poll() is None:
                assert time.monotonic() < deadline, "the child never got ready"
                time.sleep(0.002)
            time.sleep(rng.uniform(0.005, 0.4))
        child.send_signal(signal.SIGKILL)
        _, errors = child.communicate()
        assert child.returncode == -signal.SIGKILL, errors.decode()
    return log.read_bytes().startswith(b"READY\n")


def drain_node_child(data_dir: Path, log: Path, trial: int) -> str:
    with start_node_child(data_dir, log, trial, "drain") as child:
        _, errors = child.communicate(timeout=30)
        assert child.returncode == 0, errors.decode()
    text = log.read_text()
    assert text.endswith("LEFT 0\nCHECK ok\nDONE\n"), text[-300:]
    return text


def kill_trials(tmp_path: Path, trials: int, *mode: str) -> tuple[History, int]:
    """``trials`` children killed with SIGKILL one after the other on one data directory,
    then a clean one that drains the queue; the checked history, and how many of the
    killed children got ready first."""
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    data_dir = tmp_path / "node"
    runs: list[list[Line]] = []
    ready = 0
    for trial in range(trials):
        log = tmp_path / f"node{trial}.log"
        ready += kill_node_child(data_dir, log, trial, rng, *mode)
        runs.append(parse_node_log(log.read_text()))
    # a clean run takes what is left; a second one finds nothing (its acks were kept)
    runs.append(parse_node_log(drain_node_child(data_dir, tmp_path / "drain.log", trials)))
    again = parse_node_log(drain_node_child(data_dir, tmp_path / "again.log", trials + 1))
    assert not again, f"the queue was drained and acked, yet: {again[:5]}"
    try:
        history = check_history(runs)
    except AssertionError as exc:
        raise AssertionError(f"seed {seed}: {exc}") from exc
    unacked = sorted(history.receipts.keys() - history.acked)
    # the queue ended empty, so a message never acked was dropped instead of redelivered
    assert not unacked, f"received, never acked, yet gone from the queue: {unacked[:10]}"
    return history, ready


def test_node_keeps_every_acked_message_through_kill_9(tmp_path: Path) -> None:
    history, ready = kill_trials(tmp_path, NODE_TRIALS)
    # it tested something: many kills in full flow, messages in flight at the kills
    assert ready >= NODE_TRIALS // 2
    assert len(history.published) > 20 * NODE_TRIALS, len(history.published)
    assert history.redelivered > 0, "no message was ever in flight at a kill"


def test_one_message_in_flight_keeps_its_guarantees_through_kill_9(tmp_path: Path) -> None:
    # One message in flight is the path where the put writes the delivery mark (one
    # fsync per message): a message handed out before the kill must still come back
    # flagged redelivered, and none acked by the bus may be lost.
    history, ready = kill_trials(tmp_path, SINGLE_TRIALS, "single")
    assert ready >= SINGLE_TRIALS // 2
    assert len(history.published) > 5 * SINGLE_TRIALS, len(history.published)
    assert history.redelivered > 0, "no message was ever in flight at a kill"


def test_history_check_catches_violations() -> None:
    ok = [
        [("SEND", 0, 4), ("PUB", 0, 0), ("SEND", 1, 1), ("GOT", 0, 0), ("GOT", 1, 0)],
        [("GOT", 0, 1), ("ACK", 0, 0), ("GOT", 1, 1), ("ACK", 1, 0), ("GOT", 2, 1)],
        [("GOT", 2, 1), ("GOT", 4, 0)],
    ]
    history = check_history(ok)
    assert (history.published, history.redelivered) == ({0}, 4)
    bad = {
        "never published": [[("SEND", 0, 0), ("GOT", 2, 0)]],
        "not redelivered": [[("SEND", 0, 0), ("GOT", 0, 0)], [("GOT", 0, 0)]],
        "out of order": [[("SEND", 0, 4), ("GOT", 2, 0), ("GOT", 0, 0)]],
        "acked before it was received": [[("SEND", 0, 0), ("ACK", 0, 0)]],
        "never received": [[("SEND", 0, 2), ("PUB", 0, 0), ("PUB", 2, 0), ("GOT", 2, 0)]],
    }
    for why, runs in bad.items():
        with pytest.raises(AssertionError, match=why):
            check_history(runs)


def test_node_log_ignores_a_torn_last_line() -> None:
    assert parse_node_log("READY\nSEND 0 4\nPUB 0\nGOT 0 1\nACK 0\nPUB 2") == [
        ("SEND", 0, 4),
        ("PUB", 0, 0),
        ("GOT", 0, 1),
        ("ACK", 0, 0),
    ]


# --- store: put, mark, ack, kill -9, reopen and compare --------------------------------


class Log:
    """What the child reported before it died (a torn last line is ignored)."""

    def __init__(self, text: str) -> None:
        self.ready = False
        self.puts: dict[int, tuple[int, int, bool]] = {}  # id -> task, seq, persistent
        self.marked: set[int] = set()
        self.acked: set[int] = set()
        for line in text.splitlines(keepends=True):
            if not line.endswith("\n"):
                break
            kind, *fields = line.split()
            if kind == "ready":
                self.ready = True
            elif kind == "P":
                message_id, task, seq, persistent = map(int, fields)
                self.puts[message_id] = (task, seq, bool(persistent))
            elif kind == "M":
                self.marked.update(map(int, fields))
            elif kind == "A":
                self.acked.update(map(int, fields))


def run_child(path: Path, log_path: Path, backend: str, trial: int, rng: random.Random) -> Log:
    command = [sys.executable, str(STORE_CHILD), str(path), str(log_path), backend, str(trial)]
    with subprocess.Popen(command, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE) as child:
        if trial % 6 == 5:
            time.sleep(rng.uniform(0.0, 0.15))  # anywhere, also while it opens the file
        else:
            deadline = time.monotonic() + 10
            while "ready" not in log_path.read_text() and child.poll() is None:
                assert time.monotonic() < deadline, "child never got ready"
                time.sleep(0.002)
            time.sleep(rng.uniform(0.01, 0.3))
        child.send_signal(signal.SIGKILL)
        _, errors = child.communicate()
        assert child.returncode == -signal.SIGKILL, errors.decode()
    return Log(log_path.read_text())


async def read_endpoint(store: SqliteStore, endpoint: str) -> dict[int, SpoolEntry]:
    entries: dict[int, SpoolEntry] = {}
    after = 0
    while page := await store.read(endpoint, after, 500):
        entries.update((entry.message.id, entry) for entry in page)
        after = page[-1].message.id
    return entries


async def verify(path: Path, log: Log, trial: int, floor: int) -> int:
    """Check the reopened file against the log; empty it for the next trial.

    Returns the highest id seen (the next trial's ids must be above it).
    """
    async with SqliteStore(path) as store:
        await store.check()  # integrity, refcounts, figures, every header decodes
        q1 = await read_endpoint(store, "q1")
        q2 = await read_endpoint(store, "q2")
        # every acknowledged put is there, byte for byte
        missing = sorted(set(log.puts) - set(q1))
        assert not missing, f"acked puts lost: {missing[:10]} (of {len(log.puts)})"
        for message_id, entry in q1.items():
            message = entry.message
            assert message_id > floor, "an id was reused across a restart"
            headers = message.headers
            assert headers["trial"] == trial
            task, seq = headers["task"], headers["seq"]
            assert message.topic == f"crash/{task}"
            assert message.payload == payload_for(trial, task, seq), f"message {message_id}"
            assert message.persistent == (seq % 10 != 9)
            if message_id in log.puts:
                assert log.puts[message_id] == (task, seq, message.persistent)
        # acks and delivery marks that returned are there too
        assert not log.acked & set(q2), "an acked message came back"
        assert set(q2) <= set(q1)
        undelivered = [i for i in log.marked if q1[i].delivery_count < 1]
        assert not undelivered, f"delivery marks lost: {undelivered[:10]}"
        assert store.stats("q1").messages == len(q1)
        assert store.stats("q2").messages == len(q2)
        top = max(q1, default=floor)
        await store.drop_endpoint("q1")
        await store.drop_endpoint("q2")
        await store.check()
    return top


def test_every_acknowledged_call_survives_kill_9(tmp_path: Path) -> None:
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    path = tmp_path / "spool.db"
    floor = 0
    checked_puts = 0
    for trial in range(STORE_TRIALS):
        backend = ("asyncio", "trio")[trial % 2]
        log_path = tmp_path / f"log{trial}.txt"
        log_path.touch()
        log = run_child(path, log_path, backend, trial, rng)
        try:
            floor = anyio.run(verify, path, log, trial, floor)
        except AssertionError as exc:
            raise AssertionError(f"trial {trial} ({backend}, seed {seed}): {exc}") from exc
        checked_puts += len(log.puts)
    assert checked_puts > 20 * STORE_TRIALS, "the child hardly published: nothing was tested"


def test_crash_log_ignores_a_torn_last_line() -> None:
    log = Log("ready\nP 1 0 0 1\nM 1\nA 1\nP 2 0 1")
    assert (log.ready, log.puts, log.marked, log.acked) == (True, {1: (0, 0, True)}, {1}, {1})
