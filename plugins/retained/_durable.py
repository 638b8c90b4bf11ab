"""Retained values on disk: ``retained.sqlite`` in the node's data directory.

Changes are collected per (VPN, topic) as they happen, so a burst of updates to one
topic costs one row write, and a writer task commits them in batches off the event
loop. A guaranteed retained publish waits for the batch holding its value
(:meth:`DurableRetained.flush`) before the publisher's ack, so an acknowledged
retained value survives a crash; a direct one is written behind, within one batch.
"""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import orjson
from anyio.abc import TaskStatus

from meshbus import DeliveryMode, Message

__all__ = ["DurableRetained"]

log = logging.getLogger("meshbus.retained")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS retained (
    vpn TEXT NOT NULL,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    meta BLOB NOT NULL,
    PRIMARY KEY (vpn, topic)
) WITHOUT ROWID
"""

_MODES = {mode.value: mode for mode in DeliveryMode}


def _meta(message: Message) -> bytes:
    return orjson.dumps(
        {
            "s": message.sender,
            "t": message.timestamp,
            "m": message.delivery_mode.value,
            "h": dict(message.headers),
            "r": message.reply_to,
            "c": message.correlation_id,
            "x": message.expires_at,
        }
    )


def _message(topic: str, payload: bytes, meta: bytes) -> Message:
    fields: dict[str, Any] = orjson.loads(meta)
    return Message(
        topic,
        bytes(payload),
        _MODES.get(fields.get("m", "direct"), DeliveryMode.DIRECT),
        fields.get("h") or {},
        reply_to=fields.get("r"),
        correlation_id=fields.get("c"),
        sender=fields.get("s"),
        timestamp=fields.get("t"),
        expires_at=fields.get("x"),
        retain=True,
        retained=True,
    )


class DurableRetained:
    """The writer of one node's retained values (one SQLite file, every VPN)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pending: dict[tuple[str, str], Message | None] = {}
        self._wake = anyio.Event()
        self._asked = 0  # generations: changes asked for, and written
        self._written = 0
        self._written_event = anyio.Event()
        self._conn: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self.failure: BaseException | None = None

    async def load(self) -> dict[str, list[Message]]:
        """Open the file and read what it holds, by VPN."""
        return await anyio.to_thread.run_sync(self._load, limiter=self._limiter)

    def _load(self) -> dict[str, list[Message]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(_SCHEMA)
        self._conn = conn
        found: dict[str, list[Message]] = {}
        for vpn, topic, payload, meta in conn.execute(
            "SELECT vpn, topic, payload, meta FROM retained"
        ):
            try:
                found.setdefault(vpn, []).append(_message(topic, payload, meta))
            except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
                log.warning(
                    "retained value of %r in VPN %r is unreadable, skipped: %s", topic, vpn, exc
                )
        return found

    def changed(self, vpn: str, topic: str, message: Message | None) -> None:
        """Note a new value (``None``: cleared) to write in the next batch."""
        self._pending[(vpn, topic)] = message
        self._asked += 1
        self._wake.set()

    async def flush(self) -> None:
        """Return once every change noted so far is committed."""
        target = self._asked
        while self._written < target:
            if self.failure is not None:
                from meshbus import SpoolError

                raise SpoolError(f"retained values could not be written: {self.failure}")
            event = self._written_event
            await event.wait()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The writer task: commit what changed, batch by batch, until cancelled."""
        task_status.started()
        try:
            while True:
                await self._wake.wait()
                await self._write_pending()
        finally:
            with anyio.CancelScope(shield=True):
                await self._write_pending()
                if self._conn is not None:
                    await anyio.to_thread.run_sync(self._conn.close, limiter=self._limiter)
                    self._conn = None

    async def _write_pending(self) -> None:
        self._wake = anyio.Event()
        if not self._pending:
            return
        batch, self._pending = self._pending, {}
        upto = self._asked
        try:
            await anyio.to_thread.run_sync(self._write, batch, limiter=self._limiter)
        except (sqlite3.Error, OSError) as exc:
            log.error("retained values could not be written to %s: %s", self.path, exc)
            self.failure = exc
        self._written = upto
        event, self._written_event = self._written_event, anyio.Event()
        event.set()

    def _write(self, batch: dict[tuple[str, str], Message | None]) -> None:
        conn = self._conn
        assert conn is not None
        rows = [(v, t, m.payload, _meta(m)) for (v, t), m in batch.items() if m is not None]
        gone = [(v, t) for (v, t), m in batch.items() if m is None]
        conn.execute("BEGIN")
        try:
            if gone:
                conn.executemany("DELETE FROM retained WHERE vpn = ? AND topic = ?", gone)
            if rows:
                conn.executemany("INSERT OR REPLACE INTO retained VALUES (?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
