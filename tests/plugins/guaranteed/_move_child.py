"""Child process of test_dmq_move: move messages to a dead message queue until killed.

Usage: python _move_child.py DB COUNT

Stores COUNT messages for endpoint ``q`` (payload ``b"m<n>"``), prints ``READY``,
then moves them one by one (a few concurrent movers, so moves share commits) to
``dmq`` with :meth:`SqliteStore.put_and_ack`, as the guaranteed plugin's dead
message path does, printing ``DONE`` if it gets to the end before the kill.
"""

from __future__ import annotations

import sys

import anyio

from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._store import NewMessage

MOVERS = 4


async def main(path: str, count: int) -> None:
    async with SqliteStore(path) as store:
        await store.put_many([NewMessage("t", b"m%d" % n, ("q",)) for n in range(count)])
        entries = await store.read("q", 0, count)
        print("READY", flush=True)

        async def mover(first: int) -> None:
            for entry in entries[first::MOVERS]:
                message = entry.message
                await store.put_and_ack(
                    [NewMessage(message.topic, message.payload, ("dmq",))], "q", [message.id]
                )

        async with anyio.create_task_group() as tg:
            for first in range(MOVERS):
                tg.start_soon(mover, first)
        print("DONE", flush=True)


if __name__ == "__main__":
    anyio.run(main, sys.argv[1], int(sys.argv[2]))
