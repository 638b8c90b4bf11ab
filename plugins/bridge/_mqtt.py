"""Bridges whose remotes are external MQTT brokers (SPEC 7, 13): the link is the ``mqtt``
plugin's :class:`~meshbus.plugins.mqtt.MqttLink`; mapping, hop counting, counters,
backoff and failover are the bridge's as for any other remote."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from meshbus import ConfigurationError, Link, Vpn
from meshbus.plugins.mqtt import MqttBridgeOptions, MqttLink, MqttRemote

if TYPE_CHECKING:
    from ._bridge import Bridge

__all__ = ["bridge_queue", "open_mqtt_link"]


def bridge_queue(name: str) -> str:
    """The queue where guaranteed messages for the broker wait: ``bridge.<name>``."""
    return f"bridge.{name}"


def open_mqtt_link(vpn: Vpn, bridge: Bridge, name: str) -> Link:
    settings = bridge.settings
    options = settings.mqtt
    if options is None:
        options = MqttBridgeOptions()
    elif isinstance(options, Mapping):
        options = MqttBridgeOptions(**options)
    elif not isinstance(options, MqttBridgeOptions):
        raise ConfigurationError(f"bridge {settings.name!r}: mqtt must be MqttBridgeOptions")
    if settings.queues:
        raise ConfigurationError(
            f"bridge {settings.name!r}: an MQTT broker has no queues to bind (use subscriptions)"
        )
    remotes = [r if isinstance(r, MqttRemote) else MqttRemote(r) for r in settings.remotes]
    queue = None
    pub_filters = bridge.pub.filters
    if pub_filters and options.qos:
        queue = bridge_queue(settings.name)
        service: Any = vpn.node.guaranteed
        service.create_queue(
            queue, vpn=vpn.name, subscriptions=list(pub_filters), accept_direct=False
        )
    link = MqttLink(
        vpn,
        name,
        remotes,
        client_id=options.client_id or f"meshbus-{vpn.node.name}-{settings.name}",
        protocol=options.protocol,
        qos=options.qos,
        keepalive=options.keepalive,
        session_expiry=options.session_expiry,
        username=settings.username,
        password=settings.password,
        tls=settings.tls,
        backoff=settings.backoff,
        fail_back=settings.fail_back_interval if settings.fail_back else None,
        dedup=settings.dedup,
        queue=queue,
        window=settings.window,
        drain_timeout=settings.drain_timeout,
    )
    for topic_filter in bridge.wants:
        link.want(topic_filter)
    return link
