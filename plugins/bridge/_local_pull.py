"""Guaranteed messages over a bridge between two VPNs of one node (SPEC 7).

A same-node bridge with ``queues`` binds a flow, in the other VPN, to each of those
queues, as a bridge to another node binds one over its connection. What the flow
delivers crosses the bridge's link as a wire link's pulled messages do: through the
far end's outgoing stages (the hop count goes up), then spooled to every matching
endpoint of this VPN, those that arrived together in one commit; each is acknowledged
on the flow once held. One an endpoint refuses is offered again every
``retry_interval`` seconds, holding up that flow only.
"""

from __future__ import annotations

from collections import deque

import anyio

from meshbus import LocalLink, MeshbusError, Message
from meshbus.abc import Flow

__all__ = ["pull_local"]


async def pull_local(
    near: LocalLink, far: LocalLink, queue: str, window: int, retry_interval: float = 1.0
) -> None:
    """Move the guaranteed messages of ``far``'s VPN's ``queue`` into ``near``'s VPN until
    cancelled (the bridge stops); a flow that cannot be bound is tried again."""
    clock = near.vpn.node.clock
    # The node's own session, whatever the far VPN's authentication.
    name = f"pull:{near.name}:{queue}".replace("/", ":")
    while True:
        session = None
        try:
            session = far.vpn.open_internal_session(name)
            flow = await session.bind(queue, window=window)
        except MeshbusError as exc:
            near.reason = f"cannot bind a flow to queue {queue!r}: {exc}"
            if session is not None:
                session.close()
            await clock.sleep_until(clock.monotonic() + retry_interval)
            continue
        try:
            await _Pull(near, far, flow).run(retry_interval)
        finally:
            session.close()


class _Pull:
    """One flow's messages on their way across: received, then spooled in order."""

    def __init__(self, near: LocalLink, far: LocalLink, flow: Flow) -> None:
        self.near = near
        self.far = far
        self.flow = flow
        self.waiting: deque[tuple[Message, Message]] = deque()  # (on the flow, crossing)
        self.arrived = anyio.Event()

    async def run(self, retry_interval: float) -> None:
        clock = self.near.vpn.node.clock
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._receive)
            while True:
                if not self.waiting:
                    self.arrived = anyio.Event()
                    await self.arrived.wait()
                    continue
                if await self._spool():
                    await clock.sleep_until(clock.monotonic() + retry_interval)

    async def _receive(self) -> None:
        async for message in self.flow:
            crossing = self.far.outgoing(message)  # the far end's stages: hop count + 1
            if crossing is None:
                self.flow.ack(message)  # stopped on its way out (counted there): settled
                continue
            self.waiting.append((message, crossing))
            self.arrived.set()

    async def _spool(self) -> bool:
        """Spool what waits, in order, acknowledging on the flow what was taken and
        keeping the rest waiting; return whether one was refused."""
        waiting = self.waiting
        batch = list(waiting)
        for _ in batch:
            waiting.popleft()
        crossing = [message for _, message in batch]
        try:
            taken, refusal = await self.near.receive_guaranteed_many(crossing)
        except MeshbusError:
            taken, refused = [], True
        else:
            refused = refusal is not None
        kept = set(taken)
        for i, (message, _) in enumerate(batch):
            if i in kept:
                self.flow.ack(message)
                self.far.settled(message)
        waiting.extendleft(reversed([entry for i, entry in enumerate(batch) if i not in kept]))
        return refused
