"""Guaranteed messaging: a durable queue that survives a restart (SPEC 4).

An order service publishes orders as guaranteed messages; the publish returns only
once the spool holds them on disk. A consumer takes two and acknowledges one, then
the node "crashes" (stops without the consumer acking the other). After the restart
everything the spool acknowledged is still there: the order the worker held comes back
flagged ``redelivered=True`` (so the worker knows it may have seen it), the ones that
never reached the worker come back unflagged.

Run it with ``python examples/guaranteed_orders.py``.
"""

from __future__ import annotations

import tempfile

import anyio

from meshbus import Node, PublishRejectedError


async def first_run(data_dir: str) -> None:
    async with Node(data_dir=data_dir) as node:
        node.guaranteed.create_queue("orders", subscriptions=["orders/>"], max_messages=4)
        shop = node.connect(client_name="shop")
        for i in range(1, 5):
            await shop.send(f"orders/eu/{i}", f"order {i}")  # returns once on disk
        print("published 4 orders; the queue holds at most 4")
        try:
            await shop.send("orders/eu/5", b"order 5")
        except PublishRejectedError as exc:
            print(f"order 5 rejected to the publisher: {exc.reason} (limit {exc.limit})")

        worker = node.connect(client_name="worker")
        # A window of 2: at most two orders are out with the worker at a time.
        async with await worker.bind("orders", window=2) as flow:
            done = await flow.receive()
            flow.ack(done)
            print(f"worker acknowledged {done.payload.decode()}")
            taken = await flow.receive()
            print(f"worker took {taken.payload.decode()} and stopped before acknowledging it")


async def after_restart(data_dir: str) -> None:
    async with Node(data_dir=data_dir) as node:
        node.guaranteed.create_queue("orders", subscriptions=["orders/>"], max_messages=4)
        worker = node.connect(client_name="worker")
        async with await worker.bind("orders") as flow:
            for _ in range(3):
                message = await flow.receive()
                print(
                    f"after restart: {message.payload.decode()} "
                    f"redelivered={message.redelivered} mode={message.delivery_mode.value}"
                )
                flow.ack(message)


async def main() -> None:
    with tempfile.TemporaryDirectory() as data_dir:
        await first_run(data_dir)
        await after_restart(data_dir)


if __name__ == "__main__":
    anyio.run(main)
