"""Hostile connections written by hand, one case each, against a node: refused logins
and login fields of the wrong type, a header too deep to forward, a bad connection
among busy ones, how the end of a connection is counted and logged, and headers JSON
cannot carry. Each case says what the node must answer, log and count; the random
attacks are in test_fuzz.py."""

from __future__ import annotations

import logging
from typing import Any

import anyio
import pytest

from meshbus import HEADER_LIMITS
from meshbus.transports import ConnectionState, FrameKind, encode_frame
from meshbus.transports._framing import HEADER_DEPTH_LIMIT
from tests.fuzzing import nested_json

from ._raw_client import ENDINGS, LOGGER, MAX_FRAME, PREFIX, Client, records_of, serving

K = FrameKind


def warnings_for(caplog: pytest.LogCaptureFixture, peer: str) -> list[str]:
    return [
        r.getMessage()
        for r in records_of(caplog, 0, peer)
        if r.levelno == logging.WARNING and r.msg.startswith(ENDINGS)
    ]


def ending_reason(caplog: pytest.LogCaptureFixture, peer: str) -> str:
    """Why the connection from ``peer`` ended, from its one ending record, whatever its level
    (known bug A: a violation after the login is logged at DEBUG only)."""
    [ending] = [r for r in records_of(caplog, 0, peer) if r.msg.startswith(ENDINGS)]
    return str(ending.args[1])  # type: ignore[index]


async def test_wrong_password_and_unknown_vpn_are_refused_with_a_clear_error_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with serving() as (node, server, tg):
        vpn = node.create_vpn("secure", authentication="basic")
        vpn.add_user("alice", password="s3cret")
        # The client is told "login refused" whatever the reason (SPEC 6); the log says why.
        cases = [
            ({"vpn": "secure", "username": "alice", "password": "wrong"}, "wrong password", 1),
            ({"vpn": "secure", "username": "alice"}, "no password", 1),
            ({"vpn": "secure", "username": "mallory", "password": "x"}, "unknown username", 1),
            ({"vpn": "nowhere", "password": "s3cret"}, "no Message VPN named 'nowhere'", 0),
        ]
        for n, (hello, why, counted) in enumerate(cases, start=1):
            failures = vpn.login_failures
            client = Client(server, tg, f"client-{n}")
            kind, refused, _ = await client.login(**hello)
            assert kind == K.REFUSED
            assert refused["error"] == "authentication"
            told = "login refused" if counted else why
            assert told in refused["message"]
            assert told in refused["why"]
            with anyio.fail_after(5):
                await client.served.wait()  # the node hung up
            await client.ours.aclose()
            assert client.protocol.state is ConnectionState.CLOSED
            assert server.statistics().refused == n
            assert vpn.login_failures == failures + counted
            [warning] = warnings_for(caplog, f"client-{n}")
            assert warning.startswith(f"refused login from client-{n}: ")
            assert why in warning
        stats = server.statistics()
        assert (stats.failed, stats.logins, stats.open) == (0, 0, 0)
        # and the right password still works
        client = Client(server, tg, "alice")
        kind, welcome, _ = await client.login(vpn="secure", username="alice", password="s3cret")
        assert kind == K.WELCOME
        assert welcome["vpn"] == "secure"
        assert server.statistics().logins == 1
        await client.hang_up()


@pytest.mark.parametrize(
    ("field", "value"),
    [("no_local", "yes"), ("timestamps", 1), ("client_name", 5), ("password", ["x"])],
)
async def test_a_login_field_of_the_wrong_type_fails_the_connection_naming_it(
    caplog: pytest.LogCaptureFixture, field: str, value: object
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with serving() as (node, server, tg):
        client = Client(server, tg, "typo")
        client.protocol.hello({field: value})
        await client.flush()
        with anyio.fail_after(5):
            await client.served.wait()  # the node hung up
        [warning] = warnings_for(caplog, "typo")
        assert f"HELLO {field} must be" in warning
        stats = server.statistics()
        assert (stats.failed, stats.logins, stats.open) == (1, 0, 0)
        assert [s.client_name for s in node.vpn().sessions] == []


async def test_a_header_too_deep_to_forward_closes_the_publisher_not_its_subscribers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Without the depth limit of the frame decoder, the subscriber's connection failed to
    # encode the DELIVER (orjson writes 254 levels, reads 1024): a TypeError out of serve().
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    async with serving() as (node, server, tg):
        victim = Client(server, tg, "victim")
        await victim.login(client_name="victim")
        await victim.request(K.SUBSCRIBE, {"id": 1, "subscription": "deep/>"})
        attacker = Client(server, tg, "attacker")
        await attacker.login()
        head = b'["deep/x",{"h":{"k":%s}}]' % nested_json([True] * 300, b"1")
        await attacker.ours.send(PREFIX.pack(5 + len(head), K.PUBLISH, len(head)) + head)
        with anyio.fail_after(5):
            await attacker.served.wait()
        await attacker.ours.aclose()
        assert (
            ending_reason(caplog, "attacker")
            == f"frame header is nested deeper than {HEADER_DEPTH_LIMIT} levels"
        )
        # the subscriber gets what others publish, headers as deep as the limit included
        nested: Any = "bottom"
        for _ in range(HEADER_LIMITS.max_depth - 1):  # in {"k": ...}: max_depth levels
            nested = [nested]
        async with node.connect() as local:
            local.publish("deep/ok", b"fine", headers={"k": nested})
        header = await victim.wait_for(lambda f: f[0] == K.DELIVER and f[1][0] == "deep/ok")
        assert header[3]["h"] == {"k": nested}
        await victim.hang_up()


async def test_one_bad_connection_among_busy_ones(caplog: pytest.LogCaptureFixture) -> None:
    """Several remote sessions publish and receive while a bad one comes and goes."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    async with serving() as (_, server, tg):
        clients = [Client(server, tg, f"good-{n}") for n in range(3)]
        for n, client in enumerate(clients):
            await client.login(client_name=f"good-{n}", compression=["zlib"])
            await client.request(K.SUBSCRIBE, {"id": 1, "subscription": "chat/>"})
        for round in range(3):
            bad = Client(server, tg, f"bad-{round}")
            await bad.login()
            bad.protocol.send(K.PUBLISH, ["chat/bad"], b"first")  # accepted: a valid frame
            await bad.flush()
            await bad.ours.send(encode_frame(K.DELIVER, ["chat/x", None, 0]))  # not from a client
            for n, client in enumerate(clients):
                client.protocol.send(K.PUBLISH, [f"chat/{round}/{n}"], b"hi")
                await client.flush()
            for client in clients:
                for n in range(3):
                    topic = f"chat/{round}/{n}"
                    await client.wait_for(lambda f, t=topic: f[0] == K.DELIVER and f[1][0] == t)
            with anyio.fail_after(5):
                await bad.served.wait()
            await bad.ours.aclose()
            reason = ending_reason(caplog, f"bad-{round}")
            assert reason == "DELIVER frames are not accepted here"
        assert server.statistics().open == 3
        for client in clients:
            await client.hang_up()


async def test_a_violation_after_login_is_a_failure_logged_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with serving() as (_, server, tg):
        client = Client(server, tg, "bad")
        await client.login()
        await client.ours.send(PREFIX.pack(2**31, K.PUBLISH, 10))
        with anyio.fail_after(5):
            await client.served.wait()
        await client.ours.aclose()
        assert server.statistics().failed == 1
        assert warnings_for(caplog, "bad") == [
            "closing connection from bad: frame of 2147483648 bytes is larger than the limit "
            f"of {MAX_FRAME}"
        ]


async def test_a_peer_that_closes_after_a_refused_publish_is_not_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with serving() as (_, server, tg):
        client = Client(server, tg, "polite")
        await client.login()
        client.protocol.send(K.PUBLISH, [""], b"to an invalid topic")  # answered by ERROR
        client.protocol.close("bye")
        await client.flush()  # both frames in one write
        with anyio.fail_after(5):
            await client.served.wait()
        await client.ours.aclose()
        assert warnings_for(caplog, "polite") == []
        assert server.statistics().failed == 0
        assert any(
            r.getMessage() == "connection from polite closed: peer closed: bye"
            for r in records_of(caplog, 0, "polite")
        )


async def test_headers_json_cannot_carry_do_not_break_a_remote_subscriber() -> None:
    async with serving() as (node, server, tg):
        victim = Client(server, tg, "victim")
        await victim.login()
        await victim.request(K.SUBSCRIBE, {"id": 1, "subscription": "t/>"})
        async with node.connect() as local:
            local.publish("t/1", b"", headers={"raw": b"\x00"})
            local.publish("t/2", b"plain")
        await victim.wait_for(lambda f: f[0] == K.DELIVER and f[1][0] == "t/2")
        await victim.hang_up()
