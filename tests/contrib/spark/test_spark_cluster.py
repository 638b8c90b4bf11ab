"""Spark on a cluster against a standalone node: ``local-cluster[2,1,1024]`` (two executor
JVMs, each with its own Python workers) reading from and writing to a ``meshbus run``
process over TLS with a password, in two partitions; the node is killed (``kill -9``)
in the middle of a streaming query and started again on its data directory, and the
query restarted from its checkpoint writes every message exactly once.

Each Spark application is a process of its own (``cluster_driver.py``).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import anyio
import pyarrow.parquet as pq
import pytest

from meshbus.transports import TlsSettings, connect
from meshbus.transports.certs import make_ca, make_server_certificate
from tests.processes import Child, free_port

pytestmark = [
    pytest.mark.slow,  # about a minute and a half: three Spark applications on a cluster
    pytest.mark.timeout(900),
    pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java 17 on PATH"),
]

DRIVER = Path(__file__).with_name("cluster_driver.py")
RUNNING = "meshbus run: node sparknode listening on "
PASSWORD = "s3cret-spark"
SPARK_WAIT = 240.0  # seconds a Spark application on two executor JVMs may take for a step


def node_file(folder: Path, port: int) -> Path:
    path = folder / "node.toml"
    path.write_text(
        f"""
[node]
name = "sparknode"
data_dir = "spool"
plugins = ["direct", "shared", "eliding", "guaranteed", "retained", "spark"]

[[listeners]]
host = "127.0.0.1"
port = {port}
[listeners.tls]
certificate = "certs/server.pem"
private_key = "certs/server-key.pem"

[vpns.plant]
authentication = "basic"
[vpns.plant.users.spark]
password = "{PASSWORD}"
[vpns.plant.queues.orders]
subscriptions = ["orders/>"]
[vpns.plant.queues.written]
subscriptions = ["written/>"]

[spark]
vpn = "plant"
username = "spark"
password = "{PASSWORD}"
queues = ["orders"]
partitions = 2
""",
        encoding="utf-8",
    )
    return path


def start_node(folder: Path) -> tuple[Child, str]:
    child = Child([sys.executable, "-m", "meshbus", "run", "node.toml"], folder)
    (line,) = child.wait_for(RUNNING)
    return child, line.removeprefix(RUNNING)


def tls(folder: Path) -> TlsSettings:
    return TlsSettings(ca=folder / "certs" / "ca.pem")


async def publish(url: str, folder: Path, first: int, count: int) -> None:
    async with connect(
        url, vpn="plant", username="spark", password=PASSWORD, tls=tls(folder), reconnect=False
    ) as client:
        messages = [(f"orders/{i % 7}", f"order-{i}".encode()) for i in range(first, first + count)]
        assert await client.send_many(messages) == [None] * count


async def queue_depth(url: str, folder: Path, queue: str, expected: int) -> list[bytes]:
    async with connect(
        url, vpn="plant", username="spark", password=PASSWORD, tls=tls(folder), reconnect=False
    ) as client:
        flow = await client.bind(queue, window=1000)
        got = []
        with anyio.fail_after(30):
            while len(got) < expected:
                message = await flow.receive()
                got.append(message.payload)
                flow.ack(message)
        return got


def driver(folder: Path, **settings: Any) -> Child:
    return Child([sys.executable, str(DRIVER), json.dumps(settings)], folder)


def result_of(child: Child) -> dict[str, Any]:
    try:
        (line,) = child.wait_for("RESULT ", timeout=SPARK_WAIT)
        assert child.process.wait(60) == 0, child.stderr_lines[-30:]
    finally:
        child.close()
    found: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return found


def committed_rows(out: Path) -> list[bytes]:
    """The values of the Parquet files Spark's file sink committed (its metadata log
    names them; files of a batch that failed are not read)."""
    files: set[str] = set()
    for log in sorted((out / "_spark_metadata").iterdir(), key=lambda p: p.name):
        if log.name.isdecimal() or log.name.endswith(".compact"):
            for entry in log.read_text().splitlines()[1:]:
                record = json.loads(entry)
                if record.get("action", "add") == "add":
                    files.add(record["path"].removeprefix("file://"))
    values: list[bytes] = []
    for file in sorted(files):
        values += pq.read_table(file, columns=["value"]).column("value").to_pylist()
    return values


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    make_ca(tmp_path / "certs")
    make_server_certificate(tmp_path / "certs")
    return tmp_path


def test_a_cluster_reads_and_writes_through_a_standalone_node_and_survives_its_kill(
    folder: Path,
) -> None:
    node_file(folder, free_port())
    node, url = start_node(folder)
    assert url.startswith("tls://127.0.0.1:")
    options = {
        "address": url,
        "vpn": "plant",
        "username": "spark",
        "password": PASSWORD,
        "tlsCa": str(folder / "certs" / "ca.pem"),
        "queue": "orders",
        "partitions": "2",
        "consumer": "parquet",
    }
    out, checkpoint = folder / "out", folder / "checkpoint"
    streaming = None
    try:
        anyio.run(publish, url, folder, 0, 400)
        streaming = driver(
            folder, mode="stream", options=options, out=str(out), checkpoint=str(checkpoint)
        )
        # Wait for a micro-batch with rows, then kill the node under the running query.
        while True:
            (line,) = streaming.wait_for("STARTED ", timeout=SPARK_WAIT)
            if json.loads(line.removeprefix("STARTED "))["rows"] > 0:
                break
        node.process.kill()
        node.process.wait(30)
        streaming.process.kill()
        streaming.process.wait(30)
        streaming.close()
        streaming = None
        node.close()

        node, url = start_node(folder)  # the same data directory
        anyio.run(publish, url, folder, 400, 200)
        options_out = {
            k: v for k, v in options.items() if k not in ("queue", "partitions", "consumer")
        }
        # The restarted query reads on from its checkpoint, then the same application
        # writes 90 rows (one cluster for both: each start of one takes long).
        read = write = result_of(
            driver(
                folder,
                mode="read-write",
                options=options,
                out=str(out),
                checkpoint=str(checkpoint),
                write_options={**options_out, "deliveryMode": "persistent"},
                rows=90,
            )
        )
        values = committed_rows(out)
        assert sorted(values) == sorted(f"order-{i}".encode() for i in range(600))
        # Executors read every row themselves: the driver's processes got none.
        assert read["served"], "the node served no rows"
        for name, served in read["served"].items():
            assert served["executor"] or served["rows"] == 0, (name, served)

        assert sum(s["rows"] for s in write["staged"].values()) == 90
        assert all(s["executor"] for s in write["staged"].values()), write["staged"]
        written = anyio.run(queue_depth, url, folder, "written", 90)
        assert sorted(written) == sorted(f"w{i}".encode() for i in range(90))
    finally:
        if streaming is not None:
            streaming.close()
        node.close()
