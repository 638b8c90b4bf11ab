"""The SQL of :class:`~meshbus.plugins.guaranteed.SqliteStore`: its tables, the
statements of its hot paths, and the queries its ``check()`` runs."""

from __future__ import annotations

import sqlite3
from typing import Any, Final

#: Bumped when the tables change; a file with another version is refused.
SCHEMA_VERSION: Final = 1

# One copy per message (refcount = endpoints still holding it), one row per
# (endpoint, message). ``refs`` is clustered on its key, so an endpoint's messages
# are one range scan in id order. ``endpoints`` keeps each endpoint's figures, so
# opening a store with a million messages reads a few rows, not all of them.
# The trigger makes an ack, a drop or anything else deleting a reference keep the
# refcount, the figures and the message's lifetime right in the same transaction.
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    headers TEXT NOT NULL,
    persistent INTEGER NOT NULL,
    expires_at REAL,
    published_at REAL NOT NULL,
    refcount INTEGER NOT NULL
);
-- The TTL sweep's way to the expired messages without reading the others. Created on
-- open, so spools written before it get it too; it changes no table, hence no new version.
CREATE INDEX IF NOT EXISTS messages_by_expiry ON messages (expires_at)
    WHERE expires_at IS NOT NULL;
CREATE TABLE IF NOT EXISTS refs (
    endpoint TEXT NOT NULL,
    message_id INTEGER NOT NULL,
    delivery_count INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint, message_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS endpoints (
    name TEXT PRIMARY KEY,
    messages INTEGER NOT NULL,
    bytes INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
CREATE TRIGGER IF NOT EXISTS ref_removed AFTER DELETE ON refs BEGIN
    UPDATE endpoints SET
        messages = messages - 1,
        bytes = bytes - (SELECT length(payload) FROM messages WHERE id = OLD.message_id)
    WHERE name = OLD.endpoint;
    -- delete on the last reference, else count down: one write either way
    DELETE FROM messages WHERE id = OLD.message_id AND refcount = 1;
    UPDATE messages SET refcount = refcount - 1 WHERE id = OLD.message_id;
END;
INSERT OR IGNORE INTO meta VALUES ('next_id', 1);
PRAGMA user_version = {SCHEMA_VERSION};
"""

# Constant statement texts: sqlite3 caches the prepared statement per text.
_INSERT_MESSAGE = "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
# (endpoint, message id, delivery count): 1 for a reference of NewMessage.marked
_INSERT_REF = "INSERT INTO refs VALUES (?, ?, ?)"
_ADD_TO_ENDPOINT = (
    "INSERT INTO endpoints VALUES (?, ?, ?) ON CONFLICT (name) DO UPDATE SET"
    " messages = messages + excluded.messages, bytes = bytes + excluded.bytes"
)
_DELETE_REF = "DELETE FROM refs WHERE endpoint = ? AND message_id = ?"
_MARK_REF = (
    "UPDATE refs SET delivery_count = delivery_count + 1 WHERE endpoint = ? AND message_id = ?"
)
_DROP_REFS = "DELETE FROM refs WHERE endpoint = ?"
_DROP_ENDPOINT = "DELETE FROM endpoints WHERE name = ?"
_ENDPOINT_FIGURES = "SELECT messages, bytes FROM endpoints WHERE name = ?"
_SET_NEXT_ID = "UPDATE meta SET value = ? WHERE key = 'next_id'"
_READ = """
SELECT m.id, m.topic, m.payload, m.headers, m.persistent, m.expires_at, m.published_at,
       r.delivery_count
FROM refs AS r JOIN messages AS m ON m.id = r.message_id
WHERE r.endpoint = ? AND r.message_id > ?
ORDER BY r.message_id
LIMIT ?
"""

# Through messages_by_expiry (the comparison implies the index's NOT NULL), then refs
# by its key: reads only the expired messages, whatever the endpoint holds besides.
_READ_EXPIRED = """
SELECT m.id, m.topic, m.payload, m.headers, m.persistent, m.expires_at, m.published_at,
       r.delivery_count
FROM messages AS m INDEXED BY messages_by_expiry
CROSS JOIN refs AS r ON r.endpoint = ? AND r.message_id = m.id
WHERE m.expires_at <= ? AND m.id > ?
ORDER BY m.id
LIMIT ?
"""

# What check() looks for; each query returns a row describing the first violation.
_CHECKS = (
    (
        "message {} has refcount {} but {} references",
        # refs has no index on message_id: count them once, then join (not a nested scan)
        "SELECT m.id, m.refcount, coalesce(h.n, 0) FROM messages AS m"
        " LEFT JOIN (SELECT message_id, count(*) AS n FROM refs GROUP BY message_id) AS h"
        " ON h.message_id = m.id WHERE m.refcount != coalesce(h.n, 0) OR m.refcount < 1"
        " LIMIT 1",
    ),
    (
        "endpoint {!r} references missing message {}",
        "SELECT r.endpoint, r.message_id FROM refs AS r"
        " LEFT JOIN messages AS m ON m.id = r.message_id WHERE m.id IS NULL LIMIT 1",
    ),
    (
        "endpoint {!r} is recorded with {} messages / {} bytes but holds {} / {}",
        "SELECT e.name, e.messages, e.bytes, coalesce(h.n, 0), coalesce(h.b, 0)"
        " FROM endpoints AS e LEFT JOIN (SELECT r.endpoint, count(*) AS n,"
        " sum(length(m.payload)) AS b FROM refs AS r JOIN messages AS m"
        " ON m.id = r.message_id GROUP BY r.endpoint) AS h ON h.endpoint = e.name"
        " WHERE e.messages != coalesce(h.n, 0) OR e.bytes != coalesce(h.b, 0) LIMIT 1",
    ),
    (
        "endpoint {!r} holds messages but has no figures",
        "SELECT DISTINCT r.endpoint FROM refs AS r"
        " LEFT JOIN endpoints AS e ON e.name = r.endpoint WHERE e.name IS NULL LIMIT 1",
    ),
    (
        "next id {} is not above the highest id {}",
        "SELECT value, (SELECT max(id) FROM messages) FROM meta"
        " WHERE key = 'next_id' AND value <= (SELECT coalesce(max(id), 0) FROM messages)",
    ),
)


def _insert(
    conn: sqlite3.Connection,
    rows: list[Any],
    refs: list[Any],
    delta: dict[str, list[int]],
    touched: dict[str, None],
) -> None:
    """Insert a run of puts: messages, references, then each endpoint's figures once."""
    conn.executemany(_INSERT_MESSAGE, rows)
    conn.executemany(_INSERT_REF, refs)
    conn.executemany(_ADD_TO_ENDPOINT, [(name, m, b) for name, (m, b) in delta.items()])
    touched.update(dict.fromkeys(delta))
