"""Logins over real TCP and TLS on 127.0.0.1 (SPEC 6 and 10): basic authentication,
client certificates, pinned CAs and compression."""

from __future__ import annotations

import gc
import hashlib
import logging
import threading
from collections.abc import AsyncIterator

import anyio
import pytest

from meshbus import (
    AuthenticationError,
    ConfigurationError,
    ManualClock,
    Message,
    Node,
    TransportError,
)
from meshbus.transports import (
    ListenerSettings,
    RemoteSession,
    Server,
    TlsSettings,
    connect,
    start_server,
)
from meshbus.transports._framing import FrameKind
from meshbus.transports._protocol import ConnectionState, LinkProtocol, Role
from meshbus.transports._settings import MAX_FRAME_SIZE

from .conftest import Certificates, wait_until


async def receive(session: RemoteSession, timeout: float = 2.0) -> Message:
    with anyio.fail_after(timeout):
        return await session.receive()


async def check_messages_flow(session: RemoteSession, payload: bytes = b"ping") -> None:
    """A message the session publishes to itself comes back."""
    topic = f"echo/{session.client_name}"
    session.subscribe(topic)
    await session.confirm()
    session.publish(topic, payload)
    message = await receive(session)
    assert (message.topic, message.payload) == (topic, payload)
    session.unsubscribe(topic)


# --- basic authentication --------------------------------------------------------------------


REFUSED = "login refused"


@pytest.fixture
def secure(node: Node) -> None:
    vpn = node.create_vpn("secure", authentication="basic")
    vpn.add_user("dave", password="s3cret")
    vpn.add_user("nopass")  # no password: cannot log in with basic authentication
    vpn.add_user("off", password="s3cret", enabled=False)


@pytest.fixture
def scrypt_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of each scrypt call from now on (the real scrypt still runs)."""
    threads: list[int] = []
    real = hashlib.scrypt

    def recording(*args: object, **kwargs: object) -> bytes:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(hashlib, "scrypt", recording)
    return threads


async def test_basic_login(node: Node, server: Server, secure: None) -> None:
    async with connect(server.url, vpn="secure", username="dave", password="s3cret") as s:
        assert s.welcome["vpn"] == "secure"
        assert node.vpn("secure").sessions[s.client_name].username == "dave"  # type: ignore[index]
        await check_messages_flow(s)
    assert server.statistics().logins == 1
    assert server.statistics().refused == 0


async def test_basic_wrong_password_is_refused_and_counted(
    node: Node, server: Server, secure: None, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "meshbus")
    with pytest.raises(AuthenticationError, match=REFUSED) as caught:
        async with connect(server.url, vpn="secure", username="dave", password="nope"):
            pytest.fail("logged in with a wrong password")
    assert caught.value.username == "dave"
    assert "s3cret" not in str(caught.value)
    assert "nope" not in str(caught.value)
    assert node.vpn("secure").login_failures == 1
    assert node.vpn("secure").statistics().login_failures == 1
    assert server.statistics().refused == 1
    assert server.statistics().logins == 0
    assert not node.vpn("secure").sessions
    # The operator's log says why, and where from.
    (record,) = [r for r in caplog.records if "refused login" in r.getMessage()]
    assert "wrong password" in record.getMessage()
    assert "127.0.0.1" in record.getMessage()
    await wait_until(lambda: server.statistics().open == 0)


@pytest.mark.parametrize(
    ("username", "password", "why"),
    [
        ("dave", None, "no password"),
        ("nopass", "anything", "no password"),
        ("eve", "s3cret", "unknown username"),
        ("off", "s3cret", "disabled"),
    ],
)
async def test_basic_other_refusals_give_the_same_answer(
    node: Node,
    server: Server,
    secure: None,
    caplog: pytest.LogCaptureFixture,
    username: str,
    password: str | None,
    why: str,
) -> None:
    caplog.set_level(logging.WARNING, "meshbus")
    with pytest.raises(AuthenticationError) as caught:
        async with connect(server.url, vpn="secure", username=username, password=password):
            pass
    # SPEC 6: nothing tells a client whether the username exists.
    assert str(caught.value) == f"connect denied for user {username!r}: {REFUSED}"
    assert caught.value.why == REFUSED
    assert node.vpn("secure").login_failures == 1
    assert server.statistics().refused == 1
    assert why in caplog.text


@pytest.mark.parametrize(
    ("username", "password"),
    [("dave", "nope"), ("eve", "s3cret"), ("off", "s3cret"), ("nopass", "anything")],
)
async def test_remote_passwords_are_checked_off_the_event_loop_with_equal_work(
    node: Node,
    server: Server,
    secure: None,
    scrypt_threads: list[int],
    username: str,
    password: str,
) -> None:
    with pytest.raises(AuthenticationError, match=REFUSED):
        async with connect(server.url, vpn="secure", username=username, password=password):
            pass
    # One scrypt whatever the reason (a dummy hash stands in for a missing one), so
    # an unknown username answers no sooner than a wrong password; never on the loop.
    assert len(scrypt_threads) == 1
    assert threading.get_ident() not in scrypt_threads
    async with connect(server.url, vpn="secure", username="dave", password="s3cret") as s:
        await check_messages_flow(s)
    assert len(scrypt_threads) == 2
    assert threading.get_ident() not in scrypt_threads


@pytest.fixture
async def clocked() -> AsyncIterator[tuple[Node, ManualClock, Server]]:
    """A node on a manual clock with a basic-authentication VPN and a TCP listener."""
    clock = ManualClock()
    async with Node(name="clocked", clock=clock) as running:
        vpn = running.create_vpn("secure", authentication="basic")
        vpn.add_user("dave", password="s3cret")
        yield running, clock, await start_server(running, ListenerSettings(port=0))


async def test_repeated_failures_from_one_address_wait_on_the_node_clock(
    clocked: tuple[Node, ManualClock, Server],
) -> None:
    _, clock, server = clocked
    for i in range(5):  # five free failures from 127.0.0.1, for five usernames
        with pytest.raises(AuthenticationError, match=REFUSED):
            async with connect(server.url, vpn="secure", username=f"u{i}", password="x"):
                pass
    await clock.settle()
    idle = clock.sleepers
    outcome: list[object] = []

    async def sixth() -> None:
        try:
            async with connect(server.url, vpn="secure", username="dave", password="s3cret") as s:
                outcome.append(s.client_name)
        except AuthenticationError as exc:
            outcome.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(sixth)
        await wait_until(lambda: clock.sleepers == idle + 1)  # waiting for its turn
        assert outcome == []
        clock.advance(1.0)
    (client_name,) = outcome
    assert isinstance(client_name, str)
    assert server.statistics().refused == 5


class _Stream:
    def __init__(self, address: object) -> None:
        self.address = address

    def extra(self, attribute: object, default: object = None) -> object:
        return self.address


@pytest.mark.parametrize(
    ("remote", "counted_as"),
    [
        (("192.0.2.7", 50000), "192.0.2.7"),
        (("2001:db8:1:2:3:4:5:6", 50000, 0, 0), "2001:db8:1:2::/64"),  # a host has its /64
        (("::ffff:192.0.2.7", 50000, 0, 0), "192.0.2.7"),
        ("/run/node.sock", None),
        (None, None),
    ],
)
def test_failed_logins_are_counted_per_ip_address_or_ipv6_network(
    remote: object, counted_as: str | None
) -> None:
    from meshbus.transports import peer_address

    assert peer_address(_Stream(remote)) == counted_as  # type: ignore[arg-type]


async def test_unknown_vpn_is_refused_with_a_clear_message(node: Node, server: Server) -> None:
    with pytest.raises(AuthenticationError, match="no Message VPN named 'nowhere'"):
        async with connect(server.url, vpn="nowhere"):
            pass
    assert server.statistics().refused == 1
    assert node.statistics().login_failures == 0  # no VPN to count it in


async def test_refusals_do_not_disturb_other_sessions(
    node: Node, server: Server, secure: None
) -> None:
    async with connect(server.url) as session:
        for _ in range(3):
            with pytest.raises(AuthenticationError):
                async with connect(server.url, vpn="secure", username="dave", password="x"):
                    pass
        await check_messages_flow(session)
    assert server.statistics().refused == 3
    assert server.statistics().logins == 1


async def test_unreachable_node_raises_transport_error(server: Server) -> None:
    port = server.port
    await server.aclose()
    with pytest.raises(TransportError, match=str(port)):
        async with connect(f"tcp://127.0.0.1:{port}"):
            pass


# --- TLS ------------------------------------------------------------------------------------


def server_tls(certificates: Certificates, *, require: bool = True) -> TlsSettings:
    return TlsSettings(
        ca=certificates.ca,
        certificate=certificates.server.certificate,
        private_key=certificates.server.private_key,
        require_client_certificate=require,
    )


def client_tls(certificates: Certificates, who: str | None = None, **kw: object) -> TlsSettings:
    paths = {"alice": certificates.alice, "bob": certificates.bob}.get(who or "")
    return TlsSettings(
        ca=kw.pop("ca", certificates.ca),  # type: ignore[arg-type]
        certificate=paths.certificate if paths else None,
        private_key=paths.private_key if paths else None,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def certs_vpn(node: Node) -> None:
    vpn = node.create_vpn("certs", authentication="client-certificate")
    vpn.add_user("alice")


@pytest.fixture
async def tls_server(node: Node, certificates: Certificates, certs_vpn: None) -> Server:
    """A TLS listener that requires client certificates signed by the CA."""
    return await start_server(node, ListenerSettings(port=0, tls=server_tls(certificates)))


@pytest.fixture
async def optional_tls_server(node: Node, certificates: Certificates, certs_vpn: None) -> Server:
    """A TLS listener that verifies client certificates but does not require one."""
    settings = ListenerSettings(port=0, tls=server_tls(certificates, require=False))
    return await start_server(node, settings)


async def test_client_certificate_logs_in_as_its_common_name(
    node: Node, tls_server: Server, certificates: Certificates
) -> None:
    assert tls_server.url.startswith("tls://127.0.0.1:")
    tls = client_tls(certificates, "alice")
    async with connect(tls_server.url, vpn="certs", tls=tls) as session:
        served = node.vpn("certs").sessions[session.client_name]  # type: ignore[index]
        assert served.username == "alice"
        await check_messages_flow(session)
    # The default VPN (authentication "none") takes the certificate's name too.
    async with connect(tls_server.url, tls=tls) as session:
        assert node.vpn().sessions[session.client_name].username == "alice"  # type: ignore[index]
    assert tls_server.statistics().logins == 2


async def test_certificate_without_a_configured_user_is_refused(
    node: Node, tls_server: Server, certificates: Certificates
) -> None:
    with pytest.raises(AuthenticationError, match=REFUSED):
        async with connect(tls_server.url, vpn="certs", tls=client_tls(certificates, "bob")):
            pass
    assert node.vpn("certs").login_failures == 1
    assert tls_server.statistics().refused == 1


async def test_certificate_for_another_user_is_refused(
    node: Node, tls_server: Server, certificates: Certificates
) -> None:
    tls = client_tls(certificates, "alice")
    node.vpn("certs").add_user("bob")
    with pytest.raises(AuthenticationError, match=REFUSED):
        async with connect(tls_server.url, vpn="certs", username="bob", tls=tls):
            pass
    assert node.vpn("certs").login_failures == 1


async def test_no_certificate_is_refused_by_a_listener_that_requires_one(
    node: Node, tls_server: Server, certificates: Certificates
) -> None:
    with pytest.raises(TransportError, match="client certificate"):
        async with connect(tls_server.url, vpn="certs", tls=client_tls(certificates)):
            pass
    await wait_until(lambda: tls_server.statistics().failed == 1)
    assert tls_server.statistics().logins == 0
    assert not node.vpn("certs").sessions


async def test_no_certificate_is_refused_by_a_client_certificate_vpn(
    node: Node, optional_tls_server: Server, certificates: Certificates
) -> None:
    server = optional_tls_server
    with pytest.raises(AuthenticationError, match=REFUSED):
        async with connect(server.url, vpn="certs", username="alice", tls=client_tls(certificates)):
            pass
    assert server.statistics().refused == 1
    # Without a certificate the default VPN (authentication "none") still takes the client.
    async with connect(server.url, tls=client_tls(certificates)) as session:
        assert node.vpn().sessions[session.client_name].username == "default"  # type: ignore[index]
        await check_messages_flow(session)


async def test_a_password_does_not_replace_the_certificate(
    node: Node, optional_tls_server: Server, certificates: Certificates
) -> None:
    node.vpn("certs").add_user("carl", password="pw")
    with pytest.raises(AuthenticationError):
        async with connect(
            optional_tls_server.url,
            vpn="certs",
            username="carl",
            password="pw",
            tls=client_tls(certificates),
        ):
            pass


async def test_client_trusting_another_ca_fails_on_the_certificate(
    node: Node, tls_server: Server, certificates: Certificates
) -> None:
    tls = client_tls(certificates, "alice", ca=certificates.other_ca)
    with pytest.raises(TransportError, match="certificate"):
        async with connect(tls_server.url, vpn="certs", tls=tls):
            pass
    assert tls_server.statistics().logins == 0


async def test_server_certificate_from_another_ca_is_not_trusted(
    node: Node, certificates: Certificates
) -> None:
    other = certificates.other_server
    settings = ListenerSettings(
        port=0, tls=TlsSettings(certificate=other.certificate, private_key=other.private_key)
    )
    server = await start_server(node, settings)
    with pytest.raises(TransportError, match="certificate"):
        async with connect(server.url, tls=client_tls(certificates)):
            pass


async def test_server_hostname_is_checked(
    node: Node, optional_tls_server: Server, certificates: Certificates
) -> None:
    wrong = client_tls(certificates, server_hostname="wrong.example")
    with pytest.raises(TransportError, match="certificate"):
        async with connect(optional_tls_server.url, tls=wrong):
            pass
    by_name = client_tls(certificates, server_hostname="localhost")
    async with connect(optional_tls_server.url, tls=by_name) as session:
        await check_messages_flow(session)


async def test_a_failed_tls_handshake_closes_the_client_socket(
    tls_server: Server, certificates: Certificates
) -> None:
    tls = client_tls(certificates, "alice", ca=certificates.other_ca)
    with pytest.raises(TransportError, match="certificate"):
        async with connect(tls_server.url, vpn="certs", tls=tls):
            pass
    gc.collect()  # an unclosed socket warns now, in this test


async def test_client_without_a_certificate_and_plain_tcp_to_a_tls_listener(
    tls_server: Server,
) -> None:
    plain = tls_server.url.replace("tls://", "tcp://")
    with pytest.raises(TransportError):
        async with connect(plain, connect_timeout=1):
            pass
    await wait_until(lambda: tls_server.statistics().failed == 1)


@pytest.mark.parametrize("scheme", ["tcp", "tls"])
async def test_compression(
    node: Node, certificates: Certificates, certs_vpn: None, scheme: str
) -> None:
    tls = server_tls(certificates) if scheme == "tls" else None
    server = await start_server(node, ListenerSettings(port=0, tls=tls))
    client = client_tls(certificates, "alice") if scheme == "tls" else None
    big = b"compressible " * 20_000  # 260 kB
    async with (
        connect(server.url, vpn="certs" if tls else "default", tls=client, compression=True) as a,
        connect(server.url, vpn="certs" if tls else "default", tls=client) as b,
    ):
        assert a.welcome["compression"] == "lz4"  # the first both sides speak
        assert b.welcome["compression"] is None
        a.subscribe("zip/>")
        b.subscribe("zip/>")
        await a.confirm()
        await b.confirm()
        for i in range(3):
            a.publish(f"zip/{i}", big, headers={"i": i})
        got_a = [await receive(a) for _ in range(3)]
        got_b = [await receive(b) for _ in range(3)]
        b.publish("zip/back", b"from b")
        assert (await receive(a)).payload == b"from b"
        assert (await receive(b)).payload == b"from b"
    for got in (got_a, got_b):
        assert [(m.topic, m.payload, dict(m.headers)) for m in got] == [
            (f"zip/{i}", big, {"i": i}) for i in range(3)
        ]
    # Three 260 kB messages went each way for each session: compressed, far fewer bytes.
    stats = server.statistics()
    assert stats.bytes_received < len(big)
    assert stats.bytes_sent < 6 * len(big)


async def test_a_client_offering_only_zlib_gets_zlib(node: Node) -> None:
    # A client of a version before LZ4 offers zlib alone: the node still compresses.
    server = await start_server(node, ListenerSettings(port=0))
    async with await anyio.connect_tcp("127.0.0.1", server.port) as stream:
        protocol = LinkProtocol(Role.CLIENT, max_frame_size=MAX_FRAME_SIZE)
        protocol.hello({"vpn": "default", "compression": ["zlib"]})
        await stream.send(protocol.data_to_send())
        with anyio.fail_after(5):
            while protocol.state is ConnectionState.HANDSHAKE:
                protocol.receive_data(await stream.receive())
        assert protocol.compression == "zlib"
        protocol.send(FrameKind.SUBSCRIBE, {"id": 1, "subscription": "old/>"})
        await stream.send(protocol.data_to_send())
        with anyio.fail_after(5):
            answers: list[object] = []
            while not answers:
                answers = protocol.receive_data(await stream.receive())
        assert answers[0][0] == FrameKind.OK  # type: ignore[index]


@pytest.mark.parametrize("algorithm", ["lz4", "zlib"])
async def test_a_client_may_offer_one_algorithm(node: Node, algorithm: str) -> None:
    server = await start_server(node, ListenerSettings(port=0))
    async with connect(server.url, compression=algorithm) as session:
        assert session.welcome["compression"] == algorithm
        await check_messages_flow(session, b"y" * 10_000)


def test_an_unknown_algorithm_is_refused_before_connecting() -> None:
    with pytest.raises(ConfigurationError, match="compression must be true, false or one of"):
        connect("tcp://127.0.0.1:1", compression="brotli")


async def test_compression_refused_by_the_listener(node: Node) -> None:
    server = await start_server(node, ListenerSettings(port=0, compression=False))
    async with connect(server.url, compression=True) as session:
        assert session.welcome["compression"] is None
        await check_messages_flow(session, b"x" * 10_000)
