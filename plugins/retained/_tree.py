"""The topics that hold a retained value, as a tree of levels, walked by a filter.

A subscription asks the opposite of what a subscription index answers: not "which
filters match this topic" but "which topics match this filter". A tree of topic
levels answers it by walking only the branches the filter's levels can match, so an
exact filter is one step per level and ``a/>`` visits only what lies under ``a``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["TopicTree"]

T = TypeVar("T")


class _Branch(Generic[T]):
    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.children: dict[str, _Branch[T]] = {}
        self.value: T | None = None


class TopicTree(Generic[T]):
    """Values under concrete topics; :meth:`matching` yields those a filter matches."""

    def __init__(self) -> None:
        self._root: _Branch[T] = _Branch()
        self._values: dict[str, T] = {}

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, topic: object) -> bool:
        return topic in self._values

    def get(self, topic: str) -> T | None:
        """The value under ``topic``, or ``None``."""
        return self._values.get(topic)

    def items(self) -> Iterator[tuple[str, T]]:
        """Every (topic, value), in no particular order."""
        return iter(list(self._values.items()))

    def put(self, topic: str, value: T) -> None:
        """Set the value under ``topic``."""
        branch = self._root
        for level in topic.split("/"):
            child = branch.children.get(level)
            if child is None:
                child = branch.children[level] = _Branch()
            branch = child
        branch.value = value
        self._values[topic] = value

    def pop(self, topic: str) -> T | None:
        """Remove the value under ``topic`` and return it (``None`` if there was none);
        branches left empty go too."""
        value = self._values.pop(topic, None)
        if value is None:
            return None
        path: list[tuple[_Branch[T], str]] = []
        branch = self._root
        for level in topic.split("/"):
            path.append((branch, level))
            branch = branch.children[level]
        branch.value = None
        for parent, level in reversed(path):
            child = parent.children[level]
            if child.value is not None or child.children:
                break
            del parent.children[level]
        return value

    def matching(self, filter: str) -> list[T]:
        """The values under every topic ``filter`` matches (SPEC 1 wildcards)."""
        if filter in self._values:  # an exact filter, or a topic spelled like one
            exact = self._values[filter]
            if "*" not in filter and not filter.endswith(">"):
                return [exact]
        found: list[T] = []
        self._walk(self._root, filter.split("/"), 0, found)
        return found

    def _walk(self, branch: _Branch[T], levels: list[str], at: int, found: list[T]) -> None:
        pattern = levels[at]
        last = at == len(levels) - 1
        if last and pattern == ">":
            for child in branch.children.values():
                _collect(child, found)
            return
        if pattern == "*":
            children = list(branch.children.values())
        elif pattern.endswith("*"):
            prefix = pattern[:-1]
            children = [c for level, c in branch.children.items() if level.startswith(prefix)]
        else:
            exact = branch.children.get(pattern)
            children = [] if exact is None else [exact]
        for child in children:
            if last:
                if child.value is not None:
                    found.append(child.value)
            else:
                self._walk(child, levels, at + 1, found)


def _collect(branch: _Branch[T], found: list[T]) -> None:
    stack = [branch]
    while stack:
        each = stack.pop()
        if each.value is not None:
            found.append(each.value)
        stack.extend(each.children.values())
