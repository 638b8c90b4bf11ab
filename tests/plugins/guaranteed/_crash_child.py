"""Child process of test_crash: publish, consume and log until killed.

Usage: python _crash_child.py DB LOG BACKEND TRIAL

Every line goes to LOG with its own write() right after the call it reports has
returned, so whatever the log shows was acknowledged by the store before the kill:

    P <id> <task> <seq> <persistent>   put returned (message for q1 and q2)
    M <id> <id>...                     mark_delivered on q1 returned
    A <id> <id>...                     ack on q2 returned
"""

from __future__ import annotations

import hashlib
import math
import sys

import anyio
from anyio.abc import ObjectReceiveStream

from meshbus.plugins.guaranteed._sqlite import SqliteStore
from meshbus.plugins.guaranteed._store import NewMessage

PUBLISHERS = 6


def payload_for(trial: int, task: int, seq: int) -> bytes:
    """Deterministic, 32 bytes to ~2.5 KB (several rows share a page, some overflow it)."""
    digest = hashlib.sha256(f"{trial}/{task}/{seq}".encode()).digest()
    return digest * (1 + (seq * 7 + task) % 80)


def message_for(trial: int, task: int, seq: int) -> NewMessage:
    return NewMessage(
        f"crash/{task}",
        payload_for(trial, task, seq),
        ["q1", "q2"],
        {"trial": trial, "task": task, "seq": seq},
        persistent=seq % 10 != 9,  # non-persistent ones must survive a process crash too
    )


async def main(path: str, log_path: str, trial: int) -> None:
    with open(log_path, "w", buffering=1) as log:  # line-buffered: one write() per line
        async with SqliteStore(path, "full") as store:
            log.write("ready\n")
            send, receive = anyio.create_memory_object_stream[int](math.inf)

            async def publish(task: int) -> None:
                seq = 0
                while True:
                    if seq % 4 == 3:  # now and then a batch of three in one call
                        batch = [message_for(trial, task, seq + i) for i in range(3)]
                        ids = await store.put_many(batch)
                    else:
                        m = message_for(trial, task, seq)
                        batch = [m]
                        ids = [
                            await store.put(
                                m.topic,
                                m.payload,
                                endpoints=m.endpoints,
                                headers=m.headers,
                                persistent=m.persistent,
                            )
                        ]
                    for i, message_id in enumerate(ids):
                        persistent = int(batch[i].persistent)
                        log.write(f"P {message_id} {task} {seq + i} {persistent}\n")
                        send.send_nowait(message_id)
                    seq += len(batch)

            async def consume(ids: ObjectReceiveStream[int]) -> None:
                while True:
                    batch = [await ids.receive()]
                    while len(batch) < 8:
                        try:
                            batch.append(ids.receive_nowait())
                        except anyio.WouldBlock:
                            break
                    await store.mark_delivered("q1", batch)
                    log.write("M " + " ".join(map(str, batch)) + "\n")
                    await store.ack("q2", batch)
                    log.write("A " + " ".join(map(str, batch)) + "\n")

            async with anyio.create_task_group() as tg:
                for task in range(PUBLISHERS):
                    tg.start_soon(publish, task)
                tg.start_soon(consume, receive)


if __name__ == "__main__":
    db, log_file, backend, trial_number = sys.argv[1:]
    anyio.run(main, db, log_file, int(trial_number), backend=backend)
