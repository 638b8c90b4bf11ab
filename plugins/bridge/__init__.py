"""Plugin ``bridge``: Message VPN bridges (SPEC 7). Under construction: so far, topic
mapping (:class:`TopicMapper`), which the bridge's links apply in each direction."""

from ._mapping import EXCLUDED, NO_MATCH, TOO_SHORT, Mapped, TopicMapper, TopicMapping

__all__ = ["EXCLUDED", "NO_MATCH", "TOO_SHORT", "Mapped", "TopicMapper", "TopicMapping"]
