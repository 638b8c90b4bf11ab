"""The [spark] table of a node's configuration file (``meshbus run``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshbus import ConfigurationError
from meshbus.app._config import load_config
from meshbus.contrib.spark import SparkBridge

PLUGINS = 'plugins = ["direct", "shared", "eliding", "guaranteed", "retained", "spark"]\n'


def problems(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "node.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_config(str(path), environ={}).build_node()
    except ConfigurationError as exc:
        return list(exc.problems)
    return []


def test_a_spark_table_puts_a_bridge_on_the_node(tmp_path: Path) -> None:
    path = tmp_path / "node.toml"
    path.write_text(
        "[node]\n"
        + PLUGINS
        + '[spark]\nsubscribe = ["meters/>"]\nqueues = ["orders"]\npartitions = 3\n'
        'advertise = "tls://gw.example:55443"\nmax_staged_bytes = 1000000\n',
        encoding="utf-8",
    )
    node = load_config(str(path), environ={}).build_node()
    (bridge,) = [p for p in node.plugins.plugins() if isinstance(p, SparkBridge)]
    assert bridge.max_staged_bytes == 1_000_000
    assert [s.id for s in bridge._declared] == ["meters/>#3", "queue:orders#3"]


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ("partitions = 0", "partitions"),
        ("partitions = 300", "partitions must be from 1 to 256"),
        ('subscribe = ["#bad/x"]', "#bad/x"),
        ('advertise = "0.0.0.0:1"', "wildcard"),
        ("queue_windows = 5", "queue_windows"),
    ],
)
def test_a_bad_spark_table_is_refused_naming_the_key(
    tmp_path: Path, table: str, expected: str
) -> None:
    found = problems(tmp_path, "[node]\n" + PLUGINS + "[spark]\n" + table + "\n")
    assert found, "the file was accepted"
    assert any(expected in problem for problem in found), found


def test_without_the_plugin_the_table_is_unknown(tmp_path: Path) -> None:
    found = problems(tmp_path, '[spark]\nsubscribe = ["a/>"]\n')
    assert any("spark" in problem for problem in found), found
