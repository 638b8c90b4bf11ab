"""Topic and subscription-filter syntax (SPEC section 1).

A topic is a string of levels separated by ``/``. A filter adds two wildcards:
``*`` alone in a level matches exactly one level, ``ab*`` matches a level that
starts with ``ab``, and ``>`` as the last level alone matches one or more
further levels. Anywhere else ``*`` and ``>`` are literal characters.

This module only parses and validates; matching many filters at once is the
job of :mod:`meshbus._index`. The pairwise helpers here (:func:`filter_matches`,
:func:`filter_covers`, :func:`filters_overlap`) serve ACL checks, which compare
a handful of filters, never every subscription.
"""

from __future__ import annotations

import attrs

from .errors import InvalidTopicError

__all__ = [
    "Subscription",
    "TopicLimits",
    "filter_covers",
    "filter_matches",
    "filters_overlap",
    "from_mqtt_filter",
    "is_wildcard_filter",
    "parse_endpoint_subscription",
    "parse_subscription",
    "validate_queue_topic",
    "validate_topic",
]

SHARE_PREFIX = "#share/"
NOEXPORT_PREFIX = "#noexport/"
#: The reserved topic a queue is addressed by: ``#P2P/QUE/<queue name>`` (SPEC 4).
QUEUE_TOPIC_PREFIX = "#P2P/QUE/"


@attrs.frozen
class TopicLimits:
    """Size limits for topics and filters (SPEC 1 defaults)."""

    max_bytes: int = attrs.field(default=250, validator=attrs.validators.gt(0))
    """Longest topic or filter, in UTF-8 bytes."""
    max_levels: int = attrs.field(default=128, validator=attrs.validators.gt(0))
    """Most levels in a topic or filter."""


DEFAULT_LIMITS = TopicLimits()


@attrs.frozen
class Subscription:
    """A parsed subscription request.

    ``#noexport/#share/g/a/>`` parses to ``filter="a/>"``, ``share_name="g"``,
    ``no_export=True`` and keeps the original text in ``text``.
    """

    text: str
    """The subscription exactly as the client gave it."""
    filter: str
    """The topic filter, without reserved prefixes."""
    share_name: str | None = None
    """The ShareName of a ``#share/`` subscription, else ``None``."""
    no_export: bool = False
    """``True`` when the ``#noexport/`` prefix was given (never advertised to other nodes)."""

    @property
    def is_shared(self) -> bool:
        """Whether this is a shared subscription (SPEC 3)."""
        return self.share_name is not None


def _check_common(text: str, limits: TopicLimits, what: str) -> list[str]:
    if not isinstance(text, str):
        raise InvalidTopicError(repr(text), f"{what} must be a str, not {type(text).__name__}")
    if not text:
        raise InvalidTopicError(text, f"{what} is empty")
    if "\x00" in text:
        level = text[: text.index("\x00")].count("/") + 1
        raise InvalidTopicError(text, "NUL character is not allowed", level)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        level = text[: exc.start].count("/") + 1
        raise InvalidTopicError(text, "not valid UTF-8 (lone surrogate)", level) from None
    if size > limits.max_bytes:
        raise InvalidTopicError(text, f"{size} bytes is over the limit of {limits.max_bytes}")
    levels = text.split("/")
    if len(levels) > limits.max_levels:
        raise InvalidTopicError(
            text, f"{len(levels)} levels is over the limit of {limits.max_levels}"
        )
    return levels


def validate_topic(topic: str, limits: TopicLimits = DEFAULT_LIMITS) -> None:
    """Check a topic a client publishes to; raise :class:`InvalidTopicError` if invalid.

    Topics starting with ``#`` are reserved for the system and rejected.
    """
    _check_common(topic, limits, "topic")
    if topic.startswith("#"):
        raise InvalidTopicError(topic, "topics starting with '#' are reserved for the system", 1)


def validate_queue_topic(topic: str) -> str:
    """Check a queue's topic, ``#P2P/QUE/<name>`` (what a message sent to a queue by
    name carries, SPEC 4); return the queue's name or raise :class:`InvalidTopicError`."""
    if not isinstance(topic, str) or not topic.startswith(QUEUE_TOPIC_PREFIX):
        raise InvalidTopicError(repr(topic), f"a queue's topic starts with {QUEUE_TOPIC_PREFIX}")
    name = topic[len(QUEUE_TOPIC_PREFIX) :]
    if not name or len(name) > 200 or any(c in name for c in "*>\x00"):
        raise InvalidTopicError(
            topic, "a queue's topic names one queue: 1 to 200 characters, no '*', '>' or NUL"
        )
    return name


def parse_subscription(text: str, limits: TopicLimits = DEFAULT_LIMITS) -> Subscription:
    """Parse and validate a subscription, including ``#noexport/`` and ``#share/`` prefixes."""
    _check_common(text, limits, "subscription")
    rest = text
    no_export = False
    share_name = None
    offset = 0  # levels consumed by prefixes, so errors name the level in `text`
    if rest.startswith(NOEXPORT_PREFIX):
        no_export = True
        rest = rest[len(NOEXPORT_PREFIX) :]
        offset += 1
    if rest.startswith(SHARE_PREFIX):
        rest = rest[len(SHARE_PREFIX) :]
        name, sep, rest = rest.partition("/")
        offset += 2
        if not name:
            raise InvalidTopicError(text, "a shared subscription needs a ShareName", offset)
        if "*" in name or ">" in name:
            raise InvalidTopicError(text, "ShareName may not contain wildcards", offset)
        if not sep or not rest:
            raise InvalidTopicError(
                text, "a shared subscription needs a topic filter after the ShareName"
            )
        share_name = name
    if rest.startswith("#"):
        raise InvalidTopicError(
            text, "subscriptions starting with '#' are reserved for the system", offset + 1
        )
    if not rest:
        raise InvalidTopicError(text, "the topic filter is empty")
    return Subscription(text=text, filter=rest, share_name=share_name, no_export=no_export)


def parse_endpoint_subscription(text: str, limits: TopicLimits = DEFAULT_LIMITS) -> Subscription:
    """Parse a subscription for a queue or topic endpoint (SPEC 3, 4).

    As :func:`parse_subscription`, but shared subscriptions are refused: an
    endpoint is already a point of load sharing, so ``#share/`` means nothing there.
    """
    sub = parse_subscription(text, limits)
    if sub.is_shared:
        raise InvalidTopicError(
            text, "shared subscriptions are not allowed on queues or topic endpoints"
        )
    return sub


def wildcard_levels(filter: str) -> int:
    """What a filter counts against a client profile's ``max_wildcard_levels``: its
    levels, or 0 if it is exact (a publish may step through every level of a wildcard
    filter; an exact one costs one lookup)."""
    return filter.count("/") + 1 if is_wildcard_filter(filter) else 0


def is_wildcard_filter(filter: str) -> bool:
    """Whether a (valid) filter contains a wildcard level, so it can match more than one topic."""
    if filter == ">" or filter.endswith("/>"):
        return True
    if "*" not in filter:
        return False
    return any(level.endswith("*") for level in filter.split("/"))


def from_mqtt_filter(mqtt_filter: str) -> tuple[str, ...]:
    """Translate an MQTT topic filter into the equivalent meshbus filters.

    ``+`` becomes ``*``; ``a/#`` becomes ``("a", "a/>")`` because MQTT's ``#``
    also matches the parent level (``/#`` becomes just ``("/>",)``: its parent
    would be the empty topic); ``#`` alone becomes ``(">",)``; an MQTT shared
    subscription ``$share/g/f`` becomes ``#share/g/<f translated>``. MQTT
    levels that would turn into meshbus wildcards (``*``, ``ab*``, a trailing
    ``>``) have no equivalent and are rejected, as are ShareNames holding
    ``+``, ``#``, ``*`` or ``>``. Error levels count from the start of
    ``mqtt_filter``. This is the only place the two syntaxes meet.
    """
    if not isinstance(mqtt_filter, str):
        raise InvalidTopicError(
            repr(mqtt_filter), f"MQTT topic filter must be a str, not {type(mqtt_filter).__name__}"
        )
    if not mqtt_filter.startswith("$share/"):
        return _from_mqtt_levels(mqtt_filter)
    _, group, *tail = mqtt_filter.split("/", 2)
    rest = tail[0] if tail else ""
    if not group or not rest:
        raise InvalidTopicError(mqtt_filter, "MQTT shared subscription needs a group and a filter")
    if any(c in group for c in "+#*>"):
        raise InvalidTopicError(
            mqtt_filter, "ShareName may not contain '+', '#' or meshbus wildcards", 2
        )
    try:
        filters = _from_mqtt_levels(rest)
    except InvalidTopicError as exc:
        # Re-raise against the whole filter so `level` names a level the caller gave.
        level = None if exc.level is None else exc.level + 2
        raise InvalidTopicError(mqtt_filter, exc.reason, level) from None
    return tuple(f"#share/{group}/{f}" for f in filters)


def _from_mqtt_levels(mqtt_filter: str) -> tuple[str, ...]:
    if not mqtt_filter:
        raise InvalidTopicError(mqtt_filter, "topic filter is empty")
    levels = mqtt_filter.split("/")
    last = len(levels)
    # The level that ends the translated filter: the one before a final '#' ends the parent.
    final = last - 1 if levels[-1] == "#" else last
    out: list[str] = []
    for i, level in enumerate(levels, start=1):
        if level == "+":
            out.append("*")
        elif level == "#":
            if i != last:
                raise InvalidTopicError(mqtt_filter, "'#' must be the last level", i)
            if not out:
                return (">",)
            parent = "/".join(out)
            if not parent:  # '/#': the parent level would be the empty topic, not a topic
                return ("/>",)
            return (parent, parent + "/>")
        elif "+" in level or "#" in level:
            raise InvalidTopicError(mqtt_filter, "'+' and '#' must stand alone in a level", i)
        elif level.endswith("*") or (level == ">" and i == final):
            # A literal '*' or a '>' ending the filter in MQTT would become a wildcard here.
            raise InvalidTopicError(
                mqtt_filter, f"level {level!r} has no MQTT equivalent (would become a wildcard)", i
            )
        else:
            out.append(level)
    return ("/".join(out),)


# --- pairwise comparisons (ACL checks; never on the per-message path) ------------------


def _level_matches(pattern: str, level: str) -> bool:
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return level.startswith(pattern[:-1])
    return pattern == level


def filter_matches(filter: str, topic: str) -> bool:
    """Whether one filter matches one topic."""
    f = filter.split("/")
    t = topic.split("/")
    if f[-1] == ">":
        if len(t) < len(f):
            return False
        f = f[:-1]
        t = t[: len(f)]
    elif len(t) != len(f):
        return False
    return all(_level_matches(p, lv) for p, lv in zip(f, t, strict=True))


def _level_covers(outer: str, inner: str) -> bool:
    """Every level matched by ``inner`` is matched by ``outer``."""
    if outer == "*":
        return True
    if outer.endswith("*"):
        # inner is a prefix wildcard or a literal: its matches all start with its prefix.
        prefix = inner[:-1] if inner.endswith("*") else inner
        return prefix.startswith(outer[:-1])
    return not inner.endswith("*") and outer == inner


def filter_covers(outer: str, inner: str) -> bool:
    """Whether every topic that ``inner`` matches is also matched by ``outer``."""
    o = outer.split("/")
    i = inner.split("/")
    inner_rest = i[-1] == ">"
    if inner_rest:
        i = i[:-1]
    if o[-1] == ">":
        o = o[:-1]
        # inner's topics all have more than len(o) levels?
        if len(i) < len(o) or (len(i) == len(o) and not inner_rest):
            return False
        return all(_level_covers(a, b) for a, b in zip(o, i[: len(o)], strict=True))
    if inner_rest or len(i) != len(o):
        return False
    return all(_level_covers(a, b) for a, b in zip(o, i, strict=True))


def _levels_overlap(a: str, b: str) -> bool:
    """Whether some single level is matched by both patterns."""
    a_pre = a[:-1] if a.endswith("*") else None
    b_pre = b[:-1] if b.endswith("*") else None
    if a_pre is not None and b_pre is not None:
        return a_pre.startswith(b_pre) or b_pre.startswith(a_pre)
    if a_pre is not None:
        return b.startswith(a_pre)
    if b_pre is not None:
        return a.startswith(b_pre)
    return a == b


def filters_overlap(a: str, b: str) -> bool:
    """Whether at least one topic is matched by both filters."""
    x = a.split("/")
    y = b.split("/")
    x_rest = x[-1] == ">"
    y_rest = y[-1] == ">"
    if x_rest:
        x = x[:-1]
    if y_rest:
        y = y[:-1]
    n = min(len(x), len(y))
    if not all(_levels_overlap(p, q) for p, q in zip(x[:n], y[:n], strict=True)):
        return False
    if len(x) == len(y):
        return x_rest == y_rest
    # The shorter one must end in '>' to absorb the other's extra levels
    # (which it does when they are at least one level).
    return (len(x) < len(y) and x_rest) or (len(y) < len(x) and y_rest)
