"""One VPN's retained values: the last message kept per topic, within the VPN's limits."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from meshbus import ConfigurationError, Message, PublishRejectedError, make_message

from ._tree import TopicTree

__all__ = ["RetainedLimits", "RetainedStatistics", "RetainedStore"]


def _positive(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{attribute.name} must be a positive int, got {value!r}")


@attrs.frozen
class RetainedLimits:
    """How much one VPN keeps (SPEC 12). A retained publish over a limit is refused
    with :class:`~meshbus.PublishRejectedError` (reason ``"retained-limit"``) and is
    neither kept nor delivered; replacing or clearing a topic's value is always allowed
    when the new value fits."""

    max_topics: int = attrs.field(default=10_000, validator=_positive)
    """Topics with a value, at most."""
    max_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=_positive)
    """Bytes the kept messages take in all (payload and headers, :attr:`Message.size`)."""


@attrs.frozen
class RetainedStatistics:
    """What a VPN's retained store holds and has done."""

    topics: int
    """Topics with a value now."""
    size: int
    """Bytes those values take (their :attr:`~meshbus.Message.size`)."""
    kept: int
    """Retained publishes kept (new values and replacements)."""
    cleared: int
    """Values cleared by an empty retained payload (or expired)."""
    refused: int
    """Retained publishes refused by a limit."""
    delivered: int
    """Retained values delivered to new subscriptions."""


class RetainedStore:
    """The retained values of one VPN."""

    def __init__(
        self,
        vpn: str,
        limits: RetainedLimits,
        now: Callable[[], float],
        changed: Callable[[str, str, Message | None], None],
    ) -> None:
        self.vpn = vpn
        self.limits = limits
        self._now = now
        self._changed = changed  # (vpn, topic, value or None): what durability writes
        self._tree: TopicTree[Message] = TopicTree()
        self.size = 0
        self.kept = 0
        self.cleared = 0
        self.refused = 0
        self.delivered = 0

    def __len__(self) -> int:
        return len(self._tree)

    def get(self, topic: str) -> Message | None:
        """The value kept for ``topic`` (flagged ``retained``), or ``None``."""
        message = self._tree.get(topic)
        if message is not None and self._expired(message):
            self._drop(topic)
            return None
        return message

    def topics(self) -> list[str]:
        """The topics with a value."""
        return [topic for topic, _ in self._tree.items()]

    def check(self, topic: str, size: int) -> None:
        """Raise if a value of ``size`` bytes for ``topic`` would go over a limit."""
        old = self._tree.get(topic)
        limits = self.limits
        if old is None and len(self._tree) >= limits.max_topics:
            self.refused += 1
            raise PublishRejectedError(
                "retained-limit",
                f"VPN {self.vpn!r} keeps retained values for {limits.max_topics} topics "
                f"already (max_topics); {topic!r} was not published",
                limits.max_topics,
                len(self._tree) + 1,
            )
        after = self.size - (0 if old is None else old.size) + size
        if after > limits.max_bytes:
            self.refused += 1
            raise PublishRejectedError(
                "retained-limit",
                f"VPN {self.vpn!r}'s retained values would take {after} bytes, over its "
                f"max_bytes of {limits.max_bytes}; {topic!r} was not published",
                limits.max_bytes,
                after,
            )

    def keep(self, message: Message) -> None:
        """Keep ``message`` as its topic's value; an empty payload clears the value."""
        topic = message.topic
        if not message.payload:
            if self._drop(topic):
                self.cleared += 1
            return
        self.check(topic, message.size)
        self.restore(as_retained(message))
        self.kept += 1
        self._changed(self.vpn, topic, message)

    def restore(self, message: Message) -> None:
        """Put a value back (from disk at start), limits not checked."""
        old = self._tree.get(message.topic)
        if old is not None:
            self.size -= old.size
        self._tree.put(message.topic, message)
        self.size += message.size

    def matching(self, filter: str) -> list[Message]:
        """The values of every topic ``filter`` matches (expired ones are dropped)."""
        found = self._tree.matching(filter)
        if any(m.expires_at is not None for m in found):
            now = self._now()
            for message in [m for m in found if m.expires_at is not None and m.expires_at <= now]:
                self._drop(message.topic)
                self.cleared += 1
            found = [m for m in found if m.expires_at is None or m.expires_at > now]
        return found

    def statistics(self) -> RetainedStatistics:
        """Counts and sizes, now."""
        return RetainedStatistics(
            len(self._tree), self.size, self.kept, self.cleared, self.refused, self.delivered
        )

    def _expired(self, message: Message) -> bool:
        return message.expires_at is not None and message.expires_at <= self._now()

    def _drop(self, topic: str) -> bool:
        old = self._tree.pop(topic)
        if old is None:
            return False
        self.size -= old.size
        self._changed(self.vpn, topic, None)
        return True


def as_retained(message: Message) -> Message:
    """``message`` as new subscriptions get it: flagged ``retained`` (and ``retain``)."""
    options = attrs.evolve(message.options, retain=True, retained=True)
    return make_message(
        message.topic,
        message.payload,
        message.sender,
        message.timestamp,
        options,
        message.origin,
        message.hop_count,
    )
