"""Queue settings: a frozen value validated at construction (SPEC 4)."""

from __future__ import annotations

import enum
from typing import Any

import attrs

from meshbus import (
    QUEUE_TOPIC_PREFIX,
    ConfigurationError,
    InvalidTopicError,
    TopicLimits,
    parse_endpoint_subscription,
    validate_queue_topic,
)

__all__ = ["MAX_MESSAGE_SIZE", "META_HEADER", "AccessType", "QueueSettings", "endpoint_filter"]

#: The largest message the bus takes unless a queue says less (SPEC 4: 30 MB).
MAX_MESSAGE_SIZE = 30 * 1024 * 1024


#: Reserved header under which the spool keeps what a Message carries outside its
#: headers (sender, reply-to, correlation id); consumers never see it.
META_HEADER = "#meshbus"


class AccessType(enum.Enum):
    """How a queue shares its messages between bound consumer flows."""

    EXCLUSIVE = "exclusive"
    """One active flow gets everything; the others stand by and take over on its unbind."""
    NON_EXCLUSIVE = "non-exclusive"
    """Messages go round-robin to the bound flows."""


def _name(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if (
        not isinstance(value, str)
        or not value
        or len(value) > 200
        or value.startswith("#")
        or any(c in value for c in "*>\x00")
    ):
        what = "queue name" if attribute.name == "name" else f"queue setting {attribute.name}"
        raise ConfigurationError(
            f"{what} must be a non-empty str of at most 200 characters without "
            f"'*', '>' or NUL, not starting with '#'; got {value!r}"
        )


def _limit(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None and attribute.name in ("max_messages", "max_bytes"):
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ConfigurationError(
            f"queue setting {attribute.name} must be an int >= 0, got {value!r}"
        )
    if attribute.name == "max_message_size" and not 0 < value <= MAX_MESSAGE_SIZE:
        raise ConfigurationError(
            f"queue setting max_message_size must be 1..{MAX_MESSAGE_SIZE}, got {value!r}"
        )


def _flag(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigurationError(f"queue setting {attribute.name} must be a bool, got {value!r}")


def endpoint_filter(text: str, limits: TopicLimits | None = None) -> str:
    """The filter an endpoint subscription attracts. Besides what a session may
    subscribe, a queue may take another queue's topic, ``#P2P/QUE/<name>``: it then
    also gets what is sent to that queue by name (how a queue that holds messages for
    a link follows the queues of that name on the other side).

    :raises InvalidTopicError: it is neither.
    """
    if text.startswith(QUEUE_TOPIC_PREFIX):
        validate_queue_topic(text)
        return text
    if limits is None:
        return parse_endpoint_subscription(text).filter
    return parse_endpoint_subscription(text, limits).filter


def _subscriptions(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not hasattr(value, "__iter__"):
        raise ConfigurationError(f"queue subscriptions must be a list of filters, got {value!r}")
    out = tuple(value)
    for text in out:
        try:
            endpoint_filter(text)
        except InvalidTopicError as exc:
            raise ConfigurationError(f"invalid queue subscription: {exc}") from None
    return out


def _access(value: object) -> AccessType:
    try:
        return value if isinstance(value, AccessType) else AccessType(value)
    except ValueError:
        raise ConfigurationError(
            f"access_type must be 'exclusive' or 'non-exclusive', got {value!r}"
        ) from None


def _dmq(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _name(instance, attribute, value)


@attrs.frozen
class QueueSettings:
    """Everything that defines a queue. Invalid values raise ConfigurationError."""

    name: str = attrs.field(validator=_name)
    """Unique in its VPN."""
    subscriptions: tuple[str, ...] = attrs.field(default=(), converter=_subscriptions)
    """Topic filters whose guaranteed (and direct) messages the queue attracts."""
    access_type: AccessType = attrs.field(default=AccessType.EXCLUSIVE, converter=_access)
    """Exclusive (one active consumer) or non-exclusive (round-robin)."""
    max_messages: int | None = attrs.field(default=None, validator=_limit)
    """Quota in messages; ``None`` for none."""
    max_bytes: int | None = attrs.field(default=None, validator=_limit)
    """Quota in payload bytes; ``None`` for none."""
    max_message_size: int = attrs.field(default=MAX_MESSAGE_SIZE, validator=_limit)
    """Largest payload taken, in bytes."""
    max_redelivery: int = attrs.field(default=0, validator=_limit)
    """Deliveries after the first before the message goes to the DMQ; 0 retries forever."""
    dead_message_queue: str | None = attrs.field(default=None, validator=_dmq)
    """Queue (same VPN) for messages past max_redelivery or expired; ``None`` discards."""
    respect_ttl: bool = attrs.field(default=False, validator=_flag)
    """Whether messages past their TTL are expired instead of delivered."""
    ingress_enabled: bool = attrs.field(default=True, validator=_flag)
    """Whether publishes are accepted."""
    egress_enabled: bool = attrs.field(default=True, validator=_flag)
    """Whether flows may bind and receive."""
    reject_msg_to_sender_on_discard: bool = attrs.field(default=True, validator=_flag)
    """Whether a topic publish this queue cannot take is rejected to the publisher."""
    accept_direct: bool = attrs.field(default=True, validator=_flag)
    """Whether direct messages matching its subscriptions are spooled (as
    non-persistent, SPEC 4). A queue that holds guaranteed messages for a link to
    another node turns it off: direct messages cross links as direct messages."""
