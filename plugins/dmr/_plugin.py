"""The hooks of plugin ``dmr``: local interest in, routing links accepted and staged."""

from __future__ import annotations

from typing import Any, NoReturn

from meshbus import (
    AccessDeniedError,
    ClientUsername,
    ConfigSections,
    Link,
    LinkPipeline,
    Session,
    Subscription,
    Vpn,
    hookimpl,
)
from meshbus.transports import WireLink

from ._config import SECTIONS
from ._dmr import NEIGHBOUR, ROUTING, on_advertise
from ._neighbour import parse_link_name
from ._routing import Routing

KINDS = frozenset({"internal", "external"})


@hookimpl
def meshbus_vpn_created(vpn: Vpn) -> None:
    vpn.stash[ROUTING] = Routing(vpn)


@hookimpl
def meshbus_subscription_added(session: Session, subscription: Subscription) -> None:
    if not subscription.no_export:
        routing = session.vpn.stash.get(ROUTING, None)
        if routing is not None:
            routing.local_changed("d", subscription.filter, 1)


@hookimpl
def meshbus_subscription_removed(session: Session, subscription: Subscription) -> None:
    if not subscription.no_export:
        routing = session.vpn.stash.get(ROUTING, None)
        if routing is not None:
            routing.local_changed("d", subscription.filter, -1)


@hookimpl
def meshbus_endpoint_interest(vpn: Vpn, endpoint: str, filters: tuple[str, ...]) -> None:
    routing = vpn.stash.get(ROUTING, None)
    if routing is not None:
        routing.endpoint_changed(endpoint, filters)


@hookimpl
def meshbus_accept_link(
    vpn: Vpn,
    user: ClientUsername,
    kind: str,
    peer_node: str,
    peer_cluster: str | None,
    name: str,
) -> None:
    if kind not in KINDS:
        return
    routing = vpn.stash.get(ROUTING, None)
    dmr = None if routing is None else routing.dmr
    if routing is None or dmr is None:
        _refuse(user, f"dynamic routing does not run in VPN {vpn.name!r} of this node")
    parsed = parse_link_name(name)
    if parsed is None:
        _refuse(user, f"{name!r} is not the name of a routing link")
    source, target = parsed
    if target != dmr.node_name:
        _refuse(user, f"the link is for node {target!r}; this is node {dmr.node_name!r}")
    neighbour = routing.neighbours.get(source)
    if neighbour is None:
        _refuse(user, f"unknown peer {source!r}: not among node {dmr.node_name!r}'s peers")
    if neighbour.refused:
        _refuse(user, neighbour.refused)
    if neighbour.kind != kind:
        _refuse(user, f"peer {source!r} is configured for an {neighbour.kind} link, not {kind}")
    expected = dmr.cluster if kind == "internal" else neighbour.peer.cluster
    if peer_cluster != expected:
        _refuse(
            user,
            f"cluster name mismatch: peer {source!r} says it is in cluster {peer_cluster!r}, "
            f"expected {expected!r}",
        )


def _refuse(user: ClientUsername, why: str) -> NoReturn:
    raise AccessDeniedError(user.name, "connect", why=why)


def _routing_link(link: Link) -> tuple[Routing, object] | None:
    """Find the routing and neighbour of a routing link (accepted ones by their name)."""
    found = link.stash.get(NEIGHBOUR, None)
    if found is not None or link.kind not in KINDS or not isinstance(link, WireLink):
        return found
    login = link.peer_login
    routing = link.vpn.stash.get(ROUTING, None)
    parsed = None if login is None else parse_link_name(login.name)
    if routing is None or parsed is None:
        return None
    neighbour = routing.neighbours.get(parsed[0])
    if neighbour is None:
        return None
    link.stash[NEIGHBOUR] = (routing, neighbour)
    return routing, neighbour


@hookimpl
def meshbus_link_pipeline(link: Link, pipeline: LinkPipeline) -> None:
    found = _routing_link(link)
    if found is not None:
        routing, neighbour = found
        routing.link_pipeline(neighbour, link, pipeline)  # type: ignore[arg-type]


@hookimpl
def meshbus_link_opened(link: Link) -> None:
    found = link.stash.get(NEIGHBOUR, None)
    if found is None or not isinstance(link, WireLink):
        return
    routing, neighbour = found
    if link is neighbour.out:
        routing.out_opened(neighbour)
        if routing.dmr is not None:
            routing.dmr.sync_changed()
        return
    old = neighbour.into
    if old is not None and old is not link:
        old.stop("replaced by a new connection from the same peer")
    link.on_advertise = on_advertise
    routing.into_opened(neighbour, link)


@hookimpl
def meshbus_link_closed(link: Link, reason: str) -> None:
    found = link.stash.get(NEIGHBOUR, None)
    if found is None or not isinstance(link, WireLink):
        return
    routing, neighbour = found
    if link is neighbour.out:
        neighbour.synced = False
        neighbour.receiving = None
        if routing.dmr is not None:
            routing.dmr.sync_changed()
    else:
        routing.into_closed(neighbour, link)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    for section in SECTIONS:
        sections.add(section, plugin="dmr")


@hookimpl
def meshbus_vpn_statistics(vpn: Vpn) -> dict[str, Any] | None:
    routing = vpn.stash.get(ROUTING, None)
    if routing is None or routing.dmr is None:
        return None
    dmr = routing.dmr
    figures = routing.statistics()
    figures.update(
        cluster=dmr.cluster, node=dmr.node_name, state=dmr.state, synced_after=dmr.synced_after
    )
    return {"dmr": figures}
