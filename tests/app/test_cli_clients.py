"""``meshbus pub`` and ``sub`` against a ``meshbus run`` node, each a process of its own.

Payloads are bytes: what ``pub`` is given (an argument, a file, standard input)
arrives unchanged, and each ``sub`` format shows it without loss. A subscriber that
loses its node must not look like one that finished: without ``--reconnect`` it
exits 1 with one line on standard error; with it, it says on standard error when
the node is lost and when it is back, and goes on printing.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from tests.test_e2e import LISTENING, Process, Setup, Start

KILLS = {"SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
#: Not UTF-8 (the issue's example, and a Latin-1 word), UTF-8, and empty.
PAYLOADS = [b"\x00\xff\xfe", "café".encode("latin-1"), "café ☕\nline 2".encode(), b""]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    return Setup(tmp_path, "tcp")


@pytest.fixture
def start(setup: Setup) -> Iterator[Start]:
    """Start ``meshbus`` processes in the node's folder; each is killed if still running."""
    started: list[Process] = []

    def start(args: list[str]) -> Process:
        started.append(Process(args, setup.folder, setup.env, setup.node))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            process.close()


def command(setup: Setup, *args: str | bytes, stdin: bytes = b"") -> tuple[int, bytes, str]:
    """Run ``python -m meshbus ARGS`` to its end: exit status, stdout bytes, stderr text."""
    done = subprocess.run(
        [sys.executable, "-m", "meshbus", *args],
        cwd=setup.folder,
        env=setup.env,
        input=stdin,
        capture_output=True,
        timeout=15,
        check=False,
    )
    return done.returncode, done.stdout, done.stderr.decode(errors="replace")


def publish_each_way(setup: Setup, topic: str) -> None:
    """Send :data:`PAYLOADS` to ``topic``, guaranteed: as an argument (its bytes as the OS
    passes them), from a file, from standard input with ``-`` and without an argument."""
    for n, payload in enumerate(PAYLOADS):
        options = [*setup.options(), "-g", topic]
        if n == 0:
            path = setup.folder / "payload.bin"
            path.write_bytes(payload)
            args, stdin = [*options, "-f", str(path)], b""
        elif n == 1:
            args, stdin = [*options, payload], b""  # bytes in argv: not UTF-8
        elif n == 2:
            args, stdin = [*options, "-"], payload
        else:
            args, stdin = options, payload
        status, out, err = command(setup, "pub", *args, stdin=stdin)
        assert (status, out, err) == (0, b"", f"published 1 message(s) to {topic}\n"), args


@pytest.mark.slow  # about 4 s: a node, a process per publish, one subscriber
def test_binary_payloads_arrive_unchanged_however_pub_is_given_them(
    setup: Setup, start: Start
) -> None:
    setup.start_node(start)
    publish_each_way(setup, "alarms/raw")
    status, out, err = command(
        setup, "sub", *setup.options(), "--queue", "alarms", "-C", "4", "-F", "json"
    )
    assert (status, err) == (0, "bound to queue alarms\n")
    records = [orjson.loads(line) for line in out.splitlines()]
    assert [r["topic"] for r in records] == ["alarms/raw"] * 4
    assert [r["payload_encoding"] for r in records] == ["base64", "base64", "utf-8", "utf-8"]
    decoded = [
        base64.b64decode(r["payload"]) if r["payload_encoding"] == "base64" else r["payload"]
        for r in records
    ]
    assert decoded == [PAYLOADS[0], PAYLOADS[1], PAYLOADS[2].decode(), ""]


def subscriber(setup: Setup, start: Start, mode: str, *extra: str) -> tuple[Process, str]:
    """A running ``meshbus sub`` (filters or a queue) that has printed one message."""
    if mode == "queue":
        sub = start(["sub", *setup.options(), *extra, "--queue", "alarms"])
        ready = "bound to queue alarms"
        topic = "alarms/boiler"
    else:
        sub = start(["sub", *setup.options(), *extra, "plant/>"])
        ready = "subscribed to plant/>"
        topic = "plant/boiler"
    sub.wait_for("stderr", ready)
    pub = setup.command("pub", *setup.options(), "-g", topic, "before")
    assert pub.returncode == 0, pub.stderr
    sub.wait_for("stdout", f"{topic} before")
    return sub, ready


@pytest.mark.slow  # about 2 s each: a node and a subscriber process
@pytest.mark.parametrize("mode", ["filters", "queue"])
@pytest.mark.parametrize("kill", list(KILLS))
def test_sub_exits_1_saying_so_when_the_node_goes_away(
    setup: Setup, start: Start, kill: str, mode: str
) -> None:
    node = setup.start_node(start)
    sub, ready = subscriber(setup, start, mode)
    node.finish(KILLS[kill])
    assert sub.finish() == 1, sub.outputs()
    assert sub.stdout[-1].endswith(" before")
    assert sub.stderr[0] == ready
    # One line, whatever the node did: a goodbye (SIGTERM) or nothing at all (SIGKILL).
    (error,) = sub.stderr[1:]
    assert error.startswith(f"meshbus sub: error: connection to {setup.url} lost: "), error


@pytest.mark.slow  # about 5 s each: the subscriber waits its backoff, the node restarts
@pytest.mark.parametrize(("mode", "kill"), [("filters", "SIGTERM"), ("queue", "SIGKILL")])
def test_sub_reconnect_says_when_it_loses_and_regains_the_node(
    setup: Setup, start: Start, mode: str, kill: str
) -> None:
    node = setup.start_node(start)
    sub, ready = subscriber(setup, start, mode, "--reconnect")
    node.finish(KILLS[kill])
    sub.wait_for("stderr", f"meshbus sub: connection to {setup.url} lost: ")
    # The node comes back on the same address, with the same spool.
    port = setup.url.rsplit(":", 1)[1]
    setup.node = start(["run", "--listen", f"127.0.0.1:{port}", "node.toml"])
    assert setup.node.wait_for("stdout", LISTENING) == LISTENING + setup.url
    sub.wait_for("stderr", f"meshbus sub: reconnected to {setup.url}")
    topic = sub.stdout[0].split()[0]
    pub = setup.command("pub", *setup.options(), "-g", topic, "after")
    assert pub.returncode == 0, pub.stderr
    sub.wait_for("stdout", f"{topic} after")  # its subscription or flow is back
    assert sub.popen.poll() is None, sub.outputs()
    assert sub.finish(signal.SIGINT) == 130, sub.outputs()
    lines = sub.stderr
    assert lines[0] == ready
    assert lines[1].startswith(f"meshbus sub: connection to {setup.url} lost: "), lines
    # then its attempts, each said, until one succeeds
    assert all(line.startswith("meshbus sub: reconnect") for line in lines[2:]), lines
    assert any(line.startswith(f"meshbus sub: reconnected to {setup.url}") for line in lines)


@pytest.mark.slow  # about 3 s: a node and four client processes
def test_pub_ttl_gives_messages_a_time_to_live_and_refuses_a_bad_one(
    setup: Setup, start: Start
) -> None:
    setup.start_node(start)
    before = time.time()
    for args in (["--retain", "--ttl", "60", "meters/1", "41"], ["--retain", "meters/2", "42"]):
        status, _, err = command(setup, "pub", *setup.options(), *args)
        assert status == 0, err
    status, _, err = command(setup, "pub", *setup.options(), "--ttl", "-1", "meters/3", "43")
    assert (status, err.count("\n")) == (1, 1), err
    assert "invalid-ttl" in err
    status, out, err = command(setup, "sub", *setup.options(), "meters/*", "-C", "2", "-F", "json")
    assert status == 0, err
    records = {r["topic"]: r for r in map(orjson.loads, out.splitlines())}
    assert sorted(records) == ["meters/1", "meters/2"]  # the refused one was not kept
    assert before + 59 < records["meters/1"]["expires_at"] < time.time() + 60
    assert records["meters/2"]["expires_at"] is None


@pytest.mark.slow  # about 3 s: a node and three client processes
def test_pub_retain_keeps_a_value_that_a_later_sub_is_given(setup: Setup, start: Start) -> None:
    setup.start_node(start)
    for args in (["--retain", "meters/1", "41"], ["--retain", "-g", "meters/2", "42"]):
        status, _, err = command(setup, "pub", *setup.options(), *args)
        assert status == 0, err
    status, out, err = command(setup, "sub", *setup.options(), "meters/*", "-C", "2", "-F", "json")
    assert status == 0, err
    records = sorted((orjson.loads(line) for line in out.splitlines()), key=lambda r: r["topic"])
    assert [(r["topic"], r["payload"], r["retained"]) for r in records] == [
        ("meters/1", "41", True),
        ("meters/2", "42", True),
    ]
