"""Publishing guaranteed messages (SPEC 4): to topics, to queues by name, in batches.

Storage matters for every rule here, so each test runs on the MemoryStore (a node
without ``data_dir``) and on the SqliteStore (``Node(data_dir=...)``).
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    ClientProfile,
    ConfigurationError,
    DeliveryMode,
    InvalidTopicError,
    Message,
    Node,
    PublishRejectedError,
    Session,
    SpoolError,
    StateError,
)
from meshbus.plugins.guaranteed._queue import Queue
from meshbus.plugins.guaranteed._settings import MAX_MESSAGE_SIZE
from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._store import SpoolStore

from ._helpers import PLUGINS, nothing_for, receive, service


def held(node: Node, queue: str) -> tuple[int, int]:
    """(messages, bytes) the store holds for ``queue``."""
    stats = service(node).store.stats(f"default/{queue}")
    return stats.messages, stats.bytes


def records(store: SpoolStore) -> int:
    return store.statistics().records


async def drain(session: Session) -> list[Message]:
    """The direct messages waiting for ``session`` (delivered inline by the publish)."""
    out = []
    while (message := session.receive_nowait()) is not None:
        out.append(message)
    return out


async def spooled(queue: Queue, count: int) -> None:
    """Wait for the spooler to store ``count`` messages for ``queue``."""
    with anyio.fail_after(2):
        while queue.store.stats(queue.endpoint).messages < count:
            await anyio.sleep(0.001)


# --- publish to a topic -------------------------------------------------------------------


async def test_topic_publish_is_stored_once_for_every_matching_queue(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        # Two filters of one queue match: it still holds the message once.
        svc.create_queue("all", subscriptions=["orders/>", "orders/*/eu"])
        svc.create_queue("eu", subscriptions=["orders/*/eu"])
        svc.create_queue("us", subscriptions=["orders/*/us"])
        store = svc.store
        s = node.connect()
        before = store.statistics()
        await s.send("orders/1/eu", b"payload", headers={"k": [1, "v"]})
        # Acked: both queues hold it as soon as send returns, from one stored copy.
        assert held(node, "all") == held(node, "eu") == (1, 7)
        assert held(node, "us") == (0, 0)
        after = store.statistics()
        assert after.records - before.records == 1
        assert after.commits - before.commits == 1
        if isinstance(store, SqliteStore):
            assert after.syncs - before.syncs == 1  # persistent: on disk before the ack
        async with await s.bind("all") as f_all, await s.bind("eu") as f_eu:
            a = await receive(f_all)
            e = await receive(f_eu)
            assert a.message_id == e.message_id  # the same stored message
            for m, queue in ((a, "all"), (e, "eu")):
                assert (m.topic, m.payload, m.headers) == (
                    "orders/1/eu",
                    b"payload",
                    {"k": [1, "v"]},
                )
                assert m.delivery_mode is DeliveryMode.PERSISTENT
                assert not m.redelivered
                assert m.destination == queue
            await nothing_for(f_all, 0.01)
            # Deleted only when every queue holding it has acked.
            f_all.ack(a)
            await f_all.unbind()
            assert held(node, "all") == (0, 0)
            assert held(node, "eu") == (1, 7)
            await store.check()
            f_eu.ack(e)
        assert held(node, "eu") == (0, 0)
        assert store.endpoints() == []
        await store.check()


async def test_topic_publish_without_a_matching_queue_is_acked_and_discarded(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["orders/>"])
        before = svc.store.statistics()
        s = node.connect()
        await s.send("invoices/1", b"x")  # returns: acked
        assert svc.store.statistics() == before  # nothing written
        assert svc.store.endpoints() == []


async def test_non_persistent_send_is_spooled_and_delivered_non_persistent(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"])
        s = node.connect()
        before = svc.store.statistics()
        await s.send("t/1", b"np", persistent=False)
        await s.send_to_queue("q", b"np2", persistent=False)
        assert held(node, "q") == (2, 5)
        assert svc.store.statistics().syncs == before.syncs  # no fsync for them
        async with await s.bind("q") as flow:
            for payload in (b"np", b"np2"):
                m = await receive(flow)
                assert (m.payload, m.delivery_mode) == (payload, DeliveryMode.NON_PERSISTENT)
                flow.ack(m)


async def test_matching_client_subscriptions_get_a_direct_copy(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["orders/>"])
        pub = node.connect(client_name="pub")
        sub = node.connect()
        sub.subscribe("orders/>")
        other = node.connect()
        other.subscribe("invoices/>")
        await pub.send(
            "orders/1", b"x", headers={"h": 1}, reply_to="replies/1", correlation_id="c1"
        )
        (copy,) = await drain(sub)
        assert copy.delivery_mode is DeliveryMode.DIRECT
        assert (copy.topic, copy.payload, copy.sender) == ("orders/1", b"x", "pub")
        assert (copy.headers, copy.reply_to, copy.correlation_id) == ({"h": 1}, "replies/1", "c1")
        assert copy.message_id is None
        assert not copy.redelivered
        assert await drain(other) == []
        # The direct copy is not spooled a second time by the queue's subscription.
        await anyio.sleep(0.01)
        assert held(node, "q") == (1, 1)


async def test_guaranteed_message_matching_only_client_subscriptions_is_delivered_direct(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["orders/>"])
        sub = node.connect()
        sub.subscribe("prices/>")
        before = svc.store.statistics()
        await node.connect().send("prices/eur", b"1.1")
        (m,) = await drain(sub)
        assert (m.topic, m.payload, m.delivery_mode) == ("prices/eur", b"1.1", DeliveryMode.DIRECT)
        assert svc.store.statistics() == before  # not stored


async def test_send_many_direct_copies_go_to_client_subscriptions(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q", subscriptions=["a/>"], max_messages=1)
        sub = node.connect()
        sub.subscribe(">")
        results = await node.connect().send_many([("a/1", b"1"), ("a/2", b"2"), ("b/3", b"3")])
        assert results[0] is None
        assert results[2] is None
        assert isinstance(results[1], PublishRejectedError)
        got = await drain(sub)
        assert [(m.topic, m.delivery_mode) for m in got] == [
            ("a/1", DeliveryMode.DIRECT),
            ("b/3", DeliveryMode.DIRECT),
        ]  # not the rejected one


async def test_concurrent_publishers_share_commits(tmp_path: Path) -> None:
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"])
        before = svc.store.statistics()
        sessions = [node.connect() for _ in range(20)]
        async with anyio.create_task_group() as tg:
            for i, s in enumerate(sessions):
                tg.start_soon(s.send, f"t/{i}", b"x")
        after = svc.store.statistics()
        assert held(node, "q") == (20, 20)
        assert after.records - before.records == 20
        assert after.syncs - before.syncs < 10  # group commit: far fewer fsyncs than messages


# --- rejection of a topic publish ---------------------------------------------------------


async def test_topic_publish_rejected_when_a_rejecting_queue_cannot_take_it(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        # matched before the rejecting queue: it must not count a discard for nothing
        lenient = svc.create_queue(
            "lenient", subscriptions=["t/>"], max_messages=1, reject_msg_to_sender_on_discard=False
        )
        svc.create_queue("roomy", subscriptions=["t/>"])
        full = svc.create_queue("full", subscriptions=["t/>"], max_messages=1)
        sub = node.connect()
        sub.subscribe("t/>")
        s = node.connect()
        await s.send("t/1", b"first")
        assert await drain(sub) != []
        before = svc.store.statistics()
        with pytest.raises(PublishRejectedError) as info:
            await s.send("t/2", b"second")
        assert info.value.reason == "over-quota"
        assert (info.value.limit, info.value.size) == (1, 2)
        assert "full" in str(info.value)
        # Nothing stored in ANY queue, and no direct copy went out.
        assert svc.store.statistics() == before
        assert held(node, "roomy") == held(node, "full") == held(node, "lenient") == (1, 5)
        assert await drain(sub) == []
        # The sender got it back: no queue counts it as discarded.
        assert full.discarded == lenient.discarded == 0


async def test_topic_publish_over_a_queue_max_message_size_is_rejected() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("small", subscriptions=["t/>"], max_message_size=4)
        svc.create_queue("big", subscriptions=["t/>"])
        s = node.connect()
        with pytest.raises(PublishRejectedError) as info:
            await s.send("t/1", b"12345")
        assert (info.value.reason, info.value.limit, info.value.size) == ("too-large", 4, 5)
        assert held(node, "big") == (0, 0)
        await s.send("t/1", b"1234")
        assert held(node, "big") == held(node, "small") == (1, 4)


async def test_topic_publish_to_a_queue_with_ingress_disabled_is_rejected() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("closed", subscriptions=["t/>"], ingress_enabled=False)
        svc.create_queue("open", subscriptions=["t/>"])
        with pytest.raises(PublishRejectedError) as info:
            await node.connect().send("t/1", b"x")
        assert info.value.reason == "ingress-disabled"
        assert held(node, "open") == (0, 0)


async def test_queues_that_do_not_reject_count_a_discard_and_others_still_get_it(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        quiet = svc.create_queue(
            "quiet", subscriptions=["t/>"], max_messages=1, reject_msg_to_sender_on_discard=False
        )
        small = svc.create_queue(
            "small",
            subscriptions=["t/>"],
            max_message_size=2,
            reject_msg_to_sender_on_discard=False,
        )
        closed = svc.create_queue(
            "closed",
            subscriptions=["t/>"],
            ingress_enabled=False,
            reject_msg_to_sender_on_discard=False,
        )
        svc.create_queue("other", subscriptions=["t/>"])
        s = node.connect()
        await s.send("t/1", b"aa")
        await s.send("t/2", b"bbb")  # quiet is full, small too small: no error
        assert held(node, "other") == (2, 5)
        assert held(node, "quiet") == (1, 2)
        assert held(node, "small") == (1, 2)
        assert held(node, "closed") == (0, 0)
        assert (quiet.discarded, small.discarded, closed.discarded) == (1, 1, 2)
        # Only a queue that does not reject matches: acked, and stored nowhere.
        svc.create_queue(
            "lonely",
            subscriptions=["x/>"],
            ingress_enabled=False,
            reject_msg_to_sender_on_discard=False,
        )
        before = svc.store.statistics()
        await s.send("x/1", b"z")
        assert svc.store.statistics() == before


async def test_message_over_30_mb_is_rejected_even_without_matching_queue() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q")
        s = node.connect()
        sub = node.connect()
        sub.subscribe(">")
        big = bytes(MAX_MESSAGE_SIZE + 1)
        with pytest.raises(PublishRejectedError) as info:
            await s.send("t/1", big)
        assert (info.value.reason, info.value.limit, info.value.size) == (
            "too-large",
            MAX_MESSAGE_SIZE,
            MAX_MESSAGE_SIZE + 1,
        )
        assert await drain(sub) == []
        with pytest.raises(PublishRejectedError) as info:
            await s.send_to_queue("q", big)
        assert info.value.reason == "too-large"
        (result,) = await s.send_many([("t/1", big)])
        assert isinstance(result, PublishRejectedError)
        assert result.reason == "too-large"
        await s.send_to_queue("q", bytes(MAX_MESSAGE_SIZE))  # the limit itself is taken
        assert held(node, "q") == (1, MAX_MESSAGE_SIZE)


# --- publish to a queue by name -----------------------------------------------------------


async def test_send_to_queue_delivers_under_the_queue_topic(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("orders")
        svc.create_queue("everything", subscriptions=[">"])
        sub = node.connect()
        sub.subscribe(">")
        s = node.connect()
        await s.send_to_queue("orders", b"y", headers={"a": "b"})
        assert held(node, "orders") == (1, 1)
        assert held(node, "everything") == (0, 0)  # only the named queue gets it
        assert await drain(sub) == []  # and no client subscription
        async with await s.bind("orders") as flow:
            m = await receive(flow)
            assert (m.topic, m.payload, m.headers) == ("#P2P/QUE/orders", b"y", {"a": "b"})
            assert m.delivery_mode is DeliveryMode.PERSISTENT
            assert m.destination == "orders"


async def test_a_queue_following_a_queue_name_gets_what_is_sent_to_that_name(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("orders")
        svc.create_queue("follower", subscriptions=["#P2P/QUE/orders"], accept_direct=False)
        svc.create_queue("elsewhere", subscriptions=["#P2P/QUE/invoices"])
        s = node.connect()
        await s.send_to_queue("orders", b"1")
        await s.send_to_queue("invoices", b"2")  # no such queue here: its follower takes it
        assert held(node, "orders") == (1, 1)
        assert held(node, "follower") == (1, 1)
        assert held(node, "elsewhere") == (1, 1)
        with pytest.raises(PublishRejectedError, match="no-such-queue"):
            await s.send_to_queue("nobody", b"3")
        with pytest.raises(ConfigurationError, match="names one queue"):
            svc.create_queue("bad", subscriptions=["#P2P/QUE/or*"])


@pytest.mark.parametrize(
    ("settings", "payload", "reason", "limit", "size"),
    [
        ({"ingress_enabled": False}, b"x", "ingress-disabled", None, None),
        ({"max_messages": 0}, b"x", "over-quota", 0, 1),
        ({"max_bytes": 3}, b"four", "over-quota", 3, 4),
        ({"max_message_size": 3}, b"four", "too-large", 3, 4),
    ],
)
async def test_send_to_queue_rejections_store_nothing(
    data_dir: Path | None,
    settings: dict[str, object],
    payload: bytes,
    reason: str,
    limit: int | None,
    size: int | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", **settings)  # type: ignore[arg-type]
        s = node.connect()
        before = svc.store.statistics()
        with pytest.raises(PublishRejectedError) as info:
            await s.send_to_queue("q", payload)
        assert (info.value.reason, info.value.limit, info.value.size) == (reason, limit, size)
        assert svc.store.statistics() == before
        assert svc.store.endpoints() == []


async def test_send_to_an_unknown_queue_is_rejected(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        before = svc.store.statistics()
        with pytest.raises(PublishRejectedError) as info:
            await node.connect().send_to_queue("nope", b"x")
        assert info.value.reason == "no-such-queue"
        assert "nope" in str(info.value)
        assert svc.store.statistics() == before


# --- quotas ---------------------------------------------------------------------------------


async def test_max_messages_is_enforced_at_the_boundary_and_acks_free_room(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_messages=3)
        s = node.connect()
        for i in range(3):
            await s.send("t/x", str(i).encode())
        for attempt in (s.send("t/x", b"3"), s.send_to_queue("q", b"3")):
            with pytest.raises(PublishRejectedError) as info:
                await attempt
            assert (info.value.reason, info.value.limit, info.value.size) == ("over-quota", 3, 4)
        assert held(node, "q") == (3, 3)
        flow = await s.bind("q", window=3)
        m = await receive(flow)
        with pytest.raises(PublishRejectedError):  # delivered is not acked: still counts
            await s.send("t/x", b"3")
        flow.ack(m)  # acked, commit still pending: the room is free already
        await s.send("t/x", b"3")
        with pytest.raises(PublishRejectedError):
            await s.send_to_queue("q", b"4")
        await flow.unbind()
        assert held(node, "q") == (3, 3)


async def test_max_bytes_is_enforced_at_the_boundary_and_acks_free_room(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_bytes=10)
        s = node.connect()
        await s.send("t/x", b"1234")
        await s.send_to_queue("q", b"567890")  # exactly 10 bytes: taken
        with pytest.raises(PublishRejectedError) as info:
            await s.send("t/x", b"!")
        assert (info.value.reason, info.value.limit, info.value.size) == ("over-quota", 10, 11)
        await s.send("t/x", b"")  # an empty message takes no bytes
        assert held(node, "q") == (3, 10)
        async with await s.bind("q") as flow:
            flow.ack(await receive(flow))  # frees 4 bytes
            with pytest.raises(PublishRejectedError) as info:
                await s.send("t/x", b"12345")
            assert (info.value.limit, info.value.size) == (10, 11)
            await s.send("t/x", b"1234")
        assert held(node, "q") == (3, 10)


async def test_max_message_size_boundary(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_message_size=10)
        s = node.connect()
        await s.send("t/x", bytes(10))
        await s.send_to_queue("q", bytes(10))
        for attempt in (s.send("t/x", bytes(11)), s.send_to_queue("q", bytes(11))):
            with pytest.raises(PublishRejectedError) as info:
                await attempt
            assert (info.value.reason, info.value.limit, info.value.size) == ("too-large", 10, 11)
        assert held(node, "q") == (2, 20)


async def test_concurrent_publishers_cannot_overshoot_a_quota(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_messages=5)
        outcomes: list[str] = []

        async def publish(s: Session) -> None:
            try:
                await s.send("t/x", b"x")
                outcomes.append("ok")
            except PublishRejectedError as exc:
                outcomes.append(exc.reason)

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(publish, node.connect())
        assert sorted(outcomes) == ["ok"] * 5 + ["over-quota"] * 7
        assert held(node, "q") == (5, 5)


# --- direct messages matching a queue -----------------------------------------------------


async def test_direct_publish_matching_a_queue_is_spooled_non_persistent(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        q = svc.create_queue("q", subscriptions=["orders/>"])
        other = svc.create_queue("other", subscriptions=["orders/eu/>"])
        sub = node.connect()
        sub.subscribe("orders/>")
        pub = node.connect(client_name="pub")
        pub.publish("orders/eu/1", b"d1", headers={"x": 1})
        pub.publish("orders/us/2", b"d2")
        pub.publish("invoices/3", b"no")
        assert len(await drain(sub)) == 2  # direct subscribers as usual
        await spooled(q, 2)
        await spooled(other, 1)
        async with await pub.bind("q") as flow:
            for topic, payload in (("orders/eu/1", b"d1"), ("orders/us/2", b"d2")):
                m = await receive(flow)
                assert (m.topic, m.payload) == (topic, payload)
                assert m.delivery_mode is DeliveryMode.NON_PERSISTENT
                assert not m.redelivered
                assert m.message_id is not None
                flow.ack(m)
            await nothing_for(flow, 0.01)
        assert held(node, "q") == (0, 0)
        assert held(node, "other") == (1, 2)


async def test_a_queue_that_does_not_accept_direct_messages_takes_only_guaranteed_ones(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("link", subscriptions=["orders/>"], accept_direct=False)
        both = svc.create_queue("both", subscriptions=["orders/>"])
        pub = node.connect(client_name="pub")
        pub.publish("orders/1", b"direct")
        await pub.send("orders/2", b"guaranteed")
        await spooled(both, 2)
        assert held(node, "link") == (1, len(b"guaranteed"))


async def test_a_spooled_direct_message_always_carries_a_timestamp(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        q = service(node).create_queue("q", subscriptions=["t"])
        sub = node.connect()
        sub.subscribe("t")
        plain = node.connect(client_name="plain")
        stamping = node.connect(client_name="stamping", timestamps=True)
        before = time.time()
        plain.publish("t", b"plain")
        stamping.publish("t", b"stamping")
        after = time.time()
        direct = {m.payload: m.timestamp for m in await drain(sub)}
        assert direct[b"plain"] is None
        await spooled(q, 2)
        async with await plain.bind("q") as flow:
            first, second = await receive(flow), await receive(flow)
        # Unstamped: the time the node spooled it. Stamped: the publisher's own stamp.
        assert first.timestamp is not None
        assert before <= first.timestamp <= after
        assert second.timestamp == direct[b"stamping"]


async def test_direct_publish_over_quota_is_discarded_without_error(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        q = svc.create_queue("q", subscriptions=["t/>"], max_messages=2)
        pub = node.connect()
        for i in range(5):
            pub.publish("t/x", str(i).encode())  # no error for a direct publisher
        await spooled(q, 2)
        await anyio.sleep(0.01)
        assert held(node, "q") == (2, 2)
        assert q.discarded == 3
        async with await pub.bind("q") as flow:
            assert [(await receive(flow)).payload for _ in range(2)] == [b"0", b"1"]


async def test_direct_and_guaranteed_publishes_keep_their_order_in_a_queue(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        q = svc.create_queue("q", subscriptions=["t/>"])
        s = node.connect()
        s.publish("t/1", b"d1")
        await spooled(q, 1)
        await s.send("t/2", b"g2")
        s.publish("t/3", b"d3")
        await spooled(q, 3)
        async with await s.bind("q") as flow:
            got = [await receive(flow) for _ in range(3)]
        assert [(m.payload, m.delivery_mode) for m in got] == [
            (b"d1", DeliveryMode.NON_PERSISTENT),
            (b"g2", DeliveryMode.PERSISTENT),
            (b"d3", DeliveryMode.NON_PERSISTENT),
        ]


# --- send_many ------------------------------------------------------------------------------


async def test_send_many_returns_one_result_per_message_after_one_commit(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("a", subscriptions=["t/>"])
        svc.create_queue("b", subscriptions=["t/even/>"])
        s = node.connect()
        before = svc.store.statistics()
        batch = [(f"t/{'even' if i % 2 == 0 else 'odd'}/{i}", str(i).encode()) for i in range(10)]
        results = await s.send_many([*batch, ("nowhere", b"x")])
        assert results == [None] * 11
        after = svc.store.statistics()
        assert after.commits - before.commits == 1
        assert after.records - before.records == 10  # one stored copy each
        if isinstance(svc.store, SqliteStore):
            assert after.syncs - before.syncs == 1
        assert held(node, "a") == (10, 10)
        assert held(node, "b") == (5, 5)
        async with await s.bind("a", window=10) as flow:
            got = [await receive(flow) for _ in range(10)]
        assert [m.payload for m in got] == [p for _, p in batch]
        assert {m.delivery_mode for m in got} == {DeliveryMode.PERSISTENT}


async def test_send_many_rejects_only_the_messages_after_a_quota_is_reached(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_messages=3, max_message_size=5)
        s = node.connect()
        await s.send("t/0", b"0")
        before = svc.store.statistics()
        results = await s.send_many(
            [
                ("t/1", b"1"),
                ("t/big", b"123456"),  # too large for the queue
                ("#reserved", b"?"),  # invalid topic
                ("t/2", b"2"),  # the quota is reached here
                ("t/3", b"3"),
                ("elsewhere", b"4"),  # matches no queue: acked
            ],
            persistent=False,
        )
        assert results[0] is None
        assert isinstance(results[1], PublishRejectedError)
        assert (results[1].reason, results[1].limit, results[1].size) == ("too-large", 5, 6)
        assert isinstance(results[2], InvalidTopicError)
        assert results[3] is None
        assert isinstance(results[4], PublishRejectedError)
        assert (results[4].reason, results[4].limit, results[4].size) == ("over-quota", 3, 4)
        assert results[5] is None
        after = svc.store.statistics()
        assert after.commits - before.commits == 1
        assert after.records - before.records == 2
        assert held(node, "q") == (3, 3)
        async with await s.bind("q") as flow:
            got = [await receive(flow) for _ in range(3)]
        assert [(m.payload, m.delivery_mode) for m in got] == [
            (b"0", DeliveryMode.PERSISTENT),
            (b"1", DeliveryMode.NON_PERSISTENT),
            (b"2", DeliveryMode.NON_PERSISTENT),
        ]


async def test_send_many_with_nothing_to_store_makes_no_commit(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"], max_messages=0)
        s = node.connect()
        before = svc.store.statistics()
        assert await s.send_many([]) == []
        results = await s.send_many([("t/1", b"x"), ("u/1", b"y")])
        assert isinstance(results[0], PublishRejectedError)
        assert results[1] is None
        assert svc.store.statistics() == before


# --- who may send ---------------------------------------------------------------------------


async def test_sending_is_denied_when_the_client_profile_disallows_guaranteed_send(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"])
        vpn = node.vpn()
        vpn.add_client_profile(ClientProfile("direct-only", allow_guaranteed_send=False))
        vpn.add_user("dan", client_profile="direct-only")
        s = node.connect(username="dan")
        for attempt in (
            s.send("t/1", b"x"),
            s.send_to_queue("q", b"x"),
            s.send_many([("t/1", b"x")]),
        ):
            with pytest.raises(AccessDeniedError) as info:
                await attempt
            assert info.value.username == "dan"
        assert svc.store.endpoints() == []
        s.publish("t/1", b"direct")  # direct publishing is still allowed (and spooled)
        await spooled(svc.queue("q"), 1)


async def test_acl_denied_topics_are_refused_before_anything_is_stored() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=[">"])
        vpn = node.vpn()
        vpn.add_acl_profile(AclProfile("no-secrets", publish_exceptions=["secret/>"]))
        vpn.add_user("eve", acl_profile="no-secrets")
        s = node.connect(username="eve")
        with pytest.raises(AccessDeniedError):
            await s.send("secret/1", b"x")
        with pytest.raises(InvalidTopicError):
            await s.send("#system", b"x")
        results = await s.send_many([("secret/2", b"x"), ("open/1", b"y")])
        assert isinstance(results[0], AccessDeniedError)
        assert results[1] is None
        assert held(node, "q") == (1, 1)


async def test_send_to_queue_is_judged_by_the_publish_acl_as_its_queue_topic(
    data_dir: Path | None,
) -> None:
    # SPEC 4: a queue addressed by name is the reserved topic #P2P/QUE/<name> for the ACL.
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("alarms")
        svc.create_queue("orders")
        vpn = node.vpn()
        vpn.add_acl_profile(
            AclProfile(
                "plant-only",
                publish_default="deny",
                publish_exceptions=["plant/>"],
            )
        )
        vpn.add_user("sensor", acl_profile="plant-only")
        s = node.connect(username="sensor")
        with pytest.raises(AccessDeniedError) as info:
            await s.send_to_queue("alarms", b"x")
        assert (info.value.username, info.value.action) == ("sensor", "publish")
        assert info.value.topic == "#P2P/QUE/alarms"
        assert "#P2P/QUE/alarms" in str(info.value)
        assert s.statistics().denied == 1
        assert held(node, "alarms") == (0, 0)
        # Denied before the queue is looked up: a denied user learns nothing of the
        # queues there are.
        with pytest.raises(AccessDeniedError):
            await s.send_to_queue("no-such-queue", b"x")
        assert s.statistics().denied == 2
        assert node.vpn().statistics().denied == 2
        await s.send("plant/boiler", b"topics the ACL allows are still taken")
        with pytest.raises(AccessDeniedError):
            await s.send("alarms/x", b"x")
        assert held(node, "orders") == (0, 0)


async def test_a_queue_topic_exception_allows_sending_to_that_queue() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        svc.create_queue("alarms")
        svc.create_queue("orders")
        vpn = node.vpn()
        vpn.add_acl_profile(
            AclProfile("orders", publish_default="deny", publish_exceptions=["#P2P/QUE/orders"])
        )
        vpn.add_user("clerk", acl_profile="orders")
        s = node.connect(username="clerk")
        await s.send_to_queue("orders", b"allowed by its exception")
        assert held(node, "orders") == (1, 24)
        with pytest.raises(AccessDeniedError):
            await s.send_to_queue("alarms", b"x")
        with pytest.raises(AccessDeniedError):
            s.publish("orders", b"a topic named like the queue is not the queue")


async def test_queue_topic_exceptions_follow_the_default_and_the_variables() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = service(node)
        for name in ("inbox-ann", "inbox-bob", "audit"):
            svc.create_queue(name)
        vpn = node.vpn()
        vpn.add_acl_profile(
            AclProfile(
                "own-inbox",
                publish_exceptions=["#P2P/QUE/inbox-*", "#P2P/QUE/audit"],
                subscribe_default="allow",
            )
        )
        vpn.add_acl_profile(
            AclProfile(
                "inbox-only",
                publish_default="deny",
                publish_exceptions=["#P2P/QUE/inbox-$client-username"],
            )
        )
        vpn.add_user("mallory", acl_profile="own-inbox")
        vpn.add_user("ann", acl_profile="inbox-only")
        mallory = node.connect(username="mallory")
        for queue in ("inbox-ann", "audit"):  # default allow: the exceptions are denied
            with pytest.raises(AccessDeniedError):
                await mallory.send_to_queue(queue, b"x")
        mallory.publish("inbox-ann/x")  # an ordinary topic is not a queue topic
        ann = node.connect(username="ann")
        await ann.send_to_queue("inbox-ann", b"to myself")
        with pytest.raises(AccessDeniedError):
            await ann.send_to_queue("inbox-bob", b"x")
        assert held(node, "inbox-ann") == (1, 9)
        assert held(node, "inbox-bob") == (0, 0)


async def test_send_without_the_guaranteed_plugin_raises_configuration_error() -> None:
    async with Node(plugins=["direct"]) as node:
        s = node.connect()
        for attempt in (
            s.send("t/1", b"x"),
            s.send_to_queue("q", b"x"),
            s.send_many([("t/1", b"x")]),
        ):
            with pytest.raises(ConfigurationError, match="guaranteed"):
                await attempt


async def test_send_on_a_closed_session_raises_state_error(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["t/>"])
        s = node.connect()
        await s.send("t/1", b"warm the topic cache")
        s.close()
        for attempt in (s.send("t/1", b"x"), s.send_to_queue("q", b"x"), s.send_many([])):
            with pytest.raises(StateError):
                await attempt
        assert held(node, "q") == (1, 20)


# --- known gaps (reported; strict so that a fix shows up) ----------------------------------


async def test_queue_consumers_see_sender_reply_to_and_correlation_id(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        service(node).create_queue("q", subscriptions=["t/>"])
        s = node.connect(client_name="requester")
        await s.send("t/1", b"x", reply_to="replies/1", correlation_id="c1", headers={"k": 1})
        await s.send_to_queue("q", b"y", correlation_id="c2")
        s.publish("t/2", b"z", reply_to="replies/2")  # direct, spooled as non-persistent
        async with await s.bind("q") as flow:
            got = [await receive(flow) for _ in range(3)]
        assert [(m.sender, m.reply_to, m.correlation_id, dict(m.headers)) for m in got] == [
            ("requester", "replies/1", "c1", {"k": 1}),  # the reserved header is not shown
            ("requester", None, "c2", {}),
            ("requester", "replies/2", None, {}),
        ]


async def test_an_invalid_ttl_is_rejected_and_nothing_is_stored() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q", subscriptions=["t/>"])
        s = node.connect()
        for ttl in (-1, float("nan"), float("inf"), "10", True):
            with pytest.raises(PublishRejectedError) as info:
                await s.send("t/1", b"x", ttl=ttl)  # type: ignore[arg-type]
            assert info.value.reason == "invalid-ttl"
        assert held(node, "q") == (0, 0)


async def test_a_message_a_queue_took_is_not_counted_unmatched() -> None:
    async with Node(plugins=PLUGINS) as node:
        service(node).create_queue("q", subscriptions=["t/>"])
        s = node.connect()
        await s.send("t/1", b"held by the queue")
        await s.send_many([("t/2", b"also held")])
        assert node.vpn().statistics().unmatched == 0
        await s.send("nowhere/1", b"no queue, no subscriber")
        assert node.vpn().statistics().unmatched == 1


async def test_a_failing_store_discards_spooled_direct_messages_but_the_node_lives(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Node(plugins=PLUGINS) as node:
        q = service(node).create_queue("q", subscriptions=["t/>"])
        store = q.store
        real_put_many = store.put_many

        async def broken(messages: object) -> list[int]:
            raise SpoolError("disk on fire")

        store.put_many = broken  # type: ignore[method-assign]
        s = node.connect()
        s.publish("t/1", b"lost, as a direct message may be")
        with anyio.fail_after(2):
            while q.discarded == 0:
                await anyio.sleep(0.001)
        store.put_many = real_put_many  # type: ignore[method-assign]
        s.publish("t/2", b"spooled again")
        async with await s.bind("q") as flow:
            assert (await receive(flow)).payload == b"spooled again"
        assert "spooling 1 direct message(s) failed" in caplog.text


async def test_one_message_in_flight_costs_one_synced_commit(tmp_path: Path) -> None:
    # A consumer waits with room: the put writes the delivery mark, so the flow's
    # mark_delivered needs no commit of its own (before: two fsyncs per message).
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["orders/>"])
        svc.create_queue("busy", subscriptions=["orders/>"])  # nobody consumes it
        s = node.connect()
        async with await s.bind("q", window=4) as flow:
            await anyio.wait_all_tasks_blocked()
            before = svc.store.statistics().syncs
            for n in range(10):
                await s.send("orders/1", b"%d" % n)
                message = await flow.receive()
                assert (message.payload, message.redelivered) == (b"%d" % n, False)
                flow.ack(message)
            assert svc.store.statistics().syncs - before == 10
        assert svc.store._premarked == set()  # q's are marked; busy's were never premarked
        assert held(node, "busy") == (10, 10)
