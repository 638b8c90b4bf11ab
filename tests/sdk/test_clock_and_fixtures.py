"""ManualClock and the fixtures meshbus.testing offers to users' test suites."""

from __future__ import annotations

import anyio
import pytest

from meshbus import DEFAULT_PLUGINS, ManualClock, Node, Session, SystemClock


async def test_manual_clock_wakes_sleepers_only_when_advanced_past_their_deadline() -> None:
    clock = ManualClock()
    woken: list[str] = []

    async def sleeper(name: str, deadline: float) -> None:
        await clock.sleep_until(deadline)
        woken.append(name)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper, "late", 2.0)
        tg.start_soon(sleeper, "early", 1.0)
        await anyio.wait_all_tasks_blocked()
        assert clock.sleepers == 2
        clock.advance(0.5)
        await anyio.wait_all_tasks_blocked()
        assert woken == []
        clock.advance(0.5)
        await anyio.wait_all_tasks_blocked()
        assert woken == ["early"]
        clock.advance(5)
    assert woken == ["early", "late"]
    assert clock.monotonic() == 6.0
    assert clock.time() == 1_700_000_006.0


async def test_manual_clock_past_deadline_returns_at_once_and_refuses_going_back() -> None:
    clock = ManualClock(start=10.0)
    with anyio.fail_after(1):
        await clock.sleep_until(3.0)
    with pytest.raises(ValueError, match="back"):
        clock.advance(-1)


async def test_system_clock_sleeps_until_deadline() -> None:
    clock = SystemClock()
    start = clock.monotonic()
    await clock.sleep_until(start + 0.02)
    assert clock.monotonic() >= start + 0.02
    assert clock.time() > 1_600_000_000


async def test_message_timestamps_come_from_the_node_clock(
    meshbus_node: Node, meshbus_clock: ManualClock, meshbus_session: Session
) -> None:
    meshbus_session.subscribe("t")
    stamping = meshbus_node.connect(client_name="stamping", timestamps=True)
    meshbus_clock.advance(42)
    stamping.publish("t", b"x")
    msg = meshbus_session.receive_nowait()
    assert msg is not None
    assert msg.timestamp == meshbus_clock.time() == 1_700_000_042.0
    assert msg.sender == "stamping"
    assert meshbus_node.running
    assert meshbus_node.plugins.names() == list(DEFAULT_PLUGINS)
