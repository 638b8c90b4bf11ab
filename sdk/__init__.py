"""meshbus: an embeddable, plugin-based message bus with event-broker semantics.

The public API is what ``__all__`` lists; modules starting with ``_`` are private.
"""

from __future__ import annotations

import logging

from ._clock import ManualClock, SystemClock
from ._egress import Egress
from ._files import write_json_atomically
from ._index import SubscriptionIndex
from ._links import (
    Link,
    LinkPipeline,
    LinkRouter,
    LinkState,
    LinkStatistics,
    OriginFilter,
    Stage,
)
from ._local_link import LocalLink
from ._logins import LoginGuard
from ._messages import (
    HEADER_LIMITS,
    DeliveryMode,
    Envelope,
    HeaderLimits,
    Message,
    MessageOptions,
    make_message,
)
from ._node import DEFAULT_PLUGINS, Node
from ._pipeline import Pipeline, Router
from ._plugins import ENTRY_POINT_GROUP, PluginManager, available_plugins
from ._profiles import (
    AclAction,
    AclProfile,
    ClientProfile,
    ClientUsername,
    check_identity,
    hash_password,
    verify_password,
)
from ._sections import ConfigContext, ConfigReader, ConfigSection, ConfigSections
from ._session import MessageHandler, Session
from ._stash import Stash, StashKey
from ._stats import (
    LatencyHistogram,
    NodeStatistics,
    QueueStatistics,
    SessionStatistics,
    VpnStatistics,
)
from ._topics import (
    QUEUE_TOPIC_PREFIX,
    Subscription,
    TopicLimits,
    filter_covers,
    filter_matches,
    filters_overlap,
    from_mqtt_filter,
    is_wildcard_filter,
    parse_endpoint_subscription,
    parse_subscription,
    validate_queue_topic,
    validate_topic,
    wildcard_levels,
)
from ._vpn import Vpn
from .errors import (
    AccessDeniedError,
    AuthenticationError,
    ConfigurationError,
    InvalidTopicError,
    LimitExceededError,
    MeshbusError,
    PluginError,
    ProtocolError,
    PublishRejectedError,
    SpoolError,
    StateError,
    TransportError,
)
from .hookspecs import hookimpl, hookspec

__version__ = "0.1.0.dev0"

# A library logs; the application decides where logs go (``meshbus run`` does).
logging.getLogger("meshbus").addHandler(logging.NullHandler())

__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "HEADER_LIMITS",
    "QUEUE_TOPIC_PREFIX",
    "AccessDeniedError",
    "AclAction",
    "AclProfile",
    "AuthenticationError",
    "ClientProfile",
    "ClientUsername",
    "ConfigContext",
    "ConfigReader",
    "ConfigSection",
    "ConfigSections",
    "ConfigurationError",
    "DeliveryMode",
    "Egress",
    "Envelope",
    "HeaderLimits",
    "InvalidTopicError",
    "LimitExceededError",
    "LatencyHistogram",
    "Link",
    "LinkPipeline",
    "LinkRouter",
    "LinkState",
    "LinkStatistics",
    "LocalLink",
    "LoginGuard",
    "ManualClock",
    "MeshbusError",
    "Message",
    "MessageHandler",
    "MessageOptions",
    "Node",
    "NodeStatistics",
    "QueueStatistics",
    "OriginFilter",
    "Pipeline",
    "PluginError",
    "PluginManager",
    "ProtocolError",
    "PublishRejectedError",
    "Router",
    "Session",
    "SessionStatistics",
    "SpoolError",
    "Stage",
    "Stash",
    "StashKey",
    "StateError",
    "Subscription",
    "SubscriptionIndex",
    "SystemClock",
    "TopicLimits",
    "TransportError",
    "Vpn",
    "VpnStatistics",
    "__version__",
    "available_plugins",
    "filter_covers",
    "filter_matches",
    "filters_overlap",
    "from_mqtt_filter",
    "is_wildcard_filter",
    "wildcard_levels",
    "check_identity",
    "hash_password",
    "hookimpl",
    "hookspec",
    "make_message",
    "parse_endpoint_subscription",
    "parse_subscription",
    "validate_queue_topic",
    "validate_topic",
    "verify_password",
    "write_json_atomically",
]
