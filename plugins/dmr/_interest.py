"""What a node asks its neighbours for: refcounted interest, summarized (SPEC 8).

An :class:`InterestTable` counts how many local sources want each topic filter (client
subscriptions, queues, neighbours' interest a gateway passes on) and keeps the
*summary* that goes on the wire: a filter is advertised when its first source comes
and withdrawn when its last one goes, and a filter that an advertised filter of the
same class covers (``a/b`` under ``a/>``) is not advertised at all. Withdrawing a
wildcard brings back what it was hiding. Each change returns what to tell the
neighbours, as ``(added, removed)`` lists of ``(class, filter)`` pairs, so client
churn under a filter already advertised costs the links nothing.

Classes keep apart what must not stand in for each other: direct interest (``d``)
and guaranteed interest (``g``), and each of them as interest of another cluster
(``fd``, ``fg``) that only a gateway passes into its own cluster. A filter covers only
filters of its own class.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from meshbus import SubscriptionIndex, filter_covers, is_wildcard_filter

__all__ = ["CLASSES", "Change", "InterestTable"]

CLASSES = ("d", "g", "fd", "fg")
"""Direct, guaranteed, and the same two learned from another cluster."""

Change = tuple[list[tuple[str, str]], list[tuple[str, str]]]
"""What to advertise: the ``(class, filter)`` pairs added, and those withdrawn."""


class _Class:
    """The counts and the advertised summary of one class of interest."""

    __slots__ = ("advertised", "counts", "wildcards")

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        #: The summary on the wire: no advertised filter covers another.
        self.advertised: set[str] = set()
        #: The advertised wildcard filters, to find what covers a literal filter fast.
        self.wildcards: SubscriptionIndex[str] = SubscriptionIndex(cache_size=0)

    def covered(self, topic_filter: str) -> bool:
        """Whether an advertised filter other than ``topic_filter`` covers it (a queue's
        topic, ``#P2P/QUE/<name>``, never is: it names one queue, not what matches)."""
        if not self.wildcards or topic_filter.startswith("#"):
            return False
        if not is_wildcard_filter(topic_filter):
            return any(w != topic_filter for w in self.wildcards.match(topic_filter))
        return any(
            w != topic_filter and filter_covers(w, topic_filter) for w in self.wildcards.filters()
        )

    def show(self, topic_filter: str) -> None:
        self.advertised.add(topic_filter)
        if is_wildcard_filter(topic_filter):
            self.wildcards.add(topic_filter, topic_filter)

    def hide(self, topic_filter: str) -> None:
        self.advertised.discard(topic_filter)
        if is_wildcard_filter(topic_filter):
            self.wildcards.remove(topic_filter, topic_filter)


class InterestTable:
    """Refcounted interest by class, and its summary (see the module docstring)."""

    def __init__(self) -> None:
        self._classes = {name: _Class() for name in CLASSES}

    def __len__(self) -> int:
        """Distinct ``(class, filter)`` pairs wanted by at least one source."""
        return sum(len(c.counts) for c in self._classes.values())

    @property
    def advertised_count(self) -> int:
        """How many pairs the summary holds."""
        return sum(len(c.advertised) for c in self._classes.values())

    def advertised(self) -> Iterator[tuple[str, str]]:
        """The summary: what a neighbour that starts over is told."""
        for name, table in self._classes.items():
            for topic_filter in sorted(table.advertised):
                yield name, topic_filter

    def count(self, kind: str, topic_filter: str) -> int:
        """How many sources want ``topic_filter`` as ``kind``."""
        return self._classes[kind].counts.get(topic_filter, 0)

    def add(self, kind: str, topic_filter: str) -> Change:
        """One more source wants ``topic_filter`` as ``kind``."""
        table = self._classes[kind]
        n = table.counts.get(topic_filter, 0)
        table.counts[topic_filter] = n + 1
        if n or table.covered(topic_filter):
            return [], []
        table.show(topic_filter)
        removed: list[tuple[str, str]] = []
        if is_wildcard_filter(topic_filter):
            for other in [
                f
                for f in table.advertised
                if f != topic_filter and f[0] != "#" and filter_covers(topic_filter, f)
            ]:
                table.hide(other)
                removed.append((kind, other))
        return [(kind, topic_filter)], removed

    def remove(self, kind: str, topic_filter: str) -> Change:
        """One source less wants ``topic_filter`` as ``kind`` (a no-op if none did)."""
        table = self._classes[kind]
        n = table.counts.get(topic_filter, 0)
        if n == 0:
            return [], []
        if n > 1:
            table.counts[topic_filter] = n - 1
            return [], []
        del table.counts[topic_filter]
        if topic_filter not in table.advertised:
            return [], []
        table.hide(topic_filter)
        added: list[tuple[str, str]] = []
        if is_wildcard_filter(topic_filter):
            # What it hid comes back: the filters under it that nothing advertised
            # covers, less those another of them covers (the summary stays minimal).
            back = [
                f
                for f in table.counts
                if f not in table.advertised
                and f[0] != "#"
                and filter_covers(topic_filter, f)
                and not table.covered(f)
            ]
            wide = [f for f in back if is_wildcard_filter(f)]
            index: SubscriptionIndex[str] = SubscriptionIndex(cache_size=0)
            for f in wide:
                index.add(f, f)
            for other in back:
                if is_wildcard_filter(other):
                    hidden = any(w != other and filter_covers(w, other) for w in wide)
                else:
                    hidden = bool(index.match(other))
                if not hidden:
                    table.show(other)
                    added.append((kind, other))
        return added, [(kind, topic_filter)]

    def add_many(self, pairs: Iterable[tuple[str, str]]) -> Change:
        """:meth:`add` each pair; the changes together."""
        return _merge(self.add(kind, f) for kind, f in pairs)

    def remove_many(self, pairs: Iterable[tuple[str, str]]) -> Change:
        """:meth:`remove` each pair; the changes together."""
        return _merge(self.remove(kind, f) for kind, f in pairs)


def _merge(changes: Iterable[Change]) -> Change:
    """Several changes as one: a pair added and then withdrawn (or the reverse) cancels."""
    added: dict[tuple[str, str], None] = {}
    removed: dict[tuple[str, str], None] = {}
    for plus, minus in changes:
        for pair in minus:
            if pair in added:
                del added[pair]
            else:
                removed[pair] = None
        for pair in plus:
            if pair in removed:
                del removed[pair]
            else:
                added[pair] = None
    return list(added), list(removed)
