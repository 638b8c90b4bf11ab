"""A Spark application on ``local-cluster[2,1,1024]`` that reads from and writes to a
``meshbus run`` node, for ``test_spark_cluster.py`` (run as its own process: a process
has one SparkContext, and the other Spark tests hold a local one).

Usage: ``python cluster_driver.py SETTINGS_JSON``. It prints one JSON line, starting
``RESULT ``, when it is done (``read``, ``write`` and ``read-write`` runs: the last reads,
then writes with ``write_options``, on one cluster), or ``STARTED`` lines while a
``stream`` run goes on until it is killed.

The node sees every client by name, ``spark-<role>-<host>-<pid>``. Before it ends, a
``read`` run asks the node which clients it served rows to and checks, from
``/proc``, that each is a Python worker of an executor JVM, not of the driver.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def executor_process(pid: int) -> bool:
    """Whether ``pid`` descends from an executor JVM (``CoarseGrainedExecutorBackend``)."""
    while pid > 1:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        if b"CoarseGrainedExecutorBackend" in command:
            return True
        pid = int(stat.rpartition(")")[2].split()[1])
    return False


def main() -> None:
    settings: dict[str, Any] = json.loads(sys.argv[1])
    from meshbus.contrib.spark import local_spark_session
    from meshbus.contrib.spark._client import NodeClient
    from meshbus.contrib.spark._options import read_options, write_options
    from meshbus.contrib.spark._source import MeshbusDataSource

    spark = local_spark_session(
        master="local-cluster[2,1,1024]",
        conf={"spark.executor.memory": "512m", "spark.task.maxFailures": "1"},
    )
    spark.dataSource.register(MeshbusDataSource)
    options: dict[str, str] = settings["options"]
    mode = settings["mode"]
    if mode != "write":
        reader = spark.readStream.format("meshbus").options(**options).load()
        writer = (
            reader.writeStream.format("parquet")
            .option("path", settings["out"])
            .option("checkpointLocation", settings["checkpoint"])
        )
        if mode in ("read", "read-write"):
            writer.trigger(availableNow=True).start().awaitTermination()
        else:  # "stream": until killed
            query = writer.trigger(processingTime="500 milliseconds").start()
            while True:
                progress = query.lastProgress
                print("STARTED", json.dumps({"rows": progress["numInputRows"] if progress else 0}))
                sys.stdout.flush()
                query.awaitTermination(1)
                time.sleep(0.5)
    if mode in ("write", "read-write"):  # the write after the read: one cluster for both
        options = settings.get("write_options", options)
        rows = [(f"written/{i % 3}", f"w{i}".encode()) for i in range(settings["rows"])]
        frame = spark.createDataFrame(rows, "topic string, value binary").repartition(2)
        frame.write.format("meshbus").mode("append").options(**options).save()
    target = (read_options if mode == "read" else write_options)(options).node
    stats, _ = NodeClient(target, "check").request("stats")
    result = {
        "driver": os.getpid(),
        "served": {
            name: {"rows": rows, "executor": executor_process(int(name.rsplit("-", 1)[1]))}
            for name, rows in stats["served"].items()
        },
        "staged": {
            name: {"rows": rows, "executor": executor_process(int(name.rsplit("-", 1)[1]))}
            for name, rows in stats["staged_by"].items()
        },
    }
    print("RESULT", json.dumps(result))
    sys.stdout.flush()
    spark.stop()


if __name__ == "__main__":
    main()
