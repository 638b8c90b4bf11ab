"""Shared subscriptions: spread work over a group of workers (SPEC 3).

Three workers join the group ``#share/resizers/jobs/>``; each job goes to exactly
one of them, picked at random, so the load spreads evenly. A second group over
the same filter (an auditor) gets its own copy of every job. When a worker
leaves mid-stream, the others take all the later jobs.

Run it with ``python examples/shared_workers.py``.
"""

from __future__ import annotations

from collections import Counter

import anyio

from meshbus import Node


async def main() -> None:
    async with Node(seed=42) as node:  # the seed makes the random picks repeatable
        done: Counter[str] = Counter()
        workers = []
        for name in ("worker-a", "worker-b", "worker-c"):
            session = node.connect(
                client_name=name, on_message=lambda msg, name=name: done.update([name])
            )
            session.subscribe("#share/resizers/jobs/>")
            workers.append(session)

        audited: list[str] = []
        auditor = node.connect(client_name="auditor", on_message=lambda m: audited.append(m.topic))
        auditor.subscribe("#share/audit/jobs/>")  # another ShareName: an independent group

        producer = node.connect(client_name="producer")
        for i in range(3000):
            producer.publish(f"jobs/resize/{i}", b"photo.jpg")
        print(f"3000 jobs spread over the group: {dict(sorted(done.items()))}")
        print(f"the auditor group (one member) saw all of them: {len(audited) == 3000}")

        workers[0].close()  # worker-a leaves; nothing is lost for the others
        before = done.copy()
        for i in range(300):
            producer.publish(f"jobs/resize/late-{i}", b"photo.jpg")
        late = done - before
        print(f"after worker-a left, 300 jobs went to: {dict(sorted(late.items()))}")
        print(f"jobs handled in total: {sum(done.values())}")


if __name__ == "__main__":
    anyio.run(main)
