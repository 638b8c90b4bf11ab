"""What crossing a link changes in a message: its origin, its hop count, and the mode
its direct copy is marked with (see :mod:`meshbus._links`)."""

from __future__ import annotations

import attrs

from ._messages import DEFAULT_OPTIONS, DeliveryMode, Message

__all__ = ["as_direct", "restamped", "with_mode", "with_origin"]

_new = object.__new__
_DIRECT = DeliveryMode.DIRECT


def with_origin(message: Message, origin: tuple[str, int]) -> Message:
    """``message`` with its origin set (the first time it leaves its node)."""
    return restamped(message, origin, message.hop_count)


def restamped(message: Message, origin: tuple[str, int] | None, hop_count: int) -> Message:
    """``message`` with another origin and hop count (what crossing a link changes)."""
    # Slot by slot (not make_message): it runs for every message crossing a link. The
    # options and the size are the same.
    new: Message = _new(Message)
    new.topic = message.topic  # type: ignore[misc]
    new.payload = message.payload  # type: ignore[misc]
    new.sender = message.sender  # type: ignore[misc]
    new.timestamp = message.timestamp  # type: ignore[misc]
    new.options = message.options  # type: ignore[misc]
    new.origin = origin  # type: ignore[misc]
    new.hop_count = hop_count  # type: ignore[misc]
    new.size = message.size  # type: ignore[misc]
    return new


def as_direct(message: Message) -> Message:
    """The direct message a guaranteed ``message`` is routed as (its direct copy): the
    same but for its delivery mode."""
    options = attrs.evolve(message.options, delivery_mode=_DIRECT)
    new = restamped(message, message.origin, message.hop_count)
    new.options = DEFAULT_OPTIONS if options == DEFAULT_OPTIONS else options  # type: ignore[misc]
    return new


def with_mode(message: Message, mode: DeliveryMode) -> Message:
    """The direct copy ``message`` of a guaranteed message marked with ``mode``, the
    mode it really has, to cross a link that carries modes in messages (the inverse
    of :func:`as_direct`)."""
    new = restamped(message, message.origin, message.hop_count)
    new.options = attrs.evolve(message.options, delivery_mode=mode)  # type: ignore[misc]
    return new
