"""SPEC section 1: topic and filter syntax, MQTT translation and the pairwise helpers.

The property tests at the end compare ``filter_matches``, ``filter_covers`` and
``filters_overlap`` with answers computed by brute force over a small topic
universe, using a matcher written here from the SPEC (not the one under test).
"""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshbus import (
    InvalidTopicError,
    Subscription,
    TopicLimits,
    filter_covers,
    filter_matches,
    filters_overlap,
    from_mqtt_filter,
    parse_subscription,
    validate_topic,
)
from meshbus._topics import is_wildcard_filter

# --- topics ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "topic",
    [
        "a",
        "a/b/c",
        "a//b",  # empty levels are allowed
        "/",
        "/a",
        "a/",
        "orders/eu/\u00e9t\u00e9/\U0001f600",
        "a*b/c",  # '*' and '>' are plain characters in a topic
        "a/>/b",
        "x#y/#z",  # only a leading '#' is reserved
    ],
)
def test_valid_topics(topic: str) -> None:
    validate_topic(topic)


def test_empty_topic_is_rejected_without_a_level() -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_topic("")
    assert info.value.level is None
    assert "empty" in info.value.reason
    assert info.value.topic == ""


@pytest.mark.parametrize(
    ("topic", "level"),
    [("\x00", 1), ("a/b\x00c/d", 2), ("a/b/c/\x00", 4), ("//\x00", 3)],
)
def test_nul_is_rejected_naming_its_level(topic: str, level: int) -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_topic(topic)
    assert info.value.level == level
    assert "NUL" in info.value.reason
    assert info.value.topic == topic


def test_lone_surrogate_is_not_utf8() -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_topic("a/b/\ud800")
    assert info.value.level == 3
    assert "UTF-8" in info.value.reason


def test_byte_limit_counts_utf8_bytes_not_characters() -> None:
    validate_topic("a" * 250)
    validate_topic("\u00e9" * 125)  # 2 bytes each: exactly 250
    for topic in ("a" * 251, "\u00e9" * 126, "\u20ac" * 84):  # 251, 252, 252 bytes
        with pytest.raises(InvalidTopicError) as info:
            validate_topic(topic)
        assert info.value.level is None
        assert "250" in info.value.reason


def test_level_limit() -> None:
    # Empty levels keep the topic under the byte limit: 127 slashes are 128 levels.
    validate_topic("/" * 127)
    with pytest.raises(InvalidTopicError) as info:
        validate_topic("/" * 128)
    assert info.value.level is None
    assert "129 levels" in info.value.reason
    assert "128" in info.value.reason


def test_limits_are_configurable() -> None:
    limits = TopicLimits(max_bytes=10, max_levels=3)
    validate_topic("a/b/c", limits)
    validate_topic("abcdefghij", limits)
    with pytest.raises(InvalidTopicError, match="levels"):
        validate_topic("a/b/c/d", limits)
    with pytest.raises(InvalidTopicError, match="bytes"):
        validate_topic("abcdefghijk", limits)
    # The same limits apply to subscriptions.
    parse_subscription("a/*/>", limits)
    with pytest.raises(InvalidTopicError, match="levels"):
        parse_subscription("a/*/c/>", limits)
    # Larger limits admit what the defaults refuse.
    validate_topic("a" * 300, TopicLimits(max_bytes=300))
    validate_topic("/" * 200, TopicLimits(max_levels=201))


@pytest.mark.parametrize("kwargs", [{"max_bytes": 0}, {"max_levels": 0}, {"max_levels": -1}])
def test_limits_must_be_positive(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="max_"):
        TopicLimits(**kwargs)


def test_default_limits_are_the_spec_ones() -> None:
    assert TopicLimits() == TopicLimits(max_bytes=250, max_levels=128)


@pytest.mark.parametrize("topic", ["#", "#a", "#share/g/a", "#noexport/a", "#/a"])
def test_hash_prefixed_topics_are_reserved(topic: str) -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_topic(topic)
    assert info.value.level == 1
    assert "reserved" in info.value.reason


@pytest.mark.parametrize("topic", [None, b"a/b", 1, ["a"]])
def test_non_str_topic_is_rejected(topic: object) -> None:
    with pytest.raises(InvalidTopicError) as info:
        validate_topic(topic)  # type: ignore[arg-type]
    assert "str" in info.value.reason
    with pytest.raises(InvalidTopicError):
        parse_subscription(topic)  # type: ignore[arg-type]


def test_invalid_topic_error_is_a_value_error() -> None:
    # Callers that only know about ValueError still catch it.
    with pytest.raises(ValueError, match="empty"):
        validate_topic("")


# --- subscriptions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["a", "a/b", "*", "a/*/c", "ab*", "a/b*/c", "a*b", ">", "a/>", "a/>/b", "a//>", "*/*/>"],
)
def test_plain_filters_parse_to_themselves(text: str) -> None:
    assert parse_subscription(text) == Subscription(text=text, filter=text)
    sub = parse_subscription(text)
    assert sub.share_name is None
    assert not sub.no_export
    assert not sub.is_shared


@pytest.mark.parametrize(
    ("text", "filter", "share", "no_export"),
    [
        ("#share/g/a/>", "a/>", "g", False),
        ("#share/group-1/a/b", "a/b", "group-1", False),
        ("#share/g/*", "*", "g", False),
        ("#share/g//", "/", "g", False),
        ("#share/a#b/x", "x", "a#b", False),  # only wildcards are banned from a ShareName
        ("#noexport/a/*", "a/*", None, True),
        ("#noexport/>", ">", None, True),
        ("#noexport/#share/g/a/>", "a/>", "g", True),
    ],
)
def test_reserved_prefixes(text: str, filter: str, share: str | None, no_export: bool) -> None:
    sub = parse_subscription(text)
    assert sub.text == text
    assert sub.filter == filter
    assert sub.share_name == share
    assert sub.is_shared is (share is not None)
    assert sub.no_export is no_export


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("#share/*/a", 2),
        ("#share/g*/a", 2),
        ("#share/>/a", 2),
        ("#share/g>/a", 2),
        ("#share/a*b/a", 2),
        ("#noexport/#share/*/a", 3),
    ],
)
def test_share_name_without_wildcards(text: str, level: int) -> None:
    with pytest.raises(InvalidTopicError) as info:
        parse_subscription(text)
    assert info.value.level == level
    assert "wildcard" in info.value.reason
    assert info.value.topic == text


@pytest.mark.parametrize(("text", "level"), [("#share//a", 2), ("#noexport/#share//a", 3)])
def test_share_name_required(text: str, level: int) -> None:
    with pytest.raises(InvalidTopicError) as info:
        parse_subscription(text)
    assert info.value.level == level
    assert "ShareName" in info.value.reason


@pytest.mark.parametrize("text", ["#share/g", "#share/g/", "#noexport/#share/g"])
def test_shared_subscription_needs_a_filter(text: str) -> None:
    with pytest.raises(InvalidTopicError) as info:
        parse_subscription(text)
    assert "filter" in info.value.reason


def test_noexport_needs_a_filter() -> None:
    with pytest.raises(InvalidTopicError) as info:
        parse_subscription("#noexport/")
    assert "empty" in info.value.reason


@pytest.mark.parametrize(
    ("text", "level"),
    [
        ("#", 1),
        ("#a/b", 1),
        ("#noexport", 1),  # the prefix needs its slash
        ("#share", 1),
        ("#shared/g/a", 1),
        ("#Share/g/a", 1),
        ("#noexport/#noexport/a", 2),
        ("#noexport/#other/a", 2),
        ("#share/g/#x", 3),
        ("#share/g/#noexport/a", 3),  # #noexport/ must come first
        ("#share/g/#share/h/a", 3),
        ("#noexport/#share/g/#x", 4),
    ],
)
def test_other_hash_prefixes_are_reserved(text: str, level: int) -> None:
    with pytest.raises(InvalidTopicError) as info:
        parse_subscription(text)
    assert info.value.level == level
    assert "reserved" in info.value.reason


@pytest.mark.parametrize(
    ("text", "level"), [("a/\x00", 2), ("#share/g/a/b\x00", 4), ("#noexport/\x00", 2)]
)
def test_subscription_levels_count_from_the_start_of_the_text(text: str, level: int) -> None:
    with pytest.raises(InvalidTopicError) as info:
        parse_subscription(text)
    assert info.value.level == level


def test_subscription_limits_count_the_whole_text() -> None:
    parse_subscription("a" * 250)
    with pytest.raises(InvalidTopicError):
        parse_subscription("#noexport/" + "a" * 241)
    with pytest.raises(InvalidTopicError):
        parse_subscription("")


@pytest.mark.parametrize(
    ("filter", "expected"),
    [
        ("a", False),
        ("a/b", False),
        ("a*b", False),
        ("a/>/b", False),
        ("a/*b/c", False),
        ("*", True),
        ("a/*", True),
        ("a/b*/c", True),
        ("**", True),
        (">", True),
        ("a/>", True),
        ("a//>", True),
    ],
)
def test_is_wildcard_filter(filter: str, expected: bool) -> None:
    assert is_wildcard_filter(filter) is expected


# --- MQTT translation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mqtt", "expected"),
    [
        ("a/b", ("a/b",)),
        ("+", ("*",)),
        ("a/+/c", ("a/*/c",)),
        ("+/+", ("*/*",)),
        ("a/#", ("a", "a/>")),
        ("a/+/#", ("a/*", "a/*/>")),
        ("+/#", ("*", "*/>")),
        ("#", (">",)),
        ("a//#", ("a/", "a//>")),
        ("/#", ("/>",)),  # the parent of '/#' would be the empty topic, which is no topic
        ("a*b/c", ("a*b/c",)),  # '*' inside a level is literal in both syntaxes
        ("a/>/b", ("a/>/b",)),
        ("a/>/+/#", ("a/>/*", "a/>/*/>")),
        ("//#", ("/", "//>")),
        ("$share/g/$share/h/a", ("#share/g/$share/h/a",)),  # the inner one is literal
        ("$SYS/#", ("$SYS", "$SYS/>")),
        ("$share/g/a/+", ("#share/g/a/*",)),
        ("$share/g/a/#", ("#share/g/a", "#share/g/a/>")),
        ("$share/g/#", ("#share/g/>",)),
    ],
)
def test_from_mqtt_filter(mqtt: str, expected: tuple[str, ...]) -> None:
    result = from_mqtt_filter(mqtt)
    assert result == expected
    for text in result:
        parse_subscription(text)  # every translation is a valid meshbus subscription


@pytest.mark.parametrize(
    ("mqtt", "level"),
    [
        ("", None),
        ("a/#/b", 2),
        ("#/a", 1),
        ("a+/b", 1),
        ("a/b+", 2),
        ("a/#b", 2),
        ("a/b#", 2),
        ("a/*", 2),  # a literal '*' level would become a wildcard
        ("a/ab*/c", 2),
        ("a/>", 2),  # likewise a trailing literal '>'
        ("a/>/#", 2),  # ... also when '#' makes it the last level
        (">/#", 1),
        ("$share/g", None),
        ("$share/g/", None),
        ("$share//a", None),
        ("$share/+/a", 2),  # MQTT forbids '+' and '#' in a ShareName
        ("$share/g#/a", 2),
        ("$share/g*/a", 2),  # ShareName may not contain meshbus wildcards
        ("$share/g/a/#/b", 4),  # levels count from the start of the whole filter
        ("$share/g/a/+x", 4),
        ("$share/g/a/>/#", 4),
    ],
)
def test_invalid_mqtt_filters(mqtt: str, level: int | None) -> None:
    # Regressions: '/#', '>/#', 'a/>/#', '$share/+/...' used to translate to an empty or
    # a wildcard filter, and errors inside '$share/g/...' named the wrong level.
    with pytest.raises(InvalidTopicError) as info:
        from_mqtt_filter(mqtt)
    assert info.value.level == level
    assert info.value.topic == mqtt


@pytest.mark.parametrize("mqtt", [None, b"a/#", 3])
def test_non_str_mqtt_filter_is_rejected(mqtt: object) -> None:
    with pytest.raises(InvalidTopicError, match="str"):
        from_mqtt_filter(mqtt)  # type: ignore[arg-type]


def _mqtt_matches(mqtt_filter: str, topic: str) -> bool:
    """MQTT 3.1.1 section 4.7 matching, written from that spec (no '$' topics here)."""
    f = mqtt_filter.split("/")
    t = topic.split("/")
    for i, level in enumerate(f):
        if level == "#":
            return True  # matches the parent level and any number of children
        if i >= len(t) or (level != "+" and level != t[i]):
            return False
    return len(f) == len(t)


# --- pairwise helpers ------------------------------------------------------------------------


def _ref_matches(filter: str, topic: str) -> bool:
    """SPEC 1 matching, level by level, written independently of meshbus."""

    def go(f: list[str], t: list[str]) -> bool:
        if not f:
            return not t
        head, rest = f[0], f[1:]
        if head == ">" and not rest:
            return len(t) >= 1
        if not t:
            return False
        if head == "*":
            ok = True
        elif head.endswith("*"):
            ok = t[0].startswith(head[:-1])
        else:
            ok = head == t[0]
        return ok and go(rest, t[1:])

    return go(filter.split("/"), topic.split("/"))


@pytest.mark.parametrize(
    ("filter", "topic", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("a/b", "a/b/c", False),
        ("a/b", "a", False),
        ("*", "a", True),
        ("*", "", True),  # an empty level is a level
        ("*", "a/b", False),
        ("a/*/c", "a/x/c", True),
        ("a/*/c", "a//c", True),
        ("a/*/c", "a/x/y/c", False),
        ("ab*", "ab", True),  # a prefix matches itself
        ("ab*", "abc", True),
        ("ab*", "a", False),
        ("ab*", "xab", False),
        ("ab*", "ab/c", False),
        ("a*b", "a*b", True),  # '*' inside a level is literal
        ("a*b", "axb", False),
        ("*a", "*a", True),
        ("*a", "ba", False),
        (">", "a", True),
        (">", "a/b/c", True),
        (">", "/", True),
        ("a/>", "a/b", True),
        ("a/>", "a/b/c", True),
        ("a/>", "a/", True),
        ("a/>", "a", False),  # '>' needs at least one more level
        ("a/>", "b/c", False),
        ("a/>/b", "a/>/b", True),  # '>' not last is literal
        ("a/>/b", "a/x/b", False),
        ("a/b*/>", "a/bc/d/e", True),
        ("a/b*/>", "a/cb/d", False),
        ("*/>", "x/y", True),
        ("*/>", "x", False),
    ],
)
def test_filter_matches(filter: str, topic: str, expected: bool) -> None:
    assert filter_matches(filter, topic) is expected
    assert _ref_matches(filter, topic) is expected  # keeps the reference honest


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        ("a/b", "a/b", True),
        ("a/b", "a/c", False),
        ("*", "a", True),
        ("a", "*", False),
        ("*", "ab*", True),
        ("ab*", "*", False),
        ("a*", "ab*", True),
        ("ab*", "a*", False),
        ("ab*", "abc", True),
        ("ab*", "ab", True),
        ("ab*", "a", False),
        ("a", "a*", False),  # 'a*' also matches 'ab'
        ("a*b", "a*b", True),  # literal
        ("a*b", "a*", False),
        ("**", "*a", True),  # '**' is the prefix '*'; '*a' is a literal starting with it
        ("**", "*", False),
        ("*", "**", True),
        (">", "a", True),
        (">", ">", True),
        (">", "a/>", True),
        ("a/>", ">", False),  # '>' also matches 'b'
        ("a/>", "a", False),  # 'a' has no level after 'a'
        ("a/>", "a/b", True),
        ("a/>", "a/b/>", True),
        ("a/>", "a/>", True),
        ("a/>", "a/*", True),
        ("a/*", "a/>", False),  # 'a/b/c' escapes
        ("a/*", "a/b", True),
        ("a/*/>", "a/>", False),  # 'a/b' escapes: needs three levels
        ("a/*/>", "a/b/>", True),
        ("a/b", "a/b/>", False),
        ("*/*", "a/>", False),
        ("a/>/b", "a/>/b", True),  # literal '>' in the middle
        ("a/>/b", "a/x/b", False),
        ("a/*/b", "a/>/b", True),
    ],
)
def test_filter_covers(outer: str, inner: str, expected: bool) -> None:
    assert filter_covers(outer, inner) is expected


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("a", "a", True),
        ("a", "b", False),
        ("*", "a", True),
        ("*", "a/b", False),
        ("ab*", "a*", True),
        ("ab*", "ac*", False),
        ("ab*", "abc", True),
        ("ab*", "a", False),
        ("a*b", "a*", True),  # the literal 'a*b' starts with 'a'
        ("a*b", "ab*", False),
        (">", "a", True),
        (">", ">", True),
        ("a/>", "a", False),
        ("a/>", "a/b/c", True),
        ("a/>", "*/b", True),
        ("a/>", "b/>", False),
        ("a/>", "*/>", True),
        ("a/b/>", "a/>", True),
        ("a/b/>", "a/c", False),
        ("a/b/>", "a/*", False),  # 'a/*' has exactly two levels
        ("a/*", "a/b/c", False),
        ("a/>/b", "a/x/b", False),
        ("a/>/b", "*/*/b", True),
    ],
)
def test_filters_overlap(a: str, b: str, expected: bool) -> None:
    assert filters_overlap(a, b) is expected
    assert filters_overlap(b, a) is expected


# --- brute-force properties ------------------------------------------------------------------
#
# Filter levels come from LITERALS, '*' and the prefixes in PREFIXES; filters have at most
# MAX_FILTER_LEVELS levels counting a trailing '>'. UNIVERSE is every topic of 1 to
# MAX_FILTER_LEVELS + 1 levels over LEVEL_VALUES, which holds, for any one filter level:
# every literal, every prefix itself, every prefix extended by a character no pattern
# mentions ('z'), and 'z' alone. So whenever some topic (of any length, over any levels)
# is matched by one filter and not by another, or by both of two filters, such a topic is
# in UNIVERSE too: levels are independent, each level's witness is in LEVEL_VALUES
# (the longer of two prefixes, the literal, 'p'+'z' for "prefix p but not literal p",
# 'z' for "not this prefix or literal"), and a witness never needs more than one level
# beyond the longer filter. Hence the comparisons below are exact equivalences over all
# topics, for filters from this alphabet, not merely samples.

LITERALS = ("", "a", "ab", "*a", ">")
PREFIXES = ("a", "ab", "*")  # '*' gives the pattern '**': levels starting with '*'
PATTERNS = (*LITERALS, "*", *(p + "*" for p in PREFIXES))
LEVEL_VALUES = tuple(dict.fromkeys((*LITERALS, *PREFIXES, *(p + "z" for p in PREFIXES), "z")))
MAX_FILTER_LEVELS = 3
UNIVERSE_BY_LEVELS = {
    n: tuple("/".join(levels) for levels in itertools.product(LEVEL_VALUES, repeat=n))
    for n in range(1, MAX_FILTER_LEVELS + 2)
}
UNIVERSE = tuple(t for ts in UNIVERSE_BY_LEVELS.values() for t in ts)

filters = st.one_of(
    st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=MAX_FILTER_LEVELS).map("/".join),
    st.lists(st.sampled_from(PATTERNS), max_size=MAX_FILTER_LEVELS - 1).map(
        lambda levels: "/".join([*levels, ">"])
    ),
)
topics = st.sampled_from(UNIVERSE)


@functools.cache
def _matched(filter: str) -> frozenset[str]:
    # Only topics of a length the filter can match are tried, which keeps this fast:
    # n levels without a trailing '>', more than n - 1 levels with one.
    n = filter.count("/") + 1
    lengths = range(n, MAX_FILTER_LEVELS + 2) if filter.split("/")[-1] == ">" else (n,)
    return frozenset(
        t for k in lengths for t in UNIVERSE_BY_LEVELS.get(k, ()) if _ref_matches(filter, t)
    )


def test_universe_holds_a_witness_for_every_single_level_question() -> None:
    # Part of the claim above, checked: each pattern (in a non-last level, where '>' is
    # literal) matches some level value and, unless it is '*', misses some.
    for p in PATTERNS:
        hits = {v for v in LEVEL_VALUES if _ref_matches(f"{p}/z", f"{v}/z")}
        assert hits
        assert p == "*" or len(hits) < len(LEVEL_VALUES)
    assert "z" in LEVEL_VALUES
    assert not any("z" in p for p in PATTERNS)


@settings(max_examples=300, deadline=None)
@given(filters, topics)
def test_filter_matches_agrees_with_reference(filter: str, topic: str) -> None:
    assert filter_matches(filter, topic) is _ref_matches(filter, topic)


@settings(max_examples=300, deadline=None)
@given(filters, filters)
def test_filter_covers_is_exact_over_the_universe(outer: str, inner: str) -> None:
    covered = _matched(inner) <= _matched(outer)
    assert filter_covers(outer, inner) is covered
    if filter_covers(outer, inner):
        assert all(filter_matches(outer, t) for t in _matched(inner))


@settings(max_examples=300, deadline=None)
@given(filters, filters)
def test_filters_overlap_is_exact_over_the_universe(a: str, b: str) -> None:
    assert filters_overlap(a, b) is bool(_matched(a) & _matched(b))


@settings(max_examples=100, deadline=None)
@given(filters)
def test_a_filter_covers_and_overlaps_itself(filter: str) -> None:
    assert filter_covers(filter, filter)
    assert filters_overlap(filter, filter)
    assert filter_covers(">", filter)


@settings(max_examples=200, deadline=None)
@given(filters, filters, filters)
def test_covers_is_transitive(a: str, b: str, c: str) -> None:
    if filter_covers(a, b) and filter_covers(b, c):
        assert filter_covers(a, c)


MQTT_LITERALS = ("a", "b", "", "a*b", ">x", ">")
mqtt_filters = st.lists(st.sampled_from((*MQTT_LITERALS, "+", "#")), min_size=1, max_size=3).map(
    "/".join
)
# Every topic of up to four levels over the literals plus one level no filter names.
MQTT_UNIVERSE = tuple(
    "/".join(levels)
    for n in range(1, 5)
    for levels in itertools.product((*MQTT_LITERALS, "z"), repeat=n)
)


@settings(max_examples=300, deadline=None)
@given(mqtt_filters, st.sampled_from(MQTT_UNIVERSE))
def test_mqtt_translation_matches_like_mqtt(mqtt: str, topic: str) -> None:
    levels = mqtt.split("/")
    # Untranslatable: '#' not last, or a literal '>' that would end the meshbus filter
    # (including as the parent of a final '#') and so become a wildcard.
    ends_in_gt = levels[-1] == ">" or levels[-2:] == [">", "#"]
    if not mqtt or "#" in levels[:-1] or ends_in_gt:
        with pytest.raises(InvalidTopicError):
            from_mqtt_filter(mqtt)
        return
    translated = from_mqtt_filter(mqtt)
    for text in translated:
        parse_subscription(text)
    assert any(filter_matches(f, topic) for f in translated) is _mqtt_matches(mqtt, topic)
