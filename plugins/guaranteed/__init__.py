"""Plugin ``guaranteed``: guaranteed messaging (SPEC section 4).

Queues per VPN hold published messages in a spool store until consumers
acknowledge them. The plugin's hooks live in :mod:`meshbus.plugins.guaranteed._plugin`
(the entry point); applications use it through :attr:`meshbus.Node.guaranteed`
(provisioning) and :meth:`meshbus.Session.send`, :meth:`~meshbus.Session.send_many`,
:meth:`~meshbus.Session.send_to_queue` and :meth:`~meshbus.Session.bind`.

Layers, bottom up:

* ``_store``: the :class:`SpoolStore` interface (one stored copy per message, one
  reference per endpoint, group commit), with :class:`SqliteStore` (durable, the
  default when the node has a ``data_dir``; how durable, :func:`set_spool_durability`
  or the ``[spool]`` table) and :class:`MemoryStore`;
* ``_settings``: :class:`QueueSettings`, validated at construction;
* ``_queue``: a :class:`Queue` at run time and its consumer :class:`QueueFlow`\\ s;
* ``_service``: :class:`GuaranteedService`, the node's provisioning, publish and
  bind entry points, and the router that spools matching direct messages.

Topic endpoints are queues whose one subscription the consumer names when it binds
(:meth:`GuaranteedService.create_topic_endpoint`, :meth:`meshbus.Session.bind_topic_endpoint`).
"""

from __future__ import annotations

from meshbus import QUEUE_TOPIC_PREFIX

from ._durability import Durability, set_spool_durability
from ._memory import MemoryStore
from ._queue import Queue, QueueFlow
from ._service import GuaranteedService
from ._settings import MAX_MESSAGE_SIZE, AccessType, QueueSettings
from ._sqlite import SqliteStore
from ._store import (
    EndpointStats,
    NewMessage,
    SpoolEntry,
    SpoolStatistics,
    SpoolStore,
    StoredMessage,
)

__all__ = [
    "MAX_MESSAGE_SIZE",
    "QUEUE_TOPIC_PREFIX",
    "AccessType",
    "Durability",
    "EndpointStats",
    "GuaranteedService",
    "MemoryStore",
    "NewMessage",
    "Queue",
    "QueueFlow",
    "QueueSettings",
    "SpoolEntry",
    "SpoolStatistics",
    "SpoolStore",
    "SqliteStore",
    "StoredMessage",
    "set_spool_durability",
]
