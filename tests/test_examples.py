"""Every script in examples/ runs to completion and prints what it claims to show.

The scripts are found by listing the directory, so a new example is run even
before it gets an entry in EXPECTED (it then only has to exit 0 and print).
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from meshbus import Node

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# Lines each example must print (in this order, other lines may come between).
EXPECTED: dict[str, list[str]] = {
    "quickstart.py": [
        "callback   <- alarms/fire/floor2: test",
        "dashboard  <- building/lobby/temperature: 21.5",
        "dashboard  <- building/roof/temperature: 14.0",
        "dashboard  <- building/lobby/door/state: open",
        "published=5 delivered=4 unmatched=1",
    ],
    "pair_link.py": [
        "b got news/today: hello from a (sent by writer on a)",
        "b spooled orders/1: one order (sent by shop)",
        "a's queue holds 0 messages",
        "link pair-b: forwarded=1 interest=1",
    ],
    "mqtt_devices.py": [
        "dashboard (WebSocket) got readings/meter-1/kwh: 40",
        "dashboard (WebSocket) got readings/meter-1/kwh: 41",
        "valve-3 got commands/valve-3/open: 50% (QoS 1)",
        "valve-3 back, session present: True",
        "valve-3 got commands/valve-3/close: now (QoS 1)",
        "$share group at QoS 1 took jobs/0, jobs/1, jobs/2, jobs/3 once each, over 2 workers",
        "app got readings/meter-1/kwh: 40 from meter-1",
        "app got devices/meter-1/online: false from meter-1 (retain)",
        "a late subscriber is told devices/meter-1/online: false",
        "listener: 5 logins, 1 will",
    ],
    "dmr_mesh.py": [
        "us-1 learned from eu-2: ['fx/eur-usd']",
        "desks got: ['1.0842', '1.0842', '1.0842']",
        "copies: us-1 -> eu-2: 1 eu-2 -> eu-1: 1",
        "trader got: 1.0843 for EUR 1m",
        "eu-1 is in-sync",
    ],
    "bridges.py": [
        "office got plant-7/alarms/press-3: overheated (hop count 1)",
        "excluded on the way: {'excluded': 1}",
        "cloud bridge to the plant: in-sync",
        "cloud board got status/line-1: running",
        "cloud queue got readings/0: 40 kWh",
        "cloud queue got readings/2: 42 kWh",
        "plant's queue for the cloud holds 0",
        "plant reader got news/today once (extra copies: 0)",
    ],
    "custom_plugin.py": [
        "routers of VPN 'default': ('audit', 'direct', 'links')",
        "audit: shop logged in to default as default",
        "warehouse received ['orders/0', 'orders/1', 'orders/2']",
        "audited so far: 4 messages on 4 topics",
        "audit: shop left after publishing 4 and receiving 0 messages",
        "audit: traffic in VPN 'default'",
        "audit:   metrics/cpu                1 msgs     3 B",
        "audit:   orders/2                   1 msgs    11 B",
    ],
    "sync_app.py": [
        "worker got jobs/resize: photo.jpg",
        "client handled results/resize on the node's thread: True",
        "worker: no more jobs (timed out)",
        "worker statistics: published=1",
    ],
    "shared_workers.py": [
        "3000 jobs spread over the group: {'worker-a': 1013, 'worker-b': 1013, 'worker-c': 974}",
        "the auditor group (one member) saw all of them: True",
        "after worker-a left, 300 jobs went to: {'worker-b': 130, 'worker-c': 170}",
        "jobs handled in total: 3300",
    ],
    "eliding_dashboard.py": [
        "the recorder got every update: 2000",
        "the dashboard got 12:",
        "  t=   0 ms prices/ACME 100.01",
        "  t= 200 ms prices/ACME 102.00",
        "  t=1000 ms prices/ACME 110.00",
        "  t=1000 ms prices/INIT 60.00",
    ],
    "guaranteed_orders.py": [
        "published 4 orders; the queue holds at most 4",
        "order 5 rejected to the publisher: over-quota (limit 4)",
        "worker acknowledged order 1",
        "worker took order 2 and stopped before acknowledging it",
        "after restart: order 2 redelivered=True mode=persistent",
        "after restart: order 3 redelivered=False mode=persistent",
        "after restart: order 4 redelivered=False mode=persistent",
    ],
    "acl_users.py": [
        "visitor logged in with the profiles of user 'default'",
        "refused: connect denied for user 'ops': login refused",
        "denied: publish to 'sensors/probe-8/temperature' denied for user 'probe-7'",
        "denied: subscribe to '>' denied for user 'ops'",
        "denied: subscribe to 'audit/logins' denied for user 'ops'",
        "denied: subscribe to '*/probe-7/temperature' denied for user 'wall'",
        "ops received sensors/probe-7/temperature = 21.7",
        "wall received sensors/probe-7/temperature = 21.7",
        "denied operations in tenant-a: 4",
    ],
    "spark_pipeline.py": [
        "app sent 600 page views; queue 'clicks' holds 600",
        "spark wrote the events to Parquet; queue 'clicks' now holds 0",
        "report read back by the app (pyarrow, no Spark):",
        "  /docs      120 views  avg 151.5 ms",
        "  /home      240 views  avg 148.0 ms",
        "  /pricing   240 views  avg 150.0 ms",
        'app received reports/pages/docs: {"page":"/docs","views":120,"avg_ms":151.5}',
        'app received reports/pages/home: {"page":"/home","views":240,"avg_ms":148.0}',
        'app received reports/pages/pricing: {"page":"/pricing","views":240,"avg_ms":150.0}',
    ],
}

# Examples that start a JVM: they get longer, and need Java.
NEEDS_JAVA = {"spark_pipeline.py"}
# The JVM prints this on every start and has no switch to silence it.
JVM_NOISE = "WARNING: Using incubator modules: jdk.incubator.vector"

SCRIPTS = sorted(path.name for path in EXAMPLES.glob("*.py"))


def test_every_expected_example_exists() -> None:
    assert set(EXPECTED) <= set(SCRIPTS), "EXPECTED names an example that is gone"


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=[pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(200)])
        if n in NEEDS_JAVA
        else n
        for n in SCRIPTS
    ],
)
def test_example_runs(name: str, tmp_path: Path) -> None:
    if name in NEEDS_JAVA and shutil.which("java") is None:
        pytest.skip(f"{name} needs Java 17 for Spark (java was not found)")
    # From an unrelated directory, so no example depends on the working directory.
    result = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLES / name)],  # as strict as the tests
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180 if name in NEEDS_JAVA else 30,
        check=False,
    )
    assert result.returncode == 0, f"{name} failed:\n{result.stdout}\n{result.stderr}"
    stderr = result.stderr.replace(JVM_NOISE + "\n", "") if name in NEEDS_JAVA else result.stderr
    assert stderr == "", f"{name} wrote to stderr:\n{result.stderr}"
    lines = result.stdout.splitlines()
    assert lines, f"{name} printed nothing: an example says what it shows"
    position = 0
    for expected in EXPECTED.get(name, []):
        try:
            position = lines.index(expected, position) + 1
        except ValueError:
            pytest.fail(
                f"{name} did not print {expected!r} (in order); it printed:\n{result.stdout}"
            )


def _load_example(name: str) -> Any:
    """Import an example as a module (it runs nothing: each has a main guard)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_audit_plugin_counts_every_publish() -> None:
    # The test the plugin tutorial shows (docs/how-to/write-a-plugin.rst includes it).
    example = _load_example("custom_plugin")
    lines: list[str] = []
    async with Node(plugins=["direct", example.AuditPlugin(log=lines.append)]) as node:
        async with node.connect(client_name="probe") as probe:
            probe.publish("a/b", b"123")
            probe.publish("a/b", b"45")
        audit = example.audit_of(node.vpn())
        assert audit.messages == {"a/b": 2}
        assert audit.bytes == {"a/b": 5}
    assert lines[0] == "audit: probe logged in to default as default"
    assert "audit:   a/b                        2 msgs     5 B" in lines
