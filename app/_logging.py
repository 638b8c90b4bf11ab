"""Where ``meshbus run`` logs, and in which format: ``--log-format`` and ``--log-file``.

Two formats:

* ``text`` (the default): one line per record,
  ``2026-11-24T19:40:02.114Z WARNING meshbus.session: slow consumer: ...``;
* ``json``: one JSON object per line, for a log shipper: ``time`` (ISO 8601, UTC,
  milliseconds), ``level``, ``logger``, ``message`` (the arguments filled in), then
  the fields a record was given with ``extra=`` (the slow-consumer warning's
  ``client_name``, ``vpn``, ...), and ``exception`` with the formatted traceback
  when there is one. A value JSON cannot hold is written as its ``repr``.

The records go to standard error, or appended to ``--log-file``; the file is
reopened when it is moved or deleted (a ``logrotate`` without ``copytruncate``), as
:class:`logging.handlers.WatchedFileHandler` does.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import time
from typing import Any

import orjson

__all__ = ["FORMATS", "JsonFormatter", "TextFormatter", "configure_logging"]

FORMATS = ("text", "json")
"""The values of ``--log-format``."""

# What every LogRecord has: the rest came from ``extra=``.
_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


def _utc(record: logging.LogRecord) -> str:
    seconds = int(record.created)
    millis = int((record.created - seconds) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{millis:03d}Z"


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE``, the time in UTC, a traceback on the lines after."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_utc(record)} {record.levelname} {record.name}: {record.getMessage()}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        elif record.exc_text:
            line += "\n" + record.exc_text
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module's text for its fields)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": _utc(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return orjson.dumps(entry, default=repr).decode()


def configure_logging(level: str = "info", fmt: str = "text", file: str | None = None) -> None:
    """Send the ``meshbus`` loggers' records at ``level`` and above to standard error
    (or appended to ``file``) in format ``fmt``; replaces what an earlier call set up.

    :raises ValueError: an unknown level or format.
    :raises OSError: ``file`` cannot be opened for appending.
    """
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    number = logging.getLevelName(level.upper())
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}")
    handler: logging.Handler
    if file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.handlers.WatchedFileHandler(file, encoding="utf-8")
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_meshbus_run", False):
            root.removeHandler(old)
            old.close()
    handler._meshbus_run = True  # type: ignore[union-attr]
    root.addHandler(handler)
    root.setLevel(number)
