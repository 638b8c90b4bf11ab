"""The hooks of plugin ``bridge``: each bridge's link gets its mapping stages, and its
PUB interest back after a reconnect."""

from __future__ import annotations

from meshbus import ConfigSections, Link, LinkPipeline, hookimpl

from ._bridge import BRIDGE, _pub_interest
from ._config import SECTIONS


@hookimpl
def meshbus_link_pipeline(link: Link, pipeline: LinkPipeline) -> None:
    bridge = link.stash.get(BRIDGE, None)
    if bridge is not None:
        bridge.stages(pipeline)


@hookimpl
def meshbus_link_opened(link: Link) -> None:
    bridge = link.stash.get(BRIDGE, None)
    if bridge is not None:
        _pub_interest(bridge)


@hookimpl
def meshbus_config_sections(sections: ConfigSections) -> None:
    for section in SECTIONS:
        sections.add(section, plugin="bridge")
