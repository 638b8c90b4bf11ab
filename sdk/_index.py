"""The per-VPN subscription index: which subscribers match a topic.

Three parts, chosen so that a publish never scans subscriptions and never
runs a regex:

* ``exact``: filters without wildcards, in a dict keyed by the filter itself;
* a trie over levels for wildcard filters, with one branch per literal level,
  one for ``*``, one per ``ab*`` prefix (looked up once per distinct prefix
  length, not tried one by one) and a bucket for a trailing ``>``;
* a bounded cache from topic to the tuple of matching subscribers.

A change to an exact filter evicts only that topic from the cache; a change to
a wildcard filter clears it. The cache is cleared whole when it fills, which
keeps the bookkeeping per publish to one dict lookup on a hit.

Subscribers are any hashable objects; ``match`` returns each one at most once
even when several of its filters match (SPEC 2: at most once per session).

One subscriber must not make a match cost a step per filter it holds (a client
with 100,000 overlapping filters once made every publish walk and merge all of
them). So the common
trie takes at most ``spill_after`` wildcard filters of each subscriber; the rest
spill into a trie of the subscriber's own, which a match only asks "does any
filter match?" and leaves at the first one that does. That trie is filed in a
second, small trie under one filter covering all of it (its filters' common
literal levels followed by ``>``), so only subscribers whose filters could
match are asked. A cache miss therefore costs, per subscriber, at most
``spill_after`` buckets merged plus one early-exit walk of its own trie, which
visits each of that trie's nodes at most once.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from ._topics import is_wildcard_filter
from .errors import ConfigurationError

__all__ = ["SubscriptionIndex"]

T = TypeVar("T")

_Bucket = dict  # subscriber -> None: an insertion-ordered set

#: What marks the end of a filter in a subscriber's own trie, where the subscriber is known
#: and only "is a filter here?" matters: one shared object instead of a dict per filter.
_PRESENT: dict[object, None] = {None: None}


class _Prefixes(dict[str, "_Node"]):
    """The ``ab*`` children of one node: ``'ab'`` -> child, plus the prefix lengths present.

    A match tries ``level[:k]`` for each length ``k`` in ``lengths`` (ascending), so the
    cost per level is the number of distinct lengths, not of prefixes. ``counts`` keeps
    adding and removing a prefix O(1) even with many prefixes under one node.
    """

    __slots__ = ("counts", "lengths")

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[int, int] = {}
        self.lengths: tuple[int, ...] = ()

    def add(self, key: str, child: _Node) -> None:
        self[key] = child
        k = len(key)
        n = self.counts.get(k, 0)
        self.counts[k] = n + 1
        if not n:
            self.lengths = tuple(sorted(self.counts))

    def discard(self, key: str) -> None:
        del self[key]
        k = len(key)
        n = self.counts[k] - 1
        if n:
            self.counts[k] = n
        else:
            del self.counts[k]
            self.lengths = tuple(sorted(self.counts))


class _Node:
    """One trie level. Children dicts are created on demand to keep memory low."""

    __slots__ = ("here", "literal", "parent", "prefix", "rest", "star")

    def __init__(self, parent: _Node | None) -> None:
        self.parent = parent
        self.literal: dict[str, _Node] | None = None  # 'abc' -> child
        self.prefix: _Prefixes | None = None  # 'ab' of 'ab*' -> child
        self.star: _Node | None = None  # '*'
        self.here: dict[object, None] | None = None  # filters ending at this level
        self.rest: dict[object, None] | None = None  # '>' after this level

    def is_empty(self) -> bool:
        return not (self.literal or self.prefix or self.star or self.here or self.rest)


class _Own:
    """The wildcard filters of one subscriber beyond the ``spill_after`` in the common trie."""

    __slots__ = ("count", "root", "subscriber", "summary")

    def __init__(self, subscriber: object) -> None:
        self.subscriber = subscriber
        self.root = _Node(None)
        self.count = 0
        #: The filter this trie is filed under in the index's summary trie: the literal
        #: levels every one of its filters starts with, then ``>``, so it matches every
        #: topic any of them does.
        self.summary = ""

    def cover(self) -> str:
        """The summary filter of the filters held now (a walk down the common literals)."""
        node = self.root
        levels: list[str] = []
        # A node reached through literals only ends no wildcard filter ('here' is empty),
        # so every filter below still has a level after these: '>' covers it.
        while (
            node.rest is None
            and node.prefix is None
            and node.star is None
            and node.literal is not None
            and len(node.literal) == 1
        ):
            level, node = next(iter(node.literal.items()))
            levels.append(level)
        levels.append(">")
        return "/".join(levels)


class SubscriptionIndex(Generic[T]):
    """Maps topic filters to subscribers and answers "who matches this topic?".

    Filters must already be valid (see :func:`meshbus._topics.parse_subscription`).

    :param cache_size: most topics whose answer is kept; the cache is cleared when full.
    :param spill_after: most wildcard filters of one subscriber kept in the trie all
        subscribers share. Its further filters go to a trie of its own, which a match
        leaves at the first filter that matches, so however many filters a subscriber
        holds, a match does at most ``spill_after`` steps for it in the common trie plus
        one walk of its own trie that stops early. A larger value shares more trie
        nodes between subscribers; a smaller one lowers the most a subscriber can cost.
    :raises ConfigurationError: ``spill_after`` is not an int >= 0.
    """

    __slots__ = (
        "_cache",
        "_cache_size",
        "_count",
        "_exact",
        "_in_common",
        "_own",
        "_root",
        "_spill_after",
        "_summaries",
        "_wildcards",
        "cached",
    )

    def __init__(self, cache_size: int = 8192, spill_after: int = 64) -> None:
        if not isinstance(spill_after, int) or isinstance(spill_after, bool) or spill_after < 0:
            raise ConfigurationError(f"spill_after must be an int >= 0, got {spill_after!r}")
        self._exact: dict[str, dict[T, None]] = {}
        self._root = _Node(None)
        self._wildcards = 0  # number of (wildcard filter, subscriber) pairs in the common trie
        self._count = 0
        self._spill_after = spill_after
        #: How many wildcard filters each subscriber has in the common trie.
        self._in_common: dict[T, int] = {}
        #: The subscribers with filters beyond those, each with its own trie.
        self._own: dict[T, _Own] = {}
        #: Each own trie filed under its summary filter, in 'rest' buckets of this trie.
        self._summaries = _Node(None)
        # Never rebound (only cleared), so `cached` stays valid for the index's life.
        self._cache: dict[str, tuple[T, ...]] = {}
        self._cache_size = cache_size
        self.cached = self._cache.get
        """Probe the match cache: ``cached(topic)`` is the cached result or ``None``."""

    def __len__(self) -> int:
        """Number of (filter, subscriber) pairs."""
        return self._count

    # --- changes ------------------------------------------------------------------

    def add(self, filter: str, subscriber: T) -> bool:
        """Add ``subscriber`` under ``filter``; return ``False`` if it was already there."""
        if is_wildcard_filter(filter):
            hash(subscriber)  # an unhashable subscriber fails here, before any node is made
            if not self._add_wildcard(filter, subscriber):
                return False
            self._cache.clear()
        else:
            bucket = self._exact.get(filter)
            if bucket is None:
                self._exact[filter] = {subscriber: None}
            elif subscriber in bucket:
                return False
            else:
                bucket[subscriber] = None
            self._cache.pop(filter, None)
        self._count += 1
        return True

    def remove(self, filter: str, subscriber: T) -> bool:
        """Remove ``subscriber`` from ``filter``; return ``False`` if it was not there."""
        if is_wildcard_filter(filter):
            if not self._remove_wildcard(filter, subscriber):
                return False
            self._cache.clear()
        else:
            bucket = self._exact.get(filter)
            if bucket is None or subscriber not in bucket:
                return False
            del bucket[subscriber]
            if not bucket:
                del self._exact[filter]
            self._cache.pop(filter, None)
        self._count -= 1
        return True

    def _add_wildcard(self, filter: str, subscriber: T) -> bool:
        own = self._own.get(subscriber)
        if own is not None and _end(own.root, filter) is not None:
            return False
        in_common = self._in_common.get(subscriber, 0)
        if in_common < self._spill_after:
            bucket = _bucket(self._root, filter, create=True)
            assert bucket is not None
            if subscriber in bucket:
                return False
            bucket[subscriber] = None
            self._in_common[subscriber] = in_common + 1
            self._wildcards += 1
            return True
        node, name = _find(self._root, filter)
        if node is not None and subscriber in (getattr(node, name) or ()):
            return False
        if own is None:
            own = self._own[subscriber] = _Own(subscriber)
        node, name = _path(own.root, filter)
        setattr(node, name, _PRESENT)
        own.count += 1
        self._file(own)
        return True

    def _remove_wildcard(self, filter: str, subscriber: T) -> bool:
        node, name = _find(self._root, filter)
        bucket = getattr(node, name) if node is not None else None
        if bucket and subscriber in bucket:
            del bucket[subscriber]
            if not bucket:
                setattr(node, name, None)
                _prune(node, filter)
            n = self._in_common[subscriber] - 1
            if n:
                self._in_common[subscriber] = n
            else:
                del self._in_common[subscriber]
            self._wildcards -= 1
            return True
        own = self._own.get(subscriber)
        if own is None:
            return False
        node, name = _find(own.root, filter)
        if node is None or getattr(node, name) is None:
            return False
        setattr(node, name, None)
        _prune(node, filter)
        own.count -= 1
        if own.count:
            self._file(own)
        else:
            del self._own[subscriber]
            self._unfile(own)
        return True

    def _file(self, own: _Own) -> None:
        """(Re)file ``own`` under the summary of its filters, when that changed."""
        summary = own.cover()
        if summary == own.summary:
            return
        if own.summary:
            self._unfile(own)
        own.summary = summary
        bucket = _bucket(self._summaries, summary, create=True)
        assert bucket is not None
        bucket[own] = None

    def _unfile(self, own: _Own) -> None:
        node, name = _find(self._summaries, own.summary)
        assert node is not None
        bucket = getattr(node, name)
        del bucket[own]
        if not bucket:
            setattr(node, name, None)
            _prune(node, own.summary)

    def subscribers(self, filter: str) -> tuple[T, ...]:
        """The subscribers registered under exactly this filter (not matching ones)."""
        if not is_wildcard_filter(filter):
            bucket = self._exact.get(filter)
            return tuple(bucket) if bucket else ()
        node, name = _find(self._root, filter)
        found: dict[T, None] = dict(getattr(node, name) or {}) if node is not None else {}
        for subscriber, own in self._own.items():
            if _end(own.root, filter) is not None:
                found[subscriber] = None
        return tuple(found)

    def filters(self) -> Iterator[str]:
        """Every filter that has at least one subscriber (for advertisement and debugging)."""
        yield from self._exact
        if not self._own:
            yield from _filters(self._root)
            return
        seen = set(_filters(self._root))
        yield from seen
        for own in self._own.values():
            for f in _filters(own.root):
                if f not in seen:
                    seen.add(f)
                    yield f

    # --- matching (the per-message path) ------------------------------------------

    def match(self, topic: str) -> tuple[T, ...]:
        """Every subscriber with a filter matching ``topic``, each once, cached."""
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        bucket = self._exact.get(topic)
        if self._wildcards or self._own:
            levels = topic.split("/")
            found: list[dict[T, None]] = [bucket] if bucket else []
            if self._wildcards:
                self._collect(self._root, levels, 0, found)
            if self._own:
                result = self._with_own(levels, found)
            elif len(found) == 1:
                result = tuple(found[0])
            else:
                merged: dict[T, None] = {}
                for b in found:
                    merged.update(b)
                result = tuple(merged)
        else:
            result = tuple(bucket) if bucket else ()
        cache = self._cache
        if len(cache) >= self._cache_size:
            cache.clear()
        cache[topic] = result
        return result

    def _with_own(self, levels: list[str], found: list[dict[T, None]]) -> tuple[T, ...]:
        """Merge ``found`` and add each subscriber whose own trie has a matching filter."""
        merged: dict[T, None] = {}
        for b in found:
            merged.update(b)
        candidates: list[dict[_Own, None]] = []
        self._collect(self._summaries, levels, 0, candidates)
        for owns in candidates:
            for own in owns:
                subscriber: T = own.subscriber  # type: ignore[assignment]
                # Already matched through another filter: its own trie need not be asked.
                if subscriber not in merged and _any(own.root, levels, 0):
                    merged[subscriber] = None
        return tuple(merged)

    def _collect(self, node: _Node, levels: list[str], i: int, found: list) -> None:  # type: ignore[type-arg]
        n = len(levels)
        while True:
            if node.rest is not None and i < n:
                found.append(node.rest)
            if i == n:
                if node.here is not None:
                    found.append(node.here)
                return
            level = levels[i]
            i += 1
            prefix = node.prefix
            if prefix is not None:
                for k in prefix.lengths:
                    if k > len(level):
                        break
                    child = prefix.get(level[:k])
                    if child is not None:
                        self._collect(child, levels, i, found)
            if node.star is not None:
                if node.literal is not None:
                    child = node.literal.get(level)
                    if child is not None:
                        self._collect(child, levels, i, found)
                node = node.star
                continue
            if node.literal is None:
                return
            nxt = node.literal.get(level)
            if nxt is None:
                return
            node = nxt


# --- trie plumbing ---------------------------------------------------------------------


def _any(node: _Node, levels: list[str], i: int) -> bool:
    """Whether a filter in the trie under ``node`` matches ``levels[i:]``; stops at the first.

    The same walk as :meth:`SubscriptionIndex._collect`, returning instead of collecting.
    Each node sits at one depth, so a walk visits each node at most once.
    """
    n = len(levels)
    while True:
        if node.rest is not None and i < n:
            return True
        if i == n:
            return node.here is not None
        level = levels[i]
        i += 1
        prefix = node.prefix
        if prefix is not None:
            for k in prefix.lengths:
                if k > len(level):
                    break
                child = prefix.get(level[:k])
                if child is not None and _any(child, levels, i):
                    return True
        if node.star is not None:
            if node.literal is not None:
                child = node.literal.get(level)
                if child is not None and _any(child, levels, i):
                    return True
            node = node.star
            continue
        if node.literal is None:
            return False
        nxt = node.literal.get(level)
        if nxt is None:
            return False
        node = nxt


def _split(filter: str) -> tuple[list[str], str]:
    """The levels of a wildcard filter to walk, and the bucket its end uses."""
    levels = filter.split("/")
    if levels[-1] == ">":
        levels.pop()
        return levels, "rest"
    return levels, "here"


def _path(root: _Node, filter: str) -> tuple[_Node, str]:
    """The node where ``filter`` ends, made on the way as needed, and its bucket's name."""
    levels, name = _split(filter)
    node = root
    for level in levels:
        node = _child(node, level)
    return node, name


def _bucket(root: _Node, filter: str, create: bool) -> dict[object, None] | None:
    node, name = _path(root, filter)
    bucket: dict[object, None] | None = getattr(node, name)
    if bucket is None and create:
        bucket = {}
        setattr(node, name, bucket)
    return bucket


def _end(root: _Node, filter: str) -> dict[object, None] | None:
    """The bucket of exactly ``filter`` under ``root``, or ``None``; makes no node."""
    node, name = _find(root, filter)
    return getattr(node, name) if node is not None else None


def _child(node: _Node, level: str) -> _Node:
    if level == "*":
        if node.star is None:
            node.star = _Node(node)
        return node.star
    if level.endswith("*"):
        key = level[:-1]
        if node.prefix is None:
            node.prefix = _Prefixes()
        child = node.prefix.get(key)
        if child is None:
            child = _Node(node)
            node.prefix.add(key, child)
        return child
    if node.literal is None:
        node.literal = {}
    child = node.literal.get(level)
    if child is None:
        child = node.literal[level] = _Node(node)
    return child


def _find(root: _Node, filter: str) -> tuple[_Node | None, str]:
    levels, name = _split(filter)
    node: _Node | None = root
    for level in levels:
        assert node is not None
        if level == "*":
            node = node.star
        elif level.endswith("*"):
            node = node.prefix.get(level[:-1]) if node.prefix else None
        else:
            node = node.literal.get(level) if node.literal else None
        if node is None:
            return None, name
    return node, name


def _prune(node: _Node | None, filter: str) -> None:
    """Drop now-empty nodes from the leaf up, so churn does not leak memory."""
    for level in reversed(_split(filter)[0]):
        if node is None or not node.is_empty():
            return
        parent = node.parent
        assert parent is not None
        if level == "*":
            parent.star = None
        elif level.endswith("*"):
            assert parent.prefix is not None
            parent.prefix.discard(level[:-1])
            if not parent.prefix:
                parent.prefix = None
        else:
            assert parent.literal is not None
            del parent.literal[level]
            if not parent.literal:
                parent.literal = None
        node = parent


def _filters(root: _Node) -> Iterator[str]:
    """Every filter ending in the trie under ``root``."""
    stack: list[tuple[_Node, list[str]]] = [(root, [])]
    while stack:
        node, path = stack.pop()
        if node.here:
            yield "/".join(path)
        if node.rest:
            yield "/".join([*path, ">"])
        if node.literal:
            stack.extend((child, [*path, lv]) for lv, child in node.literal.items())
        if node.prefix:
            stack.extend((child, [*path, p + "*"]) for p, child in node.prefix.items())
        if node.star:
            stack.append((node.star, [*path, "*"]))
