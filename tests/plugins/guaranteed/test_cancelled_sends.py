"""A guaranteed send whose caller is cancelled: before its commit starts it is withdrawn
and nothing happened; once its commit has started it counts, and then it counts whole
(SPEC 4 and 12): its queues hold it, the matching client subscriptions get their direct
copy, and a retained value is kept. The cancellation reaches the caller afterwards."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from meshbus import Message, Node, Session

from .test_sqlite import worker_held

pytestmark = pytest.mark.anyio


def drain(session: Session) -> list[Message]:
    return list(iter(session.receive_nowait, None))


@dataclasses.dataclass
class Senders:
    """A node with queue ``q`` and a client subscription on ``t/>``, and two sends
    (``send(n)`` sends ``b"n"`` to ``t/a``) each in its own cancel scope."""

    node: Node
    queue: Any
    watcher: Session
    scopes: list[anyio.CancelScope]
    send: Callable[[int], Awaitable[None]]


@contextlib.asynccontextmanager
async def two_senders(tmp_path: Path, retain: Callable[[int], bool]) -> AsyncIterator[Senders]:
    async with Node(data_dir=tmp_path) as node:
        queue = node.guaranteed.create_queue("q", subscriptions=["t/>"])
        watcher = node.connect(client_name="watcher")
        watcher.subscribe("t/>")
        sender = node.connect(client_name="sender")
        scopes = [anyio.CancelScope(), anyio.CancelScope()]

        async def send(n: int) -> None:
            with scopes[n]:
                await sender.send("t/a", b"%d" % n, retain=retain(n))

        yield Senders(node, queue, watcher, scopes, send)


@pytest.mark.parametrize("retain", [False, True], ids=["plain", "retained"])
async def test_a_send_cancelled_once_its_commit_started_is_a_whole_publish(
    tmp_path: Path, retain: bool
) -> None:
    async with two_senders(tmp_path, lambda n: retain and n == 1) as run:
        node, queue, watcher, scopes, send = run.node, run.queue, run.watcher, run.scopes, run.send
        store = node.guaranteed.store
        async with anyio.create_task_group() as tg, worker_held(store):
            tg.start_soon(send, 0)  # leads, and takes 1 into its commit
            tg.start_soon(send, 1)
            await anyio.wait_all_tasks_blocked()
            assert store._inflight is not None
            assert len(store._inflight.tickets) == 2  # the commit of both has started
            scopes[1].cancel()
            await anyio.wait_all_tasks_blocked()
        assert queue.usage()[0] == 2
        assert sorted(m.payload for m in drain(watcher)) == [b"0", b"1"]
        late = node.connect(client_name="late")
        late.subscribe("t/>")
        assert [(m.payload, m.retain) for m in drain(late)] == [(b"1", True)] * retain


async def test_a_send_cancelled_before_its_commit_started_changes_nothing(
    tmp_path: Path,
) -> None:
    async with two_senders(tmp_path, lambda n: True) as run:
        node, queue, watcher, scopes, send = run.node, run.queue, run.watcher, run.scopes, run.send
        store = node.guaranteed.store
        async with anyio.create_task_group() as tg, worker_held(store):
            tg.start_soon(send, 0)  # leads; its commit waits for the worker
            await anyio.wait_all_tasks_blocked()
            tg.start_soon(send, 1)  # waits for the next commit
            await anyio.wait_all_tasks_blocked()
            scopes[1].cancel()
            await anyio.wait_all_tasks_blocked()
        assert queue.usage()[0] == 1
        assert [m.payload for m in drain(watcher)] == [b"0"]
        late = node.connect(client_name="late")
        late.subscribe("t/>")
        assert [m.payload for m in drain(late)] == [b"0"]
