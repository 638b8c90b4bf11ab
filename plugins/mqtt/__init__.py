"""Plugin ``mqtt``: MQTT 3.1.1 and 5 clients on a node's own listeners (SPEC 13).

An edge gateway's devices speak MQTT. :func:`start_mqtt_listener` (or
``[[mqtt.listeners]]`` in the configuration file) opens a TCP or TLS port (or a
WebSocket one, ``websocket = true``, for browsers and HTTP-only networks) whose
clients log in to one Message VPN with its own usernames, passwords, client
certificates and ACLs, and publish and subscribe beside native sessions:

* topics are shared with native sessions; MQTT filters translate as SPEC 1 says
  (``+`` is ``*``, ``a/#`` is ``a`` and ``a/>``, ``$share/g/f`` a shared subscription);
* QoS 0 is a direct message, QoS 1 and 2 a persistent guaranteed one, acknowledged
  once the node holds it (QoS 2 with its PUBREC/PUBREL/PUBCOMP exchange, whose ids
  are session state: a QoS 2 publish sent again on a later connection is taken once);
* a QoS 1 subscription is a subscription of the client's own queue
  (``mqtt/<client id>``), so a persistent session (clean session 0, or a session
  expiry interval) gets what was published while it was away, across a restart or
  crash of a node with a data directory too; QoS 2 is granted as 1. A message
  published at QoS 0 reaches it at QoS 0;
* a shared subscription (``$share/<name>/<filter>``) makes the session a member of
  a group that lives while one session, connected or not, is a member. The group's
  first member decides what it is: at QoS 1, a non-exclusive queue
  (``mqtt-share/<name>/<filter>``) that each connected member reads from, so each
  message reaches one member at least once, waits while none is connected, and goes
  to another member when the one it was sent to goes away without acknowledging
  it; at QoS 0, a meshbus shared subscription (each message to one member, at most
  once), which native sessions can join. A member is granted what its group
  delivers;
* retained messages (the ``retained`` plugin), will messages (with their delay; a
  will that waits is kept with its session, so it outlives a restart or crash too),
  keepalive, session takeover, session expiry;
* MQTT 5: user properties are headers, response topic and correlation data are
  reply-to and correlation id, message expiry is the TTL, topic aliases from the
  client, no-local, retain-as-published, retain handling, subscription identifiers,
  receive maximum both ways, maximum packet size both ways, reason codes.

A packet that breaks the protocol (malformed, truncated, over the packet size
limit, or anything before CONNECT) closes its connection only.

A bridge (``open_bridge`` or ``[[vpns.NAME.bridges]]``) whose remotes are
``mqtt://`` or ``mqtts://`` URLs connects to an external MQTT broker (mosquitto,
HiveMQ, ...) through an :class:`MqttLink`: the HiveMQ bridge's job, with the bridge's
topic mappings, hop counting (the ``hmq-bridge-hop-count`` user property on MQTT 5),
counters, backoff and failover.

Not done: enhanced authentication (AUTH), topic aliases from the node to the client,
QoS 2 to subscribers, the expiry interval of QoS 0
messages (a direct message has none), the payload format indicator, and user
properties kept as a list (they are headers: a key given twice keeps its last value,
and a user property named ``content-type`` is the content type).
"""

from ._bridge_link import (
    HOP_COUNT_PROPERTY,
    MqttBridgeOptions,
    MqttLink,
    MqttRemote,
    is_mqtt_url,
    parse_mqtt_url,
    to_mqtt_filter,
)
from ._codec import MQTT_5, MQTT_311, Codec, MalformedPacket, PacketReader, PacketTooLarge
from ._listener import MqttListener, MqttListenerStatistics, start_mqtt_listener
from ._plugin import listeners_of
from ._sessions import queue_name
from ._settings import (
    DEFAULT_MQTT_PORT,
    DEFAULT_MQTTS_PORT,
    DEFAULT_WS_PORT,
    DEFAULT_WSS_PORT,
    MqttListenerSettings,
)

__all__ = [
    "HOP_COUNT_PROPERTY",
    "MqttBridgeOptions",
    "MqttLink",
    "MqttRemote",
    "is_mqtt_url",
    "parse_mqtt_url",
    "to_mqtt_filter",
    "DEFAULT_MQTTS_PORT",
    "DEFAULT_MQTT_PORT",
    "DEFAULT_WSS_PORT",
    "DEFAULT_WS_PORT",
    "MQTT_311",
    "MQTT_5",
    "Codec",
    "MalformedPacket",
    "MqttListener",
    "MqttListenerSettings",
    "MqttListenerStatistics",
    "PacketReader",
    "PacketTooLarge",
    "listeners_of",
    "queue_name",
    "start_mqtt_listener",
]
