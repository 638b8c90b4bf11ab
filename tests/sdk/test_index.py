"""SubscriptionIndex against a brute-force reference matcher written here from SPEC 1.

Topics and filters come from a tiny alphabet so that most filters match some of the
topics drawn; churn (add/remove interleaved with match) runs with cache sizes from 1 up,
so a stale cache entry after an exact or wildcard change shows up as a wrong answer.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from types import FrameType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from meshbus import ConfigurationError, SubscriptionIndex
from meshbus._index import _filters, _find
from meshbus._topics import filter_covers


def ref_matches(filter: str, topic: str) -> bool:
    """SPEC 1: '*' is one level, 'ab*' a level starting with 'ab', a last '>' one or more
    levels; anything else (including '*' inside a level and '>' not last) is literal."""
    f = filter.split("/")
    t = topic.split("/")
    if f[-1] == ">":
        f.pop()
        if len(t) <= len(f):
            return False
        t = t[: len(f)]
    if len(f) != len(t):
        return False
    for pattern, level in zip(f, t, strict=True):
        if pattern == "*":
            continue
        if pattern.endswith("*"):
            if level[: len(pattern) - 1] != pattern[:-1]:
                return False
        elif pattern != level:
            return False
    return True


def ref_match(subs: dict[str, set[object]], topic: str) -> set[object]:
    """Every subscriber of every filter that matches: the scan the index must avoid."""
    return {s for f, ss in subs.items() if ref_matches(f, topic) for s in ss}


# Topic levels overlap the filter literals and prefixes, so matches are frequent.
TOPIC_LEVELS = ("a", "b", "ab", "abc", "", "*", ">", "*a", "a>")
FILTER_LEVELS = ("a", "b", "ab", "", "*a", ">", "*", "a*", "ab*", "**", "a>")

topics = st.lists(st.sampled_from(TOPIC_LEVELS), min_size=1, max_size=4).map("/".join)
exact_filters = st.lists(st.sampled_from(TOPIC_LEVELS[:4]), min_size=1, max_size=4).map("/".join)
filters = st.one_of(
    exact_filters,
    st.lists(st.sampled_from(FILTER_LEVELS), min_size=1, max_size=4).map("/".join),
    st.lists(st.sampled_from(FILTER_LEVELS), max_size=3).map(lambda lv: "/".join([*lv, ">"])),
)
subscribers = st.sampled_from(("s1", "s2", "s3", 4))


def _assert_pruned(index: SubscriptionIndex[object]) -> None:
    """Every trie node below a root leads to at least one filter (private peek): the
    common trie, each subscriber's own trie and the trie of their summaries."""

    def live(node: object) -> bool:
        children = [
            *(node.literal or {}).values(),  # type: ignore[attr-defined]
            *(node.prefix or {}).values(),  # type: ignore[attr-defined]
            *([node.star] if node.star is not None else []),  # type: ignore[attr-defined]
        ]
        results = [live(c) for c in children]  # visit all: every child must be live
        assert all(results), "an empty trie node was left behind"
        return bool(node.here or node.rest or children)  # type: ignore[attr-defined]

    live(index._root)
    live(index._summaries)
    for own in index._own.values():
        assert live(own.root), "a subscriber's own trie is kept without a filter"


def _assert_spilled_within_bounds(index: SubscriptionIndex[object]) -> None:
    """At most ``spill_after`` filters of a subscriber in the common trie; its own trie
    holds the rest and is filed under a filter covering every one of them."""
    assert all(0 < n <= index._spill_after for n in index._in_common.values())
    for own in index._own.values():
        held = list(_filters(own.root))
        assert len(held) == own.count > 0
        assert all(filter_covers(own.summary, f) for f in held), (own.summary, held)
        summary_node, bucket = _find(index._summaries, own.summary)
        assert summary_node is not None
        assert own in getattr(summary_node, bucket)


# --- examples ---------------------------------------------------------------------------------


def test_exact_and_wildcards() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    assert index.add("a/b", "exact")
    assert index.add("a/*", "star")
    assert index.add("a/b*", "prefix")
    assert index.add("a/>", "rest")
    assert index.add(">", "all")
    assert set(index.match("a/b")) == {"exact", "star", "prefix", "rest", "all"}
    assert set(index.match("a/bc")) == {"star", "prefix", "rest", "all"}
    assert set(index.match("a/c/d")) == {"rest", "all"}
    assert set(index.match("a")) == {"all"}
    assert index.match("b/*") == ("all",)  # '*' in a topic is just a character
    assert len(index) == 5


def test_literal_star_and_gt_levels() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    index.add("a*b/c", "x")  # '*' inside a level: literal, so an exact filter
    index.add("a/>/b", "y")  # '>' not last: literal
    index.add("a/>/*", "z")
    assert index.match("a*b/c") == ("x",)
    assert index.match("axb/c") == ()
    assert set(index.match("a/>/b")) == {"y", "z"}
    assert index.match("a/q/b") == ()


def test_each_subscriber_once_even_when_several_filters_match() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    for f in ("a/b", "a/*", "*/b", "a/>", ">", "a*/b*"):
        index.add(f, "s")
    index.add("a/b", "t")
    result = index.match("a/b")
    assert sorted(result) == ["s", "t"]
    assert index.match("a/b") == result  # cached: the same answer


def test_duplicate_add_and_remove_return_false() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    for f in ("a/b", "a/*", "a/>"):
        assert index.add(f, "s")
        assert not index.add(f, "s")
        assert index.add(f, "t")
    assert len(index) == 6
    for f in ("a/b", "a/*", "a/>"):
        assert index.remove(f, "s")
        assert not index.remove(f, "s")
    assert len(index) == 3
    assert not index.remove("x/y", "t")
    assert not index.remove("x/*", "t")
    assert not index.remove("a", "t")  # 'a' is a node on the way to 'a/*', not a filter
    assert not index.remove("a/*/>", "t")
    assert len(index) == 3


def test_subscribers_and_filters() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    index.add("a/b", "s")
    index.add("a/b", "t")
    index.add("a/*", "s")
    index.add("a/b/>", "u")
    index.add("*", "v")
    assert set(index.subscribers("a/b")) == {"s", "t"}
    assert index.subscribers("a/*") == ("s",)
    assert index.subscribers("a/b/>") == ("u",)
    assert index.subscribers("a/>") == ()  # registered filters only, not matching ones
    assert index.subscribers("a/c") == ()
    assert index.subscribers("a") == ()
    assert sorted(index.filters()) == ["*", "a/*", "a/b", "a/b/>"]


def test_cache_sees_exact_and_wildcard_changes() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    assert index.match("a/b") == ()
    assert index.match("x") == ()
    index.add("a/b", "s")
    assert index.match("a/b") == ("s",)
    # An exact change evicts only its own topic; other cached answers stay.
    assert index.cached("x") == ()
    index.add("a/*", "t")
    assert index.cached("x") is None  # a wildcard change clears the cache
    assert set(index.match("a/b")) == {"s", "t"}
    index.remove("a/b", "s")
    assert index.match("a/b") == ("t",)
    index.remove("a/*", "t")
    assert index.match("a/b") == ()


def test_tiny_cache_is_cleared_when_full() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex(cache_size=2)
    index.add("a/*", "s")
    index.add("b", "t")
    assert index.match("a/1") == ("s",)
    assert index.match("a/2") == ("s",)
    assert index.cached("a/1") == ("s",)
    assert index.match("b") == ("t",)  # third entry: the cache was full, so it restarts
    assert index.cached("a/1") is None
    assert index.cached("b") == ("t",)
    assert index.match("a/1") == ("s",)


def test_removal_prunes_the_trie() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    subs = [
        ("a/b/c/*", "s"),
        ("a/b/c/*", "t"),
        ("a/b*/>", "s"),
        ("a/bc*/x", "s"),
        ("*/*/*", "s"),
        (">", "s"),
        ("a/>", "s"),
        ("x/y", "s"),
    ]
    for f, s in subs:
        index.add(f, s)
    for f, s in subs:
        assert index.remove(f, s)
        _assert_pruned(index)
    assert len(index) == 0
    assert list(index.filters()) == []
    assert index._root.is_empty()
    assert index._root.literal is None
    assert index._root.prefix is None
    assert index._root.star is None
    assert index._exact == {}
    assert index.match("a/b/c/d") == ()


def test_prefixes_of_several_lengths_at_one_level() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex()
    for p in ("a", "ab", "abcd", "b"):
        index.add(f"x/{p}*", p)
    assert set(index.match("x/abcde")) == {"a", "ab", "abcd"}
    assert set(index.match("x/abc")) == {"a", "ab"}
    assert index.match("x/b") == ("b",)
    index.remove("x/ab*", "ab")
    assert set(index.match("x/abcde")) == {"a", "abcd"}
    index.remove("x/abcd*", "abcd")
    assert index.match("x/abcde") == ("a",)


def test_unhashable_subscriber_changes_nothing() -> None:
    index: SubscriptionIndex[object] = SubscriptionIndex()
    for f in ("a/b", "a/b*/*/>"):
        with pytest.raises(TypeError):
            index.add(f, ["unhashable"])
    assert len(index) == 0
    assert list(index.filters()) == []
    assert index._root.is_empty()  # no half-built trie path left behind


def test_many_prefixes_under_one_node() -> None:
    index: SubscriptionIndex[int] = SubscriptionIndex()
    for i in range(300):
        assert index.add(f"u/{i}*", i)
    # '12*' matches '123', as do '1*' and '123*'; '1234*' does not.
    assert set(index.match("u/123")) == {1, 12, 123}
    for i in range(0, 300, 2):
        assert index.remove(f"u/{i}*", i)
    assert set(index.match("u/123")) == {1, 123}
    for i in range(1, 300, 2):
        assert index.remove(f"u/{i}*", i)
    assert index._root.is_empty()


@pytest.mark.parametrize("spill_after", [0, 1, 64])
def test_a_filter_covered_by_another_comes_back_when_that_one_goes(spill_after: int) -> None:
    """Removing a covering filter restores exactly what the covered ones match, whether
    the filters are in the common trie or in the subscriber's own."""
    index: SubscriptionIndex[str] = SubscriptionIndex(spill_after=spill_after)
    for f in ("a/>", "a/b*/c", "a/*/d", "x>/y*", "a*/x>"):  # 'x>' is a literal level
        assert index.add(f, "s")
    assert index.add("a/b/c", "t")
    assert set(index.match("a/b/c")) == {"s", "t"}
    assert index.match("a/q/q") == ("s",)
    assert index.match("x>/yz") == ("s",)
    assert index.match("ab/x>") == ("s",)
    assert index.match("ab/x") == ()
    assert index.remove("a/>", "s")
    assert set(index.match("a/bb/c")) == {"s"}  # 'a/b*/c' again
    assert set(index.match("a/q/d")) == {"s"}  # 'a/*/d' again
    assert index.match("a/q/q") == ()
    assert set(index.match("a/b/c")) == {"s", "t"}
    assert sorted(index.filters()) == ["a*/x>", "a/*/d", "a/b*/c", "a/b/c", "x>/y*"]
    assert index.subscribers("a/b*/c") == ("s",)
    assert index.subscribers("a/>") == ()
    for f in ("a/b*/c", "a/*/d", "x>/y*", "a*/x>"):
        assert index.remove(f, "s")
    assert index.match("a/bb/c") == ()
    assert index.match("a/b/c") == ("t",)
    assert index._own == {}
    assert index._summaries.is_empty()
    assert index._root.is_empty()


def test_a_subscriber_past_spill_after_is_filed_once_under_a_covering_filter() -> None:
    index: SubscriptionIndex[str] = SubscriptionIndex(spill_after=2)
    for i in range(50):
        index.add(f"site/{i}/*/t", "s")
    index.add("site/*/x/>", "other")
    assert index._in_common == {"s": 2, "other": 1}
    own = index._own["s"]
    assert own.count == 48
    assert own.summary == "site/>"  # filed under one filter: asked only for site/...
    assert list(index._summaries.literal) == ["site"]  # type: ignore[arg-type]
    assert index.match("site/7/q/t") == ("s",)
    assert index.match("other/7/q/t") == ()
    assert set(index.match("site/1/x/t")) == {"s", "other"}
    for i in range(2, 50):
        index.remove(f"site/{i}/*/t", "s")
    assert "s" not in index._own
    assert index.match("site/1/q/t") == ("s",)  # its filters in the common trie stay


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_spill_after_must_be_an_int_at_least_zero(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="spill_after"):
        SubscriptionIndex(spill_after=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("subscriber", [("tuple", 1), 7, frozenset({"f"})])
def test_any_hashable_subscriber(subscriber: object) -> None:
    index: SubscriptionIndex[object] = SubscriptionIndex()
    index.add("a/*", subscriber)
    assert index.match("a/b") == (subscriber,)


# --- one subscriber, many overlapping filters (issue 13, defect 5) ----------------------------

WORD = "abcdefgh"
#: Per level: the literal word, '*' and every prefix wildcard of the word. Each matches the
#: level ``WORD``, so every filter built from them matches ``WORD/WORD/...``.
LEVEL_CHOICES = (WORD, "*", *(WORD[:k] + "*" for k in range(1, len(WORD) + 1)))


def overlapping_filters(levels: int) -> list[str]:
    """``len(LEVEL_CHOICES) ** levels`` filters that all match the topic ``WORD/.../WORD``."""
    return ["/".join(p) for p in itertools.product(LEVEL_CHOICES, repeat=levels)]


def work(fn: Callable[[str], object], topic: str) -> int:
    """The Python and C function calls ``fn(topic)`` makes: work counted, not timed."""
    calls = 0

    def count(frame: FrameType, event: str, arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(count)
    try:
        fn(topic)
    finally:
        sys.setprofile(None)
    return calls


def test_overlapping_filters_of_one_subscriber_cost_a_match_no_more_than_a_hundred() -> None:
    """10,000 filters of one subscriber that all match a topic: a cache miss must cost
    what it costs when the subscriber holds 100 of them, not a step more per filter."""
    filters = overlapping_filters(4)
    indexes = {size: SubscriptionIndex[str]() for size in (100, len(filters))}
    for size, index in indexes.items():
        index.add(f"{WORD}/*/>", "other")  # another subscriber, so the result merges
        index.add(f"{WORD}/{WORD}/{WORD}/{WORD}0", "exact")
        for f in filters[:size]:
            index.add(f, "s")
    some, heavy = indexes.values()
    assert len(heavy) == 10_002
    for i in range(20):  # a different topic each time: every match is a cache miss
        topic = f"{WORD}/{WORD}/{WORD}/{WORD}{i}"
        expected = {"s", "other", "exact"} if i == 0 else {"s", "other"}
        assert heavy.cached(topic) is None
        heavy_work = work(heavy.match, topic)
        some_work = work(some.match, topic)
        assert set(heavy.match(topic)) == set(some.match(topic)) == expected
        assert len(heavy.match(topic)) == len(expected)
        # A constant per level of the topic, whatever the number of filters beyond.
        assert heavy_work <= some_work + 12 * 4, (heavy_work, some_work)


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(filters, subscribers), max_size=30),
    st.lists(topics, min_size=1, max_size=20),
    st.sampled_from((0, 1, 3, 64)),
)
def test_match_agrees_with_reference(
    pairs: list[tuple[str, object]], probes: list[str], spill_after: int
) -> None:
    index: SubscriptionIndex[object] = SubscriptionIndex(spill_after=spill_after)
    model: dict[str, set[object]] = {}
    for f, s in pairs:
        assert index.add(f, s) is (s not in model.get(f, set()))
        model.setdefault(f, set()).add(s)
    for topic in probes + probes:  # the second round is answered from the cache
        result = index.match(topic)
        assert len(result) == len(set(result))
        assert set(result) == ref_match(model, topic)


class IndexChurn(RuleBasedStateMachine):
    """Random adds and removes interleaved with matches, compared with a plain model."""

    def __init__(self) -> None:
        super().__init__()
        self.model: dict[str, set[object]] = {}
        self.index: SubscriptionIndex[object] = SubscriptionIndex()
        self.probed: list[str] = []

    @initialize(
        cache_size=st.sampled_from((1, 2, 3, 8, 8192)), spill_after=st.sampled_from((0, 1, 2, 64))
    )
    def make_index(self, cache_size: int, spill_after: int) -> None:
        # Small spill_after values move filters in and out of subscribers' own tries.
        self.index = SubscriptionIndex(cache_size=cache_size, spill_after=spill_after)

    @rule(f=filters, s=subscribers)
    def add(self, f: str, s: object) -> None:
        expected = s not in self.model.get(f, set())
        assert self.index.add(f, s) is expected
        self.model.setdefault(f, set()).add(s)

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data())
    def remove_existing(self, data: st.DataObject) -> None:
        f = data.draw(st.sampled_from(sorted(f for f, ss in self.model.items() if ss)))
        s = data.draw(st.sampled_from(sorted(self.model[f], key=repr)))
        assert self.index.remove(f, s)
        self.model[f].discard(s)

    @rule(f=filters, s=subscribers)
    def remove_any(self, f: str, s: object) -> None:
        expected = s in self.model.get(f, set())
        assert self.index.remove(f, s) is expected
        self.model.get(f, set()).discard(s)

    @rule(topic=topics)
    def match(self, topic: str) -> None:
        self.probed.append(topic)
        result = self.index.match(topic)
        assert len(result) == len(set(result))
        assert set(result) == ref_match(self.model, topic)

    @precondition(lambda self: self.probed)
    @rule(data=st.data())
    def match_again(self, data: st.DataObject) -> None:
        # Repeat a topic seen before: likely a cache hit, which must not be stale.
        topic = data.draw(st.sampled_from(self.probed))
        assert set(self.index.match(topic)) == ref_match(self.model, topic)

    @invariant()
    def same_contents(self) -> None:
        live = {f: ss for f, ss in self.model.items() if ss}
        assert len(self.index) == sum(len(ss) for ss in live.values())
        listed = list(self.index.filters())
        assert len(listed) == len(set(listed))
        assert set(listed) == set(live)
        for f, ss in live.items():
            assert set(self.index.subscribers(f)) == ss
        _assert_pruned(self.index)
        _assert_spilled_within_bounds(self.index)

    def teardown(self) -> None:
        # Removing everything leaves an empty root: churn leaks no trie nodes.
        for f, ss in self.model.items():
            for s in ss:
                assert self.index.remove(f, s)
        assert len(self.index) == 0
        assert self.index._root.is_empty()
        assert self.index._exact == {}
        assert self.index._wildcards == 0
        assert self.index._own == {}
        assert self.index._in_common == {}
        assert self.index._summaries.is_empty()


IndexChurn.TestCase.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
TestIndexChurn = IndexChurn.TestCase
