"""Message eliding: a dashboard that only wants the latest price, at most 5 times a second.

A feed publishes a price update every millisecond for two instruments. The
dashboard's client profile enables eliding with a 200 ms delay: per instrument it
gets the first update at once, then only the newest update once per delay, and
always the last update of the burst. Another consumer without eliding gets all.

The example runs on a manual clock so it is instant and repeatable; with the
default clock the same happens in real time. Run it with
``python examples/eliding_dashboard.py``.
"""

from __future__ import annotations

import anyio

from meshbus import ClientProfile, ManualClock, Node


async def main() -> None:
    clock = ManualClock()
    async with Node(clock=clock) as node:
        vpn = node.vpn()
        vpn.add_client_profile(ClientProfile("screens", eliding_enabled=True, eliding_delay_ms=200))
        vpn.add_user("dashboard", client_profile="screens")

        shown: list[str] = []
        dashboard = node.connect(
            username="dashboard",
            on_message=lambda m: shown.append(
                f"t={clock.monotonic() * 1000:4.0f} ms {m.topic} {m.payload.decode()}"
            ),
        )
        dashboard.subscribe("prices/*")  # eliding works per concrete topic
        recorded: list[str] = []
        recorder = node.connect(on_message=lambda m: recorded.append(m.topic))
        recorder.subscribe("prices/>")

        feed = node.connect()
        for ms in range(1, 1001):  # one second of updates, one per millisecond
            for instrument, base in (("ACME", 100), ("INIT", 50)):
                feed.publish(
                    f"prices/{instrument}", f"{base + ms / 100:.2f}", eliding_eligible=True
                )
            clock.advance(0.001)
            await anyio.wait_all_tasks_blocked()  # let the eliding timer run

        print(f"the recorder got every update: {len(recorded)}")
        print(f"the dashboard got {len(shown)}:")
        for line in shown:
            print(f"  {line}")


if __name__ == "__main__":
    anyio.run(main)
