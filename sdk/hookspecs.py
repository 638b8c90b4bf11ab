"""Hook specifications: the control-plane contract between the core and plugins.

Hooks fire on rare events only (node start and stop, VPN creation, sessions,
subscriptions, endpoints, links). Nothing here runs per message: a plugin that takes part in
message delivery contributes plain callables through :func:`meshbus_vpn_pipeline`
and the core calls those directly.

Implement a hook with :data:`~meshbus.hookspecs.hookimpl`::

    from meshbus import hookimpl

    @hookimpl
    def meshbus_session_opened(session):
        print("hello", session.client_name)

Only the plugin manager (``meshbus._plugins``) calls these hooks, through one typed method each.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ._links import Link, LinkPipeline
    from ._node import Node
    from ._pipeline import Pipeline
    from ._plugins import PluginManager
    from ._profiles import ClientUsername
    from ._sections import ConfigSections
    from ._session import Session
    from ._topics import Subscription
    from ._vpn import Vpn

__all__ = ["hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("meshbus")
"""Marks the hook specifications below; plugins never need it."""

hookimpl = pluggy.HookimplMarker("meshbus")
"""Marks a plugin function or method as the implementation of the hook it is named after.

Takes pluggy's options, e.g. ``@hookimpl(tryfirst=True)``.
"""


# -------------------------------------------------------------------------------------
# Plugin registration
# -------------------------------------------------------------------------------------


@hookspec(historic=True)
def meshbus_add_hookspecs(plugins: PluginManager) -> None:
    """Add hook specifications of the plugin's own, for other plugins to implement.

    Called once for each plugin as it is registered (and for plugins registered
    later, too). A plugin that offers hooks calls
    ``plugins.add_hookspecs(module_or_class)`` here, and calls them with
    ``plugins.hook.<name>(...)``; the ``guaranteed`` plugin's spool-store hook is
    one. Implementations of such hooks are checked once every plugin of the node
    is registered, so their order does not matter.

    :param plugins: the node's plugin manager.
    """


@hookspec
def meshbus_config_sections(sections: ConfigSections) -> None:
    """Declare the plugin's tables of the node configuration file.

    Called when a configuration file is read (``meshbus run``), with only the plugins
    the file names registered, before any node exists. Add one
    :class:`~meshbus.ConfigSection` per table with ``sections.add(...)``: how to read
    it, and how to apply it to the node being built or running. The file is refused
    with every problem listed if any section reports one.

    :param sections: the collector.
    """


# -------------------------------------------------------------------------------------
# Node lifecycle
# -------------------------------------------------------------------------------------


@hookspec
def meshbus_configure(node: Node) -> None:
    """Called once when the node is created, after every plugin is registered.

    This runs in the :class:`meshbus.Node` constructor, before the ``default``
    VPN is created and before the node starts. Validate settings here and raise
    :class:`~meshbus.errors.ConfigurationError` to refuse to create the node.

    Like every hook, implementations run in pluggy's order: the plugin
    registered last is called first, unless ``tryfirst``/``trylast`` say
    otherwise. Do not rely on another plugin being configured already; work
    that depends on other plugins belongs in :func:`meshbus_lifespan`, which
    is entered in registration order.

    :param node: the node being created.
    """


@hookspec
def meshbus_lifespan(node: Node) -> AbstractAsyncContextManager[None] | None:
    """Return an async context manager that lives as long as the running node.

    Entered in registration order when the node starts and exited in reverse
    order when it stops. Start background tasks inside it with
    ``await node.task_group.start(...)`` so that the node is only ready when
    they are. Return ``None`` when the plugin needs nothing running.

    :param node: the node being started.
    """


@hookspec
def meshbus_unconfigure(node: Node) -> None:
    """Called once after the node stopped and every lifespan has exited.

    A node that was created but never started is not unconfigured. As for
    :func:`meshbus_configure`, the plugin registered last is called first.

    :param node: the node that stopped.
    """


# -------------------------------------------------------------------------------------
# Message VPNs
# -------------------------------------------------------------------------------------


@hookspec
def meshbus_vpn_created(vpn: Vpn) -> None:
    """Called when a Message VPN is created, before any session can open in it.

    Attach per-VPN plugin state to ``vpn.stash`` here.

    :param vpn: the new VPN.
    """


@hookspec
def meshbus_vpn_pipeline(vpn: Vpn, pipeline: Pipeline) -> None:
    """Contribute per-message callables for ``vpn`` (routers).

    Called once per VPN right after :func:`meshbus_vpn_created`. The core
    compiles what is added into a tuple of plain callables and calls them for
    every published message; no hook runs per message.

    Routers run in the order they were added, and pluggy calls the plugin
    registered last first, so its routers run first; use
    ``@hookimpl(tryfirst=True)`` or ``trylast=True`` when the position matters.
    ``vpn.routers`` lists the result.

    :param vpn: the VPN being wired.
    :param pipeline: the collector; call ``pipeline.add_router(name, fn)``.
    """


@hookspec
def meshbus_vpn_removed(vpn: Vpn) -> None:
    """Called when a VPN is removed (or its node stops), after its sessions closed.

    :param vpn: the VPN going away.
    """


# -------------------------------------------------------------------------------------
# Sessions
# -------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def meshbus_authenticate(vpn: Vpn, username: str, password: str | None) -> ClientUsername | None:
    """Authenticate a client logging in to ``vpn``; the first non-``None`` result wins.

    Return the :class:`meshbus.ClientUsername` to log in as, or raise
    :class:`~meshbus.errors.AuthenticationError` to refuse. Return ``None`` to leave the
    decision to later plugins and finally to the VPN's own authentication
    (``none`` or ``basic`` against its configured users).

    It is called on the event loop, so it must not block (SPEC 6: no password
    hashing there). The error's ``why`` reaches the client: to give nothing
    away, refuse as the VPN does, with
    ``AuthenticationError(username, "login refused", reason="...")``, whose
    ``reason`` goes to the node's log only.

    :param vpn: the VPN the client logs in to.
    :param username: the client username given.
    :param password: the password given, or ``None``.
    """


@hookspec
def meshbus_session_opened(session: Session) -> None:
    """Called when a session has logged in and can publish and subscribe.

    :param session: the new session.
    """


@hookspec
def meshbus_session_closed(session: Session) -> None:
    """Called when a session closed, after each of its subscriptions was removed.

    :param session: the closed session.
    """


# -------------------------------------------------------------------------------------
# Subscriptions
# -------------------------------------------------------------------------------------


@hookspec(firstresult=True)
def meshbus_subscribe(session: Session, subscription: Subscription) -> bool | None:
    """Apply a subscription for ``session``; the first plugin to return ``True`` owns it.

    The core has already validated the syntax and checked the ACL. A plugin
    that handles this kind of subscription (plain, shared, ...) adds it to its
    own index and returns ``True``; others return ``None``. When no plugin
    claims it the core raises :class:`~meshbus.errors.ConfigurationError` naming the
    missing plugin.

    :param session: the session that will receive matching messages.
    :param subscription: the parsed subscription.
    """


@hookspec(firstresult=True)
def meshbus_unsubscribe(session: Session, subscription: Subscription) -> bool | None:
    """Remove a subscription applied through :func:`meshbus_subscribe`.

    The plugin that owns this kind of subscription removes it and returns ``True``.

    :param session: the session it belonged to.
    :param subscription: the parsed subscription.
    """


@hookspec
def meshbus_subscription_added(session: Session, subscription: Subscription) -> None:
    """Called after a subscription took effect (routing plugins advertise from here).

    :param session: the subscribing session.
    :param subscription: the parsed subscription.
    """


@hookspec
def meshbus_subscription_removed(session: Session, subscription: Subscription) -> None:
    """Called after a subscription was removed, including when its session closed.

    :param session: the session it belonged to.
    :param subscription: the parsed subscription.
    """


# -------------------------------------------------------------------------------------
# Endpoints
# -------------------------------------------------------------------------------------


@hookspec
def meshbus_endpoint_interest(vpn: Vpn, endpoint: str, filters: tuple[str, ...]) -> None:
    """Called when what an endpoint (queue, topic endpoint) attracts changes.

    The plugin that provides guaranteed messaging calls it when an endpoint is created
    (with its subscriptions), when its subscriptions change, and when it is deleted
    (with no filters), so routing plugins can advertise guaranteed interest and others
    can wait for an endpoint instead of polling for it.

    :param vpn: the endpoint's VPN.
    :param endpoint: the endpoint's name in the spool (``"<vpn>/<queue>"``, or
        ``"<vpn>/#te/<name>"`` for a topic endpoint).
    :param filters: every topic filter it attracts now; empty once it is deleted.
    """


# -------------------------------------------------------------------------------------
# Links between VPNs and nodes
# -------------------------------------------------------------------------------------


@hookspec
def meshbus_accept_link(
    vpn: Vpn,
    user: ClientUsername,
    kind: str,
    peer_node: str,
    peer_cluster: str | None,
    name: str,
) -> None:
    """Called when a peer asks to open a link into ``vpn``; raise to refuse it.

    The core has already authenticated the peer as ``user`` and checked that its
    client profile allows bridge connections (``allow_bridge_connections``, SPEC 7).
    Raise :class:`~meshbus.errors.AccessDeniedError` to refuse the link (a routing
    plugin refusing a peer from another cluster, say); the peer is told why.

    :param vpn: the VPN the link would join.
    :param user: the client username the peer logged in as.
    :param kind: the kind of link the peer asks for (``"bridge"``, ...).
    :param peer_node: the node id the peer gave.
    :param peer_cluster: the cluster the peer says it is in (``None``: none).
    :param name: the peer's name for the link.
    """


@hookspec
def meshbus_listening(node: Node) -> list[str] | None:
    """Return the URLs of the plugin's listeners for ``node`` (``None``: it runs none).

    ``meshbus run`` prints a ``listening on`` line for each (an MQTT listener's
    ``mqtt://HOST:PORT``, say) after the node's own listeners, so whoever waits for
    those lines knows when every listener is up. Called once the node runs and its
    configuration is provisioned.

    :param node: the running node.
    """


@hookspec
def meshbus_vpn_statistics(vpn: Vpn) -> dict[str, Any] | None:
    """Return the plugin's own figures for ``vpn``, or ``None`` when it has none there.

    The figures are ``{plugin name: figures}`` of plain (JSON-able) values;
    ``meshbus stats`` shows them under ``plugins`` (dynamic routing shows its
    neighbours, their links and interest tables this way). Called only when
    statistics are asked for, never per message.

    :param vpn: the VPN asked about.
    """


@hookspec
def meshbus_link_pipeline(link: Link, pipeline: LinkPipeline) -> None:
    """Contribute the stages of a link, once, when it joins its VPN.

    Stages are plain functions the core calls for each message going out over the
    link (``pipeline.add_egress``) or coming in (``pipeline.add_ingress``); a stage
    returning ``False`` drops the message, counted under the stage's reason. Topic
    mapping and hop counting are stages. Look at ``link.kind`` to decide whether a
    link is yours to serve.

    :param link: the link joining its VPN.
    :param pipeline: the collector of its stages.
    """


@hookspec
def meshbus_link_opened(link: Link) -> None:
    """Called when a link's connection is up and its peer is known (each reconnect too).

    The link is ``syncing``: this is where a plugin tells the peer what this side
    wants (subscriptions, interest), then sets the link ``in-sync``.

    :param link: the link; ``link.peer_node`` names the peer.
    """


@hookspec
def meshbus_link_closed(link: Link, reason: str) -> None:
    """Called when a link's connection went down (it may come back later).

    The interest its peer had was forgotten just before.

    :param link: the link.
    :param reason: why, for people.
    """
