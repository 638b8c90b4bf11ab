"""Administering a running queue: purge it, switch its ingress and egress."""

from __future__ import annotations

from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from meshbus import ConfigurationError, Node, PublishRejectedError, StateError

from ._helpers import PLUGINS, service


async def test_purge_deletes_every_message_and_ignores_acks_of_those_in_flight(
    data_dir: Path | None,
) -> None:
    async with Node(plugins=PLUGINS, data_dir=data_dir) as node:
        svc = service(node)
        svc.create_queue("q", subscriptions=["a/>"])
        s = node.connect()
        for n in range(5):
            await s.send("a/x", b"m%d" % n)
        flow = await s.bind("q", window=3)
        held = await flow.receive()  # handed out, not acked; two more prefetched

        assert await svc.purge_queue("q") == 5
        (stats,) = svc.queue_statistics("default")
        assert (stats.messages, stats.bytes, stats.in_flight, stats.flows) == (0, 0, 0, 1)
        flow.ack(held)  # purged while held: accepted, nothing to do

        await s.send("a/x", b"after")  # the queue and its flow go on
        message = await flow.receive()
        assert (message.payload, message.redelivered) == (b"after", False)
        flow.ack(message)
        await flow.unbind()  # nothing purged comes back: the queue holds nothing
        assert svc.queue_statistics()[0].messages == 0
        assert svc.store.stats("default/q").messages == 0
        await svc.store.check()
        with pytest.raises(StateError, match="no queue 'nothing'"):
            await svc.purge_queue("nothing")


async def test_entries_given_back_by_an_unbound_flow_stay_purged() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = node.guaranteed
        svc.create_queue("q", subscriptions=["a/>"])
        s = node.connect()
        await s.send("a/x", b"old")
        flow = await s.bind("q", window=2)
        await flow.receive()
        await svc.purge_queue("q")
        await flow.unbind()  # what it held does not go back to the queue
        assert svc.queue_statistics()[0].messages == 0
        await s.send("a/x", b"new")
        other = await s.bind("q")
        assert (await other.receive()).payload == b"new"


async def test_ingress_off_refuses_messages_and_on_takes_them_again() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = node.guaranteed
        svc.create_queue("q")
        s = node.connect()
        svc.enable_queue("q", ingress=False)
        with pytest.raises(PublishRejectedError) as refused:
            await s.send_to_queue("q", b"x")
        assert refused.value.reason == "ingress-disabled"
        (stats,) = svc.queue_statistics()
        assert (stats.ingress_enabled, stats.egress_enabled) == (False, True)
        svc.enable_queue("q", ingress=True)
        await s.send_to_queue("q", b"x")
        assert svc.queue_statistics()[0].messages == 1


async def test_egress_off_holds_back_bound_flows_until_it_is_on_again() -> None:
    async with Node(plugins=PLUGINS) as node:
        svc = node.guaranteed
        svc.create_queue("q")
        s = node.connect()
        flow = await s.bind("q", window=1)
        svc.enable_queue("q", egress=False)
        await s.send_to_queue("q", b"held back")
        received: list[bytes] = []

        async def consume() -> None:
            received.append((await flow.receive()).payload)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await anyio.wait_all_tasks_blocked()
            assert received == []
            with pytest.raises(StateError, match="egress disabled"):
                await s.bind("q")  # no new flow while it is off
            svc.enable_queue("q", egress=True)
        assert received == [b"held back"]
        assert svc.queue_statistics()[0].egress_enabled is True


async def test_enable_queue_takes_booleans_only() -> None:
    async with Node(plugins=PLUGINS) as node:
        node.guaranteed.create_queue("q")
        with pytest.raises(ConfigurationError, match="ingress_enabled"):
            node.guaranteed.enable_queue("q", ingress="no")  # type: ignore[arg-type]
        with pytest.raises(StateError):
            node.guaranteed.enable_queue("missing", egress=True)


@pytest.mark.parametrize("durable", [False, True])
async def test_direct_messages_on_their_way_to_a_deleted_queue_do_not_outlive_it(
    tmp_path: Path, durable: bool
) -> None:
    """Direct messages matching a queue wait a moment to be spooled together; a queue
    deleted meanwhile must not get them in the store, where a new queue of the same
    name found them (an MQTT client's next session got an old session's messages)."""
    async with Node(name="a", data_dir=tmp_path if durable else None) as node:
        guaranteed = node.guaranteed
        guaranteed.create_queue("q", subscriptions=["u/>"])
        session = node.connect()
        session.publish("u/a", b"1")
        await anyio.lowlevel.checkpoint()
        session.publish("u/a", b"2")
        await guaranteed.delete_queue("q")
        for _ in range(20):  # let the spooling of what was on its way finish
            await anyio.lowlevel.checkpoint()
        again = guaranteed.create_queue("q")
        assert again.usage() == (0, 0)
