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


# --- timeouts and letting time pass on the manual clock -----------------------------------


async def test_fail_after_on_the_manual_clock_fires_only_when_time_is_moved() -> None:
    clock = ManualClock()
    outcome: list[str] = []

    async def waits_forever() -> None:
        try:
            with clock.fail_after(5):
                await anyio.Event().wait()
        except TimeoutError:
            outcome.append(f"timed out at {clock.monotonic():g}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(waits_forever)
        await clock.settle()
        clock.advance(4.9)
        await clock.settle()
        assert outcome == []
        clock.advance(0.1)
    assert outcome == ["timed out at 5"]
    assert clock.sleepers == 0


async def test_a_finished_scope_leaves_no_deadline_behind() -> None:
    clock = ManualClock()
    with clock.move_on_after(10) as scope:
        await anyio.lowlevel.checkpoint()
    assert not scope.cancelled_caught
    assert clock.sleepers == 0
    clock.advance(20)  # the dead timer must not cancel anything now
    assert not scope.cancel_called


async def test_run_lets_time_pass_through_each_deadline_in_order() -> None:
    clock = ManualClock()
    ticks: list[float] = []

    async def ticker() -> None:
        while True:
            await clock.sleep_until(clock.monotonic() + 1.5)
            ticks.append(clock.monotonic())

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await clock.run(6)
        assert ticks == [1.5, 3.0, 4.5, 6.0]
        assert clock.monotonic() == 6.0
        tg.cancel_scope.cancel()


async def test_settle_runs_a_chain_of_tasks_waking_each_other_without_moving_time() -> None:
    clock = ManualClock()
    first, second = anyio.Event(), anyio.Event()
    done: list[str] = []

    async def relay(wait_on: anyio.Event, then: anyio.Event | None, name: str) -> None:
        await wait_on.wait()
        for _ in range(10):  # some more steps before it is done
            await anyio.lowlevel.checkpoint()
        done.append(name)
        if then is not None:
            then.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(relay, first, second, "one")
        tg.start_soon(relay, second, None, "two")
        await clock.settle()
        assert done == []
        first.set()
        await clock.settle()
        assert done == ["one", "two"]
        assert clock.monotonic() == 0.0


async def test_wait_for_returns_the_clock_time_a_condition_took() -> None:
    clock = ManualClock()
    state = {"up": False}

    async def comes_up_after(seconds: float) -> None:
        await clock.sleep_until(clock.monotonic() + seconds)
        state["up"] = True

    async with anyio.create_task_group() as tg:
        tg.start_soon(comes_up_after, 42.0)
        assert await clock.wait_for(lambda: state["up"], within=60) == 42.0

    with pytest.raises(TimeoutError, match="nothing left to wait for"):
        await clock.wait_for(lambda: False, within=5)
