"""The hooks the ``guaranteed`` plugin offers to other plugins.

Added to a node's plugin manager through :func:`~meshbus.hookspecs.meshbus_add_hookspecs`
when the plugin is registered; implement them with :data:`meshbus.hookimpl` as any hook.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshbus import hookspec

if TYPE_CHECKING:
    from meshbus import Node

__all__ = ["meshbus_spool_store"]


@hookspec(firstresult=True)
def meshbus_spool_store(node: Node) -> object | None:
    """Provide the store that spools guaranteed messages; the first non-``None`` wins.

    Return a ``SpoolStore`` (see :mod:`meshbus.plugins.guaranteed`), not yet
    opened: the guaranteed plugin opens it when the node starts and closes it when
    the node stops. Without an answer the plugin uses its embedded default: SQLite
    in ``node.data_dir``, or memory when the node has no data directory.

    :param node: the node being started.
    """
