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
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from ._topics import is_wildcard_filter

__all__ = ["SubscriptionIndex"]

T = TypeVar("T")

_Bucket = dict  # subscriber -> None: an insertion-ordered set


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


class SubscriptionIndex(Generic[T]):
    """Maps topic filters to subscribers and answers "who matches this topic?".

    Filters must already be valid (see :func:`meshbus._topics.parse_subscription`).
    """

    __slots__ = ("_cache", "_cache_size", "_count", "_exact", "_root", "_wildcards", "cached")

    def __init__(self, cache_size: int = 8192) -> None:
        self._exact: dict[str, dict[T, None]] = {}
        self._root = _Node(None)
        self._wildcards = 0  # number of (wildcard filter, subscriber) pairs
        self._count = 0
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
            bucket = self._wildcard_bucket(filter, create=True)
            assert bucket is not None
            if subscriber in bucket:
                return False
            bucket[subscriber] = None
            self._wildcards += 1
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
            node, bucket_name = self._find_wildcard(filter)
            bucket = getattr(node, bucket_name) if node is not None else None
            if not bucket or subscriber not in bucket:
                return False
            del bucket[subscriber]
            if not bucket:
                setattr(node, bucket_name, None)
                self._prune(node, filter)
            self._wildcards -= 1
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

    def subscribers(self, filter: str) -> tuple[T, ...]:
        """The subscribers registered under exactly this filter (not matching ones)."""
        if is_wildcard_filter(filter):
            node, name = self._find_wildcard(filter)
            bucket = getattr(node, name) if node is not None else None
        else:
            bucket = self._exact.get(filter)
        return tuple(bucket) if bucket else ()

    def filters(self) -> Iterator[str]:
        """Every filter that has at least one subscriber (for advertisement and debugging)."""
        yield from self._exact
        stack: list[tuple[_Node, list[str]]] = [(self._root, [])]
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

    # --- matching (the per-message path) ------------------------------------------

    def match(self, topic: str) -> tuple[T, ...]:
        """Every subscriber with a filter matching ``topic``, each once, cached."""
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        bucket = self._exact.get(topic)
        if self._wildcards:
            found: list[dict[T, None]] = [bucket] if bucket else []
            self._collect(self._root, topic.split("/"), 0, found)
            if len(found) == 1:
                result: tuple[T, ...] = tuple(found[0])
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

    # --- trie plumbing -----------------------------------------------------------------

    def _wildcard_bucket(self, filter: str, create: bool) -> dict[T, None] | None:
        levels = filter.split("/")
        rest = levels[-1] == ">"
        if rest:
            levels.pop()
        node = self._root
        for level in levels:
            node = self._child(node, level)
        name = "rest" if rest else "here"
        bucket = getattr(node, name)
        if bucket is None and create:
            bucket = {}
            setattr(node, name, bucket)
        return bucket  # type: ignore[no-any-return]

    @staticmethod
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

    def _find_wildcard(self, filter: str) -> tuple[_Node | None, str]:
        levels = filter.split("/")
        rest = levels[-1] == ">"
        if rest:
            levels.pop()
        node: _Node | None = self._root
        for level in levels:
            assert node is not None
            if level == "*":
                node = node.star
            elif level.endswith("*"):
                node = node.prefix.get(level[:-1]) if node.prefix else None
            else:
                node = node.literal.get(level) if node.literal else None
            if node is None:
                return None, "here"
        return node, ("rest" if rest else "here")

    @staticmethod
    def _prune(node: _Node | None, filter: str) -> None:
        """Drop now-empty nodes from the leaf up, so churn does not leak memory."""
        levels = filter.split("/")
        if levels[-1] == ">":
            levels.pop()
        for level in reversed(levels):
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
