"""The plugin manager facade: the only module that calls ``pm.hook.*``.

Plugins are composed explicitly: ``Node(plugins=[...])`` takes plugin objects
(modules, classes' instances) and entry-point names from the ``meshbus``
group. The built-in plugins are found through that same group, so they use no
API a third-party plugin could not. ``autoload=True`` additionally loads every
installed plugin of the group.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from . import hookspecs
from ._sections import ConfigSections
from .errors import ConfigurationError, PluginError

if TYPE_CHECKING:
    from ._links import Link, LinkPipeline
    from ._node import Node
    from ._pipeline import Pipeline
    from ._profiles import ClientUsername
    from ._session import Session
    from ._topics import Subscription
    from ._vpn import Vpn

__all__ = ["ENTRY_POINT_GROUP", "PluginManager", "available_plugins"]

ENTRY_POINT_GROUP = "meshbus"


def available_plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """Installed plugins by entry-point name (nothing is imported)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


class PluginManager:
    """Typed facade over ``pluggy.PluginManager`` for the ``meshbus`` hooks."""

    def __init__(self) -> None:
        self._pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self._pm.add_hookspecs(hookspecs)
        # Historic: every plugin registered from now on is asked for its own hookspecs.
        self._pm.hook.meshbus_add_hookspecs.call_historic(kwargs={"plugins": self})

    def add_hookspecs(self, module_or_class: ModuleType | type) -> None:
        """Add the hook specifications a plugin offers to others (see
        :func:`~meshbus.hookspecs.meshbus_add_hookspecs`); hooks already implemented by
        registered plugins are checked against them now."""
        try:
            self._pm.add_hookspecs(module_or_class)
        except pluggy.PluginValidationError as exc:
            raise PluginError(str(exc), getattr(exc, "plugin", None)) from None

    @property
    def hook(self) -> pluggy.HookRelay:
        """Callers of every hook, for a plugin calling the hooks it specified itself
        (``plugins.hook.meshbus_spool_store(node=node)``). The core's own hooks are
        called only through the typed methods of this class."""
        return self._pm.hook

    # --- composition -------------------------------------------------------------

    def register(self, plugin: object, name: str | None = None, *, check: bool = True) -> str:
        """Register a plugin object (a module or an instance with ``meshbus_*`` hooks).

        :param check: refuse a plugin that implements a hook nobody specified at once;
            :func:`compose` registers a node's plugins unchecked, then checks them all,
            so a plugin may implement another plugin's hooks whatever their order.
        """
        if isinstance(plugin, str):
            return self.load(plugin)
        if self._pm.is_registered(plugin):
            raise PluginError(f"plugin {self._describe(plugin)} is registered twice", plugin)
        if name is not None and self._pm.has_plugin(name):
            raise PluginError(f"a plugin named {name!r} is already registered", plugin)
        try:
            registered = self._pm.register(plugin, name)
        except pluggy.PluginValidationError as exc:
            self._discard(plugin)
            raise PluginError(
                f"plugin {self._describe(plugin)} is invalid: {exc}", plugin
            ) from None
        except ValueError as exc:
            raise PluginError(f"plugin {self._describe(plugin)} rejected: {exc}", plugin) from None
        except PluginError:  # its meshbus_add_hookspecs added specs others break
            self._discard(plugin)
            raise
        if registered is None:  # blocked
            raise PluginError(f"plugin {name or self._describe(plugin)!r} is blocked", plugin)
        if check:
            try:
                self.check_hooks(plugin)
            except PluginError:
                self._discard(plugin)
                raise
        return registered

    def check_hooks(self, plugin: object) -> None:
        """Refuse ``plugin`` if it implements a hook no registered plugin specified (a typo,
        or a hook of another version, or of a plugin that is not loaded)."""
        unknown = self._unknown_hooks(plugin)
        if unknown:
            raise PluginError(
                f"plugin {self._describe(plugin)} implements unknown hooks: {', '.join(unknown)}",
                plugin,
            )

    def load(self, name: str, *, check: bool = True) -> str:
        """Register the installed plugin with entry-point name ``name``."""
        if self._pm.has_plugin(name):
            raise PluginError(f"plugin {name!r} is registered twice", name)
        if self._pm.is_blocked(name):
            raise PluginError(f"plugin {name!r} is blocked", name)
        ep = available_plugins().get(name)
        if ep is None:
            known = ", ".join(sorted(available_plugins())) or "none"
            raise PluginError(
                f"no installed meshbus plugin named {name!r} (installed: {known})", name
            )
        try:
            plugin = ep.load()
        except Exception as exc:
            raise PluginError(f"plugin {name!r} failed to import: {exc!r}", name) from exc
        return self.register(plugin, name, check=check)

    def autoload(self, *, check: bool = True) -> None:
        """Register every installed plugin that is not registered or blocked yet."""
        for name in available_plugins():
            if not self._pm.has_plugin(name) and not self._pm.is_blocked(name):
                self.load(name, check=check)

    def block(self, name: str) -> None:
        """Refuse to register the plugin called ``name`` (unregistering it if present)."""
        self._pm.set_blocked(name)

    def unregister(self, plugin: object) -> None:
        """Remove a registered plugin object."""
        self._pm.unregister(plugin)

    def names(self) -> list[str]:
        """Names of the registered plugins, in registration order."""
        # pluggy records a blocked name as ``name -> None``: it was not registered.
        return [name for name, plugin in self._pm.list_name_plugin() if plugin is not None]

    def get(self, name: str) -> object | None:
        """The plugin object registered as ``name``."""
        return self._pm.get_plugin(name)

    def check_pending(self) -> None:
        """Raise :class:`~meshbus.errors.PluginError` if a hook nobody specified is implemented."""
        try:
            self._pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(str(exc), getattr(exc, "plugin", None)) from None

    def plugins(self) -> list[object]:
        """The registered plugin objects, in registration order."""
        return [plugin for _, plugin in self._pm.list_name_plugin() if plugin is not None]

    def _unknown_hooks(self, plugin: object) -> list[str]:
        """Attributes named like a hook that match no hookspec (``optionalhook`` impls aside)."""
        unknown = []
        for attr in dir(plugin):
            if not attr.startswith("meshbus_"):
                continue
            opts = self._pm.parse_hookimpl_opts(plugin, attr)
            if opts is not None and opts.get("optionalhook"):
                continue
            hook_name = (opts.get("specname") if opts is not None else None) or attr
            caller: pluggy.HookCaller | None = getattr(self._pm.hook, hook_name, None)
            if caller is None or not caller.has_spec():
                unknown.append(attr)
        return unknown

    def _discard(self, plugin: object) -> None:
        # pluggy < 1.7 registers hookimpls one by one and leaves a plugin half registered
        # when a later one fails validation; a refused plugin must change nothing.
        if self._pm.is_registered(plugin):
            self._pm.unregister(plugin)

    @staticmethod
    def _describe(plugin: object) -> str:
        if isinstance(plugin, ModuleType):
            return plugin.__name__
        return repr(plugin)

    # --- hook calls: one typed method per hookspec ---------------------------------

    def config_sections(self) -> ConfigSections:
        sections = ConfigSections()
        self._pm.hook.meshbus_config_sections(sections=sections)
        return sections

    def configure(self, node: Node) -> None:
        self._pm.hook.meshbus_configure(node=node)

    def lifespans(self, node: Node) -> list[AbstractAsyncContextManager[None]]:
        # pluggy returns results in LIFO registration order; enter them first-registered first.
        results = self._pm.hook.meshbus_lifespan(node=node)
        return [cm for cm in reversed(results) if cm is not None]

    def unconfigure(self, node: Node) -> None:
        self._pm.hook.meshbus_unconfigure(node=node)

    def vpn_created(self, vpn: Vpn, pipeline: Pipeline) -> None:
        self._pm.hook.meshbus_vpn_created(vpn=vpn)
        self._pm.hook.meshbus_vpn_pipeline(vpn=vpn, pipeline=pipeline)

    def vpn_removed(self, vpn: Vpn) -> None:
        self._pm.hook.meshbus_vpn_removed(vpn=vpn)

    def authenticate(self, vpn: Vpn, username: str, password: str | None) -> ClientUsername | None:
        result: ClientUsername | None = self._pm.hook.meshbus_authenticate(
            vpn=vpn, username=username, password=password
        )
        return result

    def session_opened(self, session: Session) -> None:
        self._pm.hook.meshbus_session_opened(session=session)

    def session_closed(self, session: Session) -> None:
        self._pm.hook.meshbus_session_closed(session=session)

    def subscribe(self, session: Session, subscription: Subscription) -> None:
        handled = self._pm.hook.meshbus_subscribe(session=session, subscription=subscription)
        if not handled:
            kind = "shared" if subscription.is_shared else "direct"
            plugin = "shared" if subscription.is_shared else "direct"
            raise ConfigurationError(
                f"no plugin handles {kind} subscriptions such as {subscription.text!r}; "
                f"add the {plugin!r} plugin to the node"
            )
        self._pm.hook.meshbus_subscription_added(session=session, subscription=subscription)

    def unsubscribe(self, session: Session, subscription: Subscription) -> bool:
        handled = bool(
            self._pm.hook.meshbus_unsubscribe(session=session, subscription=subscription)
        )
        if handled:
            self._pm.hook.meshbus_subscription_removed(session=session, subscription=subscription)
        return handled

    def endpoint_interest(self, vpn: Vpn, endpoint: str, filters: tuple[str, ...]) -> None:
        self._pm.hook.meshbus_endpoint_interest(vpn=vpn, endpoint=endpoint, filters=filters)

    def accept_link(
        self,
        vpn: Vpn,
        user: ClientUsername,
        kind: str,
        peer_node: str,
        peer_cluster: str | None = None,
        name: str = "",
    ) -> None:
        self._pm.hook.meshbus_accept_link(
            vpn=vpn,
            user=user,
            kind=kind,
            peer_node=peer_node,
            peer_cluster=peer_cluster,
            name=name,
        )

    def link_pipeline(self, link: Link, pipeline: LinkPipeline) -> None:
        self._pm.hook.meshbus_link_pipeline(link=link, pipeline=pipeline)

    def link_opened(self, link: Link) -> None:
        self._pm.hook.meshbus_link_opened(link=link)

    def link_closed(self, link: Link, reason: str) -> None:
        self._pm.hook.meshbus_link_closed(link=link, reason=reason)

    def listening(self, node: Node) -> list[str]:
        """The addresses of the listeners the plugins serve ``node`` on (see the hookspec),
        in plugin registration order."""
        results = self._pm.hook.meshbus_listening(node=node)
        return [url for urls in reversed(results) if urls for url in urls]

    def vpn_statistics(self, vpn: Vpn) -> dict[str, Any]:
        """Every plugin's own figures for ``vpn``, merged (see the hookspec)."""
        merged: dict[str, Any] = {}
        for figures in self._pm.hook.meshbus_vpn_statistics(vpn=vpn):
            if figures:
                merged.update(figures)
        return merged


def compose(
    pm: PluginManager, plugins: Iterable[object], autoload: bool, blocked: Iterable[str]
) -> None:
    """Register ``plugins`` (objects or entry-point names) into ``pm``, then validate."""
    for name in blocked:
        pm.block(name)
    for plugin in plugins:
        if isinstance(plugin, str):
            pm.load(plugin, check=False)
        else:
            pm.register(plugin, check=False)
    if autoload:
        pm.autoload(check=False)
    # Every plugin has added its hookspecs by now: implementations of hooks nobody
    # specified are typos (or hooks of a plugin that is not loaded).
    for plugin in pm.plugins():
        pm.check_hooks(plugin)
    pm.check_pending()
