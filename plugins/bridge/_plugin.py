"""The hooks of plugin ``bridge``: each bridge's link gets its mapping stages, and its
PUB interest back after a reconnect; the connection the other bridge of a pair opened
gets them too, and carries both bridges (SPEC 7: one connection for a two-way pair).

Which of the two connections of a pair stays: the one the node with the smaller node
id opened. The node with the larger id rides the connection its peer opened and closes
its own (state ``reusing``) until that one goes; the node with the smaller id does the
same only while its own connection cannot be made (its bridge in ``backoff``: say the
peer cannot be reached from here, but reaches this node).
"""

from __future__ import annotations

from meshbus import ConfigSections, Link, LinkPipeline, LinkState, hookimpl
from meshbus.plugins.hopcount import SETTINGS as HOP_SETTINGS
from meshbus.transports import WireLink

from ._bridge import BRIDGE, CARRIES, Bridge, _pub_interest, partner_of
from ._config import SECTIONS


@hookimpl(tryfirst=True)  # before hopcount's, which reads the hop settings it puts there
def meshbus_link_pipeline(link: Link, pipeline: LinkPipeline) -> None:
    bridge = link.stash.get(BRIDGE, None)
    if bridge is None:
        bridge = partner_of(link)
        if bridge is None:
            return
        link.stash[CARRIES] = bridge
        link.stash[HOP_SETTINGS] = bridge.hops
        link.dedup = bridge.settings.dedup
    bridge.stages(pipeline, link)


@hookimpl
def meshbus_link_opened(link: Link) -> None:
    bridge = link.stash.get(BRIDGE, None)
    if bridge is not None:
        _pub_interest(bridge)
        return
    bridge = link.stash.get(CARRIES, None)
    if bridge is None or not isinstance(link, WireLink):
        return
    own = bridge.link
    if own.vpn.node.node_id > (link.peer_node or "") or own.state is LinkState.BACKOFF:
        bridge.ride(link)
    else:  # the peer rides this node's connection; unless that one cannot be made
        own.vpn.node.task_group.start_soon(_ride_if_cut_off, bridge, link)


async def _ride_if_cut_off(bridge: Bridge, carrier: WireLink) -> None:
    """Ride ``carrier`` once the bridge's own connection fails (a node that cannot
    reach its peer uses the connection the peer opened), while ``carrier`` lasts."""
    own = bridge.link
    while carrier.attached and carrier.state is not LinkState.DISABLED:
        if bridge.carrier is not None:
            return
        if own.state is LinkState.BACKOFF:
            bridge.ride(carrier)
            return
        await own.wait_for(LinkState.BACKOFF, LinkState.DISABLED)
        if own.state is LinkState.DISABLED:
            return


@hookimpl
def meshbus_link_closed(link: Link, reason: str) -> None:
    bridge = link.stash.get(CARRIES, None)
    if bridge is not None and isinstance(link, WireLink):
        bridge.dismount(link)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    for section in SECTIONS:
        sections.add(section, plugin="bridge")
