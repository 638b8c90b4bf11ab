"""The ``[metrics]`` table and ``meshbus run --metrics``: the endpoint of a served node."""

from __future__ import annotations

import signal
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshbus import ConfigurationError
from meshbus.app._config import parse_config
from meshbus.app._run import main
from meshbus.transports import MetricsSettings
from tests.processes import WAIT, Child

METRICS = "meshbus run: node {name} metrics on "
LISTENING = "meshbus run: node {name} listening on "


# --- the [metrics] table ----------------------------------------------------------------


def problems(data: dict[str, object]) -> list[str]:
    with pytest.raises(ConfigurationError) as caught:
        parse_config(data, source="edge.toml", environ={})
    return caught.value.problems


def test_the_table_takes_the_settings() -> None:
    config = parse_config({"metrics": {"listen": "0.0.0.0:9100", "max_connections": 4}})
    assert config.metrics == MetricsSettings(listen="0.0.0.0:9100", max_connections=4)
    assert parse_config({"metrics": {}}).metrics == MetricsSettings()
    assert parse_config({}).metrics is None


def test_every_mistake_in_the_table_is_reported() -> None:
    assert problems(
        {
            "metrics": {
                "listen": "localhost",
                "request_timeout": 0,
                "max_connections": "many",
                "max_request_size": 100,
                "port": 9100,
            },
            "vpns": {"default": {"users": {"a": {"client_profile": "gold"}}}},
        }
    ) == [
        "edge.toml: vpns.default.users.a.client_profile: "
        "no client profile named 'gold' in VPN 'default'",
        "edge.toml: metrics.port: unknown key (expected one of: listen, request_timeout, "
        "max_connections, max_request_size)",
        "edge.toml: metrics.listen: must be HOST:PORT with a port from 0 to 65535, got 'localhost'",
        "edge.toml: metrics.request_timeout: must be a positive number, got 0",
        "edge.toml: metrics.max_connections: expected an integer, got string 'many'",
        "edge.toml: metrics.max_request_size: must be an integer of at least 256, got 100",
    ]


def test_the_table_must_be_a_table() -> None:
    assert problems({"metrics": "127.0.0.1:9464"}) == [
        "edge.toml: metrics: expected a table, got string '127.0.0.1:9464'"
    ]
    assert problems({"metric": {}})[0].startswith(
        "edge.toml: metric: unknown key (did you mean 'metrics'?)"
    )


def test_without_prometheus_client_the_table_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    assert problems({"metrics": {}}) == [
        "edge.toml: metrics: the metrics endpoint needs prometheus_client: "
        "pip install 'meshbus[metrics]'"
    ]


# --- meshbus run --metrics ----------------------------------------------------------------


@pytest.fixture
def children() -> Iterator[list[Child]]:
    started: list[Child] = []
    yield started
    for child in started:
        child.close()


def run(children: list[Child], args: list[str], cwd: Path) -> Child:
    children.append(Child([sys.executable, "-m", "meshbus", "run", *args], cwd))
    return children[-1]


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=WAIT) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode()


def test_run_serves_metrics_and_probes(children: list[Child], tmp_path: Path) -> None:
    (tmp_path / "edge.toml").write_text(
        """
        [node]
        name = "edge-m"
        [[listeners]]
        port = 0
        [metrics]
        listen = "127.0.0.1:1"      # replaced by --metrics
        [vpns.default.queues.orders]
        subscriptions = ["orders/>"]
        """,
        encoding="utf-8",
    )
    child = run(children, ["edge.toml", "--metrics", "127.0.0.1:0"], tmp_path)
    (line,) = child.wait_for(METRICS.format(name="edge-m"))
    url = line.removeprefix(METRICS.format(name="edge-m"))
    assert url.startswith("http://127.0.0.1:")
    assert url.endswith("/metrics")
    child.wait_for(LISTENING.format(name="edge-m"))
    base = url.removesuffix("/metrics")

    assert fetch(base + "/healthz") == (200, "ok\n")
    assert fetch(base + "/readyz") == (200, "ready\n")
    status, text = fetch(url)
    assert status == 200
    assert 'meshbus_node_info{cluster="",node="edge-m"' in text
    assert 'meshbus_queue_messages{kind="queue",queue="orders",vpn="default"} 0.0' in text
    assert 'meshbus_listener_logins_total{listener="tcp://127.0.0.1:' in text
    assert fetch(base + "/nothing")[0] == 404

    assert child.finish(signal.SIGTERM) == 0
    assert child.stdout_lines[-1] == "meshbus run: stopping (SIGTERM)"


def test_run_without_the_option_serves_the_configured_endpoint(
    children: list[Child], tmp_path: Path
) -> None:
    (tmp_path / "edge.toml").write_text(
        '[metrics]\nlisten = "127.0.0.1:0"\n[[listeners]]\nport = 0\n', encoding="utf-8"
    )
    child = run(children, ["edge.toml"], tmp_path)
    (line,) = child.wait_for(METRICS.format(name="meshbus"))
    assert fetch(line.rpartition(" ")[2].removesuffix("/metrics") + "/healthz")[0] == 200
    assert child.finish(signal.SIGTERM) == 0


def test_a_metrics_port_in_use_fails_with_status_1(children: list[Child], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        child = run(
            children, ["--listen", "127.0.0.1:0", "--metrics", f"127.0.0.1:{port}"], tmp_path
        )
        assert child.finish() == 1
    assert any(
        line.startswith("meshbus run: cannot serve metrics: ") and f"127.0.0.1:{port}" in line
        for line in child.stderr_lines
    ), child.stderr_lines


def test_a_bad_metrics_address_is_a_usage_error(children: list[Child], tmp_path: Path) -> None:
    child = run(children, ["--metrics", "9464"], tmp_path)
    assert child.finish() == 2
    assert "--metrics: expected HOST:PORT" in "\n".join(child.stderr_lines)


def test_main_refuses_metrics_without_prometheus_client(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    assert main(None, ["127.0.0.1:0"], metrics="127.0.0.1:0") == 2
    assert capsys.readouterr().err == (
        "meshbus run: --metrics: the metrics endpoint needs prometheus_client: "
        "pip install 'meshbus[metrics]'\n"
    )


def test_main_refuses_a_bad_metrics_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(None, metrics="127.0.0.1:70000") == 2
    assert capsys.readouterr().err == (
        "meshbus run: --metrics: expected HOST:PORT with a port from 0 to 65535, "
        "got '127.0.0.1:70000'\n"
    )
