"""Plugins' own tables in a node's configuration file.

The configuration file (read by ``meshbus run``, an application above the library) has
the tables of the core (``[node]``, ``[[listeners]]``, ``[vpns.NAME]`` with profiles and
users) and any table a plugin declares through
:func:`~meshbus.hookspecs.meshbus_config_sections`: the ``guaranteed`` plugin's
``[vpns.NAME.queues.*]``, a bridge plugin's ``[[vpns.NAME.bridges]]``, a routing plugin's
``[dmr]``, a third party's own. A plugin reads its table with the :class:`ConfigReader`
it is given, which collects every problem (the file is refused with all of them listed,
before anything starts), and applies what it read to the node it is built for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

import attrs

from .errors import ConfigurationError

__all__ = ["ConfigContext", "ConfigReader", "ConfigSection", "ConfigSections"]

T = TypeVar("T")

SCOPES = ("node", "vpn")


class ConfigReader(Protocol):
    """What reads a configuration file, as a plugin's section reader sees it.

    Every method reports what is wrong (``report``) and goes on, so that one run of
    the file finds every problem; a method that could not read a value returns
    ``None``. ``path`` arguments name where a value is, as TOML writes it
    (``vpns.default.queues.orders.max_messages``), and appear in the problems.
    """

    base_dir: Path
    """What relative paths in the file are relative to (its folder)."""

    def report(self, path: str, why: str) -> None:
        """Record a problem at ``path``."""

    def join(self, path: str, key: str) -> str:
        """``path.key``, with ``key`` quoted when TOML would need it (``queues."a b"``)."""

    def suggest(self, word: str, choices: Collection[str]) -> str:
        """`` (did you mean 'x'?)`` when one of ``choices`` is close to ``word``, else ``""``."""

    def value(self, raw: object, hint: Any, path: str) -> Any:
        """``raw`` as the type ``hint`` names (``int``, ``str``, ``Path``, an enum,
        ``tuple[str, ...]``, ``X | None``), or ``None`` after reporting why not."""

    def table(self, raw: object, path: str) -> dict[str, Any] | None:
        """``raw`` if it is a table, or ``None`` after reporting that it is not."""

    def keys(self, table: Mapping[str, Any], path: str, allowed: Collection[str]) -> bool:
        """Report every key of ``table`` not in ``allowed``; whether there was none."""

    def named_tables(
        self, raw: object, path: str, build: Callable[[str, dict[str, Any], str], T | None]
    ) -> tuple[T, ...]:
        """``build(name, table, path)`` for each sub-table ``[path.NAME]`` of ``raw``,
        keeping what it returns (``None``: it reported a problem)."""

    def attrs_value(
        self,
        cls: Callable[..., T],
        table: Mapping[str, Any],
        path: str,
        *,
        name: str | None = None,
        exclude: Collection[str] = (),
        extra: Mapping[str, Any] | None = None,
        defaults: Mapping[str, Any] | None = None,
    ) -> T | None:
        """An ``attrs`` object from a table whose keys are its fields: each key converted
        to its field's type and checked by the class's own validators, problems reported
        at the key that has them. ``name`` is passed first (``cls(name, **table)``);
        ``exclude`` are fields the table may not set; ``extra`` holds fields the caller
        read itself (``None`` for one that failed); ``defaults`` replace the class's."""


@attrs.frozen
class ConfigContext:
    """Where a section sits, for checks that span tables."""

    parent: Mapping[str, Any]
    """The raw table that holds the section: the whole document for a node-wide
    section, the VPN's table for a VPN section."""
    vpn: str | None
    """The VPN's name, for a VPN section."""
    plugins: tuple[str, ...]
    """The plugins the node loads (names)."""


@attrs.frozen
class ConfigSection:
    """A table of the configuration file that a plugin reads and applies.

    ``read(reader, raw, path, context)`` checks the raw TOML value and returns what the
    plugin keeps of it (``None`` when it reported problems). Then, for a valid file,
    ``configure(target, value)`` runs when the node is built, before it starts, and
    ``provision(target, value)`` once it runs (what needs a running node, such as
    queues), and :attr:`reload` when the file is read again while it runs. ``target``
    is the node for a node-wide section and the VPN for a VPN section. Each may raise
    :class:`~meshbus.ConfigurationError` whose ``problems`` start with the key they are
    about, relative to the section (``"orders: why"``).
    """

    name: str
    """Its key: ``"dmr"`` is ``[dmr]`` (node scope); ``"bridges"`` is
    ``[vpns.NAME.bridges]`` (VPN scope)."""
    scope: str = attrs.field(validator=attrs.validators.in_(SCOPES))
    """``"node"`` for a top-level table, ``"vpn"`` for one inside each ``[vpns.NAME]``."""
    read: Callable[[ConfigReader, object, str, ConfigContext], Any]
    """Checks the table and returns what to apply."""
    configure: Callable[[Any, Any], None] | None = None
    """Applies it to the node (or VPN) being built, before the node starts."""
    provision: Callable[[Any, Any], Awaitable[None]] | None = None
    """Applies it to the running node (or one of its VPNs)."""
    reload: Callable[[Any, Any, Any], Callable[[], Awaitable[None]]] | None = None
    """Changes a running node from what the section held (``old``) to what a reloaded
    file holds (``new``; either is ``None`` when the table is absent):
    ``reload(target, old, new)`` checks, changing nothing, and returns what applies the
    change. It raises :class:`~meshbus.ConfigurationError` listing what it cannot change
    while the node runs, and the whole reload is refused. Without it, any change to the
    table takes a restart."""
    summary: str = ""
    """One line on what the table holds, for error messages and docs."""


class ConfigSections:
    """Collects the tables plugins declare during
    :func:`~meshbus.hookspecs.meshbus_config_sections`."""

    def __init__(self) -> None:
        self._sections: dict[tuple[str, str], ConfigSection] = {}
        self._owners: dict[tuple[str, str], str] = {}

    def add(self, section: ConfigSection, *, plugin: str = "") -> None:
        """Declare ``section``; its name must be free in its scope.

        :param plugin: who declares it, for error messages.
        """
        key = (section.scope, section.name)
        if key in self._sections:
            owner = self._owners[key] or "another plugin"
            raise ConfigurationError(
                f"configuration table {section.name!r} ({section.scope} scope) "
                f"is already declared by {owner}"
            )
        self._sections[key] = section
        self._owners[key] = plugin

    def get(self, scope: str, name: str) -> ConfigSection | None:
        """The section of that scope and name, or ``None``."""
        return self._sections.get((scope, name))

    def owner(self, scope: str, name: str) -> str:
        """Who declared a section (as given to :meth:`add`)."""
        return self._owners.get((scope, name), "")

    def names(self, scope: str) -> tuple[str, ...]:
        """The names declared in ``scope``, in declaration order."""
        return tuple(name for s, name in self._sections if s == scope)

    def __iter__(self) -> Iterator[ConfigSection]:
        return iter(tuple(self._sections.values()))

    def __len__(self) -> int:
        return len(self._sections)
