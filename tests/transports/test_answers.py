"""Every request a remote client makes gets exactly one answer (OK or ERROR).

Written over the raw wire, with the hand-made :class:`~._raw_client.Client`: requests
are pipelined in one write, so the node reads them together and its sender batches
SEND frames with the same options into one store commit. Whatever refuses a request
(its options, its topic, the queue, the store), each id is answered once, in order.
"""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import anyio
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from meshbus.transports import FrameKind

from ._raw_client import Client, serving

K = FrameKind


async def answers(client: Client, ids: set[int]) -> dict[int, list[tuple[int, Any]]]:
    """Read until each of ``ids`` is answered, then make one more round trip, so an
    answer given twice shows up too; every answer by id (kind, header)."""
    found: dict[int, list[tuple[int, Any]]] = {}
    barrier = max(ids) + 1000

    def take() -> None:
        for kind, header, _ in client.frames:
            if kind in (K.OK, K.ERROR) and isinstance(header, dict) and "id" in header:
                found.setdefault(header["id"], []).append((kind, header))
        client.frames.clear()

    with anyio.move_on_after(5):
        while not ids <= found.keys():
            take()
            if not ids <= found.keys():
                await client.read()
    assert ids <= found.keys(), f"never answered: {sorted(ids - found.keys())}; got {found}"
    with anyio.fail_after(5):
        client.protocol.send(K.REQUEST, {"id": barrier, "what": "sync"})
        await client.flush()
        while barrier not in found:
            await client.read()
            take()
    del found[barrier]
    return found


def once(found: dict[int, list[tuple[int, Any]]]) -> dict[int, tuple[int, Any]]:
    """The one answer of each id (failing when an id has more than one)."""
    counts = Counter({request: len(given) for request, given in found.items()})
    assert all(count == 1 for count in counts.values()), found
    return {request: given[0] for request, given in found.items()}


async def test_pipelined_sends_with_a_refused_ttl_are_each_refused() -> None:
    async with serving() as (_, server, tg):
        client = Client(server, tg, "pipeliner")
        await client.login()
        for request in (1, 2, 3):
            client.protocol.send(K.SEND, {"id": request, "topic": "t/a", "ttl": "soon"}, b"x")
        await client.flush()  # one write: the node reads the three together
        found = once(await answers(client, {1, 2, 3}))
        assert sorted(found) == [1, 2, 3]
        for kind, header in found.values():
            assert kind == K.ERROR, header
            assert header["error"] == "rejected"
            assert header["attrs"]["reason"] == "invalid-ttl"
        await client.hang_up()


async def test_a_batch_with_one_refused_message_answers_the_others() -> None:
    async with serving() as (node, server, tg):
        node.guaranteed.create_queue("q", subscriptions=["t/>"], max_messages=2)
        client = Client(server, tg, "pipeliner")
        await client.login()
        topics = ["t/1", "#reserved/x", "t/2", "t/3", "t/4"]
        for request, topic in enumerate(topics, start=1):
            client.protocol.send(K.SEND, {"id": request, "topic": topic}, b"x")
        await client.flush()
        found = once(await answers(client, set(range(1, 6))))
        kinds = [(found[i][0], found[i][1].get("error")) for i in range(1, 6)]
        assert kinds == [
            (K.OK, None),
            (K.ERROR, "invalid-topic"),  # reserved for the system
            (K.OK, None),
            (K.ERROR, "rejected"),  # the queue holds two
            (K.ERROR, "rejected"),
        ]
        await client.hang_up()


async def test_pipelined_sends_keep_their_reply_to_and_correlation_id() -> None:
    async with serving() as (node, server, tg):
        async with node.connect(client_name="responder") as responder:
            responder.subscribe("service/>")
            client = Client(server, tg, "requester")
            await client.login()
            for request in (1, 2, 3):
                header = {"id": request, "topic": "service/x", "r": "inbox/me", "c": "same"}
                client.protocol.send(K.SEND, header, b"question")
            await client.flush()
            found = once(await answers(client, {1, 2, 3}))
            assert [found[i][0] for i in (1, 2, 3)] == [K.OK] * 3
            for _ in range(3):
                message = responder.receive_nowait()
                assert message is not None
                assert (message.reply_to, message.correlation_id) == ("inbox/me", "same")
        await client.hang_up()


async def test_a_batch_never_lets_a_send_through_with_another_ones_options() -> None:
    # JSON's true is not 1: a SEND batched behind an equal-looking one must be checked,
    # and stored, with its own options.
    async with serving() as (node, server, tg):
        async with node.connect(client_name="watcher") as watcher:
            watcher.subscribe("t/>")
            client = Client(server, tg, "pipeliner")
            await client.login()
            frames = [
                {"id": 1, "topic": "t/a", "ttl": 1},
                {"id": 2, "topic": "t/b", "ttl": True},  # refused when sent alone
                {"id": 3, "topic": "t/c", "h": {"n": 1}},
                {"id": 4, "topic": "t/d", "h": {"n": True}},
            ]
            for header in frames:
                client.protocol.send(K.SEND, header, b"x")
            await client.flush()
            found = once(await answers(client, {1, 2, 3, 4}))
            assert [found[i][0] for i in (1, 2, 3, 4)] == [K.OK, K.ERROR, K.OK, K.OK]
            assert found[2][1]["attrs"]["reason"] == "invalid-ttl"
            received = {}
            for _ in range(3):
                message = watcher.receive_nowait()
                assert message is not None
                received[message.topic] = dict(message.headers)
            assert received == {"t/a": {}, "t/c": {"n": 1}, "t/d": {"n": True}}
            assert type(received["t/d"]["n"]) is bool
        await client.hang_up()


# --- every request, exactly one answer: pipelined requests of every kind ---------------------

_ABSENT = object()
names = st.sampled_from(["t/a", "t/b", "t/>", "t/*", "", "a//b", "#x/y", "q1", "ep1", "nope"])
ttls = st.sampled_from([_ABSENT, None, 0, 5, 0.25, -1, "soon", True, [1], {}])
header_values = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=3)


def _put(header: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if value is not _ABSENT:
        header[key] = value
    return header


@st.composite
def send_bursts(draw: st.DrawFn) -> list[tuple[FrameKind, dict[str, Any]]]:
    """One to five SENDs with the same options (what the node batches), to topics."""
    options: dict[str, Any] = {}
    _put(options, "ttl", draw(ttls))
    _put(options, "persistent", draw(st.sampled_from([_ABSENT, True, False])))
    if draw(st.booleans()):
        options["h"] = draw(st.dictionaries(st.text(max_size=2), header_values, max_size=2))
    per_message = {"r": st.just("inbox/x"), "c": st.text(max_size=3), "e": st.booleans()}
    for key, values in per_message.items():  # not batched: send_many cannot carry them
        if draw(st.integers(0, 4)) == 0:
            options[key] = draw(values)
    topics = draw(st.lists(names, min_size=1, max_size=5))
    return [(K.SEND, {**options, "topic": topic}) for topic in topics]


def one(kind: FrameKind, **fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(fields).map(lambda header: [(kind, header)])


requests = st.one_of(
    send_bursts(),
    send_bursts(),
    st.builds(
        lambda queue, ttl: [(K.SEND, _put({"queue": queue}, "ttl", ttl))],
        st.sampled_from(["q1", "nope", ""]),
        ttls,
    ),
    one(K.SUBSCRIBE, subscription=names),
    one(K.UNSUBSCRIBE, subscription=names),
    one(K.BIND, queue=st.sampled_from(["q1", "nope"]), window=st.integers(1, 10)),
    one(K.BIND, endpoint=st.sampled_from(["ep1", "nope"]), subscription=names),
    one(K.UNBIND, flow=st.integers(0, 4)),
    one(K.REQUEST, what=st.sampled_from(["sync", "stats", "nothing"])),
)
#: Frames without an id, mixed in: the node may answer them with an ERROR without one.
unanswered = st.one_of(
    st.builds(lambda topic: [(K.PUBLISH, [topic])], names),
    st.builds(lambda ids: [(K.ACK, {"flow": 1, "ids": ids})], st.lists(st.integers(0, 9))),
)
cases = st.lists(requests | unanswered, min_size=1, max_size=12)


@functools.cache
def examples() -> tuple[list[list[tuple[FrameKind, Any]]], ...]:
    """Sequences of requests, made once by hypothesis and shared by both backends."""
    found: list[list[list[tuple[FrameKind, Any]]]] = []

    @settings(
        max_examples=150,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases)
    def collect(case: list[list[tuple[FrameKind, Any]]]) -> None:
        found.append(case)

    collect()
    return tuple(found)


def _valid_ttl(header: dict[str, Any]) -> bool:
    ttl = header.get("ttl")
    return ttl is None or (type(ttl) in (int, float) and ttl >= 0)


async def test_every_pipelined_request_gets_exactly_one_answer() -> None:
    async with serving() as (node, server, tg):
        node.guaranteed.create_queue("q1", subscriptions=["t/>"], max_messages=3)
        node.guaranteed.create_topic_endpoint("ep1")
        for n, case in enumerate(examples()):
            client = Client(server, tg, f"client-{n}")
            await client.login()
            sent: dict[int, tuple[FrameKind, Any]] = {}
            for kind, header in (frame for group in case for frame in group):
                if kind in (K.PUBLISH, K.ACK):
                    client.protocol.send(kind, header, b"x")
                    continue
                request = len(sent) + 1
                sent[request] = (kind, header)
                client.protocol.send(kind, {**header, "id": request}, b"x")
            await client.flush()  # one write: read together, SENDs batched where they can be
            try:
                found = once(await answers(client, set(sent))) if sent else {}
                assert found.keys() == sent.keys()
                for request, (kind, header) in sent.items():
                    answer, body = found[request]
                    if kind == K.SEND and not _valid_ttl(header):  # or refused for its topic
                        assert answer == K.ERROR, body
                    elif kind == K.REQUEST:
                        assert (answer == K.OK) == (header["what"] != "nothing"), body
            except BaseException as exc:
                exc.add_note(f"case {n}: {case!r}")
                raise
            await client.hang_up()


async def test_a_direct_publish_with_a_bad_time_to_live_is_refused_alone() -> None:
    async with serving() as (node, server, tg):
        watcher = node.connect(client_name="watcher")
        watcher.subscribe("t/>")
        client = Client(server, tg, "ttl-publisher")
        await client.login()
        client.protocol.send(K.PUBLISH, ["t/1", {"x": -1}], b"x")
        client.protocol.send(K.PUBLISH, ["t/2", {"x": 5}], b"x")
        client.protocol.send(K.REQUEST, {"id": 1, "what": "sync"})
        await client.flush()
        with anyio.fail_after(5):  # every publish before the round trip is applied
            while not any(kind == K.OK and h.get("id") == 1 for kind, h, _ in client.frames):
                await client.read()
        refused = [h for kind, h, _ in client.frames if kind == K.ERROR]
        assert [(h["topic"], h["attrs"]["reason"]) for h in refused] == [("t/1", "invalid-ttl")]
        delivered = list(iter(watcher.receive_nowait, None))
        assert [m.topic for m in delivered] == ["t/2"]
        expires_at = delivered[0].expires_at
        assert expires_at is not None
        assert node.clock.time() < expires_at <= node.clock.time() + 5
        await client.hang_up()


async def test_a_time_to_live_that_is_not_a_number_is_a_protocol_error() -> None:
    async with serving() as (node, server, tg):
        watcher = node.connect(client_name="watcher")
        watcher.subscribe("t/>")
        for n, ttl in enumerate(["soon", True, [5]]):
            client = Client(server, tg, f"ttl-{n}")
            await client.login()
            client.protocol.send(K.PUBLISH, ["t/1", {"x": ttl}], b"x")
            await client.flush()
            with anyio.fail_after(5):
                await client.served.wait()  # the node closed the connection
            await client.hang_up()
        assert watcher.receive_nowait() is None
