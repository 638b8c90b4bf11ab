"""Shared subscriptions: the cost of a delivery to one member of a 10-member group.

Run: ``.venv/bin/python bench/shared.py [--quick]``. One line per figure.

Compared in the same run, on nodes with the default plugins (direct, shared, eliding),
each publish delivering exactly one message (the receivers count what they get):

* ``shared 10 members``: ten sessions in ``#share/g/<topic>``; one is picked per message;
* ``plain 1 subscriber``: one session subscribed to the topic;
* ``plain 10 subscribers``: ten sessions subscribed (ten deliveries per message), context.

Target (issue 3): a shared delivery costs no more than a plain single-subscriber
delivery + 20%, i.e. its publish rate is at least 1/1.2 = 0.83 of the plain one.
"""

from __future__ import annotations

import argparse
import gc

import anyio
from _harness import best_rates, clock, payloads, verdict

from meshbus import Node

TOPIC = "orders/eu/created"


def make(kind: str, data: list[bytes]):  # type: ignore[no-untyped-def]
    async def run() -> float:
        counts = [0] * 10

        def receiver(i: int):  # type: ignore[no-untyped-def]
            def on_message(message: object) -> None:
                counts[i] += 1

            return on_message

        async with Node(name="bench", seed=1) as node:
            n = 1 if kind == "plain1" else 10
            for i in range(n):
                session = node.connect(on_message=receiver(i))
                session.subscribe(f"#share/g/{TOPIC}" if kind == "shared" else TOPIC)
            publish = node.connect().publish
            gc.collect()
            t0 = clock()
            for p in data:
                publish(TOPIC, p)
            elapsed = clock() - t0
        expected = len(data) * (10 if kind == "plain10" else 1)
        assert sum(counts) == expected, (kind, counts)
        if kind == "shared":  # really spread over the group
            assert min(counts) > len(data) / 10 * 0.8, counts
        return elapsed

    return run


async def main(quick: bool) -> None:
    messages = 20_000 if quick else 200_000
    rounds = 3 if quick else 9
    data = payloads(messages)
    impls = {k: make(k, data) for k in ("shared", "plain1", "plain10")}
    best = await best_rates(impls, messages, rounds)
    ratio = best["shared"] / best["plain1"]
    print(f"# {messages} messages of 100 bytes, best of {rounds} rounds, thread CPU time")
    print(
        f"shared.publish 10-member group: {best['shared'] / 1e6:.3g} M msg/s, "
        f"plain 1 subscriber {best['plain1'] / 1e6:.3g} M msg/s, "
        f"cost ratio {1 / ratio:.2f}x (target <= 1.2x) {verdict(1 / ratio <= 1.2)}"
    )
    print(
        f"shared.publish plain 10 subscribers: {best['plain10'] / 1e6:.3g} M msg/s "
        f"({best['plain10'] * 10 / 1e6:.3g} M deliveries/s), context"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and rounds")
    anyio.run(main, parser.parse_args().quick)
