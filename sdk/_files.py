"""Small durable files that plugins keep beside their data (JSON, replaced atomically)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

__all__ = ["write_json_atomically"]


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path``: a crash leaves the old file or the new one."""
    partial = path.with_suffix(".tmp")
    partial.write_bytes(orjson.dumps(data))
    os.replace(partial, path)
