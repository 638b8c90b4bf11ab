"""Logins with a password (SPEC 6): checked off the event loop with bounded concurrency,
refused with one answer after the same work whatever the reason, and slowed down
when they fail repeatedly from one address or for one username (on the node's clock)."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from meshbus import (
    AccessDeniedError,
    AclProfile,
    AuthenticationError,
    ConfigurationError,
    LoginGuard,
    ManualClock,
    Node,
    Session,
    StateError,
    Vpn,
)

REFUSED = "login refused"


class Scrypt:
    """Stands in for :func:`hashlib.scrypt`: a cheap digest of the same inputs, and a
    record of the thread each call ran on. ``gate`` (when set) holds calls until opened."""

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.active = 0
        self.peak = 0
        self.gate: threading.Event | None = None
        self._lock = threading.Lock()

    def __call__(
        self, password: bytes, *, salt: bytes, n: int, r: int, p: int, dklen: int
    ) -> bytes:
        with self._lock:
            self.threads.append(threading.get_ident())
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            if self.gate is not None:
                assert self.gate.wait(10), "the test never opened the gate"
            return hashlib.sha256(password + salt + f"{n},{r},{p}".encode()).digest()[:dklen]
        finally:
            with self._lock:
                self.active -= 1

    @property
    def calls(self) -> int:
        return len(self.threads)


@pytest.fixture
def scrypt(monkeypatch: pytest.MonkeyPatch) -> Scrypt:
    fake = Scrypt()
    monkeypatch.setattr(hashlib, "scrypt", fake)
    return fake


@pytest.fixture
def secure(meshbus_node: Node, scrypt: Scrypt) -> Vpn:
    """A VPN with basic authentication and a few kinds of users (made before counting)."""
    vpn = meshbus_node.create_vpn("secure", authentication="basic")
    vpn.add_user("alice", password="s3cret")
    vpn.add_user("bob", password="hunter2")
    vpn.add_user("off", password="s3cret", enabled=False)
    vpn.add_user("nopass")
    scrypt.threads.clear()
    return vpn


async def eventually(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Wait for ``condition`` (a worker thread may have to finish first)."""
    with anyio.fail_after(timeout):
        while not condition():
            await anyio.sleep(0.001)


async def login_now(node: Node, **login: Any) -> Session | AuthenticationError:
    """Log in to VPN "secure"; fail the test (rather than hang) if the login waits
    for its turn on the node's manual clock."""
    clock = node.clock
    assert isinstance(clock, ManualClock)
    await clock.settle()
    idle = clock.sleepers
    attempt = Attempt(node, **login)
    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt.run)
        await eventually(lambda: attempt.done or clock.sleepers > idle)
        waited = not attempt.done
        tg.cancel_scope.cancel()
    assert not waited, f"the login {login} had to wait"
    assert attempt.result is not None
    assert not isinstance(attempt.result, BaseException) or isinstance(
        attempt.result, AuthenticationError
    )
    return attempt.result  # type: ignore[return-value]


async def refused(node: Node, **login: Any) -> AuthenticationError:
    """A login that is refused at once."""
    result = await login_now(node, **login)
    assert isinstance(result, AuthenticationError), result
    return result


class Attempt:
    """One login running in the background, so a test can see it wait on the clock."""

    def __init__(self, node: Node, **login: Any) -> None:
        self.node = node
        self.login = login
        self.result: Session | BaseException | None = None

    async def run(self) -> None:
        try:
            self.result = await self.node.login("secure", **self.login)
        except AuthenticationError as exc:
            self.result = exc

    @property
    def done(self) -> bool:
        return self.result is not None


# --- hashing off the event loop ------------------------------------------------------------


async def test_a_password_is_checked_in_a_worker_thread(
    meshbus_node: Node, secure: Vpn, scrypt: Scrypt
) -> None:
    session = await meshbus_node.login("secure", username="alice", password="s3cret")
    assert isinstance(session, Session)
    assert session.user is secure.users["alice"]
    assert scrypt.calls == 1
    assert threading.get_ident() not in scrypt.threads
    await refused(meshbus_node, username="alice", password="wrong")
    assert scrypt.calls == 2
    assert threading.get_ident() not in scrypt.threads


async def test_connect_refuses_to_check_a_password_on_the_event_loop(
    meshbus_node: Node, secure: Vpn, scrypt: Scrypt
) -> None:
    for username in ("alice", "mallory"):  # the same answer whether the user exists or not
        with pytest.raises(StateError, match=r"await node\.login"):
            meshbus_node.connect("secure", username=username, password="s3cret")
    assert scrypt.calls == 0
    assert secure.sessions == {}
    # What needs no password check still logs in synchronously.
    session = meshbus_node.connect(username="anyone", password="ignored")
    assert session.vpn.name == "default"
    with pytest.raises(AuthenticationError, match=REFUSED):
        meshbus_node.connect("secure", username="alice")  # no password: refused at once
    assert scrypt.calls == 0


async def test_hashing_runs_on_a_bounded_number_of_threads(
    meshbus_node: Node, meshbus_clock: ManualClock, secure: Vpn, scrypt: Scrypt
) -> None:
    guard = meshbus_node.logins = LoginGuard(meshbus_clock, hash_threads=1)
    scrypt.gate = threading.Event()
    results: list[object] = []

    async def login(username: str, password: str) -> None:
        try:
            results.append(await meshbus_node.login("secure", username=username, password=password))
        except AuthenticationError as exc:
            results.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(login, "alice", "s3cret")
        tg.start_soon(login, "bob", "wrong")
        tg.start_soon(login, "mallory", "guess")
        try:
            # One check runs; the two others wait for the thread, not beside it.
            await eventually(
                lambda: scrypt.active == 1 and guard.limiter.statistics().tasks_waiting == 2
            )
            assert guard.limiter.borrowed_tokens == 1
        finally:
            scrypt.gate.set()
    assert scrypt.peak == 1
    assert scrypt.calls == 3
    assert sum(isinstance(r, Session) for r in results) == 1
    assert sum(isinstance(r, AuthenticationError) for r in results) == 2


# --- one answer, the same work ------------------------------------------------------------


@pytest.mark.parametrize(
    ("username", "password", "reason"),
    [
        ("alice", "wrong", "wrong password"),
        ("mallory", "s3cret", "unknown username"),
        ("off", "s3cret", "disabled"),
        ("nopass", "anything", "no password"),
    ],
)
async def test_every_refusal_gives_one_answer_after_the_same_work(
    meshbus_node: Node,
    secure: Vpn,
    scrypt: Scrypt,
    username: str,
    password: str,
    reason: str,
) -> None:
    error = await refused(meshbus_node, username=username, password=password)
    assert str(error) == f"connect denied for user {username!r}: {REFUSED}"
    assert (error.username, error.why) == (username, REFUSED)
    # One password check each, against the user's hash or a dummy one, so that no
    # refusal is quicker than another.
    assert scrypt.calls == 1
    assert secure.statistics().login_failures == 1
    # The real reason stays with the node (a listener logs it; see test_tls.py).
    assert reason in error.reason


async def test_certificate_refusals_give_the_same_answer(meshbus_node: Node) -> None:
    vpn = meshbus_node.create_vpn("certs", authentication="client-certificate")
    vpn.add_user("alice")
    vpn.add_user("bob")
    vpn.add_user("off", enabled=False)
    for username, certificate in [
        ("alice", None),  # no certificate
        ("carol", "carol"),  # no such user
        ("bob", "alice"),  # somebody else's certificate
        ("off", "off"),  # disabled
    ]:
        with pytest.raises(AuthenticationError) as info:
            await meshbus_node.login("certs", username=username, certificate_name=certificate)
        assert info.value.why == REFUSED
    assert vpn.statistics().login_failures == 4
    session = await meshbus_node.login("certs", username="alice", certificate_name="alice")
    assert session.user is vpn.users["alice"]


async def test_a_client_name_in_use_is_told_only_after_authentication(
    meshbus_node: Node,
) -> None:
    vpn = meshbus_node.create_vpn("certs", authentication="client-certificate")
    vpn.add_user("alice")
    vpn.open_session(username="alice", certificate_name="alice", client_name="app")
    # A stranger learns nothing about which client names are logged in.
    with pytest.raises(AuthenticationError, match=REFUSED):
        vpn.open_session(username="mallory", client_name="app")
    with pytest.raises(StateError, match="already in use"):
        vpn.open_session(username="alice", certificate_name="alice", client_name="app")


async def test_refusals_after_authentication_say_why(meshbus_node: Node, secure: Vpn) -> None:
    secure.add_acl_profile(AclProfile("nobody", connect_default="deny"))
    secure.add_user("blocked", password="pw", acl_profile="nobody")
    with pytest.raises(AccessDeniedError, match="ACL profile 'nobody'"):
        await meshbus_node.login("secure", username="blocked", password="pw")
    await meshbus_node.login("secure", username="alice", password="s3cret", client_name="a")
    with pytest.raises(StateError, match="already in use"):
        await meshbus_node.login("secure", username="alice", password="s3cret", client_name="a")
    assert secure.statistics().login_failures == 1


async def test_an_unknown_vpn_is_refused(meshbus_node: Node) -> None:
    with pytest.raises(AuthenticationError, match="no Message VPN named 'nowhere'") as info:
        await meshbus_node.login("nowhere", username="bob", password="pw")
    assert info.value.username == "bob"


# --- slowing down repeated failures ----------------------------------------------------------


async def test_repeated_failures_from_one_address_are_slowed_down(
    meshbus_node: Node, meshbus_clock: ManualClock, secure: Vpn, scrypt: Scrypt
) -> None:
    here, there = "192.0.2.7", "198.51.100.1"
    for i in range(5):  # distinct usernames: only the address adds up
        await refused(meshbus_node, username=f"user-{i}", password="x", address=here)
    idle = meshbus_clock.sleepers
    # The sixth attempt from that address waits for its turn, even with the right password.
    attempt = Attempt(meshbus_node, username="bob", password="hunter2", address=here)
    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt.run)
        await eventually(lambda: meshbus_clock.sleepers == idle + 1)
        assert scrypt.calls == 5  # not checked while it waits
        # Another address is not held up meanwhile.
        session = await meshbus_node.login(
            "secure", username="alice", password="s3cret", address=there
        )
        assert session.username == "alice"
        assert not attempt.done
        meshbus_clock.advance(0.9)
        await meshbus_clock.settle()
        assert not attempt.done
        meshbus_clock.advance(0.1)
    assert isinstance(attempt.result, Session)
    assert attempt.result.username == "bob"


async def test_an_attempt_held_up_by_its_address_holds_up_nobody_else(
    meshbus_node: Node, meshbus_clock: ManualClock, secure: Vpn
) -> None:
    # An attacker's address waits for its turn; its attempt naming bob must not make
    # bob's own logins from elsewhere wait behind it.
    flooded = "192.0.2.66"
    for i in range(5):
        await refused(meshbus_node, username=f"user-{i}", password="x", address=flooded)
    idle = meshbus_clock.sleepers
    held = Attempt(meshbus_node, username="bob", password="guess", address=flooded)
    async with anyio.create_task_group() as tg:
        tg.start_soon(held.run)
        await eventually(lambda: meshbus_clock.sleepers == idle + 1)
        session = await login_now(meshbus_node, username="bob", password="hunter2")
        assert isinstance(session, Session)
        assert not held.done
        meshbus_clock.advance(1.0)
    assert isinstance(held.result, AuthenticationError)


async def test_repeated_failures_for_one_username_are_slowed_down_from_any_address(
    meshbus_node: Node, meshbus_clock: ManualClock, secure: Vpn, scrypt: Scrypt
) -> None:
    for i in range(5):
        await refused(meshbus_node, username="bob", password=f"guess-{i}", address=f"192.0.2.{i}")
    idle = meshbus_clock.sleepers
    attempt = Attempt(meshbus_node, username="bob", password="guess-5", address="192.0.2.99")
    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt.run)
        await eventually(lambda: meshbus_clock.sleepers == idle + 1)
        # Other usernames are not held up, from the same addresses either.
        await meshbus_node.login("secure", username="alice", password="s3cret", address="192.0.2.0")
        assert not attempt.done
        meshbus_clock.advance(1.0)
    assert isinstance(attempt.result, AuthenticationError)
    assert scrypt.calls == 7
    # In-process logins (no address) count for the username too.
    idle = meshbus_clock.sleepers
    attempt = Attempt(meshbus_node, username="bob", password="hunter2")
    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt.run)
        await eventually(lambda: meshbus_clock.sleepers == idle + 1)
        meshbus_clock.advance(2.0)  # the delay doubled with the sixth failure
    assert isinstance(attempt.result, Session)


async def test_concurrent_attempts_take_turns_and_too_long_a_queue_is_refused_unchecked(
    meshbus_node: Node, meshbus_clock: ManualClock, secure: Vpn, scrypt: Scrypt
) -> None:
    meshbus_node.logins = LoginGuard(
        meshbus_clock, free_failures=1, first_delay=1.0, max_delay=60.0, max_wait=5.0
    )
    await refused(meshbus_node, username="bob", password="x", address="192.0.2.7")
    # Four guesses at once: they do not all get checked together after one delay,
    # but one after another, each waiting longer (1 s, then 2 s later, 4 s later...).
    attempts = [
        Attempt(meshbus_node, username="bob", password=f"guess-{i}", address="192.0.2.7")
        for i in range(4)
    ]

    def done() -> int:
        return sum(attempt.done for attempt in attempts)

    async with anyio.create_task_group() as tg:
        for attempt in attempts:
            tg.start_soon(attempt.run)
        await meshbus_clock.settle()
        assert (done(), scrypt.calls) == (0, 1)
        await meshbus_clock.run(1.0)
        await eventually(lambda: done() == 1)
        assert scrypt.calls == 2
        await meshbus_clock.run(2.0)
        await eventually(lambda: done() == 2)
        assert scrypt.calls == 3
        # The later two would have to wait beyond max_wait: refused at max_wait, unchecked.
        await meshbus_clock.run(2.0)
        await eventually(lambda: done() == 4)
    assert scrypt.calls == 3
    assert all(isinstance(a.result, AuthenticationError) for a in attempts)
    reasons = sorted(a.result.reason for a in attempts if isinstance(a.result, AuthenticationError))
    assert reasons == ["too many failed logins, so not checked"] * 2 + ["wrong password"] * 2


async def test_a_successful_login_forgets_the_usernames_failures(
    meshbus_node: Node, meshbus_clock: ManualClock, secure: Vpn
) -> None:
    # Eight failures and none of them waits (refused() fails on a wait): each
    # success starts the count again.
    for _ in range(2):
        for i in range(4):
            await refused(meshbus_node, username="alice", password=f"typo-{i}")
        assert isinstance(
            await login_now(meshbus_node, username="alice", password="s3cret"), Session
        )


async def test_failures_are_forgiven_as_time_passes(
    meshbus_node: Node, meshbus_clock: ManualClock, secure: Vpn
) -> None:
    for i in range(5):
        await refused(meshbus_node, username="bob", password=f"guess-{i}")
    meshbus_clock.advance(60.0)  # one failure forgiven: the next goes at once
    await refused(meshbus_node, username="bob", password="guess-5")
    idle = meshbus_clock.sleepers
    attempt = Attempt(meshbus_node, username="bob", password="hunter2")
    async with anyio.create_task_group() as tg:
        tg.start_soon(attempt.run)
        await eventually(lambda: meshbus_clock.sleepers == idle + 1)
        meshbus_clock.advance(1.0)
    assert isinstance(attempt.result, Session)


async def test_the_tracking_table_is_bounded(
    meshbus_node: Node, meshbus_clock: ManualClock, secure: Vpn
) -> None:
    guard = meshbus_node.logins = LoginGuard(meshbus_clock, max_tracked=10)
    for i in range(50):
        await refused(meshbus_node, username=f"user-{i}", password="x", address=f"10.0.0.{i}")
    assert guard.tracked == 10


def test_refused_logins_are_logged_as_warnings_at_a_bounded_rate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "tests.logins")
    logger = logging.getLogger("tests.logins")
    clock = ManualClock()
    guard = LoginGuard(clock, log_burst=3, log_interval=60.0)
    for i in range(10):
        guard.log_refusal(logger, f"192.0.2.{i}", "wrong password")
    levels = [r.levelno for r in caplog.records]
    assert levels == [logging.WARNING] * 3 + [logging.DEBUG] * 7  # none lost, few loud
    assert caplog.records[0].getMessage() == "refused login from 192.0.2.0: wrong password"
    clock.advance(60.0)
    guard.log_refusal(logger, "192.0.2.10", "unknown username")
    last = caplog.records[-1]
    assert last.levelno == logging.WARNING
    assert last.getMessage() == (
        "refused login from 192.0.2.10: unknown username "
        "(7 more refused logins were logged at DEBUG level only)"
    )


def test_login_guard_settings_are_validated() -> None:
    clock = ManualClock()
    for bad in (
        {"hash_threads": 0},
        {"free_failures": -1},
        {"first_delay": 0},
        {"max_delay": -1.0},
        {"max_wait": "5"},
        {"forgive_after": 0},
        {"max_tracked": 0},
        {"log_burst": 0},
        {"log_interval": 0},
    ):
        with pytest.raises(ConfigurationError, match=next(iter(bad))):
            LoginGuard(clock, **bad)
