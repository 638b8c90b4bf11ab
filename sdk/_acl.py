"""Per-session ACL decisions, compiled once at login and cached per topic."""

from __future__ import annotations

import re

from ._index import SubscriptionIndex
from ._profiles import AclAction, AclProfile
from ._topics import filter_covers, filters_overlap

__all__ = ["AclChecker"]


_VARIABLES = re.compile(r"\$client-(?:username|name)")


def _substitute(filter: str, username: str, client_name: str) -> str:
    # One pass, so a username containing "$client-name" is not substituted again.
    values = {"$client-username": username, "$client-name": client_name}
    return _VARIABLES.sub(lambda m: values[m.group()], filter)


class AclChecker:
    """Answers "may this session publish here / subscribe to that?" for one session."""

    __slots__ = ("_publish_allow", "_publish_exc", "_subscribe_allow", "_subscribe_exc")

    def __init__(self, profile: AclProfile, username: str, client_name: str) -> None:
        self._publish_allow = profile.publish_default is AclAction.ALLOW
        self._subscribe_allow = profile.subscribe_default is AclAction.ALLOW
        self._publish_exc: SubscriptionIndex[bool] = SubscriptionIndex(cache_size=1024)
        for f in profile.publish_exceptions:
            self._publish_exc.add(_substitute(f, username, client_name), True)
        self._subscribe_exc = tuple(
            _substitute(f, username, client_name) for f in profile.subscribe_exceptions
        )

    @property
    def allows_every_publish(self) -> bool:
        """True when no topic can be denied, so publish can skip the check."""
        return self._publish_allow and len(self._publish_exc) == 0

    def may_publish(self, topic: str) -> bool:
        """Whether the session may publish to ``topic``."""
        excepted = bool(self._publish_exc.match(topic))
        return self._publish_allow != excepted

    def may_subscribe(self, filter: str) -> bool:
        """Whether the session may subscribe to ``filter`` (see :class:`AclProfile`)."""
        if self._subscribe_allow:
            return not any(filters_overlap(exc, filter) for exc in self._subscribe_exc)
        return any(filter_covers(exc, filter) for exc in self._subscribe_exc)
