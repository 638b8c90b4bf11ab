"""The refcounted, summarized interest table (SPEC 8), on its own."""

from __future__ import annotations

import random

from meshbus import filter_covers
from meshbus.plugins.dmr import InterestTable


def test_a_filter_is_advertised_on_its_first_source_and_withdrawn_after_its_last() -> None:
    table = InterestTable()
    assert table.add("d", "payments") == ([("d", "payments")], [])
    assert table.add("d", "payments") == ([], [])
    assert table.add("d", "payments") == ([], [])
    assert table.remove("d", "payments") == ([], [])
    assert table.remove("d", "payments") == ([], [])
    assert table.remove("d", "payments") == ([], [("d", "payments")])
    assert table.remove("d", "payments") == ([], [])  # nobody wanted it: nothing to say
    assert len(table) == 0


def test_a_covered_filter_waits_under_its_cover_and_comes_back_when_it_goes() -> None:
    table = InterestTable()
    assert table.add("d", "a/>") == ([("d", "a/>")], [])
    assert table.add("d", "a/b") == ([], [])
    assert table.add("d", "a/*/c") == ([], [])
    added, removed = table.remove("d", "a/>")
    assert removed == [("d", "a/>")]
    assert sorted(added) == [("d", "a/*/c"), ("d", "a/b")]
    # A wider filter arriving later hides what it covers.
    added, removed = table.add("d", ">")
    assert added == [("d", ">")]
    assert sorted(removed) == [("d", "a/*/c"), ("d", "a/b")]


def test_classes_do_not_cover_each_other() -> None:
    table = InterestTable()
    table.add("d", "a/>")
    assert table.add("g", "a/b") == ([("g", "a/b")], [])
    assert table.add("fd", "a/b") == ([("fd", "a/b")], [])


def test_what_comes_back_is_minimal_too() -> None:
    table = InterestTable()
    for topic_filter in ("x/>", "x/y/>", "x/y/z", "x/q"):
        table.add("d", topic_filter)
    added, removed = table.remove("d", "x/>")
    assert removed == [("d", "x/>")]
    assert sorted(added) == [("d", "x/q"), ("d", "x/y/>")]


def test_the_summary_always_covers_everything_wanted_and_nothing_in_it_covers_another() -> None:
    rng = random.Random(7)
    levels = ["a", "b", "c", "*", "a*"]
    table = InterestTable()
    counts: dict[str, int] = {}
    wire: set[str] = set()
    for _ in range(3000):
        depth = rng.randint(1, 3)
        parts = [rng.choice(levels) for _ in range(depth)]
        if rng.random() < 0.3:
            parts.append(">")
        topic_filter = "/".join(parts)
        if counts.get(topic_filter) and rng.random() < 0.5:
            counts[topic_filter] -= 1
            added, removed = table.remove("d", topic_filter)
        else:
            counts[topic_filter] = counts.get(topic_filter, 0) + 1
            added, removed = table.add("d", topic_filter)
        for _, f in removed:
            wire.remove(f)  # never withdraws what was not advertised
        for _, f in added:
            assert f not in wire  # never advertises twice
            wire.add(f)
        assert wire == {f for _, f in table.advertised()}
        wanted = [f for f, n in counts.items() if n]
        for f in wanted:
            assert any(filter_covers(w, f) for w in wire), f
        for f in wire:
            assert counts.get(f), f"{f} advertised but not wanted"
            assert not any(g != f and filter_covers(g, f) for g in wire), f


def test_fifty_thousand_literal_filters_under_a_wildcard_come_back_in_one_go() -> None:
    table = InterestTable()
    table.add("d", "s/>")
    for i in range(50_000):
        table.add("d", f"s/{i}")
    added, removed = table.remove("d", "s/>")
    assert removed == [("d", "s/>")]
    assert len(added) == 50_000
