"""A session that starts discarding is logged as a slow consumer, rate-limited."""

from __future__ import annotations

import logging

import pytest

from meshbus import ClientProfile, Node
from meshbus.testing import ManualClock

LOGGER = "meshbus.session"


def slow_session(node: Node, name: str, limit: int = 2) -> object:
    vpn = node.vpn()
    if name not in vpn.client_profiles:
        vpn.add_client_profile(ClientProfile(name, egress_max_messages=limit))
        vpn.add_user(name, client_profile=name)
    session = node.connect(username=name, client_name=f"{name}-{len(vpn.sessions)}")
    session.subscribe("ticks")
    return session


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and r.levelno == logging.WARNING and "slow consumer" in r.getMessage()
    ]


async def test_the_first_discard_is_a_warning_naming_the_session(
    meshbus_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    slow_session(meshbus_node, "slow")
    publisher = meshbus_node.connect()
    publisher.publish("ticks", b"0")
    publisher.publish("ticks", b"1")
    assert warnings(caplog) == []  # within the limit: nothing discarded
    publisher.publish("ticks", b"2")
    (warning,) = warnings(caplog)
    assert "session 'slow-0' (username 'slow', VPN 'default') discarded 1 message(s)" in warning
    assert "holds 2 message(s)" in warning
    record = next(r for r in caplog.records if "slow consumer" in r.getMessage())
    assert (record.client_name, record.vpn, record.discarded) == ("slow-0", "default", 1)  # type: ignore[attr-defined]


async def test_a_session_that_keeps_discarding_is_named_once_per_interval(
    meshbus_node: Node, meshbus_clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    slow_session(meshbus_node, "slow")
    publisher = meshbus_node.connect()
    for i in range(100):
        publisher.publish("ticks", str(i))
    assert len(warnings(caplog)) == 1  # 98 discarded, one warning (at the first)
    meshbus_clock.advance(meshbus_node.slow_consumers.interval - 0.5)
    publisher.publish("ticks", b"x")
    assert len(warnings(caplog)) == 1
    meshbus_clock.advance(1.0)
    publisher.publish("ticks", b"y")
    later = warnings(caplog)[1]
    # Counted since the last warning: 97 after it, then x and y.
    assert "discarded 99 message(s)" in later
    assert "100 discarded since it opened" in later


async def test_many_slow_consumers_at_once_cannot_flood_the_log(
    meshbus_node: Node, meshbus_clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    burst = meshbus_node.slow_consumers.burst
    for _ in range(burst + 5):
        slow_session(meshbus_node, "slow")
    publisher = meshbus_node.connect()
    for i in range(3):
        publisher.publish("ticks", str(i))
    assert len(warnings(caplog)) == burst
    debug = [r for r in caplog.records if r.levelno == logging.DEBUG and "slow" in r.getMessage()]
    assert len(debug) == 5
    meshbus_clock.advance(meshbus_node.slow_consumers.interval)
    publisher.publish("ticks", b"3")
    assert (
        "(5 more slow-consumer warnings were logged at DEBUG level only)"
        in (warnings(caplog)[burst])
    )


async def test_a_consumer_that_keeps_up_is_never_named(
    meshbus_node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, LOGGER)
    session = slow_session(meshbus_node, "slow")
    publisher = meshbus_node.connect()
    for i in range(50):
        publisher.publish("ticks", str(i))
        assert session.receive_nowait() is not None  # type: ignore[attr-defined]
    assert warnings(caplog) == []
    assert session.statistics().discarded == 0  # type: ignore[attr-defined]
