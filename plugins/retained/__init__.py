"""Plugin ``retained``: each topic's last value, for subscriptions made later (SPEC 12).

A message published with ``retain=True`` (:meth:`meshbus.Session.publish`,
:meth:`~meshbus.Session.send`, a remote session, ``meshbus pub --retain``, an MQTT
client) is kept as its topic's value in its VPN, replacing the one before; one with
an empty payload clears it. Each new subscription gets the values its filter matches
right after it takes effect, flagged :attr:`~meshbus.Message.retained`, before
anything published after it. Shared subscriptions get none (as in MQTT).

Each VPN keeps at most :class:`RetainedLimits` (topics and bytes); a retained
publish over them is refused whole with :class:`~meshbus.PublishRejectedError`
(``"retained-limit"``). With a data directory the values are written to
``retained.sqlite`` there and come back at start: a guaranteed retained publish is
acknowledged once its value is on disk, a direct one is written behind.

Over a bridge, a message's ``retain`` flag crosses as the mapping says
(``preserve_retained``) and the far VPN keeps it; dynamic routing carries the flag
but keeps the value only on the node where it was published.
"""

from ._plugin import OWN_RETAINED, RetainedService, configure_retained, service_of
from ._store import RetainedLimits, RetainedStatistics, RetainedStore

__all__ = [
    "OWN_RETAINED",
    "RetainedLimits",
    "RetainedService",
    "RetainedStatistics",
    "RetainedStore",
    "configure_retained",
    "retained_store",
]


def retained_store(vpn: object) -> RetainedStore:
    """The retained values of ``vpn`` (a :class:`meshbus.Vpn`)."""
    from meshbus import Vpn

    if not isinstance(vpn, Vpn):
        raise TypeError(f"expected a Vpn, got {vpn!r}")
    return service_of(vpn.node).store(vpn)
