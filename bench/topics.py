"""Topic index: meshbus ``SubscriptionIndex`` against a plain reference trie.

Run from the checkout with the dev virtualenv::

    .venv/bin/python bench/topics.py            # full run, 10k and 100k subscriptions
    .venv/bin/python bench/topics.py --quick    # smoke run, 1k and 10k, a few seconds

One line per figure, each with the ratio to the reference measured in the same run
and, where the issue sets one, the target and ``OK``/``MISS``. A benchmark, not a
test: the exit status is 0 even when a target is missed.

Workload (seeded, so every run sees the same data):

* Topics have 4 to 7 levels. Level names are drawn per depth from vocabularies of
  12, 60, 400 and then 3000 names (a few thousand names in all, shared by the deeper
  levels), with a skew towards the first names of each vocabulary, like real topic
  trees (``region/site/device-class/device/...``).
* N subscriptions, spread over N / 10 subscribers (a subscriber has ten filters
  on average): 80% exact topics, 20% wildcard filters made from a topic by one of
  ``*`` replacing a level, ``ab*`` replacing a level by its first two or three
  characters, or cutting the topic after 3 or 4 levels (2 for a few broad ones)
  and adding ``>``.
* Published topics: 40% are topics some exact subscription names, 60% fresh topics
  from the same generator (of which some are caught by wildcards only). The header
  line prints the fraction that matches at least one subscription.
* ``pool``: the stream repeats topics from a pool of 4,000 (real traffic reuses
  topics), so meshbus answers most publishes from its match cache (default size).
  ``no-repeat``: every topic in every round is published once only, so every
  meshbus match is a cache miss (and the cache fills and is cleared as in real use).

The reference trie (``RefTrie`` below) is what one writes first: one node per
level with a dict of literal children, a ``*`` child, a dict of ``ab*`` children
tried by scanning it with ``startswith``, and ``>`` / end-of-filter buckets; every
filter, exact or not, lives in the trie; no cache. Both sides return each
subscriber once, and the results are compared before timing.

Memory is measured with ``tracemalloc`` while the index is built: everything the
index allocates (dicts, trie nodes, level strings split from wildcard filters,
buckets) is counted; the filter strings and subscriber objects, which the caller
creates and owns, are made before tracing starts and are not.

Each figure is the best of ``--rounds`` rounds because the machine is shared
and noisy; meshbus and the reference alternate within a round.

``topics.match overlap``: one subscriber holds many overlapping wildcard filters,
all matching the published topics (per level the literal word, ``*`` and every
prefix wildcard of the word: 10 choices over 5 levels is 100,000 filters; 4 levels,
10,000, with ``--quick``), added to the index of the largest size's workload.
Every topic is fresh (cache misses; each level is the word plus a random suffix,
so the prefixes still match). meshbus is measured as it is (``spill_after`` 64:
the subscriber's filters past 64 are asked once, in a trie of its own) and with
spilling off (``spill_after`` larger than the filter count: every filter in the
shared trie, the index as it was before), in the same run, with the reference
trie for context. The slow variants get shorter streams; the figure is a rate.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import platform
import random
import sys
import tracemalloc
from collections.abc import Callable, Sequence
from time import perf_counter

from meshbus import SubscriptionIndex

VOCAB_SIZES = (12, 60, 400, 3000)  # per depth; deeper levels reuse the last vocabulary
POOL = 4000
BROAD_SHARE = 0.02  # of the '>' filters, those cut after two levels
EXACT_SHARE = 0.8
PUBLISH_EXACT_SHARE = 0.4
TARGET_RATIO = 1.5
TARGET_BYTES = 0.6 * 1024
TARGET_SUBSCRIBE = 100_000
OVERLAP_WORD = "abcdefgh"


# --- workload -------------------------------------------------------------------------------


def _name(rng: random.Random) -> str:
    syllables = ("ka", "lo", "mi", "ne", "su", "ta", "ri", "do", "ve", "zu", "pa", "ho")
    return "".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))) + str(
        rng.randint(0, 99)
    )


class Workload:
    """Topics, subscriptions and publish streams, all from one seed."""

    def __init__(self, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        names: set[str] = set()
        vocabs: list[list[str]] = []
        for size in VOCAB_SIZES:
            vocab: list[str] = []
            while len(vocab) < size:
                n = _name(self.rng)
                if n not in names:
                    names.add(n)
                    vocab.append(n)
            vocabs.append(vocab)
        self.vocabs = vocabs
        self.seen: set[str] = set()

    def topic(self) -> str:
        rng = self.rng
        depth = rng.randint(4, 7)
        levels = []
        for d in range(depth):
            vocab = self.vocabs[min(d, len(self.vocabs) - 1)]
            # u**2 skews the choice towards the first names, as in real topic trees.
            levels.append(vocab[int(len(vocab) * rng.random() ** 2)])
        return "/".join(levels)

    def fresh_topic(self) -> str:
        """A topic never returned before by this workload."""
        while True:
            t = self.topic()
            if t not in self.seen:
                self.seen.add(t)
                return t

    def wildcard(self) -> str:
        rng = self.rng
        levels = self.topic().split("/")
        kind = rng.randrange(3)
        if kind == 0:
            levels[rng.randrange(1, len(levels))] = "*"
        elif kind == 1:
            i = rng.randrange(1, len(levels))
            levels[i] = levels[i][: rng.randint(2, 3)] + "*"
        else:
            # Few broad subscriptions (a/b/>), most cut deeper; with more broad ones
            # nearly every publish at 100k would match, which is not typical.
            cut = 2 if rng.random() < BROAD_SHARE else rng.randint(3, 4)
            levels = [*levels[:cut], ">"]
        return "/".join(levels)

    def subscriptions(self, n: int) -> list[tuple[str, object]]:
        subscribers = [object() for _ in range(max(1, n // 10))]
        out: list[tuple[str, object]] = []
        pairs: set[tuple[str, int]] = set()
        while len(out) < n:
            f = self.fresh_topic() if self.rng.random() < EXACT_SHARE else self.wildcard()
            k = self.rng.randrange(len(subscribers))
            if (f, k) not in pairs:
                pairs.add((f, k))
                out.append((f, subscribers[k]))
        return out

    def publish_topics(self, n: int, exact: Sequence[str], unique: bool) -> list[str]:
        """``n`` topics, PUBLISH_EXACT_SHARE of them named by exact subscriptions."""
        exact_pool = list(exact)
        self.rng.shuffle(exact_pool)
        out: list[str] = []
        for _ in range(n):
            if self.rng.random() < PUBLISH_EXACT_SHARE:
                out.append(exact_pool.pop() if unique else self.rng.choice(exact_pool))
            else:
                out.append(self.fresh_topic() if unique else self.topic())
        return out


# --- the reference ----------------------------------------------------------------------------


class _RefNode:
    __slots__ = ("end", "literal", "prefix", "rest", "star")

    def __init__(self) -> None:
        self.literal: dict[str, _RefNode] = {}
        self.prefix: dict[str, _RefNode] = {}
        self.star: _RefNode | None = None
        self.end: list[object] = []
        self.rest: list[object] = []


class RefTrie:
    """A plain trie over levels: no exact dict, no cache (see the module docstring)."""

    def __init__(self) -> None:
        self.root = _RefNode()

    def add(self, filter: str, subscriber: object) -> None:
        node = self.root
        levels = filter.split("/")
        rest = levels[-1] == ">"
        if rest:
            levels.pop()
        for level in levels:
            if level == "*":
                if node.star is None:
                    node.star = _RefNode()
                node = node.star
            elif level.endswith("*"):
                node = node.prefix.setdefault(level[:-1], _RefNode())
            else:
                node = node.literal.setdefault(level, _RefNode())
        (node.rest if rest else node.end).append(subscriber)

    def match(self, topic: str) -> tuple[object, ...]:
        found: dict[object, None] = {}
        self._walk(self.root, topic.split("/"), 0, found)
        return tuple(found)

    def _walk(self, node: _RefNode, levels: list[str], i: int, found: dict[object, None]) -> None:
        if i == len(levels):
            found.update(dict.fromkeys(node.end))
            return
        if node.rest:
            found.update(dict.fromkeys(node.rest))
        level = levels[i]
        child = node.literal.get(level)
        if child is not None:
            self._walk(child, levels, i + 1, found)
        if node.star is not None:
            self._walk(node.star, levels, i + 1, found)
        for prefix, child in node.prefix.items():
            if level.startswith(prefix):
                self._walk(child, levels, i + 1, found)


# --- measuring --------------------------------------------------------------------------------


def _rate(fn: Callable[[str], object], stream: Sequence[str]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = perf_counter()
        for topic in stream:
            fn(topic)
        elapsed = perf_counter() - t0
    finally:
        gc.enable()
    return len(stream) / elapsed


def _verdict(ok: bool) -> str:
    return "OK" if ok else "MISS"


def _fmt_rate(r: float) -> str:
    if r < 1e3:
        return f"{r:.0f}/s"
    return f"{r / 1e6:.2f} M/s" if r >= 1e6 else f"{r / 1e3:.0f} k/s"


def _label(n: int) -> str:
    return f"{n // 1000}k" if n >= 1000 else str(n)


def bench_size(n: int, rounds: int, stream_len: int, seed: int) -> None:
    wl = Workload(seed)
    subs = wl.subscriptions(n)
    exact = [f for f, _ in subs if "*" not in f and not f.endswith(">")]
    index: SubscriptionIndex[object] = SubscriptionIndex()
    ref = RefTrie()
    for f, s in subs:
        index.add(f, s)
        ref.add(f, s)
    label = _label(n)

    # pool: a few thousand distinct topics, repeated.
    pool = wl.publish_topics(POOL, exact, unique=False)
    pooled = [wl.rng.choice(pool) for _ in range(stream_len)]
    # no-repeat: distinct topics for every round (the same for both implementations).
    # Each round takes its exact-subscription topics from its own slice, so no topic
    # repeats across rounds either.
    per_round = min(stream_len, int(len(exact) / PUBLISH_EXACT_SHARE / (rounds + 1) * 0.8))
    share = len(exact) // (rounds + 1)
    fresh = [
        wl.publish_topics(per_round, exact[r * share : (r + 1) * share], unique=True)
        for r in range(rounds + 1)
    ]
    check = fresh.pop()  # for the comparison below, so it warms no cache the timing uses

    # Same answers, and what fraction of publishes matches anything.
    for topic in pool[:2000] + check[:2000]:
        assert set(index.match(topic)) == set(ref.match(topic)), topic
    hit = sum(1 for t in pooled if index.match(t)) / len(pooled)
    hit_fresh = sum(1 for t in check if ref.match(t)) / len(check)
    fanout = [len(m) for m in map(ref.match, check) if m]
    wild = sum(1 for f, _ in subs if "*" in f or f.endswith(">"))
    print(
        f"# {label} subs ({wild / n:.0%} wildcard), pool of {POOL} topics: "
        f"{hit:.0%} of publishes match, no-repeat streams: {hit_fresh:.0%} match "
        f"(mean {sum(fanout) / len(fanout):.1f} subscribers when they do)",
        flush=True,
    )

    best: dict[str, float] = {"pool": 0.0, "pool_ref": 0.0, "fresh": 0.0, "fresh_ref": 0.0}
    for r in range(rounds):
        best["pool"] = max(best["pool"], _rate(index.match, pooled))
        best["pool_ref"] = max(best["pool_ref"], _rate(ref.match, pooled))
        best["fresh"] = max(best["fresh"], _rate(index.match, fresh[r]))
        best["fresh_ref"] = max(best["fresh_ref"], _rate(ref.match, fresh[r]))
    for kind, what in (("pool", "pool (cached)"), ("fresh", "no-repeat (cache misses)")):
        ratio = best[kind] / best[kind + "_ref"]
        line = (
            f"topics.match {label} subs {what}: meshbus {_fmt_rate(best[kind])}, "
            f"reference trie {_fmt_rate(best[kind + '_ref'])}, ratio {ratio:.1f}x"
        )
        if n >= 100_000:
            line += f" (target >= {TARGET_RATIO}x) {_verdict(ratio >= TARGET_RATIO)}"
        print(line, flush=True)

    # Memory: fresh objects, traced while the index is built.
    del index, ref
    gc.collect()
    for name, make in (("meshbus", SubscriptionIndex), ("reference trie", RefTrie)):
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        obj = make()
        for f, s in subs:
            obj.add(f, s)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        per = (after - before) / n
        line = f"topics.memory {label} subs {name}: {per:.0f} bytes/sub"
        if name == "meshbus":
            line += (
                f" (the index's own objects incl. level strings split from wildcards; not the"
                f" caller's filter strings or subscribers) (target <= 0.6 KB = {TARGET_BYTES:.0f})"
                f" {_verdict(per <= TARGET_BYTES)}"
            )
        print(line, flush=True)
        del obj

    # Subscribe rate: build a fresh index from scratch.
    best_add = best_ref_add = 0.0
    for _ in range(rounds):
        for name in ("meshbus", "ref"):
            obj2: SubscriptionIndex[object] | RefTrie = (
                SubscriptionIndex() if name == "meshbus" else RefTrie()
            )
            add = obj2.add
            gc.collect()
            gc.disable()
            try:
                t0 = perf_counter()
                for f, s in subs:
                    add(f, s)
                rate = n / (perf_counter() - t0)
            finally:
                gc.enable()
            if name == "meshbus":
                best_add = max(best_add, rate)
            else:
                best_ref_add = max(best_ref_add, rate)
            del obj2, add
    line = (
        f"topics.subscribe {label} subs: meshbus {_fmt_rate(best_add)}, "
        f"reference trie {_fmt_rate(best_ref_add)}, ratio {best_add / best_ref_add:.1f}x"
    )
    if n >= 100_000:
        line += (
            f" (target >= {TARGET_SUBSCRIBE // 1000}k/s) {_verdict(best_add >= TARGET_SUBSCRIBE)}"
        )
    print(line, flush=True)


def overlapping_filters(levels: int) -> list[str]:
    """Per level the literal word, ``*`` and each prefix wildcard of it, in every combination."""
    w = OVERLAP_WORD
    choices = (w, "*", *(w[:k] + "*" for k in range(1, len(w) + 1)))
    return ["/".join(p) for p in itertools.product(choices, repeat=levels)]


def bench_overlap(n: int, levels: int, rounds: int, stream_len: int, seed: int) -> None:
    """One subscriber with many overlapping wildcard filters, fresh topics (module docstring)."""
    wl = Workload(seed)
    subs = wl.subscriptions(n)
    heavy = object()
    filters = overlapping_filters(levels)
    spilling: SubscriptionIndex[object] = SubscriptionIndex()
    shared_only: SubscriptionIndex[object] = SubscriptionIndex(spill_after=len(filters) + 1)
    ref = RefTrie()
    for obj in (spilling, shared_only, ref):
        for f, s in subs:
            obj.add(f, s)
        for f in filters:
            obj.add(f, heavy)

    def topics(count: int) -> list[str]:
        return [
            "/".join(f"{OVERLAP_WORD}{wl.rng.randrange(10**9)}" for _ in range(levels))
            for _ in range(count)
        ]

    check = topics(20)
    for topic in check:
        assert heavy in spilling.match(topic)
        assert set(spilling.match(topic)) == set(shared_only.match(topic)) == set(ref.match(topic))
    # The slow variants walk every filter per publish: fewer publishes keep the run short.
    slow_len = max(20, stream_len // 2000)
    best = {"spill": 0.0, "shared": 0.0, "ref": 0.0}
    for _ in range(rounds):
        best["spill"] = max(best["spill"], _rate(spilling.match, topics(stream_len)))
        best["shared"] = max(best["shared"], _rate(shared_only.match, topics(slow_len)))
        best["ref"] = max(best["ref"], _rate(ref.match, topics(slow_len)))
    label = _label(len(filters))
    print(
        f"topics.match overlap 1 subscriber with {label} overlapping wildcard filters "
        f"(+ {_label(n)} subs) no-repeat (cache misses): meshbus {_fmt_rate(best['spill'])}, "
        f"without spilling (spill_after > filters, the index before) "
        f"{_fmt_rate(best['shared'])}, ratio {best['spill'] / best['shared']:.0f}x; "
        f"reference trie {_fmt_rate(best['ref'])}, ratio {best['spill'] / best['ref']:.0f}x",
        flush=True,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke test")
    parser.add_argument("--rounds", type=int, default=None, help="repeats (best counts)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = (1_000, 10_000) if args.quick else (10_000, 100_000)
    rounds = args.rounds or (2 if args.quick else 5)
    stream_len = 5_000 if args.quick else 50_000
    print(
        f"# python {platform.python_version()} {sys.platform}; best of {rounds} rounds, "
        f"{stream_len} publishes per round",
        flush=True,
    )
    for n in sizes:
        bench_size(n, rounds, stream_len, args.seed)
    bench_overlap(sizes[-1], 4 if args.quick else 5, rounds, stream_len, args.seed)


if __name__ == "__main__":
    main()
