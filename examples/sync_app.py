"""Using meshbus from plain synchronous code with the :mod:`meshbus.blocking` facade.

The node runs on an event loop in a background thread; each call hands its
work to that thread and waits for the result. Run it with
``python examples/sync_app.py``.
"""

from __future__ import annotations

import threading

from meshbus import Message, blocking


def main() -> None:
    caller = threading.current_thread()
    handled: list[tuple[str, bool]] = []

    def on_result(message: Message) -> None:
        # on_message handlers run on the node's thread, not on the caller's.
        handled.append((message.topic, threading.current_thread() is not caller))

    with (
        blocking.start() as node,
        node.connect(client_name="worker") as worker,
        node.connect(client_name="client", on_message=on_result) as client,
    ):
        worker.subscribe("jobs/>")
        client.subscribe("results/>")
        client.publish("jobs/resize", b"photo.jpg")
        job = worker.receive(timeout=1.0)
        print(f"worker got {job.topic}: {job.payload.decode()}")
        worker.publish("results/resize", b"ok")
        for topic, elsewhere in handled:
            print(f"client handled {topic} on the node's thread: {elsewhere}")
        try:
            worker.receive(timeout=0.05)
        except TimeoutError:
            print("worker: no more jobs (timed out)")
        print(f"worker statistics: published={worker.statistics().published}")


if __name__ == "__main__":
    main()
