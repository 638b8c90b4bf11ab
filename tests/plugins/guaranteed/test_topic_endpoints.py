"""Topic endpoints: the consumer names the subscription at bind (SPEC 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    ConfigurationError,
    InvalidTopicError,
    Node,
    PublishRejectedError,
    StateError,
)

from ._helpers import receive

PLUGINS = ["direct", "guaranteed"]


async def test_spools_only_once_a_consumer_named_the_subscription(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        te = node.guaranteed.create_topic_endpoint("prices")
        s = node.connect()
        await s.send("px/1", b"before")  # no subscription yet: nowhere to spool
        assert te.store.stats(te.endpoint).messages == 0
        async with await s.bind_topic_endpoint("prices", "px/>") as flow:
            await s.send("px/2", b"bound")
            await s.send("other/1", b"not matching")
            message = await receive(flow)
            assert message.payload == b"bound"
            flow.ack(message)
        await s.send("px/3", b"while unbound")  # a durable subscription keeps spooling
        assert te.store.stats(te.endpoint).messages == 1
        async with await s.bind_topic_endpoint("prices", "px/>") as flow:
            message = await receive(flow)
            assert (message.payload, message.redelivered) == (b"while unbound", False)
            flow.ack(message)


async def test_a_new_subscription_purges_what_the_old_one_spooled(data_dir: Path | None) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        te = node.guaranteed.create_topic_endpoint("te")
        s = node.connect()
        async with await s.bind_topic_endpoint("te", "a/>"):
            pass
        await s.send("a/1", b"old stream")
        assert te.store.stats(te.endpoint).messages == 1
        async with await s.bind_topic_endpoint("te", "b/>") as flow:
            assert te.store.stats(te.endpoint).messages == 0
            await s.send("a/2", b"old topic: not attracted now")
            await s.send("b/1", b"new stream")
            message = await receive(flow)
            assert message.payload == b"new stream"
            flow.ack(message)
        assert te.subscription == "b/>"


async def test_the_subscription_cannot_change_while_a_flow_is_bound() -> None:
    async with Node(plugins=PLUGINS) as node:
        node.guaranteed.create_topic_endpoint("te")
        a, b = node.connect(), node.connect()
        async with await a.bind_topic_endpoint("te", "a/>"):
            with pytest.raises(StateError, match="cannot change while a flow is bound"):
                await b.bind_topic_endpoint("te", "b/>")
            standby = await b.bind_topic_endpoint("te", "a/>")  # same subscription: fine
            await standby.unbind()


async def test_the_subscription_survives_a_restart(tmp_path: Path) -> None:
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        node.guaranteed.create_topic_endpoint("te")
        s = node.connect()
        async with await s.bind_topic_endpoint("te", "a/>"):
            pass
        await s.send("a/1", b"spooled before the restart")
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        node.guaranteed.create_topic_endpoint("te")
        s = node.connect()
        await s.send("a/2", b"spooled before any bind")  # the saved subscription applies
        async with await s.bind_topic_endpoint("te", "a/>") as flow:
            got = [await receive(flow) for _ in range(2)]
            for message in got:
                flow.ack(message)
        assert [m.payload for m in got] == [
            b"spooled before the restart",
            b"spooled before any bind",
        ]


async def test_discards_instead_of_rejecting_by_default() -> None:
    async with Node(plugins=PLUGINS) as node:
        te = node.guaranteed.create_topic_endpoint("te", max_messages=1)
        q = node.guaranteed.create_queue("q", subscriptions=["a/>"])
        s = node.connect()
        async with await s.bind_topic_endpoint("te", "a/>"):
            pass
        await s.send("a/1", b"fits")
        await s.send("a/2", b"over the endpoint's quota: not rejected")
        assert te.discarded == 1
        assert q.store.stats(q.endpoint).messages == 2  # the queue still got both
        strict = node.guaranteed.create_topic_endpoint(
            "strict", max_messages=0, reject_msg_to_sender_on_discard=True
        )
        async with await s.bind_topic_endpoint("strict", "b/>"):
            pass
        with pytest.raises(PublishRejectedError) as info:
            await s.send("b/1", b"x")
        assert info.value.reason == "over-quota"
        assert strict.store.stats(strict.endpoint).messages == 0


async def test_bad_binds_and_settings_are_refused_with_typed_errors() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = node.guaranteed
        with pytest.raises(ConfigurationError, match="given by the consumer"):
            svc.create_topic_endpoint("te", subscriptions=["a"])
        svc.create_topic_endpoint("te")
        vpn = node.vpn()
        vpn.add_acl_profile(
            AclProfile("limited", subscribe_default="deny", subscribe_exceptions=["ok/>"])
        )
        vpn.add_user("limited", acl_profile="limited")
        s = node.connect(username="limited")
        with pytest.raises(InvalidTopicError, match="not allowed on queues"):
            await s.bind_topic_endpoint("te", "#share/g/ok/>")
        with pytest.raises(AccessDeniedError):
            await s.bind_topic_endpoint("te", "secret/>")
        with pytest.raises(StateError, match="no topic endpoint"):
            await s.bind_topic_endpoint("nope", "ok/>")
        with pytest.raises(PublishRejectedError) as info:  # not a queue: not addressable
            await s.send_to_queue("#te/te", b"x")
        assert info.value.reason == "no-such-queue"
        assert svc.topic_endpoint("te").subscription is None  # nothing was applied
        flow = await s.bind_topic_endpoint("te", "ok/>")
        await flow.unbind()


async def test_deleting_forgets_messages_and_subscription(tmp_path: Path) -> None:
    async with Node(plugins=PLUGINS, data_dir=tmp_path) as node:
        svc = node.guaranteed
        te = svc.create_topic_endpoint("te")
        s = node.connect()
        async with await s.bind_topic_endpoint("te", "a/>"):
            pass
        await s.send("a/1", b"x")
        await svc.delete_topic_endpoint("te")
        assert te.store.stats(te.endpoint).messages == 0
        await s.send("a/2", b"nobody spools this")
        again = svc.create_topic_endpoint("te")
        assert again.subscription is None
        assert again.store.stats(again.endpoint).messages == 0
