"""Eliding: publish rate with eliding on vs off, and memory per tracked topic.

Run: ``.venv/bin/python bench/eliding.py [--quick]``. One line per figure.

One publisher at full speed round-robin over 1,000 topics, one consumer subscribed
to all of them with an inline handler, on a node with the default plugins and the
real clock. Eliding on: the consumer's profile has a 100 ms delay, so after the first
message per topic almost every message is held and replaced. Eliding off: the same
node and consumer with a plain profile, every message delivered.

Target (issue 3): eliding costs at most 1.5x the plain direct path per message.
"""

from __future__ import annotations

import argparse
import gc
import tracemalloc

import anyio
from _harness import best_rates, clock, payloads, verdict

from meshbus import ClientProfile, Message, Node
from meshbus.plugins.eliding import ELIDER, DelayElider

TOPICS = [f"prices/venue{i % 10}/instrument{i}" for i in range(1000)]
BATCH = 1000  # publishes between two checkpoints, so the timer task can run


def make(eliding: bool, data: list[bytes]):  # type: ignore[no-untyped-def]
    async def run() -> float:
        got = [0]

        def on_message(message: object) -> None:
            got[0] += 1

        async with Node(name="bench") as node:
            vpn = node.vpn()
            vpn.add_client_profile(
                ClientProfile(
                    "p", eliding_enabled=eliding, eliding_delay_ms=100, max_eliding_topics=2000
                )
            )
            vpn.add_user("viewer", client_profile="p")
            node.connect(username="viewer", on_message=on_message).subscribe("prices/>")
            publish = node.connect().publish
            topics = TOPICS
            n = len(topics)
            gc.collect()
            elapsed = 0.0
            for start in range(0, len(data), BATCH):
                t0 = clock()
                for i in range(start, min(start + BATCH, len(data))):
                    publish(topics[i % n], data[i], eliding_eligible=True)
                elapsed += clock() - t0
                await anyio.sleep(0)
        if eliding:
            assert len(TOPICS) <= got[0] < len(data) / 2, got  # really elided
        else:
            assert got[0] == len(data), got
        return elapsed

    return run


async def memory_per_topic() -> float:
    async with Node(name="bench") as node:
        vpn = node.vpn()
        vpn.add_client_profile(
            ClientProfile(
                "p", eliding_enabled=True, eliding_delay_ms=100, max_eliding_topics=20_000
            )
        )
        vpn.add_user("viewer", client_profile="p")
        viewer = node.connect(username="viewer", on_message=lambda m: None)
        elider = viewer.stash[ELIDER]
        assert isinstance(elider, DelayElider)
        # Messages made beforehand, fed to the eliding stage directly: only the
        # tracker's own state (per-topic record and its dict entry) is measured.
        messages = [Message(f"m/{i}", b"x", eliding_eligible=True) for i in range(10_000)]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for m in messages:
            elider.deliver(m)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert len(elider.topics) == len(messages)
        return (after - before) / len(messages)


async def main(quick: bool) -> None:
    messages = 50_000 if quick else 300_000
    rounds = 3 if quick else 7
    data = payloads(messages)
    best = await best_rates({"on": make(True, data), "off": make(False, data)}, messages, rounds)
    cost = best["off"] / best["on"]
    print(f"# {messages} messages over {len(TOPICS)} topics, 100 ms delay, best of {rounds}")
    print(
        f"eliding.publish on: {best['on'] / 1e6:.3g} M msg/s, off: {best['off'] / 1e6:.3g} M msg/s, "
        f"cost per message {cost:.2f}x the plain direct path (target <= 1.5x) {verdict(cost <= 1.5)}"
    )
    print(f"eliding.memory per tracked topic: {await memory_per_topic():.0f} bytes")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and rounds")
    anyio.run(main, parser.parse_args().quick)
