"""MQTT sessions kept on disk, so that a node that restarts on its data directory still
has them: one small JSON file per persistent session, under ``mqtt-sessions/``.

A file holds what the session is (its VPN, client id, expiry interval, subscriptions,
queue, the will of its last connection while that waits: :mod:`._wills`, and the
QoS 2 publishes it took and has not seen released) and when its client went away; it
is written before the CONNACK, SUBACK, UNSUBACK, PUBREC or PUBCOMP that depends on it
goes out, when the connection ends, and when its will is published.
Its queue's messages live in the spool as they always did: the file only says whose
they are. What a client was sent and has not acknowledged is sent again: after a
crash it is sent again, flagged DUP, under a new packet id; the packet ids are kept
when the connection ends (a node that stops ends it first), so after a clean restart
it keeps its packet id as MQTT asks.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
from pathlib import Path
from typing import Any

import orjson

from meshbus import write_json_atomically

from ._wills import PendingWill

__all__ = ["SavedSession", "SavedSubscription", "SessionFiles"]

log = logging.getLogger("meshbus.mqtt")

VERSION = 1

#: A subscription as its file keeps it: (MQTT filter, QoS, meshbus filters, no-local,
#: retain-as-published, subscription identifier, the queue of its share group and
#: that queue's max_messages); the fields of :class:`~._sessions.Subscribed`.
SavedSubscription = tuple[str, int, tuple[str, ...], bool, bool, int | None, str | None, int | None]


class SavedSession:
    """What a session file holds, checked as it is read."""

    __slots__ = (
        "client_id",
        "expiry",
        "offline_since",
        "packet_ids",
        "queue",
        "queue_limit",
        "received",
        "subscriptions",
        "vpn",
        "will",
    )

    def __init__(
        self,
        vpn: str,
        client_id: str,
        expiry: int,
        queue: str | None,
        queue_limit: int | None,
        offline_since: float | None,
        subscriptions: list[SavedSubscription],
        packet_ids: dict[int, int] | None = None,
        will: PendingWill | None = None,
        received: list[int] | None = None,
    ) -> None:
        self.vpn = vpn
        self.client_id = client_id
        self.expiry = expiry
        self.queue = queue
        self.queue_limit = queue_limit
        self.offline_since = offline_since
        #: See :data:`SavedSubscription`.
        self.subscriptions = subscriptions
        #: The packet id each queued message was last sent with (by spool id).
        self.packet_ids = packet_ids or {}
        #: The will of its last connection, while it waits to be published.
        self.will = will
        #: The packet ids of QoS 2 publishes taken and not released yet.
        self.received = received or []

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION,
            "vpn": self.vpn,
            "client_id": self.client_id,
            "expiry": self.expiry,
            "queue": self.queue,
            "queue_limit": self.queue_limit,
            "offline_since": self.offline_since,
            "subscriptions": [
                {
                    "filter": mqtt_filter,
                    "qos": qos,
                    "filters": list(filters),
                    "no_local": no_local,
                    "retain_as_published": rap,
                    "identifier": identifier,
                    "share_queue": share,
                    "share_limit": share_limit,
                }
                for mqtt_filter, qos, filters, no_local, rap, identifier, share, share_limit in (
                    self.subscriptions
                )
            ],
            "packet_ids": [[spool_id, pid] for spool_id, pid in self.packet_ids.items()],
            "will": None if self.will is None else self.will.to_json(),
            "received": self.received,
        }

    @classmethod
    def from_json(cls, data: bytes) -> SavedSession:
        """Read a file's bytes; :class:`ValueError` saying what is wrong with them."""
        raw = orjson.loads(data)  # orjson.JSONDecodeError is a ValueError
        if not isinstance(raw, dict) or raw.get("version") != VERSION:
            raise ValueError(f"not a version {VERSION} MQTT session")
        vpn, client_id = _text(raw, "vpn"), _text(raw, "client_id")
        expiry = raw.get("expiry")
        if not isinstance(expiry, int) or not _count(expiry) or expiry == 0:
            raise ValueError(f"bad expiry {expiry!r}")
        queue = raw.get("queue")
        if queue is not None and not (isinstance(queue, str) and queue):
            raise ValueError(f"bad queue {queue!r}")
        limit = raw.get("queue_limit")
        if limit is not None and not _count(limit):
            raise ValueError(f"bad queue_limit {limit!r}")
        since = raw.get("offline_since")
        if since is not None and not (
            isinstance(since, (int, float)) and not isinstance(since, bool) and math.isfinite(since)
        ):
            raise ValueError(f"bad offline_since {since!r}")
        subs = raw.get("subscriptions")
        if not isinstance(subs, list):
            raise ValueError("subscriptions is not a list")
        subscriptions = []
        for sub in subs:
            if not isinstance(sub, dict):
                raise ValueError(f"bad subscription {sub!r}")
            filters = sub.get("filters")
            qos = sub.get("qos")
            if (
                not isinstance(filters, list)
                or not filters
                or not all(isinstance(f, str) and f for f in filters)
                or qos not in (0, 1)
                or not isinstance(sub.get("no_local"), bool)
                or not isinstance(sub.get("retain_as_published"), bool)
                or not _identifier(sub.get("identifier"))
                or not _share_queue(sub.get("share_queue"), filters)
                or not (sub.get("share_limit") is None or _count(sub.get("share_limit")))
            ):
                raise ValueError(f"bad subscription {sub!r}")
            subscriptions.append(
                (
                    _text(sub, "filter"),
                    qos,
                    tuple(filters),
                    sub["no_local"],
                    sub["retain_as_published"],
                    sub.get("identifier"),  # absent in files from before identifiers
                    sub.get("share_queue"),  # absent in files from before QoS 1 groups
                    sub.get("share_limit"),
                )
            )
        pairs = raw.get("packet_ids", [])
        if not isinstance(pairs, list) or not all(
            isinstance(pair, list)
            and len(pair) == 2
            and _count(pair[0])
            and _count(pair[1])
            and 0 < pair[1] < 0x10000
            for pair in pairs
        ):
            raise ValueError("bad packet_ids")
        packet_ids = {spool_id: pid for spool_id, pid in pairs}
        if len(set(packet_ids.values())) != len(packet_ids):
            raise ValueError("a packet id given twice")
        queued = any(q and not f[0].startswith("#share/") for _, q, f, *_ in subscriptions)
        if queue is None and queued:
            raise ValueError("QoS 1 subscriptions but no queue")
        raw_will = raw.get("will")
        will = None if raw_will is None else PendingWill.from_json(raw_will)
        received = raw.get("received", [])  # absent in files from before it was kept
        if not isinstance(received, list) or not all(
            _count(pid) and 0 < pid < 0x10000 for pid in received
        ):
            raise ValueError("bad received")
        return cls(
            vpn, client_id, expiry, queue, limit, since, subscriptions, packet_ids, will, received
        )


def _share_queue(value: object, filters: list[str]) -> bool:
    """A share group's queue: only for a shared subscription."""
    if value is None:
        return True
    return isinstance(value, str) and bool(value) and filters[0].startswith("#share/")


def _text(raw: dict[str, Any], key: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str):
        raise ValueError(f"bad {key} {value!r}")
    return value


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SessionFiles:
    """The directory of a node's saved MQTT sessions, a file per (VPN, client id)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, vpn: str, client_id: str) -> Path:
        key = f"{vpn}\x00{client_id}".encode("utf-8", "surrogatepass")
        return self.directory / (hashlib.sha256(key).hexdigest()[:40] + ".json")

    def write(self, saved: SavedSession) -> None:
        """Keep ``saved`` (replacing the session's file atomically). A session that
        cannot be written is logged, and lives on in memory only."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            write_json_atomically(self.path(saved.vpn, saved.client_id), saved.to_json())
        except (OSError, TypeError) as exc:  # TypeError: orjson and a lone surrogate
            log.warning(
                "MQTT session of client %r in VPN %r not saved: %s", saved.client_id, saved.vpn, exc
            )

    def remove(self, vpn: str, client_id: str) -> None:
        try:
            self.path(vpn, client_id).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("MQTT session file of client %r not removed: %s", client_id, exc)

    def read_all(self) -> list[SavedSession]:
        """Every session file that reads well; one that does not is logged, renamed
        ``*.bad`` beside it (kept for a look, never read again) and skipped."""
        if not self.directory.is_dir():
            return []
        found = []
        for path in sorted(self.directory.glob("*.json")):
            try:
                saved = SavedSession.from_json(path.read_bytes())
                if path != self.path(saved.vpn, saved.client_id):
                    raise ValueError("its name is not its session's")
            except (OSError, ValueError) as exc:
                log.warning("MQTT session file %s not restored: %s", path, exc)
                with contextlib.suppress(OSError):
                    path.replace(path.with_suffix(".bad"))
                continue
            found.append(saved)
        return found


def _identifier(value: object) -> bool:
    """Whether ``value`` is a subscription identifier (1 to 268,435,455) or ``None``."""
    if value is None:
        return True
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 28
