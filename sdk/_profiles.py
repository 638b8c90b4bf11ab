"""Client profiles, ACL profiles and client usernames (SPEC sections 2 and 6).

All three are frozen ``attrs`` values validated at construction: a bad
setting raises :class:`meshbus.ConfigurationError` naming the field, and the
VPN is left unchanged.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from typing import Any

import attrs

from ._topics import QUEUE_TOPIC_PREFIX, TopicLimits, parse_subscription
from .errors import ConfigurationError, InvalidTopicError

__all__ = [
    "AclAction",
    "AclProfile",
    "ClientProfile",
    "ClientUsername",
    "hash_password",
    "verify_password",
]


def _positive(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigurationError(
            f"{type(instance).__name__}.{attribute.name} must be a positive int, got {value!r}"
        )


def _non_negative(instance: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(
            f"{type(instance).__name__}.{attribute.name} must be an int >= 0, got {value!r}"
        )


def _flag(instance: object, attribute: attrs.Attribute[Any], value: bool) -> None:
    if not isinstance(value, bool):
        raise ConfigurationError(
            f"{type(instance).__name__}.{attribute.name} must be a bool, got {value!r}"
        )


def _name(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > 189:
        raise ConfigurationError(
            f"{type(instance).__name__}.{attribute.name} must be a non-empty name "
            f"of at most 189 characters, got {value!r}"
        )


@attrs.frozen
class ClientProfile:
    """What the sessions of a client username may do and how they are served."""

    name: str = attrs.field(validator=_name)
    """Unique within the VPN."""
    egress_max_messages: int = attrs.field(default=10_000, validator=_positive)
    """Most direct messages waiting for one slow consumer; beyond it the oldest is discarded."""
    egress_max_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=_positive)
    """Most bytes waiting for one slow consumer, each message counted by its whole
    :attr:`~meshbus.Message.size` (payload and headers)."""
    allow_shared_subscriptions: bool = attrs.field(default=True, validator=_flag)
    """Whether sessions may add ``#share/`` subscriptions (SPEC 3)."""
    allow_bridge_connections: bool = attrs.field(default=False, validator=_flag)
    """Whether a VPN bridge may log in with this profile (SPEC 7)."""
    allow_guaranteed_receive: bool = attrs.field(default=True, validator=_flag)
    """Whether sessions may bind flows to endpoints (SPEC 4)."""
    allow_guaranteed_send: bool = attrs.field(default=True, validator=_flag)
    """Whether sessions may publish guaranteed messages (SPEC 4)."""
    eliding_enabled: bool = attrs.field(default=False, validator=_flag)
    """Whether eliding applies to this profile's sessions (SPEC 5)."""
    eliding_delay_ms: int = attrs.field(default=0, validator=_non_negative)
    """Minimum time between two deliveries on one topic; 0 is congestion mode."""
    max_eliding_topics: int = attrs.field(default=256, validator=_positive)
    """Topics tracked per session for eliding before the oldest are aged out."""
    max_subscriptions: int = attrs.field(default=500_000, validator=_positive)
    """Most subscriptions one session may hold."""
    max_wildcard_levels: int = attrs.field(default=4096, validator=_positive)
    """Most levels one session's wildcard subscriptions may have in all.

    Each subscription whose filter has a wildcard (``*``, ``ab*``, a last ``>``),
    plain or shared, counts its filter's levels: ``a/*/c`` counts 3, ``#share/g/a/>``
    counts 2; exact filters count nothing. A subscription that would go over is
    refused with :class:`~meshbus.errors.LimitExceededError`.

    Why levels: a publish to a topic that a session's wildcard filters match only in
    part (say on every level but the last) may have to check each of their levels, so
    this sum, not the number of filters, bounds the work one session can add to a
    publish the match cache does not answer. The default lets a session hold about a
    thousand four-level wildcard filters and keeps that worst case under a millisecond
    per publish; raise it for a session that needs more, such as a bridge.
    """


class AclAction(enum.Enum):
    """Default action of an ACL rule; exceptions invert it."""

    ALLOW = "allow"
    DENY = "deny"


def _to_action(value: object) -> AclAction:
    if isinstance(value, AclAction):
        return value
    try:
        return AclAction(value)
    except ValueError:
        raise ConfigurationError(f"ACL action must be 'allow' or 'deny', got {value!r}") from None


def _to_exceptions(value: object, *, queues: bool = False) -> tuple[str, ...]:
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise ConfigurationError(f"ACL exceptions must be a list of filters, got {value!r}")
    out = tuple(value)
    for item in out:
        text = item
        # A queue is published to as the reserved topic #P2P/QUE/<name> (SPEC 4), so
        # publish exceptions may name queues; the part after the prefix is an
        # ordinary filter over queue names. Nobody subscribes to a queue topic.
        is_queue = isinstance(item, str) and item.startswith(QUEUE_TOPIC_PREFIX)
        if is_queue and queues:
            text = item[len(QUEUE_TOPIC_PREFIX) :]
        try:
            sub = parse_subscription(text, TopicLimits())
        except InvalidTopicError as exc:
            if is_queue and not queues:
                raise ConfigurationError(
                    f"ACL exception {item!r}: queue topics are for publish exceptions only"
                ) from None
            raise ConfigurationError(f"invalid ACL exception {item!r}: {exc}") from None
        if sub.is_shared or sub.no_export:
            raise ConfigurationError(f"ACL exception {item!r} must be a plain topic filter")
    return out


def _to_publish_exceptions(value: object) -> tuple[str, ...]:
    return _to_exceptions(value, queues=True)


@attrs.frozen
class AclProfile:
    """Which topics a session may publish to and which filters it may subscribe to.

    Each action has a default and a list of exception filters that invert it.
    Exceptions may contain ``$client-username`` and ``$client-name``, which
    are replaced by the session's values. How filters are judged:

    * publish: the topic is matched against the exceptions; sending to a queue by
      name is publishing to ``#P2P/QUE/<queue name>`` (an exception ``>`` covers
      it too, since ``>`` covers every topic);
    * subscribe with default *allow*: denied when the filter could receive a
      message on an exception topic (the filters overlap), so ``>`` is denied
      when ``secret/>`` is an exception;
    * subscribe with default *deny*: allowed only when an exception covers
      every topic the filter can match.
    """

    name: str = attrs.field(validator=_name)
    """Unique within the VPN."""
    connect_default: AclAction = attrs.field(default=AclAction.ALLOW, converter=_to_action)
    """Whether clients with this profile may log in at all."""
    publish_default: AclAction = attrs.field(default=AclAction.ALLOW, converter=_to_action)
    """Default for publishing to a topic."""
    publish_exceptions: tuple[str, ...] = attrs.field(default=(), converter=_to_publish_exceptions)
    """Filters whose topics get the opposite of ``publish_default``; a queue is the
    topic ``#P2P/QUE/<queue name>``, so ``#P2P/QUE/orders`` names queue ``orders``."""
    subscribe_default: AclAction = attrs.field(default=AclAction.ALLOW, converter=_to_action)
    """Default for subscribing to a filter."""
    subscribe_exceptions: tuple[str, ...] = attrs.field(default=(), converter=_to_exceptions)
    """Filters that get the opposite of ``subscribe_default``."""


# --- passwords ---------------------------------------------------------------------------

# scrypt with these costs takes ~20 ms here: cheap for a login, costly for a guesser.
_SCRYPT_N, _SCRYPT_R, _SCRYPT_P = 2**14, 8, 1


def hash_password(password: str) -> str:
    """Hash a password for storage (``scrypt$N$r$p$salt$hash``, hex encoded)."""
    if not isinstance(password, str) or not password:
        raise ConfigurationError("a password must be a non-empty str")
    salt = os.urandom(16)
    digest = hashlib.scrypt(
        password.encode(), salt=salt, n=_SCRYPT_N, r=_SCRYPT_R, p=_SCRYPT_P, dklen=32
    )
    return f"scrypt${_SCRYPT_N}${_SCRYPT_R}${_SCRYPT_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    """Whether ``password`` matches a hash made by :func:`hash_password` (constant time)."""
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = bytes.fromhex(digest)
        actual = hashlib.scrypt(
            password.encode(),
            salt=bytes.fromhex(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
        )
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(actual, expected)


def _password_hash(instance: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not (isinstance(value, str) and value.startswith("scrypt$")):
        raise ConfigurationError(
            "ClientUsername.password_hash must come from meshbus.hash_password() "
            "(pass password= to Vpn.add_user to hash a plain password)"
        )


_IDENTITY_FORBIDDEN = frozenset("/*>#\x00")


def check_identity(kind: str, value: object) -> str:
    """Check that ``value`` can be a username or client name (``kind`` says which, in
    the error) and return it: a non-empty string of at most 189 characters without
    ``/``, ``*``, ``>``, ``#`` or NUL, since ACL substitution puts it in a topic as one
    literal level. A plugin that takes names from another protocol (an MQTT client
    id) checks them with it before a login.

    :raises ConfigurationError: it cannot be one, and why.
    """
    if not isinstance(value, str) or not value or len(value) > 189:
        raise ConfigurationError(f"{kind} must be a non-empty str of at most 189 characters")
    bad = _IDENTITY_FORBIDDEN.intersection(value)
    if bad:
        raise ConfigurationError(
            f"{kind} {value!r} may not contain {', '.join(sorted(repr(c) for c in bad))}"
        )
    return value


def _identity(instance: object, attribute: attrs.Attribute[Any], value: str) -> None:
    check_identity("username", value)


@attrs.frozen
class ClientUsername:
    """A login name in a VPN, mapping to a client profile and an ACL profile."""

    name: str = attrs.field(validator=_identity)
    """The username clients log in with."""
    client_profile: str = attrs.field(default="default", validator=_name)
    """Name of its :class:`ClientProfile`."""
    acl_profile: str = attrs.field(default="default", validator=_name)
    """Name of its :class:`AclProfile`."""
    password_hash: str | None = attrs.field(default=None, validator=_password_hash, repr=False)
    """Hashed password for basic authentication, or ``None`` (no password can log in)."""
    enabled: bool = attrs.field(default=True, validator=_flag)
    """Disabled usernames cannot log in."""
    subscription_manager: bool = attrs.field(default=False, validator=_flag)
    """Whether its sessions may add and remove subscriptions for other sessions."""
    management: bool = attrs.field(default=False, validator=_flag)
    """Whether its sessions may read node-wide statistics: the node's totals, every
    VPN's and every listener's. Other sessions see their own VPN's only (SPEC 6)."""
