"""The node's defences around logins (SPEC 6): see :class:`LoginGuard`."""

from __future__ import annotations

import logging
import math
import os
from collections import OrderedDict
from collections.abc import Iterable

import anyio
import anyio.to_thread

from ._profiles import _SCRYPT_N, _SCRYPT_P, _SCRYPT_R, verify_password
from .abc import Clock
from .errors import AuthenticationError, ConfigurationError

__all__ = ["REFUSED", "LoginGuard", "Turn"]

REFUSED = "login refused"
"""What a refused client is told, whatever the reason (SPEC 6)."""

# Well formed, with the costs of hash_password(), and matched by no password (its
# digest is zeros): checking against it costs what checking a real hash costs.
_DUMMY_HASH = f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${'00' * 16}${'00' * 32}"

Key = tuple[str, ...]


class Turn:
    """When one login attempt is checked, from :meth:`LoginGuard.wait_turn`."""

    __slots__ = ("at", "taken")

    def __init__(self, at: float) -> None:
        #: The node clock's monotonic time of the check.
        self.at = at
        # (key, its record, this attempt's turn by that key alone, the next turn it
        # set for the key), for succeeded()
        self.taken: list[tuple[Key, _Record, float, float]] = []


class _Record:
    """Recent failures of one key and when its next attempt may be checked."""

    __slots__ = ("failures", "turn", "updated")

    def __init__(self, now: float) -> None:
        self.failures = 0.0
        self.turn = now  # the monotonic time before which no attempt of this key is checked
        self.updated = now


class LoginGuard:
    """Checks passwords in worker threads and slows down repeated failed logins (SPEC 6).

    Every node has one, :attr:`meshbus.Node.logins`, and every login made with
    :meth:`meshbus.Node.login` (which listeners use for their clients) goes
    through it. Replace it to change the settings::

        node.logins = LoginGuard(node.clock, max_delay=300)

    **Hashing off the event loop.** A password is checked with scrypt, which is
    slow on purpose (tens of milliseconds). It runs in worker threads, at most
    ``hash_threads`` at once, so other sessions keep their latency while logins
    queue for a thread.

    **One answer, the same work.** A failed authentication is refused with
    ``login refused`` whatever went wrong (unknown username, wrong or missing
    password, disabled username, missing or mismatched client certificate).
    A username that does not exist, is disabled or has no password is checked
    against a dummy hash, so no refusal comes sooner than another. The real
    reason is the error's ``reason``; a listener logs it, at ``WARNING`` for
    at most ``log_burst`` refusals per ``log_interval`` seconds and at
    ``DEBUG`` beyond, so a flood of bad logins cannot flood the log.

    **Repeated failures wait.** Recent failures are counted per address and
    per username (each is forgiven ``forgive_after`` seconds later). Up to
    ``free_failures`` of them cost nothing; beyond, the attempts under that
    key take turns: each is checked no sooner than the previous one's turn
    plus a delay that starts at ``first_delay`` and doubles with each further
    failure, up to ``max_delay``. Taking turns, instead of all waiting out one
    delay, means that opening many connections at once does not multiply the
    rate of guesses. An attempt waits for the later of its address's and its
    username's turns, but each key's next turn follows from its own, so an
    attempt held up by its address does not hold up other logins of the same
    username. An attempt whose turn is more than ``max_wait`` seconds away is
    held that long and refused without a check. A successful login
    clears its username's count and takes only its own failure off its
    address's. Time is the node's clock; at most ``max_tracked`` addresses and
    usernames are tracked (the least recently used are forgotten first).

    With the defaults a user can mistype a password a few times without
    noticing, and a guesser gets one check a minute per address and per
    username. An address under attack is slowed down for everyone behind it,
    a username under attack for its owner too, as with any account lockout.

    :param clock: the node's clock.
    :param hash_threads: most passwords checked at once; the default is half the
        CPUs (at least one), which leaves the others to the event loop.
    :param free_failures: recent failures per key that cost no delay.
    :param first_delay: seconds between turns after ``free_failures`` failures.
    :param max_delay: the most seconds between turns.
    :param forgive_after: seconds after which each failure no longer counts.
    :param max_wait: the longest an attempt waits for its turn.
    :param max_tracked: the most addresses and usernames tracked at once.
    :param log_burst: refused logins logged at ``WARNING`` per ``log_interval``.
    :param log_interval: seconds of that logging budget.
    """

    def __init__(
        self,
        clock: Clock,
        *,
        hash_threads: int | None = None,
        free_failures: int = 5,
        first_delay: float = 1.0,
        max_delay: float = 60.0,
        forgive_after: float = 60.0,
        max_wait: float = 5.0,
        max_tracked: int = 10_000,
        log_burst: int = 20,
        log_interval: float = 60.0,
    ) -> None:
        if hash_threads is None:
            hash_threads = max(1, (os.cpu_count() or 2) // 2)
        _check_int("hash_threads", hash_threads, 1)
        _check_int("free_failures", free_failures, 0)
        _check_int("max_tracked", max_tracked, 1)
        _check_int("log_burst", log_burst, 1)
        for name, value in (
            ("first_delay", first_delay),
            ("max_delay", max_delay),
            ("forgive_after", forgive_after),
            ("max_wait", max_wait),
            ("log_interval", log_interval),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ConfigurationError(f"LoginGuard {name} must be a number > 0, got {value!r}")
        self.clock = clock
        self.free_failures = free_failures
        self.first_delay = float(first_delay)
        self.max_delay = float(max_delay)
        self.forgive_after = float(forgive_after)
        self.max_wait = float(max_wait)
        self.max_tracked = max_tracked
        self.log_burst = log_burst
        self.log_interval = float(log_interval)
        #: Bounds the worker threads that check passwords (``hash_threads`` tokens).
        self.limiter = anyio.CapacityLimiter(hash_threads)
        #: Passwords checked so far.
        self.checked = 0
        #: Attempts that had to wait for their turn.
        self.delayed = 0
        #: Attempts refused without a check because their turn was too far away.
        self.turned_away = 0
        self._records: OrderedDict[Key, _Record] = OrderedDict()
        # More failures than this add no delay, and would only make forgiving slower.
        doublings = math.ceil(math.log2(max(1.0, self.max_delay / self.first_delay)))
        self._most_failures = free_failures + 1 + doublings
        self._log_window = -float("inf")
        self._logged = 0
        self._quiet = 0  # refusals logged at DEBUG since the last warning

    def __repr__(self) -> str:
        return f"<LoginGuard tracked={self.tracked} checked={self.checked}>"

    @property
    def tracked(self) -> int:
        """Addresses and usernames with recent failures being tracked now."""
        return len(self._records)

    # --- turns -----------------------------------------------------------------------

    @staticmethod
    def keys(vpn: str, username: str, address: str | None) -> tuple[Key, ...]:
        """The keys one login counts under: its username in its VPN, and its address."""
        user: Key = ("user", vpn, username)
        return (user,) if address is None else (user, ("address", address))

    async def wait_turn(self, keys: Iterable[Key]) -> Turn | None:
        """Wait until an attempt under ``keys`` may be checked, and count it as a failure
        until :meth:`succeeded` takes that back.

        :returns: the attempt's turn, or ``None`` when it was more than ``max_wait``
            away: the attempt was held for ``max_wait`` and must be refused without
            a check.
        """
        now = self.clock.monotonic()
        records = [(key, self._record(key, now)) for key in keys]
        at = max([now, *(record.turn for _, record in records)])
        if at - now > self.max_wait:
            self.turned_away += 1
            for _, record in records:
                self._add_failure(record)
            await self.clock.sleep_until(now + self.max_wait)
            return None
        turn = Turn(at)
        for key, record in records:
            # Counted now, not when the check fails, so that attempts made together
            # take turns instead of all being checked at once.
            self._add_failure(record)
            # Each key's turns follow from its own: an attempt that waits for its
            # address must not make its username's other logins wait behind it.
            own = max(now, record.turn)
            record.turn = own + self._delay(record.failures)
            turn.taken.append((key, record, own, record.turn))
        if at > now:
            self.delayed += 1
        await self.clock.sleep_until(at)
        return turn

    def succeeded(self, turn: Turn) -> None:
        """The attempt that had ``turn`` gave the right credentials: take its failure back.

        A username's count starts again; an address only loses this attempt's
        failure, so that one good login there does not forgive a guesser's. The
        next turn moves back too, unless a later attempt has already taken it.
        """
        now = self.clock.monotonic()
        records = self._records
        for key, record, own, next_turn in turn.taken:
            self._forgive(record, now)
            record.failures = 0.0 if key[0] == "user" else max(0.0, record.failures - 1)
            if record.turn == next_turn:
                record.turn = own + self._delay(record.failures)
            if record.failures == 0 and record.turn <= now and records.get(key) is record:
                del records[key]

    def _record(self, key: Key, now: float) -> _Record:
        records = self._records
        record = records.get(key)
        if record is None:
            record = records[key] = _Record(now)
            if len(records) > self.max_tracked:
                records.popitem(last=False)
        else:
            records.move_to_end(key)
            self._forgive(record, now)
        return record

    def _forgive(self, record: _Record, now: float) -> None:
        elapsed = now - record.updated
        if elapsed > 0:
            record.failures = max(0.0, record.failures - elapsed / self.forgive_after)
            record.updated = now

    def _add_failure(self, record: _Record) -> None:
        record.failures = min(record.failures + 1, self._most_failures)

    def _delay(self, failures: float) -> float:
        if failures < self.free_failures:
            return 0.0
        return min(self.first_delay * math.pow(2.0, failures - self.free_failures), self.max_delay)

    # --- checking ----------------------------------------------------------------------

    async def verify(self, password: str, password_hash: str | None) -> bool:
        """Whether ``password`` matches ``password_hash``, checked in a worker thread.

        With ``None`` (no such user, or no password set) it checks against a dummy
        hash instead and returns ``False``, after the same work.
        """
        self.checked += 1
        matched = await anyio.to_thread.run_sync(
            verify_password,
            password,
            _DUMMY_HASH if password_hash is None else password_hash,
            limiter=self.limiter,
        )
        return matched and password_hash is not None

    # --- refusing ---------------------------------------------------------------------

    def refuse(self, username: str, reason: str) -> AuthenticationError:
        """The error for a failed authentication: it tells the client :data:`REFUSED`
        only, and keeps the real ``reason`` for the node's log."""
        return AuthenticationError(username, REFUSED, reason=reason)

    async def unknown_vpn(
        self, vpn: str, username: str, address: str | None
    ) -> AuthenticationError:
        """A login to a VPN that does not exist: it waits for the address's turn (so
        trying VPN names is slowed down too), and is the error to raise."""
        if address is not None:
            await self.wait_turn([("address", address)])
        return AuthenticationError(username, f"no Message VPN named {vpn!r}")

    def log_refusal(self, logger: logging.Logger, peer: str, reason: str) -> None:
        """Log that a login from ``peer`` was refused for ``reason``: at ``WARNING``
        while this interval's ``log_burst`` lasts, then at ``DEBUG``; the next
        warning says how many were logged at ``DEBUG`` only."""
        now = self.clock.monotonic()
        if now - self._log_window >= self.log_interval:
            self._log_window = now
            self._logged = 0
        if self._logged >= self.log_burst:
            self._quiet += 1
            logger.debug("refused login from %s: %s", peer, reason)
            return
        self._logged += 1
        quiet, self._quiet = self._quiet, 0
        note = f" ({quiet} more refused logins were logged at DEBUG level only)" if quiet else ""
        logger.warning("refused login from %s: %s%s", peer, reason, note)


def _check_int(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigurationError(f"LoginGuard {name} must be an int >= {least}, got {value!r}")
