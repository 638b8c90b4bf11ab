"""Quickstart: publish and subscribe with wildcards, an async iterator and a callback.

Run it with ``python examples/quickstart.py``; it prints what each subscriber
receives and exits.
"""

from __future__ import annotations

import anyio

from meshbus import Message, Node, Session


def on_alarm(message: Message) -> None:
    # A plain function is called inline by the publishing code: keep it short.
    print(f"callback   <- {message.topic}: {message.payload.decode()}")


async def dashboard_loop(dashboard: Session, expected: int) -> None:
    # A session is an async iterator over its buffered messages.
    received = 0
    async for message in dashboard:
        print(f"dashboard  <- {message.topic}: {message.payload.decode()}")
        received += 1
        if received == expected:
            break


async def main() -> None:
    async with (
        Node() as node,  # the default plugins: direct messaging
        node.connect(client_name="dashboard") as dashboard,
        node.connect(client_name="alarms", on_message=on_alarm) as alarms,
        node.connect(client_name="sensor") as sensor,
    ):
        dashboard.subscribe("building/*/temperature")  # '*' alone: exactly one level
        dashboard.subscribe("building/lobby/>")  # '>' last: one or more levels
        alarms.subscribe("alarm*/>")  # 'alarm*': any level starting with "alarm"

        async with anyio.create_task_group() as tg:
            tg.start_soon(dashboard_loop, dashboard, 3)
            for topic, value in [
                ("building/lobby/temperature", "21.5"),  # matches two filters: delivered once
                ("building/roof/temperature", "14.0"),
                ("alarms/fire/floor2", "test"),
                ("building/roof/humidity", "0.61"),  # matches no subscription
                ("building/lobby/door/state", "open"),
            ]:
                print(f"sensor     -> {topic}")
                sensor.publish(topic, value)

        stats = node.statistics()
        print(
            f"published={stats.published} delivered={stats.delivered} unmatched={stats.unmatched}"
        )


if __name__ == "__main__":
    anyio.run(main)
