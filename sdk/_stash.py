"""Typed per-object storage for plugin state (modelled on pytest's stash)."""

from __future__ import annotations

from typing import Any, Generic, TypeVar, cast

__all__ = ["Stash", "StashKey"]

T = TypeVar("T")
D = TypeVar("D")


class StashKey(Generic[T]):
    """A key into a :class:`Stash`; create one per kind of state, at module level."""

    __slots__ = ()


class Stash:
    """Plugin state attached to a node, VPN, session or link, keyed by :class:`StashKey`."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        self._data: dict[StashKey[Any], object] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        """Store ``value`` under ``key``, replacing any previous value."""
        self._data[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        """The value stored under ``key``; raise :class:`KeyError` if there is none."""
        return cast(T, self._data[key])

    def get(self, key: StashKey[T], default: D) -> T | D:
        """The value for ``key``, or ``default`` (``None``, say)."""
        return cast("T | D", self._data.get(key, default))

    def setdefault(self, key: StashKey[T], default: T) -> T:
        """The value for ``key``, storing ``default`` first if absent."""
        return cast(T, self._data.setdefault(key, default))

    def __delitem__(self, key: StashKey[T]) -> None:
        """Remove the value stored under ``key``; raise :class:`KeyError` if there is none."""
        del self._data[key]

    def __contains__(self, key: object) -> bool:
        """Whether a value is stored under ``key``."""
        return key in self._data

    def __len__(self) -> int:
        """How many keys have a value."""
        return len(self._data)
