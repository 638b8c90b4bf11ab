"""``meshbus run --log-format`` and ``--log-file``: what a served node logs, and where."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from meshbus.app._logging import JsonFormatter, TextFormatter, configure_logging
from tests.processes import Child

LISTENING = "meshbus run: node {name} listening on "


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("meshbus.session", logging.WARNING, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    made.created = 1795548000.25  # 2026-11-24T19:20:00.250Z
    return made


def test_json_lines_carry_the_message_and_the_extra_fields() -> None:
    line = JsonFormatter().format(
        record("slow consumer: %r", "s-1", client_name="s-1", vpn="plant", odd=object())
    )
    entry = orjson.loads(line)
    assert "\n" not in line
    assert entry["time"] == "2026-11-24T19:20:00.250Z"
    assert (entry["level"], entry["logger"]) == ("WARNING", "meshbus.session")
    assert entry["message"] == "slow consumer: 's-1'"
    assert (entry["client_name"], entry["vpn"]) == ("s-1", "plant")
    assert entry["odd"].startswith("<object object at")  # what JSON cannot hold, as repr
    assert "args" not in entry
    assert "exception" not in entry


def test_json_lines_carry_a_traceback() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record("failed")
        failed.exc_info = sys.exc_info()
    entry = orjson.loads(JsonFormatter().format(failed))
    assert entry["exception"].startswith("Traceback (most recent call last):")
    assert entry["exception"].endswith("ValueError: boom")


def test_text_lines_are_time_level_logger_message() -> None:
    assert TextFormatter().format(record("refused login from %s", "10.0.0.9")) == (
        "2026-11-24T19:20:00.250Z WARNING meshbus.session: refused login from 10.0.0.9"
    )


def test_configure_logging_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="log format must be one of text, json"):
        configure_logging("info", "xml")
    with pytest.raises(ValueError, match="unknown log level"):
        configure_logging("loud", "text")
    with pytest.raises(FileNotFoundError, match=r"node\.log"):
        configure_logging("info", "json", str(tmp_path / "missing" / "node.log"))


# --- a served node ------------------------------------------------------------------------


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.close()


def test_run_logs_json_to_a_file_and_lists_its_plugins(
    children: list[Child], tmp_path: Path
) -> None:
    (tmp_path / "edge.toml").write_text(
        '[node]\nname = "edge-l"\nplugins = ["direct", "guaranteed"]\n[[listeners]]\nport = 0\n',
        encoding="utf-8",
    )
    log_file = tmp_path / "node.log"
    args = ["edge.toml", "--log-format", "json", "--log-file", str(log_file)]
    child = Child([sys.executable, "-m", "meshbus", "run", *args], tmp_path)
    children.append(child)
    child.wait_for(LISTENING.format(name="edge-l"))
    assert child.finish(signal.SIGTERM) == 0
    entries = [orjson.loads(line) for line in log_file.read_text("utf-8").splitlines()]
    messages = [e["message"] for e in entries]
    serving = next(i for i, m in enumerate(messages) if m.startswith("serving node 'edge-l'"))
    assert messages[serving].startswith("serving node 'edge-l' from edge.toml (meshbus ")
    assert messages[serving + 1] == (
        "plugins: direct (meshbus.plugins.direct), guaranteed (meshbus.plugins.guaranteed._plugin)"
    )
    assert messages[-1] == "stopping node 'edge-l' on SIGTERM"
    assert {e["level"] for e in entries} == {"INFO"}
    assert not child.stderr_lines  # the log went to the file only


def test_a_log_file_that_cannot_be_opened_is_a_usage_error(
    children: list[Child], tmp_path: Path
) -> None:
    args = ["--log-file", str(tmp_path / "missing" / "node.log"), "--listen", "127.0.0.1:0"]
    child = Child([sys.executable, "-m", "meshbus", "run", *args], tmp_path)
    children.append(child)
    assert child.finish(None) == 2
    (line,) = child.stderr_lines
    assert line.startswith("meshbus run: --log-file: cannot log there: ")
