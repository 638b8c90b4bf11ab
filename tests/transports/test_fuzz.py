"""Hostile bytes against a node (SPEC 10 acceptance).

"A fuzz test (hypothesis, many thousands of cases in CI) feeding random, truncated,
oversized and mutated frames to a node: the node never crashes, other sessions are
unaffected, each bad connection is closed with a logged reason."

How: hypothesis cannot run one async example after another against a node that
lives for the whole test on both anyio backends, and starting a node per example
would cost more than the examples. So a sync ``@given`` function only *collects*
hostile inputs (:class:`Attack`: bytes, how they are cut into writes, what the node
must say) into a list, made once per strategy and shared by both backends. Then one
``anyio.run`` per (strategy, backend) starts one :class:`~meshbus.Node` and one
:class:`~meshbus.transports.Server` and replays every attack as its own connection
over a memory stream pair, ``server.serve(stream)`` in a task group of the test (an
exception escaping ``serve`` would crash a node's task group: here it fails the test).
Around each attack: a healthy in-process session and a healthy remote session (a
second connection to the same server) must still exchange messages, the connection
must end with one logged reason, and the server's counters must agree with the logs.
Failures print the attack, which is enough to replay it (no shrinking). Hostile
connections written by hand, one case each, are in test_hostile_cases.py.
"""

from __future__ import annotations

import functools
import itertools
import logging
import re
import zlib
from typing import Any

import anyio
import attrs
import lz4.frame
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from meshbus import HEADER_LIMITS, Node, Session
from meshbus.errors import ProtocolError
from meshbus.transports import (
    ConnectionState,
    FrameKind,
    LinkProtocol,
    Role,
    Server,
    encode_frame,
    memory_stream_pair,
)
from meshbus.transports._compression import ALGORITHMS, Compressor
from meshbus.transports._framing import HEADER_DEPTH_LIMIT
from tests.fuzzing import mutate, nested_json

from ._raw_client import ENDINGS, LOGGER, MAX_FRAME, PREFIX, Client, records_of, settings_for_fuzz

K = FrameKind
BACKENDS = ["asyncio", "trio"]
_GONE = (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError)


@attrs.frozen
class Attack:
    """What one hostile connection writes, and what the node must make of it."""

    body: bytes
    """Written after the login (or from the start when there is none)."""
    hello: dict[str, Any] | None = None
    """A valid HELLO written first, alone; the rest waits for the node's answer."""
    compressed: bool = False
    """``body`` is already compressed (the HELLO offered zlib)."""
    cuts: tuple[int, ...] = ()
    """Where ``body`` is cut into separate writes."""
    fails: bool = True
    """The node must close the connection as failed (counted, logged as a warning)."""
    reason: str | None = None
    """A regex the logged reason must match."""

    def writes(self) -> list[bytes]:
        points = sorted({0, len(self.body), *(min(c, len(self.body)) for c in self.cuts)})
        return [self.body[a:b] for a, b in itertools.pairwise(points)]


def hello_bytes(hello: dict[str, Any]) -> bytes:
    return encode_frame(K.HELLO, {"version": 1, **hello})


def compressed(data: bytes) -> bytes:
    """``data`` as the first write of a client's compressed stream."""
    return Compressor().compress(data)


# --- strategies -------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.integers(min_value=-3, max_value=70_000)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(
        ["", "a/b", "fuzz/x", ">", "a/*", "#share/g/a", "q1", "sync", "stats", "subscribe_for"]
    )
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=8,
)
names = st.sampled_from(["fuzz/a", "fuzz/b/c", "fuzz/>", "fuzz/*/c", "q1", "ep1", "x"])
requests = st.integers(min_value=0, max_value=5)
cuts = st.lists(st.integers(min_value=0, max_value=400), max_size=4).map(tuple)
#: Keys a client frame may carry, by kind; wrong-shape headers mix these with random values.
KEYS = {
    K.SUBSCRIBE: ("id", "subscription"),
    K.UNSUBSCRIBE: ("id", "subscription"),
    K.SEND: ("id", "topic", "queue", "persistent", "h", "ttl", "e", "r", "c"),
    K.BIND: ("id", "queue", "endpoint", "subscription", "window"),
    K.UNBIND: ("id", "flow"),
    K.ACK: ("flow", "ids"),
    K.REQUEST: ("id", "what", "client", "subscription"),
    K.CLOSE: ("reason",),
    K.PING: ("id",),
    K.PONG: ("id",),
    K.ADVERTISE: ("add", "remove"),
}
options_keys = st.sampled_from(["h", "e", "r", "c", "m", "x"])


def valid_frames() -> st.SearchStrategy[bytes]:
    """One well-formed client frame (the node may still refuse what it asks)."""
    payload = st.binary(max_size=40)
    return st.one_of(
        st.builds(
            lambda i, s: encode_frame(K.SUBSCRIBE, {"id": i, "subscription": s}), requests, names
        ),
        st.builds(
            lambda i, s: encode_frame(K.UNSUBSCRIBE, {"id": i, "subscription": s}),
            requests,
            names,
        ),
        st.builds(lambda t, p: encode_frame(K.PUBLISH, [t], p), names, payload),
        st.builds(
            lambda ts, p: encode_frame(K.PUBLISH_BATCH, [[t, len(p)] for t in ts], p * len(ts)),
            st.lists(names, max_size=4),
            payload,
        ),
        st.builds(
            lambda t, h, p: encode_frame(K.PUBLISH, [t, {"h": h, "e": True, "r": "r/t"}], p),
            names,
            st.dictionaries(st.text(max_size=4), json_values, max_size=3),
            payload,
        ),
        st.builds(
            lambda i, t, per, p: encode_frame(K.SEND, {"id": i, "topic": t, "persistent": per}, p),
            requests,
            names,
            st.booleans(),
            payload,
        ),
        st.builds(
            lambda i, q, p: encode_frame(K.SEND, {"id": i, "queue": q, "ttl": 5}, p),
            requests,
            names,
            payload,
        ),
        st.builds(
            lambda i, q, w: encode_frame(K.BIND, {"id": i, "queue": q, "window": w}),
            requests,
            names,
            st.integers(min_value=1, max_value=10),
        ),
        st.builds(
            lambda i, e, s: encode_frame(K.BIND, {"id": i, "endpoint": e, "subscription": s}),
            requests,
            names,
            names,
        ),
        st.builds(lambda i, f: encode_frame(K.UNBIND, {"id": i, "flow": f}), requests, requests),
        st.builds(
            lambda f, ids: encode_frame(K.ACK, {"flow": f, "ids": ids}),
            requests,
            st.lists(requests, max_size=3),
        ),
        st.builds(
            lambda i, w: encode_frame(K.REQUEST, {"id": i, "what": w}),
            requests,
            st.sampled_from(["sync", "stats", "nothing"]),
        ),
        st.builds(
            lambda i, w, c, s: encode_frame(
                K.REQUEST, {"id": i, "what": w, "client": c, "subscription": s}
            ),
            requests,
            st.sampled_from(["subscribe_for", "unsubscribe_for"]),
            st.sampled_from(["healthy", "nobody", ""]),
            names,
        ),
        st.just(encode_frame(K.PING, {})),
        st.just(encode_frame(K.PONG, {})),
        st.just(encode_frame(K.ADVERTISE, {"add": ["a"]})),
    )


@st.composite
def wrong_shape_frames(draw: st.DrawFn) -> bytes:
    """A frame of any kind whose header has missing, extra or wrongly typed fields."""
    kind = draw(st.sampled_from(FrameKind))
    keys = KEYS.get(kind, ("id",))
    shape = draw(st.sampled_from(["fields", "fields", "any", "array"]))
    header: Any
    if shape == "fields":
        header = draw(
            st.dictionaries(st.sampled_from([*keys, "id", "zz"]), json_values, max_size=len(keys))
        )
    elif shape == "array":  # PUBLISH and the node's data frames have array headers
        header = draw(
            st.lists(json_values | st.dictionaries(options_keys, json_values), max_size=7)
        )
    else:
        header = draw(json_values)
    return encode_frame(kind, header, draw(st.binary(max_size=20)))


hellos = st.fixed_dictionaries(
    {}, optional={"compression": st.just(["zlib"]), "client_name": st.just(None)}
)


@st.composite
def random_bytes(draw: st.DrawFn) -> Attack:
    """Pure noise, or noise behind a plausible frame prefix, from the first byte."""
    if draw(st.booleans()):
        body = draw(st.binary(min_size=1, max_size=300))
    else:
        length = draw(st.integers(min_value=0, max_value=400))
        kind = draw(st.sampled_from([*FrameKind, 0, 99, 255]))
        body = PREFIX.pack(length, kind, draw(st.integers(0, 400))) + draw(st.binary(max_size=300))
    return Attack(body, cuts=draw(cuts))


@st.composite
def hello_then_random(draw: st.DrawFn) -> Attack:
    """A good login, then noise (compressed noise on a compressed link, sometimes)."""
    hello = draw(hellos)
    body = draw(st.binary(min_size=1, max_size=300))
    zipped = "compression" in hello and draw(st.booleans())
    return Attack(compressed(body) if zipped else body, hello, zipped, draw(cuts))


@st.composite
def mutated_frames(draw: st.DrawFn) -> Attack:
    """Valid frames, the HELLO among them sometimes, with bytes flipped, added or cut."""
    hello = draw(hellos)
    frames = b"".join(draw(st.lists(valid_frames(), min_size=1, max_size=6)))
    if draw(st.integers(0, 3)) == 0:  # the HELLO itself is mutated
        body = mutate(hello_bytes(hello) + frames, draw)
        return Attack(body, cuts=draw(cuts), fails=False)
    # a mutation may leave valid frames (a cut at a boundary) or make a CLOSE (kind 5 -> 4)
    body = mutate(frames, draw)
    if "compression" in hello:
        if draw(st.booleans()):
            return Attack(compressed(body), hello, True, draw(cuts), fails=False)
        return Attack(mutate(compressed(frames), draw), hello, True, draw(cuts), fails=False)
    return Attack(body, hello, cuts=draw(cuts), fails=False)


@st.composite
def wrong_shapes(draw: st.DrawFn) -> Attack:
    """Well-framed headers of every kind with the wrong fields, or a HELLO of the wrong shape."""
    if draw(st.integers(0, 4)) == 0:
        fields = st.sampled_from(
            [
                "vpn",
                "username",
                "password",
                "client_name",
                "no_local",
                "timestamps",
                "compression",
                "version",
            ]
        )
        hello = draw(st.dictionaries(fields, json_values, max_size=4))
        if draw(st.booleans()):
            hello["version"] = 1
        body = encode_frame(K.HELLO, hello) + b"".join(draw(st.lists(valid_frames(), max_size=2)))
        return Attack(body, cuts=draw(cuts), fails=False)  # a login may be refused, not failed
    hello = draw(hellos)
    frames = draw(st.lists(wrong_shape_frames() | valid_frames(), min_size=1, max_size=5))
    body = b"".join(frames)
    if "compression" in hello:
        return Attack(compressed(body), hello, True, draw(cuts), fails=False)
    return Attack(body, hello, cuts=draw(cuts), fails=False)


@st.composite
def oversized(draw: st.DrawFn) -> Attack:
    """A length prefix over the limit, before or after a login (compressed or not)."""
    length = draw(
        st.integers(min_value=MAX_FRAME + 1, max_value=2**32 - 1)
        | st.sampled_from([MAX_FRAME + 1, 2**31, 2**32 - 1])
    )
    kind = draw(st.sampled_from(FrameKind))
    body = PREFIX.pack(length, kind, draw(st.integers(0, 100))) + draw(st.binary(max_size=50))
    reason = f"frame of {length} bytes is larger than the limit of {MAX_FRAME}"
    when = draw(st.sampled_from(["first", "plain", "compressed"]))
    if when == "first":
        return Attack(body, cuts=draw(cuts), reason=reason)
    if when == "plain":
        return Attack(body, {}, cuts=draw(cuts), reason=reason)
    return Attack(compressed(body), {"compression": ["zlib"]}, True, draw(cuts), reason=reason)


@functools.cache
def bombs() -> dict[tuple[str, str], tuple[bytes, str]]:
    """Compressed bodies that inflate to far more than a frame, for each algorithm:
    (algorithm, name) -> (bytes, logged reason)."""
    made: dict[tuple[str, str], tuple[bytes, str]] = {}
    for algorithm in ALGORITHMS:
        # 50 MB of zeros: ~50 kB with zlib, ~200 kB with LZ4
        zeros = Compressor(algorithm).compress(bytes(50 * 1024 * 1024))
        huge_frame = Compressor(algorithm).compress(
            PREFIX.pack(40 * 1024 * 1024, K.PUBLISH, 5) + b'["t"]' + bytes(10 * 1024 * 1024)
        )
        # the stream ends: zlib's Z_FINISH, LZ4's end mark
        finish = zlib.compress if algorithm == "zlib" else lz4.frame.compress
        finished = finish(encode_frame(K.PING, {}) * 1000)
        made[algorithm, "zeros"] = (zeros, "frame length 0 is shorter than a frame header")
        made[algorithm, "huge frame"] = (
            huge_frame,
            "frame of 41943040 bytes is larger than the limit of 65536",
        )
        made[algorithm, "finished"] = (finished, "compressed stream ended before the connection")
    return made


@st.composite
def compressed_bombs(draw: st.DrawFn) -> Attack:
    """A decompression bomb after a login that negotiated zlib or LZ4, whole, cut or
    mutated."""
    algorithm, name = draw(st.sampled_from(sorted(bombs())))
    body, reason = bombs()[algorithm, name]
    how = draw(st.sampled_from(["whole", "whole", "truncated", "mutated"]))
    hello = {"compression": [algorithm]}
    if how == "whole":
        writes = (draw(st.integers(0, len(body))),) if draw(st.booleans()) else ()
        return Attack(body, hello, True, writes, reason=re.escape(reason))
    if how == "truncated":
        body = body[: draw(st.integers(min_value=1, max_value=len(body) - 1))]
    else:  # flip a byte in the first few kB (the frame prefix is decoded first)
        at = draw(st.integers(min_value=0, max_value=min(len(body) - 1, 4096)))
        body = body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1 :]
    return Attack(body, hello, True, draw(cuts))


@st.composite
def deep_headers(draw: st.DrawFn) -> Attack:
    """Message headers around the depth limit and far beyond what a node could write again:
    refused with an error while the frame fits its own depth limit, closing it beyond."""
    depth = draw(
        st.integers(min_value=HEADER_LIMITS.max_depth - 3, max_value=HEADER_DEPTH_LIMIT + 3)
        | st.integers(min_value=HEADER_DEPTH_LIMIT, max_value=1100)
    )
    nested = nested_json(draw(st.lists(st.booleans(), min_size=depth, max_size=depth)), b"1")
    kind, head = draw(
        st.sampled_from(
            [
                (K.PUBLISH, b'["fuzz/deep",{"h":{"x":%s}}]'),
                (K.SEND, b'{"id":1,"topic":"fuzz/deep","h":{"x":%s}}'),
                (K.SUBSCRIBE, b'{"id":1,"subscription":%s}'),
                (K.PUBLISH, b"%s"),
            ]
        )
    )
    head = head % nested
    frame = PREFIX.pack(5 + len(head) + 4, kind, len(head)) + head + b"deep"
    hello = draw(hellos)
    if "compression" in hello:
        return Attack(compressed(frame), hello, True, draw(cuts), fails=False)
    return Attack(frame, hello, cuts=draw(cuts), fails=False)


STRATEGIES: dict[str, tuple[st.SearchStrategy[Attack], int]] = {
    "random bytes": (random_bytes(), 700),
    "hello then random bytes": (hello_then_random(), 500),
    "mutated frames": (mutated_frames(), 700),
    "wrong header shapes": (wrong_shapes(), 700),
    "oversized lengths": (oversized(), 300),
    "compressed bombs": (compressed_bombs(), 100),
    "deep headers": (deep_headers(), 100),
}


@functools.cache
def attacks(name: str) -> tuple[Attack, ...]:
    """The examples of one strategy, made once (hypothesis generates; nothing runs here)."""
    strategy, count = STRATEGIES[name]
    found: list[Attack] = []

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(attack: Attack) -> None:
        found.append(attack)

    collect()
    return tuple(found)


# --- the node side ----------------------------------------------------------------------------


async def replay(server: Server, attack: Attack, peer: str) -> None:
    """One hostile connection: write the attack, read what comes back, until the node hangs up."""
    ours, theirs = memory_stream_pair()
    watcher = LinkProtocol(Role.CLIENT, max_frame_size=1 << 30)
    if attack.hello is not None:
        watcher.hello(attack.hello)
    answered = anyio.Event()

    async def read() -> None:
        try:
            while True:
                data = await ours.receive(1 << 20)
                if watcher.state is ConnectionState.HANDSHAKE:
                    try:
                        watcher.receive_data(data)
                    except ProtocolError:  # pragma: no cover - the node answers properly
                        answered.set()
                        raise
                    if watcher.state is not ConnectionState.HANDSHAKE:
                        answered.set()
        except _GONE:
            pass
        finally:
            answered.set()

    async def write() -> None:
        try:
            if attack.hello is not None:
                await ours.send(watcher.data_to_send())
                await answered.wait()
            for chunk in attack.writes():
                await ours.send(chunk)
            await ours.send_eof()
        except _GONE:
            pass

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(write)
        await server.serve(theirs, peer=peer)
    await ours.aclose()


async def fuzz_node(name: str, caplog: pytest.LogCaptureFixture) -> int:
    """Replay the attacks of strategy ``name`` against one node; return how many failed."""
    failures = 0
    async with Node(name="fuzz") as node:
        server = Server(node, settings_for_fuzz())
        # something for hostile SEND, BIND, ACK and UNBIND frames to work on
        node.guaranteed.create_queue("q1", subscriptions=["fuzz/>"], max_messages=1000)
        node.guaranteed.create_topic_endpoint("ep1")
        async with (
            node.connect(client_name="watcher") as watcher,
            node.connect(client_name="healthy") as healthy,
            anyio.create_task_group() as tg,
        ):
            watcher.subscribe(">")
            probe = Client(server, tg, "probe")  # a healthy remote session, subscribed to all
            assert (await probe.login(client_name="probe", compression=["zlib"]))[0] == K.WELCOME
            await probe.request(K.SUBSCRIBE, {"id": 1, "subscription": ">"})
            for i, attack in enumerate(attacks(name)):
                peer = f"fuzz-{i}"
                before = server.statistics()
                start = len(caplog.records)
                try:
                    with anyio.fail_after(10):
                        await replay(server, attack, peer)
                    await check_healthy(watcher, healthy, probe, f"healthy/{i}")
                    records = records_of(caplog, start, peer)
                    failures += check_ending(attack, server, before, records)
                except BaseException as exc:
                    exc.add_note(f"attack {i} of {name!r}: {attack!r}")
                    raise
            assert server.statistics().open == 1  # the probe
            assert set(node.vpn().sessions) == {"watcher", "healthy", "probe"}
            await probe.hang_up()
    return failures


async def check_healthy(watcher: Session, healthy: Session, probe: Client, topic: str) -> None:
    """The sessions that did nothing wrong still get what is published."""
    healthy.publish(topic, b"still here")
    with anyio.fail_after(5):
        while (await watcher.receive()).topic != topic:
            pass
        await probe.wait_for(lambda f: f[0] == K.DELIVER and f[1][0] == topic)


def check_ending(
    attack: Attack, server: Server, before: Any, records: list[logging.LogRecord]
) -> int:
    """One logged reason per connection, counted as the log says; 1 if it was a failure."""
    after = server.statistics()
    endings = [r for r in records if r.msg.startswith(ENDINGS)]
    assert len(endings) == 1, [r.getMessage() for r in records]
    [ending] = endings
    message = ending.getMessage()
    reason = str(ending.args[1]) if len(ending.args) > 1 else ""  # type: ignore[arg-type]
    assert reason.strip(), message
    failed = ending.msg.startswith("closing connection from")
    refused = ending.msg.startswith("refused login from")
    if failed or refused:
        assert ending.levelno == logging.WARNING, message
    closings = sum(r.msg.startswith("closing connection from") for r in endings)
    assert after.failed - before.failed == closings, message
    assert after.refused - before.refused == refused, message
    assert after.open == before.open == 1
    if attack.fails:
        assert failed, message
    if attack.reason is not None:
        assert failed, message
        assert re.search(attack.reason, reason), message
    return int(failed)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(STRATEGIES))
def test_hostile_connections_never_hurt_the_node(
    name: str, backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    found = attacks(name)
    assert len(found) >= STRATEGIES[name][1] // 2  # hypothesis made enough distinct cases
    failures = anyio.run(fuzz_node, name, caplog, backend=backend)
    assert failures >= len(found) // 3  # most attacks are violations
