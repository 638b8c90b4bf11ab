"""Child process of test_crash's node test: publish and consume guaranteed messages.

Usage: python crash_child.py DATA_DIR BACKEND TRIAL [drain | single]

Runs a :class:`meshbus.Node` with ``data_dir=DATA_DIR`` and one queue ``q``
(subscribed to ``orders/>``). Two publishers send sequence-numbered messages, one with
``send_many`` (batches of 1 to 16), one with ``send``; a consumer bound to ``q``
receives, holds a few messages unacknowledged, then acks them. It runs until the
parent kills it. With ``drain`` it publishes nothing, consumes until the queue has
been idle for a moment, and exits cleanly. With ``single`` only the ``send`` publisher
runs, with one message in flight: it sends the next once the consumer acked the last
(the path where the delivery mark is written with the put).

Every line is written and flushed right after the call it reports returned, so what
the log shows had happened before the kill:

    READY                    the node runs, the flow is bound
    SEND <first> <last>      a publisher is about to send seqs first, first+2, ..., last
    PUB <seq>                the publisher's ack for seq returned
    GOT <seq> <0|1>          flow.receive() returned seq (1: flagged redelivered)
    ACK <seq>                flow.ack() returned for seq
    BAD <seq> <why>          a received message is not what was published
    LEFT <n>                 (drain) messages the store still holds for q after unbind
    CHECK ok | CHECK <error> (drain) the store's consistency check
    DONE                     (drain) the node stopped cleanly

Publisher ``p`` (0 or 1) sends seqs ``TRIAL * 1_000_000 + 2 * n + p``: unique over all
trials, increasing per publisher, and ``seq % 2`` names the publisher.
"""

from __future__ import annotations

import random
import sys

import anyio

from meshbus import Message, Node

QUEUE = "q"
BACKLOG = 300  # publishers pause while the queue holds more than this
SELF_DESTRUCT = 30.0  # seconds: a child the parent forgot does not run forever


def payload_for(seq: int) -> bytes:
    """Deterministic, 12 to ~200 bytes, so a mixed-up or torn payload is noticed."""
    return f"{seq}:".encode() + bytes((seq + i) % 251 for i in range(seq % 190))


def topic_for(seq: int) -> str:
    return f"orders/{seq % 2}"


def emit(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def seq_of(message: Message) -> tuple[int, str | None]:
    """The message's seq, and what is wrong with it (``None`` if nothing)."""
    head, _, _ = message.payload.partition(b":")
    try:
        seq = int(head)
    except ValueError:
        return -1, f"payload {message.payload[:30]!r}"
    if message.payload != payload_for(seq):
        return seq, "payload differs"
    if message.topic != topic_for(seq):
        return seq, f"topic {message.topic!r}"
    if message.destination != QUEUE:
        return seq, f"destination {message.destination!r}"
    return seq, None


async def main(data_dir: str, trial: int, mode: str) -> None:
    rng = random.Random(trial)
    drain = mode == "drain"
    single = mode == "single"
    turn = anyio.Semaphore(1)  # single: the publisher's turn, given back by each ack
    async with Node(plugins=["direct", "guaranteed"], data_dir=data_dir) as node:
        service = node.guaranteed
        queue = service.create_queue(QUEUE, subscriptions=["orders/>"])
        store = service.store
        session = node.connect()
        window = 1 if single else rng.choice((1, 4, 16, 64))
        flow = await session.bind(QUEUE, window=window)
        emit("READY\n")

        def backlog() -> int:
            return int(store.stats(queue.endpoint).messages)

        async def publish_many() -> None:
            seq = trial * 1_000_000
            while True:
                while backlog() > BACKLOG:
                    await anyio.sleep(0.002)
                seqs = [seq + 2 * i for i in range(rng.randint(1, 16))]
                seq = seqs[-1] + 2
                emit(f"SEND {seqs[0]} {seqs[-1]}\n")
                results = await session.send_many([(topic_for(s), payload_for(s)) for s in seqs])
                for result in results:
                    if result is not None:
                        raise result
                emit("".join(f"PUB {s}\n" for s in seqs))

        async def publish_one() -> None:
            seq = trial * 1_000_000 + 1
            while True:
                while backlog() > BACKLOG:
                    await anyio.sleep(0.002)
                if single:
                    await turn.acquire()
                emit(f"SEND {seq} {seq}\n")
                await session.send(topic_for(seq), payload_for(seq))
                emit(f"PUB {seq}\n")
                seq += 2

        async def consume() -> None:
            held: list[tuple[int, Message]] = []
            hold = 1
            while True:
                if drain:
                    got: Message | None = None
                    with anyio.move_on_after(0.5):  # idle that long: the queue is empty
                        got = await flow.receive()
                    if got is None:
                        break
                    message = got
                else:
                    message = await flow.receive()
                seq, problem = seq_of(message)
                emit(f"GOT {seq} {int(message.redelivered)}\n")
                if problem is not None:
                    emit(f"BAD {seq} {problem}\n")
                held.append((seq, message))
                if len(held) >= hold:  # ack a few at once: some are in flight at the kill
                    for seq, message in held:
                        flow.ack(message)
                        emit(f"ACK {seq}\n")
                        if single:
                            turn.release()
                    held.clear()
                    hold = rng.randint(1, window)
            for seq, message in held:
                flow.ack(message)
                emit(f"ACK {seq}\n")

        with anyio.move_on_after(SELF_DESTRUCT) as deadline:
            async with anyio.create_task_group() as tg:
                if not drain:
                    if not single:
                        tg.start_soon(publish_many)
                    tg.start_soon(publish_one)
                await consume()  # returns only when draining
                tg.cancel_scope.cancel()
        if deadline.cancelled_caught:
            raise SystemExit("crash_child: never killed, or the drain never ended")
        await flow.unbind()
        emit(f"LEFT {backlog()}\n")
        try:
            await store.check()
        except Exception as exc:
            emit(f"CHECK {exc!r}\n")
        else:
            emit("CHECK ok\n")
    emit("DONE\n")


if __name__ == "__main__":
    directory, backend, trial_number, *mode = sys.argv[1:]
    anyio.run(main, directory, int(trial_number), "".join(mode), backend=backend)
