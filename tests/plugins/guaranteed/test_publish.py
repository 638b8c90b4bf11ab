"""Publishing guaranteed messages (SPEC 4): to topics, to queues by name, direct
messages a queue spools, in batches. What the node refuses (a queue that cannot take
a message, quotas, who may send) is in test_publish_refused.py.

Storage matters for every rule here, so each test runs on the MemoryStore (a node
without ``data_dir``) and on the SqliteStore (``Node(data_dir=...)``).
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from meshbus import (
    ConfigurationError,
    DeliveryMode,
    InvalidTopicError,
    Node,
    PublishRejectedError,
    SpoolError,
)
from meshbus.plugins.guaranteed._sqlite import SqliteStore

from ._helpers import PLUGINS, drain, held, nothing_for, receive, service, spooled

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
        s = node.connect(client_name="batcher")
        before = svc.store.statistics()
        batch = [(f"t/{'even' if i % 2 == 0 else 'odd'}/{i}", str(i).encode()) for i in range(10)]
        results = await s.send_many([*batch, ("nowhere", b"x")], headers={"k": "v"})
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
        # each keeps the batch's headers and sender, and an origin of its own
        assert all((m.headers, m.sender) == ({"k": "v"}, "batcher") for m in got)
        assert len({m.origin for m in got}) == 10
        assert None not in {m.origin for m in got}


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
        # send_many counts the same way, one per message nothing took
        await s.send_many([("nowhere/2", b"x"), ("t/3", b"held"), ("nowhere/3", b"y")])
        assert node.vpn().statistics().unmatched == 3
        # ... and so do both when a subscriber elsewhere has the direct router routing
        node.connect().subscribe("elsewhere/>")
        await s.send("nowhere/4", b"z")
        await s.send_many([("nowhere/5", b"x"), ("t/4", b"held")])
        assert node.vpn().statistics().unmatched == 5


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


async def test_a_batch_a_consumer_has_room_for_costs_one_synced_commit(tmp_path: Path) -> None:
    # send_many marks as delivered in its put as many messages as the waiting consumer
    # has room for (as send does for one), and no more: the rest wait, unmarked.
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["orders/>"])
        s = node.connect()
        async with await s.bind("q", window=4) as flow:
            await anyio.wait_all_tasks_blocked()
            before = svc.store.statistics().syncs
            ids = await s.send_many([("orders/1", b"%d" % n) for n in range(4)])
            assert ids == [None] * 4
            with anyio.fail_after(5):
                got = [await flow.receive() for _ in range(4)]
            assert [m.payload for m in got] == [b"0", b"1", b"2", b"3"]
            assert svc.store.statistics().syncs - before == 1  # the put; no mark of its own
            for m in got:
                flow.ack(m)
            await anyio.wait_all_tasks_blocked()
            await s.send_many([("orders/2", b"%d" % n) for n in range(6)])
            assert len(svc.store._premarked) == 4  # the room of the window, not the batch
            for n in range(6):
                with anyio.fail_after(5):
                    message = await flow.receive()
                assert (message.payload, message.redelivered) == (b"%d" % n, False)
                flow.ack(message)
        assert svc.store._premarked == set()
