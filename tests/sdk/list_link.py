"""A link for tests of the core of links: it keeps what it is given to send."""

from __future__ import annotations

from typing import Any

from meshbus import DeliveryMode, Envelope, Link, Message, Vpn


class ListLink(Link):
    """A link that keeps (topic, hop count, message) of what it is given to send, and
    the mode each was routed with (a guaranteed one for a guaranteed message's direct
    copy)."""

    def __init__(self, vpn: Vpn, name: str, **options: Any) -> None:
        super().__init__(vpn, name, "test", **options)
        self.sent: list[tuple[str, int, Message]] = []
        self.modes: list[DeliveryMode] = []
        self.up = True

    def send(self, envelope: Envelope) -> bool:
        if not self.up:
            return False
        self.sent.append((envelope.message.topic, envelope.hop_count, envelope.message))
        self.modes.append(envelope.mode)
        return True

    @property
    def topics(self) -> list[str]:
        return [topic for topic, _, _ in self.sent]


def attached(vpn: Vpn, name: str, *interest: str, **options: Any) -> ListLink:
    """A :class:`ListLink` attached to ``vpn``, with ``interest``."""
    link = ListLink(vpn, name, **options)
    vpn.links.attach(link)
    for topic_filter in interest:
        link.add_interest(topic_filter)
    return link
